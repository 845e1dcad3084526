"""Typed, validated configs of one residual block: ``BlockConfig`` with ``AttentionConfig`` and ``MLPConfig`` inside.

All three are ``lnblocks.config.Config``s (frozen dataclasses). Sub-configs and norms may be given as dicts (the YAML
form); an unknown key, an unknown choice or a combination that makes no sense raises ``ValueError`` naming the dotted
key (``attention.n_heads``) and the valid values, a value of the wrong type ``TypeError``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

from lnblocks.blocks.hyper import HyperConnectionsConfig
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
    under_key,
)
from lnblocks.norms import NormSpec

AttentionBackend = Literal["sdpa", "flash_attn", "eager"]
Activation = Literal["gelu", "gelu_tanh", "relu", "silu", "swiglu", "geglu", "geglu_tanh"]
OutputGate = Literal["headwise", "elementwise"]

ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackend)
ACTIVATIONS: tuple[str, ...] = get_args(Activation)
GATED_ACTIVATIONS: tuple[str, ...] = ("swiglu", "geglu", "geglu_tanh")
QK_NORM_KINDS: tuple[str, ...] = ("rmsnorm", "layernorm")
OUTPUT_GATES: tuple[str, ...] = get_args(OutputGate)


class AddedFields:
    """Mixin: ``ADDED`` names fields added after configs were first stored; ``to_dict()`` leaves each out while it
    is None (its default, which does what configs did before it existed), so the stored form of an existing config
    (YAML, run records, the study's run ids) does not change. ``from_dict`` fills them back in."""

    ADDED: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()  # type: ignore[misc]
        for name in self.ADDED:
            if out.get(name, 0) is None:
                del out[name]
        return out


def _norm_or_none(value: Any, key: str) -> NormSpec | None:
    """A per-head norm option (``qk_norm``, ``v_norm``): None, or an rmsnorm/layernorm spec."""
    if value is None:
        return None
    spec = NormSpec.from_dict(value, key=key)
    if spec.kind not in QK_NORM_KINDS:
        raise ConfigValueError(
            key, f"must be None or one of {list(QK_NORM_KINDS)} (or a preset of them), got {spec.kind!r}"
        )
    return spec


@dataclass(frozen=True, kw_only=True)
class AttentionConfig(AddedFields, Config):
    """Multi-head self-attention with grouped KV heads (GQA, Ainslie et al. 2023; MQA with ``n_kv_heads=1``).

    ``head_dim`` None: ``dim // n_heads``. ``scale`` None: ``head_dim ** -0.5``. ``sliding_window``: a query sees at
    most this many latest keys, itself included (Mistral). ``backend``: ``"sdpa"`` (``F.scaled_dot_product_attention``),
    ``"flash_attn"`` (flash-attn on CUDA in fp16/bf16 when installed, otherwise sdpa; ``Attention.last_backend`` says
    which ran) or ``"eager"`` (explicit softmax; records attention-logit maxima and entropy in ``last_stats``).
    Positions (RoPE or learned) belong to the model: a block receives RoPE's ``(cos, sin)`` as an argument.
    ``softcap``: None, or ``c`` for Gemma 2's attention-logit soft-capping ``c * tanh(logits / c)`` (arXiv
    2408.00118; sdpa cannot cap: a capped layer runs eager, or flash-attn's own cap). ``output_gate``: None,
    ``"headwise"`` or ``"elementwise"``, the sigmoid gate on the SDPA output computed from the attention's input
    (gated attention, Qiu et al. 2025, arXiv 2505.06708).
    """

    ADDED: ClassVar[tuple[str, ...]] = ("softcap", "output_gate")

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
    softcap: float | None = None
    output_gate: OutputGate | None = None

    def __post_init__(self) -> None:
        for name in ("n_heads", "n_kv_heads", "head_dim", "sliding_window"):
            self._set(name, check_int(name, getattr(self, name), allow_none=name != "n_heads"))
        for name in ("causal", "qkv_bias", "out_bias"):
            check_bool(name, getattr(self, name))
        check_choice("backend", self.backend, ATTENTION_BACKENDS)
        self._set("dropout", check_prob("dropout", self.dropout))
        self._set("scale", check_float("scale", self.scale, lo=0, lo_open=True, allow_none=True))
        self._set("softcap", check_float("softcap", self.softcap, lo=0, lo_open=True, allow_none=True))
        check_choice("output_gate", self.output_gate, OUTPUT_GATES, allow_none=True)
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
class BlockConfig(AddedFields, Config):
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
    ``v_norm``: None, or an rmsnorm/layernorm spec applied per head to v (with ``qk_norm``: HybridNorm's
    QKV-norm, Zhuo et al. 2025, arXiv 2503.04598). ``mlp_placement``: None (the MLP sublayer follows
    ``placement``), or the MLP sublayer's own placement: per-sublayer placement, both among the single-stream rows
    (``Placement.sublayer``); HybridNorm is ``placement="none"`` with QKV-norm and ``mlp_placement=
    "normed_residual"`` (``lnblocks.models.hybridnorm``). ``hyper_connections``: None, or a
    ``HyperConnectionsConfig`` (``n_streams`` residual streams, ``kind`` static / dynamic / mhc) replacing the
    residual adds of a placement without a post norm (``lnblocks.blocks.hyper``).
    ``memory_efficient``: None (as ``norm`` says), or True: the block's norms (``norm``, and ``mlp_norm=True``) save
    their output for the backward instead of their input (the fused kernels' ``memory_efficient``, Apex's option;
    ``docs/norms.md``): the input of a pre-norm, the residual stream, is then freed, one activation per norm. For
    norm kinds that have it (layernorm, rmsnorm, l2norm) on the fused backend ("auto" or "triton").
    """

    ADDED: ClassVar[tuple[str, ...]] = ("v_norm", "mlp_placement", "hyper_connections", "memory_efficient")

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
    v_norm: NormSpec | str | dict | None = None
    mlp_placement: str | None = None
    hyper_connections: HyperConnectionsConfig | dict | None = None
    memory_efficient: bool | None = None

    def __post_init__(self) -> None:
        self._set("dim", check_int("dim", self.dim))
        check_choice("placement", self.placement, PLACEMENTS)
        check_choice("mlp_placement", self.mlp_placement, PLACEMENTS, allow_none=True)
        self._set("norm", NormSpec.from_dict(self.norm, key="norm"))
        self._apply_memory_efficient()
        self._nested("attention", AttentionConfig)
        self._nested("mlp", MLPConfig)
        self._nested("hyper_connections", HyperConnectionsConfig, allow_none=True)
        self._set("qk_norm", _norm_or_none(self.qk_norm, "qk_norm"))
        self._set("v_norm", _norm_or_none(self.v_norm, "v_norm"))
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

    def _apply_memory_efficient(self) -> None:
        """``memory_efficient=True`` sets the norm spec's option (refused, naming why, where the kind lacks it or the
        backend is torch); False contradicts a norm that has it on."""
        check_bool("memory_efficient", self.memory_efficient, allow_none=True)
        has = "memory_efficient" in self.norm.field_names()
        if self.memory_efficient and not has:
            raise ConfigValueError(
                "memory_efficient",
                f"is True, but norm kind {self.norm.kind!r} has no memory-efficient backward (layernorm, rmsnorm and "
                "l2norm have)",
            )
        if self.memory_efficient:
            with under_key("norm"):
                self._set("norm", self.norm.replace(memory_efficient=True))
        elif self.memory_efficient is False and has and self.norm.memory_efficient:
            raise ConfigValueError("memory_efficient", "is False while norm.memory_efficient is True: set one of them")

    def _check_combinations(self) -> None:
        p, pm = PLACEMENTS[self.placement], PLACEMENTS[self.mlp_placement or self.placement]
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
        with_in_norm = [k for k, v in PLACEMENTS.items() if v.in_norm and not v.siamese]
        if self.depth_scaled_norm and not (p.in_norm or pm.in_norm):
            raise ConfigValueError(
                "depth_scaled_norm",
                f"scales an input norm's output; placement={self.placement!r} has none (use one of {with_in_norm})",
            )
        if self.norm.residual_in_fp32 and not (p.in_norm or pm.in_norm):
            raise ConfigValueError(
                "norm.residual_in_fp32",
                f"keeps a pre-norm residual stream in fp32; placement={self.placement!r} has no input norm to "
                f"fuse it into (use one of {with_in_norm})",
            )
        self._check_new_options(p, pm)

    def _check_new_options(self, p: Any, pm: Any) -> None:
        """Per-sublayer placement, SiameseNorm, nGPT and hyper-connections: what each combines with."""
        single = [k for k, v in PLACEMENTS.items() if v.sublayer]
        if self.mlp_placement not in (None, self.placement) and not (p.sublayer and pm.sublayer):
            raise ConfigValueError(
                "mlp_placement",
                f"sets a per-sublayer placement: both sublayers' placements must be among {single} (one stream, "
                f"no block-level constant), got placement={self.placement!r}, mlp_placement={self.mlp_placement!r}",
            )
        if self.norm.residual_in_fp32 and (p.siamese or p.normalized or pm.residual_after_norm or p.residual_after_norm
                                           or self.hyper_connections is not None):  # fmt: skip
            raise ConfigValueError(
                "norm.residual_in_fp32", "keeps a pre-norm residual stream in fp32: only with pre-norm-like streams"
            )
        if p.siamese:
            for name in ("depth_scaled_norm", "hyper_connections"):
                if getattr(self, name) not in (False, None):
                    raise ConfigValueError(name, "is not available with placement 'siamese' (its own two streams)")
        if p.normalized:
            self._check_ngpt()
        if self.hyper_connections is not None:
            allowed = [k for k, v in PLACEMENTS.items() if v.sublayer and not v.post_norm and not v.residual_after_norm]
            for key, name in (("placement", self.placement), ("mlp_placement", self.mlp_placement)):
                if name is not None and name not in allowed:
                    raise ConfigValueError(
                        key,
                        f"with hyper_connections must be one of {allowed} (the streams replace the residual add), "
                        f"got {name!r}",
                    )

    def _check_ngpt(self) -> None:
        """nGPT (Loshchilov et al. 2024): no norms, biases, dropout or gates; SwiGLU; one KV head per query head."""
        clashes = {
            "qk_norm": self.qk_norm is not None,
            "v_norm": self.v_norm is not None,
            "mlp_norm": self.mlp_norm_spec is not None,
            "depth_scaled_norm": self.depth_scaled_norm,
            "rezero": self.rezero,
            "dropout": self.dropout != 0.0,
            "hyper_connections": self.hyper_connections is not None,
            "attention.scale": self.attention.scale is not None,
            "attention.softcap": self.attention.softcap is not None,
            "attention.output_gate": self.attention.output_gate is not None,
            "attention.n_kv_heads": self.attention.kv_heads != self.attention.n_heads,
            "attention.qkv_bias": self.attention.qkv_bias,
            "attention.out_bias": self.attention.out_bias,
            "mlp.bias": self.mlp.bias,
            "mlp.activation": self.mlp.activation != "swiglu",
        }
        bad = [k for k, v in clashes.items() if v]
        if bad:
            raise ConfigValueError(
                bad[0],
                "does not go with placement 'ngpt' (nGPT: no norms, biases, dropout, gates or other logit scales; "
                f"a SwiGLU MLP; n_kv_heads = n_heads): set {bad} to their defaults (biases False, activation "
                "'swiglu')",
            )

    @property
    def mlp_placement_name(self) -> str:
        """The MLP sublayer's placement: ``mlp_placement``, or ``placement`` when None."""
        return self.mlp_placement or self.placement

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
