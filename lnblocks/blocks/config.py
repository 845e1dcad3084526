"""Typed, validated configs of one residual block: ``BlockConfig`` with ``AttentionConfig`` and ``MLPConfig`` inside.

All three are frozen dataclasses. Sub-configs and norms may be given as dicts (the YAML form); an unknown key, an
unknown choice or a combination that makes no sense raises ``ValueError`` naming the option and the valid values.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from lnblocks.blocks.placements import PLACEMENTS
from lnblocks.norms import NormSpec, norm_spec

AttentionBackend = Literal["sdpa", "flash_attn", "eager"]
Activation = Literal["gelu", "gelu_tanh", "relu", "silu", "swiglu", "geglu"]

ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackend)
ACTIVATIONS: tuple[str, ...] = get_args(Activation)
GATED_ACTIVATIONS: tuple[str, ...] = ("swiglu", "geglu")
QK_NORM_KINDS: tuple[str, ...] = ("rmsnorm", "layernorm")


def _check_int(name: str, value: object, *, minimum: int = 1, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be an int{' or None' if allow_none else ''}, got {type(value).__name__} {value!r}"
        )
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def _check_prob(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float in [0, 1), got {type(value).__name__} {value!r}")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def _check_positive_float(name: str, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite float > 0 or None, got {value!r}")


class _Config:
    """Shared helpers: ``from_dict`` (unknown keys -> ValueError), ``replace`` and ``to_dict``."""

    @classmethod
    def from_dict(cls, options: dict[str, Any]) -> Any:
        if not isinstance(options, dict):
            raise TypeError(f"{cls.__name__} options must be a dict, got {type(options).__name__}")
        valid = {f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
        unknown = sorted(set(options) - valid)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} option(s) {unknown}; valid options: {sorted(valid)}")
        return cls(**options)

    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes`` applied (validated again); unknown fields raise ``ValueError``."""
        merged = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}  # type: ignore[arg-type]
        unknown = sorted(set(changes) - set(merged))
        if unknown:
            raise ValueError(f"unknown {type(self).__name__} option(s) {unknown}; valid options: {sorted(merged)}")
        return type(self)(**{**merged, **changes})

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (norm specs as ``{"kind": ..., ...}``): what configs and run records store."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, (_Config, NormSpec)):
                value = value.to_dict()
            out[f.name] = value
        return out


