"""The user's own data in study files: ``data.source: tokens | text | hf_dataset`` with paths
relative to the study file, reference losses for every source (checked against an fp64 numpy formula written here),
"stuck" classified against them, and ``lnblocks data prepare``. The corpus mechanics themselves (memmap windows,
caching, tokenizers) are tested in test_study_corpus.py."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from lnblocks.cli import main as cli_main
from lnblocks.config import ConfigValueError
from lnblocks.study import RunConfig, load_study, read_record, run_study, train_run
from lnblocks.study.lm.data.builtin import build_source
from lnblocks.study.lm.data.corpus import TokenFileSource

SMALL = {
    "model": {"dim": 16, "n_heads": 2, "depth": 1},
    "train": {"steps": 3, "log_every": 1},
    "diagnostics": {"every": 0, "init_grad_batches": 0},
}


def unigram(train: np.ndarray, val: np.ndarray, vocab: int) -> float:
    """Cross-entropy on ``val`` of add-one-smoothed ``train`` frequencies (docs/study-protocol.md), in fp64."""
    p = (np.bincount(train, minlength=vocab) + 1.0) / (len(train) + vocab)
    return float(-np.log(p[val]).mean())


def zipf_tokens(n: int, vocab: int, seed: int) -> np.ndarray:
    p = 1.0 / np.arange(1, vocab + 1)
    return np.random.default_rng(seed).choice(vocab, size=n, p=p / p.sum())


def yaml_dump(obj: dict) -> str:
    return json.dumps(obj)  # JSON is YAML


def test_tokens_source_from_a_study_file_with_relative_paths(tmp_path: Path, monkeypatch, capsys) -> None:
    vocab = 300
    (tmp_path / "data").mkdir()
    train, val = zipf_tokens(200_000, vocab, 0), zipf_tokens(4_000, vocab, 1)
    train.astype(np.uint16).tofile(tmp_path / "data" / "train.bin")
    val.astype(np.uint16).tofile(tmp_path / "data" / "val.bin")
    (tmp_path / "study").mkdir()
    cfg = tmp_path / "study" / "s.yaml"
    data = {
        "source": "tokens",
        "train_path": "../data/train.bin",
        "val_path": "../data/val.bin",
        "vocab_size": vocab,
        "seq_len": 16,
        "batch_size": 4,
        "eval_batches": 2,
    }
    cfg.write_text(yaml_dump({"data": data, **SMALL, "grid": {"train.lr": [1.0e-6, 3.0e-3]}}))
    monkeypatch.chdir(tmp_path / "data")  # paths in the file are relative to the file, not to the current folder

    assert cli_main(["data", "prepare", str(cfg)]) == 0
    printed = capsys.readouterr().out
    expected = unigram(train, val, vocab)
    assert "corpus: tokens (token files checked)" in printed and "tokens: train 200,000, val 4,000" in printed
    assert f"vocabulary: {vocab}" in printed and f"unigram plateau = {expected:.4f}" in printed

    assert cli_main(["study", "run", str(cfg), "--out", str(tmp_path / "out"), "--set", "train.steps=4"]) == 0
    records = [read_record(p) for p in sorted((tmp_path / "out" / "runs").glob("*.json"))]
    assert len(records) == 2
    for rec in records:
        assert rec.result.corpus["train_path"] == str(tmp_path / "data" / "train.bin")  # the record names its data
        assert rec.config["data"]["corpus"] == rec.result.corpus["digest"] and "train_path" not in rec.config["data"]
        assert rec.result.steps_done == 4
        assert rec.result.reference["uniform"] == pytest.approx(math.log(vocab), rel=1e-12)
        assert rec.result.reference["unigram"] == pytest.approx(expected, rel=1e-12)
    with open(tmp_path / "out" / "summary.csv") as f:
        rows = {r["lr"]: r for r in csv.DictReader(f)}
    assert float(rows["1e-06"]["unigram_loss"]) == pytest.approx(expected, rel=1e-9)
    assert rows["1e-06"]["outcome"] == "stuck"  # an untrained model sits above the plateau: "stuck" keeps its meaning

    run = load_study(cfg).runs()[0]
    source = build_source(run.data)
    assert isinstance(source, TokenFileSource) and source.train_tokens == len(train)


def test_text_source_is_tokenized_once_and_its_reference_reaches_the_record(texts: Path, capsys) -> None:
    data = {
        "source": "text",
        "files": ["texts/*.txt"],
        "tokenizer": "bpe/tokenizer.json",
        "eos_token": "<|endoftext|>",
        "cache_dir": "cache",
        "seq_len": 16,
        "batch_size": 4,
        "eval_batches": 1,
    }
    cfg = texts / "text.yaml"
    cfg.write_text(yaml_dump({"data": data, **SMALL}))
    assert cli_main(["data", "prepare", str(cfg)]) == 0
    first = capsys.readouterr().out
    assert "corpus: text (tokenized in" in first and "vocabulary: 300" in first
    train_bin = next((texts / "cache").glob("text-*/train.bin"))
    train = np.fromfile(train_bin, np.uint16).astype(np.int64)
    val = np.fromfile(train_bin.with_name("val.bin"), np.uint16).astype(np.int64)
    assert f"tokens: train {len(train):,}, val {len(val):,}" in first
    expected = unigram(train, val, 300)
    assert f"unigram plateau = {expected:.4f}" in first

    assert run_study(cfg, texts / "out", show_progress=False, report=False) == 0
    assert "corpus: text (found in cache)" in capsys.readouterr().out  # the driver prepared it; nothing redone
    (rec,) = [read_record(p) for p in (texts / "out" / "runs").glob("*.json")]
    # the record keeps the corpus by digest and a summary, not the list of files
    assert "files" not in rec.config["data"] and "tokenizer" not in rec.config["data"]
    assert rec.result.corpus["files"] == 2 and rec.result.corpus["tokenizer"] == str(texts / "bpe" / "tokenizer.json")
    assert rec.config["data"]["corpus"] == rec.result.corpus["digest"]
    assert rec.result.reference["unigram"] == pytest.approx(expected, rel=1e-12)
    assert rec.result.reference["uniform"] == pytest.approx(math.log(300), rel=1e-12)


def test_hf_dataset_source_from_json_rows(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    rows = [f"row {i}: the quick brown fox jumps over the lazy dog {i % 7}" for i in range(60)]
    with open(tmp_path / "rows.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({"body": r}) + "\n")
    data = {
        "source": "hf_dataset",
        "dataset": str(tmp_path / "rows.jsonl"),
        "text_column": "body",
        "eos_token": "\n",
        "eval_fraction": 0.2,
        "cache_dir": str(tmp_path / "cache"),
        "seq_len": 16,
        "batch_size": 4,
        "eval_batches": 1,
    }
    rec = train_run(RunConfig.from_dict({"data": data, **SMALL}), show_progress=False)
    train = np.frombuffer("".join(r + "\n" for r in rows[:48]).encode(), np.uint8).astype(np.int64)
    val = np.frombuffer("".join(r + "\n" for r in rows[48:]).encode(), np.uint8).astype(np.int64)
    assert rec.status == "finished" and rec.result.steps_done == 3
    assert rec.result.reference["unigram"] == pytest.approx(unigram(train, val, 256), rel=1e-12)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (
            {"source": "tokens", "train_path": "nope.bin", "val_path": "nope.bin", "vocab_size": 9},
            r"data\.train_path is not an existing file",
        ),
        ({"source": "tokens", "train_path": "{tb}", "val_path": "{tb}"}, r"data\.vocab_size is required"),
        ({"source": "markov", "train_path": "{tb}"}, r"data\.train_path is a key of the sources \['tokens'"),
        ({"source": "text", "files": ["{tb}"], "texts": "folio"}, r"data\.texts is a key of the sources"),
        ({"source": "text", "files": ["*.nothing"]}, r"data\.files\[0\] matches no file"),
        ({"source": "text", "files": ["{tb}"], "tokenizer": "no/such/tokenizer"}, r"data\.tokenizer must be 'bytes'"),
    ],
)
def test_bad_data_sections_name_the_key(tmp_path: Path, monkeypatch, data: dict, match: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.bin").write_bytes(b"\0\0" * 64)
    data = {
        k: (
            v.format(tb="t.bin")
            if isinstance(v, str)
            else [x.format(tb="t.bin") for x in v]
            if isinstance(v, list)
            else v
        )
        for k, v in data.items()
    }
    with pytest.raises(ConfigValueError, match=match):
        load_study_from(tmp_path, {"data": data})


def load_study_from(folder: Path, raw: dict):
    path = folder / "bad.yaml"
    path.write_text(yaml_dump(raw))
    return load_study(path)
