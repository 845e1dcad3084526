"""Norm, then add (``Norm.norm_then_add``, ``fused_norm_then_add``): ``residual + norm(x)`` in one kernel that reads x
and the residual and writes the new residual (and y only when asked), against the torch backend (which is bit-identical
with the unfused ``residual + norm(x)``, tests/norms/test_new_kinds.py) and fp64."""

from __future__ import annotations

import pytest
import torch

from lnblocks.kernels.functional import fused_norm_then_add
from lnblocks.norms.spec import LayerNormSpec, RMSNormSpec
from tests.kernels.kernel_helpers import ATOL, DEVICE, DTYPES, assert_close_to_fp64
from tests.kernels.module_helpers import check_call, randn

N = 40


def _new_residual(m, x, r):
    return m.norm_then_add(x, r)


def _both(m, x, r):
    return m.norm_then_add(x, r, return_normed=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("preset", ["olmo2", "gemma", "layernorm", "dyt", "derf", "l2norm"])
def test_norm_then_add_against_fp64(preset: str, dtype: torch.dtype) -> None:
    x, r = randn(3, 5, N, dtype=dtype, offset=0.3), randn(3, 5, N, dtype=dtype)
    check_call(preset, N, dtype, _new_residual, [x, r])


@pytest.mark.parametrize("preset", ["olmo2", "layernorm", "derf"])
def test_return_normed_writes_y_too(preset: str) -> None:
    """Both outputs used: y's own gradient adds to the new residual's."""
    x, r = randn(4, N, dtype=torch.bfloat16), randn(4, N, dtype=torch.bfloat16)
    triton_m, _, _ = check_call(preset, N, torch.bfloat16, _both, [x, r])
    with torch.no_grad():
        y, new = triton_m.norm_then_add(x, r, return_normed=True)
        assert torch.equal(new, triton_m.norm_then_add(x, r)), "the new residual depends on whether y is written"
        assert torch.equal(new, (y + r)), "the new residual is not residual + the rounded y"


@pytest.mark.parametrize(
    ("x_dtype", "r_dtype", "in_fp32"),
    [(torch.bfloat16, torch.float32, False), (torch.bfloat16, torch.bfloat16, True), (torch.float16, torch.bfloat16,
                                                                                        False)],
    ids=["fp32-stream", "residual_in_fp32", "mixed-halves"],
)  # fmt: skip
def test_residual_stream_dtypes(x_dtype: torch.dtype, r_dtype: torch.dtype, in_fp32: bool) -> None:
    """The new residual takes ``y + residual``'s dtype (fp32 with ``residual_in_fp32``); the residual's gradient
    is the new residual's, in the residual's dtype."""
    x, r = randn(5, N, dtype=x_dtype), randn(5, N, dtype=r_dtype)
    triton_m, torch_m, _ = check_call("olmo2", N, torch.bfloat16, _new_residual, [x, r], residual_in_fp32=in_fp32)
    with torch.no_grad():
        assert triton_m.norm_then_add(x, r).dtype == torch_m.norm_then_add(x, r).dtype


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_functional_looped_path_and_y_unused_gradient(kind: str) -> None:
    """``fused_norm_then_add`` on rows wider than one register block, and an unused new residual (y's gradient
    alone)."""
    spec = LayerNormSpec() if kind == "layernorm" else RMSNormSpec(eps=1e-6)
    x = randn(3, 100, dtype=torch.float32, offset=0.5).requires_grad_()
    r = randn(3, 100, dtype=torch.float32).requires_grad_()
    w = randn(100, dtype=torch.float32, scale=0.3, offset=1.0).requires_grad_()
    y, new = fused_norm_then_add(x, r, w, None, spec, return_normed=True, max_block_n=32)
    from lnblocks.norms import build_norm

    ref = build_norm(spec, 100, backend="torch", device=DEVICE)
    ref64 = build_norm(spec, 100, backend="torch", device=DEVICE, dtype=torch.float64)
    for m in (ref, ref64):
        with torch.no_grad():
            m.weight.copy_(w)
    y_t, new_t = ref.norm_then_add(x, r, return_normed=True)
    x64, r64 = (t.double().detach().requires_grad_() for t in (x, r))
    y_64, new_64 = ref64.norm_then_add(x64, r64, return_normed=True)
    assert_close_to_fp64("new_residual", new, new_t, new_64, ATOL[torch.float32])
    gy = torch.randn(y.shape, dtype=torch.float64, device=DEVICE)
    (g_k,), (g_t,), (g_64,) = (torch.autograd.grad(o, [leaf], gy.to(o.dtype)) for o, leaf in
                               ((y, x), (y_t, x), (y_64, x64)))  # fmt: skip
    assert_close_to_fp64("dx (y's gradient only)", g_k, g_t, g_64, ATOL[torch.float32])


def test_bad_calls_are_refused() -> None:
    from lnblocks.norms import build_norm

    norm = build_norm("olmo2", N, backend="triton", device=DEVICE)
    x = randn(2, N, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"residual: expected the same shape as x \(2, 40\), got \(1, 40\)"):
        norm.norm_then_add(x, randn(1, N, dtype=torch.float32))
    with pytest.raises(TypeError, match="return_normed must be a bool"):
        norm.norm_then_add(x, x, return_normed=1)
    with pytest.raises(TypeError, match="residual must be a floating-point tensor"):
        norm.norm_then_add(x, torch.ones(2, N, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match="gated_rmsnorm has no norm-then-add form"):
        build_norm("mamba2_gated", N, device=DEVICE).norm_then_add(x, x)
    with pytest.raises(ValueError, match=r"backend='triton' cannot run here: residual is torch\.float64"):
        norm.norm_then_add(x, x.double())
    auto = build_norm("olmo2", N, backend="auto", device=DEVICE)
    assert torch.equal(auto.norm_then_add(x, x.double()), x.double() + auto(x))  # auto falls back to torch


@pytest.mark.parametrize("call", ["gated", "norm_then_add"])
def test_weight_changed_in_place_is_replanned(call: str) -> None:
    """``weight.data = ...`` keeps the Parameter: the other call forms plan again too (never read it as the old
    dtype or past its end)."""
    from lnblocks.norms import build_norm

    preset = "qwen3_next_gated" if call == "gated" else "olmo2"
    norm, ref = (build_norm(preset, N, backend=b, device=DEVICE) for b in ("triton", "torch"))
    x, other = randn(3, N, dtype=torch.float32), randn(3, N, dtype=torch.float32)

    def run(m):
        return m(x, other) if call == "gated" else m.norm_then_add(x, other)

    run(norm)
    for m in (norm, ref):
        m.weight.data = torch.linspace(0.5, 1.5, N, device=DEVICE).to(torch.bfloat16)
    y = run(norm)
    assert y.dtype == run(ref).dtype and norm.last_backend == "triton"
    torch.testing.assert_close(y, run(ref), rtol=1e-2, atol=1e-2)
    norm.weight.data = torch.ones(N + 1, device=DEVICE)
    with pytest.raises(ValueError, match=r"^weight: expected shape \(40,\) \(normalized_shape\), got \(41,\)"):
        run(norm)