@dataclass(frozen=True, kw_only=True)
class AttentionConfig(_Config):
    """Multi-head self-attention with grouped KV heads (GQA, Ainslie et al. 2023; MQA with ``n_kv_heads=1``).

    ``head_dim`` None: ``dim // n_heads``. ``scale`` None: ``head_dim ** -0.5``. ``sliding_window``: a query sees at
    most this many latest keys, itself included (Mistral). ``backend``: ``"sdpa"`` (``F.scaled_dot_product_attention``),
    ``"flash_attn"`` (flash-attn on CUDA in fp16/bf16 when installed, otherwise sdpa; ``Attention.last_backend`` says
    which ran) or ``"eager"`` (explicit softmax; records attention-logit maxima and entropy in ``last_stats``).
    Positions (RoPE or learned) belong to the model: a block receives RoPE's ``(cos, sin)`` as an argument.
    """

    n_heads: int = 4
    n_kv_heads: int | None = None
    head_dim: int | None = None
    causal: bool = True
    backend: AttentionBackend = "sdpa"
    dropout: float = 0.0
    qkv_bias: bool = True
    out_bias: bool = True
    sliding_window: int | None = None
    scale: float | None = None

    def __post_init__(self) -> None:
        _check_int("n_heads", self.n_heads)
        _check_int("n_kv_heads", self.n_kv_heads, allow_none=True)
        _check_int("head_dim", self.head_dim, allow_none=True)
        _check_int("sliding_window", self.sliding_window, allow_none=True)
        for name in ("causal", "qkv_bias", "out_bias"):
            _check_bool(name, getattr(self, name))
        _check_choice("backend", self.backend, ATTENTION_BACKENDS)
        _check_prob("dropout", self.dropout)
        _check_positive_float("scale", self.scale)
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads != 0:
            raise ValueError(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
        if self.sliding_window is not None and not self.causal:
            raise ValueError("sliding_window needs causal=True (a window over past keys)")

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads


@dataclass(frozen=True, kw_only=True)
class MLPConfig(_Config):
    """Position-wise MLP: ``fc2(act(fc1(x)))``, or gated ``fc2(act(gate(x)) * up(x))`` for ``"swiglu"``/``"geglu"``
    (Shazeer 2020). ``"gelu"`` is the exact erf GELU (BERT), ``"gelu_tanh"`` the tanh approximation (GPT-2's
    ``gelu_new``). ``hidden_dim`` None: ``4 * dim``.
    """

    activation: Activation = "gelu"
    hidden_dim: int | None = None
    bias: bool = True

    def __post_init__(self) -> None:
        _check_choice("activation", self.activation, ACTIVATIONS)
        _check_int("hidden_dim", self.hidden_dim, allow_none=True)
        _check_bool("bias", self.bias)

    @property
    def gated(self) -> bool:
        return self.activation in GATED_ACTIVATIONS


def _coerce(name: str, value: Any, cls: type[_Config]) -> Any:
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        return cls.from_dict(value)
    article = "an" if cls.__name__[0] in "AEIOU" else "a"
    raise TypeError(f"{name} must be {article} {cls.__name__} or a dict, got {type(value).__name__}")


@dataclass(frozen=True, kw_only=True)
class BlockConfig(_Config):
    """One residual block: where its norms go (``placement``), which norm, and its attention and MLP.

    ``placement``: one of ``PLACEMENTS`` (``"pre"``, ``"post"``, ``"sandwich"``, ``"reordered"``, ``"deepnorm"``,
    ``"resi_dual"``, ``"parallel"``, ``"none"``); each states its formula and final-norm rule in
    ``lnblocks.blocks.PLACEMENTS``. ``norm``: anything ``build_norm`` takes (kind, preset, spec, dict).
    ``qk_norm``: None, or an rmsnorm/layernorm spec applied per head to q and k before RoPE (Qwen3).
    ``depth_scaled_norm``: multiply every input-norm output by ``1/sqrt(layer_idx + 1)`` (LayerNorm Scaling,
    Sun et al. 2025); needs a placement with an input norm. ``shared_norm``: ``"parallel"`` only, one norm feeds both
    branches (Falcon-7B, Phi). ``deepnorm_alpha``: ``"deepnorm"`` only, overrides ``(2N)^(1/4)``.
    ``rezero``: scale each branch by a learnable scalar that starts at 0 (Bachlechner et al. 2020).
    ``dropout``: on each branch output before its residual add (GPT-2's ``resid_pdrop``).
    """

    dim: int = 64
    placement: str = "pre"
    norm: NormSpec | str | dict = "layernorm"
    attention: AttentionConfig | dict = field(default_factory=AttentionConfig)
    mlp: MLPConfig | dict = field(default_factory=MLPConfig)
    qk_norm: NormSpec | str | dict | None = None
    depth_scaled_norm: bool = False
    shared_norm: bool = False
    deepnorm_alpha: float | None = None
    rezero: bool = False
    dropout: float = 0.0

    def __post_init__(self) -> None:
        _check_int("dim", self.dim)
        if self.placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {self.placement!r}; choices: {list(PLACEMENTS)}")
        object.__setattr__(self, "norm", norm_spec(self.norm))
        object.__setattr__(self, "attention", _coerce("attention", self.attention, AttentionConfig))
        object.__setattr__(self, "mlp", _coerce("mlp", self.mlp, MLPConfig))
        if self.qk_norm is not None:
            qk = norm_spec(self.qk_norm)
            if qk.kind not in QK_NORM_KINDS:
                raise ValueError(
                    f"qk_norm must be None or one of {list(QK_NORM_KINDS)} (or a preset of them), got {qk.kind!r}"
                )
            object.__setattr__(self, "qk_norm", qk)
        for name in ("depth_scaled_norm", "shared_norm", "rezero"):
            _check_bool(name, getattr(self, name))
        _check_prob("dropout", self.dropout)
        _check_positive_float("deepnorm_alpha", self.deepnorm_alpha)
        self._check_combinations()

    def _check_combinations(self) -> None:
        p = PLACEMENTS[self.placement]
        att = self.attention
        if att.head_dim is None and self.dim % att.n_heads != 0:
            raise ValueError(f"dim ({self.dim}) must be divisible by n_heads ({att.n_heads}), or set head_dim")
        if self.shared_norm and not p.parallel:
            raise ValueError(f"shared_norm=True needs placement='parallel', got placement={self.placement!r}")
        if self.deepnorm_alpha is not None and self.placement != "deepnorm":
            raise ValueError(f"deepnorm_alpha needs placement='deepnorm', got placement={self.placement!r}")
        with_in_norm = [k for k, v in PLACEMENTS.items() if v.in_norm]
        if self.depth_scaled_norm and not p.in_norm:
            raise ValueError(
                f"depth_scaled_norm scales an input norm's output; placement={self.placement!r} has none "
                f"(use one of {with_in_norm})"
            )
        if self.norm.residual_in_fp32 and not p.in_norm:
            raise ValueError(
                f"norm residual_in_fp32=True keeps a pre-norm residual stream in fp32; placement={self.placement!r} "
                f"has no input norm to fuse it into (use one of {with_in_norm})"
            )

    @property
    def head_dim(self) -> int:
        return self.attention.head_dim or self.dim // self.attention.n_heads

    @property
    def mlp_hidden_dim(self) -> int:
        return self.mlp.hidden_dim or 4 * self.dim
