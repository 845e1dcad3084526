"""Fold eval-mode BatchNorm into the preceding Conv/Linear, for inference: one layer fewer, outputs unchanged.

In eval mode BatchNorm is the per-channel affine map ``y = s * (z - running_mean) + beta`` with
``s = gamma / sqrt(running_var + eps)``; after ``z = W x + b`` it equals a single layer with ``W' = s W`` (scaled
per output channel) and ``b' = s (b - running_mean) + beta``. Folded weights are computed in fp64 and stored in the
layer's dtype.

Pairs are found on the ``torch.fx`` graph (a BatchNorm whose input is the output of a Conv/Linear used nowhere
else, each module called once), so ``self.conv1`` / ``self.bn1`` attribute pairs fold as well as ``nn.Sequential``
ones; models fx cannot trace fall back to adjacent pairs inside ``nn.Sequential`` containers, with a warning.
Folds Conv1d/2d/3d, ConvTranspose1d/2d/3d (grouped too) and Linear, followed by torch.nn's or lnblocks'
BatchNorm*d, SyncBatchNorm or BatchRenorm*d. Linear + BatchNorm1d assumes 2-D ``(N, C)`` activations, the layout
in which BatchNorm1d's channel is the Linear's output feature.
"""

from __future__ import annotations

import copy
import itertools
import warnings

import torch
import torch.fx as fx
from torch import nn

from lnblocks.cnn._base import NormBase
from lnblocks.cnn.instancenorm import InstanceNormBase

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_CONV_T = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_LAYERS = (*_CONV, *_CONV_T, nn.Linear)
_BATCH_NORMS = (nn.modules.batchnorm._BatchNorm, NormBase)


def _is_batch_norm(m: nn.Module) -> bool:
    # lnblocks' InstanceNorm shares NormBase but normalises per instance: not foldable.
    return isinstance(m, _BATCH_NORMS) and not isinstance(m, InstanceNormBase)


def _out_features(layer: nn.Module) -> int:
    return layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels


def _compatible(layer: nn.Module, bn: nn.Module) -> bool:
    if bn.running_mean is None or bn.num_features != _out_features(layer):
        return False
    if not isinstance(layer, nn.Linear):
        return True
    if isinstance(bn, NormBase):  # Linear + BatchNorm: only a norm that takes (N, C) inputs
        return 2 in bn._ranks
    return isinstance(bn, (nn.BatchNorm1d, nn.SyncBatchNorm))


