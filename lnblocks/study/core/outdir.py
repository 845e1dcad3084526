"""A study's output folder ``OUT``: its layout, which runs are still to do, and the lock a runner holds on a run
while it trains it.

``OUT/study.json`` (the manifest: the resolved study and its run ids, written by ``init_out_dir``),
``OUT/runs/<run id>.json`` (one ``RunRecord`` per finished run), ``OUT/runs/<run id>.lock`` (held while a runner
trains that run: two runners on one folder never train the same run), and whatever the task's report writes. A
record is written only when its run ends (atomically), so a killed run leaves no partial result: the next runner
removes the dead process's temp file and redoes that run (from its newest checkpoint when it has
``train.checkpoint``: ``OUT/checkpoints/<run id>/``, ``core.checkpoint``); a record that fails validation is redone too.
"""

from __future__ import annotations

import os
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lnblocks.study.core.atomic import remove_stale_tmp, write_json_atomic
from lnblocks.study.core.records import RecordError, read_record

if TYPE_CHECKING:
    from lnblocks.study.core.study_config import StudyConfig

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no cross-runner locking
    fcntl = None  # type: ignore[assignment]


def record_path(runs_dir: Path, run_id: str) -> Path:
    return runs_dir / f"{run_id}.json"


def init_out_dir(study: StudyConfig, out: Path, runs: list[Any] | None = None) -> Path:
    """Create ``out/runs/``, remove temp files of dead writers, write the manifest; return the runs folder.
    ``runs``: the study's runs as the task resolved them (``Task.resolve_runs``; default ``study.runs()``)."""
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(runs_dir)
    remove_stale_tmp(out)
    runs = study.runs() if runs is None else runs
    write_json_atomic(out / "study.json", {**study.to_dict(), "run_ids": [r.run_id for r in runs]})
    return runs_dir


def check_record(runs_dir: Path, run_id: str) -> str | None:
    """None if ``run_id`` has a valid record, else why not (missing, or the validation error)."""
    path = record_path(runs_dir, run_id)
    if not path.exists():
        return "missing"
    try:
        rec = read_record(path)
    except RecordError as err:
        return str(err)
    if rec.id != run_id:
        return f"{path}: id is {rec.id!r}, not the file's run id"
    return None


def pending_runs(study: StudyConfig, runs_dir: Path, runs: list[Any] | None = None) -> tuple[list[Any], int, list[str]]:
    """Runs without a valid record, most expensive first (balances parallel workers); how many are done; and one
    line per record that exists but fails validation (those runs are redone). ``runs``: as for ``init_out_dir``."""
    runs = study.runs() if runs is None else runs
    todo, problems = [], []
    for r in runs:
        why = check_record(runs_dir, r.run_id)
        if why is None:
            continue
        todo.append(r)
        if why != "missing":
            problems.append(f"{why}; the run is redone")
    todo.sort(key=lambda r: -r.cost)
    return todo, len(runs) - len(todo), problems


class RunLock:
    """An exclusive, non-blocking lock on ``runs/<id>.lock`` held while one runner trains that run."""

    def __init__(self, runs_dir: Path, run_id: str) -> None:
        self.path = runs_dir / f"{run_id}.lock"
        self.fd: int | None = None

    def acquire(self) -> bool:
        if fcntl is None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            with suppress(OSError):
                self.path.unlink()
            os.close(self.fd)
            self.fd = None
