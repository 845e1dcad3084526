"""The unified view: ``normalize(x, dims, groups=...)`` equals every native torch norm, outputs and grads, and the
shared running-statistics rule equals torch.nn.BatchNorm's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lnblocks.cnn import batch_moments, moments, normalize, update_running_stats
from tests.cnn.cnn_helpers import TOL, shifted_input

SHAPE = (3, 8, 5, 6)


def _native(kind: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    c = x.shape[1]
    if kind == "batch":
        return F.batch_norm(x, None, None, w, b, True, 0.0, eps)
    if kind == "instance":
        return F.instance_norm(x, weight=w, bias=b, eps=eps)
    if kind == "group":
        return F.group_norm(x, 4, w, b, eps)
    if kind == "layer_chw":  # Ba et al.'s LN over (C, H, W) with a per-channel affine = GroupNorm(1, C)
        return F.group_norm(x, 1, w, b, eps)
    if kind == "layer2d":  # ConvNeXt's: nn.LayerNorm(C) on the channels-last view
        return F.layer_norm(x.permute(0, 2, 3, 1), (c,), w, b, eps).permute(0, 3, 1, 2)
    raise AssertionError(kind)


UNIFIED = {
    "batch": {"dims": (0, 2, 3)},
    "instance": {"dims": (2, 3)},
    "group": {"dims": (1, 2, 3), "groups": 4},
    "layer_chw": {"dims": (1, 2, 3)},
    "layer2d": {"dims": (1,)},
}


@pytest.mark.parametrize("kind", list(UNIFIED))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_normalize_is_every_native_norm(kind: str, dtype: torch.dtype) -> None:
    eps = 1e-5
    x64 = shifted_input(SHAPE, torch.float64)
    w64 = torch.rand(SHAPE[1], dtype=torch.float64) + 0.5
    b64 = torch.randn(SHAPE[1], dtype=torch.float64)
    g64 = torch.randn(SHAPE, dtype=torch.float64)

    def run(fn, dt):
        x, w, b = (t.to(dt).requires_grad_(True) for t in (x64, w64, b64))
        y = fn(x, w, b)
        grads = torch.autograd.grad(y, [x, w, b], g64.to(dt))
        return [t.detach().double() for t in (y, *grads)]

    ours = run(lambda x, w, b: normalize(x, weight=w, bias=b, eps=eps, **UNIFIED[kind]), dtype)
    native = run(lambda x, w, b: _native(kind, x, w, b, eps), dtype)
    exact = run(lambda x, w, b: _native(kind, x, w, b, eps), torch.float64)
    for name, o, n, e in zip(["y", "dx", "dw", "db"], ours, native, exact, strict=True):
        if dtype in (torch.float64, torch.float32):
            torch.testing.assert_close(o, n, **TOL[dtype], msg=f"{kind} {name}")
        else:  # half inputs: no worse than the native kernel in the same dtype, against fp64
            err_ours = (o - e).abs().max().item()
            err_native = (n - e).abs().max().item()
            assert err_ours <= 2 * err_native + TOL[dtype]["atol"], (name, err_ours, err_native)
    assert normalize(x64.to(dtype), **UNIFIED[kind]).dtype == dtype


def test_normalize_with_given_statistics_and_negative_dims() -> None:
    x = shifted_input(SHAPE, torch.float64)
    mean, var = moments(x, (0, 2, 3))
    assert mean.shape == (1, SHAPE[1], 1, 1)
    torch.testing.assert_close(normalize(x, (0, -2, -1), mean=mean, var=var), normalize(x, (0, 2, 3)))
    rm, rv = torch.randn(SHAPE[1], dtype=torch.float64), torch.rand(SHAPE[1], dtype=torch.float64) + 0.5
    expected = F.batch_norm(x, rm, rv, None, None, False, 0.0, 1e-5)
    torch.testing.assert_close(normalize(x, (0, 2, 3), mean=rm.view(1, -1, 1, 1), var=rv.view(1, -1, 1, 1)), expected)


@pytest.mark.parametrize("momentum", [0.1, 0.7])
def test_update_running_stats_matches_torch_batchnorm(momentum: float) -> None:
    x = shifted_input((4, 5, 3, 2))
    rm_ref, rv_ref = torch.randn(5), torch.rand(5) + 0.5
    rm, rv = rm_ref.clone(), rv_ref.clone()
    F.batch_norm(x, rm_ref, rv_ref, None, None, True, momentum, 1e-5)
    mean, var = moments(x, (0, 2, 3))
    update_running_stats(rm, rv, mean, var, count=4 * 3 * 2, factor=momentum)
    torch.testing.assert_close(rm, rm_ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(rv, rv_ref, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dims": ()}, "dims must be distinct"),
        ({"dims": (0, 4)}, "dims must be distinct"),
        ({"dims": (2, -2)}, "dims must be distinct"),
        ({"dims": 1}, "dims must be a sequence"),
        ({"dims": (1,), "groups": 3}, "groups must be a positive int dividing the 8 channels"),
        ({"dims": (1,), "weight": torch.ones(7)}, r"weight: expected shape \(8,\)"),
        ({"dims": (1,), "mean": torch.zeros(1)}, "mean and var must be given together"),
    ],
)
def test_normalize_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        normalize(torch.randn(SHAPE), **kwargs)


def test_normalize_rejects_bad_inputs() -> None:
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        normalize(torch.ones(2, 3, dtype=torch.long), (0,))
    with pytest.raises(ValueError, match="x: expected a"):
        normalize(torch.randn(5), (0,))
    with pytest.raises(ValueError, match="count"):
        update_running_stats(torch.zeros(2), torch.ones(2), torch.zeros(2), torch.ones(2), 1, 0.1)


@pytest.mark.parametrize("shape", [(5, 3), (4, 3, 7), (2, 3, 4, 5), (2, 3, 2, 3, 4)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_batch_moments_are_batchnorm_statistics(shape, dtype, channels_last) -> None:
    x = shifted_input(shape, dtype)
    if channels_last and len(shape) == 4:
        x = x.to(memory_format=torch.channels_last)
    mean, var = batch_moments(x)
    assert mean.shape == var.shape == (shape[1],) and mean.dtype == torch.promote_types(dtype, torch.float32)
    var64, mean64 = torch.var_mean(x.double(), dim=(0, *range(2, len(shape))), correction=0)
    tol = {"atol": 1e-12, "rtol": 1e-12} if dtype == torch.float64 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(mean.double(), mean64, **tol)
    torch.testing.assert_close(var.double(), var64, **tol)
