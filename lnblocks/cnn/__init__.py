"""Normalization layers of convolutional networks, with ``torch.nn``-exact semantics and state_dicts.

BatchNorm1d/2d/3d, SyncBatchNorm (exact across unequal shards, CPU/gloo included) with ``convert_sync_batchnorm``,
InstanceNorm1d/2d/3d, GroupNorm, LayerNorm2d (ConvNeXt's channels-first LN), BatchRenorm1d/2d (Ioffe 2017),
``normalize`` (the unified view: one function, the norms as choices of reduction dims) and ``fold_batchnorm``
(inference folding into Conv/Linear). The small-batch study on sklearn's digits lives in ``lnblocks.study.digits``.
Imports nothing else from lnblocks.
"""

from lnblocks.cnn.batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from lnblocks.cnn.batchrenorm import BatchRenorm1d, BatchRenorm2d
from lnblocks.cnn.fold import find_conv_bn_pairs, fold_batchnorm, fold_conv_bn
from lnblocks.cnn.functional import batch_moments, moments, normalize, update_running_stats
from lnblocks.cnn.groupnorm import GroupNorm
from lnblocks.cnn.instancenorm import InstanceNorm1d, InstanceNorm2d, InstanceNorm3d
from lnblocks.cnn.layernorm2d import LayerNorm2d
from lnblocks.cnn.syncbn import SyncBatchNorm, convert_sync_batchnorm

__all__ = [
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "BatchRenorm1d",
    "BatchRenorm2d",
    "GroupNorm",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "InstanceNorm3d",
    "LayerNorm2d",
    "SyncBatchNorm",
    "batch_moments",
    "convert_sync_batchnorm",
    "find_conv_bn_pairs",
    "fold_batchnorm",
    "fold_conv_bn",
    "moments",
    "normalize",
    "update_running_stats",
]
