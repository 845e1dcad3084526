"""Every option of the fused kernels: cast orders, zero-centred and optional affine, dtypes, residual dtypes, output
dtype, layouts, in-place backward, partial dW rows and 64-bit row offsets."""

from __future__ import annotations

import pytest
import torch

from lnblocks.kernels.functional import fused_add_norm
from lnblocks.kernels.launch import bwd_config, bwd_grid
from lnblocks.norms.spec import LayerNormSpec, RMSNormSpec, norm_spec
from tests.kernels.kernel_helpers import (
    ATOL,
    DEVICE,
    DTYPES,
    Case,
    check_against_references,
    make_case,
    reference,
    run_kernel,
)

N = 64


def _exact_fraction(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a == b).double().mean().item()


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("weight_dtype", [None, torch.float32], ids=["w_same", "w_fp32"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("preset", ["llama", "t5", "gemma", "olmo2"])
def test_hf_cast_orders(preset: str, dtype: torch.dtype, weight_dtype: torch.dtype | None, residual: bool) -> None:
    """Llama rounds x_hat to the input dtype before the weight, T5 to a half weight's dtype, Gemma adds 1 + w in
    fp32: the kernel must round at the same places, so it agrees with eager on almost every element, not just
    within tolerance (a wrong cast order changes ~1/3 of the elements by one ulp)."""
    case = make_case((4, N), dtype, norm_spec(preset), residual=residual, weight_dtype=weight_dtype)
    check_against_references(case)
    with torch.no_grad():
        y = run_kernel(case)[0]
        eager = reference(case, fp64=False)[0]
    assert y.dtype == eager.dtype
    if y.dtype == torch.float32:  # fp32 output: only the reduction order differs
        torch.testing.assert_close(y, eager, rtol=1e-5, atol=1e-6)
    else:
        assert _exact_fraction(y, eager) >= 0.97, f"only {_exact_fraction(y, eager):.1%} of elements equal eager"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_zero_centered_weight(kind: str, dtype: torch.dtype) -> None:
    spec = norm_spec(kind, zero_centered=True)
    check_against_references(make_case((5, N), dtype, spec, residual=True))
    # w = 2^-9: 1 + w rounds to 1 in bf16 but not in fp32 (Liger#1462), so the output must differ from w = 0.
    case = make_case((5, N), dtype, spec)
    with torch.no_grad():
        case.weight.fill_(2**-9)
        y1 = run_kernel(case)[0]
        case.weight.zero_()
        y0 = run_kernel(case)[0]
    assert not torch.equal(y1, y0), "1 + w was rounded to the weight's dtype"


@pytest.mark.parametrize(
    ("kind", "weight", "bias"),
    [("layernorm", True, False), ("layernorm", False, False), ("rmsnorm", False, False)],
    ids=["ln_w_only", "ln_no_affine", "rms_no_affine"],
)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_optional_weight_and_bias(kind: str, weight: bool, bias: bool, dtype: torch.dtype) -> None:
    check_against_references(make_case((5, N), dtype, norm_spec(kind), residual=True, weight=weight, bias=bias))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_fp32_weights_with_half_inputs(kind: str, dtype: torch.dtype) -> None:
    check_against_references(make_case((5, N), dtype, norm_spec(kind), residual=True, weight_dtype=torch.float32))


@pytest.mark.parametrize(
    ("dtype", "out_dtype"),
    [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16), (torch.float16, torch.bfloat16)],
    ids=str,
)
def test_out_dtype(dtype: torch.dtype, out_dtype: torch.dtype) -> None:
    case = make_case((5, N), dtype, LayerNormSpec(), residual=True)
    case.out_dtype = out_dtype
    check_against_references(case)


@pytest.mark.parametrize(
    ("dtype", "residual_dtype"),
    [
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.bfloat16),
    ],
    ids=str,
)
@pytest.mark.parametrize("in_fp32", [False, True], ids=["promote", "residual_in_fp32"])
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_residual_dtypes(kind: str, in_fp32: bool, dtype: torch.dtype, residual_dtype: torch.dtype) -> None:
    """The new residual has eager's dtype (fp32 or promoted) and exactly eager's values (one rounding of x + r)."""
    spec = norm_spec(kind, residual_in_fp32=in_fp32)
    case = make_case((5, N), dtype, spec, residual=True, residual_dtype=residual_dtype)
    check_against_references(case)
    with torch.no_grad():
        assert torch.equal(run_kernel(case)[1], reference(case, fp64=False)[1])


def test_unused_new_residual_gets_no_gradient_read() -> None:
    check_against_references(make_case((5, N), torch.bfloat16, RMSNormSpec(), residual=True), dres_used=False)


