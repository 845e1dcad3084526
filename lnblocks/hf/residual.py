"""``fuse_residual=True``: the residual add in front of a norm inside an HF decoder layer becomes part of the norm call.

A Pre-LN decoder layer (Llama and its copies) reads, between attention and MLP::

    hidden_states = residual + hidden_states
    residual = hidden_states
    hidden_states = self.post_attention_layernorm(hidden_states)

lnblocks norms take the add as an argument, ``norm(x, residual=r) -> (norm(x + r), x + r)`` (one kernel on GPU: the
fused add + norm of flash-attn and Liger-Kernel), so the three statements become::

    hidden_states, residual = __lnblocks_add_norm__(self.post_attention_layernorm, residual, hidden_states)

Only an add that the layer's own code follows with a norm can be fused this way; the add at the end of a layer meets
the next layer's norm outside this code. The other order, a norm whose output is added to the residual (OLMo 2's
``hidden_states = residual + self.post_attention_layernorm(hidden_states)``, written as two statements), becomes
``hidden_states = __lnblocks_norm_add__(self.post_attention_layernorm, hidden_states, residual, False)``, which calls
``norm(x, then_add=r)``: ``Norm.norm_then_add``, one kernel reading ``x`` and ``r`` and writing ``r + norm(x)``. So
Llama fuses one of its two adds per layer, OLMo2 both (norm, then add), and Gemma2/3 two: the add between their
sandwich norms (into the pre-feedforward norm) and the last one (after the post-feedforward norm); the add after
Gemma's post-attention norm is the pre-feedforward norm's already.

Why it is exact, and never a guess:

- the forward is read from its source and checked against the code the class runs (``lnblocks.hf.layer_source``);
  a layer that fails (another transformers version, a closure, an unknown decorator) is refused, naming its class;
- the three statements are matched as syntax trees, and the callee must be a norm that lnblocks patches on this
  instance; nothing else in the function changes (it is compiled with its module's globals and line numbers);
- ``__lnblocks_add_norm__(norm, a, b)`` adds ``a + b`` in that operand order, in their dtype as HF does; when the
  norm is not (or no longer) patched, the operands would broadcast, or a hook would see the call (a forward or
  backward hook on the norm, or a global one), it runs the original statements, so hooks see the norm's true input
  ``a + b`` and its plain output; ``__lnblocks_norm_add__`` falls back the same way (hooks see ``norm(x)``);
- the layer's class becomes a subclass with the same name whose forward is the rewritten one; transformers'
  ``GradientCheckpointingLayer`` wraps it at class creation like the original, so gradient checkpointing keeps
  working (FSDP2 swaps classes the same way); unpatching swaps the class back.
"""

from __future__ import annotations

import functools
import logging
import types
from dataclasses import dataclass

from torch import Tensor, nn

from lnblocks.hf.layer_source import read_forward
from lnblocks.hf.record import FUSION_KEY, LayerFusion, fusion_of, is_fused
from lnblocks.hf.wrappers import base_model_name, hooked_by_accelerate, takes_residual, wrapped_copies

log = logging.getLogger("lnblocks.hf")


def _one_call(norm: nn.Module, a: object, b: object) -> bool:
    """Whether ``norm`` can take ``b`` into its own call with ``a``: two tensors of one shape on one device, and a
    norm that runs lnblocks with no hook that would see the call."""
    return (
        isinstance(a, Tensor)
        and isinstance(b, Tensor)
        and a.shape == b.shape
        and a.device == b.device
        and takes_residual(norm)
    )


def norm_add(norm: nn.Module, x: Tensor, r: Tensor, norm_first: bool) -> Tensor:
    """``r + norm(x)`` (``norm(x) + r`` with ``norm_first``: the same bits), as the one call ``norm(x, then_add=r)``
    (``Norm.norm_then_add``: one kernel on GPU) where ``norm`` runs lnblocks and no hook would see the call."""
    if _one_call(norm, x, r):
        return norm(x, then_add=r)
    y = norm(x)
    return y + r if norm_first else r + y


