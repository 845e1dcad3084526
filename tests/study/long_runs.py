"""Helpers of the long-run tests: the study every kill/resume scenario trains, a way to run ``lnblocks study run``
in a process that is killed (``LNBLOCKS_CHECKPOINT_FAULT``), and readers of records and TensorBoard events."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # a spawned process imports this checkout's lnblocks, PYTHONPATH or not

# dropout, grad_accum 2, warmup + cosine, z-loss, diagnostics every 3 steps, evals, TensorBoard: what must resume
STUDY = """
name: long_runs
data: {source: markov, vocab_size: 8, seq_len: 8, batch_size: 4, eval_batches: 1}
model: {dim: 16, n_heads: 2, depth: 2, dropout: 0.1}
train:
  steps: 24
  lr: 3.0e-3
  warmup: 3
  schedule: cosine
  grad_accum: 2
  z_loss: 1.0e-4
  eval_every: 6
  log_every: 4
  checkpoint: {every: 5}
diagnostics: {every: 3, init_grad_batches: 1, probe_batch_size: 2}
tracking: {tensorboard: true}
"""
EVERY, STEPS = 5, 24


def child_env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **extra}


def study_cli(cfg: Path, out: Path, *args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    """``lnblocks study run cfg --out out args`` in a new process (with ``fault`` injected, if given)."""
    cmd = [sys.executable, "-m", "lnblocks.cli", "study", "run", str(cfg), "--out", str(out), *args]
    env = child_env(**({"LNBLOCKS_CHECKPOINT_FAULT": fault} if fault else {}))
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def events(log_dir: Path) -> tuple[Counter, dict[tuple[str, int], float]]:
    """How often each (tag, step) scalar occurs in the event files of ``log_dir``, and its value, read with
    TensorBoard's raw event reader (no de-duplication: a step written twice counts twice)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    count: Counter = Counter()
    values: dict[tuple[str, int], float] = {}
    for path in sorted(glob.glob(str(log_dir / "events.out.tfevents.*"))):
        for event in EventFileLoader(path).Load():
            for v in event.summary.value:
                if v.metadata.plugin_data.plugin_name == "scalars" or v.HasField("simple_value"):
                    key = (v.tag, event.step)
                    count[key] += 1
                    values[key] = tensor_util.make_ndarray(v.tensor).item() if v.HasField("tensor") else v.simple_value
    return count, values


def same_record(resumed: Any, reference: Any) -> list[str]:
    """The fields of two records that differ, timing and host fields aside (empty: byte-identical)."""
    a, b = resumed.deterministic_json(), reference.deterministic_json()
    return [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
