"""``StudyConfig``: a study file (with ``extends:`` base files) validated and expanded into one run config per grid
point, for any task; ``load_study`` reads one (``lnblocks.study.core.studyfile``) and builds its runs.

A study file names its ``task`` (without one: the default task registered in ``core.tasks``); the core reads it
the same way for every task (``read_sections``): the run sections of the task's run config (``Task.run_type``'s
fields: ``data``, ``model``, ... for ``lm``), each a mapping of the base run's options; the report's ``analysis``
section (``Task.analysis_type``); and the grid (``grid`` and ``extra_grids``: ``lnblocks.study.core.grid``), whose
dotted keys are checked against the run config (``Config.check_key``). A task whose file gives its grid otherwise
(``cnn_digits``: the lists ``norms``, ``batch_sizes``, ``seeds``) replaces the grid reading alone (``Task.read_grid``).
Every grid point is built as ``run_type.from_dict(options with the point's overrides)`` when the study is read, so a
bad point fails before any run starts.

``extends: base.yaml`` (or a list) deep-merges the base files first (paths relative to the including file); ``null``
removes a key. A value set in a file that an inherited grid axis would override in every run is refused.

File paths among the options (the task's ``path_keys``, e.g. ``data.train_path``) resolve against the folder of the
file that set them; paths given as overrides (``--set``) resolve against the current folder. Overrides
(``load_study(path, overrides)``, ``StudyConfig.override``) apply to the merged file before validation: a dotted key
sets that option, a grid axis takes a list of values (a value alone is a list of one; a named axis takes a list of
its labels), which shrinks the grid. The study-wide sections ``tracking`` (curves: ``TrackingConfig``) and
``resources`` (per-run CPUs/GPUs for the Ray executor: ``ResourcesConfig``) are not part of any run's config.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lnblocks.config import Config, ConfigError, ConfigTypeError, ConfigValueError
from lnblocks.study.core.grid import GridAxis, grid_dict, parse_grid
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
from lnblocks.study.core.tasks import Task, default_task_name, get_task, task_names
from lnblocks.study.core.tracking import TrackingConfig

STUDY_SECTIONS = ("tracking", "resources")  # study-wide sections: not part of any run's config


@dataclass(frozen=True)
class StudyConfig:
    """A validated study: the task, the base ``options`` (a plain tree, before validation), the task's run config
    class (``run_type``), the grid ``axes`` and the task's report settings (``analysis``). ``runs()`` expands the grid
    into run configs; ``base`` is the run config of the options alone."""

    name: str
    task: str
    options: dict[str, Any]
    run_type: type
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
        return self.run_type.from_dict(copy.deepcopy(self.options)).with_labels(())

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
                run = self.run_type.from_dict(tree).with_labels(tuple(labels))
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
            "grid": grid_dict(self.axes),
            **({"extra_grids": [grid_dict(g) for g in self.extra_grids]} if self.extra_grids else {}),
        }


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


def read_sections(raw: Mapping[str, Any], task: Task) -> tuple[dict[str, Any], tuple[GridAxis, ...], tuple]:
    """The core's reading of a study file (meta keys and the study-wide sections removed): the base options (the
    run sections of ``task.run_type``; a section that holds a nested config must be a mapping), the grid axes and
    the extra grids (``task.read_grid`` replaces the grid reading for a file that gives its grid otherwise)."""
    sections = task.run_type.field_names()
    if task.read_grid is not None:
        return task.read_grid(dict(raw))
    valid = [*sections, *(["analysis"] if task.analysis_type is not None else []), "grid", "extra_grids"]
    unknown = sorted(str(k) for k in set(raw) - set(valid))
    if unknown:
        every = ["name", "description", "task", "extends", *valid, *STUDY_SECTIONS]
        raise ConfigValueError(
            unknown[0], f"is not a top-level key of a study file of task {task.name!r}; valid: {every}"
        )
    options: dict[str, Any] = {}
    for section in sections:
        value = raw.get(section)
        if value is None:
            continue
        if task.run_type.nested_config(section) is not None and not isinstance(value, dict):
            raise ConfigTypeError(section, f"must be a mapping of options, got {type(value).__name__} {value!r}")
        options[section] = value
    axes, extra_grids = parse_grid(raw, task.run_type.check_key)
    return options, axes, extra_grids


def build_study(raw: Mapping[str, Any], task: str, *, name: str, description: str, source: str) -> StudyConfig:
    """The ``StudyConfig`` of a merged study mapping (meta keys removed) for ``task``, every grid point built and
    checked now (not halfway through a sweep); errors name ``source``."""
    raw = dict(raw)
    sections = {k: raw.pop(k, None) for k in STUDY_SECTIONS}
    spec = get_task(task)
    try:
        options, axes, extra_grids = read_sections(copy.deepcopy(raw), spec)
        analysis = None
        if spec.analysis_type is not None:
            analysis = spec.analysis_type.from_dict(raw.get("analysis"), key="analysis")
        tracking = TrackingConfig.from_dict(sections["tracking"], key="tracking")
        resources = ResourcesConfig.from_dict(sections["resources"], key="resources")
        full = {**raw, **{k: v for k, v in sections.items() if v is not None}}
        study = StudyConfig(name, task, options, spec.run_type, axes, analysis, description, source, extra_grids,
                            tracking, resources, full)  # fmt: skip
        runs = study.runs()
        if spec.check_grid is not None:
            spec.check_grid(runs)
    except ConfigError as err:  # name the file too
        if not source:
            raise
        raise type(err)(f"{source}: {err.key}", err.detail) from None
    if tracking.enabled and spec.replay_curves is None:
        raise ConfigValueError("tracking", f"task {task!r} logs no curves; tracking is for {_tracked_tasks()}")
    return study


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
