"""What ``torch.nn.LayerNorm``/``RMSNorm`` accept, lnblocks accepts with the same numbers (eps=0, numpy sizes).

eps=0 is legal in torch and in HF configs (``layer_norm_eps=0``); lnblocks refused it. numpy integer sizes (what
``np.prod``/``shape`` arithmetic gives) are accepted by torch's constructors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import lnblocks
from tests.norms.helpers import DTYPES, copy_params, randomize_, run_fwd_bwd


def _assert_same(ours: nn.Module, ref: nn.Module, x: torch.Tensor) -> None:
    g = torch.randn_like(x)
    y_ref, grads_ref = run_fwd_bwd(ref, x, g)
    y, grads = run_fwd_bwd(ours, x, g)
    assert torch.equal(y, y_ref)
    for a, b in zip(grads, grads_ref, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_eps_zero_matches_torch(kind: str, dtype: torch.dtype) -> None:
    ref_cls = nn.LayerNorm if kind == "layernorm" else nn.RMSNorm
    ref = randomize_(ref_cls(24, eps=0.0, dtype=dtype))
    ours = lnblocks.build_norm(kind, 24, eps=0.0, dtype=dtype)
    assert ours.spec.eps == 0.0  # not None: RMSNorm's eps=None means finfo.eps, 0 means 0
    copy_params(ref, ours)
    _assert_same(ours, ref, (torch.randn(3, 5, 24) * 0.1).to(dtype))


def test_eps_zero_is_really_zero() -> None:
    """With eps=0 a row of identical values is 0/0 = nan in torch; eps=None/1e-6 would hide it."""
    x = torch.ones(1, 8)
    assert torch.isnan(nn.LayerNorm(8, eps=0.0)(x)).all()
    assert torch.isnan(lnblocks.LayerNorm(8, eps=0.0)(x)).all()
    x = torch.randn(2, 8) * 1e-10  # mean(x²) ~1e-20: only eps=0 normalises it
    y = lnblocks.RMSNorm(8, eps=0)(x)
    assert torch.equal(y, nn.RMSNorm(8, eps=0.0)(x))
    torch.testing.assert_close(y.double(), x.double() / x.double().pow(2).mean(-1, keepdim=True).sqrt())


@pytest.mark.parametrize(
    "shape", [np.int64(16), np.int32(16), (np.int64(4), np.int64(4)), torch.Size([16]), [np.int16(16)]], ids=repr
)
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_numpy_integer_sizes(shape, kind: str) -> None:
    ref = (nn.LayerNorm if kind == "layernorm" else nn.RMSNorm)(shape)
    ours = lnblocks.build_norm(kind, shape)
    assert ours.normalized_shape == tuple(int(d) for d in ref.normalized_shape)
    assert all(type(d) is int for d in ours.normalized_shape)
    randomize_(ref)
    copy_params(ref, ours)
    _assert_same(ours, ref, torch.randn(3, 16).reshape(3, *ref.normalized_shape))


def test_numpy_scalars_in_specs_and_configs() -> None:
    assert lnblocks.LayerNorm(8, eps=np.float32(0.5)).spec.eps == 0.5
    assert type(lnblocks.RMSNormSpec(eps=np.float64(1e-6)).eps) is float
    cfg = lnblocks.BlockConfig(dim=np.int64(32), attention={"n_heads": np.int64(4)}, mlp={"hidden_dim": np.int32(8)})
    assert (type(cfg.dim), type(cfg.attention.n_heads), type(cfg.mlp.hidden_dim)) == (int, int, int)
    assert lnblocks.Block(cfg, np.int64(1), np.int64(2)).layer_idx == 1
