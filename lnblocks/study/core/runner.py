"""Run a study of any task: the one run loop. Skip runs that have a valid record, make the runs' inputs ready
(``Task.before_runs``: tokenize a corpus once), train the rest on an executor, write one record per run atomically
as it arrives, then build the report.

Executors (``lnblocks.study.core.executors`` and siblings): ``local`` (this process, or a pool of supervised worker
processes with ``workers`` > 1), ``ray`` (one Ray task per run on a cluster), ``torchrun`` (chosen when the process
was launched by ``torchrun``: every run with DDP over the ranks; rank 0 runs this loop, the others serve it). The
folder layout, the per-run locks and resume are ``lnblocks.study.core.outdir``'s. With ``tracking`` on, curves go to
``tensorboard/<run id>/``: live from the local executors, from each record as it arrives otherwise (the task's
``replay_curves``: the same points).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from lnblocks.study.core import preemption
from lnblocks.study.core.checkpoint_folders import (
    check_folder,
    checkpoint_folder,
    orphans,
    orphans_note,
    remove_folder,
    study_bases,
    study_subfolder,
)
from lnblocks.study.core.executors import Executor, Job, Outcome, make_executor
from lnblocks.study.core.outdir import RunLock, check_record, claim_out_dir, pending_runs, record_path
from lnblocks.study.core.records import write_record
from lnblocks.study.core.report import read_manifest
from lnblocks.study.core.study_config import StudyConfig, load_study
from lnblocks.study.core.tasks import Task, get_task

EXECUTORS = ("local", "ray", "torchrun")
EXIT_FAILED = 1  # some run failed or was stopped (its worker was sent SIGTERM): the rerun redoes or resumes it
EXIT_FATAL = 2  # a run's checkpoints or record could not be written: no further run started, no report written


def _executor_name(name: str, workers: int, ray_address: str | None) -> str:
    """The executor to use (``local`` becomes ``torchrun`` under torchrun); ``ValueError`` for bad combinations."""
    from lnblocks.study.core.torchrun import launched_by_torchrun

    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    if name not in EXECUTORS:
        raise ValueError(f"executor must be one of {list(EXECUTORS)}, got {name!r}")
    if name != "ray" and ray_address is not None:
        raise ValueError("--ray-address is for --executor ray")
    if name == "ray" and workers != 1:
        raise ValueError(
            "--workers is for --executor local; with Ray as many runs train at once as the cluster's resources "
            "allow (resources.cpus_per_run / gpus_per_run in the study file)"
        )
    if launched_by_torchrun():
        if name == "ray":
            raise ValueError("--executor ray runs without torchrun (every rank would start its own Ray driver)")
        name = "torchrun"
    if name == "torchrun":
        if not launched_by_torchrun():
            raise ValueError("--executor torchrun needs a launch by torchrun (WORLD_SIZE > 1)")
        if workers != 1:
            raise ValueError("--workers is for --executor local; under torchrun every run uses all the ranks")
    return name


def _require_packages(study: StudyConfig, executor: str, report: bool) -> None:
    """Fail before training, not after it, when an optional package the study needs is missing."""
    from lnblocks._optional import require

    require("tqdm")
    if report:
        require("matplotlib")
    if study.tracking.tensorboard:
        require("tensorboard")
    if study.tracking.wandb:
        require("wandb")
    if executor == "ray":
        require("ray")


def _local_or_ray(name: str, workers: int, todo: int, study: StudyConfig, ray_address: str | None) -> Executor:
    if name == "local":
        return make_executor(min(workers, max(todo, 1)))
    from lnblocks.study.core.ray_executor import RayExecutor

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
    Launched by ``torchrun`` (WORLD_SIZE > 1), ``"local"`` means ``"torchrun"``: every run of a study whose task
    trains with DDP uses all the ranks.
    """
    name = _executor_name(executor, workers, ray_address)
    if isinstance(config, StudyConfig):
        study = config.override(overrides) if overrides else config
    else:
        study = load_study(config, overrides=overrides)
    task = get_task(study.task)
    _require_packages(study, name, report)
    world = 1
    if name == "torchrun":
        from lnblocks.study.core.torchrun import dist_from_env

        world = dist_from_env().world_size
    for run in study.runs():  # every rank, before any process group: no rank is left waiting
        run.check_world(world)
    out = Path(out_dir)
    show = sys.stderr.isatty() if show_progress is None else show_progress
    if name != "torchrun":

        def pool(todo: int) -> Executor:
            return _local_or_ray(name, workers, todo, study, ray_address)

        return _run(study, task, out, show, report, pool, here=name == "local")
    from lnblocks.study.core.torchrun import TorchrunExecutor

    ddp = TorchrunExecutor(task, study.runs()[0], study.runs())  # refused on every rank if the ranks' runs differ
    try:
        if not ddp.is_driver:  # ranks > 0 train what rank 0's loop hands out
            ddp.serve()
            return 0
        # the report's own jobs run on rank 0 alone: the other ranks stop serving when the runs are done
        return _run(study, task, out, show, report, lambda todo: ddp, f" with {ddp.describe()}", report_pool=False)
    except BaseException as err:  # reaches every rank, none left waiting in a collective (core.torchrun)
        raised = ddp.failed(err)
        if raised is err:
            raise
        raise raised from err
    finally:
        ddp.close()


