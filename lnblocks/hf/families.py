"""Per-family role maps: what each norm of an HF model normalises, by its module name.

The same attribute name plays different roles across families: Llama's ``post_attention_layernorm`` normalises the
MLP *input* (Pre-LN), while Gemma2/3's and OLMo2's normalises the attention *output* before the residual add
(sandwich / "reordered" norm), and OPT's ``final_layer_norm`` is the per-layer MLP norm, Pre- or Post-LN depending on
``config.do_layer_norm_before``. Roles only label the report and drive ``include``/``exclude``; the math of a norm
comes from its class (``lnblocks.hf.recognition``), never from its role. Which model types use which layout is a column
of the one family table, ``lnblocks.norms.families.MODEL_FAMILIES``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lnblocks.norms.families import MODEL_FAMILIES

ROLES: dict[str, str] = {
    "pre_attn": "normalises the attention input (Pre-LN)",
    "pre_mlp": "normalises the MLP input (Pre-LN; Llama's post_attention_layernorm)",
    "pre_cross_attn": "normalises the cross-attention input (T5 decoder, GPT-2 with cross-attention)",
    "pre_parallel": "one norm feeding parallel attention and MLP (Falcon-7B)",
    "pre_mixer": "normalises a hybrid layer's mixer input, whichever mixer the layer has (Mamba2, NemotronH)",
    "post_attn": "normalises the attention output before the residual add (Gemma2/3 sandwich, OLMo2)",
    "post_mlp": "normalises the MLP output before the residual add (Gemma2/3 sandwich, OLMo2)",
    "post_ln_attn": "Post-LN: norm(x + attn(x)) after the residual add (BERT, RoBERTa, OPT-350m)",
    "post_ln_cross_attn": "Post-LN after the cross-attention residual add (BERT decoder)",
    "post_ln_mlp": "Post-LN: norm(x + mlp(x)) after the residual add (BERT, RoBERTa, OPT-350m)",
    "q_norm": "QK-norm on the queries (Qwen3, Gemma3 per head; OLMo2 over all heads)",
    "k_norm": "QK-norm on the keys",
    "qk_norm": "one QK-norm module applied to queries and keys (Llama 4's parameter-free L2 norm)",
    "gated": "the gated norm inside an SSM / linear-attention mixer, norm(y, gate) (Mamba2 and its copies, Qwen3-Next)",
    "mixer_inner": "a norm on a mixer's inner projections (Jamba's dt, B and C norms)",
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
        ("layers.*.self_attn.qk_norm", "qk_norm"),  # Llama 4: one L2 norm for q and k
        ("norm", "final"),
    )


def _parallel(config: Any) -> Rules:
    # Cohere: `residual + attn(norm(x)) + mlp(norm(x))`, one input_layernorm feeding both branches
    return (
        ("layers.*.input_layernorm", "pre_parallel"),
        ("layers.*.self_attn.q_norm", "q_norm"),
        ("layers.*.self_attn.k_norm", "k_norm"),
        ("norm", "final"),
    )


def _hybrid(config: Any) -> Rules:
    # SSM / linear-attention hybrids: a layer's token mixer is attention, Mamba or gated DeltaNet, each with its norm
    return (
        ("layers.*.input_layernorm", "pre_attn"),  # the token mixer's input, whichever mixer it is
        ("layers.*.mamba_decoder.input_layernorm", "pre_attn"),  # Zamba2's hybrid layers
        ("layers.*.shared_transformer.input_layernorm", "pre_attn"),
        ("layers.*.pre_ff_layernorm", "pre_mlp"),  # Bamba, Jamba, FalconH1
        ("layers.*.shared_transformer.pre_ff_layernorm", "pre_mlp"),
        ("layers.*.post_attention_layernorm", "pre_mlp"),  # GraniteMoeHybrid, Qwen3-Next
        ("layers.*.norm", "pre_mixer"),  # Mamba2, NemotronH: one norm per layer
        ("layers.*.mixer.norm", "gated"),
        ("layers.*.mamba.norm", "gated"),
        ("layers.*.mamba_decoder.mamba.norm", "gated"),
        ("layers.*.linear_attn.norm", "gated"),
        ("layers.*.mamba.dt_layernorm", "mixer_inner"),
        ("layers.*.mamba.b_layernorm", "mixer_inner"),
        ("layers.*.mamba.c_layernorm", "mixer_inner"),
        ("layers.*.self_attn.q_norm", "q_norm"),
        ("layers.*.self_attn.k_norm", "k_norm"),
        ("norm_f", "final"),
        ("final_layernorm", "final"),
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


# role layout name (``ModelFamily.roles`` in the family table) -> its rules
LAYOUTS: dict[str, Callable[[Any], Rules]] = {
    "llama": _llama,
    "parallel": _parallel,
    "hybrid": _hybrid,
    "sandwich": _sandwich,
    "olmo2": _olmo2,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "bert": _bert,
    "opt": _opt,
    "t5": _t5,
    "falcon": _falcon,
}


@dataclass(frozen=True)
class Family:
    """A role layout and the ``config.model_type`` values that use it (from ``lnblocks.norms.MODEL_FAMILIES``)."""

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


def _families() -> tuple[Family, ...]:
    unknown = {f.name: f.roles for f in MODEL_FAMILIES.values() if f.roles is not None and f.roles not in LAYOUTS}
    if unknown:
        raise RuntimeError(f"MODEL_FAMILIES rows name role layouts that lnblocks.hf lacks: {unknown}")
    return tuple(
        Family(layout, tuple(t for f in MODEL_FAMILIES.values() if f.roles == layout for t in f.model_types), rules)
        for layout, rules in LAYOUTS.items()
    )


FAMILIES: tuple[Family, ...] = _families()
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
