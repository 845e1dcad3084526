"""``lnblocks data prepare CONFIG``: make a study's data ready before any run, and say what it is.

For each distinct data section among the study's runs: a corpus (``tokens`` / ``text`` / ``hf_dataset``) is
tokenized once into the cache (or its token files checked) and described; a built-in source is described. Every
description gives the tokens, the vocabulary and the reference losses: uniform ln V and the unigram plateau, the
loss of a model that knows the token frequencies and nothing else (a run near it is "stuck").
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lnblocks.study.config import BUILTIN_SOURCES, DataConfig
from lnblocks.study.grid import load_study


def describe_builtin(cfg: DataConfig) -> str:
    """The lines ``data prepare`` prints for the built-in sources (Shakespeare bytes, the Markov chain)."""
    from lnblocks.study.data import build_source

    source = build_source(cfg)
    ref = source.reference
    lines = [f"corpus: {cfg.source} (built in)"]
    if cfg.source == "shakespeare":
        lines.append(f"tokens: train {len(source.train):,}, val {len(source.held):,} (bytes)")
    else:
        lines.append(f"tokens: sampled from the chain (data_seed {cfg.data_seed}); entropy floor {ref['floor']:.4f}")
    lines += [
        f"vocabulary: {source.vocab_size:,}",
        f"reference losses (nats/token): uniform ln V = {ref['uniform']:.4f}, unigram plateau = {ref['unigram']:.4f}",
    ]
    return "\n".join(lines)


def prepare_study_data(config: str | Path, overrides: Mapping[str, Any] | None = None, show_progress=None) -> int:
    """Prepare and describe every distinct data section of the study at ``config``; 0 on success."""
    from lnblocks.study.corpus import prepare

    study = load_study(config, task="lm", overrides=overrides)
    show = sys.stderr.isatty() if show_progress is None else show_progress
    seen: dict[str, DataConfig] = {}
    for run in study.runs():
        key = {k: v for k, v in run.data.to_dict().items() if k not in ("batch_size", "eval_batches")}
        seen.setdefault(json.dumps(key, sort_keys=True), run.data)
    for i, data in enumerate(seen.values()):
        if i:
            print()
        if data.source in BUILTIN_SOURCES:
            print(describe_builtin(data))
        else:
            print(prepare(data.corpus_config(), show_progress=show, seq_len=data.seq_len).describe())
    return 0
