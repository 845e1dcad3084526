"""The torchrun executor: a study launched by ``torchrun`` (``WORLD_SIZE`` > 1) trains every run with
DistributedDataParallel over all the ranks (gloo on CPU, nccl on GPU), or sharded as the run's ``parallel`` says
(the lm task's ``train.parallel``: FSDP2 and tensor parallelism).

Rank 0 is the driver: it runs the study's one run loop (``core.runner``) and hands each job to every rank with
``broadcast_object_list``, trains its own share, and writes the record; the other ranks only ``serve``: train each
job they are handed until the driver says there is no more. A run that raises ends the whole torchrun job (DDP
cannot go on with one rank out of step), so nothing here turns an exception into a failed record. Only a task
that declares ``ddp=True`` runs here; its ``train`` reads the rank from ``RunContext.dist``.
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

    from lnblocks.models.parallel.agreement import check_ranks_agree, flatten

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
            try:
                record = train_job(job, dist=self.dist)
            except BaseException:  # every rank raised it (a check all ranks make): none waits for another job
                self._ended = True
                raise
            on_result(job, Outcome(record=record))
        self._next(None)
        self._ended = True

    def serve(self) -> None:
        """The other ranks' side: train every job the driver hands out, until it says there is no more."""
        while (job := self._next(None)) is not None:
            train_job(job, dist=self.dist)

    def close(self) -> None:
        import torch.distributed as td

        if td.is_initialized():
            if self.is_driver and not self._ended:  # the driver stopped before handing out jobs (a refused input)
                self._next(None)
                self._ended = True
            # free what still references the runs' sub-groups (a sharded run's mesh, model, optimizer: reference
            # cycles) while the interpreter is alive: gloo work objects destroyed during interpreter teardown can
            # abort the process (pytorch PR 179291 describes it)
            gc.collect()
            td.barrier()  # the driver may still be writing its report
            td.destroy_process_group()
