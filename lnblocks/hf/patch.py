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
- PEFT models patch like any other: the frozen original and each adapter's trainable copy inside a
  ``ModulesToSaveWrapper`` are patched, and roles are read from the name in the base model.
- ``fuse_residual=True`` also rewrites decoder layers so the residual add before a norm is part of the norm call
  (``lnblocks.hf.residual``). Patching an already patched model again with other options (backend, fuse_residual) is
  refused: ``unpatch_norms`` first.
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

from lnblocks.config import check_bool, check_choice
from lnblocks.hf import residual as R
from lnblocks.hf.families import ROLES, role_map_for
from lnblocks.hf.recognition import NormMath, recognise
from lnblocks.hf.report import LayerEntry, PatchEntry, PatchReport
from lnblocks.hf.wrappers import NORM_KEY, base_model_name, hooked_by_accelerate, is_patched, is_peft_model, role_name
from lnblocks.norms import Norm, build_norm
from lnblocks.norms.spec import BACKENDS

_NORM_KEY = NORM_KEY
log = logging.getLogger("lnblocks.hf")


def _same_kind(err: Exception, message: str) -> Exception:
    """A plain ``ValueError``/``TypeError`` (as ``err`` is) with ``message``: the error says which module failed."""
    return (ValueError if isinstance(err, ValueError) else TypeError)(message)


def _class_route(norm: Norm, x: Tensor, dtype: torch.dtype) -> bool:
    """True where the lnblocks norm as it is would round differently from the class (see ``NormMath``)."""
    math: NormMath = norm.hf_math
    if math.fp32_only and dtype == torch.float64:
        return True  # the class computes in fp32 even for fp64 inputs
    return math.torch_route != "lnblocks" and norm.backend_for(x) == "torch"


def _class_math(module: nn.Module, norm: Norm, x: Tensor) -> Tensor:
    if norm.hf_math.torch_route == "fp32_input" and x.dtype != torch.float64:
        return norm.forward(x.to(torch.float32)).to(x.dtype)  # OLMo: F.layer_norm of the fp32 input
    return type(module).forward(module, x)


def _patched_forward(module: nn.Module, hidden_states: Tensor, residual: Tensor | None = None) -> Tensor | tuple:
    """The forward of a patched module: the lnblocks norm, with eps read from the module's own attribute.

    With ``residual`` (a fused decoder layer's call): ``(norm(hidden_states + residual), hidden_states + residual)``.
    """
    norm = getattr(module, _NORM_KEY)
    math: NormMath = norm.hf_math
    if residual is None:
        if _class_route(norm, hidden_states, hidden_states.dtype):
            return _class_math(module, norm, hidden_states)
    elif _class_route(norm, hidden_states, torch.promote_types(hidden_states.dtype, residual.dtype)):
        total = hidden_states + residual
        return _class_math(module, norm, total), total
    eps = norm.spec.eps if math.eps_attr is None else getattr(module, math.eps_attr)
    if eps != norm.spec.eps:  # eps changed on the module after patching: follow it
        try:
            norm.spec = norm.spec.replace(eps=None if eps is None else float(eps))
        except (TypeError, ValueError) as err:
            raise _same_kind(
                err,
                f"{type(module).__name__}.{math.eps_attr} = {eps!r}, set after patching, is no eps lnblocks can run: "
                f"{err}",
            ) from None
    return norm.forward(hidden_states) if residual is None else norm.forward(hidden_states, residual)


def _patched_extra_repr(module: nn.Module) -> str:
    norm = getattr(module, _NORM_KEY)
    return f"{type(module).extra_repr(module)}, lnblocks(backend={norm.spec.backend!r})".lstrip(", ")


def _lnblocks_norm(name: str, module: nn.Module, math: NormMath, backend: str) -> Norm:
    # built on "meta" (no memory), then pointed at the module's own parameter dict: no copy, no new Parameter
    try:
        norm = build_norm(math.spec(module, backend), math.normalized_shape(module), device="meta")
    except (TypeError, ValueError) as err:
        raise _same_kind(err, f"cannot patch the norm {name or '<model>'} ({type(module).__name__}): {err}") from None
    if math.params or math.origin.startswith("torch.nn."):  # a class with no parameter at all keeps the norm's Nones
        object.__setattr__(norm, "_parameters", module._parameters)
    norm.hf_math = math
    return norm


