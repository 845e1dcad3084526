"""The family's rules for degenerate inputs, on every layer of ``lnblocks.cnn`` (a new layer must join ``LAYERS``).

Zero-size inputs (N = 0, or a zero-size spatial dim), torch's rule: accepted in train and eval mode, an empty output
of the usual shape and dtype, zero gradients for every parameter, running statistics untouched (``num_batches_tracked``
counts the call where torch's BatchNorm counts it), and the next real batch computes what it would have without the
empty one. The convolutions follow ``torch.nn.Conv2d``: N = 0 accepted, a zero-size spatial dim a ``ValueError``.

``eps = 0`` on a zero-variance (constant) input: the centred layers (FRN2d, WSConv2d, ScaledWSConv2d, AdaIN,
SwitchableNorm2d, ``normalize``) give the normalised value 0 (the eps -> 0 limit), never NaN, with finite gradients;
EvoNorm, whose numerator is not centred, refuses ``eps = 0``.
"""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from torch import nn

import lnblocks.cnn as C

CH = 4
# class -> (factory, input rank, counts the call in num_batches_tracked, is a convolution)
LAYERS: dict[type, tuple] = {
    C.BatchNorm1d: (lambda: C.BatchNorm1d(CH), 3, True, False),
    C.BatchNorm2d: (lambda: C.BatchNorm2d(CH, momentum=None), 4, True, False),
    C.BatchNorm3d: (lambda: C.BatchNorm3d(CH), 5, True, False),
    C.SyncBatchNorm: (lambda: C.SyncBatchNorm(CH), 4, True, False),
    C.BatchRenorm1d: (lambda: C.BatchRenorm1d(CH), 3, True, False),
    C.BatchRenorm2d: (lambda: C.BatchRenorm2d(CH, r_max=1.5, d_max=0.5), 4, True, False),
    C.InstanceNorm1d: (lambda: C.InstanceNorm1d(CH, affine=True, track_running_stats=True), 3, False, False),
    C.InstanceNorm2d: (lambda: C.InstanceNorm2d(CH, affine=True, track_running_stats=True), 4, False, False),
    C.InstanceNorm3d: (lambda: C.InstanceNorm3d(CH, affine=True), 5, False, False),
    C.GroupNorm: (lambda: C.GroupNorm(2, CH), 4, False, False),
    C.LayerNorm2d: (lambda: C.LayerNorm2d(CH), 4, False, False),
    C.SwitchableNorm2d: (lambda: C.SwitchableNorm2d(CH), 4, True, False),
    C.FRN2d: (lambda: C.FRN2d(CH, learnable_eps=True), 4, False, False),
    C.TLU: (lambda: C.TLU(CH), 4, False, False),
    C.EvoNormB0: (lambda: C.EvoNormB0(CH), 4, False, False),
    C.EvoNormS0: (lambda: C.EvoNormS0(CH, groups=2), 4, False, False),
    C.AdaIN: (lambda: C.AdaIN(), 4, False, False),
    C.WSConv2d: (lambda: C.WSConv2d(CH, 3, 1), 4, False, True),
    C.ScaledWSConv2d: (lambda: C.ScaledWSConv2d(CH, 3, 1), 4, False, True),
}
STYLE = torch.randn(1, CH, 3, 3)


def test_every_layer_of_the_family_is_covered() -> None:
    exported = {getattr(C, n) for n in C.__all__ if inspect.isclass(getattr(C, n))}
    assert {c for c in exported if issubclass(c, nn.Module)} == set(LAYERS)


