"""Typed specs for every norm variant lnblocks knows, and the parsing that turns strings and dicts into them.

A spec says *which math* a norm computes (kind, eps, affine, bias, zero-centred weight, cast order) and which
backend may run it. It holds no tensors: modules (``lnblocks.norms.modules``), kernels, the HF patcher and configs
all name norms through these dataclasses, so a new variant is one field here plus one branch in
``lnblocks.norms.functional``. Specs are ``lnblocks.config.Config``s: one exception policy (unknown key or bad value:
``ValueError`` naming the dotted key and what is valid; wrong type: ``TypeError``). Presets come from the one table
of model families, ``lnblocks.norms.families``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

from lnblocks.config import (
    Config,
    ConfigTypeError,
    ConfigValueError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    join_key,
    under_key,
)
from lnblocks.norms.families import MODEL_FAMILIES

Backend = Literal["auto", "torch", "triton"]
CastMode = Literal["fp32", "llama", "t5"]
LayerNormCast = Literal["fp32", "cohere", "nemotron"]
GatedCast = Literal["llama", "fp32"]
GatePosition = Literal["before", "after"]
GateActivation = Literal["silu", "sigmoid"]
L2Reduction = Literal["mean", "sum"]

BACKENDS: tuple[str, ...] = get_args(Backend)
CAST_MODES: tuple[str, ...] = get_args(CastMode)
LAYERNORM_CASTS: tuple[str, ...] = get_args(LayerNormCast)
GATED_CASTS: tuple[str, ...] = get_args(GatedCast)
GATE_POSITIONS: tuple[str, ...] = get_args(GatePosition)
GATE_ACTIVATIONS: tuple[str, ...] = get_args(GateActivation)
L2_REDUCTIONS: tuple[str, ...] = get_args(L2Reduction)


@dataclass(frozen=True, kw_only=True)
class NormSpec(Config):
    """Fields every norm kind shares.

    ``residual_in_fp32``: with ``norm(x, residual=r)`` the new residual ``x + r`` is kept in fp32 (the residual stream
    of flash-attn's / Mamba's fused norms), while the normalised output keeps ``x``'s dtype.
    ``backend``: ``"auto"`` (fused kernel on CUDA when it supports the spec, PyTorch otherwise), ``"torch"`` or
    ``"triton"``.
    """

    kind: ClassVar[str] = ""
    # Fields added after specs were first stored, with the value that does what a spec did before the field existed:
    # ``to_dict`` leaves a field out while it has that value, so stored configs, run records and the study's run ids
    # keep their form; ``from_dict`` fills it back in.
    ADDED_DEFAULTS: ClassVar[dict[str, Any]] = {}
    residual_in_fp32: bool = False
    backend: Backend = "auto"

    def __post_init__(self) -> None:
        check_bool("residual_in_fp32", self.residual_in_fp32)
        check_choice("backend", self.backend, BACKENDS)

    @classmethod
    def from_dict(cls, options: Any = None, *, key: str = "") -> Any:
        """A spec from its dict form ``{"kind": ..., **options}``; on ``NormSpec`` itself also from a kind or preset
        name or a spec (what ``norm_spec`` takes). On a subclass ``kind`` may be left out. Errors name ``key``."""
        if cls is NormSpec:
            return _resolve(options, {}, key)
        if isinstance(options, Mapping) and "kind" in options:
            if options["kind"] != cls.kind:
                raise ConfigValueError(
                    join_key(key, "kind"), f"must be {cls.kind!r} for {cls.__name__}, got {options['kind']!r}"
                )
            options = {k: v for k, v in options.items() if k != "kind"}
        return super().from_dict(options, key=key)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with ``kind`` first: the form configs and run records store (added fields at their
        ``ADDED_DEFAULTS`` left out)."""
        out = super().to_dict()
        for name, default in self.ADDED_DEFAULTS.items():
            if name in out and out[name] == default and type(out[name]) is type(default):
                del out[name]
        return {"kind": self.kind, **out}


def _check_zero_centered_has_weight(spec: LayerNormSpec | RMSNormSpec) -> None:
    if spec.zero_centered and not spec.elementwise_affine:
        raise ConfigValueError(
            "zero_centered",
            "must be False with elementwise_affine=False: it says how the weight is stored (w, applied as 1 + w), "
            "and there is no weight",
        )


def _check_groups(spec: LayerNormSpec | RMSNormSpec | GatedRMSNormSpec) -> None:
    """``group_size`` (statistics over groups of that many elements) and ``per_head`` (groups = the last dim) are one
    choice: the module checks the group size against its shape."""
    spec._set("group_size", check_int("group_size", spec.group_size, allow_none=True))
    check_bool("per_head", spec.per_head)
    if spec.per_head and spec.group_size is not None:
        raise ConfigValueError(
            "group_size", f"must be None with per_head=True (the groups are the last dim), got {spec.group_size}"
        )


