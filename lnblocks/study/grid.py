"""``StudyConfig``: a YAML study file (with ``extends:`` base configs) validated and expanded into ``RunConfig``s.

A study file has the run sections (``data``, ``model``, ``train``, ``diagnostics``: the base run), an ``analysis``
section, and a ``grid``. Each grid axis is either a dotted key with a list of values::

    grid:
      model.placement: [pre, post]
      train.lr: [1.0e-3, 3.0e-3]

or a named axis whose values are labelled bundles of overrides (for settings that only make sense together)::

    grid:
      variant:
        deepnorm: {model.placement: deepnorm, model.init: deepnet}
        dyt: {model.norm: dyt}

The grid is the product of the axes in file order. ``extends: base.yaml`` (or a list) deep-merges the base files
first (paths relative to the including file); a key set to ``null`` in the child removes it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from lnblocks._optional import require
from lnblocks.study.config import SECTIONS, OptimizerConfig, RunConfig, _Section

TOP_LEVEL_KEYS = ("extends", "name", "description", *SECTIONS, "analysis", "grid")
FINAL_LOSSES = ("eval", "train")


@dataclass(frozen=True)
class AnalysisConfig(_Section):
    """How runs are classified in the report.

    A run is *diverged* when it stopped early (non-finite or exploding loss); *stuck* when its final loss stays
    within ``stuck_margin`` nats of the context-free plateau (the unigram loss of the eval split: a model that has
    learnt byte frequencies and nothing else; reference/stability.md §10); *trained* otherwise. ``final_loss``: the
    held-out ``"eval"`` loss or the ``"train"`` loss averaged over the last ``train.final_window`` steps.
    ``stable_tol``: the max stable LR is the largest LR whose loss is within this of the best loss at that depth.
    """

    prefix: ClassVar[str] = "analysis"
    floats: ClassVar[tuple[str, ...]] = ("stuck_margin", "stable_tol")

    stuck_margin: float = 0.3
    stable_tol: float = 0.1
    final_loss: str = "eval"

    def __post_init__(self) -> None:
        self._coerce_floats()
        self._float("stuck_margin")
        self._float("stable_tol")
        self._choice("final_loss", FINAL_LOSSES)


@dataclass(frozen=True)
class GridAxis:
    """One axis: ``name`` and its values as ``(label, ((dotted_key, value), ...))``."""

    name: str
    values: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]


def _label(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return str(value.get("kind", "x"))
    return str(value)


def check_key(key: str, where: str) -> tuple[str, ...]:
    """Split a dotted config key and check that it names a field; ``ValueError`` naming it otherwise."""
    parts = tuple(key.split("."))
    if parts[0] not in SECTIONS:
        raise ValueError(f"{where}: {key!r} is not a config key; it must start with one of {list(SECTIONS)}")
    cls = SECTIONS[parts[0]]
    names = [f.name for f in dataclasses.fields(cls)]
    if len(parts) < 2 or parts[1] not in names:
        raise ValueError(f"{where}: {key!r} is not a config key; valid keys in {parts[0]!r}: {names}")
    if parts[:2] == ("train", "optimizer") and len(parts) == 3:
        sub = [f.name for f in dataclasses.fields(OptimizerConfig)]
        if parts[2] not in sub:
            raise ValueError(f"{where}: {key!r} is not a config key; valid keys in 'train.optimizer': {sub}")
        return parts
    if len(parts) != 2:
        raise ValueError(f"{where}: {key!r} is not a config key (too many dots)")
    return parts


def _set(tree: dict[str, Any], parts: tuple[str, ...], value: Any) -> None:
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def _parse_axis(name: Any, spec: Any) -> GridAxis:
    if not isinstance(name, str):
        raise ValueError(f"grid axis names must be strings, got {name!r}")
    if "." in name:
        check_key(name, "grid")
        if not isinstance(spec, list) or not spec:
            raise ValueError(f"grid.{name} must be a non-empty list of values, got {spec!r}")
        return GridAxis(name, tuple((_label(v), ((name, v),)) for v in spec))
    if not isinstance(spec, dict) or not spec:
        raise ValueError(
            f"grid.{name}: a named axis maps labels to overrides, e.g. {{deepnorm: {{model.placement: deepnorm}}}}; "
            f"got {spec!r} (a dotted key such as 'model.depth' takes a list of values)"
        )
    values = []
    for label, overrides in spec.items():
        if not isinstance(overrides, dict):
            raise ValueError(f"grid.{name}.{label} must be a mapping of dotted keys to values, got {overrides!r}")
        for key in overrides:
            check_key(str(key), f"grid.{name}.{label}")
        values.append((str(label), tuple(overrides.items())))
    return GridAxis(name, tuple(values))


@dataclass(frozen=True)
class StudyConfig:
    """A validated study: ``base`` run, ``axes`` of the grid, ``analysis`` settings. ``runs()`` expands the grid."""

    name: str
    base: RunConfig
    axes: tuple[GridAxis, ...] = ()
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    description: str = ""
    source: str = ""

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "") -> StudyConfig:
        unknown = sorted(set(raw) - set(TOP_LEVEL_KEYS))
        if unknown:
            raise ValueError(
                f"{source or 'study config'}: unknown top-level key(s) {unknown}; valid: {list(TOP_LEVEL_KEYS)}"
            )
        base = RunConfig.from_dict({k: raw.get(k) for k in SECTIONS})
        grid = raw.get("grid") or {}
        if not isinstance(grid, dict):
            raise ValueError(f"grid must be a mapping of axes, got {grid!r}")
        axes = tuple(_parse_axis(k, v) for k, v in grid.items())
        name = raw.get("name") or (Path(source).stem if source else "study")
        study = cls(
            name=str(name),
            base=base,
            axes=axes,
            analysis=AnalysisConfig.from_dict(raw.get("analysis")),
            description=str(raw.get("description") or ""),
            source=source,
        )
        study.runs()  # every grid point must validate now, not halfway through a sweep
        return study

    def runs(self) -> list[RunConfig]:
        """One ``RunConfig`` per grid point (product of the axes in file order); duplicates raise ``ValueError``."""
        base = self.base.to_dict()
        out: list[RunConfig] = []
        seen: dict[str, tuple[tuple[str, str], ...]] = {}
        for point in itertools.product(*(axis.values for axis in self.axes)):
            tree = {k: dict(v) for k, v in base.items()}
            tree["train"]["optimizer"] = dict(tree["train"]["optimizer"])
            labels = []
            for axis, (label, overrides) in zip(self.axes, point):
                labels.append((axis.name, label))
                for key, value in overrides:
                    _set(tree, check_key(key, f"grid.{axis.name}"), value)
            try:
                run = RunConfig.from_dict(tree, labels=tuple(labels))
            except (TypeError, ValueError) as err:
                where = ", ".join(f"{k}={v}" for k, v in labels)
                raise ValueError(f"grid point ({where}): {err}") from None
            if run.hash in seen:
                raise ValueError(f"grid points {dict(seen[run.hash])} and {dict(labels)} resolve to the same run")
            seen[run.hash] = run.labels
            out.append(run)
        return out

    def override(self, changes: dict[str, Any]) -> StudyConfig:
        """A copy with dotted-key ``changes``: a key that is a grid axis gets the given list as its values (a
        shrunk grid), any other key changes the base run. Used to smoke-test long studies with 2 steps."""
        axes = {a.name: a for a in self.axes}
        base = self.base.to_dict()
        for key, value in changes.items():
            if key in axes:
                axes[key] = _parse_axis(key, value)
            else:
                _set(base, check_key(key, "override"), value)
        return dataclasses.replace(self, base=RunConfig.from_dict(base), axes=tuple(axes.values()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            **self.base.to_dict(),
            "analysis": self.analysis.to_dict(),
            "grid": {a.name: [{"label": lab, "overrides": dict(ov)} for lab, ov in a.values] for a in self.axes},
        }


def _merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in child.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict) and k != "norm":
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _read_yaml(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    yaml = require("yaml")
    if path in chain:
        raise ValueError(f"extends cycle: {' -> '.join(str(p) for p in (*chain, path))}")
    if not path.is_file():
        where = f" (extended by {chain[-1]})" if chain else ""
        raise FileNotFoundError(f"study config {str(path)!r} not found{where}")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a study config must be a mapping, got {type(raw).__name__}")
    parents = raw.pop("extends", None) or []
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise ValueError(f"{path}: extends must be a file name or a list of them, got {parents!r}")
    merged: dict[str, Any] = {}
    for parent in parents:
        merged = _merge(merged, _read_yaml((path.parent / parent).resolve(), (*chain, path)))
    return _merge(merged, raw)


def load_study(path: str | Path) -> StudyConfig:
    """Read, merge (``extends``) and validate a study YAML file; errors name the offending key."""
    path = Path(path).resolve()
    raw = _read_yaml(path, ())
    if "name" not in raw:
        raw["name"] = path.stem
    return StudyConfig.from_dict(raw, source=str(path))


def lr_label(lr: float) -> str:
    """``1e-3`` style label for tables and plots."""
    exp = math.floor(math.log10(lr))
    mant = lr / 10**exp
    return f"{mant:g}e{exp}"
