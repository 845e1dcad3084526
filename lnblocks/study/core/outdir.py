"""A study's output folder ``OUT``: its layout, which runs are still to do, who may use it, and the lock a runner
holds on a run while it trains it.

``OUT/study.json`` (the manifest: the resolved study and its run ids, written by ``claim_out_dir``),
``OUT/runs/<run id>.json`` (one ``RunRecord`` per finished run), ``OUT/runs/<run id>.lock`` (held while a runner
trains that run: two runners on one folder never train the same run), and whatever the task's report writes. A
record is written only when its run ends (atomically), so a killed run leaves no partial result: the next runner
removes the dead process's temp file and redoes that run (from its newest checkpoint when it has
``train.checkpoint``: ``OUT/checkpoints/<run id>/``, ``core.checkpoint``); a record that fails validation is redone too.

One folder holds one study. A runner holds ``OUT/.runners.lock`` (shared) for as long as it runs, and reads and
writes the manifest under ``OUT/.study.lock``: a second runner of the same study (the same manifest) joins the first;
one of another study (another ``name`` or task) is refused, and so is one of another version of the running study
(other ``--set`` values, an edited file) while the first still runs, so a runner never reports another's study.
With no runner left, a new version of the same study replaces the manifest (records of the old one are left alone
and not reported); a damaged manifest is named and rewritten.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lnblocks.study.core.atomic import remove_stale_tmp, write_json_atomic
from lnblocks.study.core.records import RecordError, read_json
from lnblocks.study.core.tasks import read_record

if TYPE_CHECKING:
    from lnblocks.study.core.study_config import StudyConfig

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no cross-runner locking
    fcntl = None  # type: ignore[assignment]


def record_path(runs_dir: Path, run_id: str) -> Path:
    return runs_dir / f"{run_id}.json"


def manifest_of(study: StudyConfig, runs: list[Any] | None = None) -> dict[str, Any]:
    """What ``study.json`` holds for ``study``: its manifest form and its run ids (of ``runs``, the study's runs as
    the task resolved them, ``Task.resolve_runs``; default ``study.runs()``)."""
    runs = study.runs() if runs is None else runs
    manifest = {**study.to_dict(), "run_ids": [r.run_id for r in runs]}
    return json.loads(json.dumps(manifest, allow_nan=False))  # as it reads back from the file


def _flock(path: Path, mode: int, block: bool) -> int | None:
    """An open descriptor on ``path`` holding ``flock`` ``mode``; None when ``block`` is false and it is held."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode | (0 if block else fcntl.LOCK_NB))
    except OSError:
        os.close(fd)
        if block:
            raise
        return None
    return fd


def _describe(manifest: dict[str, Any]) -> str:
    source = f" ({manifest['source']})" if manifest.get("source") else ""
    return f"{manifest.get('name')!r}{source}"


def _check_manifest(path: Path, new: dict[str, Any], others_running: bool) -> None:
    """Refuse to write ``new`` over the manifest at ``path`` when it is another study's, or another version of the
    study a runner is running now; a damaged manifest is named (and rewritten by the caller)."""
    if not path.exists():
        return
    try:
        old = read_json(path, "study manifest")
        if not isinstance(old, dict):
            raise RecordError(str(path), "", f"must be a JSON object, got {type(old).__name__}")
    except RecordError as err:
        if others_running:
            raise ValueError(f"{err}; another runner is using {path.parent}: wait for it to end") from None
        print(f"warning: {err}; it is rewritten", file=sys.stderr)
        return
    if (old.get("name"), old.get("task")) != (new.get("name"), new.get("task")):
        raise ValueError(
            f"{path.parent} holds the study {_describe(old)}, not {_describe(new)}: give another --out (or remove "
            f"{path} to reuse the folder)"
        )
    if others_running and old != new:
        raise ValueError(
            f"another runner is training a different version of the study {_describe(new)} in {path.parent} "
            "(other --set values or an edited file): wait for it to end or give another --out"
        )


@contextmanager
def claim_out_dir(study: StudyConfig, out: Path, runs: list[Any] | None = None) -> Iterator[Path]:
    """Make ``out`` this runner's for ``study`` (see the module docstring): check and write the manifest, create
    ``out/runs/``, remove temp files of dead writers; yields the runs folder and holds ``out`` until the end.
    ``runs``: as for ``manifest_of``."""
    out.mkdir(parents=True, exist_ok=True)
    new = manifest_of(study, runs)
    runners: int | None = None
    if fcntl is None:  # pragma: no cover - not POSIX: the manifest check only
        _check_manifest(out / "study.json", new, others_running=False)
        write_json_atomic(out / "study.json", new)
    else:
        mutex = _flock(out / ".study.lock", fcntl.LOCK_EX, block=True)  # held for the few lines below only
        try:
            alone = _flock(out / ".runners.lock", fcntl.LOCK_EX, block=False)
            if alone is not None:
                os.close(alone)  # no runner uses out, and none can start while we hold the mutex
            _check_manifest(out / "study.json", new, others_running=alone is None)
            if alone is not None:
                write_json_atomic(out / "study.json", new)
            runners = _flock(out / ".runners.lock", fcntl.LOCK_SH, block=True)
        finally:
            assert mutex is not None
            os.close(mutex)
    try:
        runs_dir = out / "runs"
        runs_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_tmp(runs_dir)
        remove_stale_tmp(out)
        yield runs_dir
    finally:
        if runners is not None:
            os.close(runners)


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
    line per record that exists but fails validation (those runs are redone). ``runs``: as for ``manifest_of``."""
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
