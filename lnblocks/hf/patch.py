"""``patch_norms`` / ``unpatch_norms`` / ``patched_norms``: run the norms of a built model through lnblocks.

How a module is patched (per instance, reversibly; Liger-Kernel binds forwards the same way):

- its class, parameters and ``state_dict`` keys stay as they are, so ``isinstance``, optimizers holding the
  Parameters, ``save_pretrained`` and checkpoints keep working;
- an lnblocks norm (``lnblocks.norms``: the one source of norm math, and the Triton dispatch) is built for the
  module's exact math and kept in the module's ``__dict__``, not registered as a submodule; it shares the module's
  ``_parameters`` dict, so it always sees the live Parameters, also after ``.to()``, ``.half()``, ``to_empty`` or
  ``load_state_dict(assign=True)``;
- the instance gets ``forward = partial(_patched_forward, module)``, which reads eps from the module's own attribute
  (``variance_epsilon`` or ``eps``) at every call and calls the lnblocks norm. Nothing is computed in place, so
  post-branch (sandwich) norms, whose input is still needed, are safe. ``unpatch_norms`` removes exactly what was
  added. A module whose forward another tool already replaced is left alone and reported, except accelerate's
  device hooks (``device_map``), whose wrapped ``_old_forward`` is patched instead, keeping the hook.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import logging
import types
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lnblocks.config import check_choice
from lnblocks.hf.classes import NormMath, recognise
from lnblocks.hf.families import ROLES, role_map_for
from lnblocks.hf.report import PatchEntry, PatchReport
from lnblocks.norms import Norm, build_norm
from lnblocks.norms.spec import BACKENDS

_NORM_KEY = "_lnblocks_norm"  # instance attribute holding the lnblocks norm of a patched module
log = logging.getLogger("lnblocks.hf")


def _same_kind(err: Exception, message: str) -> Exception:
    """A plain ``ValueError``/``TypeError`` (as ``err`` is) with ``message``: the error says which module failed."""
    return (ValueError if isinstance(err, ValueError) else TypeError)(message)


def _patched_forward(module: nn.Module, hidden_states: Tensor) -> Tensor:
    """The forward of a patched module: the lnblocks norm, with eps read from the module's own attribute."""
    norm = getattr(module, _NORM_KEY)
    math: NormMath = norm.hf_math
    if math.fp32_only and hidden_states.dtype == torch.float64:
        return type(module).forward(module, hidden_states)  # the class computes in fp32 even for fp64 inputs
    eps = getattr(module, math.eps_attr)
    if eps != norm.spec.eps:  # eps changed on the module after patching: follow it
        try:
            norm.spec = norm.spec.replace(eps=None if eps is None else float(eps))
        except (TypeError, ValueError) as err:
            raise _same_kind(
                err,
                f"{type(module).__name__}.{math.eps_attr} = {eps!r}, set after patching, is no eps lnblocks can run: "
                f"{err}",
            ) from None
    return norm.forward(hidden_states)


def _patched_extra_repr(module: nn.Module) -> str:
    norm = getattr(module, _NORM_KEY)
    return f"{type(module).extra_repr(module)}, lnblocks(backend={norm.spec.backend!r})".lstrip(", ")


def is_patched(module: nn.Module) -> bool:
    """True if ``module``'s forward currently runs an lnblocks norm."""
    return _NORM_KEY in module.__dict__


def _lnblocks_norm(name: str, module: nn.Module, math: NormMath, backend: str) -> Norm:
    # built on "meta" (no memory), then pointed at the module's own parameter dict: no copy, no new Parameter
    try:
        norm = build_norm(math.spec(module, backend), math.normalized_shape(module), device="meta")
    except (TypeError, ValueError) as err:
        raise _same_kind(err, f"cannot patch the norm {name or '<model>'} ({type(module).__name__}): {err}") from None
    object.__setattr__(norm, "_parameters", module._parameters)
    norm.hf_math = math
    return norm


