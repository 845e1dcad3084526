"""Where runs train: an ``Executor`` takes jobs one at a time and reports each one's outcome.

- ``SerialExecutor``: in this process, one run after the other.
- ``LocalProcessExecutor``: ``workers`` spawned processes, each fed through its own pipe and watched by its process
  sentinel, so a worker that dies (OOM killer, ``kill -9``) is noticed at once: its run is reported as lost, a new
  worker takes its place, and the sweep goes on. No shared queue or Manager process that a death could wedge.
  Workers die with the runner (``PR_SET_PDEATHSIG`` on Linux, and a parent-pid watchdog everywhere). They start
  with SIGINT ignored: a Ctrl-C reaches the whole process group, and only the runner handles it (it stops the
  workers at once and says so in one line), so no worker prints a traceback.

Every executor trains a run with ``train_job``: the run's own pinned thread count (``run.threads``) and
flush-to-zero for denormals, so a record does not depend on which executor or how many workers trained it. The Ray
executor (one task per run, ``lnblocks.study.core.ray_executor``) and the torchrun executor (every run with DDP over
the ranks, ``lnblocks.study.core.torchrun``) have the same interface: ``map(jobs, on_result)``.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Protocol

from lnblocks.study.core import preemption
from lnblocks.study.core.dist import DistContext
from lnblocks.study.core.records import RunRecord
from lnblocks.study.core.tasks import RunContext, get_task

MAX_STARTUP_FAILURES = 3


@dataclass(frozen=True)
class Job:
    """One run to train: the task's name and its run config (picklable), whether to draw a step bar, where its
    curves go while it trains (``tracking``: a ``TrackingConfig`` that is on, with the study's ``out_dir``), and the
    absolute folder of its checkpoints (``checkpoint_dir``, when the run asks for them: ``run.checkpoint``).

    ``call``: other work of the task for the same workers (the report's init profiles): a module-level function
    (picklable by reference) called as ``call(run, ctx)`` instead of the task's ``train``; ``run`` then only needs
    ``run_id`` and ``threads``, and the outcome carries what it returned in ``value``."""

    task: str
    run: Any
    show: bool = False
    tracking: Any = None
    out_dir: str | None = None
    checkpoint_dir: str | None = None
    call: Callable[[Any, RunContext], Any] | None = None

    @property
    def run_id(self) -> str:
        return self.run.run_id


@dataclass(frozen=True)
class Outcome:
    """What came back for a job: its record (``value``: a ``Job.call``'s result), or an error message (``lost``: the
    process training it died; ``fatal``: its checkpoints could not be written, a one-line message: no further run
    should start; ``preempted``: it stopped on SIGTERM after a checkpoint, ``core.preemption``)."""

    record: RunRecord | None = None
    error: str | None = None
    lost: bool = False
    preempted: bool = False
    value: Any = None
    fatal: bool = False


class Executor(Protocol):
    live_tracking: bool  # True: runs write their curves while they train; False: the driver replays each record

    def map(self, jobs: Iterator[Job], on_result: Callable[[Job, Outcome], None]) -> None:
        """Train every job ``jobs`` yields (pulled one at a time, when a slot is free) and call ``on_result`` in
        the calling process as each one ends."""


def train_job(job: Job, position: int = 0, dist: DistContext | None = None) -> Any:
    """Train ``job`` in this process with its task's ``train`` (or run its ``call``), its pinned thread count and
    flush-to-zero; the process's thread count and denormal mode are restored afterwards."""
    import torch

    from lnblocks.study.core.allocator import tune_allocator

    dist = dist or DistContext()
    checkpoints = None
    if job.checkpoint_dir is not None:
        from lnblocks.study.core.checkpoint import Checkpoints

        parallel = getattr(job.run, "parallel", None)  # a sharded run's layout (as the torchrun executor reads it)
        layout = parallel.to_dict() if parallel is not None else None
        checkpoints = Checkpoints(job.checkpoint_dir, job.run.checkpoint, job.run.digest, dist, layout)
    ctx = RunContext(job.show, position, job.out_dir, job.tracking, dist, checkpoints)
    threads = torch.get_num_threads()
    tune_allocator()  # glibc keeps the step's big buffers instead of re-faulting them (docs/cluster.md)
    torch.set_flush_denormal(True)  # denormals can make a sweep several times slower on CPU
    try:
        torch.set_num_threads(job.run.threads)
        if job.call is not None:
            return job.call(job.run, ctx)
        with _tracker(job, dist) as tracker:  # the run's curves, live
            return get_task(job.task).train(job.run, dataclasses.replace(ctx, tracker=tracker))
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)  # torch's default: leave the process as it was


def _tracker(job: Job, dist: DistContext) -> contextlib.AbstractContextManager[Any]:
    """The tracker a run logs its curves to while it trains (rank 0, when the job carries ``tracking``), else
    nothing."""
    if job.tracking is None or job.out_dir is None or not dist.is_main:
        return contextlib.nullcontext(None)
    from lnblocks.study.core.tracking import open_tracker

    return open_tracker(job.tracking, job.out_dir, job.run_id, job.run.to_dict())


def execute(job: Job, position: int = 0) -> Outcome:
    """``train_job``, with an exception turned into an error outcome (the other runs of the sweep go on)."""
    from lnblocks.study.core.checkpoint import CheckpointError

    try:
        out = train_job(job, position)
    except CheckpointError as err:  # a full disk or a folder that went away: one line, and stop the sweep
        return Outcome(error=str(err), fatal=True)
    except preemption.Preempted as err:  # SIGTERM: checkpointed, to be resumed by the next runner
        return Outcome(error=str(err), preempted=True)
    except Exception:  # a bug or a config the model rejects: report it, keep the other runs going
        return Outcome(error=traceback.format_exc())
    return Outcome(record=out) if job.call is None else Outcome(value=out)


class SerialExecutor:
    """Train the jobs one by one in this process."""

    live_tracking = True  # a run's curves are written while it trains (the job carries the tracking section)

    def map(self, jobs: Iterator[Job], on_result: Callable[[Job, Outcome], None]) -> None:
        for job in jobs:
            on_result(job, execute(job, position=1))


# ---- worker processes ------------------------------------------------------------------------------------------


def _die_with_parent(parent_pid: int) -> None:
    """Make this process end when ``parent_pid`` does (also when the parent is killed with SIGKILL)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)

    def watchdog() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watchdog, daemon=True, name="lnblocks-parent-watchdog").start()


def _worker_main(conn: Any, parent_pid: int, position: int) -> None:
    """A pool worker: train each job the runner sends until it sends None. A SIGTERM (from Slurm, forwarded by the
    runner, or sent to this worker alone) stops it: a run that checkpoints writes one at its next step and stops,
    and the worker then exits instead of taking another job (whose run would stop at its first step); idle, or
    training a run without checkpoints, it exits at once. The runner replaces a worker that exits, unless it is
    stopping itself."""
    _die_with_parent(parent_pid)
    preemption.install()
    now: dict[str, Any] = {"phase": "wait", "job": None}  # waiting for a job, training one, or sending its outcome

    def end_unless_checkpointing() -> None:
        if now["phase"] == "wait" or (now["phase"] == "train" and now["job"].checkpoint_dir is None):
            raise SystemExit(preemption.EXIT_CODE)  # nothing to save: the signal's default meaning

    preemption.on_sigterm(end_unless_checkpointing)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        now.update(phase="train", job=job)
        outcome = execute(job, position)
        now["phase"] = "send"  # a message cut in half would be worse than a late stop
        if preemption.requested():  # asked to stop: its run checkpointed and stopped; it takes no other job
            conn.send(("last", outcome))  # the runner hands this worker nothing more and replaces it
            return
        conn.send(("done", outcome))
        now.update(phase="wait", job=None)


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


@dataclass
class _Worker:
    proc: Any
    conn: Any
    position: int
    ready: bool = False
    job: Job | None = None
    ending: bool = False  # it sent its last outcome and exits (it was asked to stop)


class LocalProcessExecutor:
    """``workers`` spawned processes on this machine, supervised one by one (see the module docstring)."""

    live_tracking = True

    def __init__(self, workers: int) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        self.workers = workers
        self._ctx = mp.get_context("spawn")

    def _start(self, position: int) -> _Worker:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_worker_main, args=(child, os.getpid(), position), daemon=True, name=f"lnblocks-worker-{position}"
        )
        with _sigint_ignored():  # inherited by the child from its first instruction: Ctrl-C is the runner's
            proc.start()
        child.close()
        return _Worker(proc, parent, position)

    def map(self, jobs: Iterator[Job], on_result: Callable[[Job, Outcome], None]) -> None:
        pool = [self._start(i + 1) for i in range(self.workers)]
        startup_failures = 0
        exhausted = False
        interrupted = False
        # a SIGTERM here (core.preemption) reaches the busy workers, which checkpoint and stop
        unforward = preemption.forward_to(lambda: [w.proc.pid for w in pool if w.job is not None])
        try:
            while True:
                for w in pool:  # hand out work to idle, started workers
                    if w.ready and w.job is None and not exhausted:
                        w.job = next(jobs, None)
                        if w.job is None:
                            exhausted = True
                        else:
                            w.conn.send(w.job)
                if exhausted and all(w.job is None for w in pool):
                    return
                waiting = [w.conn for w in pool] + [w.proc.sentinel for w in pool]
                wait(waiting)
                for i, w in enumerate(pool):
                    self._drain(w, on_result)
                    if w.proc.is_alive():
                        continue
                    self._drain(w, on_result)  # a last message sent just before it exited
                    w.proc.join()
                    if w.job is not None:
                        on_result(
                            w.job,
                            Outcome(
                                error=f"the worker process (pid {w.proc.pid}) training it died "
                                f"({describe_exit(w.proc.exitcode)}; out of memory or killed)",
                                lost=True,
                            ),
                        )
                        w.job = None
                    elif not w.ready and not w.ending:
                        startup_failures += 1
                        if startup_failures >= MAX_STARTUP_FAILURES:
                            raise RuntimeError(
                                f"{startup_failures} worker processes died while starting "
                                f"({describe_exit(w.proc.exitcode)}); try --workers 1 to see the error"
                            )
                    w.conn.close()
                    pool[i] = None if preemption.requested() else self._start(w.position)  # stopping: not replaced
                if None in pool:
                    pool[:] = [w for w in pool if w is not None]
                    exhausted = True
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            unforward()
            self._shutdown(pool, at_once=interrupted)

    @staticmethod
    def _drain(w: _Worker, on_result: Callable[[Job, Outcome], None]) -> None:
        try:
            while w.conn.poll():
                kind, payload = w.conn.recv()
                if kind == "ready":
                    w.ready = True
                elif kind in ("done", "last") and w.job is not None:
                    if kind == "last":  # the worker exits now: no job for it
                        w.ready, w.ending = False, True
                    job, w.job = w.job, None
                    on_result(job, payload)
        except (EOFError, OSError):
            pass

    @staticmethod
    def _shutdown(pool: list[_Worker], at_once: bool = False) -> None:
        """Stop the workers: idle ones are told to exit; busy ones (the runner is being interrupted) are killed,
        after 5 s, or ``at_once`` (a Ctrl-C: their runs are redone by the next runner)."""
        for w in pool:
            try:
                if w.proc.is_alive() and w.job is None:
                    w.conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + (0.0 if at_once else 5.0)
        for w in pool:
            w.proc.join(max(0.0, deadline - time.monotonic()))
            if w.proc.is_alive():  # still training (the runner is being interrupted)
                w.proc.kill()
                w.proc.join()
            w.conn.close()


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored in this process while the block runs (what a child started in it inherits); a no-op off
    the main thread, where signal handlers cannot be changed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def make_executor(workers: int) -> Executor:
    """``SerialExecutor`` for one worker, ``LocalProcessExecutor`` for more."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    return SerialExecutor() if workers == 1 else LocalProcessExecutor(workers)
