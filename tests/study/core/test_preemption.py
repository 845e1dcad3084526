"""SIGTERM, what Slurm sends a preempted job before SIGKILL (``lnblocks.study.core.preemption``): a run that
checkpoints writes a checkpoint of its next step and stops, the runner starts nothing more, writes no report and
exits with 143 after one line; the rerun resumes each stopped run from exactly that step, to the record of the
uninterrupted run (byte for byte apart from timing and host fields). In one process (the runner trains) and with
``--workers 2`` (the runner gets the signal and forwards it to its busy workers)."""

from __future__ import annotations

import signal
from pathlib import Path

from lnblocks.study import load_study, read_record
from lnblocks.study.core import preemption
from tests.study.study_helpers import EVERY, STEPS, same_record, study_cli

QUICK_REPORT = ("--set", "analysis.init_profile.batches=1")


def steps_saved(folder: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in folder.iterdir() if p.name.startswith("step-"))


def reference_of(long_reference: dict, placement: str):
    (path,) = (long_reference[placement] / "runs").glob("*.json")
    return read_record(path)


def test_sigterm_checkpoints_the_next_step_and_the_rerun_resumes_there(
    long_study: Path, long_reference: dict, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    first = study_cli(long_study, out, fault="term-at-step@7")  # between the checkpoints of steps 5 and 10
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-2000:]
    lines = [line for line in first.stderr.splitlines() if line.startswith("lnblocks: ")]
    assert lines == [
        "lnblocks: stopped by SIGTERM: 1 run(s) checkpointed where they were, 1 without a record in all; rerun the "
        "same command to resume (no report was written)"
    ], first.stderr[-2000:]
    assert not list((out / "runs").glob("*.json")) and not (out / "report.md").exists()
    (folder,) = (out / "checkpoints").iterdir()
    assert steps_saved(folder) == [EVERY, 8]  # the periodic one, and the one SIGTERM asked for
    second = study_cli(long_study, out, *QUICK_REPORT)
    assert second.returncode == 0, second.stderr[-2000:]
    (run,) = load_study(long_study).runs()
    rec = read_record(out / "runs" / f"{run.run_id}.json")
    assert rec.env["resumed_from"] == [8] and rec.result.steps_done == STEPS
    assert same_record(rec, reference_of(long_reference, run.model.placement)) == []


def test_sigterm_to_the_runner_reaches_its_busy_workers(long_study: Path, long_reference: dict, tmp_path: Path) -> None:
    """Each worker signals the runner at its step 7; the runner forwards SIGTERM to its busy workers, which
    checkpoint at their next step (wherever each is then: one that started later may be at step 1) and stop, and
    it hands out nothing more (a worker that was not ready yet never gets its run, which the rerun trains whole)."""
    cfg = tmp_path / "grid.yaml"
    cfg.write_text(long_study.read_text() + "grid: {model.placement: [pre, post]}\n")
    out = tmp_path / "out"
    first = study_cli(cfg, out, "--workers", "2", fault="term-parent-at-step@7")
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-2000:]
    assert not list((out / "runs").glob("*.json"))
    stopped = {f.name: steps_saved(f)[-1] for f in (out / "checkpoints").iterdir() if steps_saved(f)}
    assert stopped and all(0 < step < STEPS for step in stopped.values()), stopped
    assert f"lnblocks: stopped by SIGTERM: {len(stopped)} run(s) checkpointed where they were" in first.stderr
    second = study_cli(cfg, out, "--workers", "2", *QUICK_REPORT)
    assert second.returncode == 0, second.stderr[-2000:]
    for run in load_study(cfg).runs():
        rec = read_record(out / "runs" / f"{run.run_id}.json")
        assert rec.env.get("resumed_from") == ([stopped[run.run_id]] if run.run_id in stopped else None)
        assert rec.result.steps_done == STEPS
        ref = reference_of(long_reference, run.model.placement)
        assert {k: v for k, v in rec.deterministic_json().items() if k not in ("id", "labels")} == {
            k: v for k, v in ref.deterministic_json().items() if k not in ("id", "labels")
        }


def test_the_handler_is_installed_only_where_asked_and_reset_after() -> None:
    assert not preemption.requested()
    before = signal.getsignal(signal.SIGTERM)  # what the process had (pytest's, or the default): restored after
    calls: list[int] = []
    stop = preemption.forward_to(lambda: calls.append(1) or [])
    try:
        assert preemption.install() and preemption.install()  # idempotent
        signal.raise_signal(signal.SIGTERM)  # handled: this process goes on
        assert preemption.requested() and calls == [1]
    finally:
        stop()
        preemption.reset()
    assert signal.getsignal(signal.SIGTERM) == before and not preemption.requested()


def test_a_sweep_in_this_process_leaves_the_sigterm_handler_as_it_was(long_study: Path, tmp_path: Path) -> None:
    from lnblocks.study import run_study

    before = signal.getsignal(signal.SIGTERM)
    assert run_study(long_study, tmp_path, show_progress=False, report=False, overrides={"train.steps": 6}) == 0
    assert signal.getsignal(signal.SIGTERM) == before and not preemption.requested()


def test_sigterm_to_one_worker_stops_its_run_only_and_counts_in_the_exit_status(
    long_study: Path, tmp_path: Path
) -> None:
    """A SIGTERM to one worker of a pool (a user's ``kill <pid>``, an out-of-memory daemon), not to the runner: that
    worker's run checkpoints and stops, the worker ends and another takes its place, so the runs after it train to
    their last step (a worker left with its stop flag set stopped every later run at its first step); the stopped
    run counts in the exit status (1, not 0) and the rerun resumes it."""
    cfg = tmp_path / "grid.yaml"
    cfg.write_text(
        long_study.read_text()
        + "grid:\n  run:\n    long: {train.steps: 24}\n"
        + "".join(f"    short{i}: {{train.steps: 6, train.seed: {i}}}\n" for i in (1, 2, 3))
    )
    runs = {r.label_dict["run"]: r for r in load_study(cfg).runs()}
    out = tmp_path / "out"
    first = study_cli(cfg, out, "--workers", "2", *QUICK_REPORT, fault="term-at-step@7")  # the long run only
    assert first.returncode == 1, first.stderr[-3000:]
    long_id = runs["long"].run_id
    assert (
        f"run {long_id} was stopped by a SIGTERM to its worker process and checkpointed there; rerun the same "
        "command to resume it" in first.stderr
    ), first.stderr[-3000:]
    assert steps_saved(out / "checkpoints" / long_id)[-1] == 8
    for label in ("short1", "short2", "short3"):
        rec = read_record(out / "runs" / f"{runs[label].run_id}.json")
        assert rec.result.steps_done == 6 and rec.status == "finished", label
    second = study_cli(cfg, out, "--workers", "2", *QUICK_REPORT)
    assert second.returncode == 0, second.stderr[-3000:]
    rec = read_record(out / "runs" / f"{long_id}.json")
    assert rec.env["resumed_from"] == [8] and rec.result.steps_done == STEPS
