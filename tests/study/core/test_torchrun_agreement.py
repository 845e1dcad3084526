"""Ranks of a ``torchrun`` study launched with different settings (a ``--set`` that reached one node only, another
study file): the driver hands every rank rank 0's runs, so before any run every rank compares the runs it resolved
itself, every field included (``train.parallel`` and other execution keys too, which are not in the run id), and
all stop with one line naming the key, instead of training rank 0's config without a word."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.models.parallel_launch import ROOT, free_port

STUDY = """
name: agree
data: {source: markov, vocab_size: 16, seq_len: 8, batch_size: 4, eval_batches: 1}
model: {dim: 16, depth: 1}
train: {steps: 2}
diagnostics: {every: 0, init_grad_batches: 0}
grid: {train.seed: [0, 1]}
"""

WRAPPER = """
import os, sys
from lnblocks.cli import main
extra = {extra!r} if os.environ["RANK"] == "1" else []
sys.exit(main(["study", "run", {study!r}, "--out", {out!r}, *extra]))
"""


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--set", "train.parallel.dp_shard=2"], "run 1 of 2 of the study: the ranks disagree on train.parallel: "
         "rank 0 has None, rank 1 has {dp_shard: 2, tp: 1, sequence_parallel: True, loss_parallel: False, "
         "param_dtype: None, reduce_dtype: None, reshard_after_forward: True, compile: False, "
         "compile_backend: 'inductor'}; every rank"),
        (["--set", "train.seed=[0, 1, 2]"], "the ranks disagree on the study: rank 0: 2, rank 1: 3 runs"),
    ],
    ids=["execution_key", "grid"],
)  # fmt: skip
def test_ranks_with_other_settings_all_stop_with_one_line(tmp_path: Path, extra: list[str], message: str) -> None:
    (tmp_path / "s.yaml").write_text(STUDY)
    script = tmp_path / "wrapper.py"
    script.write_text(WRAPPER.format(extra=extra, study=str(tmp_path / "s.yaml"), out=str(tmp_path / "out")))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script)]  # fmt: skip
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)  # a hang fails here
    # one line per rank (counted in the text: two ranks' lines can interleave on the shared stderr)
    assert proc.returncode != 0 and proc.stderr.count("lnblocks: error:") == 2, proc.stdout[-2000:] + proc.stderr
    assert proc.stderr.count(message) == 2, proc.stderr[-4000:]
    assert not (tmp_path / "out" / "runs").exists() or not list((tmp_path / "out" / "runs").glob("*.json"))
