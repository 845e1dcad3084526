"""Run a study of any task: skip runs that have a valid record, make the runs' inputs ready (tokenize a corpus once),
train the rest on an executor (this process, a pool of supervised worker processes, or Ray tasks on a cluster; every
run with DDP under ``torchrun``), write one record per run atomically as it arrives, then build the report.

Layout of ``OUT``: ``study.json`` (the resolved study and its run ids), ``runs/<run id>.json`` (one ``RunRecord``
per finished run), and what the task's report writes. A record is written only when its run ends (temp file +
``os.replace``), so a killed run leaves no partial result: the next invocation removes the dead process's temp file
and redoes that run; a record that fails validation (truncated, a key missing) is redone too. While a run trains, its
runner holds an exclusive lock on ``runs/<run id>.lock``, so two runners on one folder never train the same run.
With ``tracking`` on, curves go to ``tensorboard/<run id>/``: live from the local executors, from each record as it
arrives with Ray (``tracking.replay``: the same points).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

from lnblocks.study.executors import Executor, Job, Outcome, make_executor
from lnblocks.study.grid import StudyConfig, load_study
from lnblocks.study.records import RecordError, read_record, remove_stale_tmp, write_json_atomic, write_record
from lnblocks.study.tasks import get_task

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no cross-runner locking
    fcntl = None  # type: ignore[assignment]


def record_path(runs_dir: Path, run_id: str) -> Path:
    return runs_dir / f"{run_id}.json"


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


def pending_runs(study: StudyConfig, runs_dir: Path) -> tuple[list[Any], int, list[str]]:
    """Runs without a valid record, most expensive first (balances parallel workers); how many are done; and one
    line per record that exists but fails validation (those runs are redone)."""
    runs = study.runs()
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


def _bar(total: int, initial: int, show: bool) -> Any:
    from lnblocks._optional import require

    return require("tqdm").tqdm(
        total=total, initial=initial, desc="runs", position=0, disable=not show, dynamic_ncols=True
    )


def _prepare(study: StudyConfig, out: Path) -> Path:
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(runs_dir)
    remove_stale_tmp(out)
    write_json_atomic(out / "study.json", {**study.to_dict(), "run_ids": [r.run_id for r in study.runs()]})
    return runs_dir


EXECUTORS = ("local", "ray")


def _load(config: str | Path | StudyConfig, overrides: Mapping[str, Any] | None) -> StudyConfig:
    if isinstance(config, StudyConfig):
        return config.override(overrides) if overrides else config
    return load_study(config, overrides=overrides)


def _check_executor(name: str, workers: int, ray_address: str | None) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    if name not in EXECUTORS:
        raise ValueError(f"executor must be one of {list(EXECUTORS)}, got {name!r}")
    if name == "local" and ray_address is not None:
        raise ValueError("--ray-address is for --executor ray")
    if name == "ray" and workers != 1:
        raise ValueError(
            "--workers is for --executor local; with Ray as many runs train at once as the cluster's resources "
            "allow (resources.cpus_per_run / gpus_per_run in the study file)"
        )


def _executor(name: str, workers: int, todo: int, study: StudyConfig, ray_address: str | None) -> Executor:
    if name == "local":
        return make_executor(min(workers, max(todo, 1)))
    from lnblocks.study.ray_executor import RayExecutor

    return RayExecutor(study.resources, address=ray_address)


def run_study(
    config: str | Path | StudyConfig,
    out_dir: str | Path,
    workers: int = 1,
    *,
    show_progress: bool | None = None,
    report: bool = True,
    overrides: Mapping[str, Any] | None = None,
    executor: str = "local",
    ray_address: str | None = None,
) -> int:
    """Run every unfinished run of ``config`` into ``out_dir`` and build the report; 0 if every run has a record.

    ``overrides``: dotted keys applied to the study file before validation (``--set``; see ``apply_overrides``).
    ``executor``: ``"local"`` (``workers`` > 1: that many supervised worker processes, each run with its own
    ``threads``) or ``"ray"`` (one Ray task per run on the cluster at ``ray_address``, or a local Ray instance).
    Launched by ``torchrun`` (WORLD_SIZE > 1): every run of an ``lm`` study trains with DDP over the ranks.
    """
    _check_executor(executor, workers, ray_address)
    from lnblocks._optional import require

    study = _load(config, overrides)
    task = get_task(study.task)
    require("tqdm")
    if report:
        require("matplotlib")  # fail before training, not after it
    if study.tracking.tensorboard:
        require("tensorboard")
    if study.tracking.wandb:
        require("wandb")
    if executor == "ray":
        require("ray")
    out = Path(out_dir)
    show = sys.stderr.isatty() if show_progress is None else show_progress
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from lnblocks.study.distributed import run_distributed

        return run_distributed(study, out, show, report)
    runs_dir = _prepare(study, out)
    todo, done, problems = pending_runs(study, runs_dir)
    for line in problems:
        print(f"warning: {line}", file=sys.stderr)
    total = done + len(todo)
    ids = {r.run_id for r in study.runs()}
    others = [p for p in runs_dir.glob("*.json") if p.stem not in ids]
    if others:
        print(
            f"note: {len(others)} record(s) in {runs_dir} are not runs of this study (another config, or an older "
            "lnblocks whose run ids differ); they are left alone and not reported",
            file=sys.stderr,
        )
    print(f"study {study.name!r}: {total} runs, {done} already finished, {len(todo)} to run -> {out}", flush=True)
    pool = _executor(executor, workers, len(todo), study, ray_address)
    if todo and task.prepare is not None:  # tokenize a corpus once here, not in every worker at the same time
        for line in task.prepare(todo, show_progress=show):
            print(line, flush=True)
    live = pool.live_tracking
    tracking = study.tracking if study.tracking.enabled else None
    failed: list[tuple[str, str]] = []
    elsewhere: list[str] = []
    locks: dict[str, RunLock] = {}
    bar = _bar(total, done, show)

    def jobs() -> Iterator[Job]:
        for run in todo:
            lock = RunLock(runs_dir, run.run_id)
            if not lock.acquire():
                elsewhere.append(run.run_id)
                bar.write(f"{run.run_id}: being trained by another runner on this folder; skipped")
                continue
            if check_record(runs_dir, run.run_id) is None:  # finished by another runner meanwhile
                lock.release()
                bar.update(1)
                continue
            locks[run.run_id] = lock
            yield Job(study.task, run, show and live, tracking if live else None, str(out))

    def finished(job: Job, outcome: Outcome) -> None:
        try:
            if outcome.record is not None:
                write_record(record_path(runs_dir, job.run_id), outcome.record)
                if tracking is not None and not live:
                    from lnblocks.study.tracking import replay

                    replay(outcome.record, out, tracking)
                bar.write(task.outcome(outcome.record))
            else:
                failed.append((job.run_id, outcome.error or "unknown error"))
                bar.write(f"{job.run_id}: FAILED\n{outcome.error}")
        finally:
            locks.pop(job.run_id).release()
            bar.update(1)

    try:
        pool.map(jobs(), finished)
    finally:
        bar.close()
        for lock in locks.values():
            lock.release()
    for run_id, err in failed:
        last = err.strip().splitlines()[-1] if err.strip() else err
        print(f"run {run_id} failed: {last}; rerun the same command to retry it", file=sys.stderr)
    if elsewhere:
        print(
            f"{len(elsewhere)} run(s) were being trained by another runner on {out}; rebuild the report with "
            f"`lnblocks study report {out}` when it ends",
            file=sys.stderr,
        )
    code = 1 if failed else 0
    if report:
        from lnblocks.study.report import build_report

        code = build_report(out) or code
    return code