def _is_ours(obj: object, func: object = _patched_forward) -> bool:
    return isinstance(obj, functools.partial) and obj.func is func


def _hooked_by_accelerate(module: nn.Module) -> bool:
    """accelerate's ``add_hook_to_module`` convention: ``forward`` wraps ``_old_forward`` and ``_hf_hook`` is set."""
    return "forward" in module.__dict__ and "_old_forward" in module.__dict__ and hasattr(module, "_hf_hook")


def _install(module: nn.Module, norm: Norm) -> None:
    module.__dict__[_NORM_KEY] = norm
    ours = functools.partial(_patched_forward, module)
    if "forward" in module.__dict__:  # an accelerate hook: replace the forward it calls, keep the hook
        norm.hf_saved_forward = module.__dict__["_old_forward"]
        module.__dict__["_old_forward"] = ours
    else:
        module.__dict__["forward"] = ours
    module.__dict__["extra_repr"] = functools.partial(_patched_extra_repr, module)


def _uninstall(module: nn.Module) -> None:
    """Remove only what ``_install`` put there, also when a hook was added on top of it since (accelerate)."""
    norm = module.__dict__.pop(_NORM_KEY)
    if _is_ours(module.__dict__.get("forward")):
        del module.__dict__["forward"]
    elif _is_ours(module.__dict__.get("_old_forward")):
        saved = getattr(norm, "hf_saved_forward", None)
        module.__dict__["_old_forward"] = saved if saved is not None else types.MethodType(type(module).forward, module)
    if _is_ours(module.__dict__.get("extra_repr"), _patched_extra_repr):
        del module.__dict__["extra_repr"]


def _triton_check(name: str, module: nn.Module, norm: Norm) -> None:
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


def _selectors(arg: str | Iterable[str] | None, what: str) -> list[str] | None:
    if arg is None:
        return None
    items = [arg] if isinstance(arg, str) else list(arg) if isinstance(arg, Iterable) else None
    if items is None or not all(isinstance(i, str) for i in items):
        raise TypeError(f"{what} must be None, a role/pattern string or a list of them, got {arg!r}")
    return items


def _matches(item: str, name: str, role: str) -> bool:
    return item == role or fnmatch.fnmatchcase(name, item)


@dataclass
class _Plan:
    name: str
    module: nn.Module
    role: str
    math: NormMath


