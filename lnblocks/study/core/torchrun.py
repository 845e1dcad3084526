"""The torchrun executor: a study launched by ``torchrun`` (``WORLD_SIZE`` > 1) trains every run with
DistributedDataParallel over all the ranks (gloo on CPU, nccl on GPU), or sharded as the run's ``parallel`` says
(the lm task's ``train.parallel``: FSDP2 and tensor parallelism).

Rank 0 is the driver: it runs the study's one run loop (``core.runner``) and hands each job to every rank with
``broadcast_object_list``, trains its own share, and writes the record; the other ranks only ``serve``: train each
job they are handed until the driver says there is no more. Only a task that declares ``ddp=True`` runs here; its
``train`` reads the rank from ``RunContext.dist``.

A run that raises ends the whole torchrun job (DDP cannot go on with one rank out of step), so nothing here turns an
exception into a failed record, and an error on one rank must never leave the others waiting (gloo waits 30 minutes
in a collective whose peer went elsewhere). The driver stopping before or between jobs tells the other ranks, which
wait for the next job, that none follows (they end with status 0). Any other error (one rank's own data, a bad
environment variable on one node, an out-of-memory on one GPU) is posted to the job's store under this process
group's token, the process group is dropped without a barrier, and the error ends that rank's process: its
collectives' peers then fail at once (a closed connection; under torchrun, the agent also stops every rank once one
exits with an error), and each of them, finding the posted message, stops with one line naming the rank and its
error (``RankFailed``) instead of its own collective's failure.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from typing import Any

from lnblocks.study.core.dist import DistContext
from lnblocks.study.core.executors import Job, Outcome, train_job
from lnblocks.study.core.tasks import Task, get_task, task_names


def dist_from_env() -> DistContext:
    """The ``torchrun`` rank/world size from the environment (world size 1 when not launched by torchrun)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return DistContext(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))


def launched_by_torchrun() -> bool:
    return dist_from_env().enabled


def same_runs_on_every_rank(runs: list[Any]) -> None:
    """``ValueError`` on every rank unless every rank resolved the same runs (each run's every field, execution keys
    included): the driver hands out rank 0's runs, so ranks launched with other ``--set`` values or study files would
    otherwise train rank 0's config without a word, or wait in other collectives. One small ``all_gather_object`` of
    a digest per run; on a difference, a second one of the first differing run's fields, to name the key."""
    import dataclasses
    import hashlib

    import torch.distributed as td

    from lnblocks.rank_agreement import check_ranks_agree, flatten

    def fields(run: Any) -> dict[str, Any]:
        return dataclasses.asdict(run) if dataclasses.is_dataclass(run) else {"run": run}

    digests = [hashlib.sha256(repr(sorted(flatten(fields(r)).items())).encode()).hexdigest()[:16] for r in runs]
    gathered: list[Any] = [None] * td.get_world_size()
    td.all_gather_object(gathered, digests)
    if any(len(d) != len(digests) for d in gathered):
        counts = ", ".join(f"rank {r}: {len(d)}" for r, d in enumerate(gathered))
        raise ValueError(f"the ranks disagree on the study: {counts} runs; launch every rank with the same command")
    differing = [i for i in range(len(digests)) if len({d[i] for d in gathered}) > 1]
    if differing:
        i = differing[0]
        check_ranks_agree(f"run {i + 1} of {len(runs)} of the study", fields(runs[i]))


FAILURE_WAIT_S = 2.0  # how long a failing rank waits to see whether every rank failed with it


class RankFailed(ValueError):
    """Another rank of the torchrun job stopped with an error, so this one stops too; the message is that rank's
    error in one line (a ``ValueError``: one line and exit status 2 from the CLI, as the error it reports)."""


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:2000] or type(err).__name__


