"""The chunked LM head's summed loss (``reduction="sum"``: what HF's causal-LM loss divides by
``num_items_in_batch``) and the mapped-logits route (``mapped_lm_head_loss``: soft-capping, a scale, a divisor)
against the full logits: ``F.cross_entropy(map(F.linear(h, w)).float(), t, reduction=...)``.

Tolerances (fp32): the loss bit-identical where the BLAS computes GEMM rows independently of the chunk (probed, as
in ``test_lm_loss.py``), else and for the gradients ``max|diff| <= 1e-6 * max|reference|``.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from lnblocks.blocks import softcap
from lnblocks.models.capped_loss import mapped_lm_head_loss
from lnblocks.models.lm_head import lm_head_loss
from tests.models.test_lm_loss import _data, _rows_independent, assert_rel

MAPS = {
    "softcap": functools.partial(softcap, cap=2.0),
    "scale": lambda x: x * 0.3,
    "divide": lambda x: x / 3.0,
}


def _reference(h, w, t, logit_map, reduction: str, coef: float = 0.0):
    h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
    logits = logit_map(F.linear(h, w)).float()  # (B, T, V)
    loss = F.cross_entropy(logits.flatten(0, 1), t.flatten(), reduction=reduction)
    z = coef * torch.logsumexp(logits, dim=-1).pow(2).mean()
    ((loss + z) * 0.5).backward()
    return loss.detach(), h.grad, w.grad


def _check(got, want, rows: int | None) -> None:
    if rows is None or _rows_independent(rows):
        assert torch.equal(got[0], want[0]), "loss"
    for name, a, b in zip(("loss", "grad_hidden", "grad_weight"), got, want):
        assert_rel(a, b, what=name)


@pytest.mark.parametrize("coef", [0.0, 1e-2])  # gradients in the forward; recomputed in the backward
@pytest.mark.parametrize("rows", [8, None])
def test_summed_loss_equals_cross_entropys_sum(rows: int | None, coef: float) -> None:
    h, w, t = _data("some")
    hc, wc = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss, st = lm_head_loss(hc, wc, t, z_loss=coef, chunk_rows=rows, reduction="sum")
    ((loss + (st.z_loss if coef else 0)) * 0.5).backward()
    _check((loss.detach(), hc.grad, wc.grad), _reference(h, w, t, lambda x: x, "sum", coef), rows)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("kind", MAPS)
@pytest.mark.parametrize("rows", [8, None])
def test_mapped_loss_equals_the_mapped_full_logits(rows: int | None, kind: str, reduction: str) -> None:
    h, w, t = _data("some")
    hc, wc = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss, _ = mapped_lm_head_loss(hc, wc, t, MAPS[kind], chunk_rows=rows, reduction=reduction)
    (loss * 0.5).backward()
    _check((loss.detach(), hc.grad, wc.grad), _reference(h, w, t, MAPS[kind], reduction), rows)


def test_bad_reduction_and_logit_map_are_refused() -> None:
    h, w, t = _data("none")
    with pytest.raises(ValueError, match=r"reduction must be one of \['mean', 'sum'\], got 'none'"):
        lm_head_loss(h, w, t, reduction="none")
    with pytest.raises(ValueError, match=r"reduction must be one of"):
        mapped_lm_head_loss(h, w, t, MAPS["scale"], reduction="max")
    with pytest.raises(TypeError, match=r"logit_map must be a function of the logits, got float"):
        mapped_lm_head_loss(h, w, t, 2.0)


def test_a_second_backward_through_the_forwards_gradients_raises() -> None:
    """The gradients computed in the forward are scaled in place by the backward (no second ``(V, C)`` buffer): a
    second backward through the same graph would scale them twice, so it raises."""
    h, w, t = _data("some")
    w = w.clone().requires_grad_()
    loss, _ = lm_head_loss(h, w, t, chunk_rows=8)
    (loss * 0.5).backward(retain_graph=True)
    first = w.grad.clone()
    with pytest.raises(RuntimeError, match=r"lm_head_loss: its backward ran twice \(retain_graph\)"):
        loss.backward()
    assert torch.equal(w.grad, first)
