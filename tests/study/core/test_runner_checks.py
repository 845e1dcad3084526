"""What ``study run`` checks before training and how it behaves around it: optimizer values torch would refuse and a
device the machine lacks are one line before any run starts; Ctrl-C with worker processes is one line; tracking
turned on for a finished study writes its curves from the records; progress bars follow stderr being a terminal,
the report's init-profile bar included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lnblocks.cli import main as cli_main
from lnblocks.study import OptimizerConfig, TrainConfig, run_study
from lnblocks.study.lm.run.optim import build_optimizer

ROOT = Path(__file__).resolve().parents[3]
STUDY = """
data: {source: markov, vocab_size: 16, seq_len: 16, batch_size: 8, eval_batches: 1}
model: {dim: 16, n_heads: 2, depth: 1}
train: {steps: 2}
diagnostics: {every: 1, init_grad_batches: 1, probe_batch_size: 2}
analysis: {init_profile: {seeds: 2, batches: 1}}
grid: {model.placement: [pre, post]}
"""


@pytest.fixture
def tiny_study(tmp_path: Path) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(STUDY)
    return path


@pytest.mark.parametrize("key", ["beta1", "beta2"])
@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_optimizer_values_are_what_torch_accepts(key: str, name: str) -> None:
    model = torch.nn.Linear(2, 2)
    for value in (0.0, 0.5, 0.999999):  # accepted here and by torch
        build_optimizer(model, _train(name, key, value))
    with pytest.raises(ValueError, match=rf"{key} must be a finite number >= 0 and < 1, got 1.0"):
        OptimizerConfig.from_dict({"name": name, key: 1.0})
    with pytest.raises(ValueError):  # torch refuses it too: the config must never pass what torch rejects
        torch.optim.Adam(model.parameters(), betas=(1.0, 0.9) if key == "beta1" else (0.9, 1.0))
    build_optimizer(model, _train("sgd", "momentum", 1.0))  # torch takes momentum 1 (and so does the config)


def _train(name: str, key: str, value: float) -> TrainConfig:
    return TrainConfig.from_dict({"optimizer": {"name": name, key: value}})


def test_set_beta_one_is_one_line_before_training(tiny_study: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert cli_main(["study", "run", str(tiny_study), "--out", str(out), "--set", "train.optimizer.beta2=1.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.optimizer.beta2 must be a finite number >= 0 and < 1" in err
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_cuda_without_a_gpu_is_one_line_before_any_run(tiny_study: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert cli_main(["study", "run", str(tiny_study), "--out", str(out), "--set", "train.device=cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.device is 'cuda' in 2 run(s)" in err and "no CUDA device" in err
    assert list((out / "runs").iterdir()) == []  # nothing trained, nothing failed per run


def test_ctrl_c_with_workers_is_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "long.yaml"
    seeds = "[pre, post], train.seed: [0, 1, 2]}"
    cfg.write_text(STUDY.replace("steps: 2", "steps: 60").replace("[pre, post]}", seeds))
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "lnblocks.cli", "study", "run", str(cfg), "--out", str(out), "--workers", "2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    deadline = time.time() + 120
    while time.time() < deadline and not list((out / "runs").glob("*.json")):  # the workers are training
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip() == "lnblocks: interrupted", err
    assert cli_main(["study", "run", str(cfg), "--out", str(out), "--workers", "1"]) == 0  # the rest is redone


def test_tracking_turned_on_for_a_finished_study(tiny_study: Path, tmp_path: Path, capsys) -> None:
    pytest.importorskip("tensorboard")
    out = tmp_path / "out"
    assert run_study(tiny_study, out, show_progress=False, report=False) == 0
    capsys.readouterr()
    assert run_study(tiny_study, out, show_progress=False, report=False, overrides={"tracking.tensorboard": True}) == 0
    assert "wrote the TensorBoard curves of 2 run(s) that finished without tracking" in capsys.readouterr().err
    folders = sorted((out / "tensorboard").iterdir())
    assert len(folders) == 2 and all(list(f.glob("events.out.tfevents.*")) for f in folders)
    assert run_study(tiny_study, out, show_progress=False, report=False, overrides={"tracking.tensorboard": True}) == 0
    assert "TensorBoard" not in capsys.readouterr().err  # written once


def test_no_progress_bars_when_stderr_is_not_a_terminal(tiny_study: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert run_study(tiny_study, out, show_progress=False) == 0
    assert "init gradient profiles" not in capsys.readouterr().err
    (out / "init_profile.json").unlink()
    proc = subprocess.run([sys.executable, "-m", "lnblocks.cli", "study", "report", str(out)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and "\r" not in proc.stderr and "init gradient profiles" not in proc.stderr
    assert (out / "init_profile.json").exists()
