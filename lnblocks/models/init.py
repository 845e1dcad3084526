"""Weight-init schemes for ``GPT``, each the one its paper specifies.

- ``"gpt2"`` (Radford et al. 2019; nanoGPT, HF ``GPT2PreTrainedModel._init_weights``): every Linear and embedding
  ``N(0, init_std=0.02)``, biases 0, and the residual projections (``attn.proj``, ``mlp.fc2``) ``N(0, 0.02/sqrt(2L))``.
  Layers with LayerNorm Scaling keep ``0.02``: Sun et al. 2025 drop the depth-scaled init when scaling the norm.
- ``"xavier"`` (Glorot & Bengio 2010), the setting of the Pre/Post-LN analysis of Xiong et al. 2020: Xavier-normal
  for every matrix, computed per logical matrix (W_Q, W_K, W_V separately, not over the fused ``qkv``), biases 0,
  embeddings ``N(0, 1)`` (unit variance, as ``sqrt(d)``-scaled embeddings in Vaswani et al. 2017).
  With ``qkv_init="stacked"`` the q/k/v projection instead gets one Xavier draw over the stacked ``(3d, d)``
  matrix (std ``sqrt(2 / 4d)``), the convention of ``torch.nn.MultiheadAttention``'s ``in_proj_weight``.
- ``"deepnet"`` (Wang et al. 2022, DeepNet): as ``"xavier"``, but in ``"deepnorm"`` layers W_V, W_O and the MLP
  matrices get gain ``beta = (8N)^(-1/4)`` (decoder-only, N layers); W_Q and W_K keep gain 1.

Norm weights are reset by their own ``reset_parameters`` (ones, or zeros when zero-centred); ReZero gates start at 0.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lnblocks.blocks import deepnorm_beta
from lnblocks.models.config import INIT_SCHEMES


@torch.no_grad()
def init_weights(model: nn.Module, scheme: str | None = None) -> None:
    """Re-initialise every parameter of ``model``, a ``GPT``, with ``scheme`` (default: ``model.config.init``).

    Typed as a module: ``GPT.__init__`` calls it, so naming the class here would tie the two modules in a circle."""
    cfg = model.config
    scheme = cfg.init if scheme is None else scheme
    if scheme not in INIT_SCHEMES:
        raise ValueError(f"unknown init scheme {scheme!r}; choices: {list(INIT_SCHEMES)}")
    std = cfg.init_std
    emb_std = cfg.emb_init_std if cfg.emb_init_std is not None else (std if scheme == "gpt2" else 1.0)
    for m in model.modules():
        reset = getattr(m, "reset_parameters", None)
        if m is not model and not isinstance(m, (nn.Linear, nn.Embedding)) and callable(reset):
            reset()  # norms (and anything else that knows its own init)
    nn.init.normal_(model.tok_emb.weight, 0.0, emb_std)
    if model.pos_emb is not None:
        nn.init.normal_(model.pos_emb.weight, 0.0, emb_std)
    for blk in model.blocks:
        attn, mlp = blk.attn, blk.mlp
        for lin in (attn.qkv, attn.proj, mlp.fc1, mlp.fc2):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        for gate in (blk.attn_gate, blk.mlp_gate):
            if gate is not None:
                nn.init.zeros_(gate)
        if scheme == "gpt2":
            resid_std = std if blk.config.depth_scaled_norm else std / math.sqrt(2 * cfg.n_layers)
            nn.init.normal_(attn.qkv.weight, 0.0, std)
            nn.init.normal_(mlp.fc1.weight, 0.0, std)
            nn.init.normal_(attn.proj.weight, 0.0, resid_std)
            nn.init.normal_(mlp.fc2.weight, 0.0, resid_std)
            continue
        beta = deepnorm_beta(cfg.n_layers) if scheme == "deepnet" and blk.config.placement == "deepnorm" else 1.0
        w_q, w_k, w_v = attn.split_qkv(attn.qkv.weight)
        if cfg.qkv_init == "stacked":
            nn.init.xavier_normal_(attn.qkv.weight)  # rows [W_Q; W_K; W_V], fan_in + fan_out = d + 3d
            w_v.mul_(beta)
        else:
            nn.init.xavier_normal_(w_q)
            nn.init.xavier_normal_(w_k)
            nn.init.xavier_normal_(w_v, gain=beta)
        nn.init.xavier_normal_(attn.proj.weight, gain=beta)
        for w in mlp.split_fc1(mlp.fc1.weight) if mlp.gated else (mlp.fc1.weight,):
            nn.init.xavier_normal_(w, gain=beta)
        nn.init.xavier_normal_(mlp.fc2.weight, gain=beta)
    if model.lm_head.weight is not model.tok_emb.weight:
        if scheme == "gpt2":
            nn.init.normal_(model.lm_head.weight, 0.0, std)
        else:
            nn.init.xavier_normal_(model.lm_head.weight)
    from lnblocks.models.init_options import init_options

    init_options(model, scheme)  # the parameters of the attention gate, mHC and nGPT (none in other models)