def test_grads_only_for_inputs_that_need_them() -> None:
    case = make_case((5, N), torch.float32, LayerNormSpec(), residual=True)
    case.weight.requires_grad_(False)
    y, z = run_kernel(case)
    dx, dr, db = torch.autograd.grad((y.sum(), z.sum()), [case.x, case.residual, case.bias])
    y_ref, z_ref = reference(case, fp64=False)
    ex, er, eb = torch.autograd.grad((y_ref.sum(), z_ref.sum()), [case.x, case.residual, case.bias])
    for a, b in ((dx, ex), (dr, er), (db, eb)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_multi_dim_normalized_shape_and_leading_dims() -> None:
    case = make_case((2, 3, 4, 16), torch.bfloat16, LayerNormSpec(), residual=True, normalized_shape=(4, 16))
    check_against_references(case)


def test_strided_and_noncontiguous_inputs() -> None:
    """A row-strided slice runs in place (no copy), a transposed tensor is copied, and both give the right answer."""
    spec = RMSNormSpec(eps=1e-6)
    wide = torch.randn(6, 2 * N, dtype=torch.bfloat16, device=DEVICE)
    x = wide[:, 3 : 3 + N].requires_grad_()  # row stride 2N, unit column stride
    r = torch.randn(N, 6, dtype=torch.bfloat16, device=DEVICE).t().requires_grad_()  # column stride 6: copied
    w = torch.randn(N, dtype=torch.bfloat16, device=DEVICE).requires_grad_()
    check_against_references(Case(x, r, w, None, spec, (N,)))


def test_expanded_output_gradient() -> None:
    """``y.sum().backward()`` hands the kernel a stride-0 dy."""
    case = make_case((5, N), torch.float32, LayerNormSpec())
    (dx,) = torch.autograd.grad(run_kernel(case)[0].sum(), [case.x])
    (ex,) = torch.autograd.grad(reference(case, fp64=False)[0].sum(), [case.x])
    torch.testing.assert_close(dx, ex, atol=1e-5, rtol=1e-5)


def test_empty_batch() -> None:
    case = make_case((0, N), torch.float32, LayerNormSpec(), residual=True)
    y, z = run_kernel(case)
    assert y.shape == z.shape == (0, N)
    dx, dr, dw, db = torch.autograd.grad((y.sum() + z.sum(),), case.leaves())
    zeros = torch.zeros(N, device=DEVICE)
    assert dx.shape == dr.shape == (0, N) and torch.equal(dw, zeros) and torch.equal(db, zeros)


@pytest.mark.parametrize("inplace", [False, True], ids=["default", "inplace_backward"])
def test_dx_overwrites_dy_only_when_asked(inplace: bool) -> None:
    case = make_case((5, N), torch.float32, LayerNormSpec())
    y = run_kernel(case, inplace_backward=inplace)[0]
    dy = torch.randn_like(y)
    dy_before = dy.clone()
    (dx,) = torch.autograd.grad(y, [case.x], dy)
    (ex,) = torch.autograd.grad(reference(case, fp64=False)[0], [case.x], dy_before)
    torch.testing.assert_close(dx, ex, atol=1e-5, rtol=1e-5)
    if inplace:
        assert dx.data_ptr() == dy.data_ptr() and torch.equal(dy, dx)
    else:
        assert torch.equal(dy, dy_before), "dy was modified"


def test_idle_programs_write_their_partial_rows_and_dw_is_deterministic() -> None:
    """One row more than the backward has programs: 2 rows per program, so the last programs own none, and their
    (NaN-poisoned) dW partial rows must still be written."""
    m = bwd_grid(10**6, bwd_config(N), DEVICE)[0] + 1
    programs, per_program = bwd_grid(m, bwd_config(N), DEVICE)
    assert programs * per_program - m >= per_program, "the split no longer leaves a program without rows"
    for max_block_n in (0, 16):  # register-block and looped paths
        case = make_case((m, N), torch.bfloat16, LayerNormSpec(), residual=True)
        y = run_kernel(case, max_block_n=max_block_n)[0]
        gy = torch.randn_like(y)
        first = torch.autograd.grad(y, [case.weight, case.bias], gy, retain_graph=True)
        second = torch.autograd.grad(y, [case.weight, case.bias], gy)
        for a, b in zip(first, second):
            assert not a.isnan().any()
            assert torch.equal(a, b), "dW/dB differ between two identical backward passes"
        check_against_references(case, max_block_n=max_block_n)


def test_row_offsets_are_64_bit() -> None:
    """Rows 2^20 elements apart: row 2048 starts at element 2^31. With 32-bit offsets the kernel would read and
    write the wrong rows. Only the touched pages of the 4 GiB virtual buffer are ever committed."""
    torch.utils.deterministic.fill_uninitialized_memory = False  # do not write 4 GiB of NaN
    m, n, stride = 2100, 8, 2**20
    storage = torch.empty(m * stride, dtype=torch.bfloat16, device=DEVICE)
    x = storage.as_strided((m, n), (stride, 1))
    x.copy_(torch.randn(m, n))
    spec = RMSNormSpec(eps=1e-6)
    w = torch.randn(n, dtype=torch.bfloat16, device=DEVICE)
    x_leaf = x.detach().requires_grad_()
    y = fused_add_norm(x_leaf, None, w, None, spec)
    ref = reference(Case(x.double(), None, w.double(), None, spec, (n,)), fp64=True)[0]
    assert (y.double() - ref).abs().max().item() <= ATOL[torch.bfloat16]
    (dx,) = torch.autograd.grad(y, [x_leaf], torch.ones_like(y))
    x64 = x.double().requires_grad_()
    ref = reference(Case(x64, None, w.double(), None, spec, (n,)), fp64=True)[0]
    (ex,) = torch.autograd.grad(ref, [x64], torch.ones_like(ref))
    assert (dx.double() - ex).abs().max().item() <= 4 * ATOL[torch.bfloat16]
