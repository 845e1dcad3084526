"""lnblocks: normalization for Transformers.

Exact LayerNorm/RMSNorm variants (``LayerNorm``, ``RMSNorm``, ``build_norm``), the norms of the 2025-26 families
(``GatedRMSNorm``, ``L2Norm``, ``Derf``), fused Triton kernels
(``lnblocks.kernels``), residual blocks and GPT models, HuggingFace norm patching (``lnblocks.hf``), Pre/Post-LN
stability studies (``lnblocks.study``) and CNN norms (``lnblocks.cnn``).

Importing lnblocks loads only torch: triton, transformers and matplotlib load when first used.
"""

from __future__ import annotations

import importlib
from typing import Any

from lnblocks.norms import (
    NORM_PRESETS,
    Derf,
    DerfSpec,
    DyT,
    DyTSpec,
    GatedRMSNorm,
    GatedRMSNormSpec,
    L2Norm,
    L2NormSpec,
    LayerNorm,
    LayerNormSpec,
    NoNorm,
    NoNormSpec,
    Norm,
    NormSpec,
    RMSNorm,
    RMSNormSpec,
    ScaleNorm,
    ScaleNormSpec,
    available_norms,
    build_norm,
    norm_spec,
)

__version__ = "0.1.0"

# Public names that live in subpackages, loaded on first access (PEP 562).
_LAZY: dict[str, str] = {
    "BlockConfig": "lnblocks.blocks",
    "Block": "lnblocks.blocks",
    "GPTConfig": "lnblocks.models",
    "GPT": "lnblocks.models",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lnblocks' has no attribute {name!r}")


__all__ = [
    "NORM_PRESETS",
    "Derf",
    "DerfSpec",
    "DyT",
    "DyTSpec",
    "GatedRMSNorm",
    "GatedRMSNormSpec",
    "L2Norm",
    "L2NormSpec",
    "LayerNorm",
    "LayerNormSpec",
    "NoNorm",
    "NoNormSpec",
    "Norm",
    "NormSpec",
    "RMSNorm",
    "RMSNormSpec",
    "ScaleNorm",
    "ScaleNormSpec",
    "__version__",
    "available_norms",
    "build_norm",
    "norm_spec",
    *_LAZY,
]
