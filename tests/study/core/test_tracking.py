"""TensorBoard curves of a run, read back with TensorBoard's own event reader: the live API, ``replay`` of a real
run record (schemas 1 and 2), non-finite values, resumed runs; W&B offline where wandb is installed."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from lnblocks.config import ConfigTypeError, ConfigValueError
from lnblocks.study import RunConfig, train_run
from lnblocks.study.core.tracking import TensorBoardTracker, Tracker, TrackingConfig, open_tracker
from lnblocks.study.lm.run.curves import diagnostics_scalars, record_scalars, replay

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.study.study_helpers import read_scalars

RUN = {
    "data": {"source": "markov", "vocab_size": 16, "seq_len": 16, "batch_size": 8, "eval_batches": 1},
    "model": {"depth": 3, "dim": 32},
    "train": {"steps": 12, "lr": 3e-3, "eval_every": 4},
    "diagnostics": {"every": 5, "init_grad_batches": 0, "probe_batch_size": 2},
}


def f32(x: float) -> float:
    return float(np.float32(x))  # event files store float32


@pytest.fixture(scope="module")
def record() -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # module scope runs before the per-test one-thread fixture
    try:
        rec = train_run(RunConfig.from_dict(RUN), show_progress=False).to_json()
    finally:
        torch.set_num_threads(threads)
    # the flat form of schema 1 (measurements at the top level); the schema-2 test nests them again
    flat = {k: v for k, v in rec.items() if k != "result"}
    return {**flat, **rec["result"], "format": "lnblocks.study.run/1"}


def test_live_tracker_writes_grouped_tags_and_skips_non_finite(tmp_path: Path) -> None:
    with TensorBoardTracker.open(tmp_path, "run-a", config={"train": {"lr": 0.1}}) as t:
        assert t.log_dir == tmp_path / "tensorboard" / "run-a"
        t.log(0, {"loss/train": 2.5, "lr": 1e-3, "grad_norm/W_Q/layer_00": 0.25})
        t.log(1, {"loss/train": float("nan"), "lr": 2e-3, "grad_norm/W_Q/layer_00": float("inf")})
        t.log(2, {"loss/train": 1.75, "loss/eval": None})
    got = read_scalars(t.log_dir)
    assert got == {
        "loss/train": [(0, 2.5), (2, 1.75)],
        "lr": [(0, f32(1e-3)), (1, f32(2e-3))],
        "grad_norm/W_Q/layer_00": [(0, 0.25)],
    }
    assert t.skipped == {"loss/train": 1, "grad_norm/W_Q/layer_00": 1, "loss/eval": 1}
    acc = EventAccumulator(str(t.log_dir))
    acc.Reload()
    assert "config/text_summary" in acc.Tags()["tensors"]


def test_replay_of_a_real_record_matches_its_fields(record: dict, tmp_path: Path) -> None:
    log_dir = replay(record, tmp_path).log_dir
    assert log_dir == tmp_path / "tensorboard" / record["id"]
    got = read_scalars(log_dir)
    loss = record["loss"]
    assert got["loss/train"] == [(i, f32(v)) for i, v in enumerate(loss)] and len(loss) == 12
    assert got["loss/eval"] == [(s, f32(v)) for s, v in record["eval"]["curve"]]
    assert [s for s, _ in got["loss/eval"]] == [0, 4, 8, 12]
    diag = record["diagnostics"]
    steps = [d["step"] for d in diag]
    assert steps == [0, 5, 10, 11]
    assert got["lr"] == [(d["step"], f32(d["lr"])) for d in diag]
    assert got["grad_norm/global"] == [(d["step"], f32(d["grad_norm_total"])) for d in diag]
    for group in ("W_Q", "W_K", "W_V", "W_O", "W_1", "W_2", "norm"):
        for layer in range(3):
            assert got[f"grad_norm/{group}/layer_{layer:02d}"] == [
                (d["step"], f32(d["grad_norm"][group][layer])) for d in diag
            ]
            assert got[f"update_ratio/{group}/layer_{layer:02d}"] == [
                (d["step"], f32(d["update_ratio"][group][layer])) for d in diag
            ]
    assert got["residual_rms/embedding"] == [(d["step"], f32(d["residual_rms"][0])) for d in diag]
    assert got["residual_rms/layer_02"] == [(d["step"], f32(d["residual_rms"][3])) for d in diag]
    assert "residual_rms/layer_03" not in got  # L + 1 entries: the embedding and 3 blocks
    assert got["attention/max_logit"] == [(d["step"], f32(max(d["attn_max_logit"]))) for d in diag]
    assert got["attention/entropy/layer_01"] == [(d["step"], f32(d["attn_entropy"][1])) for d in diag]
    assert got["output/log_z"] == [(d["step"], f32(d["log_z"])) for d in diag]


def test_replay_reads_schema_2_records_and_starts_over_on_resume(record: dict, tmp_path: Path) -> None:
    measurements = ("loss", "grad_norm", "eval", "diagnostics", "reference", "model")
    v2 = {"format": "lnblocks.study.run/2", "id": record["id"], "task": "lm", "config": record["config"],
          "result": {k: record[k] for k in measurements}}  # fmt: skip
    a = read_scalars(replay(record, tmp_path / "a").log_dir)
    b_dir = replay(v2, tmp_path / "b").log_dir
    replay(v2, tmp_path / "b")  # a second write of the same run replaces the first: no doubled points
    assert read_scalars(b_dir) == a
    assert len(list(b_dir.glob("events.out.tfevents.*"))) == 1


def test_diverged_record_skips_nulls(record: dict, tmp_path: Path) -> None:
    diverged = {**record, "id": "diverged", "loss": [*record["loss"][:3], None],
                "diagnostics": [{**record["diagnostics"][0], "attn_max_logit": [1.0, None, 2.0]}]}  # fmt: skip
    t = replay(diverged, tmp_path)
    got = read_scalars(t.log_dir)
    assert [s for s, _ in got["loss/train"]] == [0, 1, 2]
    assert "attention/max_logit" not in got and [s for s, _ in got["attention/max_logit/layer_02"]] == [0]
    assert t.skipped["loss/train"] == 1 and t.skipped["attention/max_logit"] == 1


def test_scalars_of_a_diagnostics_entry() -> None:
    entry = {"step": 3, "lr": 0.5, "grad_norm_total": 2.0, "grad_norm": {"W_Q": [1.0, 2.0]}, "residual_rms": [1, 2, 3],
             "attn_max_logit": [4.0, 7.0], "max_output_logit": 9.0}  # fmt: skip
    assert diagnostics_scalars(entry) == {
        "lr": 0.5,
        "grad_norm/global": 2.0,
        "grad_norm/W_Q/layer_00": 1.0,
        "grad_norm/W_Q/layer_01": 2.0,
        "residual_rms/embedding": 1,
        "residual_rms/layer_00": 2,
        "residual_rms/layer_01": 3,
        "attention/max_logit": 7.0,
        "attention/max_logit/layer_00": 4.0,
        "attention/max_logit/layer_01": 7.0,
        "output/max_logit": 9.0,
    }
    assert record_scalars({"id": "r", "loss": [1.0], "eval": {"curve": [[0, 2.0]]}}) == [
        (0, {"loss/train": 1.0, "loss/eval": 2.0})
    ]


def test_tracking_config_and_bad_input(tmp_path: Path) -> None:
    assert type(open_tracker(None, tmp_path, "r")) is Tracker  # tracking off: logs nowhere
    assert not (tmp_path / "tensorboard").exists()
    with pytest.raises(ConfigValueError, match=r"^tracking\.wandb_mode must be one of \['offline', 'online'"):
        TrackingConfig.from_dict({"wandb_mode": "cloud"}, key="tracking")
    with pytest.raises(ConfigTypeError, match=r"^tracking\.tensorboard must be a bool, got str 'yes'$"):
        TrackingConfig.from_dict({"tensorboard": "yes"}, key="tracking")
    with pytest.raises(ValueError, match=r"run_id must be a non-empty name without path separators, got '\.\./x'"):
        TensorBoardTracker.open(tmp_path, "../x")
    with pytest.raises(ValueError, match=r"record must be a run record"):
        replay({"loss": [1.0]}, tmp_path)


def test_wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")  # optional extra `lnblocks[wandb]`: tested only where it is installed
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    t = open_tracker({"wandb": True}, tmp_path, "run-w", config={"lr": 0.1})
    t.log(0, {"loss/train": 2.0, "lr": 0.1})
    t.log(1, {"loss/train": math.nan, "lr": 0.2})
    t.log(2, {"lr": 0.3})  # wandb commits a step's row when a later step is logged
    summary = dict(t.run.summary)
    t.close()
    assert summary["loss/train"] == 2.0 and summary["lr"] == 0.2 and t.skipped == {"loss/train": 1}
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))


class Recorder(Tracker):
    """Keeps every ``log`` call in order (what a live tracker is handed, and when)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, dict]] = []

    def log(self, step: int, scalars: dict) -> None:
        self.calls.append((step, dict(scalars)))


