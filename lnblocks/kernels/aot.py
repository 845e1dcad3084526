"""Compile the kernels for a GPU without one: proves they lower to PTX/SASS and reports registers and spills.

The interpreter runs the kernels as NumPy, so it cannot catch what only the compiler checks (types of loop-carried
values, layouts, register pressure). ``triton.compile`` with an explicit ``GPUTarget`` runs the whole pipeline,
ptxas included, on a machine with no GPU. The launch arguments come from the same ``fwd_launch``/``bwd_launch`` the
real launches use, fed with ``meta`` tensors. Needs triton's bundled CUDA tools (``backends/nvidia/bin``).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from lnblocks.kernels.heuristics import bwd_config
from lnblocks.kernels.norm_bwd import _norm_bwd_kernel, bwd_launch
from lnblocks.kernels.norm_fwd import _norm_fwd_kernel, fwd_launch

_PTR = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int64: "*i64"}
_TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


@dataclass(frozen=True)
class KernelResources:
    """Per-thread registers and local-memory (spill) bytes of one compiled kernel, from ``cuobjdump``."""

    registers: int
    stack_bytes: int
    num_warps: int


def tools_available() -> bool:
    return os.path.exists(os.path.join(_TOOLS, "cuobjdump"))


def _compile(fn: Any, kwargs: dict[str, Any], arch: int) -> KernelResources:
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    num_warps = kwargs.pop("num_warps")
    kwargs["RNE"] = False  # the GPU rounds to nearest even natively
    if not hasattr(fn, "params"):
        raise RuntimeError("kernels were decorated under TRITON_INTERPRET=1; compile them in a process without it")
    for param in fn.params:
        name, value = param.name, kwargs[param.name]
        if param.is_constexpr or value is None:
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = _PTR[value.dtype]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name] = "i64" if abs(value) >= 2**31 else "i32"
    compiled = triton.compile(
        ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps}
    )
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    try:
        out = subprocess.run(
            [os.path.join(_TOOLS, "cuobjdump"), "--dump-resource-usage", f.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        os.unlink(f.name)
    return KernelResources(
        int(re.search(r"REG:(\d+)", out).group(1)), int(re.search(r"STACK:(\d+)", out).group(1)), num_warps
    )


def _meta(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def compile_norm(
    direction: str,
    n: int,
    dtype: torch.dtype = torch.bfloat16,
    *,
    is_rms: bool = False,
    residual: bool = True,
    weight_dtype: torch.dtype | None = torch.float32,
    bias: bool = True,
    zero_centered: bool = False,
    round_mode: int = 0,
    dropout: bool = False,
    arch: int = 90,
    max_block_n: int = 0,
) -> KernelResources:
    """Compile the ``"fwd"`` or ``"bwd"`` kernel for hidden size ``n`` and these options for ``sm_<arch>``."""
    m = 4096
    x = _meta((m, n), dtype)
    w = None if weight_dtype is None else _meta((n,), weight_dtype)
    seed = _meta((1,), torch.int64) if dropout else None
    p = 0.1 if dropout else 0.0
    stats = _meta((m,), torch.float32)
    if direction == "fwd":
        _, kwargs = fwd_launch(
            x,
            x if residual else None,
            w,
            None if is_rms or not bias else _meta((n,), weight_dtype or dtype),
            seed,
            x,
            x if residual else None,
            None if is_rms else stats,
            stats,
            eps=1e-5,
            is_rms=is_rms,
            zero_centered=zero_centered,
            round_mode=round_mode,
            dropout_p=p,
            max_block_n=max_block_n,
        )
        return _compile(_norm_fwd_kernel, kwargs, arch)
    if direction != "bwd":
        raise ValueError(f"direction must be 'fwd' or 'bwd', got {direction!r}")
    cfg = bwd_config(n, max_block_n)
    part = _meta((132, n), torch.float32)
    dres = x if residual and dropout else None
    kwargs = bwd_launch(
        x,
        x if residual else None,
        x,
        w,
        seed,
        None if is_rms else stats,
        stats,
        x,
        dres,
        part if w is not None else None,
        part if bias and not is_rms else None,
        rows_per_program=32,
        is_rms=is_rms,
        zero_centered=zero_centered,
        round_mode=round_mode,
        dropout_p=p,
        recompute_dropout=dropout and not residual,
        cfg=cfg,
    )
    return _compile(_norm_bwd_kernel, kwargs, arch)
