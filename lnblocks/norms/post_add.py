"""Norm, then add: ``new_residual = residual + norm(x)`` as one call (``Norm.norm_then_add``).

The other residual fusion: OLMo 2's layers compute ``h = residual + post_attention_layernorm(attn(h))`` and Gemma 2/3's
post-norms do the same, so there is no add-then-norm to fuse there (``norm(x, residual=r)``), but the norm and the
add after it are one pass over memory: the fused kernel reads ``x`` and the residual and writes the new residual, and
writes ``y = norm(x)`` only when the caller asks for it (``return_normed=True``): in those layers nothing else reads
``y``, so not writing it saves a third of the forward's traffic. The torch backend computes ``norm(x)`` with the
module's own math and adds the residual with the same op as the eager layer (``add_residual``, fp32 with
``residual_in_fp32``), so it is bit-identical with ``residual + norm(x)``, values and gradients.
"""

from __future__ import annotations

from torch import Tensor

from lnblocks.norms import functional as LF
from lnblocks.norms import routing
from lnblocks.norms.routing import RoutedNorm


def norm_then_add(norm: RoutedNorm, x: Tensor, residual: Tensor, *, return_normed: bool = False) -> Tensor | tuple:
    """``residual + norm(x)`` (the new residual); with ``return_normed``, ``(norm(x), residual + norm(x))``.

    ``residual`` must have x's shape (never broadcast); its dtype and ``residual_in_fp32`` give the new residual's
    dtype as for ``x + residual`` in ``norm(x, residual=...)``."""
    if not isinstance(return_normed, bool):
        raise TypeError(f"return_normed must be a bool, got {type(return_normed).__name__}")
    route = routing.route_for(norm, x)
    routing.check_residual(x, residual)
    spec = norm.spec
    if route.plan is not None:
        kernels = routing._kernels()
        reason = kernels.operand_unavailable_reason("residual", residual)
        if reason is None:
            try:
                return _fused(kernels, route, x, residual, return_normed)
            except kernels.StaleOperandError:  # a parameter changed in place since the route was planned
                route = routing.plan_route(norm, x, None)
            if route.plan is not None:
                return _fused(kernels, route, x, residual, return_normed)
        elif spec.backend == routing.TRITON:
            raise ValueError(f"backend='triton' cannot run here: {reason}. Use backend='auto' or 'torch'.")
    if route.plan is not None or route.fn is None:
        norm._routes.last_backend = routing.TORCH
        fn, args = norm._math(_torch_route(norm, route, x))
    else:
        fn, args = route.fn, route.args
    y = fn(x, *args)
    new_residual = LF._add_residual(y, residual, spec.residual_in_fp32)
    return (y, new_residual) if return_normed else new_residual


def _fused(kernels, route: routing.Route, x: Tensor, residual: Tensor, return_normed: bool) -> Tensor | tuple:
    from lnblocks.kernels.plan import norm_then_add_plan  # (no triton in it)

    plan = norm_then_add_plan(route.plan, residual.dtype, return_normed)
    out = kernels.run_fused(plan, x, residual, route.weight, route.bias, route.n, route.others)
    return out if return_normed else out[1]


def _torch_route(norm: RoutedNorm, route: routing.Route, x: Tensor) -> routing.Route:
    """The torch backend's view of a route planned for the kernels (its eps resolved for ``x``)."""
    spec = norm.spec
    eps = LF.resolve_rms_eps(spec.eps, x.dtype) if spec.kind == "rmsnorm" else getattr(spec, "eps", None)
    torch_route = routing.Route(weight=route.weight, bias=route.bias, eps=eps, spec=spec, backend=routing.TORCH)
    torch_route.others = route.others
    return torch_route
