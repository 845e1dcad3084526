"""EvoNorm-B0 and EvoNorm-S0 (Liu et al. 2020, arXiv 2004.02967) against the paper's formulas in fp64 (train and
eval, grads of every parameter, B0's running variance), the reference code's group rule, batch (in)dependence,
gradcheck and state_dict round trips."""

from __future__ import annotations

import pytest
import torch

import lnblocks.cnn as C
from lnblocks.cnn.evonorm import evonorm_groups
from tests.cnn.cnn_helpers import TOL, gradcheck_module, randomize_, run_fwd_bwd, shifted_input, state_dict_round_trip

SHAPE = (3, 6, 3, 4)
EPS = 1e-3


def _biased_var(x, dims):
    mean = x.sum(dims, keepdim=True) / torch.tensor([x.shape[d] for d in dims]).prod()
    return ((x - mean) ** 2).sum(dims, keepdim=True) / torch.tensor([x.shape[d] for d in dims]).prod()


def _b0_reference(x, w, b, v, var_batch):
    """x / max(sqrt(var_batch + eps), v x + sqrt(var_instance + eps)) * w + b."""
    std_b = torch.sqrt(var_batch.view(1, -1, 1, 1) + EPS)
    std_in = torch.sqrt(_biased_var(x, (2, 3)) + EPS)
    den = torch.maximum(std_b, v.view(1, -1, 1, 1) * x + std_in)
    return x / den * w.view(1, -1, 1, 1) + b.view(1, -1, 1, 1)


