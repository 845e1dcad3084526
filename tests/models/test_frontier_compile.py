"""Each 2025-26 model option under ``torch.compile(fullgraph=True)`` (AOT autograd on CPU): no graph break, the
forward and the gradients equal to eager; the chunked head too where an option changes it (the final cap's
checkpointed chunks, nGPT's logit scale). One layer each, to keep the suite short."""

from __future__ import annotations

import pytest
import torch

from lnblocks import GPT, BlockConfig, GPTConfig
from lnblocks.models import hybridnorm, ngpt_block

pytestmark = pytest.mark.slow

CASES = {
    "hybridnorm_v_norm": ({}, hybridnorm(BlockConfig(dim=32, norm="rmsnorm"), 1)),
    "siamese": ({}, BlockConfig(dim=32, placement="siamese")),
    "ngpt": ({"positions": "rope"}, ngpt_block(dim=32)),
    "hc_static": ({}, BlockConfig(dim=32, hyper_connections={"n_streams": 2, "kind": "static"})),
    "hc_dynamic": ({}, BlockConfig(dim=32, hyper_connections={"n_streams": 2, "kind": "dynamic"})),
    "mhc": ({}, BlockConfig(dim=32, hyper_connections={"n_streams": 2, "kind": "mhc", "sinkhorn_iters": 3})),
    "gate_headwise": ({}, BlockConfig(dim=32, attention={"output_gate": "headwise"})),
    "gate_elementwise": ({}, BlockConfig(dim=32, attention={"output_gate": "elementwise"})),
    "softcaps": ({"final_softcap": 3.0, "emb_scale": 2.0}, BlockConfig(dim=32, attention={"softcap": 2.0})),
}


@pytest.mark.parametrize(("name", "chunked"), [(name, False) for name in CASES] + [("softcaps", True), ("ngpt", True)])
def test_option_compiles_fullgraph_with_eager_numbers(name: str, chunked: bool) -> None:
    torch._dynamo.reset()
    options, block = CASES[name]
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, max_seq_len=16, n_layers=1, block=block, **options))
    idx = torch.randint(0, 64, (2, 12))
    kwargs = {"return_logits": False} if chunked else {}
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out, loss = compiled(idx, idx, **kwargs)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ref_out, ref_loss = model(idx, idx, **kwargs)
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    if not chunked:
        torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)


def test_capped_head_in_checkpointed_chunks_compiles_fullgraph() -> None:
    """The final cap over chunks of rows (each under non-reentrant checkpointing) as one graph, gradients as eager."""
    from lnblocks.models.capped_loss import capped_lm_head_loss

    torch._dynamo.reset()
    h, w = torch.randn(24, 16, requires_grad=True), torch.randn(40, 16, requires_grad=True)
    t = torch.randint(0, 40, (24,))

    def loss_of(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        loss, stats = capped_lm_head_loss(h, w, t, 2.0, z_loss=1e-2, chunk_rows=5)
        return loss + stats.z_loss

    compiled = torch.autograd.grad(torch.compile(loss_of, fullgraph=True, backend="aot_eager")(h, w), [h, w])
    eager = torch.autograd.grad(loss_of(h, w), [h, w])
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
