"""Executors and the runner under faults: a worker killed with SIGKILL fails
only its run and the sweep finishes the rest without hanging; workers die with a killed runner; two runners on one
folder never train the same run; records do not depend on the number of workers."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lnblocks.study import load_study, read_record, run_study
from tests.study.study_helpers import write_study

TINY = (
    "data: {source: markov, vocab_size: 8, seq_len: 8, batch_size: 4, eval_batches: 1}\n"
    "model: {dim: 16, n_heads: 2, depth: 1}\n"
    "diagnostics: {every: 0, init_grad_batches: 0}\n"
)


def executors_study(tmp_path: Path, steps: int, seeds: int) -> Path:
    return write_study(
        tmp_path, "c.yaml", TINY + f"train: {{steps: {steps}}}\ngrid: {{train.seed: {list(range(seeds))}}}\n"
    )


def start(cfg: Path, out: Path, workers: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "lnblocks.cli", "study", "run", str(cfg), "--out", str(out), "--workers", str(workers)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def workers_of(pid: int) -> list[int]:
    """Pids of the spawned worker processes whose parent is ``pid`` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"spawn_main" in cmdline:
            out.append(int(entry.name))
    return sorted(out)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, FileNotFoundError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_killed_worker_fails_only_its_run_and_the_sweep_finishes(tmp_path: Path) -> None:
    cfg, out = executors_study(tmp_path, steps=2000, seeds=4), tmp_path / "out"
    proc = start(cfg, out, workers=2)
    try:
        wait_for(lambda: len(list((out / "runs").glob("*.lock"))) == 2 and len(workers_of(proc.pid)) == 2)
        victim = workers_of(proc.pid)[0]
        os.kill(victim, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=300)  # never hangs
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, stderr
    assert f"the worker process (pid {victim}) training it died (killed by SIGKILL; out of memory or killed)" in stderr
    assert "rerun the same command to retry it" in stderr
    records = list((out / "runs").glob("*.json"))
    assert len(records) == 3 and not list((out / "runs").glob("*.lock"))  # the three others finished
    assert all(read_record(p).status == "finished" for p in records)
    assert "4 runs, 3 already finished, 1 to run" in subprocess.run(
        [sys.executable, "-m", "lnblocks.cli", "study", "run", str(cfg), "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip


def test_workers_die_with_a_killed_runner(tmp_path: Path) -> None:
    cfg, out = executors_study(tmp_path, steps=5000, seeds=2), tmp_path / "out"
    proc = start(cfg, out, workers=2)
    try:
        wait_for(lambda: len(workers_of(proc.pid)) == 2 and len(list((out / "runs").glob("*.lock"))) == 2)
        workers = workers_of(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # the runner only, not its process group
        proc.wait(timeout=30)
        wait_for(lambda: not any(alive(w) for w in workers), timeout=20)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if any(alive(w) for w in workers_of(proc.pid)) else None
    assert not list((out / "runs").glob("*.json"))


def test_two_runners_on_one_folder_never_train_the_same_run(tmp_path: Path) -> None:
    cfg, out = executors_study(tmp_path, steps=150, seeds=6), tmp_path / "out"
    ids = {r.run_id for r in load_study(cfg).runs()}
    a, b = start(cfg, out, workers=1), start(cfg, out, workers=1)
    outs = [p.communicate(timeout=600) for p in (a, b)]
    assert a.returncode == 0 and b.returncode == 0, outs
    trained = [{line.split(":")[0] for line in o.splitlines() if ": eval loss" in line} for o, _ in outs]
    assert not trained[0] & trained[1]  # no run trained twice
    assert trained[0] | trained[1] == ids
    assert {p.stem for p in (out / "runs").glob("*.json")} == ids


def test_records_do_not_depend_on_the_number_of_workers(tmp_path: Path) -> None:
    """Each run pins its threads (``train.threads``, default 1) in whichever process trains it, so one worker (this
    process) and two worker processes give bit-identical records apart from timing, host and pid."""
    cfg = executors_study(tmp_path, steps=30, seeds=3)
    cfg.write_text(cfg.read_text().replace("{every: 0, init_grad_batches: 0}", "{every: 10, init_grad_batches: 1}"))
    if importlib.util.find_spec("tensorboard") is not None:  # curves too: written live by each worker process
        cfg.write_text(cfg.read_text() + "tracking: {tensorboard: true}\n")
    for workers in (1, 2):
        assert run_study(cfg, tmp_path / f"w{workers}", workers=workers, show_progress=False, report=False) == 0
    for path in (tmp_path / "w1" / "runs").glob("*.json"):
        one, two = read_record(path), read_record(tmp_path / "w2" / "runs" / path.name)
        assert one.env["threads"] == two.env["threads"] == 1
        assert one.deterministic_json() == two.deterministic_json()
        assert json.dumps(one.to_json()["result"]) == json.dumps(two.to_json()["result"])
        if importlib.util.find_spec("tensorboard") is not None:
            from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

            curves = []
            for w in ("w1", "w2"):
                acc = EventAccumulator(str(tmp_path / w / "tensorboard" / path.stem), size_guidance={"scalars": 0})
                acc.Reload()
                curves.append({t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]})
            assert curves[0] == curves[1] and len(curves[0]["loss/train"]) == 30
