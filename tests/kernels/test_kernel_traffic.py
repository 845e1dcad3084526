"""The on-paper byte counts of benchmarks/kernels/traffic.py against the tensors the launchers really read and write.

The count is the sum of the operands' sizes (each element of an (M, N) operand read or written once, weights once)
plus the backward's partial dW/dB rows (written by the kernel, read by the final sum). If a launcher starts saving,
reading or writing another tensor, these tests fail until the table in benchmarks/kernels/README.md is redone.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.kernels.traffic import Operands, kernel_bytes, min_bytes
from lnblocks.kernels.launch import bwd_config, bwd_grid, launch_backward, launch_forward
from lnblocks.kernels.plan import make_plan
from lnblocks.norms.spec import LayerNormSpec, RMSNormSpec
from tests.kernels.kernel_helpers import DEVICE

M, N = 6, 64


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize(
    ("kind", "residual", "dropout", "bias"),
    [
        ("layernorm", False, False, True),
        ("layernorm", True, False, True),
        ("layernorm", True, True, False),
        ("rmsnorm", False, True, False),
        ("rmsnorm", True, False, False),
    ],
)
def test_counts_match_the_launched_tensors(kind, residual, dropout, bias, dtype) -> None:
    spec = LayerNormSpec(bias=bias) if kind == "layernorm" else RMSNormSpec(eps=1e-6)
    elem = dtype.itemsize
    x = torch.randn(M, N, device=DEVICE, dtype=dtype)
    r = torch.randn(M, N, device=DEVICE, dtype=dtype) if residual else None
    w = torch.randn(N, device=DEVICE, dtype=dtype)
    b = torch.randn(N, device=DEVICE, dtype=dtype) if bias else None
    seed = torch.tensor([3], device=DEVICE) if dropout else None
    plan = make_plan(spec, dtype, None if r is None else dtype, dtype, None, 0.2 if dropout else 0.0)
    op = Operands(N, elem, elem if residual else 0, elem, elem if bias else 0, elem, dropout, kind == "layernorm")

    y, res, mean, rstd = launch_forward(plan, x, r, w, b, seed)
    fwd = _nbytes(x, r, w, b) + _nbytes(y, res, mean, rstd)
    assert kernel_bytes("fwd", M, op) == min_bytes("fwd", M, op) == fwd

    z = res if residual else x
    dy = torch.randn_like(y)
    dres_out = torch.randn_like(res) if residual else None
    dx, dres, dw, db, *_ = launch_backward(plan, dy, dres_out, z, w, seed, mean, rstd, True, bias)
    programs = bwd_grid(M, bwd_config(N), z.device)[0]
    partials = 2 * programs * N * 4 * (1 + int(bias))  # written by the kernel, read by the sum
    bwd = _nbytes(dy, dres_out, z, w, mean, rstd) + _nbytes(dx, dres, dw, db if bias else None)
    assert min_bytes("bwd", M, op) == bwd
    assert kernel_bytes("bwd", M, op, programs=programs) == bwd + partials
