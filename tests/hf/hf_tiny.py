"""Tiny HF models of every patched family, built locally from configs with random weights (no downloads)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

VOCAB = 96
_ATTN = {"attn_implementation": "eager"}  # the same attention math on every run


def _decoder(config_cls: str, model_cls: str, **kw: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        base = dict(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
        config = getattr(transformers, config_cls)(**{**base, **kw}, **_ATTN)
        return getattr(transformers, model_cls)(config)

    return build


def _build(config_cls: str, model_cls: str, **kw: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        config = getattr(transformers, config_cls)(**kw, **_ATTN)
        return getattr(transformers, model_cls)(config)

    return build


_BERT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)

# name -> (builder, expected number of patched norms, expected roles -> count)
FAMILIES: dict[str, tuple[Callable[[], nn.Module], int, dict[str, int]]] = {
    "llama": (_decoder("LlamaConfig", "LlamaForCausalLM"), 5, {"pre_attn": 2, "pre_mlp": 2, "final": 1}),
    "mistral": (_decoder("MistralConfig", "MistralForCausalLM"), 5, {"pre_attn": 2, "pre_mlp": 2, "final": 1}),
    "qwen2": (_decoder("Qwen2Config", "Qwen2ForCausalLM"), 5, {"pre_attn": 2, "pre_mlp": 2, "final": 1}),
    "qwen3": (
        _decoder("Qwen3Config", "Qwen3ForCausalLM", head_dim=8),
        9,
        {"pre_attn": 2, "pre_mlp": 2, "q_norm": 2, "k_norm": 2, "final": 1},
    ),
    "phi3": (_decoder("Phi3Config", "Phi3ForCausalLM", pad_token_id=0), 5, {"pre_attn": 2, "pre_mlp": 2, "final": 1}),
    "gemma": (_decoder("GemmaConfig", "GemmaForCausalLM", head_dim=8), 5, {"pre_attn": 2, "pre_mlp": 2, "final": 1}),
    "gemma2": (
        _decoder("Gemma2Config", "Gemma2ForCausalLM", head_dim=8),
        9,
        {"pre_attn": 2, "post_attn": 2, "pre_mlp": 2, "post_mlp": 2, "final": 1},
    ),
    "gemma3": (
        _decoder("Gemma3TextConfig", "Gemma3ForCausalLM", head_dim=8),
        13,
        {"pre_attn": 2, "post_attn": 2, "pre_mlp": 2, "post_mlp": 2, "q_norm": 2, "k_norm": 2, "final": 1},
    ),
    "olmo2": (
        _decoder("Olmo2Config", "Olmo2ForCausalLM"),
        9,
        {"post_attn": 2, "post_mlp": 2, "q_norm": 2, "k_norm": 2, "final": 1},
    ),
    "gpt2": (
        _build("GPT2Config", "GPT2LMHeadModel", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64),
        5,
        {"pre_attn": 2, "pre_mlp": 2, "final": 1},
    ),
    "gpt_neox": (
        _build(
            "GPTNeoXConfig",
            "GPTNeoXForCausalLM",
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
        ),
        5,
        {"pre_attn": 2, "pre_mlp": 2, "final": 1},
    ),
    "bert": (
        _build("BertConfig", "BertForMaskedLM", **_BERT),
        6,
        {"embedding": 1, "post_ln_attn": 2, "post_ln_mlp": 2, "head": 1},
    ),
    "roberta": (
        _build("RobertaConfig", "RobertaForMaskedLM", **_BERT, pad_token_id=1, max_position_embeddings=64),
        6,
        {"embedding": 1, "post_ln_attn": 2, "post_ln_mlp": 2, "head": 1},
    ),
    "opt_pre": (
        _build(
            "OPTConfig",
            "OPTForCausalLM",
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            ffn_dim=64,
            word_embed_proj_dim=32,
            max_position_embeddings=64,
            do_layer_norm_before=True,
        ),
        5,
        {"pre_attn": 2, "pre_mlp": 2, "final": 1},
    ),
    "opt_post": (
        _build(
            "OPTConfig",
            "OPTForCausalLM",
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            ffn_dim=64,
            word_embed_proj_dim=32,
            max_position_embeddings=64,
            do_layer_norm_before=False,
        ),
        4,
        {"post_ln_attn": 2, "post_ln_mlp": 2},
    ),
    "t5": (
        _build(
            "T5Config",
            "T5ForConditionalGeneration",
            vocab_size=VOCAB,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            decoder_start_token_id=0,
        ),
        12,
        {"pre_attn": 4, "pre_cross_attn": 2, "pre_mlp": 4, "final": 2},
    ),
    "falcon": (
        _build(
            "FalconConfig",
            "FalconForCausalLM",
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            parallel_attn=True,
            new_decoder_architecture=False,
        ),
        3,
        {"pre_parallel": 2, "final": 1},
    ),
    "falcon_sequential": (
        _build(
            "FalconConfig",
            "FalconForCausalLM",
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            parallel_attn=False,
            new_decoder_architecture=False,
        ),
        5,
        {"pre_attn": 2, "pre_mlp": 2, "final": 1},
    ),
    "falcon_new_arch": (
        _build(
            "FalconConfig",
            "FalconForCausalLM",
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_kv_heads=2,
            new_decoder_architecture=True,
        ),
        5,
        {"pre_attn": 2, "pre_mlp": 2, "final": 1},
    ),
}


def build(name: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Module:
    """The tiny model of family ``name`` with random weights; norm weights are randomised too (HF inits them to
    ones/zeros, which would hide a wrong ``1 + w`` or a wrong cast order)."""
    torch.manual_seed(seed)
    model = FAMILIES[name][0]()
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
