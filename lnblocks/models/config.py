"""``GPTConfig``: a decoder-only LM built from one ``BlockConfig`` per layer, plus ``mix_ln`` (Li et al. 2024)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

from lnblocks.blocks import PLACEMENTS, BlockConfig
from lnblocks.blocks.config import AddedFields
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

Positions = Literal["learned", "rope", "none"]
InitScheme = Literal["gpt2", "xavier", "deepnet"]
QKVInit = Literal["per_matrix", "stacked"]
POSITIONS: tuple[str, ...] = get_args(Positions)
INIT_SCHEMES: tuple[str, ...] = get_args(InitScheme)
QKV_INITS: tuple[str, ...] = get_args(QKVInit)

BlockSpec = BlockConfig | dict | Sequence[BlockConfig | dict] | Callable[[int], BlockConfig | dict]


def _as_block(value: Any, key: str) -> BlockConfig:
    if not isinstance(value, (BlockConfig, Mapping)):
        raise ConfigTypeError(key, f"must be a BlockConfig or a mapping, got {type(value).__name__}")
    return BlockConfig.from_dict(value, key=key)


@dataclass(frozen=True, kw_only=True)
class GPTConfig(AddedFields, Config):
    """A GPT: token embedding, positions, ``n_layers`` blocks, final norm by placement rule, LM head.

    ``block``: one ``BlockConfig`` for every layer, a sequence of ``n_layers`` of them, or a function of the 0-based
    layer index (per-depth mixes such as ``mix_ln``). After validation ``block`` holds one ``BlockConfig`` (all
    layers equal) or a tuple; ``layers`` always gives the tuple.
    ``positions``: ``"learned"`` (a ``max_seq_len`` table, GPT-2), ``"rope"`` (rotary, in every block; Llama) or
    ``"none"``. ``final_norm``: None follows the last block's placement rule (``PLACEMENTS[...].final_norm_rule``);
    True/False forces it. ``init``: ``"gpt2"``, ``"xavier"`` or ``"deepnet"`` (see ``lnblocks.models.init``);
    ``init_std``: GPT-2's 0.02; ``emb_init_std``: embedding std (None: ``init_std`` for gpt2, 1.0 otherwise).
    ``emb_norm``: None, or a norm (anything ``build_norm`` takes) on the embeddings before the first block: BERT's
    embedding LayerNorm (over token + position embeddings, before the embedding dropout; Devlin et al. 2019,
    arXiv 1810.04805) and BLOOM's ``word_embeddings_layernorm`` (arXiv 2211.05100).
    ``qkv_init`` (Xavier schemes): ``"per_matrix"`` Xavier for W_Q, W_K, W_V each (fan ``d + d``), or
    ``"stacked"`` Xavier over the stacked ``(3d, d)`` in-projection, as ``torch.nn.MultiheadAttention`` does.
    ``emb_scale``: None, or a factor on the token embeddings (Gemma's ``sqrt(hidden_size)``, in the model dtype).
    ``final_softcap``: None, or ``c`` for Gemma 2's final-logit soft-capping ``c * tanh(logits / c)`` (arXiv
    2408.00118), honoured by the chunked head too.
    ``memory_efficient``: None, or True/False for every layer's ``BlockConfig.memory_efficient`` (the norms save
    their output for the backward instead of their input; the final norm is the last block's norm, so it follows).
    """

    ADDED: ClassVar[tuple[str, ...]] = ("emb_scale", "final_softcap", "memory_efficient")

    vocab_size: int = 256
    max_seq_len: int = 256
    n_layers: int = 4
    block: BlockSpec = field(default_factory=BlockConfig)
    positions: Positions = "learned"
    rope_theta: float = 10000.0
    tie_weights: bool = False
    final_norm: bool | None = None
    init: InitScheme = "gpt2"
    init_std: float = 0.02
    emb_init_std: float | None = None
    emb_dropout: float = 0.0
    emb_norm: NormSpec | str | dict | None = None
    qkv_init: QKVInit = "per_matrix"
    emb_scale: float | None = None
    final_softcap: float | None = None
    memory_efficient: bool | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_seq_len", "n_layers"):
            self._set(name, check_int(name, getattr(self, name)))
        check_choice("positions", self.positions, POSITIONS)
        check_choice("init", self.init, INIT_SCHEMES)
        check_choice("qkv_init", self.qkv_init, QKV_INITS)
        if self.qkv_init == "stacked" and self.init == "gpt2":
            raise ConfigValueError("qkv_init", "'stacked' is a Xavier variant: it needs init='xavier' or 'deepnet'")
        check_bool("tie_weights", self.tie_weights)
        check_bool("final_norm", self.final_norm, allow_none=True)
        self._set("emb_dropout", check_prob("emb_dropout", self.emb_dropout))
        for name in ("rope_theta", "init_std", "emb_init_std", "emb_scale", "final_softcap"):
            optional = name not in ("rope_theta", "init_std")
            self._set(name, check_float(name, getattr(self, name), lo=0, lo_open=True, allow_none=optional))
        if self.emb_norm is not None:
            self._set("emb_norm", NormSpec.from_dict(self.emb_norm, key="emb_norm"))
        layers = self._resolve_layers()
        check_bool("memory_efficient", self.memory_efficient, allow_none=True)
        if self.memory_efficient is not None:
            with under_key("block"):
                layers = tuple(b.replace(memory_efficient=self.memory_efficient) for b in layers)
        self._set("block", layers[0] if all(b == layers[0] for b in layers) else layers)
        self._check_layers(layers)

    def _resolve_layers(self) -> tuple[BlockConfig, ...]:
        b = self.block
        if isinstance(b, (BlockConfig, Mapping)):
            return (_as_block(b, "block"),) * self.n_layers
        if callable(b):
            layers = []
            for i in range(self.n_layers):
                with under_key(f"block({i})"):
                    value = b(i)
                layers.append(_as_block(value, f"block({i})"))
            return tuple(layers)
        if isinstance(b, Sequence) and not isinstance(b, str):
            if len(b) != self.n_layers:
                raise ConfigValueError("block", f"got {len(b)} BlockConfigs for n_layers={self.n_layers}")
            return tuple(_as_block(x, f"block[{i}]") for i, x in enumerate(b))
        raise ConfigTypeError(
            "block", f"must be a BlockConfig, mapping, sequence or function of the layer index, got {type(b).__name__}"
        )

    def _check_layers(self, layers: tuple[BlockConfig, ...]) -> None:
        dims = sorted({b.dim for b in layers})
        if len(dims) > 1:
            raise ConfigValueError("block", f"every layer must have the same dim; got dims {dims}")
        if self.positions == "rope":
            head_dims = sorted({b.head_dim for b in layers})
            if len(head_dims) > 1 or head_dims[0] % 2:
                raise ConfigValueError("positions", f"'rope' needs one even head_dim for all layers; got {head_dims}")
        placements = [b.placement for b in layers]
        if "resi_dual" in placements and set(placements) != {"resi_dual"}:
            raise ConfigValueError(
                "block",
                "placement 'resi_dual' carries a second stream through every layer; it cannot be mixed with "
                f"{sorted(set(placements) - {'resi_dual'})}",
            )
        if placements[-1] == "resi_dual" and self.final_norm is False:
            raise ConfigValueError(
                "final_norm", "must not be False with placement 'resi_dual' (it outputs x_N + norm(y_N))"
            )
        self._check_streams(layers)
        if "deepnorm" in placements and self.init != "deepnet":
            raise ConfigValueError(
                "init",
                "must be 'deepnet' with placement 'deepnorm' (DeepNet's residual scale alpha comes with its init "
                f"gain beta, Wang et al. 2022): set init='deepnet', got init={self.init!r}",
            )

    def _check_streams(self, layers: tuple[BlockConfig, ...]) -> None:
        """SiameseNorm, nGPT and hyper-connections carry their streams through every layer: all or none."""
        for name in ("siamese", "ngpt"):
            uses = [b.placement == name for b in layers]
            if any(uses) and not all(uses):
                others = sorted({b.placement for b in layers} - {name})
                raise ConfigValueError(
                    "block", f"placement {name!r} carries its streams through every layer; cannot mix with {others}"
                )
        streams = sorted({b.hyper_connections.n_streams if b.hyper_connections else 0 for b in layers})
        if len(streams) > 1:
            raise ConfigValueError(
                "block", f"hyper_connections must give all layers one n_streams (or none), got {streams} (0: none)"
            )
        if layers[-1].placement == "siamese" and self.final_norm is False:
            raise ConfigValueError("final_norm", "must not be False with placement 'siamese' (its output norm)")
        if layers[-1].placement == "ngpt":
            clashes = {
                "positions": self.positions == "learned",
                "final_norm": self.final_norm is True,
                "emb_norm": self.emb_norm is not None,
                "emb_scale": self.emb_scale is not None,
            }
            bad = [k for k, v in clashes.items() if v]
            if bad:
                raise ConfigValueError(
                    bad[0],
                    f"does not go with placement 'ngpt' (unit-norm embeddings, RoPE or no positions, no final "
                    f"norm): set {bad} to 'rope' / their defaults",
                )

    @property
    def layers(self) -> tuple[BlockConfig, ...]:
        """One ``BlockConfig`` per layer."""
        return self.block if isinstance(self.block, tuple) else (self.block,) * self.n_layers

    @property
    def dim(self) -> int:
        return self.layers[0].dim

    @property
    def uses_final_norm(self) -> bool:
        """Whether the model applies a final norm: ``final_norm`` or the last block's placement rule."""
        last = self.layers[-1].mlp_placement_name  # the last sublayer's placement rule
        return self.final_norm if self.final_norm is not None else PLACEMENTS[last].final_norm

    @property
    def n_streams(self) -> int | None:
        """Residual streams of hyper-connections (the same in every layer), or None."""
        hc = self.layers[0].hyper_connections
        return hc.n_streams if hc is not None else None


