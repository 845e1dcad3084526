"""Normalization layers of convolutional networks, with ``torch.nn``-exact semantics and state_dicts.

BatchNorm1d/2d/3d, SyncBatchNorm (exact across unequal shards, CPU/gloo included) with ``convert_sync_batchnorm``,
InstanceNorm1d/2d/3d, GroupNorm, LayerNorm2d (ConvNeXt's channels-first LN), BatchRenorm1d/2d (Ioffe 2017),
``normalize`` (the unified view: one function, the norms as choices of reduction dims) and ``fold_batchnorm``
(inference folding into Conv/Linear). The rest of the family, each tested against its paper's formula:
SwitchableNorm2d (learned IN/LN/BN mix), FRN2d + TLU, EvoNormB0/S0, AdaIN (``adaptive_instance_norm``), WSConv2d
and ScaledWSConv2d (weight standardization, NF-ResNets) with ``adaptive_grad_clip_`` (NFNets' AGC). Weight norm and
LRN are torch's own (``torch.nn.utils.parametrizations.weight_norm``, ``torch.nn.LocalResponseNorm``).
The small-batch study on sklearn's digits lives in ``lnblocks.study.digits``.
Imports nothing else from lnblocks.
"""

from lnblocks.cnn.adain import AdaIN, adaptive_instance_norm
from lnblocks.cnn.agc import adaptive_grad_clip_
from lnblocks.cnn.batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from lnblocks.cnn.batchrenorm import BatchRenorm1d, BatchRenorm2d
from lnblocks.cnn.evonorm import EvoNormB0, EvoNormS0
from lnblocks.cnn.fold import find_conv_bn_pairs, fold_batchnorm, fold_conv_bn
from lnblocks.cnn.frn import TLU, FRN2d
from lnblocks.cnn.functional import batch_moments, moments, normalize, update_running_stats
from lnblocks.cnn.groupnorm import GroupNorm
from lnblocks.cnn.instancenorm import InstanceNorm1d, InstanceNorm2d, InstanceNorm3d
from lnblocks.cnn.layernorm2d import LayerNorm2d
from lnblocks.cnn.switchable import SwitchableNorm2d
from lnblocks.cnn.syncbn import SyncBatchNorm, convert_sync_batchnorm
from lnblocks.cnn.wsconv import RELU_GAMMA, ScaledWSConv2d, WSConv2d

__all__ = [
    "RELU_GAMMA",
    "TLU",
    "AdaIN",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "BatchRenorm1d",
    "BatchRenorm2d",
    "EvoNormB0",
    "EvoNormS0",
    "FRN2d",
    "GroupNorm",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "InstanceNorm3d",
    "LayerNorm2d",
    "ScaledWSConv2d",
    "SwitchableNorm2d",
    "SyncBatchNorm",
    "WSConv2d",
    "adaptive_grad_clip_",
    "adaptive_instance_norm",
    "batch_moments",
    "convert_sync_batchnorm",
    "find_conv_bn_pairs",
    "fold_batchnorm",
    "fold_conv_bn",
    "moments",
    "normalize",
    "update_running_stats",
]