def _run(
    study: StudyConfig,
    task: Task,
    out: Path,
    show: bool,
    report: bool,
    open_pool: Callable[[int], Executor],
    how: str = "",
    here: bool = True,
    report_pool: bool = True,
) -> int:
    """The loop every executor shares: manifest, pending runs, locks, one record per run as it arrives, the report.
    ``open_pool(n)``: the executor for ``n`` runs to train; ``here``: whether they train on this machine. Runs with
    ``checkpoint`` resume from their newest valid checkpoint (``core.checkpoint``): their folders are checked before
    any run trains and removed once the record is written. ``report_pool``: the report's own jobs (init profiles) go
    to ``open_pool`` too."""
    runs = study.runs()
    if task.resolve_runs is not None:  # what each run trains on is part of its id (a corpus's digest)
        runs = task.resolve_runs(runs, show)
    with claim_out_dir(study, out, runs) as runs_dir:  # one study per folder, held until its report is written
        sweep = Sweep(study, task, out, runs_dir, runs, show, here)
        code = sweep.run(open_pool, how)
        if code in (preemption.EXIT_CODE, EXIT_FATAL) or not report:  # a SIGTERM, or storage that cannot be written
            return code
        from lnblocks.study.core.report import build_report

        pool = open_pool if report_pool else None
        built = build_report(out, show_progress=show, open_executor=pool, note_orphans=False)  # named at the start
        return code or built  # the sweep's own status first: a report of no finished run says 1