def _s0_reference(x, w, b, v, groups):
    """x sigmoid(v x) / sqrt(var over the (C/G, H, W) of each group + eps) * w + b."""
    n, c, h, wd = x.shape
    std = torch.sqrt(_biased_var(x.view(n, groups, c // groups, h, wd), (2, 3, 4)) + EPS)
    std = std.expand(n, groups, c // groups, h, wd).reshape(n, c, h, wd)
    return x * torch.sigmoid(v.view(1, -1, 1, 1) * x) / std * w.view(1, -1, 1, 1) + b.view(1, -1, 1, 1)


def _compare(module, x, reference) -> None:
    """Output and grads (x, then parameters by name) of ``module`` against ``reference(x, params)`` in fp64."""
    g = torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    y, grads = run_fwd_bwd(module, x, g)
    xr = x.clone().requires_grad_(True)
    params = {n: p.detach().clone().requires_grad_(True) for n, p in module.named_parameters()}
    y_ref = reference(xr, params)
    grads_ref = torch.autograd.grad(y_ref, [xr, *(params[n] for n in sorted(params))], g)
    torch.testing.assert_close(y, y_ref.detach(), atol=1e-12, rtol=1e-12)
    for a, e in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(a, e, atol=1e-10, rtol=1e-10)


def test_b0_matches_the_paper_formula_in_fp64_train_and_eval() -> None:
    m = randomize_(C.EvoNormB0(SHAPE[1], momentum=0.2, eps=EPS, dtype=torch.float64))
    with torch.no_grad():
        m.v.uniform_(-2, 2, generator=torch.Generator().manual_seed(3))  # both sides of the max are taken
    running = m.running_var.clone()
    took_batch_side = took_instance_side = False
    for step in range(3):
        x = shifted_input(SHAPE, torch.float64, seed=step) * (1 + step)
        var_batch = _biased_var(x, (0, 2, 3)).flatten()

        def reference(xr, p):
            return _b0_reference(xr, p["weight"], p["bias"], p["v"], _biased_var(xr, (0, 2, 3)))

        _compare(m, x, reference)
        # running variance: the reference code's EMA of the *biased* batch variance
        running = 0.8 * running + 0.2 * var_batch
        torch.testing.assert_close(m.running_var, running, atol=1e-12, rtol=1e-12)
        std_b = torch.sqrt(var_batch.view(1, -1, 1, 1) + EPS)
        right = m.v.detach().view(1, -1, 1, 1) * x + torch.sqrt(_biased_var(x, (2, 3)) + EPS)
        took_batch_side |= bool((std_b > right).any())
        took_instance_side |= bool((right > std_b).any())
    assert took_batch_side and took_instance_side
    m.eval()
    x = shifted_input(SHAPE, torch.float64, seed=9)
    before = m.running_var.clone()
    _compare(m, x, lambda xr, p: _b0_reference(xr, p["weight"], p["bias"], p["v"], running))
    assert torch.equal(m.running_var, before)  # eval leaves it


@pytest.mark.parametrize(("channels", "groups"), [(6, 3), (6, 32), (8, 3)])
@pytest.mark.parametrize("training", [True, False])
def test_s0_matches_the_paper_formula_in_fp64(channels, groups, training) -> None:
    shape = (2, channels, 3, 4)
    m = randomize_(C.EvoNormS0(channels, groups=groups, eps=EPS, dtype=torch.float64)).train(training)
    x = shifted_input(shape, torch.float64)
    g = evonorm_groups(channels, groups)
    _compare(m, x, lambda xr, p: _s0_reference(xr, p["weight"], p["bias"], p["v"], g))


def test_group_rule_is_the_reference_codes() -> None:
    """The largest divisor of C that is at most ``groups``: min(groups, C) when that divides C."""
    cases = {(64, 32): 32, (16, 32): 16, (48, 32): 24, (37, 32): 1, (96, 32): 32, (6, 4): 3, (5, 1): 1}
    for (c, groups), expected in cases.items():
        assert evonorm_groups(c, groups) == expected
        assert C.EvoNormS0(c, groups=groups).num_groups == expected
    assert "num_groups=24" in repr(C.EvoNormS0(48))


def test_batch_dependence() -> None:
    """S0 is batch-independent in both modes; B0 depends on the batch in training, not in eval."""
    x = shifted_input(SHAPE)
    s0 = randomize_(C.EvoNormS0(SHAPE[1], groups=2))
    b0 = randomize_(C.EvoNormB0(SHAPE[1]))
    y = s0(x)
    for i in range(SHAPE[0]):
        torch.testing.assert_close(s0(x[i : i + 1]), y[i : i + 1], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(b0(x)[:1], b0(x[:1]))
    b0.eval()
    torch.testing.assert_close(b0(x)[:1], b0(x[:1]), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_close_to_fp64(dtype) -> None:
    for m in (C.EvoNormS0(SHAPE[1], groups=3), C.EvoNormB0(SHAPE[1])):
        m = randomize_(m).to(dtype)
        x = shifted_input(SHAPE, dtype)
        ref = randomize_(type(m)(SHAPE[1]).double())
        ref.load_state_dict(m.state_dict())
        if isinstance(m, C.EvoNormS0):
            ref.num_groups = m.num_groups
        y = m(x)
        assert y.dtype == dtype
        torch.testing.assert_close(y.double(), ref(x.double()), **TOL[dtype])


@pytest.mark.parametrize("training", [True, False])
def test_gradcheck(training) -> None:
    x = shifted_input((2, 4, 2, 3), torch.float64)
    gradcheck_module(randomize_(C.EvoNormS0(4, groups=2, eps=EPS)).train(training), x)
    gradcheck_module(randomize_(C.EvoNormB0(4, eps=EPS)).train(training), x)


def test_state_dict_round_trip() -> None:
    x = shifted_input(SHAPE)
    state_dict_round_trip(lambda: C.EvoNormB0(SHAPE[1], momentum=0.3), x)
    state_dict_round_trip(lambda: C.EvoNormS0(SHAPE[1], groups=2), x)
    assert list(C.EvoNormB0(4).state_dict()) == ["weight", "bias", "v", "running_var"]
    assert list(C.EvoNormS0(4).state_dict()) == ["weight", "bias", "v"]
