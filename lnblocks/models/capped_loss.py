"""The LM head's cross-entropy with soft-capped logits (Gemma 2's ``cap * tanh(logits / cap)``, arXiv 2408.00118),
in chunks of rows, never holding the ``(N, V)`` logits.

The chunked head of ``lnblocks.models.loss`` computes the gradient of the plain logits by hand; the cap changes it
(a factor ``1 - tanh^2``), so capped logits take this route instead: each chunk's loss terms are computed under
``torch.utils.checkpoint`` (non-reentrant), which keeps only the chunk's inputs and recomputes its logits in the
backward, one chunk at a time. The loss is the sum of the chunks' summed cross-entropies over the counted rows:
``F.cross_entropy(capped.float())`` within float summation order. Logits of at most ``SINGLE_CHUNK_ELEMENTS`` take
the plain autograd path, the very ops of the full computation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from lnblocks.blocks import softcap
from lnblocks.config import check_float
from lnblocks.models.loss import LMHeadStats, check_targets, default_chunk_rows


def _chunk_terms(
    h: Tensor, weight: Tensor, t: Tensor | None, cap: float, ignore_index: int, z: bool, stats: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(summed cross-entropy, summed log(Z)^2, max logit, log Z per row)`` of one chunk's capped logits."""
    logits = softcap(F.linear(h, weight), cap).float()  # (n, V)
    zero = logits.new_zeros(())
    ce = F.cross_entropy(logits, t, ignore_index=ignore_index, reduction="sum") if t is not None else zero
    lse = torch.logsumexp(logits, dim=-1) if (z or stats) else logits.new_zeros(0)
    return ce, lse.pow(2).sum() if z else zero, logits.detach().amax() if stats else zero, lse.detach()


def capped_lm_head_loss(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor | None,
    cap: float,
    *,
    ignore_index: int = -100,
    z_loss: float = 0.0,
    stats: bool | None = None,
    chunk_rows: int | None = None,
) -> tuple[Tensor | None, LMHeadStats]:
    """``lnblocks.models.loss.lm_head_loss`` for ``logits = cap * tanh(hidden @ weight.T / cap)``: the same
    arguments and returns (``stats`` None: only without targets), the capped logits never held whole."""
    cap = check_float("cap", cap, lo=0, lo_open=True)
    z_loss = check_float("z_loss", z_loss, lo=0)
    if not isinstance(weight, Tensor) or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"weight must have shape (V, C) with C = hidden.shape[-1] = {hidden.shape[-1]}")
    lead, vocab = tuple(hidden.shape[:-1]), weight.shape[0]
    if targets is not None:
        targets = check_targets(targets, lead, vocab, ignore_index).reshape(-1)
    stats = targets is None if stats is None else bool(stats)
    h2 = hidden.reshape(-1, hidden.shape[-1])  # (N, C)
    n = h2.shape[0]
    rows = default_chunk_rows(n, vocab, 5) if chunk_rows is None else chunk_rows
    parts = []
    for s in range(0, max(n, 1), rows):
        t = targets[s : s + rows] if targets is not None else None
        args = (h2[s : s + rows], weight, t, cap, ignore_index, bool(z_loss), stats)
        parts.append(_chunk_terms(*args) if rows >= n else checkpoint(_chunk_terms, *args, use_reentrant=False))
    ce, z2, maxes, lse = (list(x) for x in zip(*parts))
    loss = None
    if targets is not None:
        counted = (targets != ignore_index).sum().to(torch.float32)
        loss = torch.stack(ce).sum() / counted
    z = z_loss * torch.stack(z2).sum() / n if z_loss else None
    max_logit = torch.stack(maxes).amax() if stats else None
    log_z = torch.cat(lse).view(lead) if stats else None
    return loss, LMHeadStats(z, max_logit, log_z)
