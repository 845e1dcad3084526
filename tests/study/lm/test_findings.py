"""Every claim check on synthetic rows and init profiles with known answers: a clear effect (REPRODUCED), no effect
or the opposite one (INCONCLUSIVE / DID NOT REPRODUCE), and a noisy one (INCONCLUSIVE with a seeds-needed count).
The expected verdicts and counts follow from the rules of docs/study-claims.md, worked out by hand below."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lnblocks.study.core.claims import Outcome, claims_table
from lnblocks.study.lm.report.findings import placement_claims, study_claims, wortsman_claims, xiong_claims
from lnblocks.study.lm.report.init_profile import InitProfile

R, N, U = Outcome.REPRODUCED, Outcome.DID_NOT_REPRODUCE, Outcome.INCONCLUSIVE  # U: undecided
PLATEAU = 3.33


def row(arch: str, depth: int, lr: float, warmup: int, seed: int, ok: bool = True, **kw: object) -> dict:
    """One summary row; ``ok``: trained (loss 2.5) or stuck on the plateau (3.34). ``kw`` overrides any column."""
    placement = kw.pop(
        "placement", arch if arch in ("pre", "post", "sandwich", "deepnorm", "resi_dual", "mix_ln", "none") else "pre"
    )
    r = {
        "arch": arch, "placement": placement, "norm": "layernorm", "depth": depth, "dim": 64, "lr": lr,
        "warmup": warmup, "seed": seed, "outcome": "trained" if ok else "stuck", "final_loss": 2.5 if ok else 3.34,
        "initial_loss": 5.6, "unigram_loss": PLATEAU, "qk_norm": False, "z_loss": 0.0, "rezero": False,
        "depth_scaled_norm": False, "final_attn_max_logit": 10.0, "final_log_z": 0.0, "final_residual_rms_last": 4.0,
        "final_gradW2_slope": 0.0, "ablation_deep_half": 0.01,
    }  # fmt: skip
    r.update(kw)
    return r


def threshold_rows(arch: str, m: dict, lrs: tuple, seeds: tuple = (0, 1), **kw: object) -> list[dict]:
    """Runs of ``arch`` that train exactly at LRs <= ``m[(depth, warmup)]`` (a largest stable LR per cell)."""
    return [row(arch, d, lr, w, s, lr <= thr, **kw) for (d, w), thr in m.items() for lr in lrs for s in seeds]


def profile(
    arch: str, depth: int, slope: float, noise: float, seeds: int = 16, last_scale: float = 1.0, rng_seed: int = 0
) -> InitProfile:
    """``seeds`` W_2 profiles ``last_scale * exp(slope * (layer - L) + noise)``; residual RMS^2 = 2 + layer + noise."""
    rng = np.random.default_rng(rng_seed + depth * 7 + len(arch))
    layers = range(1, depth + 1)
    w2 = [
        [last_scale * math.exp(slope * (k - depth) + noise * rng.standard_normal()) for k in layers]
        for _ in range(seeds)
    ]
    res = [[math.sqrt(2 + k + 0.1 * rng.standard_normal()) for k in range(depth + 1)] for _ in range(seeds)]
    return InitProfile(arch, depth, list(range(seeds)), {"W_2": w2}, res, batches=8)


def by_id(claims: list) -> dict:
    return {c.id: c for c in claims}


# ---- Xiong et al. 2020 ---------------------------------------------------------------------------------------------

LRS = (1e-3, 3e-3)
PILOT_M = {  # largest stable LR per (depth, warmup): the demo's pattern (docs/study-protocol.md)
    "post": {(3, 0): 1.0, (3, 60): 1.0, (12, 0): 0.0, (12, 60): 1e-3},
    "pre": {(3, 0): 1.0, (3, 60): 1.0, (12, 0): 1.0, (12, 60): 1.0},
}


def pilot_rows(post: dict | None = None, lrs: tuple = LRS, seeds: tuple = (0, 1)) -> list[dict]:
    m = {**PILOT_M["post"], **(post or {})}
    return threshold_rows("post", m, lrs, seeds) + threshold_rows("pre", PILOT_M["pre"], lrs, seeds)


def clear_profiles(**changes: float) -> list[InitProfile]:
    post_slope, pre_slope = changes.get("post", 0.05), changes.get("pre", -0.05)
    noise = changes.get("noise", 0.02)
    post = [profile("post", d, post_slope, noise) for d in (3, 12)]
    return post + [profile("pre", d, pre_slope, noise, last_scale=d**-0.5) for d in (3, 12)]


def test_xiong_clear_effects_reproduce_with_exact_counts() -> None:
    c = by_id(xiong_claims(pilot_rows(), clear_profiles()))
    assert {k: v.outcome for k, v in c.items()} == {k: R for k in ("X1", "X2", "X3", "X4", "X5")} | {
        "X6": R, "X7": R, "X8": U,
    }  # fmt: skip
    assert c["X1"].verdict.estimate.value == pytest.approx(0.05, abs=0.01) and c["X1"].verdict.estimate.n == 16
    assert c["X3"].verdict.estimate.value == pytest.approx(-0.5, abs=0.05)  # last ~ 1/sqrt(L)
    assert "contains" in c["X3"].text and c["X3"].verdict.estimate.contains(-0.5)
    # X6: L=12 w=0 -> Pre trains where Post does not at 1e-3 and 3e-3; w=60 at 3e-3; 2 seeds: 6/6, 2 ties per seed
    assert c["X6"].verdict.estimate.successes == 6 and c["X6"].verdict.estimate.n == 6
    assert "(10 of 16 pairs tie and are left out)" in c["X6"].text
    # X7: 3 -> 12 at the same (lr, warmup, seed): w=0 both LRs, w=60 at 3e-3 -> 6/6
    assert (c["X7"].verdict.estimate.successes, c["X7"].verdict.estimate.n) == (6, 6)
    # X8: warmup rescues 1e-3 at L=12 only: 2/2 -> INCONCLUSIVE, 6 units would settle it
    assert (c["X8"].verdict.estimate.successes, c["X8"].verdict.estimate.n) == (2, 2)
    assert c["X8"].settle() == "~6 units"


def test_a_wider_lr_grid_cannot_flip_the_threshold_claims() -> None:
    """The issue's case: placements.yaml added lr 3e-4, where deep Post-LN trains. The old 'fails at every LR'
    finding flipped; the threshold form does not (new pairs at 3e-4 are ties)."""
    wide = pilot_rows(post={(12, 0): 3e-4}, lrs=(3e-4, 1e-3, 3e-3))
    c = by_id(xiong_claims(wide, []))
    assert c["X6"].outcome is R and (c["X6"].verdict.estimate.successes, c["X6"].verdict.estimate.n) == (6, 6)
    assert c["X7"].outcome is R
    assert "X1" not in c  # no profiles: the init claims are not checked


def test_xiong_opposite_effects_do_not_reproduce() -> None:
    flipped = threshold_rows("post", PILOT_M["pre"], LRS) + threshold_rows("pre", PILOT_M["post"], LRS)
    c = by_id(xiong_claims(flipped, clear_profiles(post=-0.05, pre=0.05)))
    assert c["X1"].outcome is N and c["X2"].outcome is N
    assert c["X6"].outcome is N and c["X6"].verdict.estimate.successes == 0


def test_xiong_null_and_noisy_effects_are_inconclusive() -> None:
    c = by_id(xiong_claims(pilot_rows(), clear_profiles(post=0.0, noise=0.3)))
    assert c["X1"].outcome is U  # no slope: the interval straddles 0
    noisy = by_id(xiong_claims(pilot_rows(), clear_profiles(post=0.02, noise=1.0)))["X1"]
    assert noisy.outcome is U and noisy.verdict.seeds_needed > 16 and noisy.settle().endswith("seeds")
    # one seed per cell: a pooled share of 3/3 cannot reproduce
    assert by_id(xiong_claims(pilot_rows(seeds=(0,)), []))["X6"].outcome is U


def test_single_arm_studies_check_no_xiong_claim() -> None:
    assert xiong_claims([r for r in pilot_rows() if r["arch"] == "pre"], []) == []


# ---- Wortsman et al. 2023 -----------------------------------------------------------------------------------------

WLRS = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
SIZES = ((3, 64), (12, 64), (3, 128))


def wortsman_rows(growth: float = 0.8, fail_at: float = 0.1, noise: float = 0.1, logz: float = -3.0) -> list[dict]:
    """No-qk logits grow as lr^growth and fail from ``fail_at`` (earlier when deeper); qk-norm's stay at 5."""
    rng = np.random.default_rng(0)
    rows = []
    for depth, dim in SIZES:
        for seed in (0, 1, 2):
            for lr in WLRS:
                top = fail_at / (3 if depth > 3 else 1)
                for qk, z in ((False, 0.0), (True, 0.0), (True, 1e-4)):
                    if z and (depth, dim) != (3, 64):
                        continue
                    logit = 5 * math.exp(noise * rng.standard_normal()) * ((lr / 1e-3) ** growth if not qk else 1.0)
                    ok = qk or lr < top
                    loss = 2.0 + 0.1 * math.log10(lr / 1e-3) ** 2 * (2 if depth > 3 else 1) if ok else 3.34
                    rows.append(
                        row(
                            "qk" if qk else "noqk",
                            depth,
                            lr,
                            30,
                            seed,
                            ok,
                            dim=dim,
                            qk_norm=qk,
                            z_loss=z,
                            final_attn_max_logit=logit,
                            final_loss=loss,
                            final_log_z=(0.05 if z else logz) + 0.05 * rng.standard_normal(),
                        )
                    )
    return rows


