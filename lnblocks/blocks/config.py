"""Typed, validated configs of one residual block: ``BlockConfig`` with ``AttentionConfig`` and ``MLPConfig`` inside.

All three are ``lnblocks.config.Config``s (frozen dataclasses). Sub-configs and norms may be given as dicts (the YAML
form); an unknown key, an unknown choice or a combination that makes no sense raises ``ValueError`` naming the dotted
key (``attention.n_heads``) and the valid values, a value of the wrong type ``TypeError``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from lnblocks.blocks.placements import PLACEMENTS
from lnblocks.config import (
    Config,
    ConfigTypeError,
    ConfigValueError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_prob,
)
from lnblocks.norms import NormSpec

AttentionBackend = Literal["sdpa", "flash_attn", "eager"]
Activation = Literal["gelu", "gelu_tanh", "relu", "silu", "swiglu", "geglu"]

ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackend)
ACTIVATIONS: tuple[str, ...] = get_args(Activation)
GATED_ACTIVATIONS: tuple[str, ...] = ("swiglu", "geglu")
QK_NORM_KINDS: tuple[str, ...] = ("rmsnorm", "layernorm")


@dataclass(frozen=True, kw_only=True)
class AttentionConfig(Config):
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
        for name in ("n_heads", "n_kv_heads", "head_dim", "sliding_window"):
            self._set(name, check_int(name, getattr(self, name), allow_none=name != "n_heads"))
        for name in ("causal", "qkv_bias", "out_bias"):
            check_bool(name, getattr(self, name))
        check_choice("backend", self.backend, ATTENTION_BACKENDS)
        self._set("dropout", check_prob("dropout", self.dropout))
        self._set("scale", check_float("scale", self.scale, lo=0, lo_open=True, allow_none=True))
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads != 0:
            raise ConfigValueError("n_kv_heads", f"({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
        if self.sliding_window is not None and not self.causal:
            raise ConfigValueError("sliding_window", "needs causal=True (a window over past keys)")

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads


@dataclass(frozen=True, kw_only=True)
class MLPConfig(Config):
    """Position-wise MLP: ``fc2(act(fc1(x)))``, or gated ``fc2(act(gate(x)) * up(x))`` for ``"swiglu"``/``"geglu"``
    (Shazeer 2020). ``"gelu"`` is the exact erf GELU (BERT), ``"gelu_tanh"`` the tanh approximation (GPT-2's
    ``gelu_new``). ``hidden_dim`` None: ``4 * dim``.
    """

    activation: Activation = "gelu"
    hidden_dim: int | None = None
    bias: bool = True

    def __post_init__(self) -> None:
        check_choice("activation", self.activation, ACTIVATIONS)
        self._set("hidden_dim", check_int("hidden_dim", self.hidden_dim, allow_none=True))
        check_bool("bias", self.bias)

    @property
    def gated(self) -> bool:
        return self.activation in GATED_ACTIVATIONS


@dataclass(frozen=True, kw_only=True)
class BlockConfig(Config):
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
    ``mlp_norm``: NormFormer's FFN norm (Shleifer et al. 2021, arXiv 2110.09456): a norm over the MLP's hidden
    activations, after the activation (after the gating product for SwiGLU/GeGLU), before ``fc2``; any placement.
    ``True`` uses the block's ``norm``; a norm (kind, preset, spec, dict) uses that one; ``False`` none.
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
    mlp_norm: bool | NormSpec | str | dict = False

    def __post_init__(self) -> None:
        self._set("dim", check_int("dim", self.dim))
        check_choice("placement", self.placement, PLACEMENTS)
        self._set("norm", NormSpec.from_dict(self.norm, key="norm"))
        self._nested("attention", AttentionConfig)
        self._nested("mlp", MLPConfig)
        if self.qk_norm is not None:
            qk = NormSpec.from_dict(self.qk_norm, key="qk_norm")
            if qk.kind not in QK_NORM_KINDS:
                raise ConfigValueError(
                    "qk_norm", f"must be None or one of {list(QK_NORM_KINDS)} (or a preset of them), got {qk.kind!r}"
                )
            self._set("qk_norm", qk)
        for name in ("depth_scaled_norm", "shared_norm", "rezero"):
            check_bool(name, getattr(self, name))
        if not isinstance(self.mlp_norm, (bool, NormSpec, str, dict)):
            raise ConfigTypeError(
                "mlp_norm", f"must be a bool or a norm (kind, preset, spec or dict), got {self.mlp_norm!r}"
            )
        if not isinstance(self.mlp_norm, bool):
            self._set("mlp_norm", NormSpec.from_dict(self.mlp_norm, key="mlp_norm"))
        self._set("dropout", check_prob("dropout", self.dropout))
        self._set(
            "deepnorm_alpha", check_float("deepnorm_alpha", self.deepnorm_alpha, lo=0, lo_open=True, allow_none=True)
        )
        self._check_combinations()

    def _check_combinations(self) -> None:
        p = PLACEMENTS[self.placement]
        att = self.attention
        if att.head_dim is None and self.dim % att.n_heads != 0:
            raise ConfigValueError(
                "dim", f"({self.dim}) must be divisible by n_heads ({att.n_heads}), or set attention.head_dim"
            )
        if self.shared_norm and not p.parallel:
            raise ConfigValueError(
                "shared_norm",
                f"needs placement='parallel' (one norm feeds both branches), got placement={self.placement!r}",
            )
        if self.deepnorm_alpha is not None and self.placement != "deepnorm":
            raise ConfigValueError("deepnorm_alpha", f"needs placement='deepnorm', got placement={self.placement!r}")
        with_in_norm = [k for k, v in PLACEMENTS.items() if v.in_norm]
        if self.depth_scaled_norm and not p.in_norm:
            raise ConfigValueError(
                "depth_scaled_norm",
                f"scales an input norm's output; placement={self.placement!r} has none (use one of {with_in_norm})",
            )
        if self.norm.residual_in_fp32 and not p.in_norm:
            raise ConfigValueError(
                "norm.residual_in_fp32",
                f"keeps a pre-norm residual stream in fp32; placement={self.placement!r} has no input norm to "
                f"fuse it into (use one of {with_in_norm})",
            )

    @property
    def mlp_norm_spec(self) -> NormSpec | None:
        """The norm inside the MLP: the block's ``norm`` for ``mlp_norm=True``, the given one, or None."""
        if isinstance(self.mlp_norm, bool):
            return self.norm if self.mlp_norm else None
        return self.mlp_norm

    @property
    def head_dim(self) -> int:
        return self.attention.head_dim or self.dim // self.attention.n_heads

    @property
    def mlp_hidden_dim(self) -> int:
        return self.mlp.hidden_dim or 4 * self.dim
