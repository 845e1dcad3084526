"""What the kernel benchmark times: the norms (``OPS``) and who computes them (``CONTENDERS``), as two tables.

Adding a kernel is one ``NormOp`` in ``OPS`` (its lnblocks spec, torch's ops for it and its byte count); a rival
library offers it by one entry in that library's per-op table (``_LIGER``, ``_QUACK``, ...). A contender's builder
returns the function to time, a string saying why it is missing (printed, and shown as "–"), or None where it is not
a contender at all (the tile variants away from their N). Third-party libraries are imported lazily, inside the
builders, so that a machine without them still runs the rest.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.kernels.traffic import Operands


@dataclass
class Inputs:
    """The operands of one call, leaves with ``requires_grad``: x (M, N), the residual, weight and bias (N,), and a
    kind's own operands in ``extra`` (a gate, a learnable scalar)."""

    x: Tensor
    residual: Tensor | None
    weight: Tensor | None
    bias: Tensor | None
    extra: dict[str, Tensor] = field(default_factory=dict)

    def leaves(self) -> list[Tensor]:
        return [t for t in (self.x, self.residual, self.weight, self.bias, *self.extra.values()) if t is not None]


Output = Tensor | tuple[Tensor, ...]  # y, or (y, x + residual) with a residual
Fn = Callable[[Inputs], Output]
# (h, weight, bias, extra, eps) -> y: plain tensors, so that torch.compile traces it without a dataclass
Eager = Callable[[Tensor, Tensor | None, Tensor | None, dict[str, Tensor], float], Tensor]


@dataclass(frozen=True)
class NormOp:
    """One norm the benchmark times: its defaults, lnblocks' spec, torch's own ops and the bytes its math moves.

    ``extra``: the kind's own operands (``"gate"``: shaped like x; ``"alpha"``, ``"shift"``: learnable scalars);
    ``weight``/``bias``: whether it has them (bias: LayerNorm's by default); ``takes_residual``: whether it has a
    fused-residual form (the gated norm has none); ``sizes``: the N it is timed at on the GPU (None: every N).
    """

    name: str
    eps: float
    layer_norm: bool  # subtracts the mean: a second fp32 statistic per row (and, by default, a bias)
    spec: Callable[[float], object]  # eps -> the lnblocks NormSpec that the fused entry point runs
    eager: Eager  # torch's own ops on h = x (+ residual)
    extra: tuple[str, ...] = ()
    weight: bool = True
    bias: bool | None = None
    takes_residual: bool = True
    sizes: tuple[int, ...] | None = None

    @property
    def has_bias(self) -> bool:
        return self.layer_norm if self.bias is None else self.bias

    def inputs(self, m: int, n: int, dtype: torch.dtype, device: torch.device, residual: bool) -> Inputs:
        def leaf(*shape: int, value: float | None = None) -> Tensor:
            t = torch.randn(*shape, device=device, dtype=dtype) if value is None else torch.full(
                shape, value, device=device, dtype=dtype)  # fmt: skip
            return t.requires_grad_()

        scalars = {"alpha": 0.5, "shift": 0.1}
        extra = {k: leaf(m, n) if k == "gate" else leaf(1, value=scalars[k]) for k in self.extra}
        return Inputs(leaf(m, n), leaf(m, n) if residual else None, leaf(n) if self.weight else None,
                      leaf(n) if self.has_bias else None, extra)  # fmt: skip

    def operands(self, n: int, elem: int, residual: bool) -> Operands:
        """The byte count (``traffic.min_bytes``) every contender's time is divided by."""
        scalars = sum(k in ("alpha", "shift") for k in self.extra)
        return Operands(n, elem, elem if residual else 0, elem if self.weight else 0, elem if self.has_bias else 0,
                        elem, False, self.layer_norm, gate=elem if "gate" in self.extra else 0,
                        scalars=scalars)  # fmt: skip


def _layer_norm(h: Tensor, weight: Tensor | None, bias: Tensor | None, extra: dict, eps: float) -> Tensor:
    return F.layer_norm(h, h.shape[-1:], weight, bias, eps)


def _rms_norm(h: Tensor, weight: Tensor | None, bias: Tensor | None, extra: dict, eps: float) -> Tensor:
    return F.rms_norm(h, h.shape[-1:], weight, eps)


def _gated_rms_norm(h: Tensor, weight: Tensor | None, bias: Tensor | None, extra: dict, eps: float) -> Tensor:
    """``MambaRMSNormGated``'s ops: the gate before the norm, RMS in fp32, the weight after the cast back."""
    g = h.float() * F.silu(extra["gate"].float())
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    return weight * g.to(h.dtype)


def _dyt(h: Tensor, weight: Tensor | None, bias: Tensor | None, extra: dict, eps: float) -> Tensor:
    return (torch.tanh(extra["alpha"].float() * h.float()) * weight.float() + bias.float()).to(h.dtype)


