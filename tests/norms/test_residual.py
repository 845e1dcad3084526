"""The fused-residual call convention: ``y, x + r = norm(x, residual=r)`` with ``y = norm(x + r)``."""

from __future__ import annotations

import pytest
import torch

import lnblocks
from tests.norms.helpers import randomize_

KINDS = ["layernorm", "rmsnorm", "llama", "gemma", "t5", "dyt", "scalenorm", "none"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_equals_add_then_norm(kind: str, dtype: torch.dtype) -> None:
    norm = randomize_(lnblocks.build_norm(kind, 32, dtype=dtype))
    x, r = torch.randn(2, 5, 32).to(dtype), torch.randn(2, 5, 32).to(dtype)
    y, new_r = norm(x, residual=r)
    assert torch.equal(new_r, x + r)
    assert torch.equal(y, norm(x + r))


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm", "llama", "t5", "dyt"])
def test_residual_in_fp32_keeps_stream_in_fp32_and_branch_in_input_dtype(kind: str) -> None:
    norm = randomize_(lnblocks.build_norm(kind, 64, residual_in_fp32=True, dtype=torch.bfloat16))
    x, r = torch.randn(4, 64).bfloat16(), torch.randn(4, 64).bfloat16()
    y, new_r = norm(x, residual=r)
    assert new_r.dtype == torch.float32
    assert torch.equal(new_r, x.float() + r.float())
    assert y.dtype == norm.output_dtype(torch.bfloat16) == norm(x).dtype
    assert torch.equal(y, norm(new_r).to(y.dtype))


def test_residual_stream_in_fp32_is_more_accurate_over_many_adds() -> None:
    """What residual_in_fp32 is for: 64 bf16 adds drift, the fp32 stream does not."""
    torch.manual_seed(1)
    branches = [torch.randn(8, 256).bfloat16() * 0.01 for _ in range(64)]
    exact = sum(b.double() for b in branches)
    streams = {}
    for fp32 in (False, True):
        norm = lnblocks.RMSNorm(256, residual_in_fp32=fp32)
        resid = torch.zeros(8, 256, dtype=torch.float32 if fp32 else torch.bfloat16)
        for b in branches:
            _, resid = norm(b, residual=resid)
        streams[fp32] = (resid.double() - exact).abs().max().item()
    assert streams[True] < streams[False] / 10


def test_gradient_flows_to_both_inputs() -> None:
    norm = lnblocks.LayerNorm(16)
    x, r = torch.randn(3, 16, requires_grad=True), torch.randn(3, 16, requires_grad=True)
    y, new_r = norm(x, residual=r)
    (y.square().sum() + new_r.sum()).backward()
    x2, r2 = x.detach().clone().requires_grad_(), r.detach().clone().requires_grad_()
    h = x2 + r2
    (norm(h).square().sum() + h.sum()).backward()
    assert torch.equal(x.grad, x2.grad) and torch.equal(r.grad, r2.grad)
