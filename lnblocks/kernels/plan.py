"""What the fused kernels can run, and ``NormPlan``: every non-tensor argument of a call, resolved once.

The support rule (``unavailable_reason``, ``sharding_unavailable_reason``) is the one home of "can the kernels run
this call": kinds, dtypes, devices, DTensor placements. A plan is what the launchers, the autograd layer and the
``torch.library`` custom ops pass around instead of a long argument list: its fields, in order, are the scalar tail of
every op's schema (``schema_args``), so adding an option is one field here, and every field is resolved when the plan
is made (``make_plan``: RMSNorm's ``eps=None`` becomes the number it means there, once). The dtypes follow the eager
convention (``lnblocks.norms.modules``): ``new_residual = add_residual(x, r)`` (fp32 when ``residual_in_fp32``, else
type promotion); ``y = norm(new_residual)`` on the rounded new residual; with ``residual_in_fp32`` the output takes
the dtype ``norm(x)`` would have. The dtype rules themselves live in ``lnblocks.norms.functional``
(``new_residual_dtype``, ``output_dtype``). Nothing here imports triton or touches CUDA.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from lnblocks.norms import functional as LF
from lnblocks.norms.spec import NormSpec

# ---- the support rule ----------------------------------------------------------------------------------------------
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FUSED_KINDS = ("layernorm", "rmsnorm", "l2norm", "gated_rmsnorm", "dyt", "derf")
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None  # a file-system lookup, no import
_PLAIN_TYPES = (Tensor, torch.nn.Parameter)


def triton_installed() -> bool:
    return _TRITON_INSTALLED


def interpreter_enabled() -> bool:
    """True under ``TRITON_INTERPRET=1``: kernels then run on CPU tensors (slowly; this is how tests run them)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def device_unavailable_reason(x: Tensor, name: str = "x") -> str | None:
    """Why the kernels cannot run on ``x``'s device (None when they can)."""
    if not x.is_cuda and not interpreter_enabled():
        return (
            f"{name} is on {x.device.type}: the Triton kernels run on CUDA tensors, or on CPU only under "
            "TRITON_INTERPRET=1"
        )
    return None


def is_dtensor(t: object) -> bool:
    """``t`` is a ``torch.distributed.tensor.DTensor`` (imported only when a tensor subclass shows up)."""
    if t is None or type(t) in _PLAIN_TYPES or not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def sharding_unavailable_reason(
    x: Tensor, residual: Tensor | None, parameters: Iterable[tuple[str, Tensor | None]], n: int
) -> str | None:
    """Why the kernels cannot run a call with DTensor operands on each rank's local rows (None when they can).

    They can when every row is whole on one rank: ``x`` sharded on leading (batch or sequence) dims or replicated,
    ``n`` = elements per row, the parameters replicated on x's mesh and the residual (and a gate, passed among
    ``parameters``) a DTensor on that mesh. An input
    sharded on a normalised dim is refused rather than gathered (the statistics would need an all-reduce the kernels
    do not do); so is a ``Partial`` (pending-sum) input, which must be reduced before a non-linear op.
    """
    if not is_dtensor(x):
        sharded = next((label for label, t in (("residual", residual), *parameters) if is_dtensor(t)), None)
        if sharded is None:
            return None
        return (
            f"{sharded} is a DTensor but x is a plain tensor. A norm under FSDP2 must be called as a module, "
            "norm(x), not norm.forward(x): its all-gather runs in __call__'s hooks (pytorch#157209)"
        )
    mesh = x.device_mesh
    k = _row_dims(tuple(x.shape), n)
    for i, p in enumerate(x.placements):
        if p.is_partial():
            return (
                f"x is Partial on mesh dim {i} (a pending sum): reduce it first, e.g. "
                "x.redistribute(placements=[Shard(1)])"
            )
        if p.is_shard() and p.dim % x.dim() >= x.dim() - k:
            return (
                f"x is sharded on dim {p.dim % x.dim()}, a normalised dim of shape {tuple(x.shape)}: each rank "
                "needs whole rows (shard the batch or sequence dim instead; SequenceParallel: Shard(1))"
            )
    for label, t in (("residual", residual), *parameters):
        if t is None:
            continue
        if not is_dtensor(t):
            return (
                f"{label} is a plain tensor while x is a DTensor: distribute it on x's mesh too (for a norm module: "
                "parallelize_module(norm, mesh, SequenceParallel()) replicates its parameters)"
            )
        if t.device_mesh != mesh:
            return f"{label} is on another device mesh than x ({t.device_mesh} vs {mesh})"
        if label not in ("residual", "gate") and not all(p.is_replicate() for p in t.placements):
            return (
                f"{label} has placements {tuple(t.placements)}: a norm's parameters must be replicated where it runs "
                "(FSDP2 gathers them in the module's __call__; under tensor parallelism use SequenceParallel)"
            )
    return None


