"""What every token source of the ``lm`` task gives a run: the ``TokenSource`` interface, the offset of the
held-out stream's seed, and the reference loss every source reports. The built-in sources (``lm.data.builtin``) and
the user's corpus (``lm.data.corpus``) both build on this module, which imports neither (so neither imports the other
back).
"""

from __future__ import annotations

import torch
from torch import Tensor

EVAL_SEED_OFFSET = 7919  # eval windows / sequences come from their own generator, never the training stream


class TokenSource:
    """Interface of a data source: ``vocab_size``, ``batch(B, generator)`` (random training windows from the run's
    generator), ``eval_set()`` (fixed held-out batches, from ``data_seed + EVAL_SEED_OFFSET``) and ``reference``:
    ``uniform`` = ln V, ``unigram`` = the loss of a model that knows the token frequencies and nothing else (where
    a Post-LN run that fails to train sits; docs/study-protocol.md), and for the Markov chain its ``floor``."""

    vocab_size: int
    reference: dict[str, float]

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:  # (B, T), (B, T)
        raise NotImplementedError

    def eval_set(self) -> list[tuple[Tensor, Tensor]]:
        raise NotImplementedError


def unigram_loss(train: Tensor, held: Tensor, vocab: int) -> float:
    """Cross-entropy (nats) on ``held`` of token frequencies counted on ``train`` (add-one smoothed)."""
    counts = torch.bincount(train.long().flatten(), minlength=vocab).double() + 1.0
    logp = (counts / counts.sum()).log()
    return float(-logp[held.long().flatten()].mean())
