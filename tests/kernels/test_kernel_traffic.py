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


# (name, preset, spec options, Operands options, residual, gate, norm_then_add, write_y)
KINDS = [
    ("gated", "mamba2_gated", {}, dict(layer_norm=False, gate=1), False, True, False, True),
    ("gated-groups", "qwen3_next_gated", {"group_size": 16}, dict(layer_norm=False, gate=1, groups=4), False, True,
     False, True),
    ("l2norm", "l2norm", {}, dict(layer_norm=False, weight=0), False, False, False, True),
    ("dyt-residual", "dyt", {}, dict(scalars=1), True, False, False, True),
    ("derf", "derf", {}, dict(scalars=2), False, False, False, True),
    ("norm-then-add", "layernorm", {}, dict(norm_then_add=True, write_y=False), True, False, True, False),
    ("norm-then-add-y", "rmsnorm", {"eps": 1e-6}, dict(layer_norm=False, norm_then_add=True), True, False, True, True),
    ("memory-efficient", "layernorm", {"memory_efficient": True}, dict(memory_efficient=True), True, False, False,
     True),
    ("per-head", "rmsnorm", {"eps": 1e-6, "group_size": 16}, dict(layer_norm=False, groups=4), False, False, False,
     True),
]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize(("name", "preset", "options", "counts", "residual", "gated", "nta", "write_y"), KINDS,
                         ids=[k[0] for k in KINDS])  # fmt: skip
def test_counts_of_the_new_kinds(name, preset, options, counts, residual, gated, nta, write_y, dtype) -> None:
    """The same audit for the gated, point-wise, per-head, norm-then-add and memory-efficient calls."""
    from lnblocks.kernels.launch import heavy_backward
    from lnblocks.norms import norm_spec

    spec = norm_spec(preset, **options)
    e = dtype.itemsize
    affine = getattr(spec, "elementwise_affine", False)
    has_bias = affine and getattr(spec, "bias", False)
    x, r, g = (torch.randn(M, N, device=DEVICE, dtype=dtype) if on else None for on in (True, residual, gated))
    w, b = (torch.randn(N, device=DEVICE, dtype=dtype) if on else None for on in (affine, has_bias))
    scalars = counts.get("scalars", 0)
    a, s = (torch.rand(1, device=DEVICE, dtype=dtype) + 0.5 if scalars > i else None for i in range(2))
    group = options.get("group_size")
    plan = make_plan(spec, dtype, None if r is None else dtype, None if w is None else dtype, group_size=group,
                     norm_then_add=nta, write_y=write_y)  # fmt: skip
    fields = dict(x=e, residual=e if residual else 0, weight=e if affine else 0, bias=e if has_bias else 0, out=e)
    op = Operands(N, **(fields | {k: (e if k == "gate" else v) for k, v in counts.items() if k != "weight"}))

    y, res, mean, rstd = launch_forward(plan, x, r, w, b, None, gate=g, alpha=a, shift=s)
    fwd = _nbytes(x, r, w, b, g, a, s) + _nbytes(y, res, mean, rstd)
    assert kernel_bytes("fwd", M, op) == min_bytes("fwd", M, op) == fwd

    saved = y if plan.memory_efficient else (res if residual and not nta else x)
    dy = torch.randn(M, N, device=DEVICE, dtype=dtype) if write_y else torch.empty(0, device=DEVICE, dtype=dtype)
    dres_out = torch.randn(M, N, device=DEVICE, dtype=res.dtype) if residual else None
    mean_read = mean.new_empty(0) if plan.memory_efficient else mean
    grads = launch_backward(plan, dy, dres_out, saved, w, None, mean_read, rstd, w is not None, b is not None,
                            bias=b if plan.memory_efficient else None, gate=g, alpha=a, shift=s,
                            compute_dgate=gated, compute_dscalars=a is not None)  # fmt: skip
    size = group or N
    programs = bwd_grid(M, bwd_config(size, 0, False, heavy_backward(plan)), x.device)[0]
    partials = 2 * programs * N * 4 * ((w is not None) + (b is not None)) + 2 * programs * 4 * scalars
    read = _nbytes(dy, dres_out, saved, w, b if plan.memory_efficient else None, mean_read, rstd, g, a, s)
    written = _nbytes(grads.dx, grads.dresidual, grads.dweight, grads.dbias, grads.dgate, grads.dalpha, grads.dshift)
    assert min_bytes("bwd", M, op) == read + written
    assert kernel_bytes("bwd", M, op, programs=programs) == read + written + partials