def test_wortsman_clear_effects_reproduce() -> None:
    c = by_id(wortsman_claims(wortsman_rows()))
    assert {k: v.outcome for k, v in c.items()} == {
        "W1": R, "W1b": R, "W2a": R, "W2b": R, "W3a": R, "W3b": R, "W4": R
    }  # fmt: skip
    assert c["W1"].verdict.estimate.value == pytest.approx(0.8, abs=0.1) and c["W1"].verdict.estimate.n == 9
    assert c["W3a"].verdict.estimate.value == pytest.approx(3 - 0.05, abs=0.1)
    assert c["W3b"].verdict.estimate.value == pytest.approx(0.05, abs=0.05)


def test_wortsman_null_effects() -> None:
    c = by_id(wortsman_claims(wortsman_rows(growth=0.0, fail_at=10.0, logz=0.05)))
    assert c["W1"].outcome is U and c["W2a"].outcome is U  # no growth, with or without qk-norm
    assert c["W1b"].outcome is N  # 0/9 units fail at the top of the grid
    assert c["W3a"].outcome is U  # |log Z| the same with and without z-loss
    assert c["W3b"].outcome is R  # and near 0 in both


def test_wortsman_needs_a_qk_pair_and_an_lr_grid() -> None:
    rows = [r for r in wortsman_rows() if r["qk_norm"]]
    assert wortsman_claims(rows) == []
    assert wortsman_claims([r for r in wortsman_rows() if r["lr"] in (1e-3, 3e-3)]) == []


