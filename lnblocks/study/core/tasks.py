"""What the study's core needs from one kind of experiment (a *task*), what it hands a task's ``train``, the registry
of tasks by name, and a run record read by its task (``read_record``: the task's upgrade of older records, then the
envelope and the task's result type, ``core.records``).

The core never imports a task: ``lnblocks/study/__init__.py`` registers each one by module path
(``register_task("lm", "lnblocks.study.lm.task", default=True)``) and ``get_task`` imports that module on first use
and returns its ``TASK``. A task module imports the core and the library, never another task.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lnblocks.config import ConfigValueError
from lnblocks.study.core.dist import DistContext
from lnblocks.study.core.records import SCHEMA, SCHEMA_V1, RecordError, RunRecord, check_envelope, read_json

if TYPE_CHECKING:
    from pathlib import Path

    from lnblocks.study.core.checkpoint import Checkpoints
    from lnblocks.study.core.grid import GridAxis
    from lnblocks.study.core.tracking import Tracker, TrackingConfig

__all__ = ["DistContext", "RunContext", "Task", "default_task_name", "get_task", "read_record", "record_from_json",
           "register_task", "task_names"]  # fmt: skip


@dataclass(frozen=True)
class RunContext:
    """How one run trains, besides its config: whether to draw a step bar (``position``: its tqdm row), where its
    curves go while it trains (``tracking`` is set only when the executor logs live; ``out_dir`` the study folder;
    ``tracker``: the open ``core.tracking.Tracker`` the executor made of them for a run's ``train``), this process's
    place in a ``torchrun`` job, and the run's checkpoints (``checkpoints``: a ``core.checkpoint.Checkpoints`` when
    the run asks for them, else None): a task that supports them resumes from ``checkpoints.latest()`` and saves its
    state when ``checkpoints.due(step)`` says so."""

    show_progress: bool = False
    position: int = 0
    out_dir: str | None = None
    tracking: TrackingConfig | None = None
    dist: DistContext = field(default_factory=DistContext)
    checkpoints: Checkpoints | None = None
    tracker: Tracker | None = None


@dataclass(frozen=True)
class Task:
    """One kind of experiment, as the runner and the report see it.

    - ``run_type``: the task's run config, a frozen ``lnblocks.config.Config`` that also derives from
      ``core.run_config.LabelledRun``: its fields are the run sections of a study file (``data``, ``model``, ...),
      each grid point is ``run_type.from_dict(options)``, and dotted grid keys are checked by
      ``run_type.check_key`` (``core.study_config.read_sections``: the core reads every task's study file);
    - ``analysis_type``: the config of the file's ``analysis`` section (the report's settings); None: no such
      section;
    - ``read_grid(raw)``: for a file that gives its grid otherwise than ``grid:`` / ``extra_grids:``, its ``(base
      options, axes, extra grids)`` from the file's mapping; None: the core's reading;
    - ``check_grid(runs)``: refuse (``ValueError``) a grid whose runs the report could not tell apart, when the study
      is read; None: any grid;
    - ``train(run, ctx)``: one run's ``RunRecord`` (the one place a run of this task trains);
    - ``outcome(record)``: a one-line summary; ``report(out, records, manifest, problems, plots=, echo=,
      show_progress=, open_executor=)``: write the report files from records alone and return an exit code
      (``open_executor(n)``: the study's executor for ``n`` jobs of the report's own, ``core.executors.Job.call``;
      None: in this process);
    - ``result_type``: the dataclass of ``RunRecord.result`` (with ``CONFIG``/``TIME``/``SPEC``: keys to check);
    - ``path_keys``: dotted option keys whose values are file paths (relative ones resolve against the study file's
      folder), each with the values that are not paths;
    - ``before_runs(runs, show_progress)``: make the runs' inputs ready once, before any run starts (tokenize a
      corpus), returning one line per input; None: nothing to do;
    - ``resolve_runs(runs, show_progress)``: the runs with what they read fixed (a prepared corpus's digest), before
      their ids are used: what a run trained on is part of its id; None: the runs as configured;
    - ``replay_curves(record, out_dir, tracking)``: write a finished run's curves from its record (for executors that
      do not log live); None: the task logs no curves, and a study of it may not turn ``tracking`` on;
    - ``check_runs(runs)``: refuse (``ValueError``, one line) runs that cannot start on this machine (a device it
      lacks), before any starts; called where the runs train here (the local and torchrun executors);
    - ``ddp``: whether ``train`` runs under ``torchrun`` with DistributedDataParallel (``ctx.dist``);
    - ``upgrade_record(obj, source)``: a record's JSON object as the current code reads it (records older lnblocks
      wrote: schema 1, which only the default task had, or configs with keys since renamed); None: as written.
    """

    name: str
    run_type: type
    train: Callable[[Any, RunContext], RunRecord]
    outcome: Callable[[RunRecord], str]
    report: Callable[..., int]
    result_type: type
    analysis_type: type | None = None
    read_grid: Callable[[dict[str, Any]], tuple[dict[str, Any], tuple[GridAxis, ...], tuple]] | None = None
    check_grid: Callable[[list[Any]], None] | None = None
    path_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    before_runs: Callable[[list[Any], bool], list[str]] | None = None
    resolve_runs: Callable[[list[Any], bool], list[Any]] | None = None
    replay_curves: Callable[[RunRecord, str | Path, TrackingConfig], Any] | None = None
    check_runs: Callable[[list[Any]], None] | None = None
    ddp: bool = False
    upgrade_record: Callable[[Mapping[str, Any], str], dict[str, Any]] | None = None


_MODULES: dict[str, str] = {}  # task name -> module holding its TASK
_DEFAULT: list[str] = []  # the task of a study file without a ``task:`` key


def register_task(name: str, module: str, *, default: bool = False) -> None:
    """Make ``get_task(name)`` import ``module`` and return its ``TASK``; ``default``: the task of study files that
    name none."""
    _MODULES[name] = module
    if default:
        _DEFAULT[:] = [name]


def task_names() -> list[str]:
    return list(_MODULES)


def default_task_name() -> str:
    if not _DEFAULT:
        raise RuntimeError("no default study task is registered (lnblocks.study registers them on import)")
    return _DEFAULT[0]


def get_task(name: str) -> Task:
    """The task called ``name``; ``ValueError`` listing the valid names otherwise."""
    if name not in _MODULES:
        raise ConfigValueError("task", f"must be one of {task_names()}, got {name!r}")
    task = importlib.import_module(_MODULES[name]).TASK
    if task.name != name:
        raise RuntimeError(f"{_MODULES[name]}.TASK is named {task.name!r}, registered as {name!r}")
    return task


# ---- a record, read by its task --------------------------------------------------------------------------------


def record_from_json(obj: Any, source: str = "") -> RunRecord:
    """A record's JSON object as its task reads it: the task's ``upgrade_record`` first (records older lnblocks
    wrote: schema 1, which only the default task had, or configs with keys since renamed), then the envelope and the
    task's ``result_type`` (``RunRecord.from_json``); ``RecordError`` names ``source`` and the first bad key."""
    if not isinstance(obj, Mapping):
        raise RecordError(source, "", f"a run record must be a JSON object, got {type(obj).__name__}")
    fmt = obj.get("format")
    if fmt not in (SCHEMA, SCHEMA_V1):
        raise RecordError(source, "format", f"must be {SCHEMA!r} (or the older {[SCHEMA_V1]}), got {fmt!r}")
    name = obj.get("task") if fmt == SCHEMA else default_task_name()
    upgrade = get_task(name).upgrade_record if isinstance(name, str) and name in task_names() else None
    if upgrade is not None:
        obj = upgrade(obj, source)
    elif fmt == SCHEMA_V1:
        raise RecordError(source, "format", f"{SCHEMA_V1!r} records are read by the task that wrote them: none")
    check_envelope(obj, source)
    if obj["task"] not in task_names():
        raise RecordError(source, "task", f"must be one of {task_names()}, got {obj['task']!r}")
    return RunRecord.from_json(obj, source, result_type=get_task(obj["task"]).result_type)


def read_record(path: str | Path) -> RunRecord:
    """Load and validate the record at ``path``; ``RecordError`` (naming the file and key) if it is unusable."""
    return record_from_json(read_json(path, "run record"), source=str(path))
