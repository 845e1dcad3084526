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
        # the rest of the family
        (C.SwitchableNorm2d(4), torch.randn(2, 3, 4, 4), "x: SwitchableNorm2d has num_features=4 but the input has 3"),
        (C.SwitchableNorm2d(3), torch.randn(2, 3, 4), r"x: SwitchableNorm2d expects a 4-D input \(N, C, H, W\)"),
        (C.SwitchableNorm2d(3), torch.randn(1, 3, 1, 1), "x: SwitchableNorm2d needs more than 1 value per channel"),
        (C.FRN2d(4), torch.randn(2, 3, 4, 4), "x: FRN2d has num_features=4 but the input has 3 channels"),
        (C.FRN2d(3), torch.randn(2, 3, 4), "x: FRN2d expects a 4-D input"),
        (C.TLU(4), torch.randn(2, 3), "x: TLU has num_features=4 but the input has 3 channels"),
        (C.TLU(3), torch.randn(3), "x: TLU expects a 2-D or 3-D or 4-D or 5-D input"),
        (C.EvoNormB0(4), torch.randn(2, 3, 4, 4), "x: EvoNormB0 has num_features=4 but the input has 3 channels"),
        (C.EvoNormB0(3), torch.randn(2, 3, 4, 4, 4), "x: EvoNormB0 expects a 4-D input"),
        (C.EvoNormB0(3), torch.randn(1, 3, 1, 1), "x: EvoNormB0 needs more than 1 value per channel"),
        (C.EvoNormS0(4), torch.randn(2, 3, 4, 4), "x: EvoNormS0 has num_features=4 but the input has 3 channels"),
        (C.EvoNormS0(3), torch.randn(2, 3), "x: EvoNormS0 expects a 4-D input"),
        (
            C.WSConv2d(3, 4, 3),
            torch.randn(2, 5, 6, 6),
            r"x: WSConv2d has in_channels=3 but the input has 5 channels \(dim 1",
        ),
        (
            C.WSConv2d(3, 4, 3),
            torch.randn(5, 6, 6),
            r"x: WSConv2d has in_channels=3 but the input has 5 channels \(dim 0",
        ),
        (C.ScaledWSConv2d(3, 4, 3), torch.randn(1, 2, 3, 6, 6), "x: ScaledWSConv2d expects a 3-D or 4-D input"),
    ],
)
def test_bad_input_raises_value_error_naming_x(module: nn.Module, x: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        module(x)


def test_single_value_per_channel_is_fine_in_eval() -> None:
    x = torch.randn(1, 3, 1, 1)
    for m in (
        C.BatchNorm2d(3),
        C.BatchRenorm2d(3),
        C.InstanceNorm2d(3, track_running_stats=True),
        C.SwitchableNorm2d(3),
        C.EvoNormB0(3),
    ):
        assert m.eval()(x).shape == x.shape


@pytest.mark.parametrize(
    "module",
    [
        C.BatchNorm2d(3),
        C.GroupNorm(1, 3),
        C.LayerNorm2d(3),
        C.InstanceNorm2d(3),
        C.BatchRenorm2d(3),
        C.SwitchableNorm2d(3),
        C.FRN2d(3),
        C.TLU(3),
        C.EvoNormB0(3),
        C.EvoNormS0(3),
        C.WSConv2d(3, 2, 1),
        C.ScaledWSConv2d(3, 2, 1),
    ],
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
        (lambda: C.BatchNorm2d(3, momentum=1.5), ValueError, r"momentum must be a float in \[0, 1\] or None"),
        (lambda: C.BatchNorm2d(3, momentum="0.1"), TypeError, "momentum must be a float"),
        (lambda: C.BatchNorm2d(3, affine=1), TypeError, "affine must be a bool"),
        (lambda: C.InstanceNorm2d(3, momentum=None, track_running_stats=True), ValueError, "momentum=None"),
        (lambda: C.LayerNorm2d(-2), ValueError, "num_channels must be positive"),
        (lambda: C.BatchRenorm2d(3, r_max=0.5), ValueError, "r_max must be a finite number >= 1"),
        (lambda: C.BatchRenorm2d(3, d_max=-1.0), ValueError, "d_max must be a finite number >= 0"),
        (lambda: C.BatchRenorm2d(3, warmup_steps=-1), ValueError, "warmup_steps must be an int >= 0"),
        (lambda: C.BatchRenorm2d(3, r_ramp_steps=1.5), ValueError, "r_ramp_steps must be an int >= 0"),
        (lambda: C.SwitchableNorm2d(0), ValueError, "num_features must be positive"),
        (lambda: C.SwitchableNorm2d(3, momentum=2.0), ValueError, r"momentum must be a float in \[0, 1\]"),
        (lambda: C.SwitchableNorm2d(3, eps=float("nan")), ValueError, "eps must be a finite number >= 0"),
        (lambda: C.SwitchableNorm2d(3, affine="yes"), TypeError, "affine must be a bool"),
        (lambda: C.FRN2d(3, eps=-1e-6), ValueError, "eps must be a finite number >= 0"),
        (lambda: C.FRN2d(3, learnable_eps=1), TypeError, "learnable_eps must be a bool"),
        (lambda: C.FRN2d(2.0), TypeError, "num_features must be an int"),
        (lambda: C.TLU(0), ValueError, "num_features must be positive"),
        (lambda: C.EvoNormB0(3, momentum=None), TypeError, r"momentum must be a float in \[0, 1\], got None"),
        (lambda: C.EvoNormB0(3, momentum=1.5), ValueError, r"momentum must be a float in \[0, 1\], got 1.5"),
        (lambda: C.EvoNormB0(3, eps=float("inf")), ValueError, "eps must be a finite number >= 0"),
        (lambda: C.EvoNormS0(3, groups=0), ValueError, "groups must be positive"),
        (lambda: C.EvoNormS0(3, groups=2.5), TypeError, "groups must be an int"),
        (lambda: C.WSConv2d(3, 4, 3, eps=-1.0), ValueError, "eps must be a finite number >= 0"),
        (lambda: C.ScaledWSConv2d(3, 4, 3, gamma=0.0), ValueError, "gamma must be a finite number > 0"),
        (lambda: C.ScaledWSConv2d(3, 4, 3, gamma=True), ValueError, "gamma must be a finite number > 0"),
        (lambda: C.ScaledWSConv2d(3, 4, 3, eps=-1e-4), ValueError, "eps must be a finite number >= 0"),
        (lambda: C.AdaIN(eps=-1.0), ValueError, "eps must be a finite number >= 0"),
    ],
)
def test_bad_constructor_arguments(build, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        build()


@pytest.mark.parametrize(
    ("content", "style", "error", "match"),
    [
        (torch.randn(2, 3), torch.randn(2, 3, 4), ValueError, r"content: expected \(N, C, \*\) with at least one"),
        (torch.randn(2, 3, 1, 1), torch.randn(2, 3, 4, 4), ValueError, "content: AdaIN needs more than 1 spatial"),
        (torch.ones(2, 3, 4, dtype=torch.long), torch.randn(2, 3, 4), TypeError, "content must be a floating-point"),
        (torch.randn(2, 3, 4, 4), torch.randn(2, 5, 4, 4), ValueError, r"style: expected a feature map .* C=3"),
        (torch.randn(2, 3, 4, 4), torch.randn(3, 3, 4, 4), ValueError, r"style: .*N=2 or 1"),
        (torch.randn(2, 3, 4, 4), torch.randn(2, 3), ValueError, "style: expected a feature map"),
        (torch.randn(2, 3, 4, 4), "style", TypeError, r"style must be a feature map tensor .* or a \(mean, std\)"),
        (torch.randn(2, 3, 4, 4), (torch.zeros(3),), TypeError, "style must be a feature map tensor"),
        (torch.randn(2, 3, 4, 4), (torch.zeros(3), torch.ones(4)), ValueError, r"style std: expected shape \(2, 3\)"),
        (torch.randn(2, 3, 4, 4), (torch.zeros(2, 3, 1, 1), torch.ones(3)), ValueError, "style mean: expected shape"),
        (torch.randn(2, 3, 4, 4), (torch.zeros(3), [1.0, 1.0, 1.0]), TypeError, r"style std must be a torch\.Tensor"),
    ],
)
def test_adain_bad_input(content, style, error, match) -> None:
    with pytest.raises(error, match=match):
        C.adaptive_instance_norm(content, style)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"clipping": 0.0}, ValueError, "clipping must be a finite number > 0"),
        ({"clipping": float("nan")}, ValueError, "clipping must be a finite number > 0"),
        ({"eps": 0.0}, ValueError, "eps must be a finite number > 0"),
        ({"eps": "1e-3"}, ValueError, "eps must be a finite number > 0"),
    ],
)
def test_adaptive_grad_clip_bad_arguments(kwargs, error, match) -> None:
    w = torch.randn(3, 3, requires_grad=True)
    w.grad = torch.ones(3, 3)
    with pytest.raises(error, match=match):
        C.adaptive_grad_clip_([w], **kwargs)
    assert torch.equal(w.grad, torch.ones(3, 3))  # untouched


def test_adaptive_grad_clip_bad_parameters() -> None:
    w = torch.randn(3, 3, requires_grad=True)
    with pytest.raises(TypeError, match=r"parameters\[1\] must be a torch\.Tensor, got float"):
        C.adaptive_grad_clip_([w, 1.0])
    emb = torch.nn.Embedding(5, 2, sparse=True)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(ValueError, match=r"parameters\[0\]: adaptive_grad_clip_ does not support sparse"):
        C.adaptive_grad_clip_(emb.parameters())


def test_convert_sync_batchnorm_rejects_a_non_module() -> None:
    """``convert_sync_batchnorm("m")`` raised AttributeError ('str' has no 'named_children'): now a TypeError."""
    for bad in ("m", None, [nn.BatchNorm2d(2)]):
        with pytest.raises(TypeError, match=r"module must be a torch\.nn\.Module, got"):
            C.convert_sync_batchnorm(bad)
        with pytest.raises(TypeError, match=r"module must be a torch\.nn\.Module"):
            C.SyncBatchNorm.convert_sync_batchnorm(bad)