def _derf(h: Tensor, weight: Tensor | None, bias: Tensor | None, extra: dict, eps: float) -> Tensor:
    u = extra["alpha"].float() * h.float() + extra["shift"].float()
    return (torch.erf(u) * weight.float() + bias.float()).to(h.dtype)


def _spec(name: str) -> Callable[[float], object]:
    """eps -> the spec: a spec class of ``lnblocks.norms.spec`` given eps, or a kind without one (DyT, Derf)."""

    def make(eps: float) -> object:
        from lnblocks.norms import norm_spec, spec

        return norm_spec(name) if name in spec.SPEC_TYPES else getattr(spec, name)(eps=eps)

    return make


# The 2025-26 kinds are timed at two widths (of a Mamba2 head group / a hidden size and a wide one): their tables
# double the run otherwise.
_NEW_SIZES = (4096, 16384)
OPS: dict[str, NormOp] = {
    "layernorm": NormOp("layernorm", 1e-5, True, _spec("LayerNormSpec"), _layer_norm),
    "rmsnorm": NormOp("rmsnorm", 1e-6, False, _spec("RMSNormSpec"), _rms_norm),
    "gated_rmsnorm": NormOp("gated_rmsnorm", 1e-6, False, _spec("GatedRMSNormSpec"), _gated_rms_norm, ("gate",),
                            takes_residual=False, sizes=_NEW_SIZES),
    "l2norm": NormOp("l2norm", 1e-6, False, _spec("L2NormSpec"), _rms_norm, weight=False, sizes=_NEW_SIZES),
    "dyt": NormOp("dyt", 0.0, False, _spec("dyt"), _dyt, ("alpha",), bias=True, sizes=_NEW_SIZES),
    "derf": NormOp("derf", 0.0, False, _spec("derf"), _derf, ("alpha", "shift"), bias=True, sizes=_NEW_SIZES),
}  # fmt: skip


@dataclass(frozen=True)
class Context:
    """Where a contender is built: the row width, the device, a smoke run, and whether tile variants are wanted."""

    n: int
    device: torch.device
    smoke: bool = False
    variants: bool = False


Built = Fn | str | None
Builder = Callable[[NormOp, Context], Built]


def _with_residual(op: NormOp, norm: Callable[[Tensor, Inputs], Tensor]) -> Fn:
    """``norm`` after a separate add when there is a residual, returning (y, x + residual) as the fused kernels do."""

    def fn(t: Inputs) -> Output:
        h = t.x if t.residual is None else t.x + t.residual
        y = norm(h, t)
        return y if t.residual is None else (y, h)

    return fn


# ---- lnblocks and torch -------------------------------------------------------------------------------------------
def _ours(max_block_n: int | None = None, only_n: int | None = None) -> Builder:
    def build(op: NormOp, ctx: Context) -> Built:
        if only_n is not None and not (ctx.variants and ctx.n == only_n):
            return None
        from lnblocks.kernels import fused_add_norm, fused_gated_rms_norm

        spec = op.spec(op.eps)
        tile = {} if max_block_n is None else {"max_block_n": max_block_n}
        if "gate" in op.extra:
            return lambda t: fused_gated_rms_norm(t.x, t.extra["gate"], t.weight, spec, **tile)
        return lambda t: fused_add_norm(t.x, t.residual, t.weight, t.bias, spec, **tile, **t.extra)

    return build


def _eager(op: NormOp) -> Callable[..., Output]:
    def eager(x: Tensor, residual: Tensor | None, weight: Tensor | None, bias: Tensor | None, extra: dict) -> Output:
        h = x if residual is None else x + residual
        y = op.eager(h, weight, bias, extra, op.eps)
        return y if residual is None else (y, h)

    return eager


def _torch(op: NormOp, ctx: Context) -> Built:
    eager = _eager(op)
    return lambda t: eager(t.x, t.residual, t.weight, t.bias, t.extra)


def _compile(op: NormOp, ctx: Context) -> Built:
    """``torch.compile`` of torch's ops, one compile per configuration (N static; the caller marks M dynamic)."""
    if ctx.smoke:
        return "skipped (smoke run)"
    compiled = torch.compile(_eager(op), dynamic=False)
    return lambda t: compiled(t.x, t.residual, t.weight, t.bias, t.extra)


# ---- third-party kernels: one per-op table each, imported when built ----------------------------------------------
def _third_party(table: dict[str, Callable[[NormOp], Fn]], library: str) -> Builder:
    def build(op: NormOp, ctx: Context) -> Built:
        if ctx.smoke:
            return "skipped (smoke run)"
        if ctx.device.type != "cuda":
            return "needs CUDA"
        if op.name not in table:
            return f"{library} has no {op.name} kernel"
        try:
            return table[op.name](op)
        except ImportError as err:
            return f"not importable ({err.name or err})"

    return build


def _liger_layer_norm(op: NormOp) -> Fn:
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    return _with_residual(op, lambda h, t: LigerLayerNormFunction.apply(h, t.weight, t.bias, op.eps))