def _call(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return module(x, STYLE) if isinstance(module, C.AdaIN) else module(x)


def _shape(rank: int, empty: str) -> tuple[int, ...]:
    shape = [3, CH] + [3] * (rank - 2)
    if empty != "none":
        shape[0 if empty == "batch" else -1] = 0
    return tuple(shape)


@pytest.mark.parametrize("empty", ["batch", "spatial"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("cls", list(LAYERS), ids=lambda c: c.__name__)
def test_zero_size_input_is_accepted_and_changes_no_statistics(cls: type, training: bool, empty: str) -> None:
    make, rank, counts, conv = LAYERS[cls]
    module = make().train(training)
    x = torch.randn(_shape(rank, empty), requires_grad=True)
    if conv and empty == "spatial":
        with pytest.raises(ValueError, match=rf"x: {cls.__name__} needs non-empty spatial dims"):
            module(x)
        return
    before, untouched = copy.deepcopy(module.state_dict()), copy.deepcopy(module)
    y = _call(module, x)
    assert y.dtype == x.dtype and y.numel() == 0
    assert y.shape == (x.shape if not conv else (x.shape[0], 3, *x.shape[2:]))
    y.sum().backward()
    for name, p in module.named_parameters():
        assert p.grad is not None and torch.equal(p.grad, torch.zeros_like(p)), name
    for key, value in module.state_dict().items():
        if key.endswith("num_batches_tracked"):
            assert int(value) == int(before[key]) + (counts and training), key  # torch's BatchNorm counts the call
        else:
            assert torch.equal(value, before[key]), f"{key} changed on an empty batch"
    # the next real batch computes what it would have without the empty one
    real = torch.randn(_shape(rank, "none"))
    assert torch.equal(_call(module, real), _call(untouched, real))
    if getattr(module, "momentum", 0.1) is not None:  # momentum=None: torch's count of the empty call weighs in
        for (key, a), b in zip(module.state_dict().items(), untouched.state_dict().values()):
            assert key.endswith("num_batches_tracked") or torch.equal(a, b), key


def test_batchnorm_zero_size_state_equals_torch() -> None:
    ours, ref = C.BatchNorm2d(CH, momentum=None), nn.BatchNorm2d(CH, momentum=None)
    for x in (torch.randn(0, CH, 3, 3), torch.randn(5, CH, 3, 3) * 2 + 1):
        assert torch.equal(ours(x), ref(x))
    for key, value in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key


def _constant_map_input() -> torch.Tensor:
    x = torch.randn(2, CH, 5, 5, dtype=torch.float64)
    x[0, 1] = 0.0  # an all-zero map (FRN's degenerate case) and a constant one (the centred layers')
    x[1, 2] = 3.0
    return x.requires_grad_()


def _assert_finite_backward(y: torch.Tensor, *tensors: torch.Tensor) -> None:
    assert torch.isfinite(y).all()
    y.square().sum().backward()
    for t in tensors:
        assert t.grad is not None and torch.isfinite(t.grad).all()


def test_frn_eps_zero_gives_the_bias_on_an_all_zero_map() -> None:
    frn = C.FRN2d(CH, eps=0.0).double()
    nn.init.normal_(frn.bias)
    x = _constant_map_input()
    y = frn(x)
    assert torch.equal(y[0, 1], torch.full_like(y[0, 1], frn.bias[1].item()))
    other = x[0, 0].detach()
    torch.testing.assert_close(y[0, 0], other / other.square().mean().sqrt() * frn.weight[0] + frn.bias[0])
    _assert_finite_backward(y, x, frn.weight, frn.bias)


@pytest.mark.parametrize("cls", [C.WSConv2d, C.ScaledWSConv2d])
def test_weight_standardization_eps_zero_gives_zero_for_a_constant_filter(cls: type) -> None:
    conv = cls(CH, 3, 3, eps=0.0).double()
    with torch.no_grad():
        conv.weight[1] = 0.25  # a constant filter: zero variance
    w = conv.standardized_weight()
    assert torch.equal(w[1], torch.zeros_like(w[1])) and torch.isfinite(w).all()
    x = torch.randn(2, CH, 5, 5, dtype=torch.float64, requires_grad=True)
    y = conv(x)
    assert torch.equal(y[:, 1], torch.full_like(y[:, 1], conv.bias[1].item()))
    _assert_finite_backward(y, x, conv.weight)


def test_adain_eps_zero_gives_the_style_mean_on_a_constant_channel() -> None:
    x = _constant_map_input()
    style = torch.randn(2, CH, 4, 4, dtype=torch.float64, requires_grad=True)
    y = C.adaptive_instance_norm(x, style, eps=0.0)
    torch.testing.assert_close(y[1, 2], style[1, 2].mean().expand(5, 5))
    _assert_finite_backward(y, x, style)


def test_centred_norms_eps_zero_give_zero_on_a_constant_group() -> None:
    x = _constant_map_input()
    y = C.normalize(x, dims=(2, 3), eps=0.0)
    assert torch.equal(y[1, 2], torch.zeros_like(y[1, 2]))
    sn = C.SwitchableNorm2d(CH, eps=0.0).double()
    z = sn(torch.full((2, CH, 3, 3), 2.0, dtype=torch.float64, requires_grad=True))
    assert torch.equal(z, torch.zeros_like(z))  # weight 1, bias 0: every source's variance is 0
    _assert_finite_backward(y, x)


@pytest.mark.parametrize("cls", [C.EvoNormB0, C.EvoNormS0])
def test_evonorm_refuses_eps_zero(cls: type) -> None:
    with pytest.raises(ValueError, match=rf"eps must be > 0 for {cls.__name__}: its numerator is not centred"):
        cls(CH, eps=0.0)
