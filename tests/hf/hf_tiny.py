"""Tiny HF models of every patched family, built locally from configs with random weights (no downloads).

One table: ``SIZES`` gives every dimension once, under each name HF's config classes use for it (a config gets the
keys it has), and ``FAMILIES`` says per family which classes to build, with which extra config values, and what
``patch_norms`` patches there. ``tiny_config`` / ``tiny_model`` build any other config or model class the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

VOCAB = 96
# config keys set wherever the config class has them; the rest keep their defaults
SIZES: dict[str, Any] = {
    "vocab_size": VOCAB,
    **dict.fromkeys(("hidden_size", "n_embd", "d_model"), 32),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "d_ff"), 64),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers"), 2),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads"), 4),
    "num_key_value_heads": 2,
    **dict.fromkeys(("max_position_embeddings", "n_positions"), 64),
}
_ATTN = {"attn_implementation": "eager"}  # the same attention math on every run


def tiny_config(config_cls: str, **options: Any) -> Any:
    """``transformers.<config_cls>`` with the ``SIZES`` keys it has, then ``options``, and eager attention."""
    import transformers

    cls = getattr(transformers, config_cls)
    keys = set(cls().to_dict()) | set(getattr(cls, "attribute_map", {}))
    return cls(**{k: v for k, v in SIZES.items() if k in keys}, **options, **_ATTN)


def tiny_model(config_cls: str, model_cls: str, **options: Any) -> nn.Module:
    import transformers

    return getattr(transformers, model_cls)(tiny_config(config_cls, **options))


@dataclass(frozen=True)
class Tiny:
    """A family's tiny model: its config and model classes, extra config values, and what patching it gives (the
    number of patched norms and how many play each role)."""

    config: str
    model: str
    patched: int
    roles: dict[str, int]
    options: dict[str, Any] = field(default_factory=dict)


_PRE_LN = {"pre_attn": 2, "pre_mlp": 2, "final": 1}
_SANDWICH = {"pre_attn": 2, "post_attn": 2, "pre_mlp": 2, "post_mlp": 2}
_POST_LN = {"embedding": 1, "post_ln_attn": 2, "post_ln_mlp": 2, "head": 1}
_OPT = {"word_embed_proj_dim": 32}

FAMILIES: dict[str, Tiny] = {
    "llama": Tiny("LlamaConfig", "LlamaForCausalLM", 5, _PRE_LN),
    "mistral": Tiny("MistralConfig", "MistralForCausalLM", 5, _PRE_LN),
    "qwen2": Tiny("Qwen2Config", "Qwen2ForCausalLM", 5, _PRE_LN),
    "qwen3": Tiny("Qwen3Config", "Qwen3ForCausalLM", 9, {**_PRE_LN, "q_norm": 2, "k_norm": 2}, {"head_dim": 8}),
    "phi3": Tiny("Phi3Config", "Phi3ForCausalLM", 5, _PRE_LN, {"pad_token_id": 0}),
    "gemma": Tiny("GemmaConfig", "GemmaForCausalLM", 5, _PRE_LN, {"head_dim": 8}),
    "gemma2": Tiny("Gemma2Config", "Gemma2ForCausalLM", 9, {**_SANDWICH, "final": 1}, {"head_dim": 8}),
    "gemma3": Tiny(
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        13,
        {**_SANDWICH, "q_norm": 2, "k_norm": 2, "final": 1},
        {"head_dim": 8},
    ),
    "olmo2": Tiny(
        "Olmo2Config", "Olmo2ForCausalLM", 9, {"post_attn": 2, "post_mlp": 2, "q_norm": 2, "k_norm": 2, "final": 1}
    ),
    "gpt2": Tiny("GPT2Config", "GPT2LMHeadModel", 5, _PRE_LN),
    "gpt_neox": Tiny("GPTNeoXConfig", "GPTNeoXForCausalLM", 5, _PRE_LN),
    "bert": Tiny("BertConfig", "BertForMaskedLM", 6, _POST_LN),
    "roberta": Tiny("RobertaConfig", "RobertaForMaskedLM", 6, _POST_LN, {"pad_token_id": 1}),
    "opt_pre": Tiny("OPTConfig", "OPTForCausalLM", 5, _PRE_LN, {**_OPT, "do_layer_norm_before": True}),
    "opt_post": Tiny(
        "OPTConfig", "OPTForCausalLM", 4, {"post_ln_attn": 2, "post_ln_mlp": 2}, {**_OPT, "do_layer_norm_before": False}
    ),
    "t5": Tiny(
        "T5Config",
        "T5ForConditionalGeneration",
        12,
        {"pre_attn": 4, "pre_cross_attn": 2, "pre_mlp": 4, "final": 2},
        {"d_kv": 8, "decoder_start_token_id": 0},
    ),
    "falcon": Tiny(
        "FalconConfig",
        "FalconForCausalLM",
        3,
        {"pre_parallel": 2, "final": 1},
        {"parallel_attn": True, "new_decoder_architecture": False},
    ),
    "falcon_sequential": Tiny(
        "FalconConfig", "FalconForCausalLM", 5, _PRE_LN, {"parallel_attn": False, "new_decoder_architecture": False}
    ),
    "falcon_new_arch": Tiny(
        "FalconConfig", "FalconForCausalLM", 5, _PRE_LN, {"num_kv_heads": 2, "new_decoder_architecture": True}
    ),
    # the 2025-26 families: Llama 4's qk L2 norm, Nemotron's LayerNorm 1P, Cohere's per-head qk-norm and parallel
    # block, and the gated mixer norms of the SSM / linear-attention hybrids
    "llama4": Tiny(
        "Llama4TextConfig", "Llama4ForCausalLM", 7, {**_PRE_LN, "qk_norm": 2}, {"head_dim": 8}
    ),
    "nemotron": Tiny("NemotronConfig", "NemotronForCausalLM", 5, _PRE_LN, {"head_dim": 8}),
    "cohere_qk": Tiny(
        "CohereConfig",
        "CohereForCausalLM",
        7,
        {"pre_parallel": 2, "q_norm": 2, "k_norm": 2, "final": 1},
        {"use_qk_norm": True},
    ),
    "nemotron_h": Tiny(
        "NemotronHConfig",
        "NemotronHForCausalLM",
        4,
        {"pre_mixer": 2, "gated": 1, "final": 1},
        {"layers_block_type": ["mamba", "attention"], "mamba_num_heads": 4, "mamba_head_dim": 8, "n_groups": 2,
         "ssm_state_size": 8, "head_dim": 8},
    ),
    "qwen3_next": Tiny(
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        8,
        {"gated": 1, **_PRE_LN, "q_norm": 1, "k_norm": 1},
        {"layer_types": ["linear_attention", "full_attention"], "head_dim": 8, "linear_num_value_heads": 4,
         "linear_num_key_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8, "num_experts": 4,
         "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16, "num_experts_per_tok": 2},
    ),
    "mamba2": Tiny(
        "Mamba2Config",
        "Mamba2ForCausalLM",
        5,
        {"pre_mixer": 2, "gated": 2, "final": 1},
        {"expand": 1, "n_groups": 2, "head_dim": 8, "state_size": 8},
    ),
    "bamba": Tiny(
        "BambaConfig",
        "BambaForCausalLM",
        6,
        {**_PRE_LN, "gated": 1},
        {"mamba_n_heads": 4, "mamba_d_head": 16, "mamba_n_groups": 2, "mamba_d_state": 8, "attn_layer_indices": [1]},
    ),
    "jamba": Tiny(
        "JambaConfig",
        "JambaForCausalLM",
        8,
        {**_PRE_LN, "mixer_inner": 3},
        {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1,
         "num_experts": 2, "mamba_d_state": 8},
    ),
    "falcon_h1": Tiny(
        "FalconH1Config",
        "FalconH1ForCausalLM",
        7,
        {**_PRE_LN, "gated": 2},
        {"mamba_rms_norm": True, "mamba_d_ssm": 32, "mamba_expand": 1, "mamba_n_heads": 4, "mamba_d_head": 8,
         "mamba_n_groups": 2, "mamba_d_state": 8, "head_dim": 8},
    ),
    "zamba2": Tiny(
        "Zamba2Config",
        "Zamba2ForCausalLM",
        7,
        {"pre_attn": 3, "pre_mlp": 1, "gated": 2, "final": 1},
        {"layers_block_type": ["mamba", "hybrid"], "mamba_headdim": 8, "mamba_ngroups": 2, "mamba_d_state": 8},
    ),
    "granitemoehybrid": Tiny(
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        6,
        {**_PRE_LN, "gated": 1},
        {"layer_types": ["mamba", "attention"], "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_n_groups": 2,
         "mamba_d_state": 8},
    ),
}  # fmt: skip


def build(name: str, dtype: torch.dtype = torch.float32, seed: int = 0, **options: Any) -> nn.Module:
    """The tiny model of family ``name`` (``options``: config values on top of the table's) with random weights;
    norm weights are randomised too (HF inits them to ones/zeros, which would hide a wrong ``1 + w`` or a wrong cast
    order)."""
    torch.manual_seed(seed)
    tiny = FAMILIES[name]
    model = tiny_model(tiny.config, tiny.model, **{**tiny.options, **options})
    with torch.no_grad():
        for mod_name, p in model.named_parameters():
            if "norm" in mod_name.lower() or "ln_" in mod_name:
                p.normal_(0.0, 0.5)
    return model.to(dtype)


def inputs(model: nn.Module, batch: int = 2, seq: int = 12, seed: int = 1) -> dict[str, torch.Tensor]:
    """Token ids (and decoder ids for encoder-decoders) with labels, so ``model(**inputs).loss`` exists."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, seq), generator=g)
    out = {"input_ids": ids, "labels": ids}
    if getattr(model.config, "is_encoder_decoder", False):
        out["decoder_input_ids"] = torch.randint(3, VOCAB, (batch, seq - 4), generator=g)
        out["labels"] = out["decoder_input_ids"]
    return out
