"""Edges of the chunked LM-head loss (``lnblocks.models.loss.lm_head_loss``) against the full-logits computation
``F.cross_entropy(F.linear(hidden, weight).float(), targets)``: an empty batch with stats, a 1-D ``hidden`` (one
position), an ``ignore_index`` outside int64, and a double backward, which the chunked path cannot give and must
refuse by name (the one-chunk path is plain autograd and gives it)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lnblocks.models.loss import lm_head_loss

V, C = 24, 8


def _inputs(*lead: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*lead, C, generator=g, requires_grad=True)
    weight = torch.randn(V, C, generator=g, requires_grad=True)
    return hidden, weight, torch.randint(0, V, lead, generator=g)


@pytest.mark.parametrize("lead", [(0,), (2, 0), (0, 5)])
@pytest.mark.parametrize("rows", [None, 4])
def test_an_empty_batch_gives_the_full_computations_numbers(lead: tuple[int, ...], rows: int | None) -> None:
    hidden, weight, targets = _inputs(*lead)
    loss, stats = lm_head_loss(hidden, weight, targets, stats=True, z_loss=1e-3, chunk_rows=rows)
    logits = F.linear(hidden, weight).float().reshape(-1, V)
    want = F.cross_entropy(logits, targets.reshape(-1))
    assert torch.isnan(loss) and torch.isnan(want)  # the mean over no position, as torch gives
    assert stats.max_logit.item() == float("-inf")  # the max of no logits
    assert stats.log_z.shape == lead and torch.isnan(stats.z_loss)
    none, only = lm_head_loss(hidden, weight)  # without targets: the stats alone
    assert none is None and only.max_logit.item() == float("-inf") and only.log_z.shape == lead


def test_a_one_dimensional_hidden_is_one_position() -> None:
    hidden, weight, _ = _inputs(C)
    hidden = hidden[0].detach().requires_grad_()  # (C,)
    target = torch.tensor(5)
    loss, stats = lm_head_loss(hidden, weight, target, stats=True, z_loss=1e-3)
    ref_h = hidden.detach().clone().requires_grad_()
    ref_w = weight.detach().clone().requires_grad_()
    logits = F.linear(ref_h[None], ref_w).float()  # (1, V)
    want = F.cross_entropy(logits, target[None])
    want_z = 1e-3 * torch.logsumexp(logits, dim=-1).pow(2).mean()
    assert torch.equal(loss, want) and torch.equal(stats.z_loss, want_z)
    assert stats.log_z.shape == () and torch.equal(stats.max_logit, logits.max())
    (loss + stats.z_loss).backward()
    (want + want_z).backward()
    assert torch.equal(hidden.grad, ref_h.grad) and torch.equal(weight.grad, ref_w.grad)


@pytest.mark.parametrize("bad", [2**63, 2**64, -(2**63) - 1])
def test_an_ignore_index_outside_int64_is_refused_by_name(bad: int) -> None:
    hidden, weight, targets = _inputs(6)
    with pytest.raises(ValueError, match=r"^ignore_index must be (<=|>=) -?\d+, got -?\d+$"):
        lm_head_loss(hidden, weight, targets, ignore_index=bad)


def test_the_int64_extremes_are_ignore_indices_like_torch() -> None:
    hidden, weight, targets = _inputs(6)
    for ignore in (2**63 - 1, -(2**63)):
        marked = targets.clone()
        marked[::2] = ignore
        loss, _ = lm_head_loss(hidden, weight, marked, ignore_index=ignore, chunk_rows=2)
        want = F.cross_entropy(F.linear(hidden, weight).float(), marked, ignore_index=ignore)
        assert torch.allclose(loss, want, rtol=1e-6, atol=0), ignore


@pytest.mark.parametrize("z_loss", [0.0, 1e-3])
def test_double_backward_through_chunks_is_refused_naming_the_limitation(z_loss: float) -> None:
    hidden, weight, targets = _inputs(16)
    loss, stats = lm_head_loss(hidden, weight, targets, z_loss=z_loss, chunk_rows=4)
    total = loss + stats.z_loss if z_loss else loss
    with pytest.raises(RuntimeError, match=r"has no double backward: .*create_graph=True.*return_logits=True"):
        torch.autograd.grad(total, hidden, create_graph=True)
    (g,) = torch.autograd.grad(lm_head_loss(hidden, weight, targets, chunk_rows=4)[0], hidden)  # first order: fine
    assert g.shape == hidden.shape


def test_double_backward_of_one_chunk_equals_the_full_logits_one() -> None:
    """Small logits take the plain autograd path: a gradient penalty through it is autograd's own."""
    hidden, weight, targets = _inputs(6)
    loss, _ = lm_head_loss(hidden, weight, targets)
    (g,) = torch.autograd.grad(loss, hidden, create_graph=True)
    (gw,) = torch.autograd.grad(g.pow(2).sum(), weight)
    want = F.cross_entropy(F.linear(hidden, weight).float(), targets)
    (g_ref,) = torch.autograd.grad(want, hidden, create_graph=True)
    (gw_ref,) = torch.autograd.grad(g_ref.pow(2).sum(), weight)
    assert torch.equal(g, g_ref) and torch.equal(gw, gw_ref)
