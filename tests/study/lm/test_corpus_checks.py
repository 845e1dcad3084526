"""What is checked about a study's data before any run trains, once, as one line and
exit status 2: a corpus shorter than ``seq_len + 1``; a ``vocab_size`` more than 4x the ids the data can hold
(unless ``allow_unused_vocab``); train and held-out data that are the same. Warned about once: ``uint32`` ids read as
``uint16``, a unigram plateau above ln V."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from lnblocks.cli import main as cli_main
from lnblocks.config import ConfigValueError
from lnblocks.study.lm.data.corpus import CorpusConfig, prepare_corpus

SMALL = {
    "model": {"dim": 16, "n_heads": 2, "depth": 1},
    "train": {"steps": 2, "log_every": 1},
    "diagnostics": {"every": 0, "init_grad_batches": 0},
}


def _tokens(tmp_path: Path, train: np.ndarray, val: np.ndarray, dtype: str = "uint16") -> tuple[str, str]:
    train.astype(dtype).tofile(tmp_path / "train.bin")
    val.astype(dtype).tofile(tmp_path / "val.bin")
    return str(tmp_path / "train.bin"), str(tmp_path / "val.bin")


def _study(tmp_path: Path, data: dict, grid: dict | None = None) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"data": {"cache_dir": str(tmp_path / "cache"), **data}, **SMALL, "grid": grid or {}}))
    return str(path)


def _one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith("lnblocks: error: ")
    return err[0][len("lnblocks: error: ") :]


def _zipf(n: int, vocab: int, seed: int) -> np.ndarray:
    p = 1.0 / np.arange(1, vocab + 1)
    return np.random.default_rng(seed).choice(vocab, size=n, p=p / p.sum())


# ---- too short for seq_len ------------------------------------------------------------------------------------


def test_a_corpus_shorter_than_a_window_fails_before_any_run(tmp_path: Path, capsys) -> None:
    train, val = _tokens(tmp_path, _zipf(5000, 64, 0), _zipf(20, 64, 1))
    data = {"source": "tokens", "train_path": train, "val_path": val, "vocab_size": 64, "batch_size": 2}
    cfg = _study(tmp_path, data, {"data.seq_len": [8, 32]})
    assert cli_main(["data", "prepare", cfg]) == 2  # the seq_len 32 run
    msg = _one_error_line(capsys)
    assert msg.startswith("seq_len: 32 needs windows of 33 tokens, but the val split of the corpus has 20 (")
    assert cli_main(["study", "run", cfg, "--out", str(tmp_path / "out")]) == 2
    assert _one_error_line(capsys).startswith("seq_len: 32 needs windows of 33 tokens")
    assert list((tmp_path / "out" / "runs").glob("*.json")) == []  # nothing trained, not even the seq_len 8 run

    text = tmp_path / "short.txt"
    text.write_bytes(b"a few bytes of text,\nfar fewer than a window.\n")
    cfg = _study(tmp_path, {"source": "text", "files": [str(text)], "seq_len": 24, "batch_size": 2})
    assert cli_main(["study", "run", cfg, "--out", str(tmp_path / "out2")]) == 2  # 21 bytes of train, 25 of val
    assert _one_error_line(capsys).startswith("seq_len: 24 needs windows of 25 tokens, but the train split")


# ---- vocab_size far above the ids ------------------------------------------------------------------------------


def test_a_vocab_size_far_above_the_ids_is_refused_unless_allowed(tmp_path: Path, capsys) -> None:
    train, val = _tokens(tmp_path, _zipf(5000, 100, 0), _zipf(500, 100, 1))
    top = int(max(np.fromfile(train, np.uint16).max(), np.fromfile(val, np.uint16).max()))
    base = {"source": "tokens", "train_path": train, "val_path": val, "cache_dir": str(tmp_path / "c")}
    assert prepare_corpus({**base, "vocab_size": 4 * (top + 1)}, show_progress=False).vocab_size == 4 * (
        top + 1
    )  # the edge
    with pytest.raises(ValueError, match=rf"^vocab_size: {4 * (top + 1) + 1:,} is more than 4x the {top + 1} ids the "
                                         rf"token files use \(max id {top}\).*allow_unused_vocab: true"):  # fmt: skip
        prepare_corpus({**base, "vocab_size": 4 * (top + 1) + 1}, show_progress=False)
    s = prepare_corpus({**base, "vocab_size": 50_000, "allow_unused_vocab": True}, show_progress=False)
    assert s.reference["uniform"] == pytest.approx(math.log(50_000))

    cfg = _study(tmp_path, {"source": "text", "files": [train], "vocab_size": 1025, "seq_len": 8})  # bytes: 256 ids
    assert cli_main(["data", "prepare", cfg]) == 2
    assert _one_error_line(capsys).startswith("vocab_size: 1,025 is more than 4x the 256 ids the tokenizer 'bytes'")
    cfg = _study(tmp_path, {"source": "text", "files": [train], "vocab_size": 1024, "seq_len": 8})
    assert cli_main(["data", "prepare", cfg]) == 0


def test_later_keys_leave_run_ids_alone(tmp_path: Path) -> None:
    """The keys added here are left out of a run's config while at their defaults: every earlier run id holds."""
    from lnblocks.study import load_study

    train, val = _tokens(tmp_path, _zipf(5000, 100, 0), _zipf(500, 100, 1))
    data = {"source": "tokens", "train_path": train, "val_path": val, "vocab_size": 100}
    (run,) = load_study(_study(tmp_path, data)).runs()
    assert not {"exclude", "skip_undecodable", "allow_unused_vocab"} & set(run.to_dict()["data"])
    (allowed,) = load_study(_study(tmp_path, {**data, "allow_unused_vocab": True})).runs()
    assert allowed.to_dict()["data"]["allow_unused_vocab"] is True and allowed.run_id != run.run_id


