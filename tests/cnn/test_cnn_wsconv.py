"""WSConv2d (Qiao et al. 2019, arXiv 1903.10520), ScaledWSConv2d (Brock et al. 2021, arXiv 2101.08692/2102.06171)
and unit-wise adaptive gradient clipping (arXiv 2102.06171) against their formulas in fp64 and torch.nn.Conv2d."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lnblocks.cnn as C
from tests.cnn.cnn_helpers import gradcheck_module, randomize_, run_fwd_bwd, shifted_input, state_dict_round_trip

CONV = {"in_channels": 4, "out_channels": 6, "kernel_size": 3, "padding": 1, "groups": 2, "stride": (1, 2)}


def _filter_stats(w):
    """Per-output-filter mean and biased variance, written out."""
    flat = w.reshape(w.shape[0], -1)
    mean = flat.sum(1) / flat.shape[1]
    var = ((flat - mean[:, None]) ** 2).sum(1) / flat.shape[1]
    return mean.view(-1, 1, 1, 1), var.view(-1, 1, 1, 1), flat.shape[1]


def _ws_reference(w, eps):
    mean, var, _ = _filter_stats(w)
    return (w - mean) / torch.sqrt(var + eps)


def _scaled_ws_reference(w, gain, gamma, eps):
    mean, var, fan_in = _filter_stats(w)
    return gamma * gain.view(-1, 1, 1, 1) * (w - mean) / torch.sqrt(torch.clamp(fan_in * var, min=eps))


def _conv(x, w, b):
    return F.conv2d(x, w, b, stride=CONV["stride"], padding=CONV["padding"], groups=CONV["groups"])


@pytest.mark.parametrize("kind", ["ws", "scaled_ws"])
@pytest.mark.parametrize("training", [True, False])
def test_matches_the_formula_in_fp64(kind, training) -> None:
    if kind == "ws":
        m = C.WSConv2d(**CONV, eps=1e-3, dtype=torch.float64)
    else:
        m = randomize_(C.ScaledWSConv2d(**CONV, gamma=C.RELU_GAMMA, eps=1e-4, dtype=torch.float64))
        with torch.no_grad():  # one nearly constant filter: the eps floor of fan_in * var is active there
            m.weight[0] = 0.3 + 1e-4 * torch.randn_like(m.weight[0])
    m.train(training)
    x = shifted_input((2, 4, 5, 6), torch.float64)
    g = torch.randn(2, 6, 5, 3, dtype=torch.float64)
    y, grads = run_fwd_bwd(m, x, g)
    xr = x.clone().requires_grad_(True)
    p = {n: t.detach().clone().requires_grad_(True) for n, t in m.named_parameters()}
    if kind == "ws":
        w_hat = _ws_reference(p["weight"], 1e-3)
    else:
        w_hat = _scaled_ws_reference(p["weight"], p["gain"], C.RELU_GAMMA, 1e-4)
        assert 9 * _filter_stats(m.weight.detach())[1][0].item() < 1e-4  # the floor acted on filter 0
    y_ref = _conv(xr, w_hat, p["bias"])
    grads_ref = torch.autograd.grad(y_ref, [xr, *(p[n] for n in sorted(p))], g)
    torch.testing.assert_close(y, y_ref.detach(), atol=1e-12, rtol=1e-12)
    for a, e in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(a, e, atol=1e-10, rtol=1e-10)
    # torch's own Conv2d with the standardized weight computes the same
    ref = nn.Conv2d(**CONV, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(m.standardized_weight())
        ref.bias.copy_(m.bias)
    torch.testing.assert_close(ref(x), y, atol=1e-12, rtol=1e-12)


def test_standardized_weight_properties() -> None:
    """WS: each filter has mean 0 and variance ~1. Scaled WS: each filter has unit norm times gamma * gain, so a
    unit-variance input gives a unit-variance (pre-activation) output."""
    ws = C.WSConv2d(8, 5, 3, eps=0.0, dtype=torch.float64)
    mean, var, _ = _filter_stats(ws.standardized_weight())
    torch.testing.assert_close(mean, torch.zeros_like(mean), atol=1e-12, rtol=0)
    torch.testing.assert_close(var, torch.ones_like(var), atol=1e-12, rtol=0)
    sws = randomize_(C.ScaledWSConv2d(8, 5, 3, gamma=2.0, dtype=torch.float64))
    norms = sws.standardized_weight().flatten(1).norm(dim=1)
    torch.testing.assert_close(norms, 2.0 * sws.gain.detach().abs(), atol=1e-12, rtol=1e-12)
    with torch.no_grad():
        sws.gain.fill_(1.0)
    x = torch.randn(64, 8, 12, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = F.conv2d(x, sws.standardized_weight() / 2.0)
    assert abs(y.var().item() - 1.0) < 0.05


def test_padding_modes_unbatched_input_and_low_precision() -> None:
    m = randomize_(C.WSConv2d(3, 4, 3, padding=1, padding_mode="reflect"))
    ref = nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")
    with torch.no_grad():
        ref.weight.copy_(m.standardized_weight())
        ref.bias.copy_(m.bias)
    x = torch.randn(2, 3, 5, 5)
    torch.testing.assert_close(m(x), ref(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(m(x[0]), ref(x[0]), atol=1e-5, rtol=1e-5)  # (C, H, W)
    half = C.ScaledWSConv2d(3, 4, 3, dtype=torch.bfloat16)
    assert half(x.bfloat16()).dtype == torch.bfloat16 and half.standardized_weight().dtype == torch.bfloat16


def test_gradcheck_and_state_dict() -> None:
    x = shifted_input((1, 4, 3, 3), torch.float64)
    gradcheck_module(C.WSConv2d(4, 2, 2, groups=2, eps=1e-3), x)
    gradcheck_module(randomize_(C.ScaledWSConv2d(4, 2, 2, gamma=1.5)), x)
    state_dict_round_trip(lambda: C.WSConv2d(4, 2, 3), x.float())
    state_dict_round_trip(lambda: C.ScaledWSConv2d(4, 2, 3), x.float())
    assert list(C.ScaledWSConv2d(4, 2, 3).state_dict()) == ["weight", "bias", "gain"]
    assert list(C.WSConv2d(4, 2, 3, bias=False).state_dict()) == ["weight"]
    assert torch.equal(C.ScaledWSConv2d(4, 2, 3).gain, torch.ones(2))


# ---- adaptive gradient clipping ------------------------------------------------------------------------------


def _agc_reference(w, g, clipping, eps):
    """Brock et al. 2021, Eq. 3, one unit at a time: rows / filters (dim 0); a 1-d tensor is one unit."""
    out = g.clone()
    units = [(slice(None),)] if w.dim() <= 1 else [(i,) for i in range(w.shape[0])]
    for u in units:
        w_norm = max(math.sqrt((w[u] ** 2).sum().item()), eps)
        g_norm = math.sqrt((g[u] ** 2).sum().item())
        if g_norm / w_norm > clipping:
            out[u] = g[u] * (clipping * w_norm / g_norm)
    return out


def test_agc_matches_the_unitwise_formula() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 4 * 4, 5)).double()
    with torch.no_grad():
        model[0].weight[1].zero_()  # a zero filter: eps floors its norm
    x = torch.randn(8, 3, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    model(x).square().sum().backward()
    with torch.no_grad():
        model[2].weight.grad[0] *= 1e-6  # one tiny row: left alone
    before = {n: (p.detach().clone(), p.grad.clone()) for n, p in model.named_parameters()}
    C.adaptive_grad_clip_(model.parameters(), clipping=0.05, eps=1e-3)
    clipped = kept = 0
    for n, p in model.named_parameters():
        w, g = before[n]
        expected = _agc_reference(w, g, 0.05, 1e-3)
        torch.testing.assert_close(p.grad, expected, atol=1e-14, rtol=1e-12, msg=n)
        assert torch.equal(p, w)  # weights untouched
        changed = (expected != g).flatten(1).any(1) if g.dim() > 1 else (expected != g).any().view(1)
        clipped += int(changed.sum())
        kept += int((~changed).sum())
    assert clipped > 0 and kept > 0
    # the zero filter's gradient was cut to lambda * eps
    torch.testing.assert_close(model[0].weight.grad[1].norm().item(), 0.05 * 1e-3, rtol=1e-10, atol=0)


def test_agc_single_tensor_missing_grads_and_low_precision() -> None:
    w = torch.randn(4, 6, requires_grad=True)
    C.adaptive_grad_clip_(w)  # no grad yet: skipped
    assert w.grad is None
    w.grad = torch.randn(4, 6) * 10
    expected = _agc_reference(w.detach().double(), w.grad.double(), 0.01, 1e-3)
    C.adaptive_grad_clip_(w)
    torch.testing.assert_close(w.grad.double(), expected, atol=1e-6, rtol=1e-5)
    b = torch.randn(6, dtype=torch.bfloat16, requires_grad=True)
    b.grad = torch.randn(6, dtype=torch.bfloat16) * 10
    expected = _agc_reference(b.detach().double(), b.grad.double(), 0.01, 1e-3)
    C.adaptive_grad_clip_([b])
    assert b.grad.dtype == torch.bfloat16
    torch.testing.assert_close(b.grad.double(), expected, atol=1e-4, rtol=1e-2)
