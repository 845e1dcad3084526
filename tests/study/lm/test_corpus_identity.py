"""What a run trained on is part of its id and its record keeps the corpus by digest and a summary,
not the list of its files: after the corpus's files are replaced a rerun trains new runs and the
report holds only them (never a mix of old and new corpora); touching or moving the files without changing them
changes nothing; a study file that pins ``data.corpus`` refuses another corpus; a run handed a digest its worker
cannot find refuses to train."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from lnblocks.cli import main as cli_main
from lnblocks.study import load_study, read_record, run_study, train_run
from lnblocks.study.lm.task import resolve_runs

SMALL = {"model": {"dim": 16, "n_heads": 2, "depth": 1}, "train": {"steps": 3},
         "diagnostics": {"every": 0, "init_grad_batches": 0}}  # fmt: skip


def corpus(root: Path, n: int, text: str) -> None:
    (root / "src").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (root / "src" / f"f{i:03d}.txt").write_text(f"{text} {i}\n" * 40)


def text_study(root: Path, files: list[str], **data: object) -> Path:
    cfg = root / "s.yaml"
    body = {"data": {"source": "text", "files": files, "seq_len": 8, "batch_size": 2, "eval_batches": 1,
                     "cache_dir": str(root / "cache"), **data}, **SMALL, "grid": {"train.seed": [0, 1]}}  # fmt: skip
    cfg.write_text(yaml.safe_dump(body))
    return cfg


def test_a_changed_corpus_is_new_runs_and_an_unchanged_one_is_not(tmp_path: Path, capsys) -> None:
    corpus(tmp_path, 300, "the quick brown fox")
    files = [str(tmp_path / "src" / f"f{i:03d}.txt") for i in range(300)]  # listed one by one: 300 paths
    cfg, out = text_study(tmp_path, files), tmp_path / "out"
    assert run_study(cfg, out, show_progress=False, report=False) == 0
    first = {p.name for p in (out / "runs").glob("*.json")}
    rec = read_record(next((out / "runs").glob("*.json")))
    raw = (out / "runs" / f"{rec.id}.json").read_text()
    assert "f299.txt" not in raw and len(raw) < 6000  # the corpus by digest and summary, not 300 paths
    assert rec.result.corpus["files"] == 300 and rec.config["data"]["corpus"] == rec.result.corpus["digest"]
    assert rec.config["data"]["corpus"].startswith("sha256:") and "files" not in rec.config["data"]
    assert "f299.txt" in (out / "study.json").read_text()  # the study's options, once per study

    for f in (tmp_path / "src").iterdir():  # touched, same bytes: the same tokens, the same runs
        os.utime(f, (1.0e9, 1.0e9))
    capsys.readouterr()
    assert run_study(cfg, out, show_progress=False, report=False) == 0
    assert "2 runs, 2 already finished, 0 to run" in capsys.readouterr().out

    corpus(tmp_path, 300, "a slow green turtle")  # every file replaced
    assert run_study(cfg, out, show_progress=False, report=True) == 0
    printed, err = capsys.readouterr()
    assert "2 runs, 0 already finished, 2 to run" in printed and "2 record(s) in" in err
    manifest = json.loads((out / "study.json").read_text())
    assert not set(f"{i}.json" for i in manifest["run_ids"]) & first  # the report reads the new runs only
    digests = {read_record(out / "runs" / f"{i}.json").config["data"]["corpus"] for i in manifest["run_ids"]}
    assert len(digests) == 1 and digests != {rec.config["data"]["corpus"]}


def test_a_pinned_corpus_refuses_another_and_a_worker_refuses_a_changed_one(tmp_path: Path, capsys) -> None:
    corpus(tmp_path, 3, "lorem ipsum")
    cfg = text_study(tmp_path, [str(tmp_path / "src" / "*.txt")], corpus="sha256:" + "0" * 32)
    code = cli_main(["study", "run", str(cfg), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "data.corpus pins the corpus sha256:000" in err[0], err

    cfg = text_study(tmp_path, [str(tmp_path / "src" / "*.txt")])
    run = resolve_runs(load_study(cfg).runs())[0]
    corpus(tmp_path, 3, "dolor sit amet")  # changed after the driver fixed the run's corpus
    with pytest.raises(ValueError, match=r"data\.corpus: the corpus changed since this run was set up"):
        train_run(run, show_progress=False)
