"""The CNN digits study (task ``cnn_digits``) at toy size (the real study is a command, not a test): config
validation, one training run that learns, the runner end to end through both commands with resumable, validated run
records (a corrupt one is redone). The arms and the claims' verdicts have their own test files."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from lnblocks.cli import main as cli_main
from lnblocks.study import load_study, run_study, study_from_dict
from lnblocks.study.digits.config import DigitsRunConfig, DigitsSettings, DigitsStudyConfig
from lnblocks.study.digits.train import load_digits_data, schedule, train_run

REPO = Path(__file__).resolve().parents[3]
TINY = {"norms": ["batch", "group"], "batch_sizes": [2, 8], "seeds": [0], "epochs": 1, "min_steps": 1,
        "max_train": 64, "widths": [8, 8]}  # fmt: skip


def test_checked_in_config_is_the_default_and_validates() -> None:
    study = load_study(REPO / "configs" / "cnn_digits.yaml")
    assert study.task == "cnn_digits" and study.analysis is None  # the digits config is the runs' options and grid
    assert DigitsSettings.from_dict(study.options) == DigitsSettings()
    assert len(study.runs()) == 13 * 5 * 3
    with pytest.raises(ValueError, match=r"batch_size is not a config key; valid keys of DigitsStudyConfig"):
        DigitsStudyConfig.from_dict({"batch_size": 4})
    with pytest.raises(ValueError, match=r"norms\[1\] must be one of \['batch'"):
        DigitsStudyConfig(norms=("batch", "spectral"))
    with pytest.raises(ValueError, match=r"gn_groups \(3\) must divide every width"):
        DigitsStudyConfig(gn_groups=3)
    with pytest.raises(ValueError, match=r"batch_sizes\[0\] must be >= 2"):
        DigitsStudyConfig(batch_sizes=(1, 4))
    with pytest.raises(ValueError, match="base_lr must be a finite number > 0"):
        DigitsStudyConfig(base_lr=-0.1)
    with pytest.raises(TypeError, match="epochs must be an int"):
        DigitsStudyConfig(epochs="5")
    with pytest.raises(ValueError, match="agc_clipping must be a finite number > 0"):
        DigitsStudyConfig(agc_clipping=0)
    with pytest.raises(ValueError, match="wn_init_images must be >= 1"):
        DigitsStudyConfig(wn_init_images=0)
    quick = DigitsStudyConfig().quick()
    full, small = (study_from_dict({"task": "cnn_digits", **c.to_dict()}) for c in (DigitsStudyConfig(), quick))
    assert quick.seeds == (0,) and full.runs()[0].run_id != small.runs()[0].run_id


def test_schedule_keeps_epochs_and_tops_up_large_batches() -> None:
    cfg = DigitsStudyConfig()  # the default: equal epochs for every batch size
    assert schedule(cfg, 1437, 2) == (10, 10 * 718)
    assert schedule(cfg, 1437, 32) == (10, 10 * 44)
    topped = DigitsStudyConfig(epochs=3, min_steps=240)
    assert schedule(topped, 1437, 2) == (3, 3 * 718)
    assert schedule(topped, 1437, 32) == (6, 6 * 44)  # 3 epochs would be 132 < min_steps=240 steps


def test_one_run_learns_the_digits() -> None:
    cfg = DigitsStudyConfig(epochs=3, min_steps=1, max_train=256)
    data = load_digits_data(cfg)
    assert data.x_train.shape == (256, 1, 8, 8) and data.x_test.shape == (360, 1, 8, 8)
    assert abs(float(data.x_train.mean())) < 1e-5  # standardised with the training set's statistics
    run = DigitsRunConfig(norm="batch", batch_size=16, seed=0, epochs=3, min_steps=1, max_train=256)
    rec = train_run(run, data)
    assert rec.result.steps == 3 * 16 and rec.result.epochs == 3 and rec.task == "cnn_digits"
    assert rec.result.test_acc > 60.0  # chance is 10%
    again = train_run(run)  # the same run from scratch (data loaded by the run itself): the same numbers
    assert again.deterministic_json() == rec.deterministic_json()


def test_cli_end_to_end_resume_and_corrupt_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({"task": "cnn_digits", **TINY}))
    out = tmp_path / "study"
    assert cli_main(["study", "run", str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Wu & He (2018)" in printed and "4 runs, 0 already finished, 4 to run" in printed
    assert "**Wu & He (2018): BatchNorm falls at small batches, GroupNorm does not: " in printed
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["norm"], int(r["batch_size"])) for r in rows) == [
        ("batch", 2), ("batch", 8), ("group", 2), ("group", 8)
    ]  # fmt: skip
    assert all(0.0 <= float(r["test_acc"]) <= 100.0 for r in rows)
    assert (out / "accuracy_vs_batch.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert "| BatchNorm |" in report and "accuracy_vs_batch.png" in report
    assert "Singh & Krishnan (2019): FRN + TLU is batch-independent: NOT TESTED.** Not tested" in report
    written = json.loads((out / "config.json").read_text())
    assert DigitsStudyConfig.from_dict(written) == DigitsStudyConfig.from_dict(TINY)  # the study's config, from records
    files = sorted((out / "runs").glob("*.json"))
    assert len(files) == 4
    # an emptied record (a crash mid-write by another tool) is redone, not a JSONDecodeError
    victim, before = files[0], files[0].read_text()
    victim.write_text("")
    assert cli_main(["study", "report", str(out)]) == 0  # the report names the bad record, built from the rest
    assert "is empty" in capsys.readouterr().err
    assert cli_main(["study", "run", str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "4 runs, 3 already finished, 1 to run" in printed.out and "is empty" in printed.err
    redone = json.loads(victim.read_text())
    old = json.loads(before)
    assert redone["result"] == old["result"] and redone["config"] == old["config"]  # same seed, same numbers
    assert run_study(load_study(config), out, show_progress=False) == 0  # everything reused now
    assert "4 runs, 4 already finished, 0 to run" in capsys.readouterr().out


def test_records_the_report_cannot_read_are_refused() -> None:
    """A record whose config does not build the settings, or whose SwitchableNorm weights or AGC ratio are not what
    the claims read, is refused (and so redone) instead of crashing every report."""
    from lnblocks.study.core.records import RecordError
    from lnblocks.study.core.tasks import record_from_json

    run = DigitsRunConfig(norm="switchable", batch_size=16, seed=0, epochs=1, min_steps=1, max_train=64, widths=(8, 8))
    good = train_run(run).to_json()
    assert record_from_json(json.loads(json.dumps(good))).result.switch_weights
    result, config = good["result"], good["config"]
    for key, damaged in (
        ("result.switch_weights", {"result": {**result, "switch_weights": [{"mean": 1}]}}),
        ("result.switch_weights[0].var.bn", {"result": {**result, "switch_weights": [
            {"mean": {"in": 1, "ln": 0, "bn": 0}, "var": {"in": 1, "ln": 0}}]}}),
        ("result.agc_grad_ratio", {"result": {**result, "agc_grad_ratio": "x"}}),
        ("config", {"config": {**config, "epochs": -1}}),
    ):  # fmt: skip
        with pytest.raises(RecordError, match=rf"^x\.json: {re.escape(key)}"):
            record_from_json({**good, **damaged}, source="x.json")
