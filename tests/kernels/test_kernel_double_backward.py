"""Second-order gradients through the fused kernels: with ``create_graph=True`` the gradient must carry a
graph and double backward must give the torch backend's numbers (gradient penalties, Hessian-vector products), and
both must be close to the same computation in fp64."""

from __future__ import annotations

import pytest
import torch

import lnblocks
from lnblocks.kernels.functional import dropout_mask, fused_add_norm
from lnblocks.norms import functional as LF
from lnblocks.norms.spec import LayerNormSpec, RMSNormSpec
from tests.kernels.kernel_helpers import DEVICE

PRESETS = ["layernorm", "rmsnorm", "llama", "gemma", "t5"]


def _issue_reproducer(backend: str, preset: str, dtype: torch.dtype, residual: bool) -> tuple:
    """The issue's reproducer: grad of a cubic loss with create_graph, then a gradient penalty backward."""
    torch.manual_seed(0)
    n = lnblocks.build_norm(preset, 8, backend=backend, device=DEVICE, dtype=dtype)
    if preset == "rmsnorm":
        n = lnblocks.build_norm(preset, 8, backend=backend, device=DEVICE, dtype=dtype, eps=1e-6)
    with torch.no_grad():
        for p in n.parameters():
            p.add_(torch.randn(p.shape, dtype=torch.float64).to(device=DEVICE, dtype=dtype) * 0.3)
    x = torch.randn(4, 8, dtype=torch.float64).to(device=DEVICE, dtype=dtype).requires_grad_()
    r = torch.randn(4, 8, dtype=torch.float64).to(device=DEVICE, dtype=dtype).requires_grad_() if residual else None
    out = n(x) if r is None else n(x, residual=r)
    y = out if r is None else out[0] * out[1].sin()  # the new residual takes part too
    leaves = [x] + ([r] if r is not None else [])
    grads = torch.autograd.grad(y.pow(3).sum(), leaves, create_graph=True)
    penalty = sum(g.pow(2).sum() for g in grads) + x.pow(2).sum()
    params = list(n.parameters())
    second = torch.autograd.grad(penalty, leaves + params)
    return grads, second


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("preset", PRESETS)
def test_double_backward_matches_torch_backend(preset: str, residual: bool) -> None:
    g_t, h_t = _issue_reproducer("torch", preset, torch.float32, residual)
    g_k, h_k = _issue_reproducer("triton", preset, torch.float32, residual)
    g_64, h_64 = _issue_reproducer("torch", preset, torch.float64, residual)
    assert all(g.requires_grad for g in g_k), "the fused backward returned a detached gradient"
    for a, b, c in zip(g_k + h_k, g_t + h_t, g_64 + h_64, strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        err_k, err_t = (a.double() - c).abs().max().item(), (b.double() - c).abs().max().item()
        atol = 1e-6 * max(1.0, c.abs().max().item())  # the cubic loss makes some grads O(1e3)
        assert err_k <= 2 * err_t + atol, f"fused second-order error {err_k:.3g} vs torch {err_t:.3g}"


def test_issue_numbers() -> None:
    """The exact reproducer from the issue: 312.801 for both backends (the fused one gave 11.384)."""
    norms = []
    for be in ("torch", "triton"):
        torch.manual_seed(0)
        n = lnblocks.build_norm("layernorm", 8, backend=be, device=DEVICE)
        x = torch.randn(4, 8, device=DEVICE, requires_grad=True)
        (g,) = torch.autograd.grad(n(x).pow(3).sum(), x, create_graph=True)
        (g.pow(2).sum() + x.pow(2).sum()).backward()
        assert g.requires_grad
        norms.append(x.grad.norm().item())
    assert norms[1] == pytest.approx(norms[0], rel=1e-5)


@pytest.mark.parametrize("spec", [LayerNormSpec(), RMSNormSpec(eps=1e-6)], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_double_backward_with_dropout(spec, residual: bool) -> None:
    """The reference backward recomputes the seeded mask: second-order grads equal those of the explicit mask."""
    seed, p = 7, 0.3
    x = torch.randn(5, 32, device=DEVICE, requires_grad=True)
    r = torch.randn(5, 32, device=DEVICE, requires_grad=True) if residual else None
    w = (torch.randn(32, device=DEVICE) * 0.3 + 1).requires_grad_()
    b = torch.randn(32, device=DEVICE, requires_grad=True) if spec.kind == "layernorm" else None
    keep = dropout_mask(seed, (5, 32), p, DEVICE)
    leaves = [t for t in (x, r, w, b) if t is not None]

    def loss(y, z):
        return y.pow(3).sum() + (0.0 if z is None else z.pow(2).mul(y).sum())

    out = fused_add_norm(x, r, w, b, spec, dropout_p=p, seed=seed)
    y_k, z_k = (out, None) if r is None else out
    g_k = torch.autograd.grad(loss(y_k, z_k), leaves, create_graph=True)
    h_k = torch.autograd.grad(sum(g.square().sum() for g in g_k), leaves)

    h = x * keep / (1 - p)
    z_t = None if r is None else h + r
    src = h if r is None else z_t
    if spec.kind == "layernorm":
        y_t = LF.layer_norm(src, (32,), w, b, spec.eps)
    else:
        y_t = LF.rms_norm(src, (32,), w, spec.eps)
    g_t = torch.autograd.grad(loss(y_t, z_t), leaves, create_graph=True)
    h_t = torch.autograd.grad(sum(g.square().sum() for g in g_t), leaves)
    for a, c in zip(g_k + h_k, g_t + h_t, strict=True):
        torch.testing.assert_close(a, c, rtol=1e-3, atol=1e-3)  # fp32 forwards differ by an ulp


def test_first_order_backward_still_runs_the_kernel() -> None:
    """Without create_graph the fused backward (not the reference math) runs, and both agree."""
    x = torch.randn(6, 40, device=DEVICE, requires_grad=True)
    w = torch.randn(40, device=DEVICE, requires_grad=True)
    y = fused_add_norm(x, None, w, None, RMSNormSpec(eps=1e-6))
    gy = torch.randn_like(y)
    plain = torch.autograd.grad(y, [x, w], gy, retain_graph=True)
    assert not any(g.requires_grad for g in plain)
    graphed = torch.autograd.grad(y, [x, w], gy, create_graph=True)
    assert all(g.requires_grad for g in graphed)
    for a, b in zip(plain, graphed, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
