"""Residual blocks with every norm placement: ``BlockConfig`` (validated) and ``Block`` (placement as data)."""

from lnblocks.blocks.attention import Attention, AttentionStats, KVCache, flash_attn_unavailable_reason, softcap
from lnblocks.blocks.block import Block, Stream
from lnblocks.blocks.config import ACTIVATIONS, ATTENTION_BACKENDS, AttentionConfig, BlockConfig, MLPConfig
from lnblocks.blocks.hyper import (
    HyperConnection,
    HyperConnectionsConfig,
    MixingGain,
    composite_gain,
    sinkhorn_knopp,
)
from lnblocks.blocks.mlp import MLP
from lnblocks.blocks.ngpt import l2_normalize, normalize_block_weights_
from lnblocks.blocks.placements import (
    PLACEMENTS,
    Placement,
    deepnorm_alpha,
    deepnorm_beta,
    depth_scale,
    siamese_divisor,
)
from lnblocks.blocks.rope import apply_rope, rope_cache

__all__ = [
    "ACTIVATIONS",
    "ATTENTION_BACKENDS",
    "MLP",
    "PLACEMENTS",
    "Attention",
    "AttentionConfig",
    "AttentionStats",
    "Block",
    "BlockConfig",
    "HyperConnection",
    "HyperConnectionsConfig",
    "KVCache",
    "MLPConfig",
    "MixingGain",
    "Placement",
    "Stream",
    "apply_rope",
    "composite_gain",
    "deepnorm_alpha",
    "deepnorm_beta",
    "depth_scale",
    "flash_attn_unavailable_reason",
    "l2_normalize",
    "normalize_block_weights_",
    "rope_cache",
    "siamese_divisor",
    "sinkhorn_knopp",
    "softcap",
]
