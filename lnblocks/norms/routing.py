"""How a norm module's call runs: full checks and the backend choice once per kind of call, then a cached route.

``dispatch(norm, x, residual)`` is ``Norm.forward``. Its first call with a given (device kind, x dtype, residual
dtype) runs ``plan_route``: every check (x, residual, and every tensor the math reads: shape, dtype, device, DTensor
placements), the backend choice, the resolved eps (RMSNorm's ``eps=None``) or the kernels' ``NormPlan``. The
resulting ``Route`` is cached in the module (``RouteCache``), and later calls repeat only what a cached route cannot
vouch for, at a cost of well under a microsecond (benchmarks/norms/bench_norm_overhead.py):

- x's last dim and the residual's shape;
- that every tensor the math reads is the object the route was checked with (a replaced parameter,
  ``load_state_dict(assign=True)``, FSDP2 swapping sharded and unsharded parameters or a new parametrization all make
  a new object, so the call takes the full checks again; assigning ``norm.spec`` clears the routes);
- on the fused path, each parameter's shape, dtype and device (``run_fused``: ``.to()`` and ``weight.data = ...``
  change a tensor in place, and a kernel reading a tensor of the wrong size would read out of bounds); a mismatch
  re-plans once.

Nothing is cached for a parametrized weight (a new tensor every call), a DTensor input, a multi-dim
``normalized_shape`` or while torch.compile traces: those calls take the full checks every time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor
from torch.compiler import is_compiling, is_dynamo_compiling

from lnblocks.norms import functional as LF
from lnblocks.norms.spec import NormSpec

TORCH, TRITON = "torch", "triton"
_MISSING = object()
_kernels_functional = None  # lnblocks.kernels.functional, imported on the first fused call (it imports triton)


def _kernels() -> Any:
    global _kernels_functional
    if _kernels_functional is None:
        from lnblocks.kernels import functional

        _kernels_functional = functional
    return _kernels_functional


class Route:
    """One decision: ``backend``, and what the call needs (the checked tensors, the resolved eps or the plan)."""

    __slots__ = (
        "args",
        "backend",
        "bias",
        "eps",
        "fn",
        "last_dim",
        "n",
        "others",
        "out_dtype",
        "plan",
        "spec",
        "weight",
        "weight_only",
    )

    def __init__(self, **fields: Any) -> None:
        for name in self.__slots__:
            setattr(self, name, fields.get(name))


class RoutedNorm(Protocol):
    """What a call's routing reads of a norm module: ``lnblocks.norms.modules.Norm`` and its subclasses (which
    import this module, so it names their interface instead of importing them)."""

    spec: NormSpec
    normalized_shape: tuple[int, ...] | None
    _routes: RouteCache
    _parameters: dict[str, Any]
    _buffers: dict[str, Any]
    _vectors: tuple[str, ...]  # tensors of shape normalized_shape the math reads
    _scalars: tuple[str, ...]  # one-element tensors the math reads
    _fused_kernel: bool
    _row_blocks_on_cpu: bool
    _last_dim: int | None
    _row_numel: int
    _group_size: int | None  # statistics per group of this many elements (None: the whole row)

    def output_dtype(self, input_dtype: torch.dtype) -> torch.dtype: ...

    def _math(self, route: Route) -> tuple[Callable[..., Tensor], tuple]: ...

    def _rows(self, x: Tensor, fn: Callable[..., Tensor], args: tuple) -> Tensor: ...


class RouteCache:
    """A module's routes, keyed by x's dtype (or ``(x.dtype, residual.dtype)``) per device kind (``cpu``: not CUDA,
    ``cuda``), and the backend of the latest eager call. Copies and pickles of a module start empty (the routes hold
    the original's tensors)."""

    __slots__ = ("cpu", "cuda", "last_backend")

    def __init__(self) -> None:
        self.cpu: dict = {}
        self.cuda: dict = {}
        self.last_backend: str | None = None

    def clear(self) -> None:
        self.cpu.clear()
        self.cuda.clear()

    def __deepcopy__(self, memo: dict) -> RouteCache:
        return RouteCache()

    def __reduce__(self) -> tuple:
        return RouteCache, ()


def dispatch(norm: RoutedNorm, x: Tensor, residual: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """``norm(x)`` -> ``y``; ``norm(x, residual=r)`` -> ``(y, x + r)``: the cached route, else the full checks."""
    cache = norm._routes
    if not is_dynamo_compiling():  # (a plain `return False` in eager: the cheapest test)
        params = norm._parameters
        try:
            route = (cache.cuda if x.is_cuda else cache.cpu).get(
                x.dtype if residual is None else (x.dtype, residual.dtype)
            )
            valid = (
                route is not None
                and x.shape[-1] == route.last_dim
                and params.get("weight") is route.weight
                and (
                    route.weight_only
                    or (params.get("bias") is route.bias and (not route.others or _same_others(norm, route.others)))
                )
                and (residual is None or residual.shape == x.shape)
            )
        except (AttributeError, IndexError):  # not a tensor, or a 0-d one: the full checks name the problem
            valid = False
        if valid:
            cache.last_backend = route.backend
            if route.plan is None:
                return route.fn(x, *route.args) if residual is None else _add_and_normalize(x, residual, route)
            try:
                kernels = _kernels()
                return kernels.run_fused(route.plan, x, residual, route.weight, route.bias, route.n, route.others)
            except kernels.StaleOperandError:
                pass  # a parameter changed in place since the route was planned: plan again
    route = plan_route(norm, x, residual)
    if not is_dynamo_compiling():
        cache.last_backend = route.backend
    if route.plan is not None:
        return _kernels().run_fused(route.plan, x, residual, route.weight, route.bias, route.n, route.others)
    return route.fn(x, *route.args) if residual is None else _add_and_normalize(x, residual, route)


def route_for(norm: RoutedNorm, x: Tensor) -> Route:
    """The route of ``norm(x)`` for the call forms ``dispatch`` does not serve (the gated norm's ``norm(x, gate)``,
    ``Norm.norm_then_add``): the cached one when it is still valid (the test ``dispatch`` inlines), else planned
    with the full checks."""
    cache = norm._routes
    if not is_dynamo_compiling():
        params = norm._parameters
        try:
            route = (cache.cuda if x.is_cuda else cache.cpu).get(x.dtype)
            if (
                route is not None
                and x.shape[-1] == route.last_dim
                and params.get("weight") is route.weight
                and (
                    route.weight_only
                    or (params.get("bias") is route.bias and (not route.others or _same_others(norm, route.others)))
                )
            ):
                cache.last_backend = route.backend
                return route
        except (AttributeError, IndexError):  # not a tensor, or a 0-d one: the full checks name the problem
            pass
    route = plan_route(norm, x, None)
    if not is_dynamo_compiling():
        cache.last_backend = route.backend
    return route


def _add_and_normalize(x: Tensor, residual: Tensor, route: Route) -> tuple[Tensor, Tensor]:
    """The torch backend's ``(norm(x + r), x + r)``, with ``x + r`` in fp32 when ``residual_in_fp32``."""
    new_residual = LF._add_residual(x, residual, route.spec.residual_in_fp32)
    y = route.fn(new_residual, *route.args)
    if route.out_dtype is not None:  # the fp32 stream does not change what the branch sees: norm(x)'s dtype
        y = y.to(route.out_dtype)
    return y, new_residual


def _same_others(norm: RoutedNorm, others: tuple[tuple[str, Tensor], ...]) -> bool:
    return all(norm._parameters.get(name, norm._buffers.get(name, _MISSING)) is t for name, t in others)


def _read(norm: RoutedNorm, name: str) -> tuple[Any, bool]:
    """The tensor ``norm.<name>`` and whether a cached route may keep it (a parametrization computes a new one per
    call); None where a shared parameter dict lacks the name (``Norm.share_parameters``)."""
    if name in norm._parameters or name in norm._buffers:
        return getattr(norm, name), True
    value = getattr(norm, name, None)
    return value, value is None


def backend_for(norm: RoutedNorm, x: Tensor, residual: Tensor | None = None) -> str:
    """The backend a call on ``x`` (and ``residual``) runs; raises if ``"triton"`` was asked for and cannot run."""
    spec = norm.spec
    if not norm._fused_kernel or spec.backend == TORCH or (spec.backend == "auto" and not x.is_cuda):
        return TORCH
    from lnblocks.kernels import unavailable_reason  # lazy: keeps triton out of `import lnblocks`

    tensors = [(name, getattr(norm, name, None)) for name in (*norm._vectors, *norm._scalars)]
    reason = unavailable_reason(spec, x, residual=residual, parameters=tensors, row_numel=norm._row_numel)
    if spec.backend == TRITON:
        if reason is not None:
            raise ValueError(f"backend='triton' cannot run here: {reason}. Use backend='auto' or 'torch'.")
        return TRITON
    return TRITON if reason is None else TORCH


def plan_route(norm: RoutedNorm, x: Tensor, residual: Tensor | None) -> Route:
    """Check the call fully and decide how calls like it run; cached in ``norm`` when a later call can reuse it."""
    _check_operands(norm, x, residual)
    spec, shape = norm.spec, norm.normalized_shape
    cacheable = type(x) is Tensor and norm._last_dim is not None and not is_compiling()
    vectors = {}
    for name in norm._vectors:
        t, registered = _read(norm, name)
        LF.check_param(name, t, shape)
        _check_device(name, t, x)
        vectors[name] = t
        cacheable = cacheable and registered
    others = []
    for name in norm._scalars:
        t, registered = _read(norm, name)
        LF.check_float_tensor(name, t)
        if t.numel() != 1:
            raise ValueError(f"{name}: expected a one-element tensor, got shape {tuple(t.shape)}")
        _check_device(name, t, x)
        others.append((name, t))
        cacheable = cacheable and registered
    _check_dtensors(x, residual, [*vectors.items(), *others])
    weight, bias = vectors.get("weight"), vectors.get("bias")
    backend = backend_for(norm, x, residual)
    route = Route(backend=backend, spec=spec, last_dim=norm._last_dim, weight=weight, bias=bias, n=norm._row_numel)
    route.others = tuple(others)
    route.weight_only = not others and "bias" not in vectors  # the per-call check then reads one parameter
    norm_dtype = x.dtype
    if residual is not None:
        norm_dtype = LF.new_residual_dtype(x.dtype, residual.dtype, spec.residual_in_fp32)
    if backend == TRITON:
        from lnblocks.kernels.plan import make_plan  # (no triton in it; the kernels were checked runnable above)

        route.plan = make_plan(
            spec,
            x.dtype,
            None if residual is None else residual.dtype,
            None if weight is None else weight.dtype,
            group_size=norm._group_size,
        )
    else:
        route.eps = LF.resolve_rms_eps(spec.eps, norm_dtype) if spec.kind == "rmsnorm" else getattr(spec, "eps", None)
        if residual is not None and spec.residual_in_fp32:
            route.out_dtype = norm.output_dtype(x.dtype)
        route.fn, route.args = norm._math(route)
        if norm._row_blocks_on_cpu and norm._row_numel and not x.is_cuda and x.dtype in (torch.float16, torch.bfloat16):
            route.fn, route.args = norm._rows, (route.fn, route.args)
    if cacheable:
        routes = norm._routes.cuda if x.is_cuda else norm._routes.cpu
        routes[x.dtype if residual is None else (x.dtype, residual.dtype)] = route
    return route


def _check_operands(norm: RoutedNorm, x: Tensor, residual: Tensor | None) -> None:
    LF.check_float_tensor("x", x)
    if norm.normalized_shape is not None:
        LF.check_trailing(x, norm.normalized_shape)
    if residual is not None:
        _check_residual_operand(x, residual)


def _check_residual_operand(x: Tensor, residual: Tensor) -> None:
    LF.check_float_tensor("residual", residual)
    if residual.shape != x.shape:
        raise ValueError(
            f"residual: expected the same shape as x {tuple(x.shape)}, got {tuple(residual.shape)} (no broadcasting)"
        )
    _check_device("residual", residual, x)


def check_residual(x: Tensor, residual: Tensor) -> None:
    """A residual operand of a call other than ``norm(x, residual=r)`` (``Norm.norm_then_add``): floating, of x's
    shape (never broadcast), on x's device, and a DTensor exactly when x is one. ``norm(x, residual=r)`` checks the
    same in its planning."""
    _check_residual_operand(x, residual)
    _check_dtensors(x, residual, [])


def _check_device(name: str, t: Tensor | None, x: Tensor) -> None:
    if t is not None and t.device != x.device:
        raise ValueError(f"{name}: expected device {x.device} (the device of x), got {t.device}")


def _check_dtensors(x: Tensor, residual: Tensor | None, tensors: list[tuple[str, Tensor | None]]) -> None:
    """DTensors and plain tensors do not mix: say which operand is which, and what to do (either backend)."""
    if type(x) is Tensor and all(type(t) in (Tensor, torch.nn.Parameter) for _, t in tensors if t is not None):
        return
    from lnblocks.kernels import is_dtensor  # no triton: the support rule's module

    if not is_dtensor(x):
        sharded = next((name for name, t in tensors if is_dtensor(t)), None)
        if sharded is not None:
            raise ValueError(
                f"{sharded} is a DTensor but x is a plain tensor. A norm under FSDP2 must be called as a module, "
                "norm(x), not norm.forward(x): its parameters are all-gathered in __call__'s hooks (pytorch#157209)"
            )
        return
    plain = next((name for name, t in (("residual", residual), *tensors) if t is not None and not is_dtensor(t)), None)
    if plain is not None:
        raise ValueError(
            f"{plain} is a plain tensor while x is a DTensor: distribute it on x's mesh too (for a norm module: "
            "parallelize_module(norm, mesh, SequenceParallel()) replicates its parameters)"
        )
