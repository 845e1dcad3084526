"""Reference runs for the fused-kernel tests: the same call through lnblocks.norms.functional, in fp64 and eagerly.

The kernel passes when ``err(kernel vs fp64) <= 2 * err(eager in the same dtype vs fp64) + atol`` (flash-attn's rule),
for the outputs and for every gradient; the dweight/dbias atol grows with sqrt(rows) (quack's rule).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
from torch import Tensor

from lnblocks.kernels.functional import fused_add_norm
from lnblocks.kernels.plan import make_plan
from lnblocks.norms import functional as LF
from lnblocks.norms.spec import LayerNormSpec, RMSNormSpec

# CPU under the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1); the GPU when run with
# TRITON_INTERPRET=0 on a CUDA machine (benchmarks/gpu_check.sh): the same tests then check the compiled kernels.
DEVICE = torch.device("cuda" if os.environ.get("TRITON_INTERPRET", "0") != "1" and torch.cuda.is_available() else "cpu")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ATOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@dataclass
class Case:
    """Operands of one call (leaf tensors, requires_grad) and the options passed to ``fused_add_norm``."""

    x: Tensor
    residual: Tensor | None
    weight: Tensor | None
    bias: Tensor | None
    spec: LayerNormSpec | RMSNormSpec
    normalized_shape: tuple[int, ...]
    dropout_p: float = 0.0
    keep: Tensor | None = None  # (M, N) bool keep-mask, when dropout_p > 0
    out_dtype: torch.dtype | None = None

    def leaves(self) -> list[Tensor]:
        return [t for t in (self.x, self.residual, self.weight, self.bias) if t is not None]


def make_case(
    shape,
    dtype,
    spec,
    *,
    residual=False,
    residual_dtype=None,
    weight=True,
    weight_dtype=None,
    bias=None,
    normalized_shape=None,
    scale=2.0,
    offset=0.5,
) -> Case:
    """Random operands with a non-zero mean (so a missing mean subtraction shows) and non-trivial parameters."""
    normalized_shape = normalized_shape or tuple(shape[-1:])

    def randn(*size):
        return torch.randn(*size, device=DEVICE)

    x = (randn(shape) * scale + offset).to(dtype).requires_grad_()
    r = randn(shape).to(residual_dtype or dtype).requires_grad_() if residual else None
    wd = weight_dtype or dtype
    w = (randn(normalized_shape) * 0.5 + (0.0 if spec.zero_centered else 1.0)).to(wd).requires_grad_()
    if bias is None:
        bias = spec.kind == "layernorm"
    b = (randn(normalized_shape) * 0.5).to(wd).requires_grad_() if bias else None
    return Case(x, r, w if weight else None, b, spec, normalized_shape)


def reference(case: Case, fp64: bool) -> tuple[Tensor, Tensor | None]:
    """``(y, new_residual)`` of the eager math: in fp64, or in the operands' own dtypes (what torch users get)."""
    cast = (lambda t: None if t is None else t.double()) if fp64 else (lambda t: t)
    x, r, w, b = (cast(t) for t in (case.x, case.residual, case.weight, case.bias))
    plan = make_plan(
        case.spec,
        case.x.dtype,
        None if r is None else case.residual.dtype,
        None if w is None else case.weight.dtype,
        case.out_dtype,
    )
    if case.keep is not None:
        x = x * case.keep.reshape(x.shape).to(x.dtype) / (1.0 - case.dropout_p)
    z = x if r is None else LF.add_residual(x, r, case.spec.residual_in_fp32)
    s = case.spec
    if s.kind == "layernorm":
        if not fp64 and w is not None and w.dtype.itemsize < z.dtype.itemsize:  # eager CPU LN rejects this mix
            w, b = w.to(z.dtype), None if b is None else b.to(z.dtype)
        y = LF.layer_norm(z, case.normalized_shape, w, b, plan.eps, s.zero_centered)
    else:
        y = LF.rms_norm(z, case.normalized_shape, w, plan.eps, s.cast, s.zero_centered)
    if not fp64:
        y = y.to(plan.out_dtype)
    return y, (None if r is None else z)


def run_kernel(case: Case, **kwargs) -> tuple[Tensor, Tensor | None]:
    out = fused_add_norm(
        case.x,
        case.residual,
        case.weight,
        case.bias,
        case.spec,
        normalized_shape=case.normalized_shape,
        dropout_p=case.dropout_p,
        out_dtype=case.out_dtype,
        **kwargs,
    )
    return (out, None) if case.residual is None else out


def grads(outputs: tuple[Tensor, Tensor | None], case: Case, gy: Tensor, gr: Tensor | None) -> list[Tensor]:
    y, z = outputs
    outs, gouts = [y], [gy.to(y.dtype)]
    if z is not None and gr is not None:
        outs.append(z)
        gouts.append(gr.to(z.dtype))
    return list(torch.autograd.grad(outs, case.leaves(), gouts))


def max_err(a: Tensor, ref: Tensor) -> float:
    return (a.double() - ref.double()).abs().max().item() if a.numel() else 0.0


def assert_close_to_fp64(name: str, got: Tensor, eager: Tensor, ref: Tensor, atol: float) -> None:
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert not got.isnan().any(), f"{name}: NaN (an element was never written?)"
    e_kernel, e_eager = max_err(got, ref), max_err(eager, ref)
    assert e_kernel <= 2 * e_eager + atol, f"{name}: kernel err {e_kernel:.3g} > 2 * eager err {e_eager:.3g} + {atol:g}"


def check_against_references(case: Case, *, with_grads: bool = True, dres_used: bool = True, **kwargs) -> None:
    """Kernel vs fp64 vs eager for y, the new residual and (optionally) every gradient."""
    got = run_kernel(case, **kwargs)
    eager = reference(case, fp64=False)
    ref = reference(case, fp64=True)
    atol = ATOL[case.x.dtype]
    assert got[0].dtype == eager[0].dtype, f"y dtype {got[0].dtype} != eager {eager[0].dtype}"
    assert_close_to_fp64("y", got[0], eager[0], ref[0], atol)
    if case.residual is not None:
        assert got[1].dtype == eager[1].dtype, f"new_residual dtype {got[1].dtype} != eager {eager[1].dtype}"
        assert_close_to_fp64("new_residual", got[1], eager[1], ref[1], atol)
    if not with_grads:
        return
    gy = torch.randn(got[0].shape, dtype=torch.float64, device=DEVICE)
    gr = torch.randn_like(gy) if dres_used and case.residual is not None else None
    g_got, g_eager, g_ref = grads(got, case, gy, gr), grads(eager, case, gy, gr), grads(ref, case, gy, gr)
    rows = case.x.numel() // max(1, math.prod(case.normalized_shape))
    names = ["dx", "dresidual", "dweight", "dbias"]
    present = [n for n, t in zip(names, (case.x, case.residual, case.weight, case.bias)) if t is not None]
    for name, leaf, a, b, c in zip(present, case.leaves(), g_got, g_eager, g_ref):
        assert a.dtype == leaf.dtype, f"{name} dtype {a.dtype} != {leaf.dtype}"
        tol = ATOL[leaf.dtype] * (math.sqrt(rows) if name in ("dweight", "dbias") else 1.0)
        assert_close_to_fp64(name, a, b, c, tol)