def _row_dims(shape: tuple[int, ...], n: int) -> int:
    """How many trailing dims of ``shape`` hold one row of ``n`` elements (the fewest that do)."""
    for k in range(1, len(shape) + 1):
        if math.prod(shape[-k:]) == n:
            return k
    return len(shape)


def unavailable_reason(
    spec: NormSpec,
    x: Tensor,
    name: str = "x",
    *,
    residual: Tensor | None = None,
    parameters: Iterable[tuple[str, Tensor]] = (),
    row_numel: int | None = None,
) -> str | None:
    """Why the fused kernel cannot run ``spec`` on ``x`` (and ``residual``, and the module's ``parameters``), or
    None when it can; ``name`` is how messages call ``x``, ``row_numel`` the elements per row (default: the last
    dim). The one home of the kernel-support rule."""
    if spec.kind not in FUSED_KINDS:
        return f"there is no fused kernel for norm kind {spec.kind!r}"
    if not _TRITON_INSTALLED:
        return "triton is not installed (pip install triton; Linux only)"
    parameters = list(parameters)
    for label, t in ((name, x), ("residual", residual)):
        if t is None:
            continue
        reason = device_unavailable_reason(t, label)
        if reason is not None:
            return reason
        if t.dtype not in KERNEL_DTYPES:
            return f"{label} is {t.dtype}; the kernels take float16, bfloat16 or float32"
    for label, p in parameters:
        if p is not None and p.dtype not in KERNEL_DTYPES:
            return f"{label} is {p.dtype}; the kernels take float16, bfloat16 or float32 parameters"
    if any(is_dtensor(t) for t in (x, residual, *(p for _, p in parameters))):
        n = row_numel if row_numel is not None else (x.shape[-1] if x.dim() else 1)
        return sharding_unavailable_reason(x, residual, parameters, n)
    return None


# ---- the plan ------------------------------------------------------------------------------------------------------

_HALF = (torch.float16, torch.bfloat16)
_RMS_KINDS = ("rmsnorm", "l2norm", "gated_rmsnorm")
_POINTWISE = {"dyt": 1, "derf": 2}  # the kernels' POINTWISE constexpr: tanh, erf
_GATE_MODES = {"none": 0, "before": 1, "after": 2}

# How x_hat is rounded before the weight multiply (the HF cast orders): none, to the norm input's dtype
# (``LlamaRMSNorm``), or to a half-precision weight's dtype (``T5LayerNorm``).
ROUND_NONE, ROUND_TO_INPUT, ROUND_TO_WEIGHT = 0, 1, 2


