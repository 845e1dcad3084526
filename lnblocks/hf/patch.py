"""``patch_norms`` / ``unpatch_norms`` / ``patched_norms``: run the norms of a built model through lnblocks.

A call is two steps, so that every check runs before anything changes:

1. **select** (``plan_patch``): the options are checked against what an earlier patch did; each module is
   recognised (``lnblocks.hf.recognition``: the math of its class) and given a role (``lnblocks.hf.families``);
   include/exclude choose among the recognised ones; an lnblocks norm is built for each chosen module
   (``lnblocks.hf.install``); with ``fuse_residual=True`` the decoder layers to fuse are planned and their classes
   compiled (``lnblocks.hf.residual``). An error here leaves the model exactly as it was.
   With ``chunked_loss=True`` the causal LM and its head are found and checked (``lnblocks.hf.chunked_loss``).
2. **apply** (``PatchPlan.apply``): each chosen module gets its patched forward, each planned layer its fused class,
   the causal LM (with ``chunked_loss``) its chunked loss.

How one module is patched (per instance, reversibly; Liger-Kernel binds forwards the same way) is described in
``lnblocks.hf.install``, how a layer is fused in ``lnblocks.hf.residual``. A module whose forward another tool
already replaced is left alone and reported, except under accelerate's device hooks (``device_map``), which stay.
PEFT models patch like any other: the frozen original and each adapter's trainable copy inside a
``ModulesToSaveWrapper`` are patched, and roles are read from the name in the base model. Patching an already patched
model again with other options (backend, fuse_residual) is refused: ``unpatch_norms`` first.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from torch import nn

from lnblocks.config import check_bool, check_choice
from lnblocks.hf.chunked_loss import install_loss, is_head, uninstall_head, uninstall_loss
from lnblocks.hf.families import ROLES, RoleMap, role_map_for
from lnblocks.hf.head_source import HeadForm
from lnblocks.hf.install import build_norm_for, check_triton, install, same_kind, uninstall
from lnblocks.hf.loss_plan import LossPlan, plan_loss
from lnblocks.hf.recognition import NormMath, recognise
from lnblocks.hf.record import fusion_of, is_fused, is_patched, loss_record_of, record_of
from lnblocks.hf.report import LayerEntry, LossEntry, PatchEntry, PatchReport, Status
from lnblocks.hf.residual import LayerPlan, fuse, plan_fusion, unfuse
from lnblocks.hf.wrappers import base_model_name, hooked_by_accelerate, is_peft_model, role_name
from lnblocks.norms import Norm
from lnblocks.norms.spec import BACKENDS

log = logging.getLogger("lnblocks.hf")
Selectors = str | Iterable[str] | None


def _selectors(arg: Selectors, what: str) -> tuple[str, ...] | None:
    if arg is None:
        return None
    items = (arg,) if isinstance(arg, str) else tuple(arg) if isinstance(arg, Iterable) else None
    if items is None or not all(isinstance(i, str) for i in items):
        raise TypeError(f"{what} must be None, a role/pattern string or a list of them, got {arg!r}")
    return items


@dataclass(frozen=True)
class PatchOptions:
    """What a patch is asked for (``patch_norms``'s arguments, checked here); ``include``/``exclude`` are kept as
    tuples.

    ``on_empty``: what a model with no norm to patch gets: "warn" (``patch_norms``), "log" (``patch_transformers``,
    which meets every model built) or "raise" (``from_pretrained``, ``PatchNormsCallback``; a PEFT model always).
    ``on_unfusable``: with ``fuse_residual``, what a layer that cannot be fused gets: "raise" (``ValueError``, nothing
    changed) or "log" (``patch_transformers``: left unfused, its norms patched).
    ``chunked_loss``: the labelled loss of the causal LM through the chunked LM head (``lnblocks.hf.chunked_loss``);
    ``on_unchunkable``: what a model whose loss cannot go that way gets: "raise" or "log" (``patch_transformers``:
    its norms patched, its loss as it was).
    ``memory_efficient``: the patched LayerNorm / RMSNorm / L2 norms save their output for the backward instead of
    their input (``docs/norms.md``); it needs the fused kernels (backend "auto" or "triton").
    """

    backend: str = "auto"
    include: Selectors = None
    exclude: Selectors = None
    fuse_residual: bool = False
    on_empty: Literal["warn", "log", "raise"] = "warn"
    on_unfusable: Literal["raise", "log"] = "raise"
    chunked_loss: bool = False
    on_unchunkable: Literal["raise", "log"] = "raise"
    memory_efficient: bool = False

    def __post_init__(self) -> None:
        check_choice("backend", self.backend, BACKENDS)
        check_bool("fuse_residual", self.fuse_residual)
        object.__setattr__(self, "include", _selectors(self.include, "include"))
        object.__setattr__(self, "exclude", _selectors(self.exclude, "exclude"))
        check_choice("on_empty", self.on_empty, ("warn", "log", "raise"))
        check_choice("on_unfusable", self.on_unfusable, ("raise", "log"))
        check_bool("chunked_loss", self.chunked_loss)
        check_choice("on_unchunkable", self.on_unchunkable, ("raise", "log"))
        check_bool("memory_efficient", self.memory_efficient)
        if self.memory_efficient and self.backend == "torch":
            raise ValueError(
                "memory_efficient=True needs the fused kernels (backend 'auto' or 'triton'): it is their backward that "
                "saves the output instead of the input; backend='torch' saves what its autograd ops save"
            )


@dataclass
class PatchPlan:
    """What ``plan_patch`` selected and built for one model; ``apply()`` patches it."""

    model: nn.Module
    options: PatchOptions
    report: PatchReport
    norms: list[tuple[nn.Module, Norm, NormMath]] = field(default_factory=list)  # (module, its norm, its math)
    layers: list[LayerPlan] = field(default_factory=list)
    loss: LossPlan | None = None  # with chunked_loss=True and a model it can patch

    def apply(self) -> list[nn.Module]:
        """Patch the chosen modules and fuse the planned layers; returns the modules this call changed (what
        ``patched_norms`` undoes on exit)."""
        changed: list[nn.Module] = []
        for module, norm, math in self.norms:
            if not is_patched(module):
                install(module, norm, math)
                changed.append(module)
        for plan in self.layers:
            if not is_fused(plan.layer):
                fuse(plan.layer, plan.norms)
                changed.append(plan.layer)
        lm = self.loss.module if self.loss is not None else None
        if lm is not None and loss_record_of(lm) is None:
            install_loss(lm, self.loss.head, self.loss.logit_map)
            changed.append(lm)
        if not self.report.patched:
            message = f"lnblocks.hf.patch_norms: no norm of {type(self.model).__name__} was patched"
            unknown = self.report.unknown
            message += f" ({len(unknown)} unknown norm-like modules, see the report)" if unknown else ""
            if self.options.on_empty == "warn":
                warnings.warn(message, UserWarning, stacklevel=3)
            else:
                log.info(message)
        return changed


def plan_patch(model: nn.Module, options: PatchOptions) -> PatchPlan:
    """Select what ``options`` patch in ``model`` and build all it needs, changing nothing; ``.apply()`` patches.

    Raises ``ValueError``/``TypeError`` as ``patch_norms`` documents, always before anything changes."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(options, PatchOptions):
        raise TypeError(f"options must be a PatchOptions, got {type(options).__name__}")
    _check_same_options(model, options)
    loss_plan, loss_entry = _plan_loss(model, options) if options.chunked_loss else (None, None)
    model_type, roles = role_map_for(model)
    selection = _select(model, roles, options)
    _check_selection(model, options, selection)
    norms = []
    for name, module, math in selection.chosen:
        record = record_of(module)
        norm = (
            record.norm
            if record is not None
            else build_norm_for(name, module, math, options.backend, options.memory_efficient)
        )
        if options.backend == "triton":
            check_triton(name, module, norm)
        norms.append((module, norm, math))
    layers: list[LayerPlan] = []
    if options.fuse_residual:
        patched = {id(m) for m, _, math in norms if math.kind != "gated_rmsnorm"}
        patched |= {id(m) for m in model.modules() if is_patched(m) and record_of(m).math.kind != "gated_rmsnorm"}
        layers = plan_fusion(model, selection.recognised, patched, strict=options.on_unfusable == "raise")
    layer_entries = tuple(LayerEntry(lp.name, type(lp.layer).__name__, lp.norms) for lp in layers)
    entries = tuple(selection.entries)
    report = PatchReport(type(model).__name__, model_type, options.backend, entries, layer_entries, loss_entry)
    return PatchPlan(model, options, report, norms, layers, loss_plan)


def _plan_loss(model: nn.Module, options: PatchOptions) -> tuple[LossPlan | None, LossEntry]:
    """The chunked-loss plan and its report entry; a model it cannot patch raises (or, leniently, is logged)."""
    plan = plan_loss(model)
    lm = plan.module
    cls = type(lm).__name__ if lm is not None else type(model).__name__
    status: Status = "skipped" if plan.reason else "patched"
    logit_map = HeadForm(plan.logit_map).describe() if plan.head and not plan.reason else ""
    entry = LossEntry(plan.name, cls, plan.head, status, logit_map, plan.tied, plan.reason)
    if not plan.reason:
        return plan, entry
    message = f"chunked_loss=True: {base_model_name(model)}: {plan.reason}"
    if options.on_unchunkable == "raise":
        raise ValueError(message + ". Nothing was changed.")
    log.info("%s; its loss is left as it was", message)
    return None, entry


def _check_same_options(model: nn.Module, options: PatchOptions) -> None:
    """A model patched before must be asked for the same options again (nothing is changed otherwise)."""
    backends: dict[str, str] = {}  # backend -> the first module patched with it
    fused = chunked = None
    saves: dict[bool, str] = {}  # memory_efficient -> the first module patched with it (kinds that have it)
    for name, module in model.named_modules():
        record = record_of(module)
        if record is not None:
            backends.setdefault(record.norm.spec.backend, name or "<model>")
            if "memory_efficient" in record.norm.spec.field_names():
                saves.setdefault(record.norm.spec.memory_efficient, name or "<model>")
        if fused is None and fusion_of(module) is not None:
            fused = name
        if chunked is None and loss_record_of(module) is not None:
            chunked = name or "<model>"
    if not backends and fused is None and chunked is None:
        return
    what = base_model_name(model)
    hint = "unpatch_norms(model) first to patch it with other options; nothing was changed"
    for old, name in backends.items():
        if old != options.backend:
            raise ValueError(
                f"{what} is already patched with backend={old!r} (e.g. {name}); patching it again with "
                f"backend={options.backend!r} is refused: {hint}"
            )
    for old, name in saves.items():
        if old != options.memory_efficient:
            raise ValueError(
                f"{what} is already patched with memory_efficient={old} (e.g. {name}); patching it again with "
                f"memory_efficient={options.memory_efficient} is refused: {hint}"
            )
    lenient = options.on_unfusable == "log" and options.fuse_residual  # fusing where it can: none may be fused
    if (fused is not None) != options.fuse_residual and not lenient:
        raise ValueError(
            f"{what} is already patched with fuse_residual={fused is not None} "
            f"(e.g. {fused or next(iter(backends.values()), chunked)}); patching it "
            f"again with fuse_residual={options.fuse_residual} is refused: {hint}"
        )
    lenient = options.on_unchunkable == "log" and options.chunked_loss  # where it can: it may have been refused
    if (chunked is not None) != options.chunked_loss and not lenient:
        example = chunked or fused or next(iter(backends.values()))
        raise ValueError(
            f"{what} is already patched with chunked_loss={chunked is not None} (e.g. {example}); patching it "
            f"again with chunked_loss={options.chunked_loss} is refused: {hint}"
        )


@dataclass
class _Selection:
    entries: list[PatchEntry] = field(default_factory=list)  # every recognised or norm-like module, in order
    chosen: list[tuple[str, nn.Module, NormMath]] = field(default_factory=list)  # the modules to patch now
    recognised: set[int] = field(default_factory=set)  # ids of the modules whose math lnblocks reproduces
    used: set[str] = field(default_factory=set)  # include/exclude items that matched a recognised module


def _matches(item: str, name: str, role: str) -> bool:
    return item == role or fnmatch.fnmatchcase(name, item)


def _select(model: nn.Module, roles: RoleMap, options: PatchOptions) -> _Selection:
    """Recognise every module, give it a role, and choose by include/exclude (a report entry each)."""
    sel = _Selection()
    for name, module in model.named_modules():
        rec = recognise(module)
        if rec is None:
            continue
        cls, role = type(module).__name__, roles.role(role_name(name))
        if rec.math is None:
            sel.entries.append(PatchEntry(name, cls, role, rec.status, reason=rec.reason))  # type: ignore[arg-type]
            continue
        sel.recognised.add(id(module))
        hits_inc = [i for i in options.include or () if _matches(i, name, role)]
        hits_exc = [e for e in options.exclude or () if _matches(e, name, role)]
        sel.used.update(hits_inc, hits_exc)
        selected = (options.include is None or bool(hits_inc)) and not hits_exc
        try:
            math_str = rec.math.describe(rec.math.spec(module, options.backend))
        except (TypeError, ValueError) as err:  # e.g. a negative or NaN eps: torch accepts it, lnblocks does not
            if selected:
                raise same_kind(err, f"cannot patch the norm {name or '<model>'} ({cls}): {err}") from None
            math_str = f"{rec.math.kind}(not supported: {err})"
        status, reason = _status(module, selected, options.include is not None and not hits_inc, hits_exc)
        sel.entries.append(PatchEntry(name, cls, role, status, math_str, reason))
        if status == "patched" and selected:
            sel.chosen.append((name, module, rec.math))
    return sel


def _status(module: nn.Module, selected: bool, not_included: bool, hits_exc: list[str]) -> tuple[Status, str]:
    """A recognised module's report status and reason (``selected``: by include/exclude)."""
    if is_patched(module) and not selected:  # selection decides what to patch now; it never unpatches
        return "patched", "patched earlier; not selected now, left as it was (unpatch_norms restores it)"
    if not_included:
        return "skipped", "not selected by include"
    if hits_exc:
        return "skipped", f"excluded by {hits_exc[0]!r}"
    if "forward" in module.__dict__ and not is_patched(module) and not hooked_by_accelerate(module):
        return "skipped", "its forward is already replaced on the instance (another patcher or hook)"
    return "patched", ""


def _check_selection(model: nn.Module, options: PatchOptions, sel: _Selection) -> None:
    """Every include/exclude item names something; a model that must patch something (PEFT, "raise") does."""
    for item in [*(options.include or ()), *(options.exclude or ())]:
        if item not in sel.used and item not in ROLES:
            raise ValueError(
                f"include/exclude item {item!r} is neither a role ({', '.join(ROLES)}) nor a pattern matching the "
                "name of a recognised norm module"
            )
    if any(e.status == "patched" for e in sel.entries) or not (options.on_empty == "raise" or is_peft_model(model)):
        return
    unknown = sorted({e.cls for e in sel.entries if e.status == "unknown"})
    raise ValueError(
        f"lnblocks.hf: {base_model_name(model)} has no norm lnblocks can patch"
        + (f" (norm-like classes of unknown math: {', '.join(unknown)})" if unknown else "")
        + (" (all recognised norms were left out by include/exclude)" if sel.recognised else "")
        + ". Nothing was changed."
    )


def _undo(modules: Iterable[nn.Module]) -> None:
    for module in modules:
        if loss_record_of(module) is not None:
            uninstall_loss(module)
        if is_fused(module):
            unfuse(module)
        elif is_patched(module):
            uninstall(module)


def patch_norms(
    model: nn.Module,
    backend: str = "auto",
    include: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
    *,
    fuse_residual: bool = False,
    chunked_loss: bool = False,
    memory_efficient: bool = False,
) -> PatchReport:
    """Run the norms of ``model`` through lnblocks, in place and reversibly; returns what was done.

    Every recognised norm (``torch.nn.LayerNorm``/``RMSNorm`` and the HF norm classes, recognised by their code)
    keeps its class and Parameters and computes exactly its original math (cast order, ``1 + w``, eps attribute).
    ``backend``: "auto" (fused Triton kernels on CUDA where they support the spec), "torch" or "triton" (raises
    ``ValueError`` here if a kernel cannot run). ``include``/``exclude``: role names (``lnblocks.hf.ROLES``, e.g.
    ``"q_norm"``) or ``fnmatch`` patterns of module names (``"model.layers.0.*"``). ``fuse_residual=True``: the
    residual add before each norm inside a decoder layer becomes part of the norm call (one kernel on GPU;
    ``lnblocks.hf.residual``); a layer whose code lnblocks cannot verify is refused with a ``ValueError``.
    ``chunked_loss=True``: a causal LM called with ``labels`` computes its loss through lnblocks' chunked LM head,
    never holding the ``(B, T, V)`` logits, and returns the last position's logits only (``lnblocks.hf.chunked_loss``);
    a model whose head or loss it does not reproduce is refused with a ``ValueError`` naming why.
    ``memory_efficient=True``: the fused backward of the patched LayerNorm/RMSNorm/L2 norms saves their output instead
    of their input (the next layer keeps the output anyway; ``docs/norms.md``); needs backend "auto" or "triton".

    Works on PEFT models (``PeftModel``: LoRA layers are left alone, norms in ``ModulesToSaveWrapper`` patched) and on
    accelerate-dispatched ones (``device_map``: the device hooks are kept). Patching again with the same options is
    harmless (no second wrapper; selection only adds modules) and returns the report again; with another backend or
    ``fuse_residual`` it is refused (``unpatch_norms`` first). Every error leaves the model exactly as it was.
    """
    options = PatchOptions(
        backend, include, exclude, fuse_residual, chunked_loss=chunked_loss, memory_efficient=memory_efficient
    )
    plan = plan_patch(model, options)
    plan.apply()
    return plan.report


def unpatch_norms(model: nn.Module) -> int:
    """Restore the original forward of every patched module (and class of every fused layer, and the forward, loss
    function and head of a causal LM with ``chunked_loss``) in ``model``; returns how many norms were restored."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    modules = list(model.modules())
    _undo(m for m in modules if loss_record_of(m) is not None)
    for module in modules:  # a head copy PEFT made after patching, or one left by a copied model
        if is_head(module):
            uninstall_head(module)
    _undo(m for m in modules if is_fused(m))
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
    chunked_loss: bool = False,
    memory_efficient: bool = False,
) -> Iterator[PatchReport]:
    """``with patched_norms(model) as report:`` patches on entry and restores on exit the modules it patched
    (modules patched before entering stay patched)."""
    options = PatchOptions(
        backend, include, exclude, fuse_residual, chunked_loss=chunked_loss, memory_efficient=memory_efficient
    )
    plan = plan_patch(model, options)
    changed = plan.apply()
    try:
        yield plan.report
    finally:
        _undo(changed)
