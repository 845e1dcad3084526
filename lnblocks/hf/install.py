"""How one module is patched and unpatched: the lnblocks norm built for its math, and the forward that runs it.

- The module's class, parameters and ``state_dict`` keys stay as they are, so ``isinstance``, optimizers holding the
  Parameters, ``save_pretrained`` and checkpoints keep working.
- An lnblocks norm (``lnblocks.norms``: the one source of norm math, and the Triton dispatch) is built for the
  module's exact math on "meta" and shares the module's parameter dict (``Norm.share_parameters``): no copy, no new
  Parameter, and it always sees the live Parameters, also after ``.to()``, ``.half()``, ``to_empty`` or
  ``load_state_dict(assign=True)``. It is kept in the module's ``PatchRecord`` (``lnblocks.hf.record``), not
  registered as a submodule.
- The instance's ``forward`` becomes a ``PatchedForward``, which reads eps from the module's own attribute
  (``variance_epsilon`` or ``eps``) at every call and calls the lnblocks norm; it holds the module by weak reference,
  so a patched module is no reference cycle and ``del model`` frees it at once, without the garbage collector.
  Nothing is computed in place, so post-branch (sandwich) norms, whose input is still needed, are safe.
- Under accelerate's device hooks (``device_map``) the hook's wrapped ``_old_forward`` is replaced instead, keeping
  the hook. ``uninstall`` removes exactly what ``install`` added.
"""

from __future__ import annotations

import copy
import types
import weakref
from typing import Any

import torch
from torch import Tensor, nn

from lnblocks.hf.norm_match import probe
from lnblocks.hf.recognition import NormMath
from lnblocks.hf.record import RECORD_KEY, PatchRecord
from lnblocks.norms import Norm, build_norm


def same_kind(err: Exception, message: str) -> Exception:
    """A plain ``ValueError``/``TypeError`` (as ``err`` is) with ``message``: the error says which module failed."""
    return (ValueError if isinstance(err, ValueError) else TypeError)(message)


def build_norm_for(name: str, module: nn.Module, math: NormMath, backend: str, memory_efficient: bool = False) -> Norm:
    """The lnblocks norm computing ``module``'s math on ``module``'s own Parameters (built on "meta": no memory).

    A parameter-free class that stores no shape (``Llama4TextL2Norm(eps)``) gets a norm per last dim, built at its
    first call of that width (``PatchRecord.norm_for``); the one built here (for width 1) holds the spec."""
    try:
        spec = math.spec(module, backend, memory_efficient)
        shape = math.normalized_shape(module)
        norm = build_norm(spec, shape if shape is not None else 1, device="meta")
    except (TypeError, ValueError) as err:
        raise same_kind(err, f"cannot patch the norm {name or '<model>'} ({type(module).__name__}): {err}") from None
    if math.params or math.origin.startswith("torch.nn."):  # a class with no parameter at all keeps the norm's Nones
        norm.share_parameters(module)
    return norm


def check_triton(name: str, module: nn.Module, norm: Norm) -> None:
    """``backend="triton"`` must be runnable at patch time (on the parameters' device), not fail mid-forward."""
    param = next((p for p in module._parameters.values() if p is not None), None)
    if param is None or param.device.type == "meta":
        return  # nothing to probe yet: the forward raises the same error if the kernel cannot run
    from lnblocks.kernels import unavailable_reason  # lazy: no triton at import time

    probe = torch.empty((1, *norm.normalized_shape), device=param.device, dtype=param.dtype)
    reason = unavailable_reason(norm.spec, probe)
    if reason is not None:
        raise ValueError(
            f"backend='triton' cannot run the norm {name or '<model>'} ({type(module).__name__}, "
            f"{param.device.type} {param.dtype}): {reason}. Use backend='auto' (fused kernels where they can run, "
            "PyTorch elsewhere) or backend='torch'."
        )


class BoundToModule:
    """A callable put on a module's instance that reaches the module through a weak reference (a strong one would
    make module -> callable -> module a cycle). Copies and pickles of the module get one bound to the copy."""

    __slots__ = ("_module", "record")

    def __init__(self, module: nn.Module, record: PatchRecord) -> None:
        self._module = weakref.ref(module)
        self.record = record

    def module(self) -> nn.Module:
        module = self._module()
        if module is None:
            raise ReferenceError("the module this lnblocks forward was patched into no longer exists")
        return module

    def __deepcopy__(self, memo: dict) -> BoundToModule:
        return type(self)(copy.deepcopy(self.module(), memo), copy.deepcopy(self.record, memo))

    def __reduce__(self) -> tuple:
        return type(self), (self.module(), self.record)


def _class_route(module: nn.Module, norm: Norm, math: NormMath, x: Tensor, dtype: torch.dtype) -> bool:
    """True where the lnblocks norm as it is would round differently from the class (see ``NormMath``)."""
    if math.fp32_only and dtype == torch.float64:
        return True  # the class computes in fp32 even for fp64 inputs
    if math.checks and not all(probe(module, attr) == value for attr, value in math.checks):
        return True  # an attribute the math was read with has changed since (a branch, a group size, the activation)
    if math.weight_upcast and any(p is not None and p.dtype == torch.float64 for p in module._parameters.values()):
        return True  # the class rounds fp64 parameters to fp32
    if math.input_ndim is not None and x.dim() != math.input_ndim:
        return True  # the class branches on the input's rank; its math was read for this one
    return math.torch_route != "lnblocks" and norm.backend_for(x) == "torch"


