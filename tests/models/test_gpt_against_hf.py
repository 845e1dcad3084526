"""``GPT.from_hf`` / ``GPT.to_hf`` against the HF models themselves, on tiny configs built locally (litgpt style).

Each family is checked both ways in fp32 (max |logits diff| <= 1e-5): a random HF model converted to lnblocks, and a
random lnblocks model exported to HF; plus weights surviving the round trip and greedy generation token for token.
"""

from __future__ import annotations

import pytest
import torch

from lnblocks import GPT, BlockConfig, GPTConfig
from tests.blocks.block_helpers import randomize_

transformers = pytest.importorskip("transformers")

V, ATOL = 101, 1e-5
COMMON = {"vocab_size": V, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2}
COMMON.update(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
NO_IDS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def _random(model: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    return randomize_(model, 0.1).eval()


def check_both_ways(hf: torch.nn.Module, family: str, T: int = 20) -> GPT:
    hf = _random(hf)
    idx = torch.randint(0, V, (2, T))
    gpt = GPT.from_hf(hf)
    assert not gpt.training
    with torch.no_grad():
        expected = hf(idx).logits
        assert (gpt(idx)[0] - expected).abs().max().item() <= ATOL
    # the other way: a random lnblocks model of that shape, exported
    gpt = _random(GPT(gpt.config))
    back = gpt.to_hf(family)
    assert type(back).__name__ == type(hf).__name__ and not back.training
    with torch.no_grad():
        assert (back(idx).logits - gpt(idx)[0]).abs().max().item() <= ATOL
    again = GPT.from_hf(back)
    for (k, a), (k2, b) in zip(gpt.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(a, b), k
    return gpt


def test_against_hf_gpt2() -> None:
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=32, n_embd=32, n_layer=2, n_head=4, **NO_IDS)
    gpt = check_both_ways(transformers.GPT2LMHeadModel(cfg), "gpt2")
    assert gpt.config.positions == "learned" and gpt.config.tie_weights
    assert gpt.config.layers[0].mlp.activation == "gelu_tanh" and gpt.lm_head.weight is gpt.tok_emb.weight


def test_against_hf_gpt2_untied_inverse_layer_scale() -> None:
    cfg = transformers.GPT2Config(
        vocab_size=V,
        n_positions=32,
        n_embd=32,
        n_layer=3,
        n_head=2,
        n_inner=40,
        activation_function="relu",
        scale_attn_by_inverse_layer_idx=True,
        tie_word_embeddings=False,
        layer_norm_epsilon=1e-6,
        **NO_IDS,
    )
    gpt = check_both_ways(transformers.GPT2LMHeadModel(cfg), "gpt2")
    assert [b.attention.scale for b in gpt.config.layers] == [None, 0.25 / 2, 0.25 / 3]  # None: head_dim**-0.5


def test_against_hf_llama() -> None:
    cfg = transformers.LlamaConfig(**COMMON, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    gpt = check_both_ways(transformers.LlamaForCausalLM(cfg), "llama")
    b = gpt.config.layers[0]
    assert (b.norm.cast, b.mlp.activation, b.attention.kv_heads, gpt.config.rope_theta) == ("llama", "swiglu", 2, 500.0)


def test_against_hf_llama_biases_head_dim_tied() -> None:
    cfg = transformers.LlamaConfig(**COMMON, attention_bias=True, mlp_bias=True, head_dim=16, tie_word_embeddings=True)
    check_both_ways(transformers.LlamaForCausalLM(cfg), "llama")


def test_against_hf_mistral() -> None:
    """Sliding window 5 over 20 tokens: the window really masks keys."""
    gpt = check_both_ways(
        transformers.MistralForCausalLM(transformers.MistralConfig(**COMMON, sliding_window=5)), "mistral"
    )
    assert [b.attention.sliding_window for b in gpt.config.layers] == [5, 5]


def test_against_hf_qwen2() -> None:
    """q/k/v biases, no o_proj bias; sliding window on the layers from max_window_layers on."""
    cfg = transformers.Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=6, max_window_layers=1)
    gpt = check_both_ways(transformers.Qwen2ForCausalLM(cfg), "qwen2")
    b = gpt.config.layers[1]
    assert (b.attention.qkv_bias, b.attention.out_bias, b.attention.sliding_window) == (True, False, 6)
    assert gpt.config.layers[0].attention.sliding_window is None


def test_against_hf_qwen3() -> None:
    """Per-head RMS QK-norm before RoPE, explicit head_dim."""
    cfg = transformers.Qwen3Config(**COMMON, head_dim=16)
    gpt = check_both_ways(transformers.Qwen3ForCausalLM(cfg), "qwen3")
    assert gpt.config.layers[0].qk_norm.kind == "rmsnorm" and gpt.blocks[0].attn.head_dim == 16


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_greedy_generation_matches_hf_generate(family: str) -> None:
    if family == "gpt2":
        hf = transformers.GPT2LMHeadModel(
            transformers.GPT2Config(vocab_size=V, n_positions=32, n_embd=32, n_layer=2, n_head=4, **NO_IDS)
        )
    else:
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON, **NO_IDS))
    hf = _random(hf)
    gpt = GPT.from_hf(hf)
    idx = torch.randint(0, V, (2, 5))
    expected = hf.generate(idx, max_new_tokens=8, do_sample=False, attention_mask=torch.ones_like(idx))
    assert torch.equal(gpt.generate(idx, 8, temperature=0), expected)


