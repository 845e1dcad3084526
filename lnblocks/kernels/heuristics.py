"""Launch configurations: block shapes, warps and backward grid size, picked from N alone (never autotuned on M).

Autotuning keyed on the row count recompiles on every new batch shape (fla#533), and a ``tl.constexpr`` that changes
with M does the same (Liger's ``rows_per_program``); so every choice here is a function of the hidden size N, the
element size and the device's SM count. Nothing here imports triton or touches CUDA at import time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

# Rows up to this many elements are held in registers in one block; larger rows loop over chunks. At 16384 (32 warps,
# 64 registers per thread) ptxas for sm_90 spills 0-16 bytes in the forward, 8 bytes in the RMSNorm backward and
# ~170 bytes in the LayerNorm backward (its dB accumulator); measured with ``lnblocks.kernels.aot``. Which of single
# block and looped is faster at N = 16384 is for the GPU benchmark (``--variants``) to settle.
MAX_FWD_BLOCK = 16384
MAX_BWD_BLOCK = 16384
# Chunk width of the looped (N > MAX_*_BLOCK) path: each chunk is one block of the single-block kernel.
LOOP_BLOCK = 4096
# Forward rows per program for small N: keep at least this many elements per program.
TILE_ELEMENTS = 2048
# SM count used on CPU (interpreter): any small constant works; 4 makes "programs that own no rows" easy to reach.
CPU_SM_COUNT = 4


@dataclass(frozen=True)
class LaunchConfig:
    """One kernel launch shape: a (block_m, block_n) tile per step, looped over the row when not ``single_block``."""

    block_m: int
    block_n: int
    num_warps: int
    single_block: bool


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _warps(elements: int, per_thread: int) -> int:
    """Warps so that each thread holds about ``per_thread`` elements of the tile (1 to 32 warps)."""
    return max(1, min(32, next_power_of_2(max(1, elements // (32 * per_thread)))))


def _limit(default: int, max_block_n: int | None) -> int:
    if max_block_n is None or max_block_n <= 0:
        return default
    if max_block_n & (max_block_n - 1):
        raise ValueError(f"max_block_n must be a power of two, got {max_block_n}")
    return max_block_n


def fwd_config(n: int, max_block_n: int | None = None) -> LaunchConfig:
    """Forward tile for hidden size ``n``: whole rows (several per program when N is small), else looped chunks."""
    limit = _limit(MAX_FWD_BLOCK, max_block_n)
    block_n = max(16, next_power_of_2(n))
    if block_n > limit:
        chunk = min(LOOP_BLOCK, limit)
        return LaunchConfig(1, chunk, _warps(chunk, 8), single_block=False)
    block_m = max(1, min(64, TILE_ELEMENTS // block_n))
    return LaunchConfig(block_m, block_n, _warps(block_m * block_n, 8), single_block=True)


def bwd_config(n: int, max_block_n: int | None = None) -> LaunchConfig:
    """Backward tile: fewer elements per thread than the forward (dy, x, w and the dW/dB accumulators are live)."""
    limit = _limit(MAX_BWD_BLOCK, max_block_n)
    block_n = max(16, next_power_of_2(n))
    if block_n > limit:
        chunk = min(LOOP_BLOCK, limit)
        return LaunchConfig(1, chunk, _warps(chunk, 8), single_block=False)
    block_m = max(1, min(16, TILE_ELEMENTS // block_n))
    return LaunchConfig(block_m, block_n, _warps(block_m * block_n, 8), single_block=True)


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (queried once per device, never at import); a constant on CPU."""
    if device.type != "cuda":
        return CPU_SM_COUNT
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_sm_count(index)


def bwd_grid(m: int, cfg: LaunchConfig, device: torch.device) -> tuple[int, int]:
    """``(programs, rows_per_program)`` of the persistent backward.

    Each program owns ``rows_per_program`` consecutive rows and writes one fp32 partial row of dW (and dB); the
    partials are summed afterwards in a fixed order (deterministic, no atomics: Liger#815 -> #945). Several programs
    per SM for narrow rows keep enough warps resident; the partial traffic ``2 * programs * N * 4`` bytes stays a few
    percent of the backward's ``6 * M * N`` (bf16). The last programs may own no rows: they still write zeros.
    """
    per_sm = max(1, 32 // cfg.num_warps) if device.type == "cuda" else 1
    programs = max(1, min(sm_count(device) * per_sm, m))
    rows_per_program = -(-m // programs) if m > 0 else 1
    return programs, rows_per_program
