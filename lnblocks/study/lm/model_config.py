"""The ``model`` section of a language-model study run: every ``BlockConfig`` and ``GPTConfig`` field by its own
name, read from those classes (not copied), plus the study's conveniences; validated by building the ``GPTConfig``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from lnblocks.blocks import PLACEMENTS, BlockConfig
from lnblocks.config import Config, ConfigTypeError, ConfigValueError, _KeyedError, check_choice, check_float, check_int
from lnblocks.models import GPTConfig, mix_ln

STUDY_PLACEMENTS = (*PLACEMENTS, "mix_ln")  # mix_ln: built with ``lnblocks.models.mix_ln`` (Li et al. 2024)

# ---- the model section: BlockConfig and GPTConfig fields, plus study conveniences ------------------------------

_SET_BY_STUDY = {"vocab_size", "max_seq_len", "n_layers", "block", "placement"}
# The study's defaults where they differ from the library's: Xiong et al. 2020's analysis setting.
_STUDY_DEFAULTS: dict[str, Any] = {"init": "xavier"}
BLOCK_KEYS = tuple(f.name for f in dataclasses.fields(BlockConfig) if f.init and f.name not in _SET_BY_STUDY)
GPT_KEYS = tuple(f.name for f in dataclasses.fields(GPTConfig) if f.init and f.name not in _SET_BY_STUDY)
# shorthand -> the (nested block field, key) pairs it sets
SHORTHANDS: dict[str, tuple[tuple[str, str], ...]] = {
    "n_heads": (("attention", "n_heads"),),
    "mlp_hidden": (("mlp", "hidden_dim"),),
    "activation": (("mlp", "activation"),),
    "bias": (("attention", "qkv_bias"), ("attention", "out_bias"), ("mlp", "bias")),
}
QKV_INIT_GAINS = {1.0: "per_matrix", 2**-0.5: "stacked"}  # the legacy key model.qkv_init_gain


def _library_fields() -> list[tuple[str, Any, Any]]:
    out = []
    for cls, names in ((BlockConfig, BLOCK_KEYS), (GPTConfig, GPT_KEYS)):
        for f in dataclasses.fields(cls):
            if f.name in names:
                default = _STUDY_DEFAULTS.get(f.name, None if f.default is dataclasses.MISSING else f.default)
                out.append((f.name, Any, field(default=default)))  # nested configs: None = the library's default
    return out


_LibraryModelFields = dataclasses.make_dataclass(
    "_LibraryModelFields", _library_fields(), bases=(Config,), frozen=True, kw_only=True
)


def _library_error(err: Exception) -> Exception:
    if isinstance(err, _KeyedError):
        return err
    cls = ConfigTypeError if isinstance(err, TypeError) else ConfigValueError
    return cls("", str(err))


@dataclass(frozen=True, kw_only=True)
class ModelConfig(_LibraryModelFields):  # type: ignore[misc, valid-type]
    """The GPT of one run: every ``BlockConfig`` / ``GPTConfig`` field by its own name (``dim``, ``norm``,
    ``qk_norm``, ``mlp_norm``, ``emb_norm``, ``attention``, ``mlp``, ``rezero``, ``positions``, ``init``,
    ``qkv_init``, ...), plus:

    - ``depth``: the number of layers (``GPTConfig.n_layers``);
    - ``placement``: any ``lnblocks.blocks.PLACEMENTS`` key, or ``"mix_ln"`` (Post-LN in the first
      ``floor(mix_post_fraction * depth)`` layers, Pre-LN after; Li et al. 2024, arXiv 2412.13795);
    - shorthands ``n_heads`` (``attention.n_heads``), ``mlp_hidden`` (``mlp.hidden_dim``), ``activation``
      (``mlp.activation``, default ``relu``), ``bias`` (every attention and MLP bias); a shorthand and its nested key
      may both be given only with the same value;
    - ``qkv_init_gain``: older spelling of ``qkv_init`` (``1.0`` = ``per_matrix``, ``2 ** -0.5`` = ``stacked``).

    Defaults follow Xiong et al. 2020's analysis (arXiv 2002.04745): Xavier-normal matrices (``init: xavier``), unit
    embeddings, ReLU MLP of 4 * dim, learned positions, untied head; attention ``backend: flash_attn`` (flash-attn
    on CUDA in bf16/fp16 when installed, sdpa otherwise; the record says which ran) and norms ``backend: auto``.
    """

    depth: int = 6
    placement: str = "pre"
    mix_post_fraction: float = 0.25
    n_heads: int | None = None
    mlp_hidden: int | None = None
    activation: str | None = None
    bias: bool | None = None
    qkv_init_gain: float | None = None

    ALIASES: ClassVar[tuple[str, ...]] = ("qkv_init_gain",)

    def __post_init__(self) -> None:
        self._set("depth", check_int("depth", self.depth))
        check_choice("placement", self.placement, STUDY_PLACEMENTS)
        self._set("mix_post_fraction", check_float("mix_post_fraction", self.mix_post_fraction, lo=0, hi=1))
        self._resolve_qkv_init_gain()
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

    def _resolve_qkv_init_gain(self) -> None:
        gain = self.qkv_init_gain
        if gain is None:
            return
        gain = check_float("qkv_init_gain", gain, lo=0, lo_open=True)
        match = [v for g, v in QKV_INIT_GAINS.items() if math.isclose(gain, g, rel_tol=1e-12)]
        if not match:
            raise ConfigValueError(
                "qkv_init_gain",
                f"is the older spelling of model.qkv_init and must be 1.0 (per_matrix) or 0.7071067811865476 "
                f"(stacked), got {gain!r}",
            )
        if self.qkv_init not in (GPTConfig.qkv_init, match[0]):
            raise ConfigValueError("qkv_init_gain", f"({gain}) contradicts qkv_init={self.qkv_init!r}")
        self._set("qkv_init", match[0])
        self._set("qkv_init_gain", None)

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

    def to_dict(self) -> dict[str, Any]:
        """Every resolved key except the consumed alias ``qkv_init_gain``."""
        return {k: v for k, v in super().to_dict().items() if k not in self.ALIASES}

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
