"""The runner: atomic writes, skipping finished runs, redoing killed ones, and a whole study end to end on the
synthetic source (records, summary.csv, plots, report.md), through the Python API, the CLI and worker processes."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lnblocks.cli import main as cli_main
from lnblocks.study import build_report, load_study, run_study
from lnblocks.study.core.atomic import TMP_MARK, remove_stale_tmp, write_json_atomic
from lnblocks.study.core.outdir import check_record
from lnblocks.study.core.records import RecordError
from lnblocks.study.core.tasks import read_record

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "configs" / "tiny.yaml"


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_atomic_write_replaces_whole_files_and_leaves_no_tmp(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"a": [2, 3]})
    assert json.loads(path.read_text()) == {"a": [2, 3]}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
    with pytest.raises(ValueError):  # NaN is not JSON: the write fails before the old file is touched
        write_json_atomic(path, {"a": float("nan")})
    assert json.loads(path.read_text()) == {"a": [2, 3]}


def test_stale_tmp_files_of_dead_processes_are_removed(tmp_path: Path) -> None:
    stale = tmp_path / f".x.json{TMP_MARK}{dead_pid()}-0123abcd"
    live = tmp_path / f".y.json{TMP_MARK}{os.getppid()}-0123abcd"  # our parent is alive: maybe another runner writing
    stale.write_text("{partial")
    live.write_text("{partial")
    # what lnblocks did not write stays, whatever its name looks like
    users = [
        ".notes.tmp-old",
        f".notes.tmp-{dead_pid()}",
        f".n{TMP_MARK}{dead_pid()}",
        f"x{TMP_MARK}{dead_pid()}-0123abcd",
    ]
    for name in users:
        (tmp_path / name).write_text("keep")
    assert remove_stale_tmp(tmp_path) == [stale]
    assert live.exists() and not stale.exists() and all((tmp_path / n).read_text() == "keep" for n in users)
    assert tmp_path / ".notes.tmp-old" not in remove_stale_tmp(tmp_path, every=True)
    assert not live.exists()


def test_incomplete_records_are_not_finished(tmp_path: Path) -> None:
    p = tmp_path / "r.json"
    p.write_text('{"format": "lnblocks.study.run/1", "status": "fini')  # truncated
    with pytest.raises(RecordError, match=r"r\.json: is not valid JSON"):
        read_record(p)
    p.write_text(json.dumps({"format": "lnblocks.study.run/2", "task": "lm", "id": "r", "status": "running"}))
    with pytest.raises(RecordError, match=r"r\.json: labels is missing"):
        read_record(p)
    assert check_record(tmp_path, "r") is not None and check_record(tmp_path, "missing") == "missing"


def test_end_to_end_resume_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert run_study(TINY, out, show_progress=False) == 0
    ids = [r.run_id for r in load_study(TINY).runs()]
    records = {i: json.loads((out / "runs" / f"{i}.json").read_text()) for i in ids}
    assert len(records) == 8
    rec = records[ids[0]]
    res = rec["result"]
    assert rec["status"] == "finished" and len(res["loss"]) == 20 and res["steps_done"] == 20
    assert rec["config"]["model"]["placement"] == "pre" and rec["labels"]["model.depth"] == "1"
    assert rec["format"] == "lnblocks.study.run/2" and rec["env"]["threads"] == 1
    assert set(res["diagnostics"][0]) >= {
        "grad_norm",
        "update_ratio",
        "residual_rms",
        "attn_max_logit",
        "max_output_logit",
        "grad_norm_total",
    }
    # the Markov task: everything sits between the entropy floor and the initial loss
    for r in records.values():
        assert r["result"]["reference"]["floor"] < r["result"]["eval"]["final"] < r["result"]["eval"]["init"]
    with open(out / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8 and {r["arch"] for r in rows} == {"pre", "post"}
    report = (out / "report.md").read_text()
    assert "## Findings" in report and "Gradient profile at init" in report and "plots/loss_vs_lr.png" in report
    for name in ("grad_profile", "loss_vs_lr", "loss_curves", "grad_norm_curves", "residual_curves", "diagnostics"):
        assert (out / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "8 runs, 0 already finished, 8 to run" in printed and "| arch | depth | warmup |" in printed

    # Simulated kill: one record truncated mid-write by hand, one temp file of a dead process left behind.
    victim = out / "runs" / f"{ids[3]}.json"
    victim.write_text(victim.read_text()[:100])
    tmp = out / "runs" / f".{ids[3]}.json{TMP_MARK}{dead_pid()}-0123abcd"
    tmp.write_text("{")
    before = {i: (out / "runs" / f"{i}.json").stat().st_mtime_ns for i in ids if i != ids[3]}
    assert run_study(TINY, out, show_progress=False, report=False) == 0
    assert "8 runs, 7 already finished, 1 to run" in capsys.readouterr().out
    assert not tmp.exists()
    assert json.loads(victim.read_text())["result"] == records[ids[3]]["result"]  # redone from scratch, same seed
    assert all((out / "runs" / f"{i}.json").stat().st_mtime_ns == t for i, t in before.items())  # untouched

    # The report is rebuilt from runs/ alone.
    (out / "report.md").unlink()
    (out / "summary.csv").unlink()
    assert build_report(out, plots=False, echo=False) == 0
    assert (out / "report.md").exists() and (out / "summary.csv").exists()


def test_cli_workers_and_kill_midway(tmp_path: Path) -> None:
    """A real SIGKILL while runs are in flight (two worker processes): finished records survive intact, no partial
    file is left, and the same command finishes the rest without redoing anything."""
    cfg = tmp_path / "kill.yaml"
    tiny = TINY.read_text().split("grid:")[0]  # same runs as tiny.yaml, but longer and over seeds
    cfg.write_text(
        tiny.replace("steps: 20", "steps: 100") + "grid: {model.placement: [pre, post], train.seed: [0, 1, 2]}\n"
    )
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "lnblocks.cli", "study", "run", str(cfg), "--out", str(out), "--workers", "2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and not list((out / "runs").glob("*.json")):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the runner and its workers
    proc.wait()
    done = {p.name: p.read_bytes() for p in (out / "runs").glob("*.json")}
    assert 1 <= len(done) < 6, "kill the study while runs are still in flight"
    assert all(read_record(out / "runs" / n).status == "finished" for n in done)
    assert cli_main(["study", "run", str(cfg), "--out", str(out), "--workers", "1"]) == 0
    assert len(list((out / "runs").glob("*.json"))) == 6
    assert not list((out / "runs").glob(".*tmp*"))
    assert all((out / "runs" / n).read_bytes() == b for n, b in done.items())
    assert cli_main(["study", "report", str(out)]) == 0


def test_bad_workers_value() -> None:
    with pytest.raises(ValueError, match="workers must be an int >= 1"):
        run_study(TINY, "unused", workers=0)
