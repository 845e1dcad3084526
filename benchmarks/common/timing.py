"""The GPU benchmarks' clock: median seconds of ``fn()`` after warm-up, from CUDA events on GPU (optionally with the
L2 cache flushed before each repetition, so a kernel cannot read its operands from a previous run's cache) or
``time.perf_counter`` on CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


class Timer:
    """Median seconds of ``fn()`` over ``reps`` repetitions after ``warmup`` untimed calls. On CUDA, each repetition is
    timed with CUDA events, after zeroing a 256 MiB buffer (larger than the L2 cache) when ``flush_l2``."""

    def __init__(self, device: torch.device, reps: int, warmup: int, flush_l2: bool = True) -> None:
        self.device, self.reps, self.warmup = device, reps, warmup
        cuda = device.type == "cuda"
        self.flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device) if cuda and flush_l2 else None

    def __call__(self, fn: Callable[[], object]) -> float:
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.reps):
            if self.device.type != "cuda":
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
                continue
            if self.flush is not None:
                self.flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)
