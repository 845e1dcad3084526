"""What ``GPT.to_hf`` does with every field of the configs a GPT is made of: one decision per dataclass field.

``to_hf`` builds the family's HF config, reads it back (``config_from_hf``) and compares field by field
(``hf_configs.config_diff``); these rules say which fields take part. ``tests/models/test_export_rules.py`` iterates
the dataclasses' fields, so a new field without a decision here fails, and checks each decision: a compared field
set to a value the family cannot hold is named by ``to_hf``, and an exported model computes what the lnblocks one
does.
"""

from __future__ import annotations

from lnblocks.blocks import AttentionConfig, BlockConfig, HyperConnectionsConfig, MLPConfig
from lnblocks.models.config import GPTConfig
from lnblocks.norms.spec import (
    DerfSpec,
    DyTSpec,
    GatedRMSNormSpec,
    L2NormSpec,
    LayerNormSpec,
    NoNormSpec,
    NormSpec,
    RMSNormSpec,
    ScaleNormSpec,
)

COMPARED = "compared: a value the family cannot hold is named by to_hf"
INIT_ONLY = "not exported: initialisation only (the weights themselves are copied)"
BACKEND = "not exported: which implementation runs, not what it computes"
CAST = COMPARED + "; 'fp32' counts as 'llama' for fp32 weights (they are one rounding apart in fp16/bf16)"
ZERO_BIAS = COMPARED + "; False exports as zero biases where the family has them"
FP32_SAME = "compared for fp16/bf16 weights; for fp32 weights the same math as the family's (not compared)"


def _compared(*names: str) -> dict[str, str]:
    return dict.fromkeys(names, COMPARED)


EXPORT_RULES: dict[type, dict[str, str]] = {
    GPTConfig: {
        **_compared("vocab_size", "max_seq_len", "n_layers", "positions", "tie_weights", "emb_dropout", "emb_norm"),
        **_compared("emb_scale", "final_softcap"),
        "block": "compared layer by layer, by the BlockConfig, AttentionConfig, MLPConfig and norm rules",
        "rope_theta": "compared with positions='rope' (unused otherwise)",
        "final_norm": "compared as the final norm it gives (None follows the last placement's rule)",
        **dict.fromkeys(("init", "init_std", "emb_init_std", "qkv_init"), INIT_ONLY),
        "memory_efficient": BACKEND,
    },
    BlockConfig: {
        **_compared(
            "dim",
            "placement",
            "norm",
            "attention",
            "mlp",
            "qk_norm",
            "depth_scaled_norm",
            "shared_norm",
            "deepnorm_alpha",
            "rezero",
            "dropout",
            "mlp_norm",
            "v_norm",
            "mlp_placement",
            "hyper_connections",
        ),
        "memory_efficient": BACKEND,
    },
    AttentionConfig: {
        **_compared("n_heads", "n_kv_heads", "head_dim", "causal", "dropout", "sliding_window", "scale"),
        **_compared("softcap", "output_gate"),
        **dict.fromkeys(("qkv_bias", "out_bias"), ZERO_BIAS),
        "backend": BACKEND,
    },
    MLPConfig: {
        **_compared("activation", "hidden_dim"),
        "bias": ZERO_BIAS,
    },
    HyperConnectionsConfig: _compared("n_streams", "kind", "sinkhorn_iters", "eps"),
    NormSpec: {"residual_in_fp32": FP32_SAME, "backend": BACKEND},
    LayerNormSpec: {
        **_compared("eps", "elementwise_affine", "bias", "zero_centered", "cast", "group_size", "per_head"),
        "memory_efficient": BACKEND,
    },
    RMSNormSpec: {
        **_compared("eps", "elementwise_affine", "zero_centered", "group_size", "per_head"),
        "cast": CAST,
        "memory_efficient": BACKEND,
    },
    GatedRMSNormSpec: _compared("eps", "elementwise_affine", "gate", "activation", "cast", "group_size", "per_head"),
    L2NormSpec: {**_compared("eps", "reduction"), "memory_efficient": BACKEND},
    DerfSpec: _compared("alpha_init", "shift_init", "elementwise_affine", "bias"),
    DyTSpec: _compared("alpha_init", "elementwise_affine", "bias"),
    ScaleNormSpec: _compared("eps", "scale_init", "learnable"),
    NoNormSpec: {},
}

_NORM_FIELDS = ("norm", "qk_norm", "mlp_norm", "emb_norm", "v_norm")


def rule(owner: type, name: str) -> str:
    """The decision for field ``name`` of dataclass ``owner`` (a norm spec inherits ``NormSpec``'s)."""
    for cls in owner.__mro__:
        if name in EXPORT_RULES.get(cls, {}):
            return EXPORT_RULES[cls][name]
    raise KeyError(f"{owner.__name__}.{name} has no export rule in lnblocks.models.export_rules")


def block_key_rule(key: str) -> str:
    """The decision for a flattened ``BlockConfig`` key (``"attention.backend"``, ``"norm.cast"``, ``"dropout"``)."""
    head, _, leaf = key.partition(".")
    if not leaf:
        return rule(BlockConfig, head)
    if leaf == "kind":
        return COMPARED
    if head == "attention":
        return rule(AttentionConfig, leaf)
    if head == "mlp":
        return rule(MLPConfig, leaf)
    if head == "hyper_connections":
        return rule(HyperConnectionsConfig, leaf)
    if head in _NORM_FIELDS:  # a field means the same in every norm kind that has it
        for cls in (NormSpec, LayerNormSpec, RMSNormSpec, DyTSpec, ScaleNormSpec, GatedRMSNormSpec, L2NormSpec,
                    DerfSpec):  # fmt: skip
            if leaf in EXPORT_RULES[cls]:
                return EXPORT_RULES[cls][leaf]
    raise KeyError(f"block key {key!r} has no export rule in lnblocks.models.export_rules")