def _class_math(module: nn.Module, norm: Norm, math: NormMath, x: Tensor, *gate: Tensor | None) -> Tensor:
    if math.torch_route == "fp32_input" and x.dtype != torch.float64:
        return norm.forward(x.to(torch.float32)).to(x.dtype)  # OLMo: F.layer_norm of the fp32 input
    return type(module).forward(module, x, *gate)


def _follow_eps(module: nn.Module, norm: Norm, math: NormMath, eps: Any) -> None:
    """eps changed on the module after patching: the norm follows it (or says why it cannot)."""
    try:
        norm.spec = norm.spec.replace(eps=None if eps is None else float(eps))
    except (TypeError, ValueError) as err:
        raise same_kind(
            err,
            f"{type(module).__name__}.{math.eps_attr} = {eps!r}, set after patching, is no eps lnblocks can run: {err}",
        ) from None


class PatchedForward(BoundToModule):
    """The forward of a patched module: the lnblocks norm, with eps read from the module's own attribute.

    With ``residual`` (a fused decoder layer's call): ``(norm(hidden_states + residual), hidden_states + residual)``;
    with ``then_add`` (a fused post-norm): ``then_add + norm(hidden_states)``.
    """

    __slots__ = ()

    def __call__(
        self, hidden_states: Tensor, residual: Tensor | None = None, *, then_add: Tensor | None = None
    ) -> Tensor | tuple:
        module = self.module()
        record = self.record
        math = record.math
        norm = record.norm if math.shape_from != "input" else record.norm_for(hidden_states)
        if then_add is not None:
            return self._then_add(module, norm, math, hidden_states, then_add)
        if residual is None:
            if _class_route(module, norm, math, hidden_states, hidden_states.dtype):
                return _class_math(module, norm, math, hidden_states)
        elif _class_route(module, norm, math, hidden_states, torch.promote_types(hidden_states.dtype, residual.dtype)):
            total = hidden_states + residual
            return _class_math(module, norm, math, total), total
        eps = norm.spec.eps if math.eps_attr is None else getattr(module, math.eps_attr)
        if eps != norm.spec.eps:
            _follow_eps(module, norm, math, eps)
        return norm.forward(hidden_states) if residual is None else norm.forward(hidden_states, residual)

    def _then_add(self, module: nn.Module, norm: Norm, math: NormMath, x: Tensor, residual: Tensor) -> Tensor:
        """``residual + module(x)``, the new residual of a post-norm layer, as one ``Norm.norm_then_add`` call."""
        if _class_route(module, norm, math, x, x.dtype):
            return residual + _class_math(module, norm, math, x)
        eps = norm.spec.eps if math.eps_attr is None else getattr(module, math.eps_attr)
        if eps != norm.spec.eps:
            _follow_eps(module, norm, math, eps)
        return norm.norm_then_add(x, residual)


class PatchedGatedForward(BoundToModule):
    """The forward of a patched gated norm (the mixer norm of the hybrid SSM families): ``forward(x, gate)``; a class
    that needs its gate gets its own error without one."""

    __slots__ = ()

    def __call__(self, hidden_states: Tensor, gate: Tensor | None = None) -> Tensor:
        module = self.module()
        norm, math = self.record.norm, self.record.math
        if (gate is None and not math.gate_optional) or _class_route(
            module, norm, math, hidden_states, hidden_states.dtype
        ):
            return _class_math(module, norm, math, hidden_states, gate)
        eps = getattr(module, math.eps_attr)
        if eps != norm.spec.eps:
            _follow_eps(module, norm, math, eps)
        return norm.forward(hidden_states, gate)


PATCHED_FORWARDS = (PatchedForward, PatchedGatedForward)


class PatchedRepr(BoundToModule):
    """``extra_repr`` of a patched module: the class's own, and the lnblocks backend."""

    __slots__ = ()

    def __call__(self) -> str:
        module = self.module()
        return f"{type(module).extra_repr(module)}, lnblocks(backend={self.record.norm.spec.backend!r})".lstrip(", ")


def install(module: nn.Module, norm: Norm, math: NormMath) -> None:
    """Make ``module`` run ``norm``: its record, its forward (or accelerate's ``_old_forward``) and its repr."""
    record = PatchRecord(norm, math)
    forward = (PatchedGatedForward if math.kind == "gated_rmsnorm" else PatchedForward)(module, record)
    if "forward" in module.__dict__:  # an accelerate hook: replace the forward it calls, keep the hook
        record.saved_forward = module.__dict__["_old_forward"]
        module.__dict__["_old_forward"] = forward
    else:
        module.__dict__["forward"] = forward
    module.__dict__["extra_repr"] = PatchedRepr(module, record)
    module.__dict__[RECORD_KEY] = record


def uninstall(module: nn.Module) -> None:
    """Remove only what ``install`` put there, also when a hook was added on top of it since (accelerate)."""
    record: PatchRecord = module.__dict__.pop(RECORD_KEY)
    if isinstance(module.__dict__.get("forward"), PATCHED_FORWARDS):
        del module.__dict__["forward"]
    elif isinstance(module.__dict__.get("_old_forward"), PATCHED_FORWARDS):
        saved = record.saved_forward
        module.__dict__["_old_forward"] = saved if saved is not None else types.MethodType(type(module).forward, module)
    if isinstance(module.__dict__.get("extra_repr"), PatchedRepr):
        del module.__dict__["extra_repr"]
