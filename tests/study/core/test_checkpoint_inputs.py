"""Checkpoints and bad input: ``train.checkpoint`` is validated with dotted keys, never
part of a run's id; an unwritable folder, a checkpoint of another config or of an incompatible lnblocks format is
refused before any run trains (one line, exit 2), never resumed from (another world size resumes, resharded:
test_study_sharded.py); a write that fails
part-way (a full disk) stops the sweep with one line and exit 2, leaves the previous checkpoint usable, and the rerun
resumes from it to the uninterrupted record; ``every_s`` and ``keep`` do what they say."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lnblocks.cli import main as cli_main
from lnblocks.study import RunConfig, load_study, read_record, run_study
from lnblocks.study.core.checkpoint import FORMAT, CheckpointConfig, check_folder
from tests.study.study_helpers import EVERY, same_record, study_cli

PRE = {"model.placement": "pre"}


def test_checkpoint_config_keys_and_errors(long_study: Path) -> None:
    assert CheckpointConfig.from_dict({"every": 200}).keep == 2
    for bad, message in [
        ({"every": 0}, "train.checkpoint.every must be >= 1, got 0"),
        ({"every_s": 0}, "train.checkpoint.every_s must be a finite number > 0, got 0.0"),
        ({"every": 10, "keep": 0}, "train.checkpoint.keep must be >= 1, got 0"),
        ({}, "train.checkpoint.every or every_s must be set"),
        ({"every": 10, "evry": 3}, "train.checkpoint.evry is not a config key"),
        ({"every": 1.5}, "train.checkpoint.every must be an int"),
    ]:
        with pytest.raises((ValueError, TypeError), match=message.replace(".", r"\.").replace("(", r"\(")):
            RunConfig.from_dict({"train": {"checkpoint": bad}})
    # how a run is checkpointed is not what it computes: not part of its id
    plain = load_study(long_study, overrides={"train.checkpoint": None, **PRE}).runs()[0]
    every = load_study(long_study, overrides={"train.checkpoint.every": 7, **PRE}).runs()[0]
    assert plain.run_id == every.run_id and every.checkpoint.every == 7 and plain.checkpoint is None
    assert "checkpoint" not in every.to_dict()["train"]


def test_bad_folders_and_foreign_checkpoints_are_refused_before_training(
    long_study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def refused(out: Path, *sets: str) -> str:
        code = cli_main(["study", "run", str(long_study), "--out", str(out), "--set", "model.placement=pre", *sets])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith("lnblocks: error: train.checkpoint: "), err
        assert not list((out / "runs").glob("*.json"))  # nothing trained
        return err[0]

    (tmp_path / "a_file").write_text("in the way")
    line = refused(tmp_path / "o1", "--set", f"train.checkpoint.dir={tmp_path / 'a_file' / 'sub'}")
    assert "is not writable" in line and "set train.checkpoint.dir" in line

    out = tmp_path / "o2"
    assert study_cli(long_study, out, "--set", "model.placement=pre", fault="kill-after-save@1").returncode < 0
    (folder,) = (out / "checkpoints").iterdir()
    manifest = folder / "step-000000005" / "manifest.json"
    good = json.loads(manifest.read_text())
    for change, words in [
        ({"identity": "0" * 64}, "was written for another run config"),
        ({"format": "lnblocks.checkpoint/0", "lnblocks": "0.0.1"}, f"this lnblocks reads {FORMAT!r}"),
    ]:
        manifest.write_text(json.dumps({**good, **change}))
        assert words in refused(out)
    manifest.write_text(json.dumps(good))
    with pytest.raises(ValueError, match="another run config"):
        check_folder(folder, "f" * 64)


def test_a_full_disk_stops_the_sweep_and_the_rerun_resumes(
    long_study: Path, long_reference: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    out = tmp_path / "out"
    monkeypatch.setenv("LNBLOCKS_CHECKPOINT_FAULT", "enospc-mid-write@2")  # the 2nd write fails part-way
    assert run_study(long_study, out, show_progress=False, report=False, overrides=PRE) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "its checkpoint of step 5 is intact" in err
    (folder,) = (out / "checkpoints").iterdir()
    assert sorted(p.name for p in folder.iterdir()) == ["step-000000005"]  # no half-written folder left
    monkeypatch.delenv("LNBLOCKS_CHECKPOINT_FAULT")
    assert run_study(long_study, out, show_progress=False, report=False, overrides=PRE) == 0
    (run,) = load_study(long_study, overrides=PRE).runs()
    rec = read_record(out / "runs" / f"{run.run_id}.json")
    assert rec.env["resumed_from"] == [EVERY]
    assert same_record(rec, read_record(long_reference["pre"] / "runs" / f"{run.run_id}.json")) == []


def test_every_s_keep_and_keep_finished(long_study: Path, long_reference: dict, tmp_path: Path) -> None:
    out = tmp_path / "out"
    sets = ["--set", "model.placement=pre", "--set", "train.checkpoint={every_s: 1.0e-6, keep: 3}"]
    assert study_cli(long_study, out, *sets, fault="kill-after-save@6").returncode < 0
    (folder,) = (out / "checkpoints").iterdir()
    assert sorted(p.name for p in folder.iterdir()) == [f"step-00000000{n}" for n in (4, 5, 6)]  # every step; 3 kept
    overrides = {**PRE, "train.checkpoint": {"every_s": 1.0e-6, "keep": 3, "keep_finished": True}}
    assert run_study(long_study, out, show_progress=False, report=False, overrides=overrides) == 0
    (run,) = load_study(long_study, overrides=PRE).runs()
    rec = read_record(out / "runs" / f"{run.run_id}.json")
    assert rec.env["resumed_from"] == [6]
    assert same_record(rec, read_record(long_reference["pre"] / "runs" / f"{run.run_id}.json")) == []
    assert sorted(p.name for p in folder.iterdir())[-1] == "step-000000023"  # kept: keep_finished
    shutil.rmtree(folder)
