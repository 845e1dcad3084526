"""FRN2d and TLU (Singh & Krishnan 2019, arXiv 1911.09737) against the paper's formula in fp64 (train = eval, grads
of every parameter, learnable epsilon), batch independence, gradcheck and state_dict round trips."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import lnblocks.cnn as C
from tests.cnn.cnn_helpers import TOL, gradcheck_module, randomize_, run_fwd_bwd, shifted_input, state_dict_round_trip

SHAPE = (3, 4, 3, 5)


def _frn_tlu_reference(x, w, b, tau, eps):
    """Eq. 1-3 of the paper: nu2 = mean of x^2 over (H, W); y = w x / sqrt(nu2 + eps) + b; z = max(y, tau)."""
    nu2 = (x**2).sum((2, 3), keepdim=True) / (x.shape[2] * x.shape[3])
    y = w.view(1, -1, 1, 1) * x / torch.sqrt(nu2 + eps) + b.view(1, -1, 1, 1)
    return torch.maximum(y, tau.view(1, -1, 1, 1))


@pytest.mark.parametrize("learnable_eps", [False, True])
@pytest.mark.parametrize("training", [True, False])
def test_frn_tlu_match_the_paper_formula_in_fp64(learnable_eps, training) -> None:
    frn = randomize_(C.FRN2d(SHAPE[1], eps=1e-3, learnable_eps=learnable_eps, dtype=torch.float64))
    tlu = randomize_(C.TLU(SHAPE[1], dtype=torch.float64))
    model = nn.Sequential(frn, tlu).train(training)
    x = shifted_input(SHAPE, torch.float64) * 0.1  # small maps: eps matters
    g = torch.randn(SHAPE, dtype=torch.float64)
    y, grads = run_fwd_bwd(model, x, g)
    xr = x.clone().requires_grad_(True)
    params = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    eps = 1e-3 + params["0.eps_learned"].abs() if learnable_eps else 1e-3
    y_ref = _frn_tlu_reference(xr, params["0.weight"], params["0.bias"], params["1.tau"], eps)
    grads_ref = torch.autograd.grad(y_ref, [xr, *(params[n] for n in sorted(params))], g)
    torch.testing.assert_close(y, y_ref.detach(), atol=1e-12, rtol=1e-12)
    for a, e in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(a, e, atol=1e-10, rtol=1e-10)
    assert (y == tlu.tau.view(1, -1, 1, 1)).any() and (y > tlu.tau.view(1, -1, 1, 1)).any()  # TLU acted


def test_learnable_eps_starts_at_the_floor_plus_1e_4_and_learns_on_1x1_maps() -> None:
    frn = C.FRN2d(3, learnable_eps=True)
    assert frn.eps == 1e-6 and frn.eps_learned.item() == pytest.approx(1e-4)
    x = torch.randn(4, 3, 1, 1)
    frn(x).square().sum().backward()  # 1x1 maps: x / sqrt(x^2 + eps) is nearly sign(x); eps gets a gradient
    assert frn.eps_learned.grad.abs().item() > 0
    assert "eps_learned" not in C.FRN2d(3).state_dict()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_independent_and_low_precision_close_to_fp64(dtype) -> None:
    frn = randomize_(C.FRN2d(SHAPE[1], dtype=dtype))
    x = shifted_input(SHAPE, dtype)
    y = frn(x)
    assert y.dtype == dtype
    for i in range(SHAPE[0]):  # each sample alone gives the same output: no batch statistics
        assert torch.equal(frn(x[i : i + 1]), y[i : i + 1])
    ref = frn.double()(x.double())
    torch.testing.assert_close(y.double(), ref, **TOL[dtype])


@pytest.mark.parametrize("learnable_eps", [False, True])
def test_gradcheck(learnable_eps) -> None:
    gradcheck_module(randomize_(C.FRN2d(3, eps=1e-3, learnable_eps=learnable_eps)), shifted_input((2, 3, 2, 3)))
    gradcheck_module(randomize_(C.TLU(3)), shifted_input((2, 3, 2, 3)))  # random data: no ties at the threshold


def test_tlu_is_relu_at_init_for_any_rank() -> None:
    for shape in ((4, 3), (2, 3, 5), (2, 3, 2, 2), (1, 3, 2, 2, 2)):
        x = torch.randn(shape)
        assert torch.equal(C.TLU(3)(x), torch.relu(x))


def test_state_dict_round_trip() -> None:
    x = shifted_input(SHAPE)
    state_dict_round_trip(lambda: C.FRN2d(SHAPE[1], learnable_eps=True), x)
    state_dict_round_trip(lambda: C.TLU(SHAPE[1]), x)
    assert list(C.FRN2d(4, learnable_eps=True).state_dict()) == ["weight", "bias", "eps_learned"]
    assert list(C.TLU(4).state_dict()) == ["tau"]