def _is_ours(obj: object, func: object = _patched_forward) -> bool:
    return isinstance(obj, functools.partial) and obj.func is func


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


def _check_options(model: nn.Module, backend: str, fuse_residual: bool) -> None:
    """A model patched before must be asked for the same options again (nothing is changed otherwise)."""
    backends: dict[str, str] = {}  # backend -> the first module patched with it
    fused = None
    for name, module in model.named_modules():
        if is_patched(module):
            backends.setdefault(module.__dict__[_NORM_KEY].spec.backend, name or "<model>")
        if fused is None and R.is_fused(module):
            fused = name
    if not backends and fused is None:
        return
    what = base_model_name(model)
    hint = "unpatch_norms(model) first to patch it with other options; nothing was changed"
    for old, name in backends.items():
        if old != backend:
            raise ValueError(
                f"{what} is already patched with backend={old!r} (e.g. {name}); patching it again with "
                f"backend={backend!r} is refused: {hint}"
            )
    if (fused is not None) != fuse_residual:
        raise ValueError(
            f"{what} is already patched with fuse_residual={fused is not None} "
            f"(e.g. {fused or next(iter(backends.values()))}); patching it "
            f"again with fuse_residual={fuse_residual} is refused: {hint}"
        )


def _plan_fusion(model: nn.Module, recognised: set[int], patched: set[int]) -> list[R.LayerPlan]:
    """The decoder layers to fuse, or a ``ValueError`` naming the classes that cannot be (before anything changes)."""
    layers = R.plan_layers(model, recognised, patched)
    what = base_model_name(model)
    if not layers:
        raise ValueError(
            f"fuse_residual=True: {what} has no decoder layer lnblocks can fuse (no item of an nn.ModuleList has a "
            "recognised norm as a direct child); patch it without fuse_residual. Nothing was changed."
        )
    refused: dict[str, tuple[int, str, str]] = {}
    for plan in layers:
        if not plan.norms:
            count, example, reason = refused.get(type(plan.layer).__name__, (0, plan.name, plan.reason))
            refused[type(plan.layer).__name__] = (count + 1, example, reason)
    if refused:
        lines = [f"{cls} ({n} layer{'s' if n > 1 else ''}, e.g. {ex}): {why}" for cls, (n, ex, why) in refused.items()]
        raise ValueError(
            f"fuse_residual=True: the residual add of {what} cannot be fused into its norms in "
            + "; ".join(lines)
            + ". Patch it without fuse_residual. Nothing was changed."
        )
    for plan in layers:
        if not R.is_fused(plan.layer):
            R.fused_class(type(plan.layer), plan.norms)  # compiled now, so installing cannot fail half-way
    return layers


