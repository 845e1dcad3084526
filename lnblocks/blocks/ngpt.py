"""nGPT's pieces (Loshchilov et al. 2024, arXiv 2410.01131): L2 normalisation, its restored scales, and the
renormalisation of weights after each optimizer step.

Everything on the unit hypersphere: ``Norm(v) = v / ||v||`` (``l2_normalize``, no learned gain). Each learned
scale ``s`` (the eigen learning rates ``alpha_A``, ``alpha_M`` and ``s_qk``, ``s_u``, ``s_v``, ``s_z``) is stored as
a parameter initialised to ``s_scale`` and used as ``stored * (s_init / s_scale)`` (§2.5), so that its effective
learning rate is set by ``s_scale``. The weight vectors along the embedding dimension are renormalised after every
optimizer step (§2.6; the authors' NVIDIA/ngpt ``normalize_matrices``): ``normalize_block_weights_``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ALPHA_INIT = 0.05  # alpha_A, alpha_M: s_init 0.05, s_scale 1 / sqrt(d_model)


def l2_normalize(x: Tensor, dim: int = -1) -> Tensor:
    """``x / ||x||_2`` along ``dim``, computed in fp32 (at least) and returned in ``x``'s dtype."""
    compute = torch.promote_types(x.dtype, torch.float32)
    return F.normalize(x.to(compute), dim=dim, eps=1e-12).to(x.dtype)


class Scale(nn.Module):
    """A learned scale of ``shape``: parameter ``weight`` initialised to ``scale``, used as ``weight * (init /
    scale)`` (nGPT §2.5: the value starts at ``init`` and learns at a rate set by ``scale``)."""

    def __init__(self, shape: int | tuple[int, ...], init: float, scale: float) -> None:
        super().__init__()
        self.init, self.scale = float(init), float(scale)
        self.weight = nn.Parameter(torch.empty(shape))
        self.reset_parameters()

    def extra_repr(self) -> str:
        return f"shape={tuple(self.weight.shape)}, init={self.init:g}, scale={self.scale:g}"

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.weight.fill_(self.scale)

    def forward(self) -> Tensor:
        return self.weight * (self.init / self.scale)


@torch.no_grad()
def normalize_rows_(weight: Tensor, dim: int) -> None:
    """Renormalise ``weight`` in place to unit L2 norm along ``dim``."""
    weight.copy_(l2_normalize(weight, dim=dim))


@torch.no_grad()
def normalize_block_weights_(block: nn.Module) -> None:
    """A ``"ngpt"`` block's matrices to unit norm along the embedding dimension: the rows of ``attn.qkv`` and
    ``mlp.fc1`` (``(out, C)``), the columns of ``attn.proj`` and ``mlp.fc2`` (``(C, in)``)."""
    normalize_rows_(block.attn.qkv.weight, 1)
    normalize_rows_(block.attn.proj.weight, 0)
    normalize_rows_(block.mlp.fc1.weight, 1)
    normalize_rows_(block.mlp.fc2.weight, 0)
