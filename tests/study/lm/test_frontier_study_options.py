"""The study's options for the 2025-26 papers, each against a trusted reference: Muon as ``train.optimizer.name``
(a run equals a hand-written loop over ``lnblocks.models.build_muon`` bit for bit, every parameter group scheduled
from its own peak LR), nGPT's renormalisation after every step, the final eval-mode loss on training windows (the
train-val gap), the probe's attention sink / median |h| / mixing gain against ``GPT.probe``, steps to a target loss,
and the summary columns the claims read; the config refuses what it cannot run, and leaves run ids unchanged."""

from __future__ import annotations

import math

import pytest
import torch

from lnblocks.models import GPT, build_muon
from lnblocks.study import RunConfig, train_run
from lnblocks.study.lm.data.builtin import build_source
from lnblocks.study.lm.report.analysis import read_summary, steps_to_target
from lnblocks.study.lm.run import diagnostics as diag
from lnblocks.study.lm.run.diagnostics import evaluate
from lnblocks.study.lm.run.optim import build_optimizer, lr_at, set_lrs
from lnblocks.study.lm.run.setup import TRAIN_EVAL_SEED_OFFSET

DATA = {"source": "markov", "vocab_size": 16, "seq_len": 16, "batch_size": 8, "eval_batches": 2}
TRAIN = {"steps": 12, "lr": 3e-3, "warmup": 3, "schedule": "cosine", "min_lr_ratio": 0.1, "seed": 3}
MUON = {"name": "muon", "adamw_lr": 1e-3, "weight_decay": 0.01}


def muon_run(model: dict | None = None, **train: object) -> RunConfig:
    return RunConfig.from_dict({
        "data": DATA, "model": {"dim": 32, "depth": 2, **(model or {})},
        "train": {**TRAIN, "optimizer": MUON, **train}, "diagnostics": {"every": 0, "init_grad_batches": 0},
    })  # fmt: skip


def reference_loop(run: RunConfig) -> tuple[list[float], GPT]:
    """The run by hand: the same init, batches, schedule per group and Muon/AdamW pair, no study code."""
    source = build_source(run.data)
    torch.manual_seed(run.train.seed)
    model = GPT(run.model.gpt_config(source.vocab_size, run.data.seq_len))
    gen = torch.Generator().manual_seed(run.train.seed)
    o, tc = run.train.optimizer, run.train
    opt = build_muon(model, lr=tc.lr, adamw_lr=o.adamw_lr, weight_decay=o.weight_decay,
                     adamw_weight_decay=o.weight_decay, betas=(o.beta1, o.beta2), eps=o.eps,
                     adjust_lr_fn="match_rms_adamw")  # fmt: skip
    peaks = [g["initial_lr"] for g in opt.param_groups]
    assert sorted(set(peaks)) == [1e-3, 3e-3]  # Muon's groups at train.lr, AdamW's at adamw_lr
    losses = []
    for step in range(tc.steps):
        for group, peak in zip(opt.param_groups, peaks):
            group["lr"] = lr_at(step, peak, tc.warmup, tc.steps, tc.schedule, tc.min_lr_ratio)
        x, y = source.batch(run.data.batch_size, gen)
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, y, return_logits=False)  # the head in chunks, as the study trains (the library's
        loss.backward()  # tests match it to the full logits' loss)
        opt.step()
        model.normalize_weights_()
        losses.append(float(loss.detach()))
    return losses, model


NGPT = {"placement": "ngpt", "activation": "swiglu", "bias": False, "positions": "rope"}


@pytest.mark.parametrize("model", [{}, NGPT], ids=["pre", "ngpt"])
def test_a_muon_run_is_the_hand_written_loop_bit_for_bit(model: dict) -> None:
    run = muon_run(model)
    record = train_run(run, show_progress=False)
    losses, trained = reference_loop(run)
    assert record.result.loss == [float(f"{v:.7g}") for v in losses]  # every step (as the record rounds them)
    source = build_source(run.data)
    final = evaluate(trained, source.eval_set(), _no_autocast)
    gen = torch.Generator().manual_seed(run.train.seed + TRAIN_EVAL_SEED_OFFSET)
    windows = [source.batch(run.data.batch_size, gen) for _ in range(run.data.eval_batches)]
    assert record.result.eval["final"] == pytest.approx(final, rel=1e-6)
    assert record.result.train_eval == pytest.approx(evaluate(trained, windows, _no_autocast), rel=1e-6)
    if model:  # nGPT: the weights are back on the unit sphere after the last step
        norms = trained.tok_emb.weight.norm(dim=1)
        torch.testing.assert_close(norms, torch.ones_like(norms))


def _no_autocast():
    import contextlib

    return contextlib.nullcontext()


def test_the_schedule_scales_every_group_from_its_own_peak() -> None:
    run = muon_run()
    model = GPT(run.model.gpt_config(16, 16))
    opt = build_optimizer(model, run.train)
    for step in (0, 2, 3, 7, 11):
        lr = set_lrs(opt, run.train, step)
        assert lr == lr_at(step, 3e-3, 3, 12, "cosine", 0.1)
        for g in opt.param_groups:
            assert g["lr"] == lr_at(step, g["initial_lr"], 3, 12, "cosine", 0.1)
            assert g["lr"] / g["initial_lr"] == pytest.approx(lr / 3e-3, rel=1e-12)
    adam = RunConfig.from_dict({"data": DATA, "train": TRAIN})  # one peak: exactly the schedule's LR, as before
    plain = build_optimizer(GPT(adam.model.gpt_config(16, 16)), adam.train)
    assert set_lrs(plain, adam.train, 5) == lr_at(5, 3e-3, 3, 12, "cosine", 0.1)
    assert {g["lr"] for g in plain.param_groups} == {lr_at(5, 3e-3, 3, 12, "cosine", 0.1)}


