"""No host synchronisation in GPT's forward: the token-id check is eager only on CPU, a device-side assert inside
torch.compile and on accelerators, absent on meta/fake tensors; so the full forward + backward runs under
``torch.compile(fullgraph=True)``, ``FakeTensorMode`` and on the meta device (shapes without values)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from lnblocks import GPT, BlockConfig, GPTConfig

V = 40


def _config(**kw) -> GPTConfig:
    block = BlockConfig(
        dim=16, attention={"n_heads": 2, "n_kv_heads": 1}, mlp={"activation": "swiglu"}, **kw.pop("block", {})
    )
    return GPTConfig(vocab_size=V, max_seq_len=16, n_layers=2, block=block, **kw)


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_forward_backward_on_meta_tensors(positions: str) -> None:
    with torch.device("meta"):
        model = GPT(_config(positions=positions))
    idx = torch.randint(0, V, (3, 8), device="meta")
    logits, loss = model(idx, idx)
    loss.backward()
    assert logits.shape == (3, 8, V) and logits.device.type == "meta"
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())


def test_forward_backward_under_fake_tensor_mode() -> None:
    with FakeTensorMode(allow_non_fake_inputs=False):
        model = GPT(_config(block={"placement": "sandwich", "qk_norm": "rmsnorm"}))
        idx = torch.randint(0, V, (2, 8))
        logits, loss = model(idx, idx)
        loss.backward()
        assert logits.shape == (2, 8, V) and loss.shape == ()
        assert all(p.grad is not None for p in model.parameters())


def test_compiled_forward_backward_fullgraph_checks_ids_on_device() -> None:
    """fullgraph=True fails on any graph break, e.g. ``int(idx.max())``; the check is a graph op instead."""
    torch._dynamo.reset()
    model = GPT(_config())
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    idx = torch.randint(0, V, (2, 8))
    logits, loss = compiled(idx, idx)
    loss.backward()
    ref_logits, _ = model(idx, idx)
    torch.testing.assert_close(logits, ref_logits)
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(RuntimeError, match=r"idx: token ids must be in \[0, 40\)"):
        compiled(torch.full((2, 8), V), idx)
    with pytest.raises(RuntimeError, match=r"targets: class ids must be in \[0, 40\) or -100"):
        compiled(idx, torch.full((2, 8), -3))


def test_eager_cpu_check_keeps_its_clear_error() -> None:
    with pytest.raises(ValueError, match=r"token ids must be in \[0, vocab_size=40\), got min 0, max 40"):
        GPT(_config())(torch.tensor([[0, V]]))
