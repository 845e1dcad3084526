"""Launch configurations: block shapes, warps and backward grid size, picked from N alone (never autotuned on M).

Autotuning keyed on the row count recompiles on every new batch shape (fla#533), and a ``tl.constexpr`` that changes
with M does the same (Liger's ``rows_per_program``); so every choice here is a function of the hidden size N, the
element size and the device's SM count. Nothing here imports triton or touches CUDA at import time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

# Tile sizes, chosen with benchmarks/kernel_resources.py (every configuration compiled for sm_80 and sm_90; the table
# is in benchmarks/README.md). A thread holds about ELEMENTS_PER_THREAD elements of each live array of a tile; at 32
# warps ptxas caps a thread at 64 registers, which a whole row of 16384 (16 elements per thread and array) overflows:
# 88-784 bytes of spills, the worst in the backward with dropout, whose Philox rounds need registers of their own.
# So rows wider than MAX_FWD_BLOCK / MAX_BWD_BLOCK (MAX_BWD_BLOCK_DROPOUT with dropout) loop over LOOP_BLOCK chunks.
MAX_FWD_BLOCK = 8192
MAX_BWD_BLOCK = 8192
MAX_BWD_BLOCK_DROPOUT = 2048
LOOP_BLOCK = 4096
ELEMENTS_PER_THREAD = 8
BWD_ELEMENTS_PER_THREAD = 4
MAX_WARPS = 32
REGISTERS_PER_SM = 65536  # sm_80 and sm_90
# Register budget of a thread (ptxas's maxnreg): 16 resident warps per SM (a quarter of sm_80/sm_90's 64) at most.
MAX_REGISTERS = 128
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

    @property
    def max_registers(self) -> int:
        """ptxas's register limit (``maxnreg``): ``MAX_REGISTERS``, or a whole SM's register file at 32 warps.

        Passed explicitly because ptxas, left to choose, trades a few bytes of spills for occupancy in about a dozen
        configurations (4-24 bytes at 40-72 registers, e.g. the sm_80 LayerNorm backward at N = 64); with a limit
        it allocates what the kernel needs and spills nothing, and the limit keeps 16 warps resident per SM.
        """
        return min(MAX_REGISTERS, REGISTERS_PER_SM // (32 * self.num_warps))

    @property
    def programs_per_sm(self) -> int:
        """Programs of this shape that fit on one SM at the register limit (what the persistent backward plans)."""
        return max(1, REGISTERS_PER_SM // (32 * self.num_warps * self.max_registers))


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _warps(elements: int, per_thread: int) -> int:
    """Warps so that each thread holds about ``per_thread`` elements of the tile (1 to ``MAX_WARPS`` warps)."""
    return max(1, min(MAX_WARPS, next_power_of_2(max(1, elements // (32 * per_thread)))))


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
        chunk = min(LOOP_BLOCK, max_block_n or LOOP_BLOCK)
        return LaunchConfig(1, chunk, _warps(chunk, ELEMENTS_PER_THREAD), single_block=False)
    block_m = max(1, min(64, TILE_ELEMENTS // block_n))
    return LaunchConfig(block_m, block_n, _warps(block_m * block_n, ELEMENTS_PER_THREAD), single_block=True)


def bwd_config(n: int, max_block_n: int | None = None, dropout: bool = False) -> LaunchConfig:
    """Backward tile: x_hat, dy and the dW/dB accumulators are live (and, with ``dropout``, the mask's Philox)."""
    limit = _limit(MAX_BWD_BLOCK_DROPOUT if dropout else MAX_BWD_BLOCK, max_block_n)
    block_n = max(16, next_power_of_2(n))
    if block_n > limit:
        chunk = min(LOOP_BLOCK, max_block_n or LOOP_BLOCK)
        return LaunchConfig(1, chunk, _warps(chunk, ELEMENTS_PER_THREAD), single_block=False)
    block_m = max(1, min(16, TILE_ELEMENTS // block_n))
    tile = block_m * block_n
    # Small tiles: half the forward's elements per thread (up to 16 warps). The backward keeps x_hat, dy, their
    # products and the dW/dB accumulators live: over 150 registers at 8 elements per thread for N <= 2048.
    warps = max(_warps(tile, ELEMENTS_PER_THREAD), min(16, _warps(tile, BWD_ELEMENTS_PER_THREAD)))
    return LaunchConfig(block_m, block_n, warps, single_block=True)


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
    partials are summed afterwards in a fixed order (deterministic, no atomics: Liger#815 -> #945). As many programs
    per SM as fit at the register limit (``LaunchConfig.programs_per_sm``): one wave; the partial traffic
    ``2 * programs * N * 4`` bytes stays a few percent of the backward's ``6 * M * N`` (bf16). The last programs may own
    no rows: they still write zeros.
    """
    per_sm = cfg.programs_per_sm if device.type == "cuda" else 1
    programs = max(1, min(sm_count(device) * per_sm, m))
    rows_per_program = -(-m // programs) if m > 0 else 1
    return programs, rows_per_program
