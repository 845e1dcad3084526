"""torch.compile(fullgraph=True) of the default GPT on CPU: no graph breaks, same numbers as eager."""

from __future__ import annotations

import pytest
import torch

from lnblocks import GPT, GPTConfig

pytestmark = pytest.mark.slow


def test_compile_fullgraph_default_config_training_step() -> None:
    """Forward and backward captured as whole graphs (AOT autograd), gradients equal to eager."""
    torch._dynamo.reset()
    model = GPT(GPTConfig(n_layers=2))
    idx = torch.randint(0, 256, (2, 16))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    logits, loss = compiled(idx, idx)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ref_logits, ref_loss = model(idx, idx)
    ref_loss.backward()
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)


def test_compile_fullgraph_default_config_inductor() -> None:
    """The default inductor backend (C++ codegen on CPU) runs the captured forward."""
    torch._dynamo.reset()
    model = GPT(GPTConfig(n_layers=2)).eval()
    idx = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        logits, loss = torch.compile(model, fullgraph=True)(idx, idx)
        ref_logits, ref_loss = model(idx, idx)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
