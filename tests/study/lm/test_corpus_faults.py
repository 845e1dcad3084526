"""Corpus inputs that used to take forever or give silently wrong corpora: text without whitespace (the cut search
rescanned a growing window: quadratic), ``**`` globs through symlink loops (expanded forever), a folder ``exclude``
that missed files reached through a symlink to it, a ``tokens`` corpus whose new bytes kept the old digest behind the
same size and mtime, and ``data clean`` under ``LNBLOCKS_CORPUS_KEEP=0`` or pointed at the cache root.

What would hang runs in a subprocess with a timeout, so a regression fails in seconds instead of stalling the suite.
"""

from __future__ import annotations

import glob
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

from lnblocks.cli import main as cli_main
from lnblocks.study.lm.corpus import corpus_digest, prepare_corpus
from lnblocks.study.lm.data.corpus import documents as docs
from lnblocks.study.lm.data.corpus.config import CorpusConfig, expand_patterns, text_files

ROOT = Path(__file__).resolve().parents[2]
SPACE = b" \t\n\r\x0b\x0c"


def _python(code: str, timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter with this checkout first on the path; TimeoutExpired fails the test."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


# ---- text without whitespace: linear, and no cut search where none is needed ------------------------------------


def _reference_cut(buf: bytes, hi: int, lo: int) -> int:
    """``cut_before``'s rule read literally, position by position (slow, obviously right): after the last newline
    with a non-space on each side, else the start of the last whitespace run, else the last UTF-8 character start,
    all inside ``(lo, hi]`` and looking only at ``buf[lo:hi]``."""
    hi = min(hi, len(buf))
    for p in range(hi - 2, lo, -1):
        if buf[p] == 10 and buf[p - 1] not in SPACE and buf[p + 1] not in SPACE:
            return p + 1
    for p in range(hi - 1, lo, -1):
        if buf[p] in SPACE and buf[p - 1] not in SPACE:
            return p
    for c in range(hi, lo, -1):
        if c == len(buf) or (buf[c] & 0xC0) != 0x80:
            return c
    return hi


def test_cut_before_follows_its_rule_on_random_text() -> None:
    rng = random.Random(0)
    alphabet = [b"a", b"b", b" ", b"\n", b"\t", b"\r", b"  ", b"\n\n", "é".encode(), "😀".encode()]
    for _ in range(1500):
        buf = b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        if rng.random() < 0.3:  # long stretches without whitespace (or of it): several search windows
            buf += rng.choice([b"x", b" ", "é".encode()]) * rng.randint(1, 6000) + rng.choice(alphabet)
        for hi in {0, 1, 2, len(buf), rng.randint(0, len(buf) + 2)}:
            lo = rng.randint(0, max(0, min(hi, len(buf)) - 1))
            assert docs.cut_before(buf, hi, lo) == _reference_cut(buf, hi, lo), (buf[:60], hi, lo)


LONG_LINE = """
import sys
from pathlib import Path
from lnblocks.study.lm.data.corpus import documents as docs, prepare_corpus
path = Path("line.txt")
path.write_bytes("é".encode() * (3 << 20))  # 6 MiB of one UTF-8 character: no whitespace at all
pieces = [p for block in docs.read_pieces(path, 0, path.stat().st_size) for p in block]
assert b"".join(pieces) == path.read_bytes() and all(p.decode() for p in pieces)  # whole characters only
Path("bytes.txt").write_bytes(b"x" * (6 << 20))
s = prepare_corpus({"source": "text", "files": ["bytes.txt"], "cache_dir": "cache"}, show_progress=False)
assert s.train_tokens + s.val_tokens == 6 << 20
print("done")
"""


def test_a_long_line_without_whitespace_is_read_in_linear_time(tmp_path: Path) -> None:
    """6 MiB without whitespace: a second or two (the rescanning search took minutes), through the cut search and
    through a ``bytes`` corpus, which needs no cut at all."""
    proc = _python(LONG_LINE, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr[-3000:]


def test_bytes_pieces_are_fixed_slices_without_a_cut_search(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    rng = random.Random(1)
    data = b"".join(rng.choice([b"word ", b"\n", b"  x", b"\n\n"]) for _ in range(60_000))  # 165 kB
    path.write_bytes(data)
    pieces = [p for block in docs.read_pieces(path, 0, len(data), cuts=False) for p in block]
    assert b"".join(pieces) == data
    assert {len(p) for p in pieces[:-1]} == {docs.PIECE_BYTES}  # every whole piece, whatever the bytes there
    cut = [p for block in docs.read_pieces(path, 0, len(data)) for p in block]
    assert b"".join(cut) == data and any(len(p) != docs.PIECE_BYTES for p in cut[:-1])  # text: cut at whitespace


# ---- ** globs and symlinked folders -------------------------------------------------------------------------------


def _tree(root: Path) -> None:
    (root / "a" / "b").mkdir(parents=True)
    (root / ".hidden").mkdir()
    for f in ("top.txt", "a/one.txt", "a/b/two.txt", "a/b/skip.md", ".hidden/h.txt", "a/.dot.txt"):
        (root / f).write_text(f)
    (root / "store" / "linked").mkdir(parents=True)
    (root / "store" / "linked" / "three.txt").write_text("3")
    (root / "a" / "link").symlink_to(root / "store" / "linked", target_is_directory=True)
    (root / "a-b").symlink_to(root / "store" / "linked", target_is_directory=True)  # "a-b/" sorts before "a/"


def _glob_files(pattern: str) -> list[str]:
    """Python's glob, sorted, each file once (the first of its paths): what ``files`` expanded to before."""
    out, seen = [], set()
    for f in sorted(glob.glob(pattern, recursive=True)):
        st = os.stat(f)
        if os.path.isfile(f) and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            out.append(f)
    return out


def test_double_star_matches_what_glob_matches_when_there_is_no_loop(tmp_path: Path, monkeypatch) -> None:
    _tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    for pattern in ("**/*.txt", "a/**", "a/**/*.txt", "*/**/*.txt", "a/**/b/*", str(tmp_path / "**" / "*.txt")):
        got = list(map(str, expand_patterns("files", (pattern,))))
        assert got == _glob_files(pattern), pattern
    assert "a/link/three.txt" in map(str, expand_patterns("files", ("a/**/*.txt",)))  # symlinked folders followed
    assert "a-b/three.txt" in map(str, expand_patterns("files", ("**/*.txt",)))  # by the path that sorts first


LOOPS = """
from pathlib import Path
from lnblocks.study.lm.data.corpus.config import CorpusConfig, expand_patterns
Path("a/b").mkdir(parents=True)
Path("a/one.txt").write_text("1")
Path("a/b/two.txt").write_text("2")
Path("a/up").symlink_to("..")  # a loop to the folder above
Path("a/b/self").symlink_to("../../a")  # and one to an ancestor
found = sorted(map(str, expand_patterns("files", ("**/*.txt",))))
assert found == ["a/b/two.txt", "a/one.txt"], found
cfg = CorpusConfig(source="text", files=("a/**/*.txt",), exclude=("a/**/two.txt",), cache_dir="cache")
print("done")
"""


def test_symlink_loops_under_double_star_end_and_list_each_file_once(tmp_path: Path) -> None:
    proc = _python(LOOPS, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr[-3000:]


def test_exclude_of_a_folder_covers_files_reached_through_a_symlink(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "keep.txt").write_text("keep this\n" * 20)
    (tmp_path / "store" / "drafts").mkdir(parents=True)
    (tmp_path / "store" / "drafts" / "draft.txt").write_text("not ready\n" * 20)
    (tmp_path / "corpus" / "drafts").symlink_to(tmp_path / "store" / "drafts", target_is_directory=True)
    (tmp_path / "alias").symlink_to(tmp_path / "corpus", target_is_directory=True)
    for files, exclude in [
        (("corpus/**/*.txt",), ("store/drafts",)),  # the real folder; the file is found through the link
        (("corpus/**/*.txt",), ("store/*",)),  # the same, by a glob
        (("corpus/drafts/draft.txt", "corpus/keep.txt"), (str(tmp_path / "store" / "drafts"),)),
        (("alias/**/*.txt",), ("corpus/drafts",)),  # the file under a linked parent, the folder by its link
    ]:
        cfg = CorpusConfig(source="text", files=files, exclude=exclude, cache_dir="cache")
        kept, _, n_excluded = text_files(cfg)
        assert [p.name for p in kept] == ["keep.txt"] and n_excluded == 1, (files, exclude)


# ---- a tokens corpus is identified by its bytes -------------------------------------------------------------------


def _same_size_and_mtime(path: Path, data: np.ndarray) -> None:
    """New bytes in ``path`` behind its old size and mtime (what ``cp -p`` or ``rsync -a`` leave)."""
    st = path.stat()
    assert data.nbytes == st.st_size
    data.tofile(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _tokens(root: Path) -> dict:
    rng = np.random.default_rng(0)
    rng.integers(0, 50, 4000).astype(np.uint16).tofile(root / "train.bin")
    rng.integers(0, 50, 400).astype(np.uint16).tofile(root / "val.bin")
    return {"source": "tokens", "train_path": str(root / "train.bin"), "val_path": str(root / "val.bin"),
            "vocab_size": 50, "cache_dir": str(root / "cache")}  # fmt: skip


def test_new_token_bytes_behind_the_same_size_and_mtime_are_a_new_corpus(tmp_path: Path, capsys) -> None:
    cfg = _tokens(tmp_path)
    before = corpus_digest(cfg)
    swapped = np.random.default_rng(1).integers(0, 10, 4000).astype(np.uint16)  # another unigram plateau too
    _same_size_and_mtime(tmp_path / "train.bin", swapped)
    after, summary = corpus_digest(cfg), prepare_corpus(cfg, show_progress=False)
    assert "changed since" in capsys.readouterr().err
    cold = prepare_corpus({**cfg, "cache_dir": str(tmp_path / "cold")}, show_progress=False)  # counted afresh
    assert after != before and after == summary.digest == cold.digest
    assert summary.reference == cold.reference
    assert corpus_digest(cfg) == after and "changed since" not in capsys.readouterr().err  # recounted once


def test_hashing_happens_once_per_process_and_file_version(tmp_path: Path, monkeypatch) -> None:
    from lnblocks.study.lm.data.corpus import tokens

    cfg = _tokens(tmp_path)
    corpus_digest(cfg)  # counted (and hashed on the way)
    reads = []
    real = tokens.file_sha256
    monkeypatch.setattr(tokens, "file_sha256", lambda p, *a: reads.append(p) or real(p, *a))
    corpus_digest(cfg), prepare_corpus(cfg, show_progress=False)  # a driver: the runs' ids, then the check
    assert reads == []  # this process hashed these versions when it counted them
    _same_size_and_mtime(tmp_path / "val.bin", np.arange(400, dtype=np.uint16) % 50)
    corpus_digest(cfg), corpus_digest(cfg)
    assert reads == [tmp_path / "val.bin"]  # the changed file once (the unchanged one is known)


def test_a_study_on_replaced_token_files_trains_new_runs(tmp_path: Path, capsys) -> None:
    from lnblocks.study import run_study

    data = {**_tokens(tmp_path), "seq_len": 8, "batch_size": 2, "eval_batches": 1}
    body = {"data": data, "model": {"dim": 16, "n_heads": 2, "depth": 1}, "train": {"steps": 2},
            "diagnostics": {"every": 0, "init_grad_batches": 0}}  # fmt: skip
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(body))
    out = tmp_path / "out"
    assert run_study(tmp_path / "s.yaml", out, show_progress=False, report=False) == 0
    _same_size_and_mtime(tmp_path / "train.bin", np.random.default_rng(2).integers(0, 50, 4000).astype(np.uint16))
    capsys.readouterr()
    assert run_study(tmp_path / "s.yaml", out, show_progress=False, report=False) == 0
    assert "1 runs, 0 already finished, 1 to run" in capsys.readouterr().out
    assert len(list((out / "runs").glob("*.json"))) == 2  # the old record is kept, not reused


# ---- data clean -----------------------------------------------------------------------------------------------------


def _text_corpus(tmp_path: Path, fraction: float) -> dict:
    path = tmp_path / "texts" / "a.txt"
    path.parent.mkdir(exist_ok=True)
    if not path.exists():
        path.write_text("".join(f"line {i}: some text to train on\n" for i in range(300)))
    return {"source": "text", "files": [str(path)], "val_fraction": fraction, "cache_dir": str(tmp_path / "c")}


def _entries(cache: Path) -> int:
    return sum(1 for p in cache.iterdir() if p.is_dir() and p.name.startswith("text-"))


def test_keep_zero_means_no_bound_for_data_clean_too(tmp_path: Path, monkeypatch, capsys) -> None:
    for fraction in (0.1, 0.2, 0.3):
        prepare_corpus(_text_corpus(tmp_path, fraction), show_progress=False)
    monkeypatch.setenv("LNBLOCKS_CORPUS_KEEP", "0")  # documented: never remove automatically
    assert cli_main(["data", "clean", "--cache-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "removed 0 corpus entries" in out and "kept 3" in out and "no bound" in out
    assert _entries(tmp_path / "c") == 3
    assert cli_main(["data", "clean", "--keep", "0", "--cache-dir", str(tmp_path / "c")]) == 0  # asked for: all
    assert "removed 3 corpus entries" in capsys.readouterr().out and _entries(tmp_path / "c") == 0


def test_cache_dir_naming_the_cache_root_cleans_its_corpus_folder(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("LNBLOCKS_CACHE", str(tmp_path / "root"))
    for fraction in (0.1, 0.2):
        prepare_corpus({**_text_corpus(tmp_path, fraction), "cache_dir": None}, show_progress=False)
    corpora = tmp_path / "root" / "corpus"
    assert _entries(corpora) == 2
    assert cli_main(["data", "clean", "--keep", "1", "--cache-dir", str(tmp_path / "root")]) == 0
    assert capsys.readouterr().out.startswith(f"corpus cache {corpora}: removed 1 corpus entry")
    assert _entries(corpora) == 1
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "notes.txt").write_text("mine")
    assert cli_main(["data", "clean", "--all", "--cache-dir", str(tmp_path / "elsewhere")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "nothing removed, it holds no corpus cache" in out[0] and "$LNBLOCKS_CACHE" in out[0]
    assert (tmp_path / "elsewhere" / "notes.txt").read_text() == "mine"