class Sweep:
    """One pass over a study's pending runs in a claimed folder: each run is locked, trained on the pool, and its
    record written as it arrives; what failed, what another runner holds and what a SIGTERM stopped are counted.
    ``run(open_pool)`` returns the exit code (0: every run has a record; 1: some run failed, or was stopped by a
    SIGTERM sent to its worker alone; 2: a run's checkpoints or record could not be written; 143: this runner was
    stopped by SIGTERM, ``core.preemption``)."""

    def __init__(
        self, study: StudyConfig, task: Task, out: Path, runs_dir: Path, runs: list[Any], show: bool, here: bool
    ) -> None:
        self.study, self.task, self.out, self.runs_dir, self.runs, self.show = study, task, out, runs_dir, runs, show
        self.todo, self.done, self.problems = pending_runs(study, runs_dir, runs)
        if self.todo and here and task.check_runs is not None:  # a device this machine lacks: refused before any run
            task.check_runs(self.todo)
        for line in self.problems:
            print(f"warning: {line}", file=sys.stderr)
        self.here = here
        self.manifest = read_manifest(out)  # as claim_out_dir left it: its out_id names the study's checkpoints
        subfolder = study_subfolder(self.manifest)
        self.folders = _checkpoint_folders(self.todo, out, subfolder)  # CheckpointError (exit 2) before any training
        self.tracking = study.tracking if study.tracking.enabled else None
        self.live = False  # whether the pool's runs log their curves while they train (set by run)
        self.failed: list[tuple[str, str]] = []
        self.fatal: list[str] = []
        self.stopped: list[str] = []  # runs a SIGTERM stopped (core.preemption)
        self.elsewhere: list[str] = []
        self.locks: dict[str, RunLock] = {}
        self.bar: Any = None

    def run(self, open_pool: Callable[[int], Executor], how: str = "") -> int:
        """Announce the sweep, make the runs' inputs ready, train every pending run on ``open_pool(n)``."""
        self._announce(how)
        pool = open_pool(len(self.todo))
        if self.todo and self.task.before_runs is not None:  # tokenize a corpus once here, not in every worker
            for line in self.task.before_runs(self.todo, self.show):
                print(line, flush=True)
        self.live = pool.live_tracking
        self.bar = _bar(self.done + len(self.todo), self.done, self.show)
        if self.here and self.folders:  # some run checkpoints
            preemption.install()  # SIGTERM: the runs checkpoint at their next step and stop
        try:
            pool.map(self.jobs(), self.finished)
        finally:
            self.bar.close()
            for lock in self.locks.values():
                lock.release()
            sigterm = preemption.requested()
            preemption.reset()
        return self._stopped_by_sigterm() if sigterm else self._summary()

    def _announce(self, how: str) -> None:
        ids = {r.run_id for r in self.runs}
        others = [p for p in self.runs_dir.glob("*.json") if p.stem not in ids]
        if others:
            print(
                f"note: {len(others)} record(s) in {self.runs_dir} are not runs of this study (another config, or an "
                "older lnblocks whose run ids differ); they are left alone and not reported",
                file=sys.stderr,
            )
        total = self.done + len(self.todo)
        print(
            f"study {self.study.name!r}{how}: {total} runs, {self.done} already finished, {len(self.todo)} to run "
            f"-> {self.out}",
            flush=True,
        )
        note = orphans_note(self.out, orphans(study_bases(self.out, self.manifest), ids))
        if note is not None:
            print(note, file=sys.stderr, flush=True)
        if self.study.tracking.enabled and self.done:
            todo = {r.run_id for r in self.todo}
            for line in _curves_of_finished(self.study, self.task, self.out, self.runs_dir, self.runs, todo):
                print(line, file=sys.stderr, flush=True)

    def jobs(self) -> Iterator[Job]:
        """The pending runs as jobs, each once its lock is held; none more after a fatal error or a SIGTERM."""
        for run in self.todo:
            if self.fatal or preemption.requested():  # a full disk, or a SIGTERM: start nothing more
                return
            lock = RunLock(self.runs_dir, run.run_id)
            if not lock.acquire():
                self.elsewhere.append(run.run_id)
                self.bar.write(f"{run.run_id}: being trained by another runner on this folder; skipped")
                continue
            if check_record(self.runs_dir, run.run_id) is None:  # finished by another runner meanwhile
                lock.release()
                self.bar.update(1)
                continue
            self.locks[run.run_id] = lock
            folder = self.folders.get(run.run_id)
            tracking = self.tracking if self.live else None
            yield Job(self.study.task, run, self.show and self.live, tracking, str(self.out), folder and str(folder))

    def finished(self, job: Job, outcome: Outcome) -> None:
        """One run's outcome: its record written (its checkpoints removed, its curves replayed), or what went
        wrong; its lock released."""
        try:
            if outcome.record is not None:
                if not self._write(job, outcome.record):
                    return
                if job.checkpoint_dir is not None and not job.run.checkpoint.keep_finished:
                    remove_folder(Path(job.checkpoint_dir), job.run.checkpoint.dir)  # the record holds it all
                if self.tracking is not None and not self.live:
                    self.task.replay_curves(outcome.record, self.out, self.tracking)
                self.bar.write(self.task.outcome(outcome.record))
            elif outcome.fatal:
                self.fatal.append(f"run {job.run_id}: {outcome.error}")
                self.bar.write(f"{job.run_id}: FAILED: {outcome.error}")
            elif outcome.preempted:
                self.stopped.append(job.run_id)
                self.bar.write(f"{job.run_id}: {outcome.error}")
            elif outcome.lost and preemption.requested():  # its worker ended on the signal before a checkpoint
                self.bar.write(f"{job.run_id}: stopped by SIGTERM before its next checkpoint")
            else:
                self.failed.append((job.run_id, outcome.error or "unknown error"))
                self.bar.write(f"{job.run_id}: FAILED\n{outcome.error}")
        finally:
            self.locks.pop(job.run_id).release()
            self.bar.update(1)

    def _write(self, job: Job, record: Any) -> bool:
        """Write ``job``'s record; a write that fails (a full disk) is fatal: one line naming the file, no further
        run (its checkpoints, if any, are kept: the rerun resumes from them)."""
        try:
            write_record(record_path(self.runs_dir, job.run_id), record)
        except OSError as err:
            again = "resumes it from its newest checkpoint" if job.checkpoint_dir else "trains it again"
            line = f"run {job.run_id}: its record could not be written ({err}); free space (or fix the folder) and "
            self.fatal.append(f"{line}rerun the same command, which {again}")
            self.bar.write(f"{job.run_id}: FAILED: {err}")
            return False
        return True

    def _stopped_by_sigterm(self) -> int:
        left = sum(1 for r in self.todo if check_record(self.runs_dir, r.run_id) is not None)  # no record yet
        print(
            f"lnblocks: stopped by SIGTERM: {len(self.stopped)} run(s) checkpointed where they were, {left} without "
            "a record in all; rerun the same command to resume (no report was written)",
            file=sys.stderr,
        )
        return preemption.EXIT_CODE

    def _summary(self) -> int:
        for run_id, err in self.failed:
            last = err.strip().splitlines()[-1] if err.strip() else err
            print(f"run {run_id} failed: {last}; rerun the same command to retry it", file=sys.stderr)
        if self.elsewhere:
            print(
                f"{len(self.elsewhere)} run(s) were being trained by another runner on {self.out}; rebuild the report "
                f"with `lnblocks study report {self.out}` when it ends",
                file=sys.stderr,
            )
        for run_id in self.stopped:  # a SIGTERM to its worker, not to this runner: the sweep went on without it
            print(
                f"run {run_id} was stopped by a SIGTERM to its worker process and checkpointed there; rerun the same "
                "command to resume it",
                file=sys.stderr,
            )
        for line in self.fatal:
            sys.stderr.write(f"lnblocks: error: {line}\n")
        return EXIT_FATAL if self.fatal else EXIT_FAILED if self.failed or self.stopped else 0