def _liger_dyt(op: NormOp) -> Fn:
    from liger_kernel.ops.dyt import LigerDyTFunction  # (x, alpha, gamma, beta)

    return _with_residual(op, lambda h, t: LigerDyTFunction.apply(h, t.extra["alpha"], t.weight, t.bias))


def _liger_rms_norm(op: NormOp) -> Fn:
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    def fn(t: Inputs) -> Output:
        if t.residual is not None:  # its fused add + RMSNorm: (y, x + r); offset, casting mode, in_place
            return LigerFusedAddRMSNormFunction.apply(t.x, t.residual, t.weight, op.eps, 0.0, "llama", False)
        return LigerRMSNormFunction.apply(t.x, t.weight, op.eps, 0.0, "llama", False)

    return fn


def _flash_attn_norm(op: NormOp) -> Fn:
    from flash_attn.ops.triton.layer_norm import layer_norm_fn, rms_norm_fn

    norm_fn = layer_norm_fn if op.layer_norm else rms_norm_fn
    return lambda t: norm_fn(t.x, t.weight, t.bias, residual=t.residual, eps=op.eps, prenorm=t.residual is not None)


def _quack_rms_norm(op: NormOp) -> Fn:
    from quack import rmsnorm  # quack-kernels (CuTe DSL, sm_90+): fused add with prenorm=True returns (y, x + r)

    def fn(t: Inputs) -> Output:
        return rmsnorm(t.x, t.weight, residual=t.residual, eps=op.eps, prenorm=t.residual is not None)

    return fn


def _quack_layer_norm(op: NormOp) -> Fn:
    from quack.rmsnorm import layernorm_bwd, layernorm_fwd  # functional only, fp32 weight and bias

    class QuackLayerNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h, weight, bias):
            y, rstd, mean = layernorm_fwd(h, weight, bias, op.eps, return_rstd=True, return_mean=True)
            ctx.save_for_backward(h, weight, rstd, mean)
            ctx.has_bias = bias is not None
            return y

        @staticmethod
        def backward(ctx, dy):
            h, weight, rstd, mean = ctx.saved_tensors
            dx, dw, db = layernorm_bwd(h, weight, dy.contiguous(), rstd, mean, ctx.has_bias)
            return dx, dw, db

    def norm(h: Tensor, t: Inputs) -> Tensor:
        return QuackLayerNorm.apply(h, t.weight.float(), None if t.bias is None else t.bias.float())

    return _with_residual(op, norm)


def _transformer_engine(op: NormOp) -> Fn:
    """Transformer Engine's norm modules with its cuDNN backend (``NVTE_NORM_*_USE_CUDNN``), called with the
    benchmark's weight and bias through ``torch.func.functional_call``."""
    os.environ.setdefault("NVTE_NORM_FWD_USE_CUDNN", "1")
    os.environ.setdefault("NVTE_NORM_BWD_USE_CUDNN", "1")
    import transformer_engine.pytorch as te

    modules: dict[tuple[int, torch.dtype], torch.nn.Module] = {}

    def norm(h: Tensor, t: Inputs) -> Tensor:
        key = (h.shape[-1], h.dtype)
        if key not in modules:
            cls = te.LayerNorm if op.layer_norm else te.RMSNorm
            modules[key] = cls(h.shape[-1], eps=op.eps, device=h.device, dtype=h.dtype)
        params = {"weight": t.weight} | ({"bias": t.bias} if t.bias is not None else {})
        return torch.func.functional_call(modules[key], params, (h,))

    return _with_residual(op, norm)


_LIGER = {"layernorm": _liger_layer_norm, "rmsnorm": _liger_rms_norm, "dyt": _liger_dyt}
_FLASH_ATTN = {"layernorm": _flash_attn_norm, "rmsnorm": _flash_attn_norm}
_QUACK = {"layernorm": _quack_layer_norm, "rmsnorm": _quack_rms_norm}
_TRANSFORMER_ENGINE = {"layernorm": _transformer_engine, "rmsnorm": _transformer_engine}

# Columns of the table, in order. ``ours-looped`` forces the chunked path at N = 8192; ``ours-single`` times one
# 16384-wide block (the tile that spills, see kernel_resources.py) where ``ours`` loops.
CONTENDERS: dict[str, Builder] = {
    "ours": _ours(),
    "torch": _torch,
    "compile": _compile,
    "ours-looped": _ours(max_block_n=4096, only_n=8192),
    "ours-single": _ours(max_block_n=16384, only_n=16384),
    "liger": _third_party(_LIGER, "Liger-Kernel"),
    "flash-attn": _third_party(_FLASH_ATTN, "flash-attn"),
    "quack": _third_party(_QUACK, "quack"),
    "cudnn (TE)": _third_party(_TRANSFORMER_ENGINE, "Transformer Engine"),
}


def build_all(op: NormOp, ctx: Context) -> dict[str, Fn | str]:
    """Every contender for ``op`` at ``ctx``: the function to time, or why it is missing (None ones left out)."""
    out: dict[str, Fn | str] = {}
    for name, builder in CONTENDERS.items():
        built = builder(op, ctx)
        if built is not None:
            out[name] = built
    return out
