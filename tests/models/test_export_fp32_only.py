"""What ``GPT.to_hf`` exports exactly only because the weights are fp32 (``residual_in_fp32``, RMSNorm's
``cast="fp32"`` against a family's ``"llama"``: the same math in fp32, one rounding apart in fp16/bf16) is named in a
``UserWarning``, never dropped without a word: cast to half precision, the HF model would compute otherwise. Every
field whose export rule is fp32-only is enumerated from ``lnblocks.models.export_rules``, so a new one without a
checked variant here fails."""

from __future__ import annotations

import warnings

import pytest
import torch

from lnblocks import GPT, GPTConfig
from lnblocks.models.export_rules import CAST, EXPORT_RULES, FP32_SAME
from lnblocks.norms.spec import NormSpec, RMSNormSpec
from tests.blocks.block_helpers import randomize_

pytest.importorskip("transformers")

LLAMA_BLOCK = {"dim": 32, "attention": {"n_heads": 4, "qkv_bias": False, "out_bias": False},
               "mlp": {"activation": "swiglu", "bias": False}}  # fmt: skip
GPT2_BLOCK = {"dim": 32, "attention": {"n_heads": 4}}
# (class, field) -> (family, block options, the dotted key the warning and the half-precision refusal name)
RMS = {"kind": "rmsnorm", "eps": 1e-6}
VARIANTS = {
    (NormSpec, "residual_in_fp32"): [
        ("gpt2", {**GPT2_BLOCK, "norm": {"kind": "layernorm", "residual_in_fp32": True}}, "norm.residual_in_fp32"),
        ("llama", {**LLAMA_BLOCK, "norm": {**RMS, "cast": "llama", "residual_in_fp32": True}}, "norm.residual_in_fp32"),
    ],
    (RMSNormSpec, "cast"): [("llama", {**LLAMA_BLOCK, "norm": {**RMS, "cast": "fp32"}}, "norm.cast='fp32'")],
}
FP32_ONLY = sorted(
    ((cls, name) for cls, rules in EXPORT_RULES.items() for name, rule in rules.items() if rule in (FP32_SAME, CAST)),
    key=lambda c: (c[0].__name__, c[1]),
)
CASES = [(f"{c.__name__}.{f}-{i}", *v) for (c, f) in FP32_ONLY for i, v in enumerate(VARIANTS.get((c, f), [None]))]


def test_every_fp32_only_rule_has_a_variant() -> None:
    assert FP32_ONLY and all(key in VARIANTS for key in FP32_ONLY), [k for k in FP32_ONLY if k not in VARIANTS]


@pytest.mark.parametrize(("case", "family", "block", "key"), [c for c in CASES if c[1] is not None], ids=lambda c: c)
def test_exported_exactly_in_fp32_with_a_warning_and_refused_in_half(case, family, block, key) -> None:
    cfg = GPTConfig(vocab_size=64, max_seq_len=16, n_layers=2, positions="rope" if family == "llama" else "learned",
                    block=block)  # fmt: skip
    torch.manual_seed(0)
    model = randomize_(GPT(cfg), 0.1).eval()
    with pytest.warns(UserWarning, match=rf"exact for these fp32 weights, but {family} cannot express layer 0 {key}"):
        hf = model.to_hf(family)
    idx = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        assert (hf(idx).logits - model(idx)[0]).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match=f"cannot export to {family}: layer 0 {key}"):
        model.to(torch.bfloat16).to_hf(family)


def test_a_model_the_family_expresses_exports_without_a_warning() -> None:
    cfg = GPTConfig(vocab_size=64, max_seq_len=16, n_layers=2, positions="rope",
                    block={**LLAMA_BLOCK, "norm": "llama"})  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GPT(cfg).to_hf("llama")
        GPT(cfg).to(torch.bfloat16).to_hf("llama")


def test_gemma2_says_the_same() -> None:
    """The Gemma 2 export goes through its own module; the same rule, the same warning and refusal."""
    import transformers

    hf_cfg = transformers.Gemma2Config(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=32, sliding_window=4, query_pre_attn_scalar=16,
        pad_token_id=None, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    cfg = GPT.from_hf(transformers.Gemma2ForCausalLM(hf_cfg)).config
    cfg = cfg.replace(block=[b.replace(norm=b.norm.replace(residual_in_fp32=True)) for b in cfg.layers])
    model = randomize_(GPT(cfg), 0.1).eval()
    with pytest.warns(UserWarning, match=r"fp32 weights, but gemma2 cannot express layer 0 norm.residual_in_fp32"):
        hf = model.to_hf("gemma2")
    idx = torch.randint(0, 96, (2, 9))
    with torch.no_grad():
        assert (hf(idx).logits - model(idx)[0]).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match=r"cannot export to gemma2: layer 0 norm\.residual_in_fp32"):
        model.to(torch.bfloat16).to_hf("gemma2")