# ---- placements ---------------------------------------------------------------------------------------------------

PLRS = (3e-4, 1e-3, 3e-3)


def placement_rows(effect: bool = True) -> list[dict]:
    """One seed, depths 3/6/12, LRs PLRS, warmups 0/60: each arm's paper's claim holds (``effect``) or not."""
    m = lambda top, deep_top: {(d, w): (top if d < 12 else deep_top) for d in (3, 6, 12) for w in (0, 60)}  # noqa: E731
    rows = threshold_rows("post", m(1.0, 0.0), PLRS, (0,)) + threshold_rows("pre", m(1.0, 1.0), PLRS, (0,))
    rows += threshold_rows("deepnorm", m(1.0, 1.0 if effect else 0.0), PLRS, (0,))
    rows += threshold_rows("resi_dual", m(1.0, 1.0 if effect else 0.0), PLRS, (0,))
    rows += threshold_rows("none", m(0.0, 0.0), PLRS, (0,))
    rows += threshold_rows(
        "rezero", m(1.0 if effect else 0.0, 1.0 if effect else 0.0), PLRS, (0,), placement="none", rezero=True
    )
    rng = np.random.default_rng(1)
    noise = lambda: 0.02 * rng.standard_normal()  # noqa: E731
    for d in (3, 6, 12):
        for lr in PLRS:
            for w in (0, 60):
                big = 4.0 * (1.5 if effect else 1.0)
                rows.append(row("sandwich", d, lr, w, 0, final_residual_rms_last=4.0 * math.exp(noise())))
                pre = next(r for r in rows if r["arch"] == "pre" and (r["depth"], r["lr"], r["warmup"]) == (d, lr, w))
                pre.update(final_residual_rms_last=big * math.exp(noise()), final_loss=2.5 + noise())
                pre.update(ablation_deep_half=0.01 + noise() / 10)
                rows.append(row("dyt", d, lr, w, 0, norm="dyt", final_loss=2.5 + (0.2 if effect else 0.0) + noise()))
                lns_rms, lns_abl = 2.0 * math.exp(noise()), (0.05 if effect else 0.01) + noise() / 10
                rows.append(row("lns", d, lr, w, 0, depth_scaled_norm=True, final_residual_rms_last=lns_rms))
                rows[-1]["ablation_deep_half"] = lns_abl
                rows.append(row("mix_ln", d, lr, w, 0))
    return rows


