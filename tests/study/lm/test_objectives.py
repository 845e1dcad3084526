"""Training options of Wortsman et al. 2023 and the layer ablation of Sun et al. 2025, against hand formulas: the
z-loss term and its effect, independent weight decay, and skipping a block."""

from __future__ import annotations

import contextlib

import pytest
import torch

from lnblocks.models import GPT
from lnblocks.study import RunConfig, train_run
from lnblocks.study.lm.config import TrainConfig
from lnblocks.study.lm.run.diagnostics import evaluate, layer_ablation
from lnblocks.study.lm.run.optim import build_optimizer, decay_coefficient, z_loss_term

BASE = {
    "data": {"source": "markov", "vocab_size": 16, "seq_len": 16, "batch_size": 8, "eval_batches": 2},
    "model": {"depth": 2, "dim": 32, "n_heads": 4},
    "diagnostics": {"every": 10, "init_grad_batches": 0, "probe_batch_size": 4},
}


def test_z_loss_term_is_the_mean_squared_log_partition() -> None:
    logits = torch.randn(3, 5, 7, dtype=torch.float32) * 4
    ref = 1e-4 * (torch.logsumexp(logits.double(), dim=-1) ** 2).mean()
    assert float(z_loss_term(logits, 1e-4)) == pytest.approx(float(ref), rel=1e-6)
    assert float(z_loss_term(logits.bfloat16(), 1.0)) == pytest.approx(
        float((torch.logsumexp(logits.bfloat16().double(), dim=-1) ** 2).mean()), rel=1e-5
    )


def test_z_loss_pulls_log_z_to_zero_and_the_logged_loss_stays_cross_entropy() -> None:
    def final(z: float) -> tuple[list, float]:
        cfg = {**BASE, "train": {"steps": 40, "lr": 1e-2, "z_loss": z}}
        rec = train_run(RunConfig.from_dict(cfg), show_progress=False)
        return rec.result.loss, rec.result.diagnostics[-1]["log_z"]

    plain_loss, plain_z = final(0.0)
    z_loss, z_z = final(0.1)
    assert plain_loss[0] == z_loss[0]  # step 0's loss is logged before any update: cross-entropy alone
    assert plain_loss[1] != z_loss[1]  # the z-loss changed the update
    assert abs(plain_z) > 1.0 and abs(z_z) < 0.5 * abs(plain_z)


@pytest.mark.parametrize("independent", [False, True])
@pytest.mark.parametrize("lr_factor", [1.0, 0.5])
def test_independent_weight_decay_decays_by_wd_not_lr_times_wd(independent: bool, lr_factor: float) -> None:
    lr, wd = 0.1, 0.01
    cfg = TrainConfig.from_dict(
        {"lr": lr, "optimizer": {"name": "adamw", "weight_decay": wd, "independent_wd": independent}}
    )
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    opt = build_optimizer(model, cfg)
    for g in opt.param_groups:
        g["lr"] = lr * lr_factor  # a schedule at lr_factor of its peak
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # Adam's own step is 0: only the decay moves the weights
    opt.step()
    per_step = wd * lr_factor if independent else lr * lr_factor * wd
    for p, b in zip(model.parameters(), before):
        expected = b * (1 - per_step) if p.dim() >= 2 else b  # decay on matrices only
        torch.testing.assert_close(p.detach(), expected, rtol=1e-6, atol=1e-7)
    assert decay_coefficient(cfg) == pytest.approx(wd / lr if independent else wd)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"optimizer": {"name": "adam", "independent_wd": True}}, "independent_wd"),
        ({"optimizer": {"name": "adamw", "independent_wd": "yes"}}, "independent_wd"),
        ({"z_loss": -1e-4}, "z_loss"),
    ],
)
def test_bad_options_name_the_key(options: dict, match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        TrainConfig.from_dict(options)


def _model(placement: str, depth: int = 3) -> tuple[GPT, list]:
    run = RunConfig.from_dict({**BASE, "model": {**BASE["model"], "depth": depth, "placement": placement}})
    torch.manual_seed(0)
    model = GPT(run.model.gpt_config(16, 16))
    g = torch.Generator().manual_seed(1)
    batches = [(x, y) for x, y in ((torch.randint(0, 16, (4, 16), generator=g),) * 2 for _ in range(2))]
    batches = [(x, torch.roll(x, -1, dims=1)) for x, _ in batches]
    return model, batches


def test_skipping_a_pre_ln_block_equals_zeroing_its_branch_outputs() -> None:
    """In Pre-LN, x + attn(LN x) + mlp(LN x) with W_O = W_2 = 0 (and their biases) is x: the block skipped."""
    model, batches = _model("pre")
    got = layer_ablation(model, batches, contextlib.nullcontext)
    base = evaluate(model, batches, contextlib.nullcontext)
    for i, loss in enumerate(got):
        zeroed, _ = _model("pre")
        with torch.no_grad():
            for lin in (zeroed.blocks[i].attn.proj, zeroed.blocks[i].mlp.fc2):
                lin.weight.zero_()
                if lin.bias is not None:
                    lin.bias.zero_()
        assert loss == pytest.approx(evaluate(zeroed, batches, contextlib.nullcontext), rel=1e-6)
        assert loss != pytest.approx(base, rel=1e-6)
    assert evaluate(model, batches, contextlib.nullcontext) == base  # every block is back


def test_layer_ablation_is_recorded_when_asked() -> None:
    cfg = {**BASE, "train": {"steps": 10}, "diagnostics": {**BASE["diagnostics"], "layer_ablation": True}}
    rec = train_run(RunConfig.from_dict(cfg), show_progress=False)
    abl = rec.result.layer_ablation
    assert abl["base"] == rec.result.eval["final"] and len(abl["skip"]) == 2
    assert (
        train_run(RunConfig.from_dict({**BASE, "train": {"steps": 2}}), show_progress=False).result.layer_ablation
        is None
    )
