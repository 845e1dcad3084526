"""fold_batchnorm: eval outputs unchanged after folding BatchNorm into Conv/ConvTranspose/Linear; pairs found on the
fx graph (attribute pairs too), Sequential fallback for untraceable models, shared or branching layers left alone."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lnblocks.cnn as C
from lnblocks.cnn._base import NormBase
from tests.cnn.cnn_helpers import randomize_


def _randomize_norms(model: nn.Module) -> nn.Module:
    for i, m in enumerate(model.modules()):
        if isinstance(m, (nn.modules.batchnorm._BatchNorm, NormBase)):
            randomize_(m, seed=i)
    return model.eval()


def _assert_same_eval_outputs(model: nn.Module, folded: nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        torch.testing.assert_close(folded(x), model(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("layer", "bn", "x_shape"),
    [
        (nn.Conv1d(3, 4, 3), nn.BatchNorm1d(4), (2, 3, 9)),
        (nn.Conv2d(3, 6, 3, groups=3, bias=False), nn.BatchNorm2d(6), (2, 3, 7, 7)),
        (nn.Conv3d(2, 4, 2), C.BatchNorm3d(4), (2, 2, 4, 4, 4)),
        (nn.ConvTranspose2d(4, 6, 3, groups=2), C.BatchNorm2d(6), (2, 4, 5, 5)),
        (nn.ConvTranspose1d(3, 5, 2, bias=False), nn.BatchNorm1d(5, affine=False), (2, 3, 6)),
        (nn.Linear(5, 7), C.BatchNorm1d(7, bias=False), (4, 5)),
        (nn.Conv2d(3, 4, 3), C.BatchRenorm2d(4), (2, 3, 6, 6)),
        (nn.Conv2d(3, 4, 3), C.SyncBatchNorm(4), (2, 3, 6, 6)),
    ],
)
def test_fold_leaves_eval_outputs_unchanged(layer: nn.Module, bn: nn.Module, x_shape: tuple[int, ...]) -> None:
    model = _randomize_norms(nn.Sequential(layer, bn, nn.ReLU()))
    folded = C.fold_batchnorm(model)
    assert isinstance(folded[1], nn.Identity) and type(folded[0]) is type(layer)
    assert folded[0].bias is not None
    assert isinstance(model[1], type(bn))  # not in place: the original is untouched
    _assert_same_eval_outputs(model, folded, torch.randn(x_shape))


def test_models_with_every_lnblocks_norm_trace_without_fallback() -> None:
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3), C.BatchNorm2d(8), C.GroupNorm(2, 8), nn.Conv2d(8, 8, 1), C.BatchRenorm2d(8),
        C.LayerNorm2d(8), nn.Conv2d(8, 8, 1), C.InstanceNorm2d(8), nn.Conv2d(8, 4, 1), C.SyncBatchNorm(4),
    )  # fmt: skip
    _randomize_norms(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fx fallback
        assert C.find_conv_bn_pairs(model) == [("0", "1"), ("3", "4"), ("8", "9")]
        folded = C.fold_batchnorm(model)
    _assert_same_eval_outputs(model, folded, torch.randn(2, 3, 7, 7))


def test_fold_is_exact_in_fp64() -> None:
    model = _randomize_norms(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, eps=1e-3)).double())
    folded = C.fold_batchnorm(model)
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(folded(x), model(x), atol=1e-12, rtol=1e-12)


class _ResBlock(nn.Module):
    """Attribute pairs, a residual branch, a conv whose output is also used elsewhere, a shared BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(4, 4, 3, padding=1, bias=False), C.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.conv3, self.bn3 = nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)  # conv3's output also feeds the sum
        self.conv4, self.shared = nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)  # shared is called twice
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 25, 6), nn.BatchNorm1d(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h)) + x
        z = self.conv3(h)
        h = self.bn3(z) + z
        h = self.shared(self.conv4(h)) + self.shared(h)
        return self.head(h)


def test_fold_finds_attribute_pairs_on_the_fx_graph_and_skips_unsafe_ones() -> None:
    model = _randomize_norms(_ResBlock())
    assert C.find_conv_bn_pairs(model) == [("conv1", "bn1"), ("conv2", "bn2"), ("head.1", "head.2")]
    folded = C.fold_batchnorm(model)
    assert isinstance(folded.bn1, nn.Identity) and isinstance(folded.head[2], nn.Identity)
    assert isinstance(folded.bn3, nn.BatchNorm2d) and isinstance(folded.shared, nn.BatchNorm2d)
    _assert_same_eval_outputs(model, folded, torch.randn(3, 4, 5, 5))


class _Untraceable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU())
        self.conv, self.bn = nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        if h.sum() > 0:  # data-dependent control flow: fx cannot trace it
            h = h * 2
        return self.bn(self.conv(h))


def test_untraceable_model_folds_sequential_pairs_only_with_a_warning() -> None:
    model = _randomize_norms(_Untraceable())
    with pytest.warns(UserWarning, match="torch.fx could not trace"):
        folded = C.fold_batchnorm(model)
    assert isinstance(folded.body[1], nn.Identity) and isinstance(folded.bn, nn.BatchNorm2d)
    _assert_same_eval_outputs(model, folded, torch.randn(2, 2, 6, 6))


def test_fold_in_place_and_errors() -> None:
    model = _randomize_norms(nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3)))
    assert C.fold_batchnorm(model, inplace=True) is model and isinstance(model[1], nn.Identity)
    training = nn.Sequential(nn.Conv2d(2, 3, 1), C.BatchNorm2d(3))
    with pytest.raises(ValueError, match=r"model: fold_batchnorm folds eval-mode BatchNorm, but '1' is in training"):
        C.fold_batchnorm(training)
    with pytest.raises(TypeError, match=r"model must be an nn\.Module"):
        C.fold_batchnorm("resnet")
    with pytest.raises(ValueError, match="bn: num_features=4 does not match the layer's 3 output channels"):
        C.fold_conv_bn(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(4).eval())
    with pytest.raises(TypeError, match="bn must be a BatchNorm module"):
        C.fold_conv_bn(nn.Conv2d(2, 3, 1), C.InstanceNorm2d(3))
    # no running statistics: eval uses batch statistics, nothing to fold; a Linear + BatchNorm2d never pairs
    no_stats = nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3, track_running_stats=False)).eval()
    mismatched = nn.Sequential(nn.Linear(2, 3), nn.Unflatten(1, (3, 1, 1)), nn.BatchNorm2d(3)).eval()
    assert C.find_conv_bn_pairs(no_stats) == [] and C.find_conv_bn_pairs(mismatched) == []
