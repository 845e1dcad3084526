"""The ``model`` section of an ``lm`` run: every ``BlockConfig`` and ``GPTConfig`` field by its own name (except
those the study sets itself: vocabulary and sequence length from the data, ``n_layers`` from ``depth``), plus the
study's conveniences; validated by building the ``GPTConfig``.

The library fields are listed here as plain fields (typed ``Any``: the library validates them) with the library's
defaults, except ``init`` (the study's ``xavier``) and the nested ``attention`` / ``mlp`` (typed as the library's
configs, so dotted keys reach into them; None: the library's default); ``tests/study/lm/test_model_config.py`` checks
that they stay the library's fields with its defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lnblocks.blocks import PLACEMENTS, BlockConfig
from lnblocks.blocks.config import AttentionConfig, MLPConfig
from lnblocks.config import Config, ConfigError, ConfigTypeError, ConfigValueError, check_choice, check_float, check_int
from lnblocks.models import GPTConfig, mix_ln

STUDY_PLACEMENTS = (*PLACEMENTS, "mix_ln")  # mix_ln: built with ``lnblocks.models.mix_ln`` (Li et al. 2024)

# the BlockConfig and GPTConfig fields of the model section, by owner
BLOCK_KEYS = ("dim", "norm", "attention", "mlp", "qk_norm", "depth_scaled_norm", "shared_norm", "deepnorm_alpha",
              "rezero", "dropout", "mlp_norm", "v_norm", "mlp_placement", "hyper_connections",
              "memory_efficient")  # fmt: skip
GPT_KEYS = ("positions", "rope_theta", "tie_weights", "final_norm", "init", "init_std", "emb_init_std", "emb_dropout",
            "emb_norm", "qkv_init", "emb_scale", "final_softcap")  # fmt: skip
# shorthand -> the (nested block field, key) pairs it sets
SHORTHANDS: dict[str, tuple[tuple[str, str], ...]] = {
    "n_heads": (("attention", "n_heads"),),
    "mlp_hidden": (("mlp", "hidden_dim"),),
    "activation": (("mlp", "activation"),),
    "bias": (("attention", "qkv_bias"), ("attention", "out_bias"), ("mlp", "bias")),
}


def _library_error(err: Exception) -> Exception:
    if isinstance(err, ConfigError):
        return err
    cls = ConfigTypeError if isinstance(err, TypeError) else ConfigValueError
    return cls("", str(err))


@dataclass(frozen=True, kw_only=True)
class ModelConfig(Config):
    """The GPT of one run: every ``BlockConfig`` / ``GPTConfig`` field by its own name (``dim``, ``norm``,
    ``qk_norm``, ``mlp_norm``, ``emb_norm``, ``attention``, ``mlp``, ``rezero``, ``positions``, ``init``,
    ``qkv_init``, ...), plus:

    - ``depth``: the number of layers (``GPTConfig.n_layers``);
    - ``placement``: any ``lnblocks.blocks.PLACEMENTS`` key, or ``"mix_ln"`` (Post-LN in the first
      ``floor(mix_post_fraction * depth)`` layers, Pre-LN after; Li et al. 2024, arXiv 2412.13795);
    - shorthands ``n_heads`` (``attention.n_heads``), ``mlp_hidden`` (``mlp.hidden_dim``), ``activation``
      (``mlp.activation``, default ``relu``), ``bias`` (every attention and MLP bias); a shorthand and its nested key
      may both be given only with the same value.

    Defaults follow Xiong et al. 2020's analysis (arXiv 2002.04745): Xavier-normal matrices (``init: xavier``), unit
    embeddings, ReLU MLP of 4 * dim, learned positions, untied head; attention ``backend: flash_attn`` (flash-attn
    on CUDA in bf16/fp16 when installed, sdpa otherwise; the record says which ran) and norms ``backend: auto``.
    Why a flat view of the library's fields rather than a nested ``block:`` section: a grid axis or ``--set`` names
    each option with one short key a reader can scan in a study file (``model.norm``, ``model.init``: the library
    splits them between ``BlockConfig`` and ``GPTConfig``, which a study has no reason to know); the run id hashes this
    resolved view, so it stays the same when the library moves a field between its configs; and the study's own keys
    (``depth``, ``placement: mix_ln``, the shorthands) sit beside the fields they set. The library still validates
    every value, by building the ``GPTConfig``.
    """

    # BlockConfig's fields
    dim: Any = 64
    norm: Any = "layernorm"
    attention: AttentionConfig | Mapping[str, Any] | None = None  # nested: a grid may set model.attention.n_heads
    mlp: MLPConfig | Mapping[str, Any] | None = None
    qk_norm: Any = None
    depth_scaled_norm: Any = False
    shared_norm: Any = False
    deepnorm_alpha: Any = None
    rezero: Any = False
    dropout: Any = 0.0
    mlp_norm: Any = False
    v_norm: Any = None  # added later: None leaves run ids as they were (lm.config.ADDED_KEYS)
    mlp_placement: Any = None
    hyper_connections: Any = None
    memory_efficient: Any = None  # the block's (GPTConfig's own sets every block's: one key here)
    # GPTConfig's fields
    positions: Any = "learned"
    rope_theta: Any = 10000.0
    tie_weights: Any = False
    final_norm: Any = None
    init: Any = "xavier"  # the library's default is gpt2; the study's is Xiong et al.'s analysis setting
    init_std: Any = 0.02
    emb_init_std: Any = None
    emb_dropout: Any = 0.0
    emb_norm: Any = None
    qkv_init: Any = "per_matrix"
    emb_scale: Any = None
    final_softcap: Any = None
    # the study's own
    depth: int = 6
    placement: str = "pre"
    mix_post_fraction: float = 0.25
    n_heads: int | None = None
    mlp_hidden: int | None = None
    activation: str | None = None
    bias: bool | None = None

    def __post_init__(self) -> None:
        self._set("depth", check_int("depth", self.depth))
        check_choice("placement", self.placement, STUDY_PLACEMENTS)
        self._set("mix_post_fraction", check_float("mix_post_fraction", self.mix_post_fraction, lo=0, hi=1))
        nested = self._resolve_shorthands()
        try:
            block = BlockConfig.from_dict({**{k: getattr(self, k) for k in BLOCK_KEYS}, **nested, "placement": "pre"})
            block = block.replace(placement="pre" if self.placement == "mix_ln" else self.placement)
            gpt = self.gpt_config(8, 8, block)
        except (TypeError, ValueError) as err:
            raise _library_error(err) from None
        for name in BLOCK_KEYS:  # the resolved values: "layernorm" and {"kind": "layernorm"} hash alike
            value = getattr(block, name)
            self._set(name, value.to_dict() if hasattr(value, "to_dict") else value)
        for name in GPT_KEYS:
            self._set(name, getattr(gpt, name))
        att, mlp = block.attention, block.mlp
        self._set("n_heads", att.n_heads)
        self._set("mlp_hidden", mlp.hidden_dim)
        self._set("activation", mlp.activation)
        self._set("bias", att.qkv_bias if att.qkv_bias == att.out_bias == mlp.bias else None)

    def _resolve_shorthands(self) -> dict[str, dict[str, Any]]:
        nested: dict[str, dict[str, Any]] = {}
        for name in ("attention", "mlp"):
            value = getattr(self, name)
            if value is None:
                nested[name] = {}
            elif hasattr(value, "to_dict"):
                nested[name] = value.to_dict()
            elif isinstance(value, dict):
                nested[name] = dict(value)
            else:
                raise ConfigTypeError(name, f"must be a mapping, got {type(value).__name__} {value!r}")
        if self.activation is None and "activation" not in nested["mlp"]:
            nested["mlp"]["activation"] = "relu"  # the study's default (Xiong et al.'s ReLU MLP)
        # the study's default: flash-attn where it can run (CUDA, bf16/fp16, installed), else sdpa
        nested["attention"].setdefault("backend", "flash_attn")
        for short, targets in SHORTHANDS.items():
            value = getattr(self, short)
            if value is None:
                continue
            for section, key in targets:
                given = nested[section].get(key, value)
                if given != value:
                    raise ConfigValueError(
                        short, f"is {value!r} but model.{section}.{key} is {given!r}: give one of them, or the same"
                    )
                nested[section][key] = value
        return nested

    def gpt_config(self, vocab_size: int, max_seq_len: int, block: BlockConfig | None = None) -> GPTConfig:
        """The ``GPTConfig`` this section describes (the model package validates placement, norm, heads, init)."""
        if block is None:
            block = BlockConfig.from_dict({k: getattr(self, k) for k in BLOCK_KEYS}).replace(
                placement="pre" if self.placement == "mix_ln" else self.placement
            )
        layers: Any = mix_ln(block, self.depth, self.mix_post_fraction) if self.placement == "mix_ln" else block
        return GPTConfig(
            vocab_size=vocab_size,
            max_seq_len=max_seq_len,
            n_layers=self.depth,
            block=layers,
            **{k: getattr(self, k) for k in GPT_KEYS},
        )

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with ``changes``; changing a shorthand (``n_heads``) or its nested config (``attention``) drops
        the other's old value, so the two never disagree."""
        current = self.to_dict()
        for short, targets in SHORTHANDS.items():
            for section, key in targets:
                if short in changes and section not in changes:
                    current[section] = {k: v for k, v in current[section].items() if k != key}
                if section in changes and short not in changes:
                    current[short] = None
        unknown = sorted(set(changes) - set(self.field_names()))
        if unknown:
            raise ConfigValueError(unknown[0], f"is not a config key; valid keys of ModelConfig: {self.field_names()}")
        return ModelConfig.from_dict({**current, **changes})
