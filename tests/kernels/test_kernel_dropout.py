"""Fused dropout: the mask's statistics, and forward and backward both applying the mask ``dropout_mask`` gives."""

from __future__ import annotations

import math

import pytest
import torch

from lnblocks.kernels.functional import dropout_mask, fused_add_norm
from lnblocks.norms.spec import LayerNormSpec, RMSNormSpec
from tests.kernels.kernel_helpers import DEVICE, check_against_references, make_case


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_mask_statistics(p: float) -> None:
    m, n = 64, 1024
    keep = dropout_mask(1234, (m, n), p, DEVICE)
    total = m * n
    sigma = math.sqrt(total * p * (1 - p))
    assert abs(keep.sum().item() - total * (1 - p)) < 5 * sigma, "kept fraction is off"
    per_row = keep.double().mean(1)
    row_sigma = math.sqrt(p * (1 - p) / n)
    assert (per_row - (1 - p)).abs().max().item() < 6 * row_sigma, "a row's kept fraction is off"
    assert len({tuple(r.tolist()) for r in keep[:8]}) == 8, "rows repeat the same mask"
    # Neighbouring elements are independent: P(keep_i and keep_i+1) = (1-p)^2.
    both = (keep[:, 1:] & keep[:, :-1]).double().mean().item()
    assert abs(both - (1 - p) ** 2) < 5 * math.sqrt((1 - p) ** 2 / (m * (n - 1)))


def test_mask_is_a_function_of_the_seed() -> None:
    a, b, c = (dropout_mask(s, (4, 300), 0.3, DEVICE) for s in (7, 7, 8))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("spec", [LayerNormSpec(), RMSNormSpec(eps=1e-6)], ids=["layernorm", "rmsnorm"])
def test_forward_and_backward_apply_the_seeded_mask(spec, residual: bool, dtype: torch.dtype) -> None:
    """The reference applies ``dropout_mask(seed)`` itself; kernel fwd and bwd (which recomputes the mask) match it."""
    seed, p = 42, 0.25
    case = make_case((6, 200), dtype, spec, residual=residual)
    case.dropout_p, case.keep = p, dropout_mask(seed, (6, 200), p, DEVICE)
    check_against_references(case, seed=seed)


def test_looped_path_uses_the_same_mask() -> None:
    seed, p = 3, 0.5
    case = make_case((3, 100), torch.float32, LayerNormSpec(), residual=True)
    case.dropout_p, case.keep = p, dropout_mask(seed, (3, 100), p, DEVICE)
    check_against_references(case, seed=seed, max_block_n=32)


def test_dropped_elements_get_no_gradient_and_kept_ones_are_scaled() -> None:
    seed, p = 11, 0.5
    x = torch.randn(4, 64, device=DEVICE, requires_grad=True)
    r = torch.zeros(4, 64, device=DEVICE)
    _, z = fused_add_norm(x, r, None, None, LayerNormSpec(), dropout_p=p, seed=seed)
    keep = dropout_mask(seed, (4, 64), p, DEVICE)
    torch.testing.assert_close(z, torch.where(keep, x.detach() * 2, 0.0))
    (dx,) = torch.autograd.grad(z.sum(), [x])
    torch.testing.assert_close(dx, keep.float() * 2)


def test_seed_none_draws_from_torch_generator() -> None:
    x = torch.randn(2, 64, device=DEVICE)
    torch.manual_seed(5)
    a = fused_add_norm(x, None, dropout_p=0.5)
    torch.manual_seed(5)
    b = fused_add_norm(x, None, dropout_p=0.5)
    c = fused_add_norm(x, None, dropout_p=0.5)
    assert torch.equal(a, b) and not torch.equal(a, c)
