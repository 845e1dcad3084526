"""AdaIN (Huang & Belongie 2017, arXiv 1703.06868) against the paper's formula in fp64, with the style as a feature
map (other spatial size, batch of 1 broadcast) or as (mean, std) tensors; grads to content and style, gradcheck,
AdaIN(x, x) == x, and the module form (no state, train = eval)."""

from __future__ import annotations

import pytest
import torch

import lnblocks.cnn as C
from tests.cnn.cnn_helpers import TOL, shifted_input

EPS = 1e-3


def _stats(t):
    """Per-(n, c) mean and biased variance over the spatial dims, written out."""
    flat = t.reshape(t.shape[0], t.shape[1], -1)
    mean = flat.sum(-1) / flat.shape[-1]
    var = ((flat - mean[..., None]) ** 2).sum(-1) / flat.shape[-1]
    return mean, var


def _reference(content, mu_s, sigma_s):
    """sigma_s (x - mu_x) / sqrt(var_x + eps) + mu_s, with (N, C) statistics."""
    mu_c, var_c = _stats(content)
    view = content.shape[:2] + (1,) * (content.dim() - 2)
    mu_s = mu_s.expand(content.shape[:2]).reshape(view)
    sigma_s = sigma_s.expand(content.shape[:2]).reshape(view)
    return sigma_s * (content - mu_c.reshape(view)) / torch.sqrt(var_c.reshape(view) + EPS) + mu_s


@pytest.mark.parametrize(
    ("content_shape", "style_shape"),
    [((2, 3, 4, 5), (2, 3, 6, 2)), ((2, 3, 4, 5), (1, 3, 3, 3)), ((3, 4, 7), (3, 4, 5))],
    ids=["map", "one-style-for-the-batch", "1d"],
)
def test_style_map_matches_the_paper_formula_in_fp64(content_shape, style_shape) -> None:
    content = shifted_input(content_shape, torch.float64, seed=1).requires_grad_(True)
    style = (shifted_input(style_shape, torch.float64, seed=2) * 3 - 1).requires_grad_(True)
    y = C.adaptive_instance_norm(content, style, eps=EPS)
    mu_s, var_s = _stats(style)
    y_ref = _reference(content, mu_s, torch.sqrt(var_s + EPS))  # the style's std carries eps too
    torch.testing.assert_close(y, y_ref, atol=1e-12, rtol=1e-12)
    g = torch.randn(content_shape, dtype=torch.float64)
    grads = torch.autograd.grad(y, [content, style], g)
    grads_ref = torch.autograd.grad(y_ref, [content, style], g)
    for a, e in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(a, e, atol=1e-10, rtol=1e-10)
    # the output carries the style's statistics: its mean, and its variance up to the content's var / (var + eps)
    mu_y, var_y = _stats(y.detach())
    _, var_c = _stats(content.detach())
    torch.testing.assert_close(mu_y, mu_s.detach().expand_as(mu_y), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(var_y, (var_s.detach() + EPS) * var_c / (var_c + EPS), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("stat_shape", [(2, 3), (1, 3), (3,)])
def test_style_statistics_given_as_tensors(stat_shape) -> None:
    content = shifted_input((2, 3, 4, 4), torch.float64)
    mu_s = torch.randn(stat_shape, dtype=torch.float64)
    sigma_s = torch.rand(stat_shape, dtype=torch.float64) + 0.5  # used as given: no eps added
    y = C.adaptive_instance_norm(content, (mu_s, sigma_s), eps=EPS)
    torch.testing.assert_close(y, _reference(content, mu_s, sigma_s), atol=1e-12, rtol=1e-12)


def test_unit_style_is_torch_instance_norm() -> None:
    x = shifted_input((2, 3, 4, 5))
    y = C.adaptive_instance_norm(x, (torch.zeros(3), torch.ones(3)), eps=EPS)
    torch.testing.assert_close(y, torch.nn.functional.instance_norm(x, eps=EPS), atol=1e-5, rtol=1e-5)


def test_identity_when_style_is_content_and_module_form() -> None:
    x = shifted_input((2, 3, 4, 4), torch.float64)
    torch.testing.assert_close(C.adaptive_instance_norm(x, x), x, atol=1e-12, rtol=1e-12)
    m = C.AdaIN(eps=EPS)
    style = shifted_input((2, 3, 2, 2), torch.float64, seed=3)
    assert m.state_dict() == {} and list(m.parameters()) == []
    assert torch.equal(m.train()(x, style), m.eval()(x, style))
    assert torch.equal(m(x, style), C.adaptive_instance_norm(x, style, eps=EPS))
    assert "eps=0.001" in repr(m)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_close_to_fp64(dtype) -> None:
    x, s = shifted_input((2, 3, 4, 4), dtype), shifted_input((2, 3, 3, 3), dtype, seed=4)
    y = C.adaptive_instance_norm(x, s)
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), C.adaptive_instance_norm(x.double(), s.double()), **TOL[dtype])


def test_gradcheck() -> None:
    content = shifted_input((2, 2, 2, 3), torch.float64).requires_grad_(True)
    style = shifted_input((2, 2, 3, 2), torch.float64, seed=5).requires_grad_(True)
    mu = torch.randn(2, 2, dtype=torch.float64, requires_grad=True)
    sigma = (torch.rand(2, 2, dtype=torch.float64) + 0.5).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda c, s: C.adaptive_instance_norm(c, s, EPS), (content, style))
    assert torch.autograd.gradcheck(lambda c, m, s: C.adaptive_instance_norm(c, (m, s), EPS), (content, mu, sigma))