def add_norm(norm: nn.Module, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``s = a + b; return norm(s), s``, as the one call ``norm(a, residual=b)`` where ``norm`` runs lnblocks and
    no hook would see the call."""
    if _one_call(norm, a, b):
        return norm(a, residual=b)
    s = a + b
    return norm(s), s


# ---- the fused layer classes --------------------------------------------------------------------------------------
def _new_fused(base: type, names: tuple[str, ...]) -> nn.Module:
    """Unpickling / deepcopy: a fused layer of ``base`` (or a plain one where this transformers cannot be fused)."""
    try:
        cls = fused_class(base, names)
    except ValueError:
        cls = base
    return object.__new__(cls)


def _reduce_ex(self: nn.Module, protocol: int) -> tuple:
    rv = object.__reduce_ex__(self, max(protocol, 2))  # (copyreg.__newobj__, (cls,), state, ...)
    fusion = fusion_of(self)
    return (_new_fused, (fusion.base, fusion.norms), *rv[2:])


@functools.cache
def fused_class(base: type, names: tuple[str, ...]) -> type:
    """The subclass of ``base`` whose forward fuses the adds in front of the norms ``names``."""
    source = read_forward(base)
    if source.fn is None:
        raise ValueError(f"{base.__name__}: {source.reason}")
    namespace = {
        "forward": source.compile(names, add_norm, norm_add),
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
        "__reduce_ex__": _reduce_ex,
        FUSION_KEY: LayerFusion(base, names),
    }
    return type(base.__name__, (base,), namespace)


def _rebind(layer: nn.Module, old: type, new: type) -> None:
    """Point forwards that accelerate's hooks saved as bound methods of ``old.forward`` at ``new.forward``."""
    for key in ("forward", "_old_forward"):
        bound = layer.__dict__.get(key)
        if isinstance(bound, types.MethodType) and bound.__self__ is layer and bound.__func__ is old.forward:
            layer.__dict__[key] = types.MethodType(new.forward, layer)


def fuse(layer: nn.Module, names: tuple[str, ...]) -> None:
    base = type(layer)
    cls = fused_class(base, names)
    layer.__class__ = cls
    _rebind(layer, base, cls)


def unfuse(layer: nn.Module) -> None:
    cls = type(layer)
    base = fusion_of(layer).base
    layer.__class__ = base
    _rebind(layer, cls, base)


# ---- which layers of a model ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerPlan:
    """A decoder layer and the norms whose preceding add is fused (empty with ``reason``: refused)."""

    name: str
    layer: nn.Module
    norms: tuple[str, ...]
    reason: str = ""


def plan_fusion(model: nn.Module, recognised: set[int], patched: set[int], *, strict: bool = True) -> list[LayerPlan]:
    """The decoder layers of ``model`` to fuse, their classes compiled now (so fusing cannot fail half-way).

    ``recognised``: ids of the norms lnblocks reproduces; ``patched``: ids of the norms patched once this call is
    applied. A layer that cannot be fused raises a ``ValueError`` naming its class and why, before anything changes
    (``strict``), or is left unfused and logged (``patch_transformers``, which meets every model built).
    """
    layers = _decoder_layers(model, recognised, patched)
    refused = [plan for plan in layers if not plan.norms]
    if not layers or refused:
        message = _refusal(base_model_name(model), layers, refused)
        if strict:
            raise ValueError(f"{message} Patch it without fuse_residual. Nothing was changed.")
        log.info("%s Its norms are patched, those adds stay as they are.", message)
    fusable = [plan for plan in layers if plan.norms]
    for plan in fusable:
        if not is_fused(plan.layer):
            fused_class(type(plan.layer), plan.norms)
    return fusable


def _refusal(what: str, layers: list[LayerPlan], refused: list[LayerPlan]) -> str:
    if not layers:
        return (
            f"fuse_residual=True: {what} has no decoder layer lnblocks can fuse (no item of an nn.ModuleList has a "
            "recognised norm as a direct child)."
        )
    by_class: dict[str, tuple[int, str, str]] = {}
    for plan in refused:
        count, example, reason = by_class.get(type(plan.layer).__name__, (0, plan.name, plan.reason))
        by_class[type(plan.layer).__name__] = (count + 1, example, reason)
    lines = [f"{cls} ({n} layer{'s' if n > 1 else ''}, e.g. {ex}): {why}" for cls, (n, ex, why) in by_class.items()]
    return f"fuse_residual=True: the residual add of {what} cannot be fused into its norms in " + "; ".join(lines) + "."


def _decoder_layers(model: nn.Module, norms: set[int], patched: set[int]) -> list[LayerPlan]:
    """Every decoder layer of ``model``: an item of an ``nn.ModuleList`` with a direct child that is one of the
    recognised ``norms`` (ids; a PEFT wrapper of one counts)."""
    prefix = {id(m): n for n, m in model.named_modules()}
    plans = []
    for container in model.modules():
        if not isinstance(container, nn.ModuleList):
            continue
        for layer in container:
            children = dict(layer.named_children())
            if not any(id(m) in norms for c in children.values() for m in wrapped_copies(c)):
                continue
            plans.append(_plan_layer(prefix[id(layer)], layer, children, patched))
    return plans


def _plan_layer(name: str, layer: nn.Module, children: dict[str, nn.Module], patched: set[int]) -> LayerPlan:
    fusion = fusion_of(layer)
    if fusion is not None:
        return LayerPlan(name, layer, fusion.norms)
    if "forward" in layer.__dict__ and not hooked_by_accelerate(layer):
        return LayerPlan(name, layer, (), "its forward is replaced on the instance (another patcher or hook)")
    source = read_forward(type(layer))
    if source.fn is None:
        return LayerPlan(name, layer, (), source.reason)
    fused = source.fusable(
        n for n in source.sites if n in children and all(id(m) in patched for m in wrapped_copies(children[n]))
    )
    if fused:
        return LayerPlan(name, layer, fused)
    called = ", ".join(f"self.{n}" for n in dict.fromkeys(source.sites))
    return LayerPlan(name, layer, (), f"the module after each residual add ({called}) is no norm patched by this call")
