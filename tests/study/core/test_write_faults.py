"""Storage that fails under a study (a full disk, a folder that went away): the study exits 2 with one line naming
the file, starts no further run and writes no report, whichever file failed: a checkpoint before any run finished
(the report's own status, 1 for "no finished run", used to win), a run's record (``[Errno 28]`` without a path),
and the rerun goes on from there."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from lnblocks.study import read_record, run_study, study_from_dict

PRE = {"model.placement": "pre"}
TWO_RUNS = {
    "name": "disk",
    "data": {"source": "markov", "vocab_size": 8, "seq_len": 8, "batch_size": 4, "eval_batches": 1},
    "model": {"dim": 16, "n_heads": 2, "depth": 1},
    "train": {"steps": 3},
    "diagnostics": {"every": 0, "init_grad_batches": 0},
    "analysis": {"init_profile": {"seeds": 0}},
    "grid": {"train.seed": [0, 1]},
}


def test_a_full_disk_before_any_run_finished_exits_2_without_a_report(
    long_study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("LNBLOCKS_CHECKPOINT_FAULT", "enospc-mid-write@1")  # the first checkpoint fails part-way
    out = tmp_path / "out"
    assert run_study(long_study, out, show_progress=False, overrides=PRE) == 2  # with the report asked for
    err = capsys.readouterr().err
    assert "lnblocks: error: run " in err and "No space left on device" in err
    assert not (out / "report.md").exists() and not list((out / "runs").glob("*.json"))


def test_a_record_that_cannot_be_written_is_named_and_no_further_run_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """``fsync`` of the record's temporary file fails as on a full disk (the real call for every other file)."""
    study = study_from_dict(TWO_RUNS)
    out = tmp_path / "out"
    real_fsync = os.fsync

    def full_disk_for_records(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(out / "runs" / ".")):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_disk_for_records)
    assert run_study(study, out, show_progress=False) == 2
    err = capsys.readouterr().err.strip().splitlines()
    first = study.runs()[0]  # the first run trained; its record failed; the second never started
    path = out / "runs" / f"{first.run_id}.json"
    assert err[-1] == (
        f"lnblocks: error: run {first.run_id}: its record could not be written ([Errno 28] No space left on device: "
        f"'{path}'); free space (or fix the folder) and rerun the same command, which trains it again"
    ), err
    assert not list((out / "runs").glob("*.json")) and not (out / "report.md").exists()
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert run_study(study, out, show_progress=False, report=False) == 0
    assert all(read_record(out / "runs" / f"{r.run_id}.json").result.steps_done == 3 for r in study.runs())
