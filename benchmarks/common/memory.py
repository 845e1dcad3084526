"""Peak memory of one call, from the allocator's own events (torch's profiler), for the CPU benchmarks that compare
what a computation holds at its peak (the LM head and loss in chunks, the study's step)."""

from __future__ import annotations

from collections.abc import Callable

from torch.profiler import ProfilerActivity, profile


def peak_extra_mib(fn: Callable[[], None], keep_bytes: int) -> float:
    """MiB the allocator held at its peak during ``fn()`` above what it held before, less ``keep_bytes``."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    now = peak = 0
    for e in events:
        now += e.nbytes()
        peak = max(peak, now)
    return (peak - keep_bytes) / 2**20
