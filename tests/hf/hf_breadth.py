"""Every ``*ForCausalLM`` class of the installed transformers, built tiny from its own config class (random weights,
nothing downloaded), for the breadth test: which can be built and run at all, and on what input."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

VOCAB = 128
MAX_PARAMS = 4_000_000  # a class whose tiny config still has more parameters (per-layer vocabularies, codebooks)
# config keys set wherever the config class has them; the rest keep their defaults
SIZES: dict[str, Any] = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim"), 64),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers"), 2),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "decoder_attention_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads"), 2),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "n_inner", "decoder_ffn_dim", "d_ff"), 128),
    **dict.fromkeys(("max_position_embeddings", "n_positions"), 64),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts"), 4),
    "vocab_size": VOCAB,
    "head_dim": 16,
    "rotary_dim": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    # vocabularies and widths some families keep besides the main ones (per-layer inputs, codebooks, glyphs)
    **dict.fromkeys(("unpadded_vocab_size", "vocab_size_per_layer_input"), VOCAB),
    **dict.fromkeys(("shape_vocab_size", "pronunciation_vocab_size"), VOCAB),
    **dict.fromkeys(("shape_embed_dim", "pronunciation_embed_dim", "hidden_size_per_layer_input"), 16),
    **dict.fromkeys(("dim_ff", "backbone_hidden_size"), 64),
    **dict.fromkeys(("o_lora_rank", "index_head_dim", "linear_head_dim"), 16),
    "linear_num_heads": 4,
    "index_topk": 4,
}
# what a class's config validators need besides SIZES (keys it has only; the layer-type lists name one of each kind)
OVERRIDES: dict[str, dict[str, Any]] = {
    "Mamba2ForCausalLM": {"expand": 1, "n_groups": 2},
    "Zamba2ForCausalLM": {"layers_block_type": ["mamba", "hybrid"]},
    "ZambaForCausalLM": {"num_hidden_layers": 3, "layers_block_type": ["mamba", "hybrid", "hybrid"]},
    "GPTNeoForCausalLM": {"attention_types": [[["global", "local"], 1]]},
    "Gemma4AssistantForCausalLM": {"hidden_size_per_layer_input": 0},
    "ZayaForCausalLM": {"num_experts_per_tok": 1},
    "CsmDepthDecoderForCausalLM": {"num_codebooks": 4},
    "DbrxForCausalLM": {"attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0}},
}
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id")


def causal_lm_names() -> list[str]:
    import transformers

    return sorted(n for n in dir(transformers) if n.endswith("ForCausalLM") and not n.startswith("Auto"))


def tiny_config(config_cls: type, overrides: dict[str, Any] | None = None) -> Any:
    try:
        default = config_cls()
    except Exception:  # a default config its own validators refuse: the overrides make it valid
        default = config_cls(**(overrides or {}))
    keys = set(default.to_dict()) | set(getattr(config_cls, "attribute_map", {}))
    kw = {k: v for k, v in SIZES.items() if k in keys}
    kw |= {k: v for k, v in (overrides or {}).items() if k in keys}
    if "qk_rope_head_dim" in kw:  # multi-head latent attention: the rotary dims are qk_rope_head_dim
        kw.pop("head_dim", None)
        kw["num_key_value_heads"] = kw.get("num_attention_heads", 4)
        if "qk_head_dim" in keys:  # stored, not derived, by some configs
            kw["qk_head_dim"] = kw["qk_rope_head_dim"] + kw.get("qk_nope_head_dim", 0)
    for key in TOKEN_IDS:
        value = getattr(default, key, None)
        if isinstance(value, int) and value >= VOCAB:
            kw[key] = 0
    return config_cls(**kw, attn_implementation="eager")


def build(name: str) -> tuple[nn.Module | None, str]:
    """``(model in eval mode, "")`` or ``(None, why it cannot be built tiny here)``."""
    import transformers

    cls = getattr(transformers, name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = tiny_config(cls.config_class, OVERRIDES.get(name))
            with torch.device("meta"):
                size = sum(p.numel() for p in cls(config).parameters())
            if size > MAX_PARAMS:
                return None, f"{size / 1e6:.0f}M parameters even when tiny"
            torch.manual_seed(0)
            model = cls(config).eval()
    except Exception as err:  # a config validator or constructor that needs real sizes
        return None, f"cannot be built tiny: {type(err).__name__}: {_line(err)}"
    if hasattr(model, "set_default_language"):  # X-MOD: one adapter per language, picked before the forward
        model.set_default_language(model.config.languages[0])
    with torch.no_grad():  # HF inits norm weights to ones/zeros, which would hide a wrong cast order or 1 + w
        for pname, p in model.named_parameters():
            if "norm" in pname.lower() or "ln" in pname.lower():
                p.normal_(0.0, 0.5)
    return model, ""


def inputs(seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(3, 100, (2, 8), generator=g), "use_cache": False}


def logits(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model(**batch).logits


def _line(err: BaseException) -> str:
    return " ".join(str(err).split())[:120]
