"""The report's analyses on hand-made run records: rows, tables, the summary round trip, and claims from records."""

from __future__ import annotations

from pathlib import Path

import pytest

from lnblocks.study.core.records import RunRecord
from lnblocks.study.lm.config import AnalysisConfig
from lnblocks.study.lm.report.analysis import gradient_profile, read_summary, run_row, sensitivity_table, warmup_table
from lnblocks.study.lm.report.findings import study_claims
from lnblocks.study.lm.result import LMResult

PLATEAU, INIT = 3.33, 5.8
ANALYSIS = AnalysisConfig(stuck_margin=0.3)


def record(
    arch: str, depth: int, lr: float, warmup: int, seed: int, final: float | None, ratio: float = 1.0
) -> RunRecord:
    """A minimal run record as ``train_run`` returns it (only the fields the analyses read are meaningful)."""
    profile = [0.1 * ratio ** (i / max(depth - 1, 1)) for i in range(depth)]  # geometric: last/first == ratio
    result = LMResult(
        reference={"uniform": 5.545, "unigram": PLATEAU},
        model={},
        steps_done=8 if final is None else 300,
        diverged_step=7 if final is None else None,
        initial_loss=INIT,
        final_train_loss=final,
        eval={"init": INIT, "final": final, "curve": []},
        loss=[],
        init_grad={"expected": {"W_2": profile}},
    )
    return RunRecord(
        id=f"{arch}-{depth}-{lr}-{warmup}-{seed}",
        task="lm",
        status="diverged" if final is None else "finished",
        labels={"model.placement": arch},
        config={
            "model": {"placement": arch, "norm": {"kind": "layernorm"}, "depth": depth, "dim": 64},
            "train": {"lr": lr, "warmup": warmup, "schedule": "constant", "seed": seed},
        },
        result=result,
        time={"wall_s": 1.0, "cpu_s": 1.0, "step_ms": 3.0},
        env={},
    )


# The pilot's pattern (docs/study-protocol.md): final losses by (arch, depth, warmup) at lr 1e-3 / 3e-3.
PILOT = {
    ("post", 3, 0): (2.52, 2.36),
    ("post", 3, 60): (2.54, 2.39),
    ("pre", 3, 0): (2.53, 2.39),
    ("pre", 3, 60): (2.55, 2.41),
    ("post", 12, 0): (3.34, 3.35),
    ("post", 12, 60): (2.62, 3.35),
    ("pre", 12, 0): (2.49, 2.38),
    ("pre", 12, 60): (2.51, 2.41),
}
RATIOS = {("post", 3): 0.94, ("post", 12): 2.32, ("pre", 3): 0.81, ("pre", 12): 0.56}


def pilot_records(changes: dict | None = None, ratios: dict | None = None) -> list[RunRecord]:
    """Two seeds per cell (seed 1 is 0.01 worse); ``changes`` replaces cells, ``ratios`` init gradient ratios."""
    table, ratio = {**PILOT, **(changes or {})}, {**RATIOS, **(ratios or {})}
    return [
        record(a, d, lr, w, seed, None if losses[i] is None else losses[i] + 0.01 * seed, ratio[(a, d)])
        for (a, d, w), losses in table.items()
        for i, lr in enumerate((1e-3, 3e-3))
        for seed in (0, 1)
    ]


def test_rows_of_the_pilot_table_give_the_threshold_claims() -> None:
    """From records through ``run_row`` to the claims: the pilot pattern, pooled over its cells."""
    rows = [run_row(r, ANALYSIS) for r in pilot_records()]
    claims = {c.id: c for c in study_claims(rows, [])}
    assert claims["X6"].status == "REPRODUCED" and claims["X6"].verdict.estimate.successes == 6
    assert claims["X7"].status == "REPRODUCED"
    assert claims["X8"].status == "INCONCLUSIVE" and claims["X8"].settle() == "~6 units"  # 2/2: warmup at 1e-3
    broken = [run_row(r, ANALYSIS) for r in pilot_records({("post", 12, 0): (2.60, 2.45)})]  # deep Post-LN trains
    assert {c.id: c.status for c in study_claims(broken, [])}["X6"] == "INCONCLUSIVE"


def test_summary_csv_round_trips_with_types(tmp_path: Path) -> None:
    from lnblocks.study.lm.report.build import write_summary_csv

    rows = [run_row(r, ANALYSIS) for r in pilot_records({("post", 3, 0): (2.52, None)})]
    write_summary_csv(rows, tmp_path / "summary.csv")
    back = read_summary(tmp_path / "summary.csv")
    assert back == rows
    assert isinstance(back[0]["depth"], int) and isinstance(back[0]["lr"], float) and back[0]["qk_norm"] is False


def test_gradient_profile_counts_each_init_once() -> None:
    prof = gradient_profile(pilot_records())
    assert prof[("post", 12)]["n"] == 2  # 2 seeds, though each init appears at 2 LRs x 2 warmups
    assert prof[("post", 12)]["ratio"] == pytest.approx(2.32)
    assert len(prof[("pre", 3)]["layers"]) == 3


def test_gradient_profile_of_an_arm_without_init_gradient(tmp_path: Path) -> None:
    """ReZero's zero gates give W_2 no gradient at init: the profile has no last/first ratio (it once divided by
    zero and crashed the report of configs/placements.yaml), the plot skips it and the table says n/a."""
    from lnblocks.study.lm.report.init_profile import InitProfile
    from lnblocks.study.lm.report.markdown import profile_table
    from lnblocks.study.lm.report.plots import grad_profile_plot

    rezero = record("rezero", 3, 1e-3, 0, 0, 2.5)
    rezero.result.init_grad["expected"]["W_2"] = [0.0, 0.0, 0.0]
    prof = gradient_profile([rezero, record("pre", 3, 1e-3, 0, 0, 2.5, ratio=0.5)])
    assert prof[("rezero", 3)]["ratio"] is None and prof[("pre", 3)]["ratio"] == pytest.approx(0.5)
    pytest.importorskip("matplotlib")
    assert grad_profile_plot([rezero], tmp_path / "g.png") is not None
    zero = InitProfile(arch="rezero", depth=3, seeds=[0, 1], grad={"W_2": [[0.0] * 3] * 2})
    assert profile_table([zero])[-1].endswith("| n/a |")


def test_sensitivity_and_warmup_tables() -> None:
    rows = [run_row(r, ANALYSIS) for r in pilot_records({("post", 12, 0): (None, 3.35)})]
    sens = {(t["arch"], t["depth"], t["warmup"]): t for t in sensitivity_table(rows, ANALYSIS)}
    post = sens[("post", 12, 0)]
    # seed 0: capped losses (diverged -> 5.8, 3.35): Wortsman E[min(l, l0) - l*] = (2.45 + 0) / 2
    assert post["lr_sensitivity"] == pytest.approx(((5.8 - 3.35) / 2 + (5.8 - 3.36) / 2) / 2)
    assert post["failed"] == 4 and post["runs"] == 4 and post["max_stable_lr"] is None
    assert sens[("pre", 12, 0)]["max_stable_lr"] == 3e-3
    warm = {(t["arch"], t["depth"]): t for t in warmup_table(rows)}
    assert warm[("post", 12)]["fail_rate_no_warmup"] == 1.0 and warm[("post", 12)]["fail_rate_warmup"] == 0.5
    # loss change = mean over lr and seed of capped(no warmup) - capped(warmup)
    expected = ((5.8 - 2.62) + (5.8 - 2.63) + (3.35 - 3.35) + (3.36 - 3.36)) / 4
    assert warm[("post", 12)]["loss_change"] == pytest.approx(expected)