@torch.no_grad()
def fold_conv_bn(layer: nn.Module, bn: nn.Module) -> nn.Module:
    """A copy of ``layer`` (Conv/ConvTranspose/Linear) with eval-mode ``bn`` folded in (see the module docstring)."""
    if not isinstance(layer, _LAYERS):
        raise TypeError(f"layer must be a Conv*d, ConvTranspose*d or Linear, got {type(layer).__name__}")
    if not _is_batch_norm(bn):
        raise TypeError(f"bn must be a BatchNorm module, got {type(bn).__name__}")
    if bn.training:
        raise ValueError("bn: fold_batchnorm folds eval-mode BatchNorm; call model.eval() first")
    if bn.running_mean is None:
        raise ValueError("bn: a BatchNorm with track_running_stats=False uses batch statistics in eval: not foldable")
    c = _out_features(layer)
    if bn.num_features != c:
        raise ValueError(f"bn: num_features={bn.num_features} does not match the layer's {c} output channels")
    f64 = torch.float64
    scale = torch.rsqrt(bn.running_var.to(f64) + bn.eps)  # (C,)
    if bn.weight is not None:
        scale = scale * bn.weight.to(f64)
    shift = -bn.running_mean.to(f64) * scale
    if bn.bias is not None:
        shift = shift + bn.bias.to(f64)
    w = layer.weight.to(f64)
    if isinstance(layer, _CONV_T):  # weight (C_in, C_out / groups, *k): output channel g * C_out/groups + j
        g = layer.groups
        w = w.reshape(g, -1, c // g, *w.shape[2:]) * scale.reshape(g, 1, c // g, *([1] * (w.dim() - 2)))
        w = w.reshape(layer.weight.shape)
    else:  # weight (C_out, ...)
        w = w * scale.reshape(-1, *([1] * (w.dim() - 1)))
    b = shift if layer.bias is None else layer.bias.to(f64) * scale + shift
    out = copy.deepcopy(layer)
    out.weight = nn.Parameter(w.to(layer.weight.dtype), requires_grad=layer.weight.requires_grad)
    dtype = layer.weight.dtype if layer.bias is None else layer.bias.dtype
    out.bias = nn.Parameter(b.to(dtype), requires_grad=layer.weight.requires_grad)
    return out


class _LeafTracer(fx.Tracer):
    """Keeps layers and every lnblocks.cnn module (whose forward checks its input) as single call_module nodes."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        ours = type(m).__module__.startswith("lnblocks.cnn.")
        return ours or isinstance(m, _LAYERS) or super().is_leaf_module(m, module_qualified_name)


def _pairs_from_graph(model: nn.Module) -> list[tuple[str, str]]:
    graph = _LeafTracer().trace(model)
    calls: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    pairs = []
    for node in graph.nodes:
        if node.op != "call_module" or not node.args or not isinstance(node.args[0], fx.Node):
            continue
        prev = node.args[0]
        if prev.op != "call_module" or len(prev.users) != 1 or calls[prev.target] != 1 or calls[node.target] != 1:
            continue
        layer, bn = model.get_submodule(prev.target), model.get_submodule(node.target)
        if isinstance(layer, _LAYERS) and _is_batch_norm(bn) and len(node.args) == 1 and not node.kwargs:
            pairs.append((prev.target, node.target))
    return pairs


def _pairs_from_sequentials(model: nn.Module) -> list[tuple[str, str]]:
    pairs = []
    for name, m in model.named_modules():
        if not isinstance(m, nn.Sequential) or type(m).forward is not nn.Sequential.forward:
            continue
        items = list(m.named_children())
        for (n1, a), (n2, b) in itertools.pairwise(items):
            if isinstance(a, _LAYERS) and _is_batch_norm(b):
                pairs.append((f"{name}.{n1}" if name else n1, f"{name}.{n2}" if name else n2))
    return pairs


def find_conv_bn_pairs(model: nn.Module) -> list[tuple[str, str]]:
    """``(layer name, batchnorm name)`` pairs that ``fold_batchnorm`` would fold (see the module docstring)."""
    try:
        pairs = _pairs_from_graph(model)
    except Exception as err:  # fx cannot trace data-dependent control flow and more: fall back, say so
        warnings.warn(
            f"fold_batchnorm: torch.fx could not trace {type(model).__name__} ({type(err).__name__}: {err}); "
            "folding only Conv/Linear + BatchNorm pairs adjacent inside nn.Sequential containers",
            stacklevel=2,
        )
        pairs = _pairs_from_sequentials(model)
    # A module reachable under two names is shared: folding it would change its other uses.
    seen: dict[int, int] = {}
    for _, m in model.named_modules(remove_duplicate=False):
        seen[id(m)] = seen.get(id(m), 0) + 1
    out = []
    for layer_name, bn_name in pairs:
        layer, bn = model.get_submodule(layer_name), model.get_submodule(bn_name)
        if seen[id(layer)] == 1 and seen[id(bn)] == 1 and _compatible(layer, bn):
            out.append((layer_name, bn_name))
    return out


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def fold_batchnorm(model: nn.Module, inplace: bool = False) -> nn.Module:
    """Fold every eval-mode BatchNorm into the Conv/Linear before it; the BatchNorm becomes ``nn.Identity``.

    Returns the folded model (a deep copy unless ``inplace``); its eval outputs equal the original's up to float
    rounding. ``ValueError`` if a foldable BatchNorm is in training mode. See ``find_conv_bn_pairs``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    pairs = find_conv_bn_pairs(model)
    for _, bn_name in pairs:
        if model.get_submodule(bn_name).training:
            raise ValueError(
                f"model: fold_batchnorm folds eval-mode BatchNorm, but {bn_name!r} is in training mode; "
                "call model.eval() first"
            )
    if not inplace:
        model = copy.deepcopy(model)
    for layer_name, bn_name in pairs:
        folded = fold_conv_bn(model.get_submodule(layer_name), model.get_submodule(bn_name))
        _set_submodule(model, layer_name, folded)
        _set_submodule(model, bn_name, nn.Identity())
    return model