def _patch(
    model: nn.Module,
    backend: str,
    include: str | Iterable[str] | None,
    exclude: str | Iterable[str] | None,
    *,
    fuse_residual: bool = False,
    on_empty: str = "warn",
) -> tuple[PatchReport, list[nn.Module]]:
    """``patch_norms`` returning also the modules this call newly patched or fused (``patched_norms`` undoes only
    those). ``on_empty``: what a model with no norm to patch gets: "warn", "log" or "raise" (a PEFT model: "raise")."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_choice("backend", backend, BACKENDS)
    check_bool("fuse_residual", fuse_residual)
    inc, exc = _selectors(include, "include"), _selectors(exclude, "exclude")
    _check_options(model, backend, fuse_residual)
    model_type, roles = role_map_for(model)

    entries: list[PatchEntry] = []
    plans: list[_Plan] = []
    used: set[str] = set()
    recognised: set[int] = set()
    for name, module in model.named_modules():
        rec = recognise(module)
        if rec is None:
            continue
        cls, role = type(module).__name__, roles.role(role_name(name))
        if rec.math is None:
            entries.append(PatchEntry(name, cls, role, rec.status, reason=rec.reason))  # type: ignore[arg-type]
            continue
        recognised.add(id(module))
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
        elif "forward" in module.__dict__ and not is_patched(module) and not hooked_by_accelerate(module):
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
    patched_count = sum(e.status == "patched" for e in entries)
    if not patched_count and (on_empty == "raise" or is_peft_model(model)):
        unknown = sorted({e.cls for e in entries if e.status == "unknown"})
        raise ValueError(
            f"lnblocks.hf: {base_model_name(model)} has no norm lnblocks can patch"
            + (f" (norm-like classes of unknown math: {', '.join(unknown)})" if unknown else "")
            + (" (all recognised norms were left out by include/exclude)" if recognised else "")
            + ". Nothing was changed."
        )

    # build and check everything first, so a failure leaves the model untouched
    norms = [
        getattr(p.module, _NORM_KEY) if is_patched(p.module) else _lnblocks_norm(p.name, p.module, p.math, backend)
        for p in plans
    ]
    if backend == "triton":
        for p, norm in zip(plans, norms):
            _triton_check(p.name, p.module, norm)
    layers: list[R.LayerPlan] = []
    if fuse_residual:
        patched_ids = {id(p.module) for p in plans} | {id(m) for m in model.modules() if is_patched(m)}
        layers = _plan_fusion(model, recognised, patched_ids)

    newly: list[nn.Module] = []
    for p, norm in zip(plans, norms):
        if not is_patched(p.module):
            _install(p.module, norm)
            newly.append(p.module)
    for plan in layers:
        if not R.is_fused(plan.layer):
            R.fuse(plan.layer, plan.norms)
            newly.append(plan.layer)

    layer_entries = tuple(LayerEntry(lp.name, type(lp.layer).__name__, lp.norms) for lp in layers)
    report = PatchReport(type(model).__name__, model_type, backend, tuple(entries), layer_entries)
    if not report.patched:
        message = f"lnblocks.hf.patch_norms: no norm of {type(model).__name__} was patched"
        message += f" ({len(report.unknown)} unknown norm-like modules, see the report)" if report.unknown else ""
        if on_empty == "warn":
            warnings.warn(message, UserWarning, stacklevel=3)
        else:
            log.info(message)
    return report, newly


def _undo(modules: Iterable[nn.Module]) -> None:
    for module in modules:
        if R.is_fused(module):
            R.unfuse(module)
        elif is_patched(module):
            _uninstall(module)


def patch_norms(
    model: nn.Module,
    backend: str = "auto",
    include: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
    *,
    fuse_residual: bool = False,
) -> PatchReport:
    """Run the norms of ``model`` through lnblocks, in place and reversibly; returns what was done.

    Every recognised norm (``torch.nn.LayerNorm``/``RMSNorm`` and the HF norm classes, recognised by their code)
    keeps its class and Parameters and computes exactly its original math (cast order, ``1 + w``, eps attribute).
    ``backend``: "auto" (fused Triton kernels on CUDA where they support the spec), "torch" or "triton" (raises
    ``ValueError`` here if a kernel cannot run). ``include``/``exclude``: role names (``lnblocks.hf.ROLES``, e.g.
    ``"q_norm"``) or ``fnmatch`` patterns of module names (``"model.layers.0.*"``). ``fuse_residual=True``: the
    residual add before each norm inside a decoder layer becomes part of the norm call (one kernel on GPU;
    ``lnblocks.hf.residual``); a layer whose code lnblocks cannot verify is refused with a ``ValueError``.

    Works on PEFT models (``PeftModel``: LoRA layers are left alone, norms in ``ModulesToSaveWrapper`` patched) and on
    accelerate-dispatched ones (``device_map``: the device hooks are kept). Patching again with the same options is
    harmless (no second wrapper; selection only adds modules) and returns the report again; with another backend or
    ``fuse_residual`` it is refused (``unpatch_norms`` first). Every error leaves the model exactly as it was.
    """
    return _patch(model, backend, include, exclude, fuse_residual=fuse_residual)[0]


def unpatch_norms(model: nn.Module) -> int:
    """Restore the original forward of every patched module (and class of every fused layer) in ``model``; returns
    how many norms were restored."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    modules = list(model.modules())
    _undo(m for m in modules if R.is_fused(m))
    restored = [m for m in modules if is_patched(m)]
    _undo(restored)
    return len(restored)


@contextlib.contextmanager
def patched_norms(
    model: nn.Module,
    backend: str = "auto",
    include: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
    *,
    fuse_residual: bool = False,
) -> Iterator[PatchReport]:
    """``with patched_norms(model) as report:`` patches on entry and restores on exit the modules it patched
    (modules patched before entering stay patched)."""
    report, newly = _patch(model, backend, include, exclude, fuse_residual=fuse_residual)
    try:
        yield report
    finally:
        _undo(newly)