def _check_memory_efficient(spec: LayerNormSpec | RMSNormSpec | L2NormSpec) -> None:
    check_bool("memory_efficient", spec.memory_efficient)
    if spec.memory_efficient and spec.backend == "torch":
        raise ConfigValueError(
            "memory_efficient",
            "needs the fused kernels (backend 'auto' or 'triton'): it is their backward that rebuilds the input "
            "from the output; the torch backend saves what its autograd ops save",
        )


def _check_no_kernel_backend(spec: NormSpec) -> None:
    if spec.backend == "triton":
        raise ConfigValueError(
            "backend", f"must be 'auto' or 'torch' for norm kind {spec.kind!r}: it has no fused kernel, got 'triton'"
        )


@dataclass(frozen=True, kw_only=True)
class LayerNormSpec(NormSpec):
    """LayerNorm (Ba et al. 2016) with the semantics of ``torch.nn.LayerNorm``.

    ``bias=False`` gives the bias-free LayerNorm of PaLM/OLMo; ``zero_centered`` stores ``w`` and applies ``1 + w``
    (added in fp32), TransformerEngine's ``zero_centered_gamma``.

    ``cast`` picks the HF class whose rounding it reproduces: ``"fp32"`` (``F.layer_norm``), ``"cohere"``
    (``CohereLayerNorm``: mean, centred variance and weight multiply written out in fp32, one cast at the end) or
    ``"nemotron"`` (``NemotronLayerNorm1P``: with ``zero_centered`` the ``+ 1`` is added in the weight's dtype, and
    under CUDA autocast input, ``1 + w`` and bias are cast to the autocast dtype and the norm runs there).

    ``group_size``: statistics over consecutive groups of that many elements of the (flattened) normalised dims, the
    parameters still covering all of them; ``per_head``: the groups are the last dim, for parameters of shape
    ``(heads, head_dim)`` over ``(..., heads, head_dim)`` (Cohere's qk-norm). ``memory_efficient``: the fused
    backward saves the output instead of the input and rebuilds x_hat from it (Apex's ``memory_efficient``; the
    rule for the weight is in ``docs/norms.md``).
    """

    kind: ClassVar[str] = "layernorm"
    ADDED_DEFAULTS: ClassVar[dict[str, Any]] = {
        "cast": "fp32", "group_size": None, "per_head": False, "memory_efficient": False
    }  # fmt: skip
    eps: float = 1e-5
    elementwise_affine: bool = True
    bias: bool = True
    zero_centered: bool = False
    cast: LayerNormCast = "fp32"
    group_size: int | None = None
    per_head: bool = False
    memory_efficient: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("eps", check_float("eps", self.eps, lo=0))
        for name in ("elementwise_affine", "bias", "zero_centered"):
            check_bool(name, getattr(self, name))
        check_choice("cast", self.cast, LAYERNORM_CASTS)
        _check_zero_centered_has_weight(self)
        _check_groups(self)
        _check_memory_efficient(self)


@dataclass(frozen=True, kw_only=True)
class RMSNormSpec(NormSpec):
    """RMSNorm (Zhang & Sennrich 2019): ``x / sqrt(mean(x^2) + eps) * w``, no mean subtraction, no bias.

    ``eps=None`` means the machine epsilon of the compute dtype at call time (fp32's for fp16/bf16/fp32 inputs, fp64's
    for fp64), which is what ``torch.nn.RMSNorm`` does (its docs say ``finfo(x.dtype)``; the code uses the opmath type).

    ``cast`` picks where the fp32 result is rounded, which is what makes HF families differ bit for bit:

    - ``"fp32"``: normalise and multiply by the weight in fp32, cast once at the end. ``torch.nn.RMSNorm``,
      OLMo2 (``Olmo2RMSNorm``), Gemma (``GemmaRMSNorm``, with ``zero_centered=True``), TransformerEngine.
    - ``"llama"``: normalise in fp32, cast to the input dtype, then multiply by the weight in the weight's dtype
      (``LlamaRMSNorm`` and its copies: Mistral, Qwen2/3, Phi3). Output dtype follows type promotion.
    - ``"t5"``: normalise in fp32, cast to the weight's dtype only if the weight is fp16/bf16, then multiply
      (``T5LayerNorm``). With an fp32 weight the output is fp32.

    ``group_size``, ``per_head``, ``memory_efficient``: as for ``LayerNormSpec``.
    """

    kind: ClassVar[str] = "rmsnorm"
    ADDED_DEFAULTS: ClassVar[dict[str, Any]] = {"group_size": None, "per_head": False, "memory_efficient": False}
    eps: float | None = None
    elementwise_affine: bool = True
    zero_centered: bool = False
    cast: CastMode = "fp32"
    group_size: int | None = None
    per_head: bool = False
    memory_efficient: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("eps", check_float("eps", self.eps, lo=0, allow_none=True))
        for name in ("elementwise_affine", "zero_centered"):
            check_bool(name, getattr(self, name))
        check_choice("cast", self.cast, CAST_MODES)
        _check_zero_centered_has_weight(self)
        if self.zero_centered and self.cast != "fp32":
            raise ConfigValueError(
                "cast",
                f"must be 'fp32' with zero_centered=True (1 + w is added in fp32, the Gemma/TE order), "
                f"got {self.cast!r}",
            )
        _check_groups(self)
        _check_memory_efficient(self)