def _curves_of_finished(
    study: StudyConfig, task: Task, out: Path, runs_dir: Path, runs: list[Any], todo: set[str]
) -> list[str]:
    """Tracking turned on for runs that finished without it: write their TensorBoard curves from their records
    (``task.replay_curves``: the points a live run logs); W&B runs are not replayed (each replay would be a new W&B
    run), which the returned lines say."""
    from lnblocks.study.core.tasks import read_record
    from lnblocks.study.core.tracking import TrackingConfig

    finished = [r.run_id for r in runs if r.run_id not in todo]
    lines = []
    if study.tracking.tensorboard:
        bare = [i for i in finished if not any((out / "tensorboard" / i).glob("events.out.tfevents.*"))]
        only_tb = TrackingConfig(tensorboard=True, flush_secs=study.tracking.flush_secs)
        for run_id in bare:
            task.replay_curves(read_record(record_path(runs_dir, run_id)), out, only_tb)  # type: ignore[misc]
        if bare:
            lines.append(
                f"tracking: wrote the TensorBoard curves of {len(bare)} run(s) that finished without tracking, from "
                f"their records, under {out / 'tensorboard'}"
            )
    if study.tracking.wandb and not (out / "wandb").exists():  # W&B newly turned on for this folder
        lines.append(
            f"note: tracking.wandb logs the runs trained from now on; the {len(finished)} that finished before are "
            "not sent to W&B (their curves are in their records, and in TensorBoard with tracking.tensorboard)"
        )
    return lines


def _checkpoint_folders(todo: list[Any], out: Path, subfolder: str | None) -> dict[str, Path]:
    """The checkpoint folder of every pending run that asks for checkpoints (``run.checkpoint``;
    ``core.checkpoint_folders``: ``subfolder`` is the study's own in a ``train.checkpoint.dir``), each checked to be
    writable and to hold no checkpoint of another config or lnblocks format (one of another world size or layout
    resumes, resharded)."""
    folders = {}
    for run in todo:
        cfg = getattr(run, "checkpoint", None)
        if cfg is not None:
            folder = checkpoint_folder(cfg.dir, out, run.run_id, subfolder)
            check_folder(folder, run.digest)
            folders[run.run_id] = folder
    return folders


def _bar(total: int, initial: int, show: bool) -> Any:
    from lnblocks._optional import require

    return require("tqdm").tqdm(
        total=total, initial=initial, desc="runs", position=0, disable=not show, dynamic_ncols=True
    )
