"""Resume on every executor: the local pool's workers SIGKILLed right after a checkpoint
and the sweep rerun, and a DDP run of 2 gloo processes under ``torchrun`` SIGKILLed at a random step (rank 0 dies,
torchrun ends the job) and relaunched, both continue from their newest checkpoint (DDP: written with
torch.distributed.checkpoint, each rank its part) to records byte-identical to the uninterrupted runs' apart from
timing and host fields. Ray's retry is in test_study_ray.py (it shares that module's Ray instance)."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from lnblocks.study import load_study, read_record
from tests.models.parallel_launch import free_port
from tests.study.study_helpers import EVERY, STEPS, child_env, same_record, study_cli


def without_labels(rec: dict) -> dict:
    return {k: v for k, v in rec.deterministic_json().items() if k not in ("id", "labels")}


def test_killed_pool_workers_resume_on_the_rerun(long_study: Path, long_reference: dict, tmp_path: Path) -> None:
    """Both workers of ``--workers 2`` die right after their second checkpoint (the fault is in their environment);
    the runner reports both runs lost, and the rerun resumes each from step 10."""
    cfg = tmp_path / "grid.yaml"
    cfg.write_text(long_study.read_text() + "grid: {model.placement: [pre, post]}\n")
    out = tmp_path / "out"
    first = study_cli(cfg, out, "--workers", "2", fault="kill-after-save@2")
    assert first.returncode == 1 and first.stderr.count("training it died (killed by SIGKILL") == 2, first.stderr
    assert sorted(len(list(f.iterdir())) for f in (out / "checkpoints").iterdir()) == [2, 2]
    second = study_cli(cfg, out, "--workers", "2", "--set", "analysis.init_profile.batches=1")  # a quick report
    assert second.returncode == 0, second.stderr[-2000:]
    for run in load_study(cfg).runs():
        rec = read_record(out / "runs" / f"{run.run_id}.json")
        (ref,) = (read_record(p) for p in (long_reference[run.model.placement] / "runs").glob("*.json"))
        assert rec.env["resumed_from"] == [2 * EVERY] and rec.result.steps_done == STEPS
        assert without_labels(rec) == without_labels(ref)  # the same run, under a grid label
    assert not (out / "checkpoints").exists()


def torchrun(cfg: Path, out: Path, fault: str | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           "-m", "lnblocks.cli", "study", "run", str(cfg), "--out", str(out)]  # fmt: skip
    env = child_env(**({"LNBLOCKS_CHECKPOINT_FAULT": fault} if fault else {}))
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_ddp_run_killed_at_a_random_step_resumes_bit_identically(long_study: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "ddp.yaml"
    cfg.write_text(long_study.read_text().replace("dropout: 0.1}", "dropout: 0.1, placement: post}"))
    step = random.Random().randrange(EVERY + 1, STEPS)
    ref = torchrun(cfg, tmp_path / "ref")  # one launch at a time: no race for the free port
    _, err = ref.communicate(timeout=300)
    assert ref.returncode == 0, err[-3000:]
    killed = torchrun(cfg, tmp_path / "out", fault=f"kill-at-step@{step}")
    _, err = killed.communicate(timeout=300)
    assert killed.returncode != 0 and not list((tmp_path / "out" / "runs").glob("*.json")), err[-3000:]
    again = torchrun(cfg, tmp_path / "out")
    stdout, stderr = again.communicate(timeout=300)
    assert again.returncode == 0 and "DDP over 2 ranks (gloo)" in stdout, stderr[-3000:]
    (run,) = load_study(cfg).runs()
    rec = read_record(tmp_path / "out" / "runs" / f"{run.run_id}.json")
    assert rec.env["world_size"] == 2 and rec.env["resumed_from"] == [(step - 1) // EVERY * EVERY], step
    assert same_record(rec, read_record(tmp_path / "ref" / "runs" / f"{run.run_id}.json")) == [], f"killed at {step}"