def test_export_fills_missing_biases_with_zeros() -> None:
    block = BlockConfig(
        dim=32,
        norm="qwen2",
        attention={"n_heads": 4, "qkv_bias": False, "out_bias": False},
        mlp={"activation": "swiglu", "hidden_dim": 48, "bias": False},
    )
    gpt = _random(GPT(GPTConfig(vocab_size=V, max_seq_len=64, n_layers=2, block=block, positions="rope")))
    hf = gpt.to_hf("qwen2")
    assert torch.all(hf.model.layers[0].self_attn.q_proj.bias == 0)
    idx = torch.randint(0, V, (1, 9))
    with torch.no_grad():
        assert (hf(idx).logits - gpt(idx)[0]).abs().max().item() <= ATOL


@pytest.mark.parametrize(
    ("block", "gpt_options", "family", "match"),
    [
        ({"placement": "post"}, {}, "gpt2", r"layer 0 placement='post' \(gpt2 needs 'pre'\)"),
        ({"norm": "rmsnorm"}, {}, "gpt2", r"norm.kind='rmsnorm' \(gpt2 needs 'layernorm'\)"),
        ({"attention": {"n_heads": 4, "n_kv_heads": 2}}, {}, "gpt2", "n_kv_heads=2"),
        ({"mlp": {"activation": "swiglu"}}, {}, "gpt2", "gpt2 takes a plain MLP"),
        ({}, {"positions": "rope"}, "gpt2", "positions='rope'"),
        ({"norm": "rmsnorm", "mlp": {"activation": "swiglu"}}, {"positions": "rope"}, "llama", "norm.eps=None"),
        (
            {"norm": "llama", "mlp": {"activation": "swiglu"}, "qk_norm": "rmsnorm"},
            {"positions": "rope"},
            "llama",
            "qk_norm.kind='rmsnorm' \\(llama needs None\\)",
        ),
        (
            {"norm": "llama", "mlp": {"activation": "swiglu"}, "attention": {"n_heads": 4, "out_bias": True}},
            {"positions": "rope"},
            "qwen2",
            r"attention.out_bias=True \(qwen2 needs False\)",
        ),
        (
            {"norm": "llama", "mlp": {"activation": "swiglu"}, "depth_scaled_norm": True},
            {"positions": "rope"},
            "llama",
            "depth_scaled_norm=True",
        ),
        ({}, {}, "opt", r"unknown family 'opt'; choices: \['gpt2', 'llama'"),
        ({"mlp_norm": True}, {}, "gpt2", r"layer 0 mlp_norm=True \(gpt2 needs False\)"),
        ({}, {"emb_norm": "layernorm"}, "gpt2", r"emb_norm=LayerNormSpec\(.*\) \(gpt2 needs None\)"),
    ],
)
def test_export_names_what_the_family_cannot_express(block: dict, gpt_options: dict, family: str, match: str) -> None:
    cfg = GPTConfig(n_layers=1, block={"dim": 32, **block}, **gpt_options)
    with pytest.raises(ValueError, match=match):
        GPT(cfg).to_hf(family)


def test_from_hf_rejects_unsupported_models() -> None:
    scaled = transformers.LlamaConfig(
        **COMMON, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
    )
    with pytest.raises(ValueError, match="rope_type 'linear' is not supported"):
        GPT.from_hf(transformers.LlamaForCausalLM(scaled))
    with pytest.raises(ValueError, match="has no lm_head"):
        GPT.from_hf(transformers.LlamaModel(transformers.LlamaConfig(**COMMON)))
    opt = transformers.OPTForCausalLM(
        transformers.OPTConfig(
            vocab_size=V, hidden_size=16, num_hidden_layers=1, ffn_dim=32, num_attention_heads=2, word_embed_proj_dim=16
        )
    )
    with pytest.raises(ValueError, match=r"unsupported model_type 'opt'"):
        GPT.from_hf(opt)
    with pytest.raises(TypeError, match="PreTrainedModel"):
        GPT.from_hf("gpt2")
