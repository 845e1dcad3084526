"""``StudyConfig``: a study file (with ``extends:`` base files) validated and expanded into one run config per grid
point, for any task; ``load_study`` reads one (``lnblocks.study.core.studyfile``) and asks its task to validate it.

A study file names its ``task`` (without one: the default task registered in ``core.tasks``), holds the base run's
options and a ``grid``. Each grid axis is either a dotted key with a list of values::

    grid:
      model.placement: [pre, post]
      train.lr: [1.0e-3, 3.0e-3]

or a named axis whose values are labelled bundles of overrides (for settings that only make sense together)::

    grid:
      variant:
        deepnorm: {model.placement: deepnorm, model.init: deepnet}
        dyt: {model.norm: dyt}

The grid is the product of the axes in file order; overrides apply to the base options before validation.
``extra_grids`` (a list) adds the points of more grids, each the main grid with some axes changed: a named axis by a
list of its labels (a subset) or by a mapping of bundles, a dotted key by a new list of values; the other axes and
the axis order (so the labels) stay the main grid's, and points already in the grid are not repeated::

    extra_grids:
      - {variant: [pre, post], model.depth: [24]}   # depth 24 for two of the variants only

Labels are unique per distinct value (a dict value's label names the options that tell it apart). ``extends: base.yaml``
(or a list) deep-merges the base files first (paths relative to the including file); ``null`` removes a key. A value
set in a file that an inherited grid axis would override in every run is refused.

File paths among the options (the task's ``path_keys``, e.g. ``data.train_path``) resolve against the folder of the
file that set them; paths given as overrides (``--set``) resolve against the current folder. Overrides
(``load_study(path, overrides)``, ``StudyConfig.override``) apply to the merged file before validation: a dotted key
sets that option, a grid axis takes a list of values (a value alone is a list of one; a named axis takes a list of
its labels), which shrinks the grid. The study-wide sections ``tracking`` (curves: ``TrackingConfig``) and
``resources`` (per-run CPUs/GPUs for the Ray executor: ``ResourcesConfig``) are not part of any run's config.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lnblocks.config import Config, ConfigError, ConfigValueError
from lnblocks.study.core.ray_executor import ResourcesConfig
from lnblocks.study.core.studyfile import (
    MergedFile,
    StudyFileError,
    apply_overrides,
    load_merged,
    resolve_file_paths,
    resolve_grid_paths,
    resolve_tree_paths,
    set_dotted,
)
from lnblocks.study.core.tasks import default_task_name, get_task, task_names
from lnblocks.study.core.tracking import TrackingConfig

STUDY_SECTIONS = ("tracking", "resources")  # study-wide sections: not part of any run's config


@dataclass(frozen=True)
class GridAxis:
    """One axis: ``name`` and its values as ``(label, ((dotted_key, value), ...))``."""

    name: str
    values: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]

    @property
    def keys(self) -> list[str]:
        """Every dotted key this axis sets (in some of its values)."""
        return sorted({k for _, overrides in self.values for k, _ in overrides})

    @property
    def keys_in_every_run(self) -> list[str]:
        """The dotted keys every value of this axis sets: what it overrides in every run."""
        sets = [{k for k, _ in overrides} for _, overrides in self.values]
        return sorted(set.intersection(*sets)) if sets else []


def _scalar_label(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return str(value.get("kind", "x"))
    return str(value)


def value_labels(name: str, values: Sequence[Any]) -> list[str]:
    """Labels of an axis's values, unique per distinct value: a dict is labelled by its ``kind`` plus the options
    that differ among the dicts sharing that label (``dyt(alpha_init=0.5)``); a float by ``%g``, then by ``repr``
    where ``%g`` collides. Values that still share a label are refused (``ValueError``)."""
    labels = [_scalar_label(v) for v in values]
    for label in set(labels):
        same = [i for i, lab in enumerate(labels) if lab == label]
        if len(same) < 2:
            continue
        if all(isinstance(values[i], dict) for i in same):
            keys = sorted({k for i in same for k in values[i]} - {"kind"})
            differ = [k for k in keys if len({json.dumps(values[i].get(k), sort_keys=True) for i in same}) > 1]
            for i in same:
                opts = ",".join(f"{k}={_scalar_label(values[i].get(k))}" for k in differ)
                labels[i] = f"{label}({opts})" if opts else label
        else:
            for i in same:
                labels[i] = repr(values[i]) if isinstance(values[i], float) else labels[i]
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):
        if label in seen and values[seen[label]] != values[i]:
            raise ConfigValueError(
                f"grid.{name}", f"values {values[seen[label]]!r} and {values[i]!r} would share the label {label!r}"
            )
        seen[label] = i
    return labels


def parse_axis(name: Any, spec: Any, check_key: Callable[[str, str], None]) -> GridAxis:
    """One ``grid`` entry: a dotted key with a non-empty list, or a named axis of labelled override bundles."""
    if not isinstance(name, str):
        raise ConfigValueError("grid", f"axis names must be strings, got {name!r}")
    if "." in name:
        check_key(name, "grid")
        if not isinstance(spec, list) or not spec:
            raise ConfigValueError(f"grid.{name}", f"must be a non-empty list of values, got {spec!r}")
        labels = value_labels(name, spec)
        return GridAxis(name, tuple((lab, ((name, v),)) for lab, v in zip(labels, spec)))
    if not isinstance(spec, dict) or not spec:
        raise ConfigValueError(
            f"grid.{name}",
            "a named axis maps labels to overrides, e.g. {deepnorm: {model.placement: deepnorm}}; "
            f"got {spec!r} (a dotted key such as 'model.depth' takes a list of values)",
        )
    values = []
    given: dict[str, Any] = {}  # label as the ids and the report write it -> the key as the file gave it
    for label, overrides in spec.items():
        text = str(label)
        if not text.strip():
            raise ConfigValueError(f"grid.{name}", f"labels must be non-empty names, got {label!r}")
        if text in given:
            raise ConfigValueError(
                f"grid.{name}",
                f"labels {given[text]!r} and {label!r} are both {text!r} as the run ids, --set and the report "
                "write them; give the values distinct names",
            )
        given[text] = label
        if not isinstance(overrides, dict) or not overrides:
            raise ConfigValueError(
                f"grid.{name}.{label}", f"must be a mapping of dotted keys to values, got {overrides!r}"
            )
        for key in overrides:
            check_key(str(key), f"grid.{name}.{label}")
        values.append((text, tuple((str(k), v) for k, v in overrides.items())))
    return GridAxis(name, tuple(values))


def parse_extra_grids(spec: Any, axes: Sequence[GridAxis], check_key: Callable[[str, str], None]) -> tuple:
    """``extra_grids``: a list of mappings, each changing some axes of the main grid ``axes`` (see the module
    docstring). Returns one tuple of axes per extra grid, in the main grid's axis order."""
    if spec is None:
        return ()
    if not isinstance(spec, list):
        raise ConfigValueError("extra_grids", f"must be a list of grids (mappings of axes), got {spec!r}")
    main = {a.name: a for a in axes}
    out = []
    for i, grid in enumerate(spec):
        where = f"extra_grids[{i}]"
        if not isinstance(grid, dict) or not grid:
            raise ConfigValueError(where, f"must be a non-empty mapping of axes to change, got {grid!r}")
        changed = {}
        for name, values in grid.items():
            if name not in main:
                raise ConfigValueError(f"{where}.{name}", f"is not an axis of the main grid; its axes: {list(main)}")
            if "." not in name and isinstance(values, list):  # a subset of a named axis's labels
                known = dict(main[name].values)
                missing = [v for v in values if str(v) not in known]
                if not values or missing:
                    raise ConfigValueError(
                        f"{where}.{name}", f"must list labels of the axis {name!r} {list(known)}, got {values!r}"
                    )
                changed[name] = GridAxis(name, tuple((str(v), known[str(v)]) for v in values))
            else:
                changed[name] = parse_axis(name, values, check_key)
        out.append(tuple(changed.get(a.name, a) for a in axes))
    return tuple(out)


