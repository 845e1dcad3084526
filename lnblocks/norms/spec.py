"""Typed specs for every norm variant lnblocks knows, and the parsing that turns strings and dicts into them.

A spec says *which math* a norm computes (kind, eps, affine, bias, zero-centred weight, cast order) and which
backend may run it. It holds no tensors: modules (``lnblocks.norms.modules``), kernels, the HF patcher and configs
all name norms through these dataclasses, so a new variant is one field here plus one branch in
``lnblocks.norms.functional``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

Backend = Literal["auto", "torch", "triton"]
CastMode = Literal["fp32", "llama", "t5"]

BACKENDS: tuple[str, ...] = get_args(Backend)
CAST_MODES: tuple[str, ...] = get_args(CastMode)


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def _check_positive_float(name: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        expected = "a positive float or None" if allow_none else "a positive float"
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite float > 0, got {value!r}")


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class NormSpec:
    """Fields every norm kind shares.

    ``residual_in_fp32``: with ``norm(x, residual=r)`` the new residual ``x + r`` is kept in fp32 (the residual stream
    of flash-attn's / Mamba's fused norms), while the normalised output keeps ``x``'s dtype.
    ``backend``: ``"auto"`` (fused kernel on CUDA when it supports the spec, PyTorch otherwise), ``"torch"`` or
    ``"triton"``.
    """

    kind: ClassVar[str] = ""
    residual_in_fp32: bool = False
    backend: Backend = "auto"

    def __post_init__(self) -> None:
        _check_bool("residual_in_fp32", self.residual_in_fp32)
        _check_choice("backend", self.backend, BACKENDS)

    def replace(self, **changes: Any) -> NormSpec:
        """A copy with ``changes`` applied; unknown fields raise ``ValueError``."""
        _reject_unknown(type(self), changes)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with ``kind`` first: the form configs and run records store."""
        return {"kind": self.kind, **dataclasses.asdict(self)}


@dataclass(frozen=True, kw_only=True)
class LayerNormSpec(NormSpec):
    """LayerNorm (Ba et al. 2016) with the semantics of ``torch.nn.LayerNorm``.

    ``bias=False`` gives the bias-free LayerNorm of PaLM/OLMo; ``zero_centered`` stores ``w`` and applies ``1 + w``
    (added in fp32), TransformerEngine's ``zero_centered_gamma``.
    """

    kind: ClassVar[str] = "layernorm"
    eps: float = 1e-5
    elementwise_affine: bool = True
    bias: bool = True
    zero_centered: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive_float("eps", self.eps)
        for name in ("elementwise_affine", "bias", "zero_centered"):
            _check_bool(name, getattr(self, name))


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
    """

    kind: ClassVar[str] = "rmsnorm"
    eps: float | None = None
    elementwise_affine: bool = True
    zero_centered: bool = False
    cast: CastMode = "fp32"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive_float("eps", self.eps, allow_none=True)
        for name in ("elementwise_affine", "zero_centered"):
            _check_bool(name, getattr(self, name))
        _check_choice("cast", self.cast, CAST_MODES)
        if self.zero_centered and self.cast != "fp32":
            raise ValueError(
                "zero_centered=True adds 1 + w in fp32 and needs cast='fp32' (the Gemma/TE order), "
                f"got cast={self.cast!r}"
            )


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
        _check_positive_float("alpha_init", self.alpha_init)
        for name in ("elementwise_affine", "bias"):
            _check_bool(name, getattr(self, name))


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
        _check_positive_float("eps", self.eps)
        _check_positive_float("scale_init", self.scale_init, allow_none=True)
        _check_bool("learnable", self.learnable)


@dataclass(frozen=True, kw_only=True)
class NoNormSpec(NormSpec):
    """No normalisation (identity); with a residual it still returns ``(x + r, x + r)``."""

    kind: ClassVar[str] = "none"


SPEC_TYPES: dict[str, type[NormSpec]] = {
    cls.kind: cls for cls in (LayerNormSpec, RMSNormSpec, DyTSpec, ScaleNormSpec, NoNormSpec)
}

# Checkpoint-exact settings of the norms in well-known model families (HF default eps of each class).
NORM_PRESETS: dict[str, NormSpec] = {
    "llama": RMSNormSpec(eps=1e-6, cast="llama"),
    "mistral": RMSNormSpec(eps=1e-6, cast="llama"),
    "qwen2": RMSNormSpec(eps=1e-6, cast="llama"),
    "qwen3": RMSNormSpec(eps=1e-6, cast="llama"),
    "phi3": RMSNormSpec(eps=1e-6, cast="llama"),
    "gemma": RMSNormSpec(eps=1e-6, cast="fp32", zero_centered=True),
    "olmo2": RMSNormSpec(eps=1e-6, cast="fp32"),
    "t5": RMSNormSpec(eps=1e-6, cast="t5"),
    "gpt2": LayerNormSpec(eps=1e-5),
    "bert": LayerNormSpec(eps=1e-12),
    "te_layernorm": LayerNormSpec(eps=1e-5, zero_centered=True),
    "te_rmsnorm": RMSNormSpec(eps=1e-5, zero_centered=True),
}


def _reject_unknown(cls: type[NormSpec], options: dict[str, Any]) -> None:
    valid = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - valid)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for norm kind {cls.kind!r}; valid options: {sorted(valid)}")


def norm_spec(kind: str | NormSpec | dict[str, Any], **options: Any) -> NormSpec:
    """Resolve a kind name, preset name, spec or config dict (``{"kind": ..., **options}``) into a spec.

    ``options`` override the spec's fields; an unknown kind or option raises ``ValueError`` listing the choices.
    """
    if isinstance(kind, dict):
        options = {**{k: v for k, v in kind.items() if k != "kind"}, **options}
        if "kind" not in kind:
            raise ValueError(f"norm config {kind!r} needs a 'kind' key; choices: {available_norms()}")
        kind = kind["kind"]
    if isinstance(kind, NormSpec):
        return kind.replace(**options) if options else kind
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a str, dict or NormSpec, got {type(kind).__name__}")
    key = kind.lower()
    if key in NORM_PRESETS:
        return NORM_PRESETS[key].replace(**options)
    if key not in SPEC_TYPES:
        raise ValueError(f"unknown norm kind {kind!r}; choices: {available_norms()}")
    cls = SPEC_TYPES[key]
    _reject_unknown(cls, options)
    return cls(**options)


def available_norms() -> list[str]:
    """Kind names followed by preset names, as accepted by ``build_norm``."""
    return [*SPEC_TYPES, *NORM_PRESETS]
