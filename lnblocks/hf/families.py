"""Per-family role maps: what each norm of an HF model normalises, by its module name.

The same attribute name plays different roles across families: Llama's ``post_attention_layernorm`` normalises the
MLP *input* (Pre-LN), while Gemma2/3's and OLMo2's normalises the attention *output* before the residual add
(sandwich / "reordered" norm), and OPT's ``final_layer_norm`` is the per-layer MLP norm, Pre- or Post-LN depending on
``config.do_layer_norm_before``. Roles only label the report and drive ``include``/``exclude``; the math of a norm
comes from its class (``lnblocks.hf.classes``), never from its role.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ROLES: dict[str, str] = {
    "pre_attn": "normalises the attention input (Pre-LN)",
    "pre_mlp": "normalises the MLP input (Pre-LN; Llama's post_attention_layernorm)",
    "pre_cross_attn": "normalises the cross-attention input (T5 decoder, GPT-2 with cross-attention)",
    "pre_parallel": "one norm feeding parallel attention and MLP (Falcon-7B)",
    "post_attn": "normalises the attention output before the residual add (Gemma2/3 sandwich, OLMo2)",
    "post_mlp": "normalises the MLP output before the residual add (Gemma2/3 sandwich, OLMo2)",
    "post_ln_attn": "Post-LN: norm(x + attn(x)) after the residual add (BERT, RoBERTa, OPT-350m)",
    "post_ln_cross_attn": "Post-LN after the cross-attention residual add (BERT decoder)",
    "post_ln_mlp": "Post-LN: norm(x + mlp(x)) after the residual add (BERT, RoBERTa, OPT-350m)",
    "q_norm": "QK-norm on the queries (Qwen3, Gemma3 per head; OLMo2 over all heads)",
    "k_norm": "QK-norm on the keys",
    "embedding": "normalises the embeddings (BERT, RoBERTa)",
    "final": "final norm of a stack, before the head or the encoder output",
    "head": "inside a task head (BERT MLM transform, RoBERTa LM head)",
    "projector": "multimodal projector (Gemma3 soft-embedding norm)",
    "other": "recognised math, but no role rule for this model or family",
}

Rules = tuple[tuple[str, str], ...]  # (module-name pattern, role); "*" is a layer index; first match wins


def _llama(config: Any) -> Rules:
    return (
        ("layers.*.input_layernorm", "pre_attn"),
        ("layers.*.post_attention_layernorm", "pre_mlp"),
        ("layers.*.self_attn.q_norm", "q_norm"),
        ("layers.*.self_attn.k_norm", "k_norm"),
        ("norm", "final"),
    )


def _sandwich(config: Any) -> Rules:
    return (
        ("layers.*.input_layernorm", "pre_attn"),
        ("layers.*.post_attention_layernorm", "post_attn"),
        ("layers.*.pre_feedforward_layernorm", "pre_mlp"),
        ("layers.*.post_feedforward_layernorm", "post_mlp"),
        ("layers.*.self_attn.q_norm", "q_norm"),
        ("layers.*.self_attn.k_norm", "k_norm"),
        ("norm", "final"),
        ("mm_soft_emb_norm", "projector"),
    )


def _olmo2(config: Any) -> Rules:
    return (
        ("layers.*.post_attention_layernorm", "post_attn"),
        ("layers.*.post_feedforward_layernorm", "post_mlp"),
        ("layers.*.self_attn.q_norm", "q_norm"),
        ("layers.*.self_attn.k_norm", "k_norm"),
        ("norm", "final"),
    )


def _gpt2(config: Any) -> Rules:
    return (
        ("h.*.ln_1", "pre_attn"),
        ("h.*.ln_2", "pre_mlp"),
        ("h.*.ln_cross_attn", "pre_cross_attn"),
        ("ln_f", "final"),
    )


def _gpt_neox(config: Any) -> Rules:
    # with use_parallel_residual both norms read the same input, but each still feeds one branch
    return (
        ("layers.*.input_layernorm", "pre_attn"),
        ("layers.*.post_attention_layernorm", "pre_mlp"),
        ("final_layer_norm", "final"),
    )


def _bert(config: Any) -> Rules:
    return (
        ("embeddings.LayerNorm", "embedding"),
        ("layer.*.attention.output.LayerNorm", "post_ln_attn"),
        ("layer.*.crossattention.output.LayerNorm", "post_ln_cross_attn"),
        ("layer.*.output.LayerNorm", "post_ln_mlp"),
        ("predictions.transform.LayerNorm", "head"),
        ("lm_head.layer_norm", "head"),
    )


def _opt(config: Any) -> Rules:
    pre = getattr(config, "do_layer_norm_before", True)
    return (
        ("layers.*.self_attn_layer_norm", "pre_attn" if pre else "post_ln_attn"),
        ("layers.*.final_layer_norm", "pre_mlp" if pre else "post_ln_mlp"),  # per layer: the MLP norm
        ("decoder.final_layer_norm", "final"),  # only built when do_layer_norm_before
    )


def _t5(config: Any) -> Rules:
    return (
        ("encoder.block.*.layer.0.layer_norm", "pre_attn"),
        ("encoder.block.*.layer.1.layer_norm", "pre_mlp"),
        ("decoder.block.*.layer.0.layer_norm", "pre_attn"),
        ("decoder.block.*.layer.1.layer_norm", "pre_cross_attn"),
        ("decoder.block.*.layer.2.layer_norm", "pre_mlp"),
        ("final_layer_norm", "final"),
    )


def _falcon(config: Any) -> Rules:
    shared = getattr(config, "parallel_attn", False) and getattr(config, "num_ln_in_parallel_attn", 1) != 2
    return (
        ("h.*.input_layernorm", "pre_parallel" if shared else "pre_attn"),
        ("h.*.post_attention_layernorm", "pre_mlp"),
        ("h.*.ln_attn", "pre_attn"),
        ("h.*.ln_mlp", "pre_mlp"),
        ("ln_f", "final"),
    )


@dataclass(frozen=True)
class Family:
    """A model family: the ``config.model_type`` values it covers and its role rules (a function of the config)."""

    name: str
    model_types: tuple[str, ...]
    rules: Callable[[Any], Rules]

    def role_map(self, config: Any) -> RoleMap:
        return RoleMap(self.rules(config))


class RoleMap:
    """Compiled rules: ``role(name)`` for a module's qualified name; a pattern matches the name's tail."""

    def __init__(self, rules: Rules) -> None:
        self._rules = [(re.compile(_pattern_regex(p)), role) for p, role in rules]

    def role(self, name: str) -> str:
        for regex, role in self._rules:
            if regex.search(name):
                return role
        return "other"


def _pattern_regex(pattern: str) -> str:
    # "layers.*.input_layernorm" -> r"(?:^|\.)layers\.\d+\.input_layernorm$"
    return r"(?:^|\.)" + re.escape(pattern).replace(r"\*", r"\d+") + "$"


FAMILIES: tuple[Family, ...] = (
    Family("llama", ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma"), _llama),
    Family("gemma2", ("gemma2", "gemma3", "gemma3_text"), _sandwich),
    Family("olmo2", ("olmo2",), _olmo2),
    Family("gpt2", ("gpt2",), _gpt2),
    Family("gpt_neox", ("gpt_neox",), _gpt_neox),
    Family("bert", ("bert", "roberta"), _bert),
    Family("opt", ("opt",), _opt),
    Family("t5", ("t5", "mt5"), _t5),
    Family("falcon", ("falcon",), _falcon),
)
_BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}
_OTHER = RoleMap(())


def role_map_for(model: Any) -> tuple[str | None, RoleMap]:
    """``(model_type, role map)`` from ``model.config.model_type``; an unknown type maps every norm to "other"."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    family = _BY_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        return (model_type if isinstance(model_type, str) else None), _OTHER
    return model_type, family.role_map(config)
