"""A study under ``torchrun``: every run of an ``lm`` study trains with DistributedDataParallel over the ranks
(gloo on CPU, nccl on GPU); rank 0 decides what is left to run, writes the records and builds the report."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from lnblocks.study.grid import StudyConfig
from lnblocks.study.records import write_record
from lnblocks.study.runner import _prepare, pending_runs, record_path
from lnblocks.study.train import DistContext, train_run


def dist_from_env() -> DistContext:
    """The ``torchrun`` rank/world size from the environment (world size 1 when not launched by torchrun)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return DistContext(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))


def run_distributed(study: StudyConfig, out: Path, show: bool, report: bool) -> int:
    """Train every unfinished run of ``study`` with DDP over this ``torchrun`` job's ranks."""
    import torch.distributed as td

    from lnblocks.study.lm import outcome

    if study.task != "lm":
        raise ValueError(f"torchrun (DDP) runs lm studies only; this study's task is {study.task!r}")
    dist = dist_from_env()
    use_cuda = torch.cuda.is_available() and study.runs()[0].train.device != "cpu"
    if not td.is_initialized():
        td.init_process_group("nccl" if use_cuda else "gloo")
    if use_cuda:
        torch.cuda.set_device(dist.local_rank)
    torch.set_flush_denormal(True)
    try:
        payload: list[Any] = [None]
        if dist.is_main:
            runs_dir = _prepare(study, out)
            todo, done, _ = pending_runs(study, runs_dir)
            print(
                f"study {study.name!r} with DDP over {dist.world_size} ranks ({td.get_backend()}): "
                f"{done + len(todo)} runs, {done} already finished, {len(todo)} to run -> {out}",
                flush=True,
            )
            payload = [[r.run_id for r in todo]]
        td.broadcast_object_list(payload, src=0)
        by_id = {r.run_id: r for r in study.runs()}
        for run_id in payload[0]:
            run = by_id[run_id]
            torch.set_num_threads(run.threads)
            rec = train_run(run, dist=dist, show_progress=show)
            if dist.is_main:
                write_record(record_path(out / "runs", run_id), rec)
                if study.tracking.enabled:
                    from lnblocks.study.tracking import replay

                    replay(rec, out, study.tracking)
                print(outcome(rec), flush=True)
            td.barrier()
        code = 0
        if report and dist.is_main:
            from lnblocks.study.report import build_report

            code = build_report(out)
        td.barrier()
        return code
    finally:
        td.destroy_process_group()