@dataclass(frozen=True)
class NormPlan:
    """The non-tensor arguments of one fused call (its tensors: x, residual, weight, bias, seed, gate, alpha, shift).

    ``kind``: the spec's kind. ``eps``: the number added to the variance (already resolved). ``cast``: the cast order
    (``"fp32"`` where the kind has none; ``"nemotron"``: ``1 + w`` rounded to the weight's dtype).
    ``x_dtype``/``residual_dtype``/``weight_dtype``: the operands' dtypes (None: absent), which fix the gradients'
    dtypes. ``out_dtype``: dtype of ``y``. ``max_block_n``: widest row held in registers (0: the heuristic's choice).
    ``inplace_backward``: write dx into the incoming gradient of ``y``. ``group_size``: statistics over groups of that
    many elements (0: the whole row). ``gate_position``: ``"none"``, ``"before"`` or ``"after"`` the norm,
    ``activation`` its function. ``l2_sum``: the sum of squares instead of their mean (``l2norm(reduction="sum")``).
    ``norm_then_add``: the residual is added after the norm (``residual + norm(x)``), ``write_y`` whether y itself is
    written.
    ``memory_efficient``: the backward rebuilds x_hat from the saved output.
    """

    kind: str
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
    group_size: int = 0
    gate_position: str = "none"
    activation: str = "silu"
    l2_sum: bool = False
    norm_then_add: bool = False
    write_y: bool = True
    memory_efficient: bool = False

    @property
    def is_rms(self) -> bool:
        """RMS statistics (no mean); the point-wise kinds have no statistics and no mean either."""
        return self.kind in _RMS_KINDS or self.pointwise > 0

    @property
    def pointwise(self) -> int:
        return _POINTWISE.get(self.kind, 0)

    @property
    def gate_mode(self) -> int:
        return _GATE_MODES[self.gate_position]

    @property
    def has_residual(self) -> bool:
        return self.residual_dtype is not None

    @property
    def norm_dtype(self) -> torch.dtype:
        """Dtype of the tensor the norm sees: the new residual, or x (also with the residual added after it)."""
        if self.residual_dtype is None or self.norm_then_add:
            return self.x_dtype
        return LF.new_residual_dtype(self.x_dtype, self.residual_dtype, self.residual_in_fp32)

    @property
    def stream_dtype(self) -> torch.dtype:
        """Dtype of the new residual: ``x + residual`` before the norm, ``y + residual`` after it."""
        if self.residual_dtype is None or not self.norm_then_add:
            return self.norm_dtype
        return LF.new_residual_dtype(self.out_dtype, self.residual_dtype, self.residual_in_fp32)

    @property
    def round_mode(self) -> int:
        if self.is_rms and self.weight_dtype is not None and not self.pointwise:
            if self.cast == "llama" and self.norm_dtype != torch.float32:
                return ROUND_TO_INPUT
            if self.cast == "t5" and self.weight_dtype in _HALF:
                return ROUND_TO_WEIGHT
        return ROUND_NONE

    @property
    def round_product(self) -> bool:
        """A gate after a Llama-order norm multiplies ``weight * h.to(dtype)``, rounded when that product is half."""
        if self.gate_position != "after" or self.cast != "llama" or self.weight_dtype is None:
            return False
        return torch.promote_types(self.weight_dtype, self.x_dtype) == self.x_dtype and self.x_dtype in _HALF

    @property
    def zero_centered_mode(self) -> int:
        """The kernels' ``ZERO_CENTERED``: 0 no, 1 ``1 + w`` in fp32, 2 rounded to the weight's dtype (Nemotron)."""
        if not self.zero_centered:
            return 0
        return 2 if self.cast == "nemotron" else 1

    @property
    def separate_dresidual(self) -> bool:
        """dresidual differs from dx (dropout between them, or another dtype): the backward writes it."""
        if self.residual_dtype is None or self.norm_then_add:
            return False
        return self.dropout_p > 0 or self.residual_dtype != self.x_dtype

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
    """``NormPlan``'s fields as custom-op schema arguments (``"str kind, float eps, ..."``)."""
    return ", ".join(f"{_SCHEMA_TYPES[f.type]} {f.name}" for f in dataclasses.fields(NormPlan))


@functools.lru_cache(maxsize=256)
def plan_from_op_args(*args) -> NormPlan:
    """The plan whose ``op_args()`` are ``args`` (custom-op bodies receive the fields flattened)."""
    return NormPlan(*args)


