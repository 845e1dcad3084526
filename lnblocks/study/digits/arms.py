"""The arms of the digits study: what each block of the CNN is, per norm kind, following each paper's recipe.

Every network is ``block x len(widths)`` (a 2x2 max-pool after the second block), global average pooling and the
same plain ``nn.Linear`` head; a block is a 3x3 convolution (padding 1) followed by the arm's layers:

=============== ============================================================================================
kind            block
=============== ============================================================================================
batch, group,   ``Conv2d(bias=False)``, the norm (affine), ``ReLU``: ``BatchNorm2d``, ``GroupNorm(gn_groups)``,
layer2d,        ``LayerNorm2d``, ``InstanceNorm2d(affine=True)``, ``BatchRenorm2d`` (Ioffe 2017's warm-up of
instance,       r_max/d_max), ``SwitchableNorm2d`` (Luo et al. 2018, arXiv 1806.10779: IN/LN/BN mix, weights
batchrenorm,    recorded per layer at the end of training)
switchable
frn             ``Conv2d(bias=False)``, ``FRN2d``, ``TLU``: FRN + TLU replace norm + ReLU (Singh & Krishnan 2019,
                arXiv 1911.09737; fixed eps 1e-6, as the paper for maps larger than 1x1)
evonorm_s0      ``Conv2d(bias=False)``, ``EvoNormS0(groups=gn_groups)``: one layer replaces norm + activation
                (Liu et al. 2020, arXiv 2004.02967); the paper gives S0 GroupNorm's group count, here GN's
evonorm_b0      ``Conv2d(bias=False)``, ``EvoNormB0(momentum=bn_momentum)``: likewise, batch-dependent
group_ws        ``WSConv2d(bias=False)``, ``GroupNorm(gn_groups)``, ``ReLU`` (Qiao et al. 2019, arXiv 1903.10520)
nf              ``ScaledWSConv2d(bias=True, gamma=RELU_GAMMA)``, ``ReLU``, no norm (Brock, De & Smith 2021, arXiv
                2101.08692); adaptive gradient clipping with ``agc_clipping`` on every conv parameter, not on the
                final linear layer (Brock et al. 2021, arXiv 2102.06171, Sec. 4.1)
weightnorm      ``weight_norm(Conv2d(bias=True))`` (torch's parametrization), ``ReLU``, no norm; the paper's
                data-dependent init (Salimans & Kingma 2016, arXiv 1602.07868, Sec. 3) on ``wn_init_images``
                training images, the same images for every batch size
lrn             ``Conv2d(bias=True)``, ``ReLU``, ``LocalResponseNorm``: AlexNet's order and constants (Krizhevsky
                et al. 2012: k = 2, n = 5, alpha = 1e-4, beta = 0.75; torch divides alpha by n, so 5e-4 here).
                The convs get He init (Kaiming normal, ReLU gain; arXiv 1502.01852) and zero bias: LRN does not
                keep the activations' scale, and with torch's default conv init (variance 1/(3 fan_in)) this stack
                trains to only ~73% at batch 32 (AlexNet set its init by hand, N(0, 0.01), for its own net)
=============== ============================================================================================

Arms without an affine norm after the conv (nf, weightnorm, lrn) get the conv's bias instead. The head is the same
for every arm and never weight-normalized or clipped: only the blocks differ.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

from lnblocks.cnn import (
    RELU_GAMMA,
    TLU,
    BatchNorm2d,
    BatchRenorm2d,
    EvoNormB0,
    EvoNormS0,
    FRN2d,
    GroupNorm,
    InstanceNorm2d,
    LayerNorm2d,
    ScaledWSConv2d,
    SwitchableNorm2d,
    WSConv2d,
)
from lnblocks.study.digits.config import NORM_KINDS, DigitsSettings

# AlexNet's LRN (Krizhevsky et al. 2012, Sec. 3.3) in torch's convention b = a / (k + alpha/n * sum a^2)^beta
LRN_SIZE, LRN_ALPHA, LRN_BETA, LRN_K = 5, 5 * 1e-4, 0.75, 2.0
NO_NORM_KINDS = ("nf", "weightnorm", "lrn")  # blocks with no activation norm: their conv has a bias


def _affine_norm(kind: str, c: int, cfg: DigitsSettings, total_steps: int) -> nn.Module:
    m = cfg.bn_momentum
    if kind == "batch":
        return BatchNorm2d(c, momentum=m)
    if kind in ("group", "group_ws"):
        return GroupNorm(cfg.gn_groups, c)
    if kind == "layer2d":
        return LayerNorm2d(c)
    if kind == "instance":
        return InstanceNorm2d(c, affine=True)
    if kind == "switchable":
        return SwitchableNorm2d(c, momentum=m)
    if kind == "batchrenorm":
        warmup = int(cfg.renorm_warmup_frac * total_steps)
        ramp = int(cfg.renorm_ramp_frac * total_steps)
        return BatchRenorm2d(
            c, momentum=m, r_max=cfg.renorm_r_max, d_max=cfg.renorm_d_max, warmup_steps=warmup,
            r_ramp_steps=ramp, d_ramp_steps=ramp,
        )  # fmt: skip
    raise AssertionError(kind)


def build_block(kind: str, c_in: int, c: int, cfg: DigitsSettings, total_steps: int) -> list[nn.Module]:
    """The layers of one block of arm ``kind`` (``c_in -> c`` channels, spatial size kept); see the module table."""
    if kind not in NORM_KINDS:
        raise ValueError(f"norm must be one of {list(NORM_KINDS)}, got {kind!r}")
    if kind == "nf":
        return [ScaledWSConv2d(c_in, c, 3, padding=1, bias=True, gamma=RELU_GAMMA), nn.ReLU()]
    if kind == "weightnorm":
        return [weight_norm(nn.Conv2d(c_in, c, 3, padding=1, bias=True)), nn.ReLU()]
    if kind == "lrn":
        conv = nn.Conv2d(c_in, c, 3, padding=1, bias=True)
        nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")  # He et al. 2015: no norm keeps the scale
        nn.init.zeros_(conv.bias)
        return [conv, nn.ReLU(), nn.LocalResponseNorm(LRN_SIZE, alpha=LRN_ALPHA, beta=LRN_BETA, k=LRN_K)]
    conv_type = WSConv2d if kind == "group_ws" else nn.Conv2d
    conv = conv_type(c_in, c, 3, padding=1, bias=False)
    if kind == "frn":
        return [conv, FRN2d(c), TLU(c)]
    if kind == "evonorm_s0":
        return [conv, EvoNormS0(c, groups=cfg.gn_groups)]
    if kind == "evonorm_b0":
        return [conv, EvoNormB0(c, momentum=cfg.bn_momentum)]
    return [conv, _affine_norm(kind, c, cfg, total_steps), nn.ReLU()]


class DigitsCNN(nn.Module):
    """The arm's blocks (max-pool after the 2nd), global average pool, linear head: (N, 1, 8, 8) -> (N, 10)."""

    def __init__(self, widths: tuple[int, ...], kind: str, cfg: DigitsSettings, total_steps: int) -> None:
        super().__init__()
        self.kind = kind
        layers: list[nn.Module] = []
        c_in = 1
        for i, c in enumerate(widths):
            layers += build_block(kind, c_in, c, cfg, total_steps)
            if i == 1:
                layers.append(nn.MaxPool2d(2))  # 8x8 -> 4x4
            c_in = c
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_in, 10)

    def forward(self, x: Tensor) -> Tensor:
        h = self.features(x)  # (N, C, 4, 4)
        return self.head(h.mean((2, 3)))  # (N, 10)

    def convs(self) -> list[nn.Conv2d]:
        return [m for m in self.features if isinstance(m, nn.Conv2d)]

    def clipped_parameters(self) -> list[nn.Parameter]:
        """What AGC clips in the NF arm: every parameter of the blocks, none of the final linear layer."""
        return list(self.features.parameters())

    def switch_weights(self) -> list[dict[str, dict[str, float]]]:
        """Per SwitchableNorm2d layer, its learned IN/LN/BN mix (``SwitchableNorm2d.switch_weights()``)."""
        return [m.switch_weights() for m in self.features if isinstance(m, SwitchableNorm2d)]


@torch.no_grad()
def weight_norm_data_init(model: DigitsCNN, x: Tensor) -> None:
    """Salimans & Kingma's data-dependent init (arXiv 1602.07868, Sec. 3), block by block on the images ``x``: with
    ``t = conv(h)`` at the current ``g`` and zero bias, set ``g <- g / std(t)`` and ``b <- -mean(t) / std(t)`` per
    output channel (over N, H, W), so every conv's output starts at zero mean and unit variance on ``x``."""
    h = x
    for layer in model.features:
        if isinstance(layer, nn.Conv2d) and hasattr(layer, "parametrizations"):
            layer.bias.zero_()
            t = layer(h)  # (N, C, H, W)
            mean, std = t.mean((0, 2, 3)), t.std((0, 2, 3), unbiased=False)
            g = layer.parametrizations.weight.original0  # (C, 1, 1, 1): the norm ||v|| at init
            g.div_(std.view_as(g))
            layer.bias.copy_(-mean / std)
        h = layer(h)
