"""Position-wise MLP: ``fc2(act(fc1(x)))`` or the gated form ``fc2(act(gate) * up)`` (SwiGLU/GeGLU, Shazeer 2020).

A gated MLP keeps gate and up in one ``fc1`` (rows ``[gate; up]``): one matmul instead of two, and stable parameter
names (``fc1``, ``fc2``) whatever the activation. With a ``norm`` spec, NormFormer's FFN norm (Shleifer et al. 2021,
arXiv 2110.09456) normalises the hidden activations before ``fc2``: ``fc2(norm(act(fc1(x))))``, for gated MLPs
after the gating product. ``normalized`` (nGPT, Loshchilov et al. 2024, arXiv 2410.01131, Eq. 20-21; SwiGLU only):
the up projection ``u`` is scaled by ``s_u`` and the gate ``v`` by ``s_v * sqrt(dim)`` before ``u * silu(v)``.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from lnblocks.blocks.config import MLPConfig
from lnblocks.blocks.ngpt import Scale
from lnblocks.norms import NormSpec, build_norm


def gelu_tanh(x: Tensor) -> Tensor:
    """The tanh approximation of GELU: GPT-2's ``gelu_new`` math in one kernel."""
    return F.gelu(x, approximate="tanh")


_ACT = {
    "gelu": F.gelu,  # exact erf form (BERT, HF "gelu")
    "gelu_tanh": gelu_tanh,
    "relu": F.relu,
    "silu": F.silu,
    "swiglu": F.silu,
    "geglu": F.gelu,
    "geglu_tanh": gelu_tanh,  # Gemma's gelu_pytorch_tanh gate
}


class MLP(nn.Module):
    """``fc1``: Linear dim -> hidden (x2 when gated), ``fc2``: Linear hidden -> dim, ``norm``: the hidden-size norm
    (None unless ``norm`` is given); nGPT's ``s_u``, ``s_v`` (``Scale`` of the hidden size) when ``normalized``."""

    def __init__(self, dim: int, config: MLPConfig, norm: NormSpec | None = None, normalized: bool = False) -> None:
        super().__init__()
        self.config = config
        self.hidden_dim = config.hidden_dim or 4 * dim
        self.gated = config.gated
        self.act = _ACT[config.activation]
        self.fc1 = nn.Linear(dim, self.hidden_dim * (2 if self.gated else 1), bias=config.bias)
        self.norm = build_norm(norm, self.hidden_dim) if norm is not None else None
        self.fc2 = nn.Linear(self.hidden_dim, dim, bias=config.bias)
        self.s_u = Scale(self.hidden_dim, init=1.0, scale=1.0) if normalized else None
        self.s_v = Scale(self.hidden_dim, init=1.0, scale=1.0) if normalized else None
        self.v_factor = dim**0.5  # nGPT's sqrt(d_model) on the gate

    def split_fc1(self, t: Tensor) -> tuple[Tensor, Tensor]:
        """Split a tensor shaped like ``fc1.weight``/``fc1.bias`` (or their grads) of a gated MLP into gate, up."""
        if not self.gated:
            raise ValueError(f"split_fc1 needs a gated activation (swiglu, geglu), got {self.config.activation!r}")
        return t[: self.hidden_dim], t[self.hidden_dim :]

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc1(x)  # (B, T, hidden) or (B, T, 2*hidden)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            if self.s_u is not None:  # nGPT Eq. 20-21: u <- u s_u, v <- v s_v sqrt(d_model)
                up, gate = up * self.s_u().to(up.dtype), gate * (self.s_v().to(gate.dtype) * self.v_factor)
            h = self.act(gate) * up
        else:
            h = self.act(h)  # (B, T, hidden)
        if self.norm is not None:
            h = self.norm(h)  # NormFormer's FFN norm
        return self.fc2(h)  # (B, T, C)
