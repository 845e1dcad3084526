"""Norm specs, the model-family table, reference math and modules. Imports nothing else from lnblocks except the
config base, ``lnblocks.config``."""

from lnblocks.norms.build import build_norm
from lnblocks.norms.families import MODEL_FAMILIES, ModelFamily
from lnblocks.norms.kinds import Derf, GatedRMSNorm, L2Norm
from lnblocks.norms.modules import DyT, LayerNorm, NoNorm, Norm, RMSNorm, ScaleNorm
from lnblocks.norms.spec import (
    NORM_PRESETS,
    DerfSpec,
    DyTSpec,
    GatedRMSNormSpec,
    L2NormSpec,
    LayerNormSpec,
    NoNormSpec,
    NormSpec,
    RMSNormSpec,
    ScaleNormSpec,
    available_norms,
    norm_spec,
)

__all__ = [
    "MODEL_FAMILIES",
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
    "ModelFamily",
    "NoNorm",
    "NoNormSpec",
    "Norm",
    "NormSpec",
    "RMSNorm",
    "RMSNormSpec",
    "ScaleNorm",
    "ScaleNormSpec",
    "available_norms",
    "build_norm",
    "norm_spec",
]
