"""Residual blocks with every norm placement: ``BlockConfig`` (validated) and ``Block`` (placement as data)."""

from lnblocks.blocks.attention import Attention, AttentionStats, KVCache, flash_attn_unavailable_reason
from lnblocks.blocks.block import Block, Stream
from lnblocks.blocks.config import ACTIVATIONS, ATTENTION_BACKENDS, AttentionConfig, BlockConfig, MLPConfig
from lnblocks.blocks.mlp import MLP
from lnblocks.blocks.placements import PLACEMENTS, Placement, deepnorm_alpha, deepnorm_beta, depth_scale
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
    "KVCache",
    "MLPConfig",
    "Placement",
    "Stream",
    "apply_rope",
    "deepnorm_alpha",
    "deepnorm_beta",
    "depth_scale",
    "flash_attn_unavailable_reason",
    "rope_cache",
]