def placement_profiles(effect: bool = True) -> list[InitProfile]:
    return [
        profile("post", 12, 0.05, 0.02), profile("pre", 12, -0.05, 0.02),
        profile("resi_dual", 12, 0.0 if effect else 0.05, 0.02), profile("mix_ln", 12, 0.0 if effect else 0.08, 0.02),
    ]  # fmt: skip


def test_placement_claims_with_clear_effects() -> None:
    c = by_id(placement_claims(placement_rows(), placement_profiles()))
    got = {k: v.outcome for k, v in c.items()}
    # DyT trains 0.2 nats worse in this table: Y1 (DyT matches LN within 0.05) does not reproduce, as measured
    assert got == {"D1": U, "P1": R, "P1b": None, "R1": R, "R1b": U, "M1": R, "M1b": R, "Y1": N, "Z1": R,
                   "Z1b": R, "S1": R, "S1b": R}  # fmt: skip
    # D1: only L=12 w=0 has discordant pairs (3 LRs, one seed): 3/3 -> ~6 units would settle it
    assert (c["D1"].verdict.estimate.successes, c["D1"].verdict.estimate.n) == (3, 3) and c["D1"].settle() == "~6 units"
    # Z1: no norm fails at all 6 (LR, warmup) cells of L=12 -> 6/6; ReZero trains all 18 cells where none fails
    assert (c["Z1"].verdict.estimate.successes, c["Z1"].verdict.estimate.n) == (6, 6)
    assert (c["Z1b"].verdict.estimate.successes, c["Z1b"].verdict.estimate.n) == (18, 18)
    assert c["P1b"].status == "NOT TESTED" and "none of the 18 run pairs is discordant" in c["P1b"].text
    assert c["P1"].verdict.estimate.value == pytest.approx(math.log(1.5), abs=0.02) and c["P1"].verdict.estimate.n == 18


def test_placement_claims_without_the_effects() -> None:
    c = by_id(placement_claims(placement_rows(effect=False), placement_profiles(effect=False)))
    got = {k: v.outcome for k, v in c.items()}
    assert got["D1"] is None and got["R1b"] is None  # DeepNorm/ResiDual fail exactly where Post-LN does: all ties
    assert got["Z1b"] is None
    assert got["R1"] is U  # same slope as Post-LN
    assert got["M1"] is N and got["M1b"] is N  # Mix-LN less uniform than both
    assert got["Y1"] is R  # DyT within 0.05 of LayerNorm
    assert got["S1"] is U and got["P1"] is U  # no ablation difference, no residual difference


def test_ambiguous_arms_play_no_role() -> None:
    rows = [*placement_rows(), row("pre_qk", 3, 1e-3, 0, 0, qk_norm=True)]
    ids = {c.id for c in placement_claims(rows, placement_profiles())}
    assert "D1" in ids and "Y1" in ids and "Z1" in ids  # roles by placement family, not by label
    twice = [dict(r, arch="pre2") for r in rows if r["arch"] == "pre"] + rows
    assert not any(c.id in ("P1", "Y1", "S1") for c in placement_claims(twice, []))  # two Pre-LN arms: which one?


def test_claims_table_lists_every_claim_with_its_verdict() -> None:
    claims = study_claims(pilot_rows(), clear_profiles())
    table = claims_table(claims)
    assert table[0].startswith("| id | claim |") and len(table) == 2 + len(claims)
    assert "| X6 | Post-LN's largest stable LR lies below Pre-LN's |" in table[7]
    assert "6/6 (share 1.00 [0.541, 1.00])" in table[7] and "| REPRODUCED |" in table[7]
    assert "| INCONCLUSIVE | ~6 units |" in table[9]
