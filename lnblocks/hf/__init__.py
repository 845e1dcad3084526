"""Patch the norms of HuggingFace ``transformers`` models with lnblocks' exact (and, on GPU, fused) norms.

``patch_norms(model)`` works on any built ``nn.Module`` (PEFT and accelerate-dispatched models included) and needs
no transformers import; ``fuse_residual=True`` also fuses the residual add before each norm of a decoder layer, and
``chunked_loss=True`` computes a causal LM's labelled loss through the chunked LM head (``lnblocks.hf.chunked_loss``).
``patch_transformers()`` hooks model construction (``from_pretrained``, ``from_config``, constructors),
``from_pretrained(...)`` loads and patches in one call, and ``PatchNormsCallback`` patches a ``Trainer``'s model;
these import transformers lazily (``PatchNormsCallback`` subclasses ``transformers.TrainerCallback``, so it is
built on first access and is not part of ``__all__``).
"""

from typing import Any

from lnblocks.hf.families import ROLES
from lnblocks.hf.global_patch import patch_transformers, unpatch_transformers
from lnblocks.hf.patch import patch_norms, patched_norms, unpatch_norms
from lnblocks.hf.record import is_patched
from lnblocks.hf.report import LayerEntry, LossEntry, PatchEntry, PatchReport
from lnblocks.hf.stacks import from_pretrained

__all__ = [
    "ROLES",
    "LayerEntry",
    "LossEntry",
    "PatchEntry",
    "PatchReport",
    "from_pretrained",
    "is_patched",
    "patch_norms",
    "patch_transformers",
    "patched_norms",
    "unpatch_norms",
    "unpatch_transformers",
]


def __getattr__(name: str) -> Any:  # PatchNormsCallback subclasses transformers.TrainerCallback: built on first use
    if name == "PatchNormsCallback":
        from lnblocks.hf import stacks

        return stacks.PatchNormsCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
