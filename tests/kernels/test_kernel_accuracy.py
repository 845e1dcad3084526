"""Forward and backward of the fused kernels against fp64 and eager references, over sizes x dtypes x kinds."""

from __future__ import annotations

import pytest
import torch

from lnblocks.kernels.launch import MAX_BWD_BLOCK, MAX_FWD_BLOCK
from lnblocks.norms.spec import LayerNormSpec, RMSNormSpec
from tests.kernels.kernel_helpers import DTYPES, check_against_references, make_case

# 1-element rows, primes, a power of two, above 4096, and one row wider than a register block (the looped path).
ABOVE_BLOCK = max(MAX_FWD_BLOCK, MAX_BWD_BLOCK) + 1
SIZES = [1, 7, 64, 1000, 4097, ABOVE_BLOCK]
SPECS = {"layernorm": LayerNormSpec(), "rmsnorm": RMSNormSpec(eps=1e-6)}


def _rows(n: int) -> int:
    return 2 if n >= 4097 else 5  # odd, so row tiles and per-program ranges end mid-tile


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("kind", list(SPECS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_fwd_bwd_against_fp64(n: int, dtype: torch.dtype, kind: str, residual: bool) -> None:
    case = make_case((_rows(n), n), dtype, SPECS[kind], residual=residual)
    check_against_references(case)


@pytest.mark.parametrize("kind", list(SPECS))
@pytest.mark.parametrize("n", [1, 33, 300])
def test_looped_path_with_small_blocks(n: int, kind: str) -> None:
    """``max_block_n`` forces the chunk loop at small N: several chunks, a ragged last one, Welford merge."""
    case = make_case((3, n), torch.bfloat16, SPECS[kind], residual=True)
    check_against_references(case, max_block_n=64 if n > 64 else 16)


def test_layernorm_statistics_are_stable_for_large_offsets() -> None:
    """Rows with mean 1000 and std 1: E[x^2] - E[x]^2 in fp32 would lose everything; Welford/two-pass does not."""
    case = make_case((3, 3000), torch.float32, SPECS["layernorm"], scale=1.0, offset=1000.0)
    check_against_references(case, with_grads=False)
    case = make_case((3, 3000), torch.float32, SPECS["layernorm"], scale=1.0, offset=1000.0)
    check_against_references(case, with_grads=False, max_block_n=1024)


@pytest.mark.parametrize("kind", list(SPECS))
def test_hidden_size_65536(kind: str) -> None:
    """The widest rows the issue asks for (16 chunks of the looped path), fp32 with the fused residual."""
    check_against_references(make_case((2, 65536), torch.float32, SPECS[kind], residual=True))
