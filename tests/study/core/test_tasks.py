"""The task interface: the core finds tasks by registered name and asks each what it supports (DDP under torchrun,
curves, record upgrades) instead of knowing them; a study asking a task for what it does not support is one clear
error before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lnblocks.cli import main as cli_main
from lnblocks.study import RecordError, RunRecord, read_record, run_study, study_from_dict
from lnblocks.study.core.tasks import default_task_name, get_task, task_names
from lnblocks.study.core.torchrun import TorchrunExecutor
from lnblocks.study.digits.result import DigitsResult
from lnblocks.study.lm.result import LMResult

DIGITS = {"task": "cnn_digits", "norms": ["batch"], "batch_sizes": [8], "seeds": [0], "epochs": 1, "max_train": 64,
          "widths": [8, 8]}  # fmt: skip
LM = {"data": {"source": "markov", "vocab_size": 8, "seq_len": 8, "batch_size": 4, "eval_batches": 1},
      "model": {"dim": 16, "n_heads": 2, "depth": 1}, "train": {"steps": 2}}  # fmt: skip


def test_registry_and_what_each_task_declares() -> None:
    assert task_names() == ["lm", "cnn_digits"] and default_task_name() == "lm"
    lm, digits = get_task("lm"), get_task("cnn_digits")
    assert lm.result_type is LMResult and lm.ddp and lm.replay_curves is not None and lm.before_runs is not None
    assert digits.result_type is DigitsResult and not digits.ddp
    assert digits.replay_curves is None and digits.before_runs is None
    with pytest.raises(ValueError, match=r"task must be one of \['lm', 'cnn_digits'\], got 'vision'"):
        get_task("vision")
    assert study_from_dict(LM).task == "lm"  # a study file without a task key is the default task's


def test_what_a_task_does_not_support_is_refused() -> None:
    with pytest.raises(ValueError, match=r"task 'cnn_digits' logs no curves; tracking is for \['lm'\]"):
        study_from_dict({**DIGITS, "tracking": {"tensorboard": True}})
    with pytest.raises(ValueError, match=r"torchrun \(DDP\) runs studies of the tasks \['lm'\]; .* 'cnn_digits'"):
        TorchrunExecutor(get_task("cnn_digits"), study_from_dict(DIGITS).runs()[0])
    with pytest.raises(ValueError, match=r"--executor torchrun needs a launch by torchrun \(WORLD_SIZE > 1\)"):
        run_study(study_from_dict(LM), "unused", executor="torchrun")


def test_cli_torchrun_outside_torchrun_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text(json.dumps(LM))
    assert cli_main(["study", "run", str(cfg), "--out", str(tmp_path / "o"), "--executor", "torchrun"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "lnblocks: error: --executor torchrun needs a launch by torchrun (WORLD_SIZE > 1)"
    assert not (tmp_path / "o").exists()


def test_records_carry_their_tasks_result_type(tmp_path: Path) -> None:
    result = DigitsResult(lr=0.1, epochs=1, steps=2, final_train_loss=1.0, train_acc=50.0, test_acc=40.0)
    config = {"norm": "batch", "batch_size": 8, "seed": 0}
    rec = RunRecord("x", "cnn_digits", "finished", {}, config, result, {"wall_s": 1.0, "cpu_s": 1.0}, {})
    with pytest.raises(RecordError, match=r"result must be a task's result dataclass, got dict"):
        RunRecord("x", "lm", "finished", {}, config, {"lr": 0.1}, {}, {})
    raw = rec.to_json()
    (tmp_path / "x.json").write_text(json.dumps({**raw, "task": "lm"}))  # read as the lm task's: not its result
    with pytest.raises(RecordError, match=r"x\.json: config\.data is missing"):
        read_record(tmp_path / "x.json")
    (tmp_path / "x.json").write_text(json.dumps(raw))
    assert read_record(tmp_path / "x.json") == rec
    (tmp_path / "x.json").write_text(json.dumps({**raw, "task": "vision"}))
    with pytest.raises(RecordError, match=r"x\.json: task must be one of \['lm', 'cnn_digits'\], got 'vision'"):
        read_record(tmp_path / "x.json")
