"""The GPU benchmarks' clock: median seconds of ``fn()`` after warm-up, from CUDA events on GPU (optionally with the
L2 cache flushed before each repetition, so a kernel cannot read its operands from a previous run's cache) or
``time.perf_counter`` on CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

FLUSH_MIN_BYTES = 256 * 2**20  # 5x the 50 MB L2 of an H100/H200


def flush_bytes(l2_bytes: int | None) -> int:
    """Bytes written between timed calls to evict what the previous call left in L2: 256 MiB, or 4x the L2 where
    that is larger (a write of the whole buffer leaves none of the kernel's operands resident)."""
    return max(FLUSH_MIN_BYTES, 4 * (l2_bytes or 0))


def l2_cache_bytes(device: torch.device) -> int | None:
    """The device's L2 size in bytes (None on CPU, or where torch does not report it)."""
    if device.type != "cuda":
        return None
    return getattr(torch.cuda.get_device_properties(device), "L2_cache_size", None) or None


class Timer:
    """Median seconds of ``fn()`` over ``reps`` repetitions after ``warmup`` untimed calls. On CUDA, each repetition is
    timed with CUDA events, after zeroing a buffer larger than the L2 cache (``flush_bytes``) when ``flush_l2``: the
    write is outside the timed region, as ``triton.testing.do_bench`` does it, and no CUDA graph is involved."""

    def __init__(self, device: torch.device, reps: int, warmup: int, flush_l2: bool = True) -> None:
        self.device, self.reps, self.warmup = device, reps, warmup
        cuda = device.type == "cuda"
        self.l2_bytes = l2_cache_bytes(device)
        size = flush_bytes(self.l2_bytes)
        self.flush = torch.empty(size, dtype=torch.int8, device=device) if cuda and flush_l2 else None

    @property
    def flushes(self) -> bool:
        """Whether every timed call starts with a cold L2 (only on CUDA, with ``flush_l2``)."""
        return self.flush is not None

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
