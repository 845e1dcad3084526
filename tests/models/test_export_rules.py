"""``GPT.to_hf`` audits every config field: each dataclass field of the model, block, attention, MLP and norm configs
has a decision in ``lnblocks.models.export_rules`` (a new field without one fails here), and each field, set to a
value of its own, is either named by ``to_hf`` or exported to a model that computes the same logits (fp32, random
weights, max |diff| <= 1e-5)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lnblocks import GPT, GPTConfig
from lnblocks.blocks import AttentionConfig, BlockConfig, HyperConnectionsConfig, MLPConfig
from lnblocks.models.export_rules import EXPORT_RULES, rule
from lnblocks.norms.spec import (
    SPEC_TYPES,
    DerfSpec,
    DyTSpec,
    GatedRMSNormSpec,
    L2NormSpec,
    LayerNormSpec,
    NormSpec,
    RMSNormSpec,
    ScaleNormSpec,
)
from tests.blocks.block_helpers import randomize_

transformers = pytest.importorskip("transformers")

CLASSES = (GPTConfig, BlockConfig, AttentionConfig, MLPConfig, HyperConnectionsConfig, NormSpec, *SPEC_TYPES.values())
CONTAINERS = {(GPTConfig, "block"), (BlockConfig, "attention"), (BlockConfig, "mlp")}  # covered field by field
BASE = {  # family -> (GPTConfig options, block options) of a model the family expresses
    "gpt2": ({}, {"dim": 32, "attention": {"n_heads": 4}}),
    "llama": (
        {"positions": "rope"},
        {
            "dim": 32,
            "norm": "llama",
            "attention": {"n_heads": 4, "qkv_bias": False, "out_bias": False},
            "mlp": {"activation": "swiglu", "bias": False},
        },
    ),
}
for _family in ("mistral", "qwen2", "qwen3"):
    _gpt, _block = BASE["llama"]
    BASE[_family] = (_gpt, {**_block, "norm": _family, "qk_norm": _family if _family == "qwen3" else None})
BASE["qwen2"][1]["attention"] = {"n_heads": 4, "qkv_bias": True, "out_bias": False}


def _attn(family: str, **kw: object) -> dict:
    return {"attention": {**BASE[family][1]["attention"], **kw}}


def _mlp(family: str, **kw: object) -> dict:
    return {"mlp": {**BASE[family][1].get("mlp", {}), **kw}}


def _rms(**kw: object) -> dict:
    return {"norm": {"kind": "rmsnorm", "cast": "llama", "eps": 1e-6, **kw}}


# (class, field) -> [(family, GPTConfig options, block options, key to_hf must name, or None: exports the same)]
VARIANTS: dict[tuple[type, str], list[tuple[str, dict, dict, str | None]]] = {
    (GPTConfig, "vocab_size"): [("gpt2", {"vocab_size": 50}, {}, None)],
    (GPTConfig, "max_seq_len"): [("gpt2", {"max_seq_len": 24}, {}, None)],
    (GPTConfig, "n_layers"): [("llama", {"n_layers": 3}, {}, None)],
    (GPTConfig, "positions"): [
        ("gpt2", {"positions": "none"}, {}, "positions"),
        ("llama", {"positions": "learned"}, {}, "positions"),
    ],
    (GPTConfig, "rope_theta"): [("llama", {"rope_theta": 500.0}, {}, None), ("gpt2", {"rope_theta": 500.0}, {}, None)],
    (GPTConfig, "tie_weights"): [("gpt2", {"tie_weights": True}, {}, None), ("qwen3", {"tie_weights": True}, {}, None)],
    (GPTConfig, "final_norm"): [("gpt2", {"final_norm": False}, {}, "final norm")],
    (GPTConfig, "init"): [("gpt2", {"init": "xavier"}, {}, None)],
    (GPTConfig, "init_std"): [("llama", {"init_std": 0.05}, {}, None)],
    (GPTConfig, "emb_init_std"): [("gpt2", {"emb_init_std": 0.5}, {}, None)],
    (GPTConfig, "qkv_init"): [("gpt2", {"init": "xavier", "qkv_init": "stacked"}, {}, None)],
    (GPTConfig, "emb_dropout"): [
        ("gpt2", {"emb_dropout": 0.1}, {}, None),
        ("llama", {"emb_dropout": 0.1}, {}, "emb_dropout"),
    ],
    (GPTConfig, "emb_norm"): [("gpt2", {"emb_norm": "layernorm"}, {}, "emb_norm")],
    (GPTConfig, "emb_scale"): [("llama", {"emb_scale": 2.0}, {}, "emb_scale")],
    (GPTConfig, "final_softcap"): [("gpt2", {"final_softcap": 30.0}, {}, "final_softcap")],
    (BlockConfig, "dim"): [("gpt2", {}, {"dim": 48}, None)],
    (BlockConfig, "placement"): [
        ("gpt2", {}, {"placement": "post"}, "placement"),
        ("llama", {}, {"placement": "sandwich"}, "placement"),
    ],
    (BlockConfig, "norm"): [
        ("gpt2", {}, {"norm": "rmsnorm"}, "norm.kind"),
        ("llama", {}, {"norm": "layernorm"}, "norm.kind"),
    ],
    (BlockConfig, "qk_norm"): [
        ("llama", {}, {"qk_norm": "rmsnorm"}, "qk_norm"),
        ("qwen3", {}, {"qk_norm": None}, "qk_norm"),
    ],
    (BlockConfig, "depth_scaled_norm"): [("gpt2", {}, {"depth_scaled_norm": True}, "depth_scaled_norm")],
    (BlockConfig, "shared_norm"): [("gpt2", {}, {"placement": "parallel", "shared_norm": True}, "shared_norm")],
    (BlockConfig, "deepnorm_alpha"): [
        ("gpt2", {"init": "deepnet"}, {"placement": "deepnorm", "deepnorm_alpha": 2.0}, "deepnorm_alpha")
    ],
    (BlockConfig, "rezero"): [("llama", {}, {"rezero": True}, "rezero")],
    (BlockConfig, "dropout"): [("gpt2", {}, {"dropout": 0.1}, None), ("llama", {}, {"dropout": 0.1}, "dropout")],
    (BlockConfig, "mlp_norm"): [
        ("gpt2", {}, {"mlp_norm": True}, "mlp_norm"),
        ("llama", {}, {"mlp_norm": "rmsnorm"}, "mlp_norm"),
    ],
    (BlockConfig, "v_norm"): [("llama", {}, {"v_norm": "rmsnorm"}, "v_norm")],
    (BlockConfig, "mlp_placement"): [("gpt2", {}, {"mlp_placement": "post"}, "mlp_placement")],
    (BlockConfig, "hyper_connections"): [("gpt2", {}, {"hyper_connections": {"n_streams": 2}}, "hyper_connections")],
    (HyperConnectionsConfig, "n_streams"): [("llama", {}, {"hyper_connections": {"n_streams": 3}}, "n_streams")],
    (HyperConnectionsConfig, "kind"): [("gpt2", {}, {"hyper_connections": {"kind": "static"}}, "kind")],
    (HyperConnectionsConfig, "sinkhorn_iters"): [
        ("gpt2", {}, {"hyper_connections": {"kind": "mhc", "sinkhorn_iters": 5}}, "sinkhorn_iters")
    ],
    (HyperConnectionsConfig, "eps"): [("gpt2", {}, {"hyper_connections": {"kind": "mhc", "eps": 1e-5}}, "eps")],
    (AttentionConfig, "n_heads"): [("gpt2", {}, _attn("gpt2", n_heads=8), None)],
    (AttentionConfig, "n_kv_heads"): [
        ("gpt2", {}, _attn("gpt2", n_kv_heads=2), "attention.n_kv_heads"),
        ("llama", {}, _attn("llama", n_kv_heads=2), None),
    ],
    (AttentionConfig, "head_dim"): [
        ("gpt2", {}, _attn("gpt2", head_dim=16), "attention.head_dim"),
        ("qwen3", {}, _attn("qwen3", head_dim=16), None),
    ],
    (AttentionConfig, "causal"): [
        ("gpt2", {}, _attn("gpt2", causal=False), "attention.causal"),
        ("qwen2", {}, _attn("qwen2", causal=False), "attention.causal"),
    ],
    (AttentionConfig, "backend"): [("gpt2", {}, _attn("gpt2", backend="eager"), None)],
    (AttentionConfig, "dropout"): [
        ("gpt2", {}, _attn("gpt2", dropout=0.1), None),
        ("llama", {}, _attn("llama", dropout=0.1), None),
    ],
    (AttentionConfig, "qkv_bias"): [
        ("gpt2", {}, _attn("gpt2", qkv_bias=False), None),
        ("mistral", {}, _attn("mistral", qkv_bias=True), "attention.qkv_bias"),
    ],
    (AttentionConfig, "out_bias"): [
        ("llama", {}, _attn("llama", qkv_bias=True, out_bias=True), None),
        ("qwen2", {}, _attn("qwen2", out_bias=True), "attention.out_bias"),
    ],
    (AttentionConfig, "sliding_window"): [
        ("gpt2", {}, _attn("gpt2", sliding_window=4), "attention.sliding_window"),
        ("mistral", {}, _attn("mistral", sliding_window=4), None),
    ],
    (AttentionConfig, "scale"): [("llama", {}, _attn("llama", scale=0.3), "attention.scale")],
    (AttentionConfig, "softcap"): [("llama", {}, _attn("llama", softcap=50.0), "attention.softcap")],
    (AttentionConfig, "output_gate"): [("gpt2", {}, _attn("gpt2", output_gate="headwise"), "attention.output_gate")],
    (MLPConfig, "activation"): [
        ("gpt2", {}, _mlp("gpt2", activation="relu"), None),
        ("gpt2", {}, _mlp("gpt2", activation="swiglu"), "activation"),
        ("llama", {}, _mlp("llama", activation="gelu"), "activation"),
    ],
    (MLPConfig, "hidden_dim"): [("llama", {}, _mlp("llama", hidden_dim=48), None)],
    (MLPConfig, "bias"): [
        ("gpt2", {}, _mlp("gpt2", bias=False), None),
        ("qwen2", {}, _mlp("qwen2", bias=True), "mlp.bias"),
    ],
    (NormSpec, "residual_in_fp32"): [("gpt2", {}, {"norm": {"kind": "layernorm", "residual_in_fp32": True}}, None)],
    (NormSpec, "backend"): [("llama", {}, _rms(backend="torch"), None)],
    (LayerNormSpec, "eps"): [("gpt2", {}, {"norm": {"kind": "layernorm", "eps": 1e-3}}, None)],
    (LayerNormSpec, "elementwise_affine"): [
        ("gpt2", {}, {"norm": {"kind": "layernorm", "elementwise_affine": False}}, "norm.elementwise_affine")
    ],
    (LayerNormSpec, "bias"): [("gpt2", {}, {"norm": {"kind": "layernorm", "bias": False}}, "norm.bias")],
    (LayerNormSpec, "zero_centered"): [
        ("gpt2", {}, {"norm": {"kind": "layernorm", "zero_centered": True}}, "norm.zero_centered")
    ],
    (RMSNormSpec, "eps"): [("llama", {}, _rms(eps=1e-3), None)],
    (RMSNormSpec, "elementwise_affine"): [("llama", {}, _rms(elementwise_affine=False), "norm.elementwise_affine")],
    (RMSNormSpec, "zero_centered"): [("llama", {}, _rms(zero_centered=True, cast="fp32"), "norm.zero_centered")],
    (RMSNormSpec, "cast"): [("llama", {}, _rms(cast="t5"), "norm.cast"), ("llama", {}, _rms(cast="fp32"), None)],
    (DyTSpec, "alpha_init"): [("gpt2", {}, {"norm": {"kind": "dyt", "alpha_init": 0.7}}, "norm.kind")],
    (DyTSpec, "elementwise_affine"): [
        ("gpt2", {}, {"norm": {"kind": "dyt", "elementwise_affine": False}}, "norm.kind")
    ],
    (DyTSpec, "bias"): [("llama", {}, {"norm": {"kind": "dyt", "bias": False}}, "norm.kind")],
    (ScaleNormSpec, "eps"): [("gpt2", {}, {"norm": {"kind": "scalenorm", "eps": 1e-3}}, "norm.kind")],
    (ScaleNormSpec, "scale_init"): [("gpt2", {}, {"norm": {"kind": "scalenorm", "scale_init": 2.0}}, "norm.kind")],
    (ScaleNormSpec, "learnable"): [("llama", {}, {"norm": {"kind": "scalenorm", "learnable": False}}, "norm.kind")],
    (LayerNormSpec, "cast"): [("gpt2", {}, {"norm": {"kind": "layernorm", "cast": "cohere"}}, "norm.cast")],
    (LayerNormSpec, "group_size"): [("gpt2", {}, {"norm": {"kind": "layernorm", "group_size": 8}}, "norm.group_size")],
    (LayerNormSpec, "per_head"): [("gpt2", {}, {"norm": {"kind": "layernorm", "per_head": True}}, "norm.per_head")],
    (LayerNormSpec, "memory_efficient"): [("gpt2", {}, {"norm": {"kind": "layernorm", "memory_efficient": True}},
                                           None)],
    (RMSNormSpec, "group_size"): [("llama", {}, _rms(group_size=8), "norm.group_size")],
    (RMSNormSpec, "per_head"): [("llama", {}, _rms(per_head=True), "norm.per_head")],
    (RMSNormSpec, "memory_efficient"): [("llama", {}, _rms(memory_efficient=True), None)],
    (GPTConfig, "memory_efficient"): [("llama", {"memory_efficient": True}, {}, None)],
    (BlockConfig, "memory_efficient"): [("gpt2", {}, {"memory_efficient": True}, None)],
    **{(GatedRMSNormSpec, f): [("llama", {}, {"norm": {"kind": "gated_rmsnorm", f: v}}, "norm.kind")] for f, v in
       (("eps", 1e-5), ("elementwise_affine", False), ("gate", "after"), ("activation", "sigmoid"), ("cast", "fp32"),
        ("group_size", 8), ("per_head", True))},
    (L2NormSpec, "eps"): [("llama", {}, {"norm": {"kind": "l2norm", "eps": 1e-5}}, "norm.kind")],
    (L2NormSpec, "reduction"): [("llama", {}, {"norm": {"kind": "l2norm", "reduction": "sum"}}, "norm.kind")],
    (L2NormSpec, "memory_efficient"): [("llama", {}, {"norm": {"kind": "l2norm", "memory_efficient": True}},
                                        "norm.kind")],
    **{(DerfSpec, f): [("gpt2", {}, {"norm": {"kind": "derf", f: v}}, "norm.kind")] for f, v in
       (("alpha_init", 0.7), ("shift_init", 0.1), ("elementwise_affine", False), ("bias", False))},
}  # fmt: skip
CASES = [(f"{c.__name__}.{f}-{i}", c, f, *v) for (c, f), vs in VARIANTS.items() for i, v in enumerate(vs)]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_field_has_an_export_rule_and_a_checked_variant(cls: type) -> None:
    own = [f.name for f in dataclasses.fields(cls) if cls is NormSpec or f.name not in _norm_base_fields()]
    for name in own:
        assert rule(cls, name), f"{cls.__name__}.{name}"  # KeyError: a field without an export decision
        if (cls, name) not in CONTAINERS:
            assert (cls, name) in VARIANTS, f"{cls.__name__}.{name} has a rule but no variant checked below"
    assert set(EXPORT_RULES.get(cls, {})) <= {f.name for f in dataclasses.fields(cls)}, "a rule for no field"


def _norm_base_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(NormSpec)}


def _model(family: str, gpt: dict, block: dict) -> GPT:
    base_gpt, base_block = BASE[family]
    cfg = GPTConfig(
        **{"vocab_size": 64, "max_seq_len": 16, "n_layers": 1, **base_gpt, **gpt}, block={**base_block, **block}
    )
    torch.manual_seed(0)
    return randomize_(GPT(cfg), 0.1).eval()


@pytest.mark.parametrize(("case", "cls", "field", "family", "gpt", "block", "named"), CASES, ids=[c[0] for c in CASES])
def test_each_field_is_named_or_exported_exactly(case, cls, field, family, gpt, block, named) -> None:
    model = _model(family, gpt, block)
    if named is not None:
        with pytest.raises(ValueError, match=f"cannot export to {family}: .*{named}"):
            model.to_hf(family)
        return
    hf = model.to_hf(family)
    idx = torch.randint(0, model.config.vocab_size, (2, 9))
    with torch.no_grad():
        assert (hf(idx).logits - model(idx)[0]).abs().max().item() <= 1e-5


@pytest.mark.parametrize(
    ("family", "block", "key"),
    [
        ("gpt2", {"norm": {"kind": "layernorm", "residual_in_fp32": True}}, "norm.residual_in_fp32"),
        ("llama", _rms(cast="fp32"), "norm.cast='fp32'"),
    ],
)
def test_half_precision_weights_end_the_fp32_only_equalities(family: str, block: dict, key: str) -> None:
    """In fp32 these export (the same math); with bf16 weights HF would round where lnblocks does not."""
    model = _model(family, {}, block)
    model.to_hf(family)
    with pytest.raises(ValueError, match=f"cannot export to {family}: layer 0 {key}"):
        model.to(torch.bfloat16).to_hf(family)


def test_generate_refuses_bidirectional_attention() -> None:
    model = _model("gpt2", {"n_layers": 2}, _attn("gpt2", causal=False))
    with pytest.raises(ValueError, match=r"generate needs causal attention: layers \[0, 1\] have attention.causal"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 3)
