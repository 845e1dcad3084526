"""Zero-centred weights, DyT, ScaleNorm and the identity norm against fp64 formulas written out here."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import lnblocks
from tests.norms.helpers import DTYPES, SIZES, randomize_

# Max error allowed against fp64, relative to the output's scale: a few ulps of the dtype.
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _max_err(y: torch.Tensor, ref64: torch.Tensor) -> float:
    return ((y.double() - ref64).abs().max() / ref64.abs().max().clamp_min(1)).item()


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_zero_centered_layernorm(n: int, dtype: torch.dtype, bias: bool) -> None:
    norm = randomize_(lnblocks.LayerNorm(n, bias=bias, zero_centered=True, dtype=dtype))
    x = torch.randn(4, n).to(dtype)
    x64 = x.double()
    b64 = norm.bias.double() if bias else 0.0
    ref = F.layer_norm(x64, (n,), eps=1e-5) * (1 + norm.weight.double()) + b64
    assert _max_err(norm(x), ref) <= TOL[dtype]
    # the same module without the offset must be a different function (the test can fail)
    plain = lnblocks.LayerNorm(n, bias=bias, dtype=dtype)
    plain.load_state_dict(norm.state_dict())
    if n > 1:
        assert not torch.allclose(plain(x).double(), ref, atol=TOL[dtype] * 10)


def test_zero_centered_init_is_identity_scale() -> None:
    for module in (lnblocks.LayerNorm(8, zero_centered=True), lnblocks.RMSNorm(8, zero_centered=True)):
        assert torch.equal(module.weight, torch.zeros(8))
        x = torch.randn(3, 8)
        plain = lnblocks.build_norm(module.spec.replace(zero_centered=False), 8)
        assert torch.equal(module(x), plain(x))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("affine", "bias"), [(True, True), (True, False), (False, False)])
def test_dyt_formula(n: int, dtype: torch.dtype, affine: bool, bias: bool) -> None:
    norm = randomize_(lnblocks.DyT(n, alpha_init=0.5, elementwise_affine=affine, bias=bias, dtype=dtype))
    x = (torch.randn(4, n) * 3).to(dtype)
    ref = torch.tanh(norm.alpha.double() * x.double())
    if affine:
        ref = ref * norm.weight.double()
    if bias:
        ref = ref + norm.bias.double()
    y = norm(x)
    assert y.dtype == dtype and _max_err(y, ref) <= TOL[dtype]


def test_dyt_init_follows_paper() -> None:
    norm = lnblocks.DyT(16)
    assert norm.alpha.item() == 0.5
    assert torch.equal(norm.weight, torch.ones(16)) and torch.equal(norm.bias, torch.zeros(16))
    assert sorted(norm.state_dict()) == ["alpha", "bias", "weight"]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_scalenorm_formula(n: int, dtype: torch.dtype) -> None:
    norm = lnblocks.ScaleNorm(n, dtype=dtype)
    assert norm.scale.item() == pytest.approx(math.sqrt(n), rel=1e-2)
    x = torch.randn(4, n).to(dtype)
    x64 = x.double()
    ref = norm.scale.double() * x64 / x64.norm(dim=-1, keepdim=True).clamp_min(1e-5)
    assert _max_err(norm(x), ref) <= TOL[dtype]


def test_scalenorm_zero_row_is_finite() -> None:
    y = lnblocks.ScaleNorm(8)(torch.zeros(2, 8))
    assert torch.equal(y, torch.zeros(2, 8))


def test_none_is_identity_and_keeps_residual_convention() -> None:
    norm = lnblocks.build_norm("none", 8)
    x, r = torch.randn(3, 8), torch.randn(3, 8)
    assert norm(x) is x
    y, new_r = norm(x, residual=r)
    assert torch.equal(y, x + r) and torch.equal(new_r, x + r)
    assert list(norm.parameters()) == []
