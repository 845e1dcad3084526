"""Small launcher helpers shared by the forward and backward: dtype mapping, strides, allocation."""

from __future__ import annotations

import torch
import triton.language as tl
from torch import Tensor

from lnblocks.kernels import interpreter_enabled

_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def tl_dtype(dtype: torch.dtype) -> tl.dtype:
    return _TL_DTYPES[dtype]


def row_stride(t: Tensor | None) -> int:
    """Stride between rows of a 2-D operand (0 for an absent one); columns must have unit stride."""
    return 0 if t is None else t.stride(0)


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """``torch.empty``: kernels write every element (tests fill uninitialised memory with NaN to prove it)."""
    return torch.empty(shape, dtype=dtype, device=device)


def interpreter_rne() -> bool:
    """Emulate the GPU's round-to-nearest-even fp32 -> bf16 conversion (the CPU interpreter truncates)."""
    return interpreter_enabled()
