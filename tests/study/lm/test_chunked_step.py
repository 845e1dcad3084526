"""The study's training step through the chunked LM head (``forward_backward``) against the step it
replaced, the full ``(B, T, V)`` logits (``full_logits=True``): the loss, every parameter's gradient, the z-loss's
share of them, and the probe's max output logit and log Z, with the logits cut in chunks (``many_chunks`` lowers
``lnblocks.models.loss``'s thresholds: 8-row chunks, 4 with grad_accum 2), in fp32, bf16 and fp16 autocast (fp16
with the GradScaler's scaled loss), with ``grad_accum`` and ``torch.compile``. DDP: ``test_study_ddp.py`` (the
study under torchrun) and ``tests/models/test_lm_loss_ddp.py`` (the chunked head under DDP).

Tolerances: fp32: the loss bit-identical (8-row chunks: MKL computes GEMM rows independently; checked by
``tests/models/test_lm_loss.py``'s probe), every gradient ``max|diff| <= 1e-6 * max|reference|`` (the head's
gradient, and through the tied or untied trunk everything, sums over rows in another order; measured <= 3e-7);
bf16/fp16: each gradient's error against an fp64 step at most twice the full-logits step's, + 1e-6 of its scale.
"""

from __future__ import annotations

import copy

import pytest
import torch

import lnblocks.models.loss as L
from lnblocks.models import GPT
from lnblocks.study.lm.model_config import ModelConfig
from lnblocks.study.lm.run import diagnostics as diag
from lnblocks.study.lm.run.optim import Precision, forward_backward

B, T, V = 8, 16, 97
CPU = torch.device("cpu")


@pytest.fixture
def many_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(L, "SINGLE_CHUNK_ELEMENTS", 0)  # chunk even these logits: 8 rows per chunk
    monkeypatch.setattr(L, "MIN_CHUNK_ELEMENTS", 0)
    assert L.default_chunk_rows(B * T, V) == 8


def _model(tie: bool, placement: str = "pre", vocab: int = V) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig.from_dict({"depth": 2, "dim": 16, "n_heads": 2, "placement": placement, "tie_weights": tie})
    return GPT(cfg.gpt_config(vocab, T))


def _batch(vocab: int = V) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, vocab, (B, T), generator=g), torch.randint(0, vocab, (B, T), generator=g)


def _step(model: GPT | torch.nn.Module, dtype: str, z: float, accum: int, full: bool) -> tuple[float, dict]:
    """One study step's loss and unscaled gradients."""
    x, y = _batch(model.lm_head.weight.shape[0] if hasattr(model, "lm_head") else V)
    precision = Precision.of(dtype, CPU)
    model.zero_grad(set_to_none=True)
    loss = forward_backward(model, x, y, accum, precision, z, full_logits=full)
    scale = precision.scaler.get_scale() if precision.scaler is not None else 1.0
    return loss, {n.removeprefix("_orig_mod."): p.grad.double() / scale for n, p in model.named_parameters()}


def _max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("accum", [1, 2])
@pytest.mark.parametrize("z", [0.0, 1e-2], ids=["ce", "z-loss"])
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_fp32_chunked_step_equals_the_full_logits_step(many_chunks: None, tie: bool, z: float, accum: int) -> None:
    model = _model(tie)
    full_loss, want = _step(model, "fp32", z, accum, full=True)
    loss, got = _step(model, "fp32", z, accum, full=False)
    assert torch.equal(loss, full_loss)
    for name, g in got.items():
        assert _max_rel(g, want[name]) <= 1e-6, name
    if z:  # the z-loss does reach the gradients, through the chunked head too
        _, plain = _step(model, "fp32", 0.0, accum, full=False)
        head = "tok_emb.weight" if tie else "lm_head.weight"
        assert _max_rel(got[head], plain[head]) > 1e-4


@pytest.mark.parametrize("z", [0.0, 1e-2], ids=["ce", "z-loss"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_autocast_chunked_step_errors_at_most_twice_the_full_steps(many_chunks: None, dtype: str, z: float) -> None:
    """fp16 runs with the GradScaler's 2**16: the chunked head must see that scale before it casts the logits'
    gradient to fp16 (else ``p / N``, here ~1e-3 / 128, is an fp16 subnormal); bf16 has fp32's range."""
    model = _model(tie=True, vocab=1009)
    exact = copy.deepcopy(model).double()
    _, ref = _step(exact, "fp32", z, 1, full=True)
    _, full = _step(model, dtype, z, 1, full=True)
    _, got = _step(model, dtype, z, 1, full=False)
    for name, r in ref.items():
        err_got, err_full = _max_rel(got[name], r), _max_rel(full[name], r)
        assert err_got <= 2 * err_full + 1e-6, f"{name}: {err_got:.3g} vs full {err_full:.3g}"


def test_compiled_chunked_step_equals_eager(many_chunks: None) -> None:
    """``train.compile``: the chunked head traced as its custom ops (aot_eager: no inductor fusion, so exact)."""
    torch._dynamo.reset()
    model = _model(tie=False)
    eager_loss, want = _step(model, "fp32", 1e-2, 1, full=False)
    loss, got = _step(torch.compile(model, backend="aot_eager"), "fp32", 1e-2, 1, full=False)
    assert torch.equal(loss, eager_loss)
    for name, g in got.items():
        assert torch.equal(g, want[name]), name


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_probe_and_eval_read_the_chunked_head_as_the_logits(many_chunks: None, dtype: str) -> None:
    model = _model(tie=False, placement="post")
    x, y = _batch()
    autocast = Precision.of(dtype, CPU).autocast
    got = diag.probe(model, x, attention=False, autocast=autocast)
    with torch.no_grad(), autocast():
        logits, loss = model.eval()(x, y)  # (B, T, V): the full logits the probe read before
    lf = logits.float()
    assert got["max_output_logit"] == float(f"{lf.amax().item():.6g}")
    assert got["log_z"] == float(f"{torch.logsumexp(lf, dim=-1).mean().item():.6g}")
    assert diag.evaluate(model, [(x, y)], autocast) == float(loss)
