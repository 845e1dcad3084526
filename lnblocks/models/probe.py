"""One diagnostic forward pass of a ``GPT``: the attention sink, massive activations and the hyper-connections'
composite mixing gain per layer, computed only when asked (the training forward keeps its sdpa path).

- ``first_token_mass``: per head, the mean attention probability on the first token (the attention sink; gated
  attention, Qiu et al. 2025, arXiv 2505.06708, reports it falls with the SDPA output gate), over the queries that
  see other keys too;
- ``max_abs_hidden`` / ``median_abs_hidden``: the largest and the median ``|h|`` of the residual stream after each
  block (massive activations, Sun et al. 2024, arXiv 2402.17762: a few entries 10^3-10^4 times the median);
- ``mixing_gain``: per token, ``composite_gain`` of the layers' residual mixing matrices (hyper-connections, mHC).

``probe`` runs every attention layer on the eager backend for the one call (as the study's diagnostics do) and
restores each layer's backend and the model's train/eval mode afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor, nn

from lnblocks.blocks import MixingGain, composite_gain


class LayerProbe(NamedTuple):
    """One block's diagnostics (fp32, detached): ``first_token_mass``, ``max_logit`` and ``entropy`` per head
    ``(H,)`` (``lnblocks.blocks.AttentionStats``), ``max_abs_hidden`` and ``median_abs_hidden`` (0-dim) of the
    stream after the block (``GPT.forward(return_hidden=True)``'s, over batch, positions and channels)."""

    first_token_mass: Tensor
    max_logit: Tensor
    entropy: Tensor
    max_abs_hidden: Tensor
    median_abs_hidden: Tensor


class ModelProbe(NamedTuple):
    """``layers``: a ``LayerProbe`` per block; ``mixing_gain``: the ``MixingGain`` of the product of all sublayers'
    residual mixing matrices, per token ``(B, T)`` (None without hyper-connections)."""

    layers: list[LayerProbe]
    mixing_gain: MixingGain | None


@contextlib.contextmanager
def _recording(model: nn.Module) -> Iterator[list]:
    """Eager attention in every layer and hyper-connections recording their mixing; both restored on exit."""
    saved = [blk.attn.config for blk in model.blocks]
    hcs = [hc for blk in model.blocks for hc in (blk.attn_hc, blk.mlp_hc) if hc is not None]
    was_training = model.training
    try:
        model.eval()
        for blk in model.blocks:
            blk.attn.config = dataclasses.replace(blk.attn.config, backend="eager")
        for hc in hcs:
            hc.record = True
        yield hcs
    finally:
        for blk, cfg in zip(model.blocks, saved):
            blk.attn.config = cfg
        for hc in hcs:
            hc.record, hc.last_mixing = False, None
        model.train(was_training)


@torch.no_grad()
def probe(model: nn.Module, idx: Tensor) -> ModelProbe:
    """The diagnostics of one eval-mode forward pass of ``model`` on token ids ``idx`` ``(B, T)``."""
    with _recording(model) as hcs:
        _, _, hidden = model(idx, return_hidden=True)  # n_layers + 1 x (B, T, C)
        mixing = [hc.last_mixing for hc in hcs]
        stats = model.attention_stats()
    layers = []
    for s, h in zip(stats, hidden[1:]):
        a = h.detach().float().abs()
        layers.append(LayerProbe(s.first_token_mass, s.max_logit, s.entropy, a.amax(), a.flatten().median()))
    gain = composite_gain([m.float() for m in mixing]) if mixing else None
    return ModelProbe(layers, gain)