def test_muon_keys_leave_run_ids_alone_and_bad_combinations_are_refused() -> None:
    plain = RunConfig.from_dict({"data": DATA, "train": TRAIN})
    stored = plain.to_dict()["train"]["optimizer"]
    assert not {"muon_momentum", "nesterov", "ns_steps", "muon_adjust_lr", "adamw_lr"} & set(stored)
    same = RunConfig.from_dict({"data": DATA, "train": {**TRAIN, "optimizer": {"ns_steps": 5, "adamw_lr": None}}})
    assert same.run_id == plain.run_id
    assert muon_run().run_id != muon_run(optimizer={**MUON, "ns_steps": 4}).run_id
    with pytest.raises(ValueError, match=r"train\.optimizer\.adamw_lr is a key of name 'muon'"):
        RunConfig.from_dict({"data": DATA, "train": {"optimizer": {"adamw_lr": 1e-3}}})
    with pytest.raises(ValueError, match=r"train\.optimizer\.muon_adjust_lr must be one of"):
        muon_run(optimizer={**MUON, "muon_adjust_lr": "rms"})
    with pytest.raises(ValueError, match=r"independent_wd needs name 'adamw'"):
        muon_run(optimizer={**MUON, "independent_wd": True})
    with pytest.raises(ValueError, match=r"'muon' is not supported with train\.parallel"):
        muon_run(parallel={"dp_shard": 2})
    with pytest.raises(ValueError, match=r"model\.placement 'ngpt' is not supported with train\.parallel"):
        muon_run(NGPT, optimizer={"name": "adamw"}, parallel={"dp_shard": 2})


def test_probe_reads_the_sink_the_median_and_the_mixing_gain_as_the_model_probe_does() -> None:
    for hc in (None, {"n_streams": 3, "kind": "dynamic"}, {"n_streams": 2, "kind": "mhc"}):
        torch.manual_seed(0)
        run = muon_run({"hyper_connections": hc} if hc else {})
        model = GPT(run.model.gpt_config(16, 16))
        x = torch.randint(0, 16, (3, 16))
        got, want = diag.probe(model, x), model.probe(x)
        sink = [float(layer.first_token_mass.mean()) for layer in want.layers]
        median = [float(layer.median_abs_hidden) for layer in want.layers]
        assert got["attn_sink"] == pytest.approx(sink, rel=1e-5) and len(got["residual_median"]) == 3
        assert got["residual_median"][1:] == pytest.approx(median, rel=1e-5)
        assert got["residual_max"][1:] == pytest.approx([float(la.max_abs_hidden) for la in want.layers], rel=1e-5)
        if hc is None:
            assert "mixing_gain" not in got
        else:
            assert got["mixing_gain"] == pytest.approx(float(want.mixing_gain.value.max()), rel=1e-5)
        assert all(blk.attn.config.backend != "eager" for blk in model.blocks)  # restored


def test_steps_to_target_is_the_first_window_mean_at_or_below_it() -> None:
    losses = [3.0, 2.8, 2.6, 2.4, 2.5, 2.2]
    assert steps_to_target(losses, 2.5, 2) == 4  # means 2.9, 2.7, 2.5 (steps 2-3) -> step 4's window (2.6, 2.4)
    assert steps_to_target(losses, 2.5, 1) == 4 and steps_to_target(losses, 2.0, 2) is None
    assert steps_to_target([3.0, None, 2.0, 2.0], 2.5, 2) == 4  # a window with a non-finite loss does not count
    assert steps_to_target(losses, 2.5, 30) is None  # window longer than the run: the whole run's mean (2.58)
    assert steps_to_target(losses, 2.6, 30) == 6


def test_a_tiny_frontier_study_writes_the_columns_its_claims_read(tmp_path) -> None:
    from lnblocks.study import run_study

    study = {
        "name": "tiny_frontier", "data": {**DATA, "eval_batches": 1},
        "model": {"dim": 32, "depth": 2}, "train": {"steps": 40, "lr": 1e-2},
        "diagnostics": {"every": 13, "init_grad_batches": 0, "probe_batch_size": 2},
        "analysis": {"init_profile": {"seeds": 0}, "target_loss": 2.6},
        "grid": {"variant": {"pre": {"model.norm": "layernorm"},
                             "mhc": {"model.hyper_connections": {"n_streams": 2, "kind": "mhc"}},
                             "muon": {"train.optimizer.name": "muon", "model.norm": "rmsnorm"},
                             "gated": {"model.attention.output_gate": "headwise"}}},
    }  # fmt: skip
    import yaml

    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(study))
    assert run_study(cfg, tmp_path / "out", workers=1, show_progress=False) == 0
    rows = {r["arch"]: r for r in read_summary(tmp_path / "out" / "summary.csv")}
    assert rows["muon"]["optimizer"] == "muon" and rows["pre"]["optimizer"] == "adamw"
    assert rows["mhc"]["hyper"] == "mhc" and rows["pre"]["hyper"] == "" and rows["gated"]["output_gate"] == "headwise"
    assert rows["mhc"]["init_mixing_gain"] == pytest.approx(1.0, abs=1e-3) and rows["pre"]["final_mixing_gain"] is None
    for r in rows.values():
        assert 0 < r["final_attn_sink"] <= 1 and r["final_massive_ratio"] >= 1
        assert r["gen_gap"] == pytest.approx(r["eval_loss"] - r["train_eval_loss"], abs=1e-12)
        assert r["target_loss"] == 2.6 and (r["steps_to_target"] is None or 1 <= r["steps_to_target"] <= 40)
    assert math.isfinite(rows["muon"]["train_eval_loss"])