def _patch(
    model: nn.Module,
    backend: str,
    include: str | Iterable[str] | None,
    exclude: str | Iterable[str] | None,
    *,
    warn: bool = True,
) -> tuple[PatchReport, list[nn.Module]]:
    """``patch_norms`` returning also the modules this call newly patched (``patched_norms`` undoes only those)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_choice("backend", backend, BACKENDS)
    inc, exc = _selectors(include, "include"), _selectors(exclude, "exclude")
    model_type, roles = role_map_for(model)

    entries: list[PatchEntry] = []
    plans: list[_Plan] = []
    used: set[str] = set()
    for name, module in model.named_modules():
        rec = recognise(module)
        if rec is None:
            continue
        cls, role = type(module).__name__, roles.role(name)
        if rec.math is None:
            entries.append(PatchEntry(name, cls, role, rec.status, reason=rec.reason))  # type: ignore[arg-type]
            continue
        hits_inc = [i for i in inc or () if _matches(i, name, role)]
        hits_exc = [e for e in exc or () if _matches(e, name, role)]
        used.update(hits_inc, hits_exc)
        selected = (inc is None or bool(hits_inc)) and not hits_exc
        try:
            math_str = rec.math.describe(rec.math.spec(module, backend))
        except (TypeError, ValueError) as err:  # e.g. a negative or NaN eps: torch accepts it, lnblocks does not
            if selected:
                raise _same_kind(err, f"cannot patch the norm {name or '<model>'} ({cls}): {err}") from None
            math_str = f"{rec.math.kind}(not supported: {err})"
        if is_patched(module) and not selected:  # selection decides what to patch now; it never unpatches
            reason = "patched earlier; not selected now, left as it was (unpatch_norms restores it)"
            entries.append(PatchEntry(name, cls, role, "patched", math_str, reason))
        elif inc is not None and not hits_inc:
            entries.append(PatchEntry(name, cls, role, "skipped", math_str, "not selected by include"))
        elif hits_exc:
            entries.append(PatchEntry(name, cls, role, "skipped", math_str, f"excluded by {hits_exc[0]!r}"))
        elif "forward" in module.__dict__ and not is_patched(module) and not _hooked_by_accelerate(module):
            reason = "its forward is already replaced on the instance (another patcher or hook)"
            entries.append(PatchEntry(name, cls, role, "skipped", math_str, reason))
        else:
            plans.append(_Plan(name, module, role, rec.math))
            entries.append(PatchEntry(name, cls, role, "patched", math_str))

    for item in [*(inc or ()), *(exc or ())]:
        if item not in used and item not in ROLES:
            raise ValueError(
                f"include/exclude item {item!r} is neither a role ({', '.join(ROLES)}) nor a pattern matching the "
                "name of a recognised norm module"
            )

    # build and check everything first, so a failure leaves the model untouched
    norms = [
        getattr(p.module, _NORM_KEY) if is_patched(p.module) else _lnblocks_norm(p.name, p.module, p.math, backend)
        for p in plans
    ]
    if backend == "triton":
        for p, norm in zip(plans, norms):
            _triton_check(p.name, p.module, norm)
    newly: list[nn.Module] = []
    for p, norm in zip(plans, norms):
        if is_patched(p.module):
            norm.spec = norm.spec.replace(backend=backend)  # patched before: no second wrapper
        else:
            _install(p.module, norm)
            newly.append(p.module)

    report = PatchReport(type(model).__name__, model_type, backend, tuple(entries))
    if not report.patched:
        message = f"lnblocks.hf.patch_norms: no norm of {type(model).__name__} was patched"
        message += f" ({len(report.unknown)} unknown norm-like modules, see the report)" if report.unknown else ""
        if warn:
            warnings.warn(message, UserWarning, stacklevel=3)
        else:
            log.info(message)
    return report, newly


def patch_norms(
    model: nn.Module,
    backend: str = "auto",
    include: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
) -> PatchReport:
    """Run the norms of ``model`` through lnblocks, in place and reversibly; returns what was done.

    Every recognised norm (``torch.nn.LayerNorm``/``RMSNorm`` and the HF RMSNorm classes, recognised by their code)
    keeps its class and Parameters and computes exactly its original math (cast order, ``1 + w``, eps attribute).
    ``backend``: "auto" (fused Triton kernels on CUDA where they support the spec), "torch" or "triton" (raises
    ``ValueError`` here if a kernel cannot run). ``include``/``exclude``: role names (``lnblocks.hf.ROLES``, e.g.
    ``"q_norm"``) or ``fnmatch`` patterns of module names (``"model.layers.0.*"``). Patching again is harmless: no
    second wrapper, the backend is updated, and the report is returned again.
    """
    return _patch(model, backend, include, exclude)[0]


def unpatch_norms(model: nn.Module) -> int:
    """Restore the original forward of every patched module in ``model``; returns how many were restored."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    restored = 0
    for module in model.modules():
        if is_patched(module):
            _uninstall(module)
            restored += 1
    return restored


@contextlib.contextmanager
def patched_norms(
    model: nn.Module,
    backend: str = "auto",
    include: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
) -> Iterator[PatchReport]:
    """``with patched_norms(model) as report:`` patches on entry and restores on exit the modules it patched
    (modules patched before entering stay patched)."""
    report, newly = _patch(model, backend, include, exclude)
    try:
        yield report
    finally:
        for module in newly:
            _uninstall(module)
