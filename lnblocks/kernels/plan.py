"""``NormPlan``: every non-tensor argument of a fused call, written once.

A plan is what the launchers, the autograd layer and the ``torch.library`` custom ops pass around instead of a long
argument list: its fields, in order, are the scalar tail of every op's schema (``schema_args``), so adding an option
is one field here, and every field is resolved when the plan is made (``make_plan``: RMSNorm's ``eps=None`` becomes the
number it means there, once). The dtypes follow the eager convention (``lnblocks.norms.modules``):
``new_residual = add_residual(x, r)`` (fp32 when ``residual_in_fp32``, else type promotion); ``y = norm(new_residual)``
on the rounded new residual; with ``residual_in_fp32`` the output takes the dtype ``norm(x)`` would have. The dtype
rules themselves live in ``lnblocks.norms.functional`` (``new_residual_dtype``, ``output_dtype``).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from lnblocks.norms import functional as LF
from lnblocks.norms.spec import LayerNormSpec, RMSNormSpec

_HALF = (torch.float16, torch.bfloat16)

# How x_hat is rounded before the weight multiply (the HF cast orders): none, to the norm input's dtype
# (``LlamaRMSNorm``), or to a half-precision weight's dtype (``T5LayerNorm``).
ROUND_NONE, ROUND_TO_INPUT, ROUND_TO_WEIGHT = 0, 1, 2


@dataclass(frozen=True)
class NormPlan:
    """The non-tensor arguments of one fused call (its tensors: x, residual, weight, bias, seed).

    ``eps``: the number added to the variance (already resolved). ``cast``: the RMSNorm cast order (``"fp32"`` for
    LayerNorm). ``x_dtype``/``residual_dtype``/``weight_dtype``: the operands' dtypes (None: absent), which fix the
    gradients' dtypes. ``out_dtype``: dtype of ``y``. ``max_block_n``: widest row held in registers (0: the
    heuristic's choice). ``inplace_backward``: write dx into the incoming gradient of ``y``.
    """

    is_rms: bool
    eps: float
    zero_centered: bool
    cast: str
    residual_in_fp32: bool
    dropout_p: float
    x_dtype: torch.dtype
    residual_dtype: torch.dtype | None
    weight_dtype: torch.dtype | None
    out_dtype: torch.dtype
    max_block_n: int
    inplace_backward: bool

    @property
    def has_residual(self) -> bool:
        return self.residual_dtype is not None

    @property
    def norm_dtype(self) -> torch.dtype:
        """Dtype of the tensor the norm sees: the new residual, or x."""
        if self.residual_dtype is None:
            return self.x_dtype
        return LF.new_residual_dtype(self.x_dtype, self.residual_dtype, self.residual_in_fp32)

    @property
    def round_mode(self) -> int:
        if self.is_rms and self.weight_dtype is not None:
            if self.cast == "llama" and self.norm_dtype != torch.float32:
                return ROUND_TO_INPUT
            if self.cast == "t5" and self.weight_dtype in _HALF:
                return ROUND_TO_WEIGHT
        return ROUND_NONE

    @property
    def separate_dresidual(self) -> bool:
        """dresidual differs from dx (dropout between them, or another dtype): the backward writes it."""
        return self.residual_dtype is not None and (self.dropout_p > 0 or self.residual_dtype != self.x_dtype)

    def op_args(self) -> tuple:
        """The fields in schema order: the scalar tail of the custom ops' arguments."""
        return tuple(getattr(self, name) for name in PLAN_FIELDS)


PLAN_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(NormPlan))
_SCHEMA_TYPES = {
    "bool": "bool",
    "int": "int",
    "float": "float",
    "str": "str",
    "torch.dtype": "ScalarType",
    "torch.dtype | None": "ScalarType?",
}


def schema_args() -> str:
    """``NormPlan``'s fields as custom-op schema arguments (``"bool is_rms, float eps, ..."``)."""
    return ", ".join(f"{_SCHEMA_TYPES[f.type]} {f.name}" for f in dataclasses.fields(NormPlan))


@functools.lru_cache(maxsize=256)
def plan_from_op_args(*args) -> NormPlan:
    """The plan whose ``op_args()`` are ``args`` (custom-op bodies receive the fields flattened)."""
    return NormPlan(*args)


def make_plan(
    spec: LayerNormSpec | RMSNormSpec,
    x_dtype: torch.dtype,
    residual_dtype: torch.dtype | None,
    weight_dtype: torch.dtype | None,
    out_dtype: torch.dtype | None = None,
    dropout_p: float = 0.0,
    max_block_n: int = 0,
    inplace_backward: bool = False,
) -> NormPlan:
    """The plan of a call with these operand dtypes; ``out_dtype=None`` picks what the eager module returns.

    Cached (a module plans once per operand dtypes), except while torch.compile traces: dynamo traces the body.
    """
    build = _build_plan if torch.compiler.is_compiling() else _cached_plan
    return build(spec, x_dtype, residual_dtype, weight_dtype, out_dtype, dropout_p, max_block_n, inplace_backward)


def _build_plan(spec, x_dtype, residual_dtype, weight_dtype, out_dtype, dropout_p, max_block_n, inplace_backward):
    is_rms = spec.kind == "rmsnorm"
    cast = spec.cast if is_rms else "fp32"
    norm_dtype = x_dtype  # what the norm sees: x, or the new residual
    if residual_dtype is not None:
        norm_dtype = LF.new_residual_dtype(x_dtype, residual_dtype, spec.residual_in_fp32)
    # with residual_in_fp32 the fp32 stream does not change what the branch sees: y takes the dtype norm(x) has
    branch_dtype = x_dtype if spec.residual_in_fp32 else norm_dtype
    return NormPlan(
        is_rms=is_rms,
        # RMSNorm's eps=None: machine epsilon of the dtype the norm computes in (the one rule, in the reference math)
        eps=float(LF.resolve_rms_eps(spec.eps, norm_dtype) if is_rms else spec.eps),
        zero_centered=spec.zero_centered,
        cast=cast,
        residual_in_fp32=spec.residual_in_fp32,
        dropout_p=float(dropout_p),
        x_dtype=x_dtype,
        residual_dtype=residual_dtype,
        weight_dtype=weight_dtype,
        out_dtype=LF.output_dtype(spec.kind, cast, branch_dtype, weight_dtype) if out_dtype is None else out_dtype,
        max_block_n=int(max_block_n),
        inplace_backward=inplace_backward,
    )


_cached_plan = functools.lru_cache(maxsize=1024)(_build_plan)