@dataclass(frozen=True)
class StudyConfig:
    """A validated study: the task, the base ``options`` (a plain tree, before validation), the grid ``axes`` and
    the task's report settings (``analysis``). ``runs()`` expands the grid into the task's run configs; ``base`` is
    the run config of the options alone."""

    name: str
    task: str
    options: dict[str, Any]
    make_run: Callable[[dict[str, Any], tuple[tuple[str, str], ...]], Any]
    check_key: Callable[[str, str], None]
    axes: tuple[GridAxis, ...] = ()
    analysis: Config | None = None
    description: str = ""
    source: str = ""
    extra_grids: tuple[tuple[GridAxis, ...], ...] = ()
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    raw: dict[str, Any] = field(default_factory=dict)  # the merged file (paths resolved): what overrides apply to

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "") -> StudyConfig:
        """A study from a mapping with the schema of a study file (no ``extends``); see ``study_from_dict``."""
        return study_from_dict(raw, source)

    @property
    def base(self) -> Any:
        """The run config the base options describe (no grid axis applied)."""
        return self.make_run(copy.deepcopy(self.options), ())

    def runs(self) -> list[Any]:
        """One run config per grid point (product of the axes in file order, then the points of ``extra_grids``
        not already there); two points of one grid that resolve to the same run raise ``ValueError``."""
        out: list[Any] = []
        seen: dict[str, tuple[tuple[str, str], ...]] = {}
        for i, axes in enumerate((self.axes, *self.extra_grids)):
            before = set(seen)
            for run in self._grid_runs(axes):
                if run.hash in before:
                    continue  # an extra grid's point that an earlier grid has
                if run.hash in seen:
                    raise ConfigValueError(
                        "grid" if i == 0 else f"extra_grids[{i - 1}]",
                        f"points {dict(seen[run.hash])} and {dict(run.labels)} resolve to the same run",
                    )
                seen[run.hash] = run.labels
                out.append(run)
        return out

    def _grid_runs(self, axes: tuple[GridAxis, ...]) -> list[Any]:
        out = []
        for point in itertools.product(*(axis.values for axis in axes)):
            tree = copy.deepcopy(self.options)
            labels = []
            for axis, (label, overrides) in zip(axes, point):
                labels.append((axis.name, label))
                for key, value in overrides:
                    set_dotted(tree, key, copy.deepcopy(value))
            try:
                run = self.make_run(tree, tuple(labels))
            except (TypeError, ValueError) as err:
                if not labels:
                    raise
                where = ", ".join(f"{k}={v}" for k, v in labels)
                if isinstance(err, ConfigError):
                    raise type(err)(f"grid point ({where}): {err.key}", err.detail) from None
                raise type(err)(f"grid point ({where}): {err}") from None
            out.append(run)
        return out

    def override(self, changes: Mapping[str, Any]) -> StudyConfig:
        """A copy with dotted-key ``changes`` applied to the study file and validated again: a key that is a grid
        axis gets the given values (a shrunk grid), any other key changes that option. Used to smoke-test long
        studies with 2 steps, and by ``lnblocks study run --set``."""
        if not self.raw:
            raise ValueError("override needs a study built by load_study or study_from_dict")
        raw = apply_overrides(self.raw, changes, get_task(self.task).path_keys)
        return build_study(raw, self.task, name=self.name, description=self.description, source=self.source)

    def to_dict(self) -> dict[str, Any]:
        """The manifest form (``study.json``): what the report needs besides the run records."""
        return {
            "name": self.name,
            "task": self.task,
            "description": self.description,
            "source": self.source,
            "options": self.options,
            "analysis": self.analysis.to_dict() if self.analysis is not None else {},
            "tracking": self.tracking.to_dict(),
            "resources": self.resources.to_dict(),
            "grid": _grid_dict(self.axes),
            **({"extra_grids": [_grid_dict(g) for g in self.extra_grids]} if self.extra_grids else {}),
        }


