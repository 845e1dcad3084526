"""The resume guarantee with Muon (docs/long-runs.md): a run of the long-run study under ``train.optimizer.name:
muon`` (its AdamW part at another peak LR, so the schedule scales groups of two peaks, with warmup + cosine, grad
accumulation, dropout, z-loss, diagnostics and TensorBoard on), killed with SIGKILL at a random step and resumed with
``lnblocks study run`` on the same folder, gives the uninterrupted run's record byte for byte apart from timing and
host fields: both optimizers' states (Muon's momentum, AdamW's moments) and every group's LR come back. The killed
process is a real ``lnblocks`` process that SIGKILLs itself where ``LNBLOCKS_CHECKPOINT_FAULT`` says."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest

from lnblocks.study import load_study, read_record, run_study
from tests.study.study_helpers import EVERY, STEPS, same_record, study_cli

pytest.importorskip("tensorboard")

MUON = {"train.optimizer.name": "muon", "train.optimizer.adamw_lr": 1.0e-3, "train.optimizer.weight_decay": 0.01}
KILL_STEP = random.Random().randrange(EVERY + 1, STEPS)  # a new step every session (named in the failure message)


def test_a_killed_muon_run_resumes_bit_identically(long_study: Path, tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    assert run_study(long_study, reference, show_progress=False, report=False, overrides=MUON) == 0
    (run,) = load_study(long_study, overrides=MUON).runs()
    assert run.train.optimizer.name == "muon"
    out = tmp_path / "out"
    sets = [a for k, v in MUON.items() for a in ("--set", f"{k}={v}")]
    killed = study_cli(long_study, out, *sets, fault=f"kill-at-step@{KILL_STEP}")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not list((out / "runs").glob("*.json"))
    assert run_study(long_study, out, show_progress=False, report=False, overrides=MUON) == 0
    rec, ref = (read_record(d / "runs" / f"{run.run_id}.json") for d in (out, reference))
    assert rec.env.get("resumed_from") == [(KILL_STEP - 1) // EVERY * EVERY], f"killed at step {KILL_STEP}"
    assert same_record(rec, ref) == [], f"killed at step {KILL_STEP}"
    assert rec.result.steps_done == STEPS and rec.result.loss == ref.result.loss
