"""``PatchReport``: what ``patch_norms`` replaced (by role), what it recognised but left alone and why, and which
norm-like modules it did not recognise."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["patched", "skipped", "unknown"]


@dataclass(frozen=True)
class PatchEntry:
    """One norm-like module of the model.

    ``status``: "patched" (its forward now runs lnblocks), "skipped" (recognised, left alone: see ``reason``) or
    "unknown" (looks like a norm, but its math matches nothing lnblocks reproduces exactly).
    ``math``: the lnblocks spec it runs, e.g. ``rmsnorm(cast=llama, eps=1e-06)``; empty when unknown.
    """

    name: str
    cls: str
    role: str
    status: Status
    math: str = ""
    reason: str = ""


@dataclass(frozen=True)
class LayerEntry:
    """A decoder layer rewritten by ``fuse_residual=True``: the residual add before each of ``norms`` (attribute
    names) is now part of that norm's call."""

    name: str
    cls: str
    norms: tuple[str, ...]


@dataclass(frozen=True)
class LossEntry:
    """The causal LM asked for ``chunked_loss=True``: ``name`` (in the patched model) and class, ``head`` (its LM
    head's attribute), ``logit_map`` (what its forward applies to the logits, e.g. "none",
    "softcap(config.final_logit_softcapping)", "mul(logit_scale)"), ``tied`` (the head's weight is the input
    embedding's); ``status`` "patched" (its labelled loss runs through the chunked head) or "skipped" (``reason``
    says why)."""

    name: str
    cls: str
    head: str
    status: Status
    logit_map: str = ""
    tied: bool = False
    reason: str = ""


@dataclass(frozen=True)
class PatchReport:
    """The result of ``patch_norms``; ``str(report)`` is a table grouped by role, with layer indices folded."""

    model: str
    model_type: str | None
    backend: str
    entries: tuple[PatchEntry, ...] = field(default_factory=tuple)
    layers: tuple[LayerEntry, ...] = field(default_factory=tuple)
    loss: LossEntry | None = None  # with chunked_loss=True

    @property
    def patched(self) -> list[PatchEntry]:
        return [e for e in self.entries if e.status == "patched"]

    @property
    def skipped(self) -> list[PatchEntry]:
        return [e for e in self.entries if e.status == "skipped"]

    @property
    def unknown(self) -> list[PatchEntry]:
        return [e for e in self.entries if e.status == "unknown"]

    def by_role(self) -> dict[str, list[str]]:
        """Names of the patched modules, by role."""
        roles: dict[str, list[str]] = {}
        for e in self.patched:
            roles.setdefault(e.role, []).append(e.name)
        return roles

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "model_type": self.model_type,
            "backend": self.backend,
            "entries": [asdict(e) for e in self.entries],
            "layers": [asdict(e) for e in self.layers],
            "loss": None if self.loss is None else asdict(self.loss),
        }

    def __str__(self) -> str:
        family = f" (model_type {self.model_type})" if self.model_type else ""
        lines = [
            f"lnblocks.hf: {self.model}{family}, backend={self.backend}: "
            f"{len(self.patched)} patched, {len(self.skipped)} left alone, {len(self.unknown)} unknown"
        ]
        for status, title in (("patched", "patched"), ("skipped", "left alone"), ("unknown", "unknown norm-like")):
            groups = Counter(
                (e.role, _fold(e.name), e.cls, "; ".join(filter(None, (e.math, e.reason))))
                for e in self.entries
                if e.status == status
            )
            if not groups:
                continue
            lines.append(f"  {title}:")
            for (role, name, cls, what), count in groups.items():
                times = f" x{count}" if count > 1 else ""
                lines.append(f"    {role:<14} {name}{times}  [{cls}]  {what}")
        if self.layers:
            lines.append("  residual add fused into the norm call (fuse_residual=True):")
            groups = Counter((re.sub(r"\.\d+$", ".*", _fold(e.name)), e.cls, ", ".join(e.norms)) for e in self.layers)
            for (name, cls, norms), count in groups.items():
                times = f" x{count}" if count > 1 else ""
                lines.append(f"    {name}{times}  [{cls}]  before {norms}")
        if self.loss is not None:
            e = self.loss
            where = f"{e.name or '<model>'}.{e.head}" if e.head else e.name or "<model>"
            what = f"logit map {e.logit_map}" + (", tied to the input embedding" if e.tied else "")
            state = what if e.status == "patched" else f"left alone: {e.reason}"
            lines.append(f"  loss through the chunked LM head (chunked_loss=True): {where}  [{e.cls}]  {state}")
        return "\n".join(lines)


def _fold(name: str) -> str:
    """``model.layers.3.input_layernorm`` -> ``model.layers.*.input_layernorm``: one line for all layers."""
    return re.sub(r"(?<=\.)\d+(?=\.)", "*", name) or "<model>"
