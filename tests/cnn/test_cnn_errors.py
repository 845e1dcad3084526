"""Bad arguments and bad inputs raise ValueError/TypeError naming the argument, never a silent wrong answer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import lnblocks.cnn as C


@pytest.mark.parametrize(
    ("module", "x", "match"),
    [
        # wrong channel count
        (C.BatchNorm2d(4), torch.randn(2, 3, 4, 4), "x: BatchNorm2d has num_features=4 but the input has 3 channels"),
        (C.BatchNorm1d(4), torch.randn(2, 5), "num_features=4 but the input has 5"),
        (C.SyncBatchNorm(4), torch.randn(2, 3, 4), "num_features=4 but the input has 3"),
        (C.InstanceNorm2d(4), torch.randn(2, 3, 4, 4), "num_features=4 but the input has 3"),  # torch only warns
        (C.InstanceNorm1d(4), torch.randn(3, 5), "num_features=4 but the input has 3 channels"),  # unbatched (C, L)
        (C.GroupNorm(2, 4), torch.randn(2, 6, 3), "x: GroupNorm has num_channels=4 but the input has 6"),
        (C.LayerNorm2d(4), torch.randn(2, 3, 4, 4), "x: LayerNorm2d has num_channels=4 but the input has 3"),
        (C.BatchRenorm2d(4), torch.randn(2, 3, 4, 4), "num_features=4 but the input has 3"),
        # wrong rank
        (C.BatchNorm2d(3), torch.randn(2, 3, 4), r"x: BatchNorm2d expects a 4-D input \(N, C, H, W\), got a 3-D"),
        (C.BatchNorm1d(3), torch.randn(2, 3, 4, 4), "expects a 2-D or 3-D input"),
        (C.BatchNorm3d(3), torch.randn(2, 3, 4, 4), "expects a 5-D input"),
        (C.SyncBatchNorm(3), torch.randn(3), "expects a 2-D or 3-D or 4-D or 5-D input"),
        (C.InstanceNorm2d(3), torch.randn(2, 3, 4, 4, 4), "expects a 3-D or 4-D input"),
        (C.GroupNorm(1, 3), torch.randn(3), "x: GroupNorm expects a"),
        (C.LayerNorm2d(3), torch.randn(2, 3, 4), "x: LayerNorm2d expects a 4-D input"),
        (C.BatchRenorm2d(3), torch.randn(2, 3), "expects a 4-D input"),
        # one value per channel in training
        (C.BatchNorm2d(3), torch.randn(1, 3, 1, 1), "x: BatchNorm2d needs more than 1 value per channel"),
        (C.BatchNorm1d(3), torch.randn(1, 3), "needs more than 1 value per channel"),
        (C.SyncBatchNorm(3), torch.randn(1, 3), "needs more than 1 value per channel"),
        (C.BatchNorm2d(3, track_running_stats=False).eval(), torch.randn(1, 3, 1, 1), "more than 1 value"),
        (C.BatchRenorm2d(3), torch.randn(1, 3, 1, 1), "needs more than 1 value per channel"),
        (C.InstanceNorm2d(3), torch.randn(4, 3, 1, 1), "x: InstanceNorm2d needs more than 1 value per channel"),
    ],
)
def test_bad_input_raises_value_error_naming_x(module: nn.Module, x: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        module(x)


def test_single_value_per_channel_is_fine_in_eval() -> None:
    x = torch.randn(1, 3, 1, 1)
    for m in (C.BatchNorm2d(3), C.BatchRenorm2d(3), C.InstanceNorm2d(3, track_running_stats=True)):
        assert m.eval()(x).shape == x.shape


@pytest.mark.parametrize(
    "module", [C.BatchNorm2d(3), C.GroupNorm(1, 3), C.LayerNorm2d(3), C.InstanceNorm2d(3), C.BatchRenorm2d(3)]
)
def test_non_float_input_raises_type_error(module: nn.Module) -> None:
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        module(torch.ones(2, 3, 4, 4, dtype=torch.long))
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor"):
        module([[1.0]])


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: C.GroupNorm(4, 6), ValueError, r"num_groups \(4\) must divide num_channels \(6\)"),
        (lambda: C.GroupNorm(0, 6), ValueError, "num_groups must be positive"),
        (lambda: C.GroupNorm(2.0, 6), TypeError, "num_groups must be an int"),
        (lambda: C.BatchNorm2d(0), ValueError, "num_features must be positive"),
        (lambda: C.BatchNorm2d(True), TypeError, "num_features must be an int"),
        (lambda: C.BatchNorm2d(3, eps=-1.0), ValueError, "eps must be a finite number >= 0"),
        (lambda: C.BatchNorm2d(3, momentum=1.5), ValueError, r"momentum must be in \[0, 1\]"),
        (lambda: C.BatchNorm2d(3, momentum="0.1"), TypeError, "momentum must be a float"),
        (lambda: C.BatchNorm2d(3, affine=1), TypeError, "affine must be a bool"),
        (lambda: C.InstanceNorm2d(3, momentum=None, track_running_stats=True), ValueError, "momentum=None"),
        (lambda: C.LayerNorm2d(-2), ValueError, "num_channels must be positive"),
        (lambda: C.BatchRenorm2d(3, r_max=0.5), ValueError, "r_max must be a finite number >= 1"),
        (lambda: C.BatchRenorm2d(3, d_max=-1.0), ValueError, "d_max must be a finite number >= 0"),
        (lambda: C.BatchRenorm2d(3, warmup_steps=-1), ValueError, "warmup_steps must be an int >= 0"),
        (lambda: C.BatchRenorm2d(3, r_ramp_steps=1.5), ValueError, "r_ramp_steps must be an int >= 0"),
    ],
)
def test_bad_constructor_arguments(build, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        build()
