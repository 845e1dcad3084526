"""The torch backend compiles without graph breaks (the kernel issue adds the Triton custom ops)."""

from __future__ import annotations

import pytest
import torch

import lnblocks


@pytest.mark.parametrize("kind", ["layernorm", "llama", "gemma"])
def test_compile_fullgraph_with_residual(kind: str) -> None:
    torch._dynamo.reset()
    norm = lnblocks.build_norm(kind, 32, residual_in_fp32=True)
    x, r = torch.randn(4, 32), torch.randn(4, 32)

    def step(x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return norm(x, residual=r)

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    y, new_r = compiled(x, r)
    y_ref, r_ref = norm(x, residual=r)
    assert torch.equal(y, y_ref) and torch.equal(new_r, r_ref)
