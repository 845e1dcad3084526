"""Initialisation of the parameters that model options add, run at the end of ``init_weights``: each as its paper
or reference implementation specifies, so that an option leaves the init of everything else unchanged.

- the attention output gate's ``gate_proj`` (gated attention, arXiv 2505.06708): as the q/k/v projection of the
  scheme (``N(0, init_std)`` for ``"gpt2"``, Xavier-normal otherwise), bias 0;
- mHC's ``phi`` (arXiv 2512.24880): ``N(0, init_std)``, as DeepSeek-V4 in ``transformers`` (its other parameters and
  the static / dynamic hyper-connections reset themselves: ``HyperConnection.reset_parameters``);
- nGPT (arXiv 2410.01131): every matrix and embedding row normalised to unit norm after its draw
  (``GPT.normalize_weights_``; the authors normalise once before training, then after every step).
"""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def init_options(model: nn.Module, scheme: str) -> None:
    """Initialise the option parameters of ``model`` under ``scheme`` (see the module docstring)."""
    std = model.config.init_std
    for blk in model.blocks:
        gate = blk.attn.gate_proj
        if gate is not None:
            if scheme == "gpt2":
                nn.init.normal_(gate.weight, 0.0, std)
            else:
                nn.init.xavier_normal_(gate.weight)
            if gate.bias is not None:
                nn.init.zeros_(gate.bias)
        for hc in (blk.attn_hc, blk.mlp_hc):
            if hc is not None and hc.config.kind == "mhc":
                hc.reset_parameters(std)
    model.normalize_weights_()
