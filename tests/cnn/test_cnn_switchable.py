"""SwitchableNorm2d (Luo et al. 2018, arXiv 1806.10779) against the paper's formulas in fp64 (train and eval, grads
of every parameter, running statistics), against torch.nn's BatchNorm2d / InstanceNorm2d / GroupNorm(1, C) when all
weight is on one source, gradcheck, and state_dict round trips."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import lnblocks.cnn as C
from tests.cnn.cnn_helpers import TOL, gradcheck_module, randomize_, run_fwd_bwd, shifted_input, state_dict_round_trip

SHAPE = (3, 4, 3, 5)
EPS = 1e-3


def _reference(x, w, b, mean_logits, var_logits, running_mean, running_var, training):
    """The paper's Eq. 3-5 in fp64: LN and BN statistics from the IN moments; returns (y, mu_bn, var_bn)."""
    mu_in = x.mean((2, 3), keepdim=True)
    var_in = ((x - mu_in) ** 2).mean((2, 3), keepdim=True)
    mu_ln = mu_in.mean(1, keepdim=True)
    var_ln = (var_in + mu_in**2).mean(1, keepdim=True) - mu_ln**2
    if training:
        mu_bn = mu_in.mean(0, keepdim=True)
        var_bn = (var_in + mu_in**2).mean(0, keepdim=True) - mu_bn**2
    else:
        mu_bn, var_bn = running_mean.view(1, -1, 1, 1), running_var.view(1, -1, 1, 1)
    pm, pv = torch.softmax(mean_logits, 0), torch.softmax(var_logits, 0)
    mu = pm[0] * mu_in + pm[1] * mu_ln + pm[2] * mu_bn
    var = pv[0] * var_in + pv[1] * var_ln + pv[2] * var_bn
    y = w.view(1, -1, 1, 1) * (x - mu) / torch.sqrt(var + EPS) + b.view(1, -1, 1, 1)
    return y, mu_bn, var_bn