@dataclass(frozen=True, kw_only=True)
class GatedRMSNormSpec(NormSpec):
    """RMSNorm with a multiplicative gate, the norm of every hybrid SSM / linear-attention family: called as
    ``norm(x, gate)``.

    ``gate="before"``: ``rms(x * act(gate)) * w`` (``MambaRMSNormGated`` and its copies in Bamba, Zamba2,
    GraniteMoeHybrid, NemotronH; FalconH1 with ``mamba_norm_before_gate=False``); ``"after"``:
    ``rms(x) * w * act(gate)`` (``Qwen3NextRMSNormGated``, FalconH1's default). ``activation``: ``"silu"`` or
    ``"sigmoid"``. ``group_size``: RMS over consecutive groups of that many elements (Mamba2's ``n_groups``), None for
    the whole row. ``cast``: ``"llama"`` rounds the normalised value to the input dtype before the weight multiply
    (Mamba2, Qwen3-Next), ``"fp32"`` multiplies in fp32 and casts once (FalconH1). The gate is applied in fp32.
    """

    kind: ClassVar[str] = "gated_rmsnorm"
    eps: float = 1e-6
    elementwise_affine: bool = True
    gate: GatePosition = "before"
    activation: GateActivation = "silu"
    cast: GatedCast = "llama"
    group_size: int | None = None
    per_head: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("eps", check_float("eps", self.eps, lo=0))
        check_bool("elementwise_affine", self.elementwise_affine)
        check_choice("gate", self.gate, GATE_POSITIONS)
        check_choice("activation", self.activation, GATE_ACTIVATIONS)
        check_choice("cast", self.cast, GATED_CASTS)
        _check_groups(self)
        if self.residual_in_fp32:
            raise ConfigValueError(
                "residual_in_fp32", "must be False for gated_rmsnorm: it takes a gate, not a residual, got True"
            )


@dataclass(frozen=True, kw_only=True)
class L2NormSpec(NormSpec):
    """Parameter-free normalisation of the last dims: ``x * rsqrt(mean(x^2) + eps)`` (``reduction="mean"``: unit RMS,
    Llama 4's qk-norm ``Llama4TextL2Norm``) or ``x * rsqrt(sum(x^2) + eps)`` (``"sum"``: unit L2 norm, the q/k
    normalisation of gated-delta-rule linear attention). Computed in fp32, one cast at the end."""

    kind: ClassVar[str] = "l2norm"
    eps: float = 1e-6
    reduction: L2Reduction = "mean"
    memory_efficient: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("eps", check_float("eps", self.eps, lo=0))
        check_choice("reduction", self.reduction, L2_REDUCTIONS)
        _check_memory_efficient(self)


@dataclass(frozen=True, kw_only=True)
class DerfSpec(NormSpec):
    """Dynamic erf (Chen et al. 2025, arXiv 2512.10938): ``w * erf(alpha * x + shift) + b``, a point-wise replacement
    for LayerNorm/RMSNorm; ``alpha`` and ``shift`` are learnable scalars, ``w``/``b`` per channel.

    Initialised as the paper's released code does: ``alpha_init=0.5``, ``shift_init=0.0``, ``w = 1``, ``b = 0``.
    """

    kind: ClassVar[str] = "derf"
    alpha_init: float = 0.5
    shift_init: float = 0.0
    elementwise_affine: bool = True
    bias: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("alpha_init", check_float("alpha_init", self.alpha_init, lo=0, lo_open=True))
        self._set("shift_init", check_float("shift_init", self.shift_init))
        for name in ("elementwise_affine", "bias"):
            check_bool(name, getattr(self, name))


@dataclass(frozen=True, kw_only=True)
class DyTSpec(NormSpec):
    """Dynamic Tanh (Zhu et al. 2025, "Transformers without Normalization"): ``w * tanh(alpha * x) + b``.

    ``alpha`` is one learnable scalar initialised to ``alpha_init`` (0.5 in the paper for LLM widths up to ~4k).
    """

    kind: ClassVar[str] = "dyt"
    alpha_init: float = 0.5
    elementwise_affine: bool = True
    bias: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("alpha_init", check_float("alpha_init", self.alpha_init, lo=0, lo_open=True))
        for name in ("elementwise_affine", "bias"):
            check_bool(name, getattr(self, name))


