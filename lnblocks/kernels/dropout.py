"""The dropout keep-mask the fused kernels use, materialised: for inspection, tests and reproducing a call."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from lnblocks.kernels._jit_common import keep_mask


@triton.jit
def _keep_mask_kernel(SEED, OUT, M, N, p, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) + tl.arange(0, 1)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = keep_mask(SEED, rows, cols, N, p)
    tl.store(OUT + rows[:, None] * N + cols[None, :], keep.to(tl.int8), mask=(cols < N)[None, :])


def dropout_mask(seed: int | Tensor, shape: tuple[int, int], p: float, device: torch.device | str = "cuda") -> Tensor:
    """Boolean keep-mask ``(M, N)`` that ``fused_add_norm(..., dropout_p=p, seed=seed)`` applies to rows of x.

    Element (row, col) is kept when Philox-4x32-7(seed, row * N + col) / 2^32 >= p; kept values are scaled by
    ``1 / (1 - p)``.
    """
    from lnblocks.kernels.functional import _seed_tensor

    m, n = shape
    device = torch.device(device)
    out = torch.empty((m, n), dtype=torch.int8, device=device)
    if m * n > 0:
        block = min(1024, triton.next_power_of_2(n))
        _keep_mask_kernel[(m, triton.cdiv(n, block))](_seed_tensor(seed, device), out, m, n, float(p), BLOCK_N=block)
    return out.bool()