# ---- train and held-out data that are the same ----------------------------------------------------------------


def test_train_and_val_that_are_the_same_are_refused(tmp_path: Path) -> None:
    train, _ = _tokens(tmp_path, _zipf(5000, 64, 0), _zipf(500, 64, 1))
    with pytest.raises(ConfigValueError, match=r"^data\.val_path is the same file as train_path \('.*train\.bin'\)"):
        CorpusConfig.from_dict({"source": "tokens", "train_path": train, "val_path": train, "vocab_size": 64},
                               key="data")  # fmt: skip
    link = tmp_path / "link.bin"
    link.symlink_to(train)
    with pytest.raises(ConfigValueError, match=r"^data\.val_path is the same file as train_path"):
        CorpusConfig.from_dict({"source": "tokens", "train_path": train, "val_path": str(link), "vocab_size": 64},
                               key="data")  # fmt: skip
    copy = tmp_path / "copy.bin"
    copy.write_bytes(Path(train).read_bytes())
    with pytest.raises(ValueError, match=r"^val_path: '.*copy\.bin' holds the same tokens as train_path"):
        prepare_corpus({"source": "tokens", "train_path": train, "val_path": str(copy), "vocab_size": 64,
                 "cache_dir": str(tmp_path / "c")}, show_progress=False)  # fmt: skip
    with pytest.raises(ConfigValueError, match=r"^data\.val_split is the split trained on \('train', the key split\)"):
        CorpusConfig.from_dict({"source": "hf_dataset", "dataset": str(tmp_path), "val_split": "train"}, key="data")
    with pytest.raises(ConfigValueError, match=r"^data\.val_split is the split trained on \('all'"):
        CorpusConfig.from_dict({"source": "hf_dataset", "dataset": str(tmp_path), "split": "all", "val_split": "all"},
                               key="data")  # fmt: skip


# ---- warnings: a wrong dtype, a plateau above ln V ------------------------------------------------------------


def test_uint32_ids_read_as_uint16_are_warned_about_once(tmp_path: Path, capsys) -> None:
    train, val = _tokens(tmp_path, _zipf(20_000, 300, 0), _zipf(2000, 300, 1), dtype="uint32")
    data = {"source": "tokens", "train_path": train, "val_path": val, "vocab_size": 300, "seq_len": 8, "batch_size": 2}
    cfg = _study(tmp_path, data, {"train.lr": [1e-3, 2e-3]})
    assert cli_main(["data", "prepare", cfg]) == 0
    out = capsys.readouterr().out
    assert "warning: train_path: every odd uint16 of" in out and "uint32 ids read as uint16?" in out
    assert "warning: val_path: every odd uint16" in out
    assert cli_main(["study", "run", cfg, "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: train_path: every odd uint16") == 1  # once for the study, not once per run
    right = _study(tmp_path, {**data, "token_dtype": "uint32"})
    assert cli_main(["data", "prepare", right]) == 0 and "warning" not in capsys.readouterr().out


def test_a_plateau_above_ln_v_is_warned_about(tmp_path: Path, capsys) -> None:
    rng = np.random.default_rng(0)
    train, val = _tokens(tmp_path, rng.integers(0, 10, 5000), rng.integers(10, 100, 500))  # disjoint ids
    s = prepare_corpus({"source": "tokens", "train_path": train, "val_path": val, "vocab_size": 100,
                 "cache_dir": str(tmp_path / "c")}, show_progress=False)  # fmt: skip
    assert s.reference["unigram"] > s.reference["uniform"]
    assert any(w.startswith("the unigram plateau") and "exceeds ln V = 4.6052" in w for w in s.warnings)
    assert "warning: the unigram plateau" in s.describe()
    fine = _tokens(tmp_path, _zipf(5000, 100, 0), _zipf(500, 100, 1))
    s = prepare_corpus({"source": "tokens", "train_path": fine[0], "val_path": fine[1], "vocab_size": 100,
                 "cache_dir": str(tmp_path / "c")}, show_progress=False)  # fmt: skip
    assert s.warnings == ()
