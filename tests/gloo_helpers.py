"""Run a check in two (or more) CPU processes joined by a gloo process group, for tests of distributed code."""

from __future__ import annotations

import datetime
import socket
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lnblocks.process_exit import exit_process


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, port: int, world: int, check: Callable[[int], None]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=datetime.timedelta(60)
    )
    try:
        check(rank)
    finally:
        dist.destroy_process_group()
    exit_process(0)  # no interpreter teardown, where gloo can abort a finished rank (lnblocks.process_exit)


def run_gloo(check: Callable[[int], None], world: int = 2) -> None:
    """``check(rank)`` in ``world`` spawned processes inside one gloo group; ``check`` must be a module-level
    function (it is pickled by name). A failing rank fails the call with its traceback."""
    mp.spawn(_entry, args=(free_port(), world, check), nprocs=world, join=True)
