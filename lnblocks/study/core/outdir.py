"""A study's output folder ``OUT``: its layout, which runs are still to do, who may use it, and the lock a runner
holds on a run while it trains it.

``OUT/study.json`` (the manifest: the resolved study, its run ids and the folder's ``out_id``, written by
``claim_out_dir``),
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
import shutil
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lnblocks.study.core.atomic import remove_stale_tmp, write_json_atomic
from lnblocks.study.core.checkpoint_folders import folder_bytes, gib, orphans, study_bases, user_dir
from lnblocks.study.core.checkpoint_manifest import step_dirs
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
    the task resolved them, ``Task.resolve_runs``; default ``study.runs()``), and the ``train.checkpoint.dir``
    folders its runs name (``checkpoint_dirs``, when any: ``core.checkpoint_folders``). ``claim_out_dir`` adds the
    folder's ``out_id``."""
    runs = study.runs() if runs is None else runs
    manifest = {**study.to_dict(), "run_ids": [r.run_id for r in runs]}
    dirs = {user_dir(getattr(getattr(r, "checkpoint", None), "dir", None)) for r in runs} - {None}
    if dirs:
        manifest["checkpoint_dirs"] = sorted(str(d) for d in dirs)
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


def _check_manifest(path: Path, new: dict[str, Any], others_running: bool) -> dict[str, Any]:
    """Refuse to write ``new`` over the manifest at ``path`` when it is another study's, or another version of the
    study a runner is running now; a damaged manifest is named (and rewritten by the caller). Returns the manifest
    there ({} when there is none, or it is damaged)."""
    if not path.exists():
        return {}
    try:
        old = read_json(path, "study manifest")
        if not isinstance(old, dict):
            raise RecordError(str(path), "", f"must be a JSON object, got {type(old).__name__}")
    except RecordError as err:
        if others_running:
            raise ValueError(f"{err}; another runner is using {path.parent}: wait for it to end") from None
        print(f"warning: {err}; it is rewritten", file=sys.stderr)
        return {}
    if (old.get("name"), old.get("task")) != (new.get("name"), new.get("task")):
        raise ValueError(
            f"{path.parent} holds the study {_describe(old)}, not {_describe(new)}: give another --out (or remove "
            f"{path} to reuse the folder)"
        )
    if others_running and {k: v for k, v in old.items() if k != "out_id"} != new:
        raise ValueError(
            f"another runner is training a different version of the study {_describe(new)} in {path.parent} "
            "(other --set values or an edited file): wait for it to end or give another --out"
        )
    return old


def _with_out_id(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """``new`` with the folder's ``out_id``: the old manifest's, else a new random one (made once per folder)."""
    out_id = old.get("out_id")
    return {**new, "out_id": out_id if isinstance(out_id, str) and out_id else uuid.uuid4().hex[:12]}


@contextmanager
def claim_out_dir(study: StudyConfig, out: Path, runs: list[Any] | None = None) -> Iterator[Path]:
    """Make ``out`` this runner's for ``study`` (see the module docstring): check and write the manifest, create
    ``out/runs/``, remove temp files of dead writers; yields the runs folder and holds ``out`` until the end.
    ``runs``: as for ``manifest_of``."""
    out.mkdir(parents=True, exist_ok=True)
    new = manifest_of(study, runs)
    runners: int | None = None
    if fcntl is None:  # pragma: no cover - not POSIX: the manifest check only
        old = _check_manifest(out / "study.json", new, others_running=False)
        write_json_atomic(out / "study.json", _with_out_id(new, old))
    else:
        mutex = _flock(out / ".study.lock", fcntl.LOCK_EX, block=True)  # held for the few lines below only
        try:
            alone = _flock(out / ".runners.lock", fcntl.LOCK_EX, block=False)
            if alone is not None:
                os.close(alone)  # no runner uses out, and none can start while we hold the mutex
            old = _check_manifest(out / "study.json", new, others_running=alone is None)
            if alone is not None:
                write_json_atomic(out / "study.json", _with_out_id(new, old))
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


def clean_study(out: str | Path, remove: bool = False) -> int:
    """``lnblocks study clean OUT``: list the checkpoint folders in the study's checkpoint folders whose run is no
    run of the study now (orphans of an earlier config, ``core.checkpoint_folders``), each with its size and steps;
    ``remove``: delete them, refused while a runner uses ``OUT`` (none can start meanwhile). Returns 0."""
    from lnblocks.study.core.report import read_manifest

    out = Path(out)
    manifest = read_manifest(out)
    bases = study_bases(out, manifest)
    found = orphans(bases, set(manifest["run_ids"]))
    if not found:
        print(f"{out}: no orphaned checkpoints (every folder in {', '.join(map(str, bases))} is a run of the study)")
        return 0
    held = _hold_alone(out) if remove else None
    try:
        total = 0
        for folder in found:
            size, steps = folder_bytes(folder), [n for n, _ in step_dirs(folder)][::-1]
            total += size
            if remove:
                shutil.rmtree(folder)
            what = "removed" if remove else "orphan"
            print(f"{what}: {folder} ({gib(size)}; checkpoints of steps {steps or 'none'})")
        if remove:
            for base in bases:
                with suppress(OSError):  # the study's own folders, once empty
                    base.rmdir()
        tail = "removed" if remove else f"`lnblocks study clean {out} --remove` deletes them"
        print(f"{len(found)} orphaned checkpoint folder(s), {gib(total)}: {tail}")
    finally:
        if held is not None:
            os.close(held)
    return 0


def _hold_alone(out: Path) -> int | None:
    """The exclusive runners lock of ``out`` (no runner uses it, none starts until it is closed); ``ValueError``
    while a runner uses it. None where there is no locking."""
    if fcntl is None:  # pragma: no cover - not POSIX
        return None
    mutex = _flock(out / ".study.lock", fcntl.LOCK_EX, block=True)
    try:
        held = _flock(out / ".runners.lock", fcntl.LOCK_EX, block=False)
    finally:
        assert mutex is not None
        os.close(mutex)
    if held is None:
        raise ValueError(f"a runner is using {out}: remove its orphaned checkpoints once it ends")
    return held
