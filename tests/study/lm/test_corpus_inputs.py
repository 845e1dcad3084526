"""The inputs of a corpus: ``text`` files that are not UTF-8 are all found before
any is tokenized, refused in one line or left out (``skip_undecodable``) and counted; ``exclude`` globs; the
held-out share of indented text (Python source) is ``eval_fraction`` within a stated tolerance; ``hf_dataset``
inputs that are empty, malformed or unreadable get one line naming the file and what was expected."""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from lnblocks.cli import main as cli_main
from lnblocks.config import ConfigValueError
from lnblocks.study.lm.data.corpus import CorpusConfig, TextTokenizer, prepare_corpus
from lnblocks.study.lm.data.corpus import documents as docs

prep = importlib.import_module("lnblocks.study.lm.data.corpus.prepare")  # the module (the package exports the function)
tokenizers = pytest.importorskip("tokenizers")

BAD = [b"# caf\xe9 in Latin-1\nx = 1\n", b"print('ok')\n# \xff\xfe broken\n", b"\x80 starts with a continuation\n"]


def _tree_with_bad_files(tmp_path: Path, source_tree: Path, n_bad: int) -> Path:
    folder = tmp_path / "tree"
    shutil.copytree(source_tree, folder)
    for i in range(n_bad):
        (folder / f"bad_{i:02d}.py").write_bytes(BAD[i % len(BAD)])
    return folder


