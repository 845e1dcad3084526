"""GPT models built from lnblocks ``Block``s: ``GPTConfig``, ``GPT``, init schemes, HF conversion (lazy)."""

from lnblocks.models.config import INIT_SCHEMES, POSITIONS, GPTConfig, mix_ln
from lnblocks.models.gpt import GPT
from lnblocks.models.init import init_weights

__all__ = ["GPT", "INIT_SCHEMES", "POSITIONS", "GPTConfig", "init_weights", "mix_ln"]
