"""BatchRenorm (Ioffe 2017): BatchNorm at r_max=1, d_max=0 (against torch.nn.BatchNorm), eval-consistent training
output when unclipped, an fp64 reference with clipping active, and the warm-up schedule."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import lnblocks.cnn as C
from tests.cnn.cnn_helpers import assert_state_equal, randomize_, run_fwd_bwd, shifted_input


@pytest.mark.parametrize(
    ("ours_cls", "ref_cls", "shape"),
    [(C.BatchRenorm2d, nn.BatchNorm2d, (3, 4, 5, 2)), (C.BatchRenorm1d, nn.BatchNorm1d, (6, 4))],
)
@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("limits", ["r_max=1,d_max=0", "warm-up"])
def test_equals_torch_batchnorm_without_correction(ours_cls, ref_cls, shape, momentum, affine, limits) -> None:
    kw = {"eps": 1e-3, "momentum": momentum, "affine": affine}
    extra = {"r_max": 1.0, "d_max": 0.0} if limits == "r_max=1,d_max=0" else {"warmup_steps": 100}
    ref = randomize_(ref_cls(shape[1], **kw))
    ours = ours_cls(shape[1], **kw, **extra)
    ours.load_state_dict(ref.state_dict())
    for step in range(4):
        x = shifted_input(shape, seed=step) * (1 + step) - step
        g = torch.randn(shape)
        y_ref, grads_ref = run_fwd_bwd(ref, x, g)
        y, grads = run_fwd_bwd(ours, x, g)
        torch.testing.assert_close(y, y_ref, atol=2e-5, rtol=2e-5)
        for a, b in zip(grads, grads_ref, strict=True):
            torch.testing.assert_close(a, b, atol=5e-5, rtol=5e-5)
        assert_state_equal(ours, ref, exact=False, atol=1e-5, rtol=1e-5)
    assert int(ours.num_batches_tracked) == 4
    ours.eval()
    ref.eval()
    x = shifted_input(shape, seed=9)
    torch.testing.assert_close(ours(x), ref(x), atol=2e-5, rtol=2e-5)  # running stats agree to rounding
    ref.load_state_dict(ours.state_dict())  # the state moves back, and eval is then BatchNorm's bit for bit
    assert torch.equal(ours(x), ref(x))


def _reference(x, w, b, rm, rv, eps, r_max, d_max):
    """Ioffe (2017), Algorithm 1, in fp64 autograd with r and d as constants."""
    dims = (0, 2, 3)
    mu = x.mean(dims, keepdim=True)
    sigma_b = torch.sqrt(((x - mu) ** 2).mean(dims, keepdim=True) + eps)
    sigma = torch.sqrt(rv.view(1, -1, 1, 1) + eps)
    r = (sigma_b / sigma).detach().clamp(1 / r_max, r_max)
    d = ((mu - rm.view(1, -1, 1, 1)) / sigma).detach().clamp(-d_max, d_max)
    return w.view(1, -1, 1, 1) * ((x - mu) / sigma_b * r + d) + b.view(1, -1, 1, 1)


@pytest.mark.parametrize(("r_max", "d_max"), [(1.5, 0.5), (3.0, 5.0), (1e9, 1e9)])
def test_matches_fp64_reference_of_the_paper(r_max: float, d_max: float) -> None:
    m = randomize_(C.BatchRenorm2d(4, eps=1e-3, r_max=r_max, d_max=d_max, dtype=torch.float64))
    rm, rv = m.running_mean.clone(), m.running_var.clone()
    x = shifted_input((3, 4, 5, 2), torch.float64) * 3 + 1  # far from the running statistics: clipping is active
    g = torch.randn(x.shape, dtype=torch.float64)
    y, grads = run_fwd_bwd(m, x, g)
    xr = x.clone().requires_grad_(True)
    w, b = m.weight.detach().clone().requires_grad_(True), m.bias.detach().clone().requires_grad_(True)
    y_ref = _reference(xr, w, b, rm, rv, 1e-3, r_max, d_max)
    grads_ref = torch.autograd.grad(y_ref, [xr, b, w], g)  # run_fwd_bwd sorts params by name: bias, weight
    torch.testing.assert_close(y, y_ref.detach(), atol=1e-12, rtol=1e-12)
    for a, e in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(a, e, atol=1e-10, rtol=1e-10)
    if r_max < 2:  # the clip really acted, else this test would not test it
        sigma_b = x.var((0, 2, 3), correction=0).add(1e-3).sqrt()
        assert ((sigma_b / (rv + 1e-3).sqrt()) > r_max).any()


def test_unclipped_training_output_equals_eval_output() -> None:
    """With r and d unclipped, x_hat = (x - running_mean) / sigma: the inference function, noise-free."""
    m = randomize_(C.BatchRenorm2d(4, r_max=1e6, d_max=1e6, dtype=torch.float64))
    x = shifted_input((2, 4, 3, 3), torch.float64)
    y_eval = m.eval()(x)
    y_train = m.train()(x)
    torch.testing.assert_close(y_train, y_eval, atol=1e-12, rtol=1e-12)


def test_warmup_schedule() -> None:
    m = C.BatchRenorm2d(2, r_max=3.0, d_max=5.0, warmup_steps=2, r_ramp_steps=4, d_ramp_steps=2)
    assert [m.limits(s) for s in (0, 1, 2, 3, 4, 6, 100)] == [
        (1.0, 0.0),
        (1.0, 0.0),
        (1.0, 0.0),
        (1.5, 2.5),
        (2.0, 5.0),
        (3.0, 5.0),
        (3.0, 5.0),
    ]
    x = torch.randn(4, 2, 3, 3)
    for _ in range(3):
        m(x)
    assert m.limits() == (1.5, 2.5)  # the next batch is step 3
    assert "r_max=3.0" in repr(m)


def test_not_converted_to_sync_and_folded_like_batchnorm() -> None:
    model = nn.Sequential(nn.Conv2d(2, 3, 3), C.BatchRenorm2d(3))
    assert isinstance(C.convert_sync_batchnorm(model)[1], C.BatchRenorm2d)
    randomize_(model[1])
    model.eval()
    folded = C.fold_batchnorm(model)
    x = torch.randn(2, 2, 5, 5)
    assert isinstance(folded[1], nn.Identity)
    torch.testing.assert_close(folded(x), model(x), atol=1e-5, rtol=1e-5)