def _grid_dict(axes: Sequence[GridAxis]) -> dict[str, Any]:
    return {a.name: [{"label": lab, "overrides": dict(ov)} for lab, ov in a.values] for a in axes}


def check_inherited_overrides(merged: MergedFile, axes: Sequence[GridAxis]) -> None:
    """Refuse a value that a later file sets while a grid axis from an earlier file overrides it in every run
    (e.g. a child's ``train.lr: 3e-3`` under an inherited ``train.lr`` axis)."""
    for axis in axes:
        axis_at = merged.axis_file.get(axis.name)
        if axis_at is None:
            continue
        for key in axis.keys_in_every_run:
            for leaf, at in merged.option_file.items():
                related = leaf == key or leaf.startswith(key + ".") or key.startswith(leaf + ".")
                if related and at > axis_at:
                    raise StudyFileError(
                        f"{merged.files[at]}: sets {leaf}, but the grid axis {axis.name!r} inherited from "
                        f"{merged.files[axis_at]} overrides it in every run; drop the axis here "
                        f"(grid: {{{axis.name}: null}}) or give its values here"
                    )


# ---- building studies ------------------------------------------------------------------------------------------


def build_study(raw: Mapping[str, Any], task: str, *, name: str, description: str, source: str) -> StudyConfig:
    """The ``StudyConfig`` of a merged study mapping (meta keys removed) for ``task``; errors name ``source``."""
    raw = dict(raw)
    sections = {k: raw.pop(k, None) for k in STUDY_SECTIONS}
    try:
        study = get_task(task).study_from_dict(copy.deepcopy(raw), name=name, description=description, source=source)
        tracking = TrackingConfig.from_dict(sections["tracking"], key="tracking")
        resources = ResourcesConfig.from_dict(sections["resources"], key="resources")
    except ConfigError as err:  # name the file too
        if not source:
            raise
        raise type(err)(f"{source}: {err.key}", err.detail) from None
    if tracking.enabled and get_task(task).replay_curves is None:
        raise ConfigValueError("tracking", f"task {task!r} logs no curves; tracking is for {_tracked_tasks()}")
    full = {**raw, **{k: v for k, v in sections.items() if v is not None}}
    return dataclasses.replace(study, tracking=tracking, resources=resources, raw=full)