@pytest.mark.parametrize("momentum", [0.1, None])
def test_matches_the_paper_formula_in_fp64_train_and_eval(momentum) -> None:
    m = randomize_(C.SwitchableNorm2d(SHAPE[1], eps=EPS, momentum=momentum, dtype=torch.float64))
    with torch.no_grad():  # a non-uniform mix, different for means and variances
        m.mean_weight.copy_(torch.tensor([0.3, -0.5, 1.2]))
        m.var_weight.copy_(torch.tensor([-0.7, 0.9, 0.1]))
    rm, rv = m.running_mean.clone(), m.running_var.clone()
    count = SHAPE[0] * SHAPE[2] * SHAPE[3]
    for step in range(3):
        x = shifted_input(SHAPE, torch.float64, seed=step) + step
        g = torch.randn(SHAPE, dtype=torch.float64, generator=torch.Generator().manual_seed(10 + step))
        y, grads = run_fwd_bwd(m, x, g)
        xr = x.clone().requires_grad_(True)
        params = {n: p.detach().clone().requires_grad_(True) for n, p in m.named_parameters()}
        y_ref, mu_bn, var_bn = _reference(
            xr, params["weight"], params["bias"], params["mean_weight"], params["var_weight"], rm, rv, True
        )
        grads_ref = torch.autograd.grad(y_ref, [xr, *(params[n] for n in sorted(params))], g)
        torch.testing.assert_close(y, y_ref.detach(), atol=1e-12, rtol=1e-12)
        for a, e in zip(grads, grads_ref, strict=True):
            torch.testing.assert_close(a, e, atol=1e-10, rtol=1e-10)
        factor = 0.1 if momentum is not None else 1 / (step + 1)
        rm = (1 - factor) * rm + factor * mu_bn.detach().flatten()
        rv = (1 - factor) * rv + factor * var_bn.detach().flatten() * count / (count - 1)  # unbiased, as BatchNorm
        torch.testing.assert_close(m.running_mean, rm, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(m.running_var, rv, atol=1e-12, rtol=1e-12)
    assert int(m.num_batches_tracked) == 3
    m.eval()
    x = shifted_input(SHAPE, torch.float64, seed=9)
    y_ref, _, _ = _reference(x, m.weight, m.bias, m.mean_weight, m.var_weight, rm, rv, False)
    before = m.running_mean.clone(), m.running_var.clone()
    torch.testing.assert_close(m(x), y_ref.detach(), atol=1e-12, rtol=1e-12)
    assert torch.equal(m.running_mean, before[0]) and torch.equal(m.running_var, before[1])  # eval leaves them


def _one_source(m: C.SwitchableNorm2d, k: int) -> C.SwitchableNorm2d:
    logits = torch.full((3,), -1e4)
    logits[k] = 0.0  # softmax -> exactly one-hot
    with torch.no_grad():
        m.mean_weight.copy_(logits)
        m.var_weight.copy_(logits)
    return m


@pytest.mark.parametrize("momentum", [0.1, None])
def test_all_weight_on_bn_is_torch_batchnorm(momentum) -> None:
    ref = randomize_(nn.BatchNorm2d(SHAPE[1], eps=EPS, momentum=momentum))
    m = _one_source(C.SwitchableNorm2d(SHAPE[1], eps=EPS, momentum=momentum), 2)
    missing, unexpected = m.load_state_dict(ref.state_dict(), strict=False)  # BatchNorm's state loads as it is
    assert missing == ["mean_weight", "var_weight"] and unexpected == []
    _one_source(m, 2)
    for step in range(3):
        x = shifted_input(SHAPE, seed=step) * (1 + step)
        g = torch.randn(SHAPE, generator=torch.Generator().manual_seed(step))
        y, grads = run_fwd_bwd(m, x, g)
        y_ref, grads_ref = run_fwd_bwd(ref, x, g)
        torch.testing.assert_close(y, y_ref, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(grads[0], grads_ref[0], atol=5e-5, rtol=5e-5)  # x
        torch.testing.assert_close(grads[1], grads_ref[1], atol=5e-5, rtol=5e-5)  # bias
        torch.testing.assert_close(grads[4], grads_ref[2], atol=5e-5, rtol=5e-5)  # weight
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(getattr(m, name), getattr(ref, name), atol=1e-6, rtol=1e-6)
    m.eval()
    ref.eval()
    x = shifted_input(SHAPE, seed=7)
    torch.testing.assert_close(m(x), ref(x), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(
    ("k", "make_ref"),
    [(0, lambda c: nn.InstanceNorm2d(c, eps=EPS, affine=True)), (1, lambda c: nn.GroupNorm(1, c, eps=EPS))],
    ids=["in", "ln"],
)
def test_all_weight_on_in_or_ln_is_torch_instancenorm_or_groupnorm(k, make_ref) -> None:
    ref = randomize_(make_ref(SHAPE[1]))
    m = _one_source(C.SwitchableNorm2d(SHAPE[1], eps=EPS), k)
    with torch.no_grad():
        m.weight.copy_(ref.weight)
        m.bias.copy_(ref.bias)
    x = shifted_input(SHAPE)
    g = torch.randn(SHAPE)
    for mode in (True, False):  # per-sample statistics: the same in eval mode
        m.train(mode)
        y, grads = run_fwd_bwd(m, x, g)
        y_ref, grads_ref = run_fwd_bwd(ref, x, g)
        torch.testing.assert_close(y, y_ref, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(grads[0], grads_ref[0], atol=5e-5, rtol=5e-5)


def test_switch_weights_start_equal_and_are_learned() -> None:
    m = C.SwitchableNorm2d(4)
    third = dict.fromkeys(("in", "ln", "bn"), 1 / 3)
    assert m.switch_weights() == {"mean": third, "var": third}
    m(shifted_input(SHAPE)).pow(3).sum().backward()
    assert m.mean_weight.grad.abs().max() > 0 and m.var_weight.grad.abs().max() > 0


def test_without_running_stats_eval_uses_batch_statistics() -> None:
    m = randomize_(C.SwitchableNorm2d(SHAPE[1], track_running_stats=False))
    x = shifted_input(SHAPE)
    assert m.running_mean is None
    assert torch.equal(m.train()(x), m.eval()(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_close_to_fp64(dtype) -> None:
    m = randomize_(C.SwitchableNorm2d(SHAPE[1], dtype=dtype))
    ref = C.SwitchableNorm2d(SHAPE[1], dtype=torch.float64)
    ref.load_state_dict(m.state_dict())
    x = shifted_input(SHAPE, dtype)
    for training in (True, False):
        y = m.train(training)(x)
        assert y.dtype == dtype
        torch.testing.assert_close(y.double(), ref.train(training)(x.double()), **TOL[dtype])
    torch.testing.assert_close(m.running_var.double(), ref.running_var, **TOL[dtype])


@pytest.mark.parametrize("training", [True, False])
def test_gradcheck(training) -> None:
    m = randomize_(C.SwitchableNorm2d(3, eps=1e-3)).train(training)
    gradcheck_module(m, shifted_input((2, 3, 2, 3), torch.float64))


def test_state_dict_round_trip() -> None:
    state_dict_round_trip(lambda: C.SwitchableNorm2d(4, momentum=0.3), shifted_input(SHAPE))
    assert list(C.SwitchableNorm2d(4).state_dict()) == [
        "weight",
        "bias",
        "mean_weight",
        "var_weight",
        "running_mean",
        "running_var",
        "num_batches_tracked",
    ]
