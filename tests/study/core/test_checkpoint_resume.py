"""The resume guarantee: a run killed with SIGKILL (at a step chosen at random, right after a
checkpoint was written, in the middle of writing one, between the write and the rename) and resumed with ``lnblocks
study run`` on the same folder gives a record byte-identical to the uninterrupted run's apart from timing and host
fields, and TensorBoard event files that hold each step once, with the values of the uninterrupted run; for Pre-LN
and Post-LN, with dropout, grad_accum 2, warmup + cosine, z-loss, diagnostics and evals on. A damaged checkpoint is
named on stderr and the previous one used. The killed process is a real ``lnblocks`` process that SIGKILLs itself
where ``LNBLOCKS_CHECKPOINT_FAULT`` says; the reference is the same study run in this process without a kill."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest

from lnblocks.study import load_study, read_record, run_study
from tests.study.study_helpers import EVERY, STEPS, read_events, same_record, study_cli

pytest.importorskip("tensorboard")

RNG = random.Random()  # a new random step every session (named in the failure message; not in the test ids, which
KILL_STEP = {p: RNG.randrange(EVERY + 1, STEPS) for p in ("pre", "post")}  # pytest-xdist's workers must agree on)


def newest_before(step: int) -> int:
    return (step - 1) // EVERY * EVERY


SCENARIOS = [
    ("pre", f"kill-at-step@{KILL_STEP['pre']}", [newest_before(KILL_STEP["pre"])]),
    ("post", f"kill-at-step@{KILL_STEP['post']}", [newest_before(KILL_STEP["post"])]),
    ("pre", "kill-after-save@2", [2 * EVERY]),  # right after the checkpoint of step 10 is in place
    ("pre", "kill-mid-write@2", [EVERY]),  # the model file of step 10 written, nothing else: step 5 is used
    ("post", "kill-mid-write@3", [2 * EVERY]),
    ("pre", "kill-before-rename@2", [EVERY]),  # complete in its temporary folder, never renamed
]


def resume_and_compare(study: Path, out: Path, reference: Path, placement: str, resumed_from: list[int]) -> None:
    (run,) = load_study(study, overrides={"model.placement": placement}).runs()
    assert run_study(study, out, show_progress=False, report=False, overrides={"model.placement": placement}) == 0
    rec, ref = read_record(out / "runs" / f"{run.run_id}.json"), read_record(reference / "runs" / f"{run.run_id}.json")
    assert rec.env.get("resumed_from") == resumed_from
    assert same_record(rec, ref) == [], f"resumed from step {resumed_from}"
    assert rec.result.steps_done == STEPS and rec.result.grad_norm == ref.result.grad_norm
    count, values = read_events(out / "tensorboard" / run.run_id)
    _, ref_values = read_events(reference / "tensorboard" / run.run_id)
    assert max(count.values()) == 1, [k for k, n in count.items() if n > 1][:5]  # each step once
    assert values == ref_values and {s for (t, s) in count if t == "loss/train"} == set(range(STEPS))
    assert not (out / "checkpoints").exists()


IDS = [f"{p}-{'kill-at-random-step' if f.startswith('kill-at-step') else f}" for p, f, _ in SCENARIOS]


@pytest.mark.parametrize(("placement", "fault", "resumed_from"), SCENARIOS, ids=IDS)
def test_killed_run_resumes_bit_identically(
    long_study: Path, long_reference: dict, tmp_path: Path, placement: str, fault: str, resumed_from: list[int]
) -> None:
    out = tmp_path / "out"
    killed = study_cli(long_study, out, "--set", f"model.placement={placement}", fault=fault)
    assert killed.returncode == -signal.SIGKILL, f"{fault}: {killed.stderr[-2000:]}"
    assert not list((out / "runs").glob("*.json"))
    resume_and_compare(long_study, out, long_reference[placement], placement, resumed_from)


def test_a_damaged_checkpoint_is_named_and_the_previous_one_used(
    long_study: Path, long_reference: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert study_cli(long_study, out, "--set", "model.placement=pre", fault="kill-after-save@2").returncode < 0
    (folder,) = (out / "checkpoints").iterdir()
    newest = folder / "step-000000010"
    model = newest / "model.pt"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])  # truncated, as by a crash of the disk
    resume_and_compare(long_study, out, long_reference["pre"], "pre", [EVERY])
    assert f"warning: checkpoint {newest} is damaged (model.pt has" in capsys.readouterr().err
