"""One run: a divergence is a recorded result, records are valid JSON, seeds fix everything, schedules apply."""

from __future__ import annotations

import json
import math

import pytest

from lnblocks.study import RunConfig, RunRecord, train_run
from lnblocks.study.lm.run.optim import lr_at

BASE = {
    "data": {"source": "markov", "vocab_size": 16, "seq_len": 16, "batch_size": 8, "eval_batches": 1},
    "model": {"depth": 2, "dim": 32},
    "diagnostics": {"every": 5, "init_grad_batches": 1, "probe_batch_size": 2},
}


def flat(record: RunRecord) -> dict:
    """The record's JSON form with the result's fields at the top (as the schema-1 layout had them)."""
    j = record.to_json()
    return {**{k: v for k, v in j.items() if k != "result"}, **j["result"]}


def run(**train: object) -> dict:
    return flat(train_run(RunConfig.from_dict({**BASE, "train": {"steps": 30, **train}}), show_progress=False))


@pytest.mark.parametrize(
    ("train", "cause"),
    [
        ({"lr": 1e4, "optimizer": {"name": "sgd"}}, "non-finite"),  # explodes to inf/NaN
        ({"lr": 1.0, "divergence_margin": 0.01, "divergence_patience": 1}, "above start"),
    ],
)
def test_divergence_stops_the_run_and_is_recorded(train: dict, cause: str) -> None:
    rec = run(**train)
    assert rec["status"] == "diverged", cause
    step = rec["diverged_step"]
    assert step is not None and 1 <= step < 30 and rec["steps_done"] == step + 1
    assert len(rec["loss"]) == step + 1 and rec["eval"]["final"] is None and rec["final_train_loss"] is None
    if cause == "non-finite":
        assert rec["loss"][-1] is None  # NaN/inf stored as null
    else:
        assert rec["loss"][-1] > rec["loss"][0] + 0.01
    json.dumps(rec, allow_nan=False)  # a diverged record is still strict JSON


def test_record_is_complete_and_seeded() -> None:
    a, b = run(lr=3e-3, seed=1), run(lr=3e-3, seed=1)
    c = run(lr=3e-3, seed=2)
    assert a["loss"] == b["loss"] and a["loss"] != c["loss"]
    assert a["status"] == "finished" and a["diverged_step"] is None and a["steps_done"] == 30
    assert a["final_train_loss"] == pytest.approx(sum(a["loss"]) / 30, rel=1e-5)  # final_window 30 = all steps
    assert a["initial_loss"] == a["loss"][0]
    assert a["eval"]["final"] < a["eval"]["init"]
    assert a["id"] == RunConfig.from_dict({**BASE, "train": {"steps": 30, "lr": 3e-3, "seed": 1}}).run_id
    assert a["model"]["params"] > 0 and a["time"]["step_ms"] > 0
    json.dumps(a, allow_nan=False)


def test_diagnostics_record_the_learning_rate_schedule() -> None:
    rec = run(lr=1e-3, warmup=10, schedule="cosine", min_lr_ratio=0.1)
    steps = [d["step"] for d in rec["diagnostics"]]
    assert steps == [0, 5, 10, 15, 20, 25, 29]
    for d in rec["diagnostics"]:
        assert d["lr"] == pytest.approx(lr_at(d["step"], 1e-3, 10, 30, "cosine", 0.1))
    assert rec["diagnostics"][-1]["lr"] == pytest.approx(1e-4)


def test_eval_every_adds_points_to_the_eval_curve() -> None:
    rec = run(lr=3e-3, eval_every=10)
    assert [s for s, _ in rec["eval"]["curve"]] == [0, 10, 20, 30]
    assert all(math.isfinite(v) for _, v in rec["eval"]["curve"])


def test_batch_must_split_over_ranks() -> None:
    from lnblocks.study.core.tasks import DistContext

    cfg = RunConfig.from_dict({**BASE, "data": {**BASE["data"], "batch_size": 3}})
    with pytest.raises(ValueError, match=r"batch_size \(3\) must be divisible by the world size \(2\)"):
        train_run(cfg, dist=DistContext(rank=0, world_size=2), show_progress=False)
