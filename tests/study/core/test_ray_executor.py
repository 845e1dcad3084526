"""The Ray executor on a local Ray instance with 2 CPUs, shared by the tests of this module:
records equal to the local executor's apart from timing and host fields (TensorBoard curves too: replayed from the
records as they arrive vs logged live), a worker process killed mid-run is retried by Ray and resumes from its
checkpoint, a run that raised is recorded as failed, resources the cluster lacks are refused at once, and Ctrl-C
cancels."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from lnblocks.study import load_study, read_record, run_study, train_run
from lnblocks.study.core.ray_executor import TASK_PREFIX

pytest.importorskip("ray")
pytest.importorskip("tensorboard")

from tests.study.study_helpers import read_scalars, write_study

pytestmark = pytest.mark.usefixtures("ray_instance")  # core/conftest.py: one Ray instance for the module

TINY = (
    "data: {source: markov, vocab_size: 8, seq_len: 8, batch_size: 4, eval_batches: 1}\n"
    "model: {dim: 16, n_heads: 2, depth: 1}\n"
)


def ray_study(tmp_path: Path, text: str) -> Path:
    return write_study(tmp_path, "c.yaml", TINY + text)


def running_tasks() -> dict[int, str]:
    """Pid -> process title of the Ray workers training a run now (Ray titles them ``ray::<task name>``)."""
    out = {}
    for entry in Path("/proc").iterdir():
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0")[0].decode()
        except (OSError, UnicodeDecodeError):
            continue
        if title.startswith(f"ray::{TASK_PREFIX}"):
            out[int(entry.name)] = title
    return out


def test_ray_records_and_curves_equal_the_local_executors(tmp_path: Path) -> None:
    cfg = ray_study(
        tmp_path,
        "train: {steps: 30, eval_every: 10}\ndiagnostics: {every: 10, init_grad_batches: 1, probe_batch_size: 2}\n"
        "tracking: {tensorboard: true}\ngrid: {train.seed: [0, 1, 2]}\n",
    )
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert run_study(cfg, local, show_progress=False, report=False) == 0
    t0 = time.perf_counter()
    assert run_study(cfg, remote, show_progress=False, report=False, executor="ray") == 0
    ray_s = time.perf_counter() - t0
    ids = [r.run_id for r in load_study(cfg).runs()]
    for run_id in ids:
        a, b = read_record(local / "runs" / f"{run_id}.json"), read_record(remote / "runs" / f"{run_id}.json")
        assert a.deterministic_json() == b.deterministic_json()  # bit-identical apart from time, host and pid
        assert b.env["threads"] == 1
        live, replayed = read_scalars(local / "tensorboard" / run_id), read_scalars(remote / "tensorboard" / run_id)
        assert live == replayed and len(live["loss/train"]) == 30 and len(live["loss/eval"]) == 4
    # resume: every run has its record, nothing is submitted again
    t0 = time.perf_counter()
    assert run_study(cfg, remote, show_progress=False, report=False, executor="ray") == 0
    assert time.perf_counter() - t0 < ray_s


def test_a_killed_worker_is_retried_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """Ray's retry of a run whose worker was SIGKILLed continues from the run's newest checkpoint
    (``train.checkpoint``, in ``OUT/checkpoints/<run id>/``, a folder the worker reaches: this machine) and the
    record equals the uninterrupted run's."""
    cfg = ray_study(
        tmp_path,
        "train: {steps: 1000, checkpoint: {every: 100}}\ndiagnostics: {every: 0, init_grad_batches: 0}\n",
    )
    (run,) = load_study(cfg).runs()
    folder = tmp_path / "out" / "checkpoints" / run.run_id
    killed: list[int] = []

    def kill_after_a_checkpoint() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            tasks = running_tasks()
            if tasks and list(folder.glob("step-*")):
                pid = next(iter(tasks))
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.01)

    killer = threading.Thread(target=kill_after_a_checkpoint, daemon=True)
    killer.start()
    assert run_study(cfg, tmp_path / "out", show_progress=False, report=False, executor="ray") == 0
    killer.join(timeout=5)
    assert killed, "no Ray task was seen training past a checkpoint"
    rec = read_record(tmp_path / "out" / "runs" / f"{run.run_id}.json")
    assert rec.status == "finished" and rec.result.steps_done == 1000
    assert rec.env["pid"] != killed[0]  # trained on, by another worker process
    assert rec.env["resumed_from"] and rec.env["resumed_from"][0] % 100 == 0  # not from step 0
    assert rec.deterministic_json() == train_run(run, show_progress=False).deterministic_json()
    assert not folder.exists()  # removed once the record was written


def test_a_run_that_raised_is_recorded_as_failed_and_bad_resources_are_refused(tmp_path: Path, capsys) -> None:
    cfg = ray_study(tmp_path, "train: {steps: 2, device: cuda}\ngrid: {train.seed: [0]}\n")  # no CUDA here
    assert run_study(cfg, tmp_path / "out", show_progress=False, report=False, executor="ray") == 1
    err = capsys.readouterr().err
    assert "failed: ValueError: train.device is 'cuda' but no CUDA device is available" in err
    assert not list((tmp_path / "out" / "runs").glob("*.json")) and not list((tmp_path / "out" / "runs").glob("*.lock"))

    gpu = ray_study(tmp_path, "train: {steps: 2}\nresources: {gpus_per_run: 1}\n")
    with pytest.raises(
        ValueError, match=r"asks the Ray cluster for 1 CPU\(s\) and 1 GPU\(s\).*has 2 CPU\(s\) and 0 GPU"
    ):
        run_study(gpu, tmp_path / "gpu", show_progress=False, report=False, executor="ray")


def test_ctrl_c_cancels_the_runs_in_flight(tmp_path: Path) -> None:
    cfg = ray_study(
        tmp_path, "train: {steps: 100000}\ndiagnostics: {every: 0, init_grad_batches: 0}\ngrid: {train.seed: [0, 1]}\n"
    )

    def interrupt() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not running_tasks():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_study(cfg, tmp_path / "out", show_progress=False, report=False, executor="ray")
    deadline = time.monotonic() + 30
    while running_tasks() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running_tasks()  # the tasks were cancelled, their processes ended
    runs = tmp_path / "out" / "runs"
    assert not list(runs.glob("*.json")) and not list(runs.glob("*.lock"))


def test_init_profiles_as_ray_tasks_equal_the_in_process_ones() -> None:
    """The report's init-profile jobs (``core.executors.Job.call``) run as Ray tasks with the same bits."""
    from lnblocks.study import RunConfig
    from lnblocks.study.core.ray_executor import RayExecutor
    from lnblocks.study.lm.config import InitProfileConfig
    from lnblocks.study.lm.report import init_profile as ip

    base = {"data": {"source": "markov", "vocab_size": 8, "seq_len": 8, "batch_size": 4, "eval_batches": 1},
            "diagnostics": {"probe_batch_size": 2}}  # fmt: skip
    runs = {(p, 2): RunConfig.from_dict({**base, "model": {"dim": 16, "n_heads": 2, "depth": 2, "placement": p}})
            for p in ("pre", "post")}  # fmt: skip
    settings = InitProfileConfig(seeds=3, batches=2, first_seed=4)
    here = ip.compute_profiles(runs, settings)
    assert ip.compute_profiles(runs, settings, open_executor=lambda n: RayExecutor()) == here
