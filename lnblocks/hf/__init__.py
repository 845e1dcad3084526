"""Patch the norms of HuggingFace ``transformers`` models with lnblocks' exact (and, on GPU, fused) norms.

``patch_norms(model)`` works on any built ``nn.Module`` and needs no transformers import; ``patch_transformers()``
hooks model construction (``from_pretrained``, ``from_config``, constructors) and imports transformers lazily.
"""

from lnblocks.hf.families import ROLES
from lnblocks.hf.global_patch import patch_transformers, unpatch_transformers
from lnblocks.hf.patch import is_patched, patch_norms, patched_norms, unpatch_norms
from lnblocks.hf.report import LayerEntry, PatchEntry, PatchReport

__all__ = [
    "ROLES",
    "LayerEntry",
    "PatchEntry",
    "PatchReport",
    "is_patched",
    "patch_norms",
    "patch_transformers",
    "patched_norms",
    "unpatch_norms",
    "unpatch_transformers",
]