@pytest.mark.parametrize(
    "train",
    [
        {"steps": 12, "lr": 3e-3, "eval_every": 4, "log_every": 5},
        # diverges at a step the trainer notices only at its next read: nothing after it may have been logged
        {"steps": 30, "lr": 1.0, "eval_every": 3, "log_every": 7, "divergence_margin": 0.01, "divergence_patience": 1},
    ],
    ids=["finished", "diverged"],
)
def test_live_curves_are_logged_as_losses_are_read_and_equal_replay(tmp_path: Path, train: dict) -> None:
    cfg = RunConfig.from_dict({**RUN, "train": train, "diagnostics": {**RUN["diagnostics"], "every": 2}})
    with TensorBoardTracker.open(tmp_path / "live", cfg.run_id) as live:
        rec = train_run(cfg, show_progress=False, tracker=live)
    assert rec.status == ("finished" if train["lr"] < 1 else "diverged")
    replayed = replay(rec, tmp_path / "replay").log_dir
    assert read_scalars(live.log_dir) == read_scalars(replayed)
    assert live.skipped == replay(rec, tmp_path / "again").skipped

    recorder = Recorder()
    assert train_run(cfg, show_progress=False, tracker=recorder).deterministic_json() == rec.deterministic_json()
    order = [(step, "loss/train" in s) for step, s in recorder.calls]
    # live: the first read (after log_every steps) logs those losses before any later diagnostics entry
    first_diag = next(i for i, (_, is_loss) in enumerate(order) if not is_loss)
    assert [step for step, _ in order[:first_diag]] == list(range(min(train["log_every"], rec.result.steps_done)))
