"""What ``lnblocks.hf`` keeps about what it changed, in one place: a ``PatchRecord`` per patched module, a
``LayerFusion`` per fused layer class, a ``LossRecord`` per causal LM whose loss runs through the chunked LM head.

A patched module carries one instance attribute, ``_lnblocks_patch``, holding its ``PatchRecord`` (besides the
``forward`` and ``extra_repr`` that make it run lnblocks); a fused decoder layer's class is a generated subclass whose
one class attribute ``lnblocks_fusion`` is its ``LayerFusion``; a causal LM with the chunked loss carries
``_lnblocks_loss``, its ``LossRecord`` (besides its ``forward``, its ``_loss_function`` and its head's ``forward``:
``lnblocks.hf.chunked_loss``). Being attributes, they travel with ``copy.deepcopy`` and pickling; nothing else is
stored on the module or on its lnblocks norm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor, nn

from lnblocks.hf.recognition import NormMath
from lnblocks.norms import Norm, build_norm

RECORD_KEY = "_lnblocks_patch"  # the instance attribute holding a patched module's PatchRecord
LOSS_KEY = "_lnblocks_loss"  # the instance attribute holding a causal LM's LossRecord
FUSION_KEY = "lnblocks_fusion"  # the class attribute holding a fused layer class's LayerFusion


@dataclass(eq=False)
class PatchRecord:
    """A patched module: ``norm`` (the lnblocks norm computing its math on the module's own Parameters), ``math``
    (what the module computes, as recognised from its class) and ``saved_forward`` (accelerate's ``_old_forward``
    that the patched forward replaced, put back by ``unpatch_norms``; None without accelerate)."""

    norm: Norm
    math: NormMath
    saved_forward: Callable | None = None
    by_dim: dict[int, Norm] = field(default_factory=dict)

    def norm_for(self, x: Tensor) -> Norm:
        """The norm for ``x``: ``norm``, or for a parameter-free class that stores no shape (``math.shape_from ==
        "input"``) one per last dim, built at its first call of that width with ``norm``'s spec."""
        if self.math.shape_from != "input":
            return self.norm
        n = x.shape[-1]
        norm = self.by_dim.get(n)
        if norm is None:
            norm = self.by_dim[n] = build_norm(self.norm.spec, n)
        return norm


@dataclass(frozen=True)
class LayerFusion:
    """A fused layer class: ``base``, the class it was generated from, and ``norms``, the attribute names of the
    norms whose preceding residual add its forward fuses."""

    base: type
    norms: tuple[str, ...]


def record_of(module: nn.Module) -> PatchRecord | None:
    """The ``PatchRecord`` of a patched module, else None."""
    return module.__dict__.get(RECORD_KEY)


def is_patched(module: nn.Module) -> bool:
    """True if ``module``'s forward currently runs an lnblocks norm."""
    return RECORD_KEY in module.__dict__


def fusion_of(layer: nn.Module) -> LayerFusion | None:
    """The ``LayerFusion`` of a layer whose class ``fuse_residual=True`` swapped, else None."""
    return type(layer).__dict__.get(FUSION_KEY)


def is_fused(layer: nn.Module) -> bool:
    return FUSION_KEY in type(layer).__dict__


@dataclass(eq=False)
class LossRecord:
    """A causal LM whose loss runs through the chunked LM head: ``head``, the attribute name of its head module;
    ``logit_map``, what its forward applies to the logits (``lnblocks.hf.head_source.HeadForm``'s steps, e.g.
    ``(("softcap", "config.final_logit_softcapping"),)``); ``loss_function``, the loss its ``loss_function`` gave
    before (transformers' ``ForCausalLMLoss``, used for calls outside a labelled forward); ``labels_at``, the
    position of ``labels`` among the forward's positional arguments (None: keyword only); ``saved_forward``
    (accelerate's ``_old_forward``) and
    ``saved_loss_function`` (the instance's ``_loss_function`` entry, None if it had none), put back on
    unpatching."""

    head: str
    logit_map: tuple[tuple[str, str], ...]
    loss_function: Callable
    labels_at: int | None
    saved_forward: Callable | None = None
    saved_loss_function: Callable | None = None


def loss_record_of(module: nn.Module) -> LossRecord | None:
    """The ``LossRecord`` of a causal LM whose loss runs through the chunked head, else None."""
    return module.__dict__.get(LOSS_KEY)
