"""The corpus cache: a damaged entry is named on stderr and rebuilt, never trusted (token
files checked against the manifest's sizes on every open and its sha256s when ``prepare`` runs; the reference-loss
cache checked against the range of the losses it holds); and the cache is bounded (older versions of a corpus go,
then the least recently used beyond ``LNBLOCKS_CORPUS_KEEP``; never an entry in use), with ``lnblocks data clean``."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lnblocks.cli import main as cli_main
from lnblocks.study.lm.data.corpus import open_corpus, prepare_corpus, reference_losses
from lnblocks.study.lm.data.corpus.cache import corpus_lock

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400)).encode()


def _corpus(tmp_path: Path, name: str = "a.txt", **options) -> dict:
    path = tmp_path / "texts" / name
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(TEXT)
    return {"source": "text", "files": [str(path)], "cache_dir": str(tmp_path / "cache"), **options}


def _entries(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_dir() and p.name.startswith("text-"))


def seal(obj: dict) -> dict:
    from lnblocks.study.lm.data.corpus.cache import (
        seal as sealed,  # imported here: each test fails alone on the old code
    )

    return sealed(obj)


def _ids(path: Path) -> bytes:
    return bytes(np.fromfile(path, np.uint16).astype(np.uint8))


# ---- damaged entries ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete"])
def test_a_damaged_token_file_is_named_and_rebuilt(tmp_path: Path, capsys, damage: str) -> None:
    cfg = _corpus(tmp_path)
    first = prepare_corpus(cfg, show_progress=False)
    train = first.train_path.read_bytes()
    assert _ids(first.train_path) + _ids(first.val_path) == TEXT
    size = len(train)
    if damage == "truncate":
        first.train_path.write_bytes(first.train_path.read_bytes()[:20])
        why = f"train.bin has 20 bytes, the manifest says {size:,}"
    elif damage == "garbage":
        first.train_path.write_bytes(np.random.default_rng(0).integers(0, 2**16, size // 2).astype(np.uint16).tobytes())
        why = "train.bin does not match the sha256 in its manifest"
    else:
        first.train_path.unlink()
        why = "train.bin is missing"
    again = prepare_corpus(cfg, show_progress=False)
    err = capsys.readouterr().err
    assert err.startswith(f"warning: corpus cache '{first.train_path.parent}': {why}") and "; rebuilding it" in err
    assert not again.cached and again.train_path == first.train_path
    assert again.train_tokens == first.train_tokens and again.train_path.read_bytes() == train
    assert prepare_corpus(cfg, show_progress=False).cached and capsys.readouterr().err == ""  # sound again: no warning


def test_open_checks_sizes_and_prepare_checksums(tmp_path: Path, capsys) -> None:
    """A run's source (``open_corpus``) checks the sizes (one stat); the checksums are ``prepare``'s, which a study's
    driver runs once before its runs, so garbage of the right size never reaches them."""
    cfg = _corpus(tmp_path)
    first = prepare_corpus(cfg, show_progress=False)
    val = first.val_path.read_bytes()
    first.val_path.write_bytes(val[:-2])
    src = open_corpus(cfg, seq_len=16, batch_size=2)
    assert "val.bin has" in capsys.readouterr().err and src.val_tokens == first.val_tokens
    del src
    same_size = bytearray(first.val_path.read_bytes())
    same_size[0] ^= 1  # still valid ids: only the checksum sees it
    first.val_path.write_bytes(bytes(same_size))
    open_corpus(cfg, seq_len=16, batch_size=2)
    assert capsys.readouterr().err == ""  # sizes only
    prepare_corpus(cfg, show_progress=False)
    assert "val.bin does not match the sha256" in capsys.readouterr().err
    assert first.val_path.read_bytes() == val


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda m: {**m, "tokens": {"train": 10, "val": 2}}, "meta.json carries no sha256 of its content"),
        (lambda m: {**m, "tokens": {"train": 10, "val": 2}, "sha256": "STALE"}, "meta.json does not match its sha256"),
        (lambda m: seal({**m, "tokens": {"train": 10, "val": m["tokens"]["val"]}}), "train.bin has"),
        (lambda m: seal({**m, "reference": {"uniform": -1.0, "unigram": 99.0}}), "reference uniform -1.0 is not ln V"),
        (lambda m: seal({**m, "reference": {"uniform": math.log(256)}}), "reference must hold exactly"),
        (lambda m: seal({**m, "reference": {"uniform": math.log(256), "unigram": 99.0}}), "reference unigram 99.0 is"),
        (lambda m: "{not json", "meta.json is not readable JSON"),
    ],
)
def test_a_damaged_manifest_is_named_and_rebuilt(tmp_path: Path, capsys, edit, why: str) -> None:
    cfg = _corpus(tmp_path)
    first = prepare_corpus(cfg, show_progress=False)
    meta_path = first.train_path.parent / "meta.json"
    meta = json.loads(meta_path.read_text())
    body = edit({k: v for k, v in meta.items() if k != "sha256"})
    if isinstance(body, dict) and body.get("sha256") == "STALE":
        body["sha256"] = meta["sha256"]  # edited, digest left as it was
    meta_path.write_text(body if isinstance(body, str) else json.dumps(body))
    again = prepare_corpus(cfg, show_progress=False)
    assert why in capsys.readouterr().err
    assert not again.cached and again.to_dict() == {**first.to_dict(), "seconds": again.seconds}


def _token_files(tmp_path: Path, vocab: int = 50) -> dict:
    rng = np.random.default_rng(0)
    rng.integers(0, vocab, 5000).astype(np.uint16).tofile(tmp_path / "train.bin")
    rng.integers(0, vocab, 500).astype(np.uint16).tofile(tmp_path / "val.bin")
    return {"source": "tokens", "train_path": str(tmp_path / "train.bin"), "val_path": str(tmp_path / "val.bin"),
            "vocab_size": vocab, "cache_dir": str(tmp_path / "cache")}  # fmt: skip


@pytest.mark.parametrize(
    ("stored", "why"),
    [
        ({"reference": {"uniform": 1.0}}, "carries no sha256"),  # the shape an older cache or a hand edit has
        ({"reference": {"uniform": -1.0, "unigram": 99.0}, "sha256": "STALE"}, "does not match its sha256"),
        ({"sealed": {"reference": {"uniform": 1.0}, "max_id": 3}}, "reference must hold exactly"),
        ({"sealed": {"reference": {"uniform": -1.0, "unigram": 99.0}, "max_id": 3}}, "reference uniform -1.0"),
        ({"sealed": {"reference": {"uniform": math.log(50), "unigram": 99.0}, "max_id": 3}}, "reference unigram 99"),
        ({"sealed": {"reference": {"uniform": math.log(50), "unigram": 3.0}, "max_id": 50}}, "max_id 50 is not"),
    ],
)
def test_the_reference_loss_cache_is_validated(tmp_path: Path, capsys, stored: dict, why: str) -> None:
    cfg = _token_files(tmp_path)
    train, val = np.fromfile(tmp_path / "train.bin", np.uint16), np.fromfile(tmp_path / "val.bin", np.uint16)
    p = (np.bincount(train, minlength=50) + 1.0) / (len(train) + 50)
    expected = {"uniform": math.log(50), "unigram": float(-np.log(p[val]).mean())}
    assert prepare_corpus(cfg, show_progress=False).reference == pytest.approx(expected, rel=1e-12)
    (entry,) = (tmp_path / "cache" / "reference").glob("*.json")
    sound = json.loads(entry.read_text())
    sealed = stored.get("sealed")
    body = seal({"key": sound["key"], **sealed}) if sealed else {"key": sound["key"], **stored}
    if body.get("sha256") == "STALE":
        body["sha256"] = sound["sha256"]  # edited, digest left as it was
    entry.write_text(json.dumps(body))
    s = prepare_corpus(cfg, show_progress=False)
    err = capsys.readouterr().err
    assert f"warning: reference-loss cache '{entry}': " in err and why in err and "recomputing it" in err
    assert s.reference == pytest.approx(expected, rel=1e-12) and "unigram plateau" in s.describe()
    assert reference_losses(tmp_path / "train.bin", tmp_path / "val.bin", np.dtype("uint16"), 50,
                            cache_dir=tmp_path / "cache") == s.reference  # fmt: skip
    assert capsys.readouterr().err == ""  # rewritten sound


# ---- a bounded cache ----------------------------------------------------------------------------------------


def test_an_edited_input_replaces_its_old_version(tmp_path: Path) -> None:
    cfg = _corpus(tmp_path)
    other = prepare_corpus({**cfg, "val_fraction": 0.2}, show_progress=False)  # another corpus config: kept
    folders = []
    for i in range(3):
        with open(tmp_path / "texts" / "a.txt", "ab") as f:
            f.write(f"edit {i}\n".encode())
        folders.append(prepare_corpus(cfg, show_progress=False).train_path.parent.name)
    assert len(set(folders)) == 3
    assert _entries(tmp_path) == sorted([folders[-1], other.train_path.parent.name])  # one copy per corpus config


def test_least_recently_used_beyond_the_limit_go(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LNBLOCKS_CORPUS_KEEP", "2")
    made = [prepare_corpus(_corpus(tmp_path, val_fraction=f), show_progress=False) for f in (0.1, 0.2)]
    os.utime(made[1].train_path.parent / "used", (time.time() - 60, time.time() - 60))
    prepare_corpus(_corpus(tmp_path, val_fraction=0.1), show_progress=False)  # used again: the most recent
    third = prepare_corpus(_corpus(tmp_path, val_fraction=0.3), show_progress=False)
    assert _entries(tmp_path) == sorted([made[0].train_path.parent.name, third.train_path.parent.name])
    monkeypatch.setenv("LNBLOCKS_CORPUS_KEEP", "0")  # 0: no automatic removal
    prepare_corpus(_corpus(tmp_path, val_fraction=0.4), show_progress=False)
    assert len(_entries(tmp_path)) == 3
    monkeypatch.setenv("LNBLOCKS_CORPUS_KEEP", "many")
    with pytest.raises(ValueError, match=r"^LNBLOCKS_CORPUS_KEEP \(0: never .*\) must be an int >= 0, got 'many'$"):
        prepare_corpus(_corpus(tmp_path, val_fraction=0.45), show_progress=False)


HOLD = """
import sys, time
from pathlib import Path
from lnblocks.study.lm.data.corpus import open_corpus
src = open_corpus({{"source": "text", "files": [{file!r}], "cache_dir": {cache!r}}}, seq_len=8, batch_size=2)
print("open", flush=True)
sys.stdin.readline()  # hold the source (and its lease) until told to stop
src.batch(2, __import__("torch").Generator().manual_seed(0))
print("read", flush=True)
"""


def test_an_entry_in_use_or_being_prepared_is_never_removed(tmp_path: Path, monkeypatch, capsys) -> None:
    cfg = _corpus(tmp_path)
    held = prepare_corpus(cfg, show_progress=False).train_path.parent
    code = HOLD.format(file=cfg["files"][0], cache=cfg["cache_dir"])
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "open"
        monkeypatch.setenv("LNBLOCKS_CORPUS_KEEP", "1")
        prepare_corpus(
            {**cfg, "val_fraction": 0.2}, show_progress=False
        )  # would evict `held`, but another process reads it
        assert held.name in _entries(tmp_path)
        assert cli_main(["data", "clean", "--all", "--cache-dir", cfg["cache_dir"]]) == 0
        assert "1 in use left alone" in capsys.readouterr().out and _entries(tmp_path) == [held.name]
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "read"  # its files were never touched
    finally:
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    evict = importlib.import_module("lnblocks.study.lm.data.corpus.evict")
    with corpus_lock(held):  # being prepared by someone (its lock held): left alone
        assert not evict.remove(held)
    assert evict.remove(held) and _entries(tmp_path) == []


def test_data_clean_command(tmp_path: Path, capsys) -> None:
    cache = str(tmp_path / "cache")
    made = [prepare_corpus(_corpus(tmp_path, val_fraction=f), show_progress=False) for f in (0.1, 0.2, 0.3)]
    for i, s in enumerate(made):  # 0.3 most recent, then 0.2
        os.utime(s.train_path.parent / "used", (time.time() - 100 + i, time.time() - 100 + i))
    tokens = _token_files(tmp_path)
    prepare_corpus(tokens, show_progress=False)
    np.arange(10, dtype=np.uint16).tofile(tmp_path / "val.bin")  # its reference entry can never be hit again
    prepare_corpus(tokens, show_progress=False)
    legacy = tmp_path / "cache" / "hf_datasets" / "json"
    legacy.mkdir(parents=True)  # where datasets' arrow copies went before
    (legacy / "x.arrow").write_bytes(b"x" * 100)
    assert cli_main(["data", "clean", "--keep", "2", "--cache-dir", cache]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"corpus cache {cache}: removed 1 corpus entry and 1 reference-loss file(s)")
    assert "kept 2" in out
    assert _entries(tmp_path) == sorted(s.train_path.parent.name for s in made[1:])
    assert len(list((tmp_path / "cache" / "reference").glob("*.json"))) == 1 and not legacy.exists()
    assert cli_main(["data", "clean", "--all", "--cache-dir", cache]) == 0
    assert "removed 2 corpus entries and 1 reference-loss file(s)" in capsys.readouterr().out
    assert _entries(tmp_path) == [] and not list((tmp_path / "cache" / "reference").glob("*.json"))
    for args, msg in [
        (["--keep", "-1"], "--keep (entries to keep) must be an int >= 0, got '-1'"),
        (["--keep", "two"], "--keep (entries to keep) must be an int >= 0, got 'two'"),
        (["--keep", "1", "--all"], "data clean takes --keep N or --all, not both"),
        (["--cache-dir", str(tmp_path / "nope")], f"--cache-dir: no such folder: '{tmp_path / 'nope'}'"),
    ]:
        assert cli_main(["data", "clean", *args]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [f"lnblocks: error: {msg}"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")  # a folder that is not a cache: nothing of it is touched
    assert cli_main(["data", "clean", "--all", "--cache-dir", str(tmp_path / "mine")]) == 0
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_a_study_run_rebuilds_garbage_before_its_runs(tmp_path: Path, capsys) -> None:
    """Same-size garbage in a cached ``train.bin`` (every id out of range): the driver's check before the runs finds
    it by its checksum and rebuilds it, so the runs train (before: every run failed, and every rerun again)."""
    from lnblocks.study import read_record, run_study

    cfg = _corpus(tmp_path)
    first = prepare_corpus(cfg, show_progress=False)
    first.train_path.write_bytes(b"\xff" * first.train_path.stat().st_size)
    study = tmp_path / "s.yaml"
    data = {**cfg, "seq_len": 16, "batch_size": 2, "eval_batches": 1}
    small = {"model": {"dim": 16, "n_heads": 2, "depth": 1}, "train": {"steps": 2, "log_every": 1},
             "diagnostics": {"every": 0, "init_grad_batches": 0}}  # fmt: skip
    study.write_text(json.dumps({"data": data, **small}))
    assert run_study(study, tmp_path / "out", show_progress=False, report=False) == 0
    assert "train.bin does not match the sha256 in its manifest" in capsys.readouterr().err
    (rec,) = [read_record(p) for p in (tmp_path / "out" / "runs").glob("*.json")]
    assert rec.status == "finished" and rec.result.reference == first.reference