def _counting_encoder(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = TextTokenizer.encode_pieces

    def encode_pieces(self, pieces, where):
        calls.append(len(pieces))
        return real(self, pieces, where)

    monkeypatch.setattr(TextTokenizer, "encode_pieces", encode_pieces)
    return calls


# ---- files that are not UTF-8 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n_bad", [3, 12])
def test_every_undecodable_file_is_named_before_any_is_tokenized(
    tmp_path: Path, source_tree: Path, source_bpe: Path, monkeypatch, n_bad: int
) -> None:
    folder = _tree_with_bad_files(tmp_path, source_tree, n_bad)
    n_files = len(list(folder.iterdir()))
    calls = _counting_encoder(monkeypatch)
    cfg = CorpusConfig(
        source="text", files=(str(folder / "*.py"),), tokenizer=str(source_bpe), cache_dir=str(tmp_path / "c")
    )
    with pytest.raises(ValueError) as err:
        prepare_corpus(cfg, show_progress=False)
    msg = str(err.value)
    assert calls == []  # refused by the UTF-8 pass, before the tokenizing pass
    assert f"files: {n_bad} of {n_files} file(s) are not UTF-8 text" in msg and "\n" not in msg
    named = [i for i in range(n_bad) if f"bad_{i:02d}.py" in msg]
    assert named == list(range(min(n_bad, 10)))  # every bad file, up to 10, in path order
    assert (f"and {n_bad - 10} more" in msg) == (n_bad > 10)
    assert "(byte b'\\xe9' at offset 5)" in msg and "(byte b'\\x80' at offset 0)" in msg  # where, exactly
    assert "skip_undecodable: true" in msg


def test_undecodable_offsets_across_block_boundaries(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(docs, "BLOCK_BYTES", 16)
    e = "é".encode()
    good = tmp_path / "good.txt"
    good.write_bytes(b"a" * 15 + e + b"b" * 40)  # a two-byte character split by a block boundary: valid
    cut = tmp_path / "cut.txt"
    cut.write_bytes(b"a" * 33 + e[:1])  # a character cut by the end of the file
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"a" * 40 + b"\xff" + b"a")
    assert docs.undecodable([good, cut, bad]) == [(cut, 33, e[:1]), (bad, 40, b"\xff")]


def test_skip_undecodable_leaves_them_out_and_counts_them(
    tmp_path: Path, source_tree: Path, source_bpe: Path, capsys
) -> None:
    folder = _tree_with_bad_files(tmp_path, source_tree, 3)
    base = {
        "source": "text",
        "files": [str(folder / "*.py")],
        "tokenizer": str(source_bpe),
        "cache_dir": str(tmp_path / "c"),
    }
    s = prepare_corpus({**base, "skip_undecodable": True}, show_progress=False)
    assert s.skipped == tuple(str(folder / f"bad_{i:02d}.py") for i in range(3))
    assert "skipped: 3 file(s) not UTF-8 (skip_undecodable)" in s.describe()
    meta = json.loads((s.train_path.parent / "meta.json").read_text())
    assert [m["path"] for m in meta["skipped"]] == list(s.skipped) and meta["files"] == len(list(source_tree.iterdir()))

    clean = prepare_corpus({**base, "files": [str(source_tree / "*.py")], "cache_dir": str(tmp_path / "c2")},
                    show_progress=False)  # fmt: skip
    for split in ("train_path", "val_path"):  # the same ids as the corpus without the bad files
        assert getattr(s, split).read_bytes() == getattr(clean, split).read_bytes()
    with pytest.raises(ValueError, match=r"^files: 3 of \d+ file\(s\) are not UTF-8 text"):
        prepare_corpus(
            base, show_progress=False
        )  # a cached corpus with skipped files is refused as a fresh one would be

    bytes_corpus = prepare_corpus({**base, "tokenizer": "bytes", "skip_undecodable": True}, show_progress=False)
    assert bytes_corpus.skipped == ()  # bytes never decode: nothing to skip

    only_bad = {**base, "files": [str(folder / "bad_*.py")], "skip_undecodable": True}
    with pytest.raises(ValueError, match=r"^files: none of its 3 file\(s\) is UTF-8 text$"):
        prepare_corpus(only_bad, show_progress=False)


def test_exclude_globs_and_folders(tmp_path: Path, source_tree: Path, source_bpe: Path, capsys) -> None:
    folder = _tree_with_bad_files(tmp_path, source_tree, 3)
    (folder / "vendored").mkdir()
    (folder / "vendored" / "bad.py").write_bytes(BAD[0])
    n_good = len(list(source_tree.iterdir()))
    exclude = (str(folder / "bad_*.py"), str(folder / "vendored"))
    cfg = CorpusConfig(source="text", files=(str(folder / "**" / "*.py"),), tokenizer=str(source_bpe), exclude=exclude,
                       cache_dir=str(tmp_path / "c"))  # fmt: skip
    s = prepare_corpus(cfg, show_progress=False)
    assert s.excluded == 4 and s.skipped == () and "excluded: 4 file(s) matched by exclude" in s.describe()
    assert json.loads((s.train_path.parent / "meta.json").read_text())["files"] == n_good

    with pytest.raises(ConfigValueError, match=r"^data\.files every file it matches is left out by exclude \(3"):
        CorpusConfig.from_dict({"source": "text", "files": [str(folder / "bad_*")], "exclude": [str(folder)]},
                               key="data")  # fmt: skip
    with pytest.raises(ConfigValueError, match=r"^data\.exclude is only used with source 'text', not 'tokens'$"):
        CorpusConfig.from_dict({"exclude": ["x"], "train_path": str(folder / "bad_00.py"),
                                "val_path": str(folder / "bad_01.py"), "vocab_size": 256}, key="data")  # fmt: skip

    # in a study file: exclude resolves against the file's folder like files; the CLI refuses bad files in one line
    study = tmp_path / "s.yaml"
    data = {"source": "text", "files": ["tree/*.py"], "tokenizer": str(source_bpe), "cache_dir": "cache", "seq_len": 16}
    study.write_text(json.dumps({"data": {**data, "exclude": ["tree/bad_*.py"]}}))
    assert cli_main(["data", "prepare", str(study)]) == 0
    assert "excluded: 3 file(s) matched by exclude" in capsys.readouterr().out
    study.write_text(json.dumps({"data": data}))
    assert cli_main(["data", "prepare", str(study)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lnblocks: error: files: 3 of ") and "bad_02.py" in err[0]


# ---- the held-out share ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fraction", [0.1, 0.25])
def test_held_out_share_of_indented_text_is_the_fraction(
    tmp_path: Path, source_tree: Path, source_bpe: Path, fraction: float
) -> None:
    """Each file's tail is ``fraction`` of it to within the line at the target; the corpus's share of bytes within
    0.002 and of BPE tokens within 0.01 (the old rule, the next unindented line, gave 0.046 for 0.1 on the whole
    standard library)."""
    files = sorted(source_tree.iterdir())
    for f in files:
        raw = f.read_bytes()
        target = round(len(raw) * (1 - fraction))
        c = docs.held_out_offset(f, fraction)
        line = (raw.rfind(b"\n", 0, target) + 1, raw.find(b"\n", target) + 1)  # the line holding the target
        assert raw[c - 1 : c] == b"\n" and abs(c - target) <= line[1] - line[0], f.name
        assert 0 < c < len(raw)
    sizes = [f.stat().st_size for f in files]
    held = sum(s - docs.held_out_offset(f, fraction) for f, s in zip(files, sizes))
    assert abs(held / sum(sizes) - fraction) < 0.002

    s = prepare_corpus({"source": "text", "files": [str(source_tree / "*.py")], "tokenizer": str(source_bpe),
                 "val_fraction": fraction, "cache_dir": str(tmp_path)}, show_progress=False)  # fmt: skip
    assert abs(s.val_tokens / (s.train_tokens + s.val_tokens) - fraction) < 0.01
    by_bytes = prepare_corpus({"source": "text", "files": [str(source_tree / "*.py")], "val_fraction": fraction,
                        "cache_dir": str(tmp_path)}, show_progress=False)  # fmt: skip
    assert by_bytes.val_tokens == held and by_bytes.train_tokens == sum(sizes) - held


def test_a_corpus_cut_by_the_old_rule_is_not_reused(tmp_path: Path, source_tree: Path) -> None:
    cfg = CorpusConfig(source="text", files=(str(source_tree / "*.py"),), cache_dir=str(tmp_path))
    key = prep.cache_key(cfg, TextTokenizer("bytes"))
    assert key["format"] == prep.CORPUS_FORMAT == "lnblocks.corpus/2"
    old = prep.corpus_folder(cfg, {**key, "format": "lnblocks.corpus/1"})  # where the old rule's entry lives
    s = prepare_corpus(cfg, show_progress=False)
    assert s.train_path.parent != old and not s.cached


def test_files_without_a_newline_and_tiny_files(tmp_path: Path) -> None:
    one_line = tmp_path / "min.js"
    one_line.write_bytes(b"var a = 1; " * 200)  # minified: no newline, cut before the nearest space
    c = docs.held_out_offset(one_line, 0.1)
    assert one_line.read_bytes()[c : c + 1] == b" " and abs(c - 1980) <= 11
    word = tmp_path / "word.txt"
    word.write_bytes("é".encode() * 50)  # no whitespace: a character boundary
    assert docs.held_out_offset(word, 0.1) % 2 == 0
    for size in (0, 1):
        tiny = tmp_path / f"tiny{size}.txt"
        tiny.write_bytes(b"x" * size)
        assert docs.held_out_offset(tiny, 0.1) == size


def test_cut_before_keeps_gpt2_pretokenization() -> None:
    """A piece must not end in whitespace that the whole document splits differently: GPT-2's ``\\s+(?!\\S)``
    makes ``" \\n"`` (or ``"\\n   "``) one pre-token at the end of a piece but two inside the document, and a BPE
    with that merge then gives other ids. Checked on the pre-tokens, which every vocabulary shares."""
    from tokenizers import pre_tokenizers

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)

    def words(b: bytes) -> list[str]:
        return [w for w, _ in pre.pre_tokenize_str(b.decode())]

    for text in ("x = 1 \nif y:\n    pass\n", "a\n\nb\nc", "def f():\n\treturn 1\n\nclass A:  pass\n"):
        buf = text.encode()
        for hi in range(2, len(buf) + 1):
            c = docs.cut_before(buf, hi)
            assert 0 < c <= hi
            if c < hi:  # a chosen cut (c == hi is the last resort: no whitespace before hi)
                assert words(buf[:c]) + words(buf[c:]) == words(buf), (text, hi, c)


# ---- hf_dataset inputs ----------------------------------------------------------------------------------------

HF_CASES = {
    "empty.jsonl": (b"", r"dataset: '.*empty\.jsonl' is empty \(1 empty file\(s\)\); expected JSON lines"),
    "bad.jsonl": (b'{"text": "a"}\n{not json\n', r"dataset: '.*bad\.jsonl' cannot be read as json \(.*\); expected"),
    "empty.csv": (b"", r"dataset: '.*empty\.csv' is empty .*expected CSV with a header row naming a 'text' column"),
    "header.csv": (b"text\n", r"dataset: '.*header\.csv' (holds no rows|cannot be read as csv).*expected CSV"),
    "bad.parquet": (b"garbage", r"dataset: '.*bad\.parquet' cannot be read as parquet \(.*\); expected Parquet"),
    "empty.txt": (b"", r"dataset: '.*empty\.txt' is empty .*expected text, one row per line"),
}


@pytest.mark.parametrize("name", sorted(HF_CASES))
def test_hf_dataset_files_that_cannot_be_read(tmp_path: Path, name: str) -> None:
    pytest.importorskip("datasets")
    content, match = HF_CASES[name]
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=match) as err:
        prepare_corpus({"source": "hf_dataset", "dataset": str(tmp_path / name), "cache_dir": str(tmp_path / "c")},
                show_progress=False)  # fmt: skip
    assert "\n" not in str(err.value)
    assert not list((tmp_path / "c").rglob(".datasets*tmp-*"))  # datasets' arrow copy does not outlive prepare


def test_hf_dataset_saved_empty_and_its_cli_line(tmp_path: Path, capsys) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": []}).save_to_disk(str(tmp_path / "empty"))
    dd = {"train": datasets.Dataset.from_dict({"text": ["a b c"] * 10}),
          "validation": datasets.Dataset.from_dict({"text": []})}  # fmt: skip
    datasets.DatasetDict(dd).save_to_disk(str(tmp_path / "no_val"))
    base = {"source": "hf_dataset", "cache_dir": str(tmp_path / "c")}
    with pytest.raises(ValueError, match=r"^dataset: '.*empty' holds no rows in '\(the dataset\)': expected a"):
        prepare_corpus({**base, "dataset": str(tmp_path / "empty")}, show_progress=False)
    with pytest.raises(ValueError, match=r"^dataset: '.*no_val' holds no rows in 'validation'"):
        prepare_corpus({**base, "dataset": str(tmp_path / "no_val"), "val_split": "validation"}, show_progress=False)
    (tmp_path / "rows.jsonl").write_bytes(HF_CASES["bad.jsonl"][0])
    study = tmp_path / "s.yaml"
    study.write_text(json.dumps({"data": {**base, "dataset": str(tmp_path / "rows.jsonl")}}))
    capsys.readouterr()  # datasets' own bars from save_to_disk above
    assert cli_main(["data", "prepare", str(study)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lnblocks: error: dataset: ") and "rows.jsonl" in err[0]
    assert "internal error" not in err[0]


def test_hf_dataset_arrow_copy_is_temporary(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    rows = [f"row {i} of the table" for i in range(30)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    s = prepare_corpus({"source": "hf_dataset", "dataset": str(tmp_path / "rows.jsonl"), "eos_token": "\n",
                 "cache_dir": str(tmp_path / "c")}, show_progress=False)  # fmt: skip
    expect = "".join(r + "\n" for r in rows[:27]).encode()
    assert bytes(np.fromfile(s.train_path, np.uint16).astype(np.uint8)) == expect
    entry = s.train_path.parent.name
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [entry, f"{entry}.lock"]
