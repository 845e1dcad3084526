"""GPT models built from lnblocks ``Block``s: ``GPTConfig``, ``GPT``, init schemes, HF conversion (lazy), per-layer
mixes (``mix_ln``, ``hybridnorm``, ``ngpt_block``), the diagnostic ``probe``, the Muon + AdamW pair
(``build_muon``), sharded training (``lnblocks.models.parallel``, lazy: ``parallelize``, ``ParallelConfig``,
``build_mesh``)."""

from typing import Any

from lnblocks.models.config import INIT_SCHEMES, POSITIONS, GPTConfig, hybridnorm, mix_ln, ngpt_block
from lnblocks.models.gpt import GPT
from lnblocks.models.init import init_weights
from lnblocks.models.optim import OptimizerPair, build_muon, muon_split
from lnblocks.models.probe import LayerProbe, ModelProbe, probe

_PARALLEL = ("ParallelConfig", "build_mesh", "parallelize")

__all__ = [
    "GPT",
    "INIT_SCHEMES",
    "POSITIONS",
    "GPTConfig",
    "LayerProbe",
    "ModelProbe",
    "OptimizerPair",
    "build_muon",
    "hybridnorm",
    "init_weights",
    "mix_ln",
    "muon_split",
    "ngpt_block",
    "probe",
    *_PARALLEL,
]


def __getattr__(name: str) -> Any:
    if name in _PARALLEL:  # imported on first use: it loads torch.distributed's FSDP2 and DTensor packages
        from lnblocks.models import parallel

        return getattr(parallel, name)
    raise AttributeError(f"module 'lnblocks.models' has no attribute {name!r}")
