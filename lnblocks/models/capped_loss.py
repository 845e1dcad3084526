"""The LM head's cross-entropy with the logits mapped elementwise before the softmax, in chunks of rows, never holding
the ``(N, V)`` logits: Gemma 2's soft-capping ``cap * tanh(logits / cap)`` (arXiv 2408.00118) for lnblocks' own GPT,
and the logit scale or divisor of HF families (Cohere, Granite) for ``lnblocks.hf``'s chunked loss.

The chunked head of ``lnblocks.models.lm_head`` computes the gradient of the plain logits by hand; a map changes it
(for the cap a factor ``1 - tanh^2``), so mapped logits take this route instead: each chunk's log-probabilities of
the targets are computed under ``torch.utils.checkpoint`` (non-reentrant), which keeps only the chunk's inputs and
recomputes its logits in the backward, one chunk at a time. The loss is then one ``nll_loss`` over those per-row
values, the reduction ``F.cross_entropy`` itself runs over the rows (its sum over rows does not depend on the number
of classes): with the BLAS computing each GEMM row independently of the chunk (MKL: chunks of a multiple of 4
rows; the default chunks are multiples of 8), the loss is bit-identical to ``F.cross_entropy(map(logits).float())``.
Logits of at most ``SINGLE_CHUNK_ELEMENTS`` take the plain autograd path, the very ops of the full computation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from lnblocks.blocks import softcap
from lnblocks.config import check_choice, check_float
from lnblocks.models.loss import REDUCTIONS, LMHeadStats, check_targets, default_chunk_rows

LogitMap = Callable[[Tensor], Tensor]  # elementwise, in the logits' dtype: e.g. softcap, a scale


def _chunk_terms(
    h: Tensor, weight: Tensor, t: Tensor | None, logit_map: LogitMap, ignore_index: int, z: bool, stats: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(log p(target) per row, summed log(Z)^2, max logit, log Z per row)`` of one chunk's mapped logits (ignored
    rows pick class 0; the loss skips them)."""
    logits = logit_map(F.linear(h, weight)).float()  # (n, V)
    zero = logits.new_zeros(())
    picked = zero
    if t is not None:  # log_softmax's own kernel, as F.cross_entropy runs it, row by row
        safe = t.masked_fill(t == ignore_index, 0).unsqueeze(1)
        picked = torch.log_softmax(logits, dim=1).gather(1, safe).squeeze(1)  # (n,)
    lse = torch.logsumexp(logits, dim=-1) if (z or stats) else logits.new_zeros(0)
    return picked, lse.pow(2).sum() if z else zero, logits.detach().amax() if stats else zero, lse.detach()


def _one_chunk(
    hidden: Tensor, weight: Tensor, targets: Tensor | None, logit_map: LogitMap, ignore_index: int, reduction: str
) -> tuple[Tensor | None, Tensor]:
    """All rows at once through autograd, on ``hidden`` in its own shape: ``(loss, mapped fp32 logits (N, V))``."""
    logits = logit_map(F.linear(hidden, weight)).float().flatten(0, -2)  # (N, V)
    loss = None
    if targets is not None:
        loss = F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction=reduction)
    return loss, logits


def mapped_lm_head_loss(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor | None,
    logit_map: LogitMap,
    *,
    ignore_index: int = -100,
    z_loss: float = 0.0,
    stats: bool | None = None,
    chunk_rows: int | None = None,
    reduction: str = "mean",
) -> tuple[Tensor | None, LMHeadStats]:
    """``lnblocks.models.lm_head.lm_head_loss`` for ``logits = logit_map(hidden @ weight.T)``: the same arguments
    and returns (``stats`` None: only without targets), the mapped logits never held whole. ``logit_map`` must act
    on each element alone (it sees chunks of rows), in the logits' dtype, as the full computation applies it."""
    if not callable(logit_map):
        raise TypeError(f"logit_map must be a function of the logits, got {type(logit_map).__name__}")
    z_loss = check_float("z_loss", z_loss, lo=0)
    reduction = check_choice("reduction", reduction, tuple(REDUCTIONS))
    if not isinstance(weight, Tensor) or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"weight must have shape (V, C) with C = hidden.shape[-1] = {hidden.shape[-1]}")
    lead, vocab = tuple(hidden.shape[:-1]), weight.shape[0]
    if targets is not None:
        targets = check_targets(targets, lead, vocab, ignore_index).reshape(-1)
    stats = targets is None if stats is None else bool(stats)
    h2 = hidden.reshape(-1, hidden.shape[-1])  # (N, C)
    n = h2.shape[0]
    rows = default_chunk_rows(n, vocab, 5) if chunk_rows is None else chunk_rows
    if rows >= n:
        loss, logits = _one_chunk(hidden, weight, targets, logit_map, ignore_index, reduction)
        lse = torch.logsumexp(logits, dim=-1) if (z_loss or stats) else None  # (N,)
        z = z_loss * lse.pow(2).mean() if z_loss else None
        max_logit = logits.detach().amax() if stats else None
        return loss, LMHeadStats(z, max_logit, lse.detach().view(lead) if stats else None)
    parts = []
    for s in range(0, n, rows):
        t = targets[s : s + rows] if targets is not None else None
        args = (h2[s : s + rows], weight, t, logit_map, ignore_index, bool(z_loss), stats)
        parts.append(checkpoint(_chunk_terms, *args, use_reentrant=False))
    picked, z2, maxes, lse = (list(x) for x in zip(*parts))
    loss = None
    if targets is not None:  # one nll_loss over the picked values: F.cross_entropy's reduction over the rows
        col = 1 if ignore_index == 0 else 0  # the picked values sit in this column of a (N, 2) input
        t2 = torch.where(targets == ignore_index, ignore_index, col)
        both = torch.cat(picked).unsqueeze(1).expand(n, 2)
        loss = F.nll_loss(both, t2, ignore_index=ignore_index, reduction=reduction)
    z = z_loss * torch.stack(z2).sum() / n if z_loss else None
    max_logit = torch.stack(maxes).amax() if stats else None
    log_z = torch.cat(lse).view(lead) if stats else None
    return loss, LMHeadStats(z, max_logit, log_z)


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
    reduction: str = "mean",
) -> tuple[Tensor | None, LMHeadStats]:
    """``lnblocks.models.loss.lm_head_loss`` for ``logits = cap * tanh(hidden @ weight.T / cap)``: the same
    arguments and returns (``stats`` None: only without targets), the capped logits never held whole."""
    cap = check_float("cap", cap, lo=0, lo_open=True)
    if not isinstance(weight, Tensor) or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"weight must have shape (V, C) with C = hidden.shape[-1] = {hidden.shape[-1]}")
    options = {"ignore_index": ignore_index, "z_loss": z_loss, "stats": stats, "chunk_rows": chunk_rows}
    capped = functools.partial(softcap, cap=cap)
    return mapped_lm_head_loss(hidden, weight, targets, capped, **options, reduction=reduction)
