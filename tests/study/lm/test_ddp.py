"""The DDP path: ``torchrun --nproc_per_node 2 -m lnblocks.cli study run`` on CPU (gloo) trains each run across two
processes and must follow the single-process run, since both see the same global batches."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lnblocks.study import load_study, read_record, train_run

CONFIG = """
name: ddp
data: {source: markov, vocab_size: 16, seq_len: 16, batch_size: 8, eval_batches: 2}
model: {dim: 32, depth: 2, placement: post}
train: {steps: 15, lr: 3.0e-3, warmup: 3}
diagnostics: {every: 5, init_grad_batches: 2, probe_batch_size: 4}
grid: {model.placement: [pre, post]}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_process_ddp_matches_single_process(tmp_path: Path) -> None:
    cfg = tmp_path / "ddp.yaml"
    cfg.write_text(CONFIG)
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "-m",
        "lnblocks.cli",
        "study",
        "run",
        str(cfg),
        "--out",
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "DDP over 2 ranks (gloo)" in proc.stdout

    study = load_study(cfg)
    for run in study.runs():
        ddp = read_record(out / "runs" / f"{run.run_id}.json")
        assert ddp.env["world_size"] == 2 and ddp.status == "finished"
        d, single = ddp.result, train_run(run, show_progress=False).result
        assert d.loss == pytest.approx(single.loss, rel=1e-4, abs=1e-5)
        assert d.eval["final"] == pytest.approx(single.eval["final"], rel=1e-4)
        # diagnostics come from rank 0, whose gradients are the all-reduced ones: same as the single process
        for a, b in zip(d.diagnostics, single.diagnostics):
            assert a["grad_norm"]["W_2"] == pytest.approx(b["grad_norm"]["W_2"], rel=1e-3)
        assert d.init_grad["expected"]["W_2"] == pytest.approx(single.init_grad["expected"]["W_2"], rel=1e-5)
    assert (out / "report.md").exists()