def _tracked_tasks() -> list[str]:
    return [name for name in task_names() if get_task(name).replay_curves is not None]


def _split_meta(raw: dict[str, Any], source: str, task: str | None) -> tuple[str, str, str]:
    default_name = Path(source).stem if source else "study"
    name = raw.pop("name", None) or default_name
    description = raw.pop("description", None) or ""
    task_name = raw.pop("task", None) or task or default_task_name()
    if task is not None and task_name != task:
        raise StudyFileError(f"{source}: task is {task_name!r}, expected {task!r}")
    if not isinstance(name, str) or not isinstance(description, str):
        raise StudyFileError(f"{source}: name and description must be strings")
    return name, description, task_name


def load_study(path: str | Path, task: str | None = None, overrides: Mapping[str, Any] | None = None) -> StudyConfig:
    """Read, merge (``extends``) and validate a study file of any task; errors name the file or dotted key.
    ``overrides``: dotted keys applied before validation (see ``apply_overrides``; ``lnblocks study run --set``)."""
    merged = load_merged(path)
    source = str(Path(path).resolve())
    task_name = merged.raw.get("task") or task or default_task_name()
    path_keys = get_task(task_name).path_keys if isinstance(task_name, str) and task_name in task_names() else {}
    raw = resolve_file_paths(merged, path_keys)
    if overrides:
        raw = apply_overrides(raw, overrides, path_keys)
    name, description, task_name = _split_meta(raw, source, task)
    study = build_study(raw, task_name, name=name, description=description, source=source)
    check_inherited_overrides(merged, study.axes)
    return study


def study_from_dict(raw: dict[str, Any], source: str = "", overrides: Mapping[str, Any] | None = None) -> StudyConfig:
    """A study from a mapping with the schema of a study file (``task`` defaults to the default task; no ``extends``).
    Relative paths resolve against the folder of ``source`` if given, else the current folder."""
    raw = copy.deepcopy(dict(raw))
    if "extends" in raw:
        raise StudyFileError("extends works in study files only (use load_study)")
    task_name = raw.get("task") or default_task_name()
    path_keys = get_task(task_name).path_keys if isinstance(task_name, str) and task_name in task_names() else {}
    folder = Path(source).resolve().parent if source else Path.cwd()
    resolve_tree_paths(raw, folder, path_keys)
    for axis in list(raw.get("grid") or {}) if isinstance(raw.get("grid"), dict) else []:
        resolve_grid_paths(raw["grid"], axis, folder, path_keys)
    if overrides:
        raw = apply_overrides(raw, overrides, path_keys)
    name, description, task_name = _split_meta(raw, source, None)
    return build_study(raw, task_name, name=str(name), description=str(description), source=source)