def mix_ln(block: BlockConfig, n_layers: int, post_fraction: float = 0.25) -> tuple[BlockConfig, ...]:
    """Mix-LN (Li et al. 2024): Post-LN in the first ``floor(post_fraction * n_layers)`` layers, Pre-LN after.

    The paper's scripts use ``post_fraction=0.25`` (3 of 12, 6 of 24 layers). Pass the result as ``GPTConfig.block``.
    """
    n_layers = check_int("n_layers", n_layers)
    post_fraction = check_float("post_fraction", post_fraction, lo=0, hi=1)
    n_post = math.floor(post_fraction * n_layers)
    return tuple(block.replace(placement="post" if i < n_post else "pre") for i in range(n_layers))


def hybridnorm(block: BlockConfig, n_layers: int, star: bool = False) -> tuple[BlockConfig, ...]:
    """HybridNorm (Zhuo et al. 2025, arXiv 2503.04598): QKV-norm in attention and Post-Norm on the FFN, per block
    ``Y = X + MHA(QKV-Norm(X))``, ``X' = FFN(Norm(Y)) + Norm(Y)``: attention with no input norm and a per-head norm
    of q, k and v (the block's ``qk_norm``, or its ``norm`` when None; v gets the same), the MLP sublayer in
    placement ``"normed_residual"``; a final norm follows (the authors' OLMo code: ``attn_norm=False``,
    ``ffn_norm=True``, ``ffn_residual_after_norm=True``, ``use_{query,key,value}_norm=True``).
    ``star=True`` is HybridNorm*: the first block Pre-Norm in both sublayers, its QKV-norm kept (the authors'
    ``norm_pos_special_config={0: {attn_norm: True, ffn_residual: False}}``). Pass the result as ``GPTConfig.block``.
    """
    n_layers = check_int("n_layers", n_layers)
    check_bool("star", star)
    qkv = block.qk_norm if block.qk_norm is not None else block.norm
    hybrid = block.replace(placement="none", mlp_placement="normed_residual", qk_norm=qkv, v_norm=qkv)
    first = hybrid.replace(placement="pre", mlp_placement=None) if star else hybrid
    return (first, *(hybrid,) * (n_layers - 1))


def ngpt_block(**options: Any) -> BlockConfig:
    """nGPT's block (Loshchilov et al. 2024, arXiv 2410.01131): placement ``"ngpt"``, no biases, a SwiGLU MLP;
    ``options`` are any other ``BlockConfig`` fields (``attention`` / ``mlp`` keys merge into those defaults). Use
    it with ``positions="rope"`` (or ``"none"``) and call ``GPT.normalize_weights_()`` after every optimizer step."""

    def plain(value: Any) -> dict:
        return value.to_dict() if hasattr(value, "to_dict") else dict(value)

    attention = {"qkv_bias": False, "out_bias": False, **plain(options.pop("attention", {}))}
    mlp = {"activation": "swiglu", "bias": False, **plain(options.pop("mlp", {}))}
    return BlockConfig.from_dict({**options, "placement": "ngpt", "attention": attention, "mlp": mlp})