class TorchrunExecutor:
    """Every job trains on all ranks of this torchrun job; ``run``: a run of the study, whose ``device``
    (``"cpu"``, ``"cuda"``, ``"auto"``) picks the backend: gloo for ``"cpu"`` or without CUDA, else nccl."""

    live_tracking = False  # the driver writes curves from each record (the task's replay_curves)

    def __init__(self, task: Task, run: Any, runs: list[Any] | None = None) -> None:
        import torch
        import torch.distributed as td

        if not task.ddp:
            ddp = [n for n in task_names() if get_task(n).ddp]
            raise ValueError(f"torchrun (DDP) runs studies of the tasks {ddp}; this study's task is {task.name!r}")
        self.dist = dist_from_env()
        use_cuda = torch.cuda.is_available() and run.device != "cpu"
        if not td.is_initialized():
            td.init_process_group("nccl" if use_cuda else "gloo")
        if use_cuda:
            torch.cuda.set_device(self.dist.local_rank)
        self.backend = td.get_backend()
        self.run = run
        self._ended = False  # the driver has told the other ranks that no job follows
        self._in_job = False  # the driver is training a job (the other ranks may be anywhere inside it)
        self._aborted = False  # this rank left the process group without a barrier (an error)
        self._store = self._failure_store()
        if runs is not None:
            try:
                same_runs_on_every_rank(runs)
            except ValueError:
                td.destroy_process_group()  # every rank raised the same error: none waits for another
                raise

    @property
    def is_driver(self) -> bool:
        return self.dist.is_main

    def describe(self) -> str:
        if getattr(self.run, "parallel", None) is not None:
            return f"train.parallel {self.run.parallel.to_dict()} over {self.dist.world_size} ranks ({self.backend})"
        return f"DDP over {self.dist.world_size} ranks ({self.backend})"

    def _next(self, job: Job | None) -> Job | None:
        """The job rank 0 hands out (None: no more), the same on every rank."""
        import torch.distributed as td

        payload: list[Any] = [job]
        td.broadcast_object_list(payload, src=0)
        return payload[0]

    def map(self, jobs: Iterator[Job], on_result: Callable[[Job, Outcome], None]) -> None:
        """The driver's side: hand every job to all ranks, train it here too, report its record."""
        for job in jobs:
            self._next(job)
            self._in_job = True
            try:
                record = train_job(job, dist=self.dist)
            except BaseException:  # the other ranks may be anywhere in this job: ``failed`` leaves without them
                self._ended = True
                raise
            self._in_job = False
            on_result(job, Outcome(record=record))
        self._next(None)
        self._ended = True

    def serve(self) -> None:
        """The other ranks' side: train every job the driver hands out, until it says there is no more."""
        while (job := self._next(None)) is not None:
            train_job(job, dist=self.dist)

    # -- an error on one rank
    def _failure_store(self) -> Any:
        """The job's key-value store under a token of this process group (rank 0's, broadcast: a restarted job or a
        second study in one process starts clean), where a failing rank posts its error; None without one."""
        import uuid

        import torch.distributed as td

        box = [uuid.uuid4().hex if self.is_driver else None]
        td.broadcast_object_list(box, src=0)
        try:
            store = td.distributed_c10d._get_default_store()  # the store the process group was made with
        except (AttributeError, RuntimeError, ValueError):  # no such store: errors are not relayed
            return None
        return td.PrefixStore(f"lnblocks/{box[0]}/", store)

    def _posted(self) -> tuple[int, str] | None:
        """The first other rank that posted an error of its own, and its message (None: none did)."""
        if self._store is None:
            return None
        for rank in range(self.dist.world_size):
            key = f"failed/{rank}"
            if rank != self.dist.rank and self._store.check([key]):
                kind, _, message = self._store.get(key).decode("utf-8", "replace").partition("\t")
                if kind == "own":
                    return rank, message
        return None

    def _post(self, err: BaseException, own: bool) -> None:
        """Post this rank's error (``own``: its own, not another rank's seen through a collective) and, for its own,
        wait up to ``FAILURE_WAIT_S`` for every other rank's: ranks that all fail at one check (a refused input)
        each print their line before any leaves, while a rank that fails alone waits that long for nothing."""
        import time

        if self._store is None:
            return
        try:
            self._store.set(f"failed/{self.dist.rank}", f"{'own' if own else 'via'}\t{_one_line(err)}")
            others = [f"failed/{r}" for r in range(self.dist.world_size) if r != self.dist.rank]
            deadline = time.monotonic() + FAILURE_WAIT_S
            while own and time.monotonic() < deadline and not self._store.check(others):
                time.sleep(0.05)
        except Exception:  # the store is gone too: the others see the closed connection
            pass

    def failed(self, err: BaseException) -> BaseException:
        """What this rank raises after ``err`` escaped the study: ``RankFailed`` when another rank's error caused
        it (posted before that rank left), else ``err`` itself, posted for the others first. The driver stopping
        outside a job keeps the process group: ``close`` tells the other ranks, waiting for a job, that none
        follows. Otherwise this rank leaves the process group without a barrier (see the module docstring)."""
        import torch.distributed as td

        other = self._posted()
        if other is None and self.is_driver and not self._in_job and not self._aborted:
            return err
        if not self._aborted:
            self._post(err, own=other is None)
        self._aborted = True
        if td.is_initialized():
            td.destroy_process_group()  # no barrier: the others are elsewhere
        if other is None:
            return err
        rank, message = other
        return RankFailed(f"rank {rank} of {self.dist.world_size} stopped with an error, so this rank stops: {message}")

    def close(self) -> None:
        import torch.distributed as td

        if self._aborted or not td.is_initialized():
            return
        try:
            if self.is_driver and not self._ended:  # the driver stopped outside a job: the others wait for one
                self._next(None)
                self._ended = True
            # free the runs' models and optimizers (reference cycles) while the interpreter is alive; DTensor's
            # caches still hold a sharded run's mesh and its gloo groups, so a rank must also end without the
            # interpreter's teardown (lnblocks.process_exit: the lnblocks command does, a script calls exit_rank)
            gc.collect()
            td.barrier()  # the driver may still be writing its report
        except Exception as err:  # a rank that failed meanwhile (its connection closed)
            self._in_job = True  # whatever the others were doing: leave without them
            raised = self.failed(err)
            if raised is err:
                raise
            raise raised from err
        td.destroy_process_group()
