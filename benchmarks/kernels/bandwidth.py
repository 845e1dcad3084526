"""What a kernel's GB/s is compared with: a device copy that moves the same bytes, timed the same way.

A norm over a small tensor (1024 x 4096 bf16 is 8 MiB) fits in an H200's 50 MB L2, so unflushed repetitions could
read it from L2 above the HBM limit; and a small copy reaches less than a 1 GiB one (launch latency and the tail of
the grid weigh more). So every cell is quoted as a percentage of ``dst.copy_(src)`` moving the same number of bytes
(half read, half written), with the L2 flushed before every repetition of both (``benchmarks.common.timing``). What
can still come from L2 is marked: a forward+backward whose backward reads what its forward just wrote, and with the
flush off, any cell whose bytes fit in L2.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

COPY_DTYPE = torch.bfloat16
PEAK_COPY_BYTES = 2**30  # the ceiling quoted next to the table: a copy of 1 GiB (1 GiB read, 1 GiB written)


def copy_elements(nbytes: int, elem: int = COPY_DTYPE.itemsize) -> int:
    """Elements of a copy that moves ``nbytes`` (reads ``nbytes / 2``, writes as many), at least one."""
    return max(1, nbytes // (2 * elem))


def pct_of_copy(gbps: float, copy_gbps: float) -> float:
    """``gbps`` as a percentage of the copy's GB/s (both count the bytes moved, read + written)."""
    if copy_gbps <= 0:
        raise ValueError(f"copy_gbps must be positive, got {copy_gbps}")
    return 100.0 * gbps / copy_gbps


def l2_mark(pass_: str, nbytes: int, fwd_bytes: int, l2_bytes: int | None, flushed: bool) -> str:
    """Why a cell's bytes may not all come from HBM: "" (they do), "L2" (no flush, and the cell's bytes fit in L2,
    so the previous repetition's operands may still be there) or "L2 reuse" (a fwd+bwd cell whose forward's bytes fit
    in L2: its backward may read the saved input and statistics the forward has just written)."""
    if not l2_bytes:
        return ""  # CPU, or a device that reports no L2
    if not flushed and nbytes <= l2_bytes:
        return "L2"
    if pass_ == "fwd+bwd" and fwd_bytes <= l2_bytes:
        return "L2 reuse"
    return ""


class CopyBaseline:
    """GB/s of ``dst.copy_(src)`` moving a given number of bytes, measured once per size with the timer the kernels
    use (CUDA events, L2 flushed before each repetition) and cached."""

    def __init__(self, device: torch.device, timer: Callable[[Callable[[], object]], float]) -> None:
        self.device, self.timer = device, timer
        self.measured: dict[int, float] = {}  # bytes moved -> GB/s

    def gbps(self, nbytes: int) -> float:
        elements = copy_elements(nbytes)
        moved = 2 * elements * COPY_DTYPE.itemsize
        if moved not in self.measured:
            src = torch.empty(elements, dtype=COPY_DTYPE, device=self.device).normal_()
            dst = torch.empty_like(src)
            self.measured[moved] = moved / self.timer(lambda: dst.copy_(src)) / 1e9
            del src, dst
        return self.measured[moved]
