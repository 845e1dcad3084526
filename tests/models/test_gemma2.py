"""Gemma 2 both ways: a tiny random ``transformers.Gemma2ForCausalLM`` (GQA, sliding windows on alternate layers,
attention and final soft-capping, a ``query_pre_attn_scalar`` of its own) and the lnblocks GPT give the same logits,
``from_hf`` and ``to_hf``, fp32 and bf16; the chunked head honours the final cap; what Gemma 2 cannot hold is named."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lnblocks import GPT
from lnblocks.models.hf_gemma2 import config_from_hf
from tests.blocks.block_helpers import randomize_

transformers = pytest.importorskip("transformers")


def _hf_config(**overrides):
    options = {
        "vocab_size": 96, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 32,
        "sliding_window": 4, "query_pre_attn_scalar": 16, "attn_logit_softcapping": 2.0,
        "final_logit_softcapping": 3.0, "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,
    }  # fmt: skip
    return transformers.Gemma2Config(**{**options, **overrides})


def _hf(**overrides):
    torch.manual_seed(0)
    return randomize_(transformers.Gemma2ForCausalLM(_hf_config(**overrides)), 0.2).eval()


ATOL = 1e-5  # fp32: the same ops, GEMMs of other shapes (fused q/k/v, gate/up) round apart


def test_from_hf_computes_what_gemma2_computes() -> None:
    hf = _hf()
    gpt = GPT.from_hf(hf)
    cfg = gpt.config
    assert cfg.emb_scale == 32**0.5 and cfg.final_softcap == 3.0 and cfg.tie_weights
    assert [b.attention.sliding_window for b in cfg.layers] == [4, None, 4]
    assert cfg.layers[0].attention.softcap == 2.0 and cfg.layers[0].attention.scale == 0.25
    ids = torch.randint(0, 96, (2, 12))
    with torch.no_grad():
        assert (gpt(ids)[0] - hf(ids).logits).abs().max().item() <= ATOL


def test_to_hf_exports_a_gemma2_with_the_same_logits() -> None:
    torch.manual_seed(1)
    gpt = randomize_(GPT(config_from_hf(_hf_config(tie_word_embeddings=False))), 0.2).eval()
    hf = gpt.to_hf("gemma2")
    assert isinstance(hf, transformers.Gemma2ForCausalLM) and not hf.config.tie_word_embeddings
    ids = torch.randint(0, 96, (2, 12))
    with torch.no_grad():
        assert (hf(ids).logits - gpt(ids)[0]).abs().max().item() <= ATOL
    assert GPT.from_hf(hf).config == gpt.config


def test_bf16_error_is_within_twice_gemma2s_own() -> None:
    """In bf16 both round; against the fp32 model the lnblocks error is at most twice HF's (+ one bf16 ulp)."""
    hf = _hf()
    ids = torch.randint(0, 96, (2, 12))
    with torch.no_grad():
        ref = hf(ids).logits
        gpt = GPT.from_hf(hf.to(torch.bfloat16))
        ours = (gpt(ids)[0].float() - ref).abs().max().item()
        theirs = (hf(ids).logits.float() - ref).abs().max().item()
    assert ours <= 2 * theirs + 2**-7


def test_chunked_head_honours_the_final_cap() -> None:
    hf = _hf()
    gpt = GPT.from_hf(hf)
    ids, targets = torch.randint(0, 96, (2, 12)), torch.randint(0, 96, (2, 12))
    with torch.no_grad():
        expected = F.cross_entropy(hf(ids).logits.flatten(0, 1), targets.flatten())
        _, chunked = gpt(ids, targets, return_logits=False)
    torch.testing.assert_close(chunked, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"placement": "pre"}, "placement='pre'"),
        ({"v_norm": "rmsnorm"}, "v_norm"),
        ({"norm": "llama"}, "norm.zero_centered"),
    ],
)
def test_to_hf_names_what_gemma2_cannot_hold(change: dict, named: str) -> None:
    cfg = config_from_hf(_hf_config())
    bad = cfg.replace(block=tuple(b.replace(**change) for b in cfg.layers))
    with pytest.raises(ValueError, match=f"cannot export to gemma2: .*{named}"):
        GPT(bad).to_hf("gemma2")
