"""Stability monitoring, against references computed here: the spike detector against a brute
numpy version of its definition (mean + 6 sigma of the previous 128 values), the per-step gradient norm against the
diagnostics' own global norm, Adam's update RMS against its first-step identity (``|m/sqrt(v)| = 1``), and the
small-variance share against eps set far above or below the variance; a run killed after its window filled scores
the same once resumed; the numbers reach summary.csv and the report."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from lnblocks.study import RunConfig, build_report, load_study, read_record, run_study, train_run
from lnblocks.study.lm.run.stability import SIGMAS, WINDOW, SpikeMonitor
from tests.study.study_helpers import same_record, study_cli

RUN = {
    "data": {"source": "markov", "vocab_size": 8, "seq_len": 8, "batch_size": 4, "eval_batches": 1},
    "model": {"dim": 16, "n_heads": 2, "depth": 2},
    "train": {"steps": 7, "optimizer": {"name": "adam", "eps": 1.0e-12}},
    "diagnostics": {"every": 3, "init_grad_batches": 0, "probe_batch_size": 2},
}


def brute_spikes(values: list[float]) -> list[int]:
    out = []
    for t in range(WINDOW, len(values)):
        w = np.array(values[t - WINDOW : t], dtype=np.float64)
        if w.std() > 0 and values[t] > w.mean() + SIGMAS * w.std():
            out.append(t)
    return out


def test_spike_monitor_matches_its_definition() -> None:
    rng = np.random.default_rng(0)
    values = list(2.0 + 0.01 * rng.standard_normal(600))
    for t in (150, 151, 400, 590):
        values[t] += 1.0  # spikes; 151 right after one (its window holds 150's spike, still a spike)
    mon = SpikeMonitor.over(values)
    assert mon.spikes == brute_spikes(values) == [150, 151, 400, 590]
    assert mon.scored == len(values) - WINDOW and mon.score == pytest.approx(4 / (600 - WINDOW))
    assert SpikeMonitor.over([1.0] * 300).score == 0.0 and SpikeMonitor.over([1.0] * 10).score is None
    with_nan = SpikeMonitor.over([*values[:200], math.nan, *values[200:]])  # a non-finite value is skipped
    assert with_nan.scored == mon.scored


def test_grad_norm_update_rms_and_small_variance_against_references() -> None:
    rec = train_run(RunConfig.from_dict(RUN), show_progress=False)
    r = rec.result
    assert len(r.grad_norm) == r.steps_done == 7
    for entry in r.diagnostics:  # the same norm, computed per tensor then combined
        assert r.grad_norm[entry["step"]] == pytest.approx(entry["grad_norm_total"], rel=1e-5)
    first = r.diagnostics[0]
    assert first["step"] == 0 and first["lr"] == pytest.approx(1e-3)
    for group, values in first["update_rms"].items():  # Adam's first step: lr * g / |g| elementwise
        assert all(0.98 < v <= 1.0 + 1e-5 for v in values), (group, values)
    assert all(v == 0.0 for e in r.diagnostics for v in e["var_below_eps"])
    assert r.stability["max_update_rms"] == max(v for e in r.diagnostics for vs in e["update_rms"].values() for v in vs)
    for kind in ("layernorm", "rmsnorm"):  # eps far above any variance: every row is under it
        cfg = {**RUN, "model": {**RUN["model"], "norm": {"kind": kind, "eps": 1.0e6}}}
        big = train_run(RunConfig.from_dict(cfg), show_progress=False).result
        assert all(v == 1.0 for e in big.diagnostics for v in e["var_below_eps"])
        assert big.stability["var_below_eps"] == 1.0


def test_a_run_resumed_after_its_window_filled_scores_the_same(tmp_path: Path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text(
        "data: {source: markov, vocab_size: 8, seq_len: 8, batch_size: 4, eval_batches: 1}\n"
        "model: {dim: 16, n_heads: 2, depth: 1}\n"
        "train: {steps: 170, lr: 3.0e-2, log_every: 10, checkpoint: {every: 70}}\n"
        "diagnostics: {every: 50, init_grad_batches: 0, probe_batch_size: 2}\n"
        "tracking: {tensorboard: true}\n"
    )
    (run,) = load_study(cfg).runs()
    assert run_study(cfg, tmp_path / "ref", show_progress=False, report=True) == 0
    assert study_cli(cfg, tmp_path / "out", fault="kill-at-step@160").returncode < 0
    assert run_study(cfg, tmp_path / "out", show_progress=False, report=False) == 0
    ref, rec = (read_record(tmp_path / d / "runs" / f"{run.run_id}.json") for d in ("ref", "out"))
    assert rec.env["resumed_from"] == [140] and same_record(rec, ref) == []
    s = rec.result.stability
    assert s["loss"]["scored"] == s["grad_norm"]["scored"] == 170 - WINDOW
    assert s["loss"]["spikes"] == brute_spikes(rec.result.loss)
    assert s["grad_norm"]["spikes"] == brute_spikes(rec.result.grad_norm)
    report = (tmp_path / "ref" / "report.md").read_text()
    assert "## Stability" in report and "| loss spike score |" in report
    assert "loss_spike_score" in (tmp_path / "ref" / "summary.csv").read_text().splitlines()[0]
    assert build_report(tmp_path / "ref", echo=False) == 0
