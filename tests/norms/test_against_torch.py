"""lnblocks.LayerNorm / RMSNorm against torch.nn.LayerNorm / RMSNorm: identical outputs, grads and state_dicts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import lnblocks
from tests.norms.helpers import DTYPES, SIZES, copy_params, randomize_, run_fwd_bwd


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("affine", "bias"), [(True, True), (True, False), (False, False)])
def test_layernorm_matches_torch_bitwise(n: int, dtype: torch.dtype, affine: bool, bias: bool) -> None:
    ref = randomize_(nn.LayerNorm(n, eps=1e-5, elementwise_affine=affine, bias=bias, dtype=dtype))
    ours = lnblocks.LayerNorm(n, eps=1e-5, elementwise_affine=affine, bias=bias, dtype=dtype)
    copy_params(ref, ours)
    x = torch.randn(3, 5, n).to(dtype) * 2 + 0.5
    g = torch.randn(3, 5, n).to(dtype)
    y_ref, grads_ref = run_fwd_bwd(ref, x, g)
    y, grads = run_fwd_bwd(ours, x, g)
    assert y.dtype == y_ref.dtype
    assert torch.equal(y, y_ref)
    for a, b in zip(grads, grads_ref, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eps", [None, 1e-6])
@pytest.mark.parametrize("affine", [True, False])
def test_rmsnorm_matches_torch(n: int, dtype: torch.dtype, eps: float | None, affine: bool) -> None:
    ref = randomize_(nn.RMSNorm(n, eps=eps, elementwise_affine=affine, dtype=dtype))
    ours = lnblocks.RMSNorm(n, eps=eps, elementwise_affine=affine, dtype=dtype)
    copy_params(ref, ours)
    x = torch.randn(3, 5, n).to(dtype) * 0.1  # small values make eps matter
    g = torch.randn(3, 5, n).to(dtype)
    y_ref, grads_ref = run_fwd_bwd(ref, x, g)
    y, grads = run_fwd_bwd(ours, x, g)
    assert torch.equal(y, y_ref), "forward must equal F.rms_norm bit for bit"
    for a, b in zip(grads, grads_ref, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("shape", [(4, 6), (2, 3, 5)])
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_multi_dim_normalized_shape(shape: tuple[int, ...], kind: str) -> None:
    ref = nn.LayerNorm(shape) if kind == "layernorm" else nn.RMSNorm(shape, eps=1e-6)
    randomize_(ref)
    ours = lnblocks.build_norm(kind, shape, **({"eps": 1e-6} if kind == "rmsnorm" else {}))
    copy_params(ref, ours)
    x = torch.randn(7, *shape)
    assert torch.equal(ours(x), ref(x))


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_state_dict_round_trip_both_ways(kind: str) -> None:
    torch_cls, ours_cls = (nn.LayerNorm, lnblocks.LayerNorm) if kind == "layernorm" else (nn.RMSNorm, lnblocks.RMSNorm)
    ref, ours = randomize_(torch_cls(16)), ours_cls(16)
    ours.load_state_dict(ref.state_dict(), strict=True)
    back = torch_cls(16)
    back.load_state_dict(randomize_(ours).state_dict(), strict=True)
    assert list(ref.state_dict()) == list(ours.state_dict())
    for k, v in ours.state_dict().items():
        assert torch.equal(back.state_dict()[k], v)


def test_constructor_defaults_match_torch() -> None:
    ln, tln = lnblocks.LayerNorm(8), nn.LayerNorm(8)
    assert (ln.eps, ln.elementwise_affine, ln.normalized_shape) == (
        tln.eps,
        tln.elementwise_affine,
        tln.normalized_shape,
    )
    assert torch.equal(ln.weight, tln.weight) and torch.equal(ln.bias, tln.bias)
    rms, trms = lnblocks.RMSNorm(8), nn.RMSNorm(8)
    assert (rms.eps, rms.elementwise_affine, rms.normalized_shape) == (
        trms.eps,
        trms.elementwise_affine,
        trms.normalized_shape,
    )
    assert torch.equal(rms.weight, trms.weight)
    assert lnblocks.LayerNorm(8, bias=False).bias is None
    assert len(lnblocks.LayerNorm(8, elementwise_affine=False).state_dict()) == 0