@dataclass(frozen=True, kw_only=True)
class ScaleNormSpec(NormSpec):
    """ScaleNorm (Nguyen & Salazar 2019): ``g * x / max(||x||_2, eps)`` with one learnable scalar ``g``.

    ``g`` starts at ``sqrt(dim)`` when ``scale_init`` is None, as in the paper.
    """

    kind: ClassVar[str] = "scalenorm"
    eps: float = 1e-5
    scale_init: float | None = None
    learnable: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("eps", check_float("eps", self.eps, lo=0))
        self._set("scale_init", check_float("scale_init", self.scale_init, lo=0, lo_open=True, allow_none=True))
        check_bool("learnable", self.learnable)
        _check_no_kernel_backend(self)


@dataclass(frozen=True, kw_only=True)
class NoNormSpec(NormSpec):
    """No normalisation (identity); with a residual it still returns ``(x + r, x + r)``."""

    kind: ClassVar[str] = "none"


SPEC_TYPES: dict[str, type[NormSpec]] = {
    cls.kind: cls
    for cls in (LayerNormSpec, RMSNormSpec, DyTSpec, ScaleNormSpec, NoNormSpec, GatedRMSNormSpec, L2NormSpec, DerfSpec)
}

# Checkpoint-exact settings of the norms of well-known model families: one per row of the family table.
NORM_PRESETS: dict[str, NormSpec] = {
    name: SPEC_TYPES[family.norm["kind"]].from_dict(family.norm, key=f"MODEL_FAMILIES[{name!r}].norm")
    for name, family in MODEL_FAMILIES.items()
}


def _without_kind(options: Mapping[str, Any], kind: str, named: str, key: str) -> Mapping[str, Any]:
    """``options`` less a ``kind`` that agrees with the norm already named (``build_norm("llama", 8, kind=...)``)."""
    if "kind" not in options:
        return options
    given = options["kind"]
    if not (isinstance(given, str) and given.lower() in (kind, named.lower())):
        raise ConfigValueError(
            join_key(key, "kind"),
            f"{given!r} contradicts {named!r} (kind {kind!r}): name the norm once, as its kind or as a preset",
        )
    return {k: v for k, v in options.items() if k != "kind"}


def _apply(spec: NormSpec, options: Mapping[str, Any], key: str, named: str) -> NormSpec:
    options = _without_kind(options, spec.kind, named, key)
    if not options:
        return spec
    with under_key(key):
        return spec.replace(**options)


def _resolve(value: Any, options: Mapping[str, Any], key: str) -> NormSpec:
    """``norm_spec``'s resolution; ``key`` is the config key of the norm (``"norm"``, ``"block.qk_norm"``)."""
    if isinstance(value, NormSpec):
        return _apply(value, options, key, value.kind)
    if isinstance(value, Mapping):
        if "kind" not in value:
            raise ConfigValueError(
                join_key(key, "kind"), f"is required in a norm config {dict(value)!r}; choices: {available_norms()}"
            )
        rest = {k: v for k, v in value.items() if k != "kind"}
        return _resolve_name(value["kind"], {**rest, **options}, join_key(key, "kind"), key)
    return _resolve_name(value, options, key or "kind", key)


def _resolve_name(name: Any, options: Mapping[str, Any], name_key: str, key: str) -> NormSpec:
    if not isinstance(name, str):
        raise ConfigTypeError(
            name_key, f"must be a norm kind or preset name, a NormSpec or a dict with 'kind', got {type(name).__name__}"
        )
    lowered = name.lower()
    if lowered in NORM_PRESETS:
        return _apply(NORM_PRESETS[lowered], options, key, name)
    if lowered not in SPEC_TYPES:
        raise ConfigValueError(
            name_key, f"must be a norm kind or preset; unknown norm kind {name!r}; choices: {available_norms()}"
        )
    options = _without_kind(options, lowered, name, key)
    return SPEC_TYPES[lowered].from_dict(dict(options), key=key)


def norm_spec(kind: str | NormSpec | dict[str, Any], /, **options: Any) -> NormSpec:
    """Resolve a kind name, preset name, spec or config dict (``{"kind": ..., **options}``) into a spec.

    ``options`` override the spec's fields. An unknown kind or option raises ``ValueError`` naming it and the valid
    choices; a value of the wrong type raises ``TypeError``.
    """
    return _resolve(kind, options, "")


def available_norms() -> list[str]:
    """Kind names followed by preset names, as accepted by ``build_norm``."""
    return [*SPEC_TYPES, *NORM_PRESETS]