def make_plan(
    spec: NormSpec,
    x_dtype: torch.dtype,
    residual_dtype: torch.dtype | None,
    weight_dtype: torch.dtype | None,
    out_dtype: torch.dtype | None = None,
    dropout_p: float = 0.0,
    max_block_n: int = 0,
    inplace_backward: bool = False,
    *,
    group_size: int | None = None,
    norm_then_add: bool = False,
    write_y: bool = True,
) -> NormPlan:
    """The plan of a call with these operand dtypes; ``out_dtype=None`` picks what the eager module returns.

    ``group_size``: the module's resolved group size (None: the whole row). A gated spec plans the call with its gate
    (``without_gate`` gives the gate-less call's). ``norm_then_add``: ``residual + norm(x)``, y written only with
    ``write_y``. Cached (a module plans once per operand dtypes), except while torch.compile traces: dynamo traces
    the body.
    """
    build = _build_plan if torch.compiler.is_compiling() else _cached_plan
    return build(
        spec, x_dtype, residual_dtype, weight_dtype, out_dtype, dropout_p, max_block_n, inplace_backward,
        group_size, norm_then_add, write_y,
    )  # fmt: skip


def _build_plan(
    spec, x_dtype, residual_dtype, weight_dtype, out_dtype, dropout_p, max_block_n, inplace_backward, group_size,
    norm_then_add, write_y,
):  # fmt: skip
    kind = spec.kind
    cast = getattr(spec, "cast", "fp32")
    norm_dtype = x_dtype  # what the norm sees: x, or the new residual
    if residual_dtype is not None and not norm_then_add:
        norm_dtype = LF.new_residual_dtype(x_dtype, residual_dtype, spec.residual_in_fp32)
    # with residual_in_fp32 the fp32 stream does not change what the branch sees: y takes the dtype norm(x) has
    branch_dtype = x_dtype if spec.residual_in_fp32 else norm_dtype
    gate = getattr(spec, "gate", "none")
    if out_dtype is None:
        out_dtype = LF.output_dtype(kind, cast, branch_dtype, weight_dtype, gate_after=gate == "after")
    # RMSNorm's eps=None: machine epsilon of the dtype the norm computes in (the one rule, in the reference math)
    eps = LF.resolve_rms_eps(spec.eps, norm_dtype) if kind == "rmsnorm" else getattr(spec, "eps", 0.0)
    return NormPlan(
        kind=kind,
        eps=float(eps),
        zero_centered=getattr(spec, "zero_centered", False),
        cast=cast,
        residual_in_fp32=spec.residual_in_fp32,
        dropout_p=float(dropout_p),
        x_dtype=x_dtype,
        residual_dtype=residual_dtype,
        weight_dtype=weight_dtype,
        out_dtype=out_dtype,
        max_block_n=int(max_block_n),
        inplace_backward=inplace_backward,
        group_size=int(group_size or 0),
        gate_position=gate,
        activation=getattr(spec, "activation", "silu"),
        l2_sum=getattr(spec, "reduction", "mean") == "sum",
        norm_then_add=norm_then_add,
        write_y=write_y or not norm_then_add,
        memory_efficient=getattr(spec, "memory_efficient", False),
    )


_cached_plan = functools.lru_cache(maxsize=1024)(_build_plan)


@functools.lru_cache(maxsize=256)
def without_gate(plan: NormPlan) -> NormPlan:
    """The plan of a gated norm called without a gate (the grouped RMSNorm with the same cast order)."""
    return dataclasses.replace(plan, gate_position="none")


@functools.lru_cache(maxsize=256)
def norm_then_add_plan(plan: NormPlan, residual_dtype: torch.dtype, write_y: bool) -> NormPlan:
    """The plan of ``residual + norm(x)`` from the plan of ``norm(x)`` (same eps, weight and output dtypes)."""
    return dataclasses.replace(plan, residual_dtype=residual_dtype, norm_then_add=True, write_y=write_y)
