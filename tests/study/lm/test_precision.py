"""GPU-sized runs on the CPU: ``train.dtype`` bf16/fp16 autocast (fp16 with a GradScaler whose
grads are unscaled before diagnostics), ``train.grad_accum`` (the same batch fed as micro-batches: the same data and,
up to float summation order, the same maths), ``train.compile``, and the norm and attention backends that actually
ran written into the record."""

from __future__ import annotations

import pytest
import torch

from lnblocks.config import ConfigValueError
from lnblocks.study import RunConfig, train_run
from lnblocks.study.lm.config import TrainConfig
from lnblocks.study.lm.run.optim import Precision, forward_backward

BASE = {
    "data": {"source": "markov", "vocab_size": 16, "seq_len": 16, "batch_size": 8, "eval_batches": 1},
    "model": {"depth": 2, "dim": 32},
    "diagnostics": {"every": 5, "init_grad_batches": 1, "probe_batch_size": 2},
}


def run(model: dict | None = None, **train: object):
    cfg = {**BASE, "model": {**BASE["model"], **(model or {})}, "train": {"steps": 10, "lr": 3e-3, **train}}
    return train_run(RunConfig.from_dict(cfg), show_progress=False)


@pytest.fixture(scope="module")
def fp32():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run()
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(("dtype", "tol"), [("bf16", 3e-2), ("fp16", 3e-3)])
def test_autocast_runs_follow_fp32_within_their_rounding(fp32, dtype: str, tol: float) -> None:
    rec = run(dtype=dtype)
    assert rec.status == "finished" and rec.config["train"]["dtype"] == dtype
    a, b = rec.result.loss, fp32.result.loss
    assert a != b  # autocast did run the matmuls in 16 bits
    assert a == pytest.approx(b, rel=tol)
    assert rec.result.eval["final"] == pytest.approx(fp32.result.eval["final"], rel=tol)
    # fp16: the GradScaler multiplies the loss by 2**16 for backward; the diagnostics see unscaled gradients
    g16, g32 = rec.result.diagnostics[0]["grad_norm_total"], fp32.result.diagnostics[0]["grad_norm_total"]
    assert g16 == pytest.approx(g32, rel=10 * tol)


def test_fp16_uses_a_grad_scaler_and_fp32_plain_backward() -> None:
    cpu = torch.device("cpu")
    assert Precision.of("fp16", cpu).scaler is not None and Precision.of("fp16", cpu).dtype is torch.float16
    assert Precision.of("bf16", cpu).scaler is None and Precision.of("fp32", cpu).dtype is None


def test_grad_accum_is_the_same_batch_in_micro_batches(fp32) -> None:
    rec = run(grad_accum=4)
    assert rec.config["train"]["grad_accum"] == 4
    # exact: everything before the first optimizer step (same init, same data, same eval set)
    assert rec.result.eval["init"] == fp32.result.eval["init"]
    assert rec.result.init_grad == fp32.result.init_grad
    # up to float summation order: the mean of 4 micro-batch means is the batch mean, gradients sum likewise
    assert rec.result.loss == pytest.approx(fp32.result.loss, rel=1e-5)
    assert rec.result.eval["final"] == pytest.approx(fp32.result.eval["final"], rel=1e-5)


def test_forward_backward_accumulates_the_full_batch_gradient() -> None:
    from lnblocks.models import GPT

    cfg = RunConfig.from_dict(BASE)
    torch.manual_seed(0)
    model = GPT(cfg.model.gpt_config(16, 16))
    x = torch.randint(0, 16, (8, 16), generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 16, (8, 16), generator=torch.Generator().manual_seed(2))
    fp32 = Precision.of("fp32", torch.device("cpu"))

    def grads(accum: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        loss = forward_backward(model, x, y, accum, fp32)
        return loss, [p.grad.clone() for p in model.parameters()]

    model.zero_grad(set_to_none=True)
    ref_loss = model(x, y)[1]
    ref_loss.backward()
    ref = [p.grad.clone() for p in model.parameters()]
    loss1, g1 = grads(1)
    assert torch.equal(loss1, ref_loss.detach()) and all(torch.equal(a, b) for a, b in zip(g1, ref))  # exact
    loss2, g2 = grads(2)
    assert torch.allclose(loss2, ref_loss.detach(), rtol=1e-6)
    for a, b in zip(g2, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_grad_accum_must_divide_the_batch() -> None:
    with pytest.raises(ConfigValueError, match=r"train\.grad_accum \(3\) must divide data\.batch_size \(8\)"):
        RunConfig.from_dict({**BASE, "train": {"grad_accum": 3}})


def test_dtype_is_the_only_spelling() -> None:
    """The older key ``train.amp_dtype`` is refused in study files (records that older versions wrote with it still
    load: tests/study/core/test_records.py)."""
    with pytest.raises(ConfigValueError, match=r"amp_dtype is not a config key; valid keys of TrainConfig"):
        TrainConfig.from_dict({"amp_dtype": "bfloat16"})
    with pytest.raises(ConfigValueError, match=r"dtype must be one of \['fp32', 'bf16', 'fp16'\]"):
        TrainConfig(dtype="float16")


def test_records_carry_the_backends_that_ran(fp32) -> None:
    # the study asks for flash-attn; on the CPU it cannot run, and sdpa is what ran; norms "auto" ran PyTorch
    assert fp32.config["model"]["attention"]["backend"] == "flash_attn"
    assert fp32.result.model["attention_backend"] == "sdpa" and fp32.result.model["norm_backend"] == "torch"
    eager = run(model={"attention": {"backend": "eager"}, "placement": "none"}, steps=2)
    assert eager.result.model["attention_backend"] == "eager" and eager.result.model["norm_backend"] == "none"


@pytest.mark.slow
def test_compiled_run_follows_the_eager_run() -> None:
    """``train.compile``: torch.compile (inductor) fuses ops, so losses agree to float rounding, not bit for bit."""
    small = {
        **BASE,
        "model": {"depth": 1, "dim": 16, "n_heads": 2},
        "diagnostics": {"every": 2, "init_grad_batches": 0},
    }
    eager, compiled = (
        train_run(RunConfig.from_dict({**small, "train": {"steps": 3, "compile": c}}), show_progress=False)
        for c in (False, True)
    )
    assert compiled.status == "finished" and compiled.config["train"]["compile"] is True
    assert compiled.result.loss == pytest.approx(eager.result.loss, rel=1e-5)
    assert compiled.result.diagnostics[0]["grad_norm_total"] == pytest.approx(
        eager.result.diagnostics[0]["grad_norm_total"], rel=1e-4
    )
    assert compiled.result.model["attention_backend"] == "sdpa"
