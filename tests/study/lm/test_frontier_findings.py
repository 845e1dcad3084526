"""The 2025-26 claim rules (``lnblocks.study.lm.report.findings.frontier``) on synthetic summary rows with known
answers: a clear effect gives REPRODUCED with the exact counts the rules imply, the opposite one DID NOT REPRODUCE,
a missing comparison arm NOT TESTED with its reason; runs are named by their options, not their labels; and a
study without the new options keeps exactly the canon's claims."""

from __future__ import annotations

import math

import numpy as np

from lnblocks.study.core.claims import Outcome
from lnblocks.study.lm.report.findings import frontier_claims, study_claims
from lnblocks.study.lm.report.findings.frontier_arms import frontier_arm, frontier_roles, uses_frontier_options

R, N, U = Outcome.REPRODUCED, Outcome.DID_NOT_REPRODUCE, Outcome.INCONCLUSIVE
LRS, SEEDS = (1e-3, 3e-3, 1e-2), (0, 1, 2)
ARMS = {  # the columns that make each arm (run_row's names); everything else is Pre-LN with LayerNorm and Adam
    "pre": {}, "post": {"placement": "post"}, "pre_rms": {"norm": "rmsnorm"},
    "dyt": {"norm": "dyt", "norm_alpha": 0.5}, "derf": {"norm": "derf", "norm_alpha": 0.5},
    "derf_a0.3": {"norm": "derf", "norm_alpha": 0.3},
    "hybridnorm": {"placement": "none", "mlp_placement": "normed_residual", "qk_norm": True, "v_norm": True},
    "siamese": {"placement": "siamese"}, "ngpt": {"placement": "ngpt"},
    "hc": {"hyper": "dynamic"}, "mhc": {"hyper": "mhc"}, "gated": {"output_gate": "headwise"},
    "olmo2": {"placement": "reordered", "norm": "rmsnorm", "qk_norm": True, "z_loss": 1e-4},
    "softcap": {"attn_softcap": 50.0, "final_softcap": 30.0}, "qk": {"qk_norm": True},
}  # fmt: skip


def frow(arm: str, lr: float, seed: int, ok: bool = True, **kw: object) -> dict:
    """One summary row of ``arm`` (``+muon``: under Muon) at (depth 6, ``lr``, no warmup, ``seed``)."""
    base = arm.removesuffix("+muon")
    r = {
        "arch": f"lbl_{arm}", "placement": "pre", "norm": "layernorm", "depth": 6, "dim": 64, "lr": lr, "warmup": 0,
        "seed": seed, "status": "finished", "outcome": "trained" if ok else "stuck",
        "final_loss": 2.5 if ok else 3.34, "initial_loss": 5.6, "qk_norm": False, "z_loss": 0.0, "rezero": False,
        "depth_scaled_norm": False, "optimizer": "muon" if arm.endswith("+muon") else "adam", "mlp_placement": "",
        "v_norm": False, "hyper": "", "output_gate": "", "attn_softcap": None, "final_softcap": None,
        "norm_alpha": None, "steps_done": 300, "target_loss": 2.6,
    }  # fmt: skip
    r.update(ARMS[base])
    r.update(kw)
    return r


def noise(seed: int, lr: float, scale: float = 0.005) -> float:
    return scale * math.sin(7 * seed + 1000 * lr)  # small, deterministic, mean near 0


def clear_rows(effect: float = 1.0) -> list[dict]:
    """Every arm over 3 LRs x 3 seeds with each paper's effect (``effect=-1``: the opposite sign)."""
    rows = []
    for lr in LRS:
        for s in SEEDS:
            e, n = effect, noise(s, lr)
            loss = {"pre": 2.5, "pre_rms": 2.5, "dyt": 2.6, "derf": 2.5 - 0.1 * e, "derf_a0.3": 2.5 - 0.1 * e,
                    "hybridnorm": 2.5 - 0.1 * e, "siamese": 2.5 - 0.1 * e, "post": 2.6}  # fmt: skip
            muon = {"pre_rms+muon": 2.6, "derf+muon": 2.6 - 0.1 * e + 0.4 * e, "dyt+muon": 2.7,
                    "derf_a0.3+muon": 2.6 - 0.1 * e + 0.05 * e}  # fmt: skip
            for arm, v in {**loss, **muon}.items():
                ok = not (arm == "post" and lr > 1e-3 and effect > 0)  # Post-LN fails above 1e-3, SiameseNorm not
                gap = 0.05 - 0.03 * e if arm == "derf" else 0.05
                rows.append(frow(arm, lr, s, ok, final_loss=v + n if ok else 3.34, gen_gap=gap + n,
                                 train_eval_loss=v - gap))  # fmt: skip
            rows.append(frow("ngpt", lr, s, steps_to_target=50 if e > 0 else 280))
            rows.append(frow("hc", lr, s, init_mixing_gain=1.0, final_mixing_gain=3.0 + n, max_mixing_gain=3.0))
            rows.append(frow("mhc", lr, s, init_mixing_gain=1.0, final_mixing_gain=1.01 + n, max_mixing_gain=1.05 + n))
            rows.append(frow("gated", lr, s, final_attn_sink=0.1 + n, final_massive_ratio=10.0))
            rows.append(frow("olmo2", lr, s, grad_norm_spike_score=0.0, loss_spike_score=0.0))
            rows.append(frow("qk", lr, s, final_attn_max_logit=8.0 + n, final_loss=2.5 + n))
            rows.append(frow("softcap", lr, s, final_attn_max_logit=40.0 + n, final_loss=2.5 + 10 * lr * e + n))
    for r in rows:
        if r["arch"] == "lbl_pre":
            r.update(steps_to_target=250, final_attn_sink=0.5, final_massive_ratio=100.0 if effect > 0 else 5.0,
                     grad_norm_spike_score=0.02 * effect, loss_spike_score=0.01)  # fmt: skip
    return rows


def high_lr_rows() -> list[dict]:
    """Pre-LN fails at 3e-2 and 1e-1 where the gated arm trains (3 seeds): 6 discordant pairs."""
    return [frow(a, lr, s, ok=a == "gated") for a in ("pre", "gated") for lr in (3e-2, 1e-1) for s in SEEDS]


def by_id(claims: list) -> dict:
    return {c.id: c for c in claims}


def test_arms_are_named_by_their_options_not_their_labels() -> None:
    rows = clear_rows()
    assert {frontier_arm(r) for r in rows} == {*ARMS, "pre_rms+muon", "derf+muon", "dyt+muon", "derf_a0.3+muon"}
    roles = frontier_roles(rows)
    assert roles["derf_a0.3"] == "lbl_derf_a0.3" and roles["mhc"] == "lbl_mhc"
    assert frontier_arm(frow("pre", 1e-3, 0, output_gate="headwise", qk_norm=True)) is None  # two options: no role
    assert frontier_arm(frow("pre", 1e-3, 0, rezero=True)) is None
    twins = rows + [dict(r, arch="other_gated") for r in rows if r["arch"] == "lbl_gated"]
    assert "gated" not in frontier_roles(twins)  # two archs with the same options play no role


def test_clear_effects_reproduce_with_exact_counts() -> None:
    got = by_id(frontier_claims(clear_rows() + high_lr_rows()))
    assert list(got) == ["DF1", "DF2", "DF3", "DF4", "NO1", "NO2", "NO3", "HN1", "HN2", "SN1", "SN2", "NG1", "NG2",
                         "HC1", "HC2", "HC3", "GA1", "GA2", "GA3", "OL1", "GM1", "GM2"]  # fmt: skip
    assert {cid: c.outcome for cid, c in got.items() if c.outcome is not R} == {}
    assert got["DF1"].verdict.estimate.n == 9 and abs(got["DF1"].verdict.estimate.value + 0.1) < 0.01
    assert abs(got["NO1"].verdict.estimate.value - 0.4) < 1e-9  # (2.9 - 2.6) - (2.4 - 2.5), the noise cancels
    assert got["SN1"].verdict.estimate.successes == 6 and got["SN1"].verdict.estimate.n == 6  # 2 LRs x 3 seeds
    assert got["HN2"].verdict.estimate.n == 3 and "6/6" in got["HN2"].text  # both trained at 1e-3 only
    assert got["NG1"].verdict.estimate.successes == 9 and got["NG2"].verdict.estimate.successes == 9
    assert got["GA3"].verdict.estimate.successes == 6
    assert got["GM2"].verdict.estimate.n == 3  # one unit per seed over the LR grid


def test_opposite_effects_do_not_reproduce() -> None:
    got = by_id(frontier_claims(clear_rows(effect=-1.0)))
    for cid in ("DF1", "DF3", "DF4", "NO1", "HN1", "SN2", "OL1"):
        assert got[cid].outcome is N, (cid, got[cid].text)
    assert got["NG1"].outcome is N and got["NG1"].verdict.estimate.successes == 0  # nGPT needed more steps
    assert got["NG2"].outcome is N
    assert got["SN1"].verdict is None and "no unit of the grid" in got["SN1"].text  # Post-LN trains everywhere
    assert got["GA2"].outcome is N  # massive activations larger with the gate
    assert got["GA3"].verdict is None  # no high-LR cells: no discordant pair


def test_noisy_effects_are_inconclusive_with_a_count() -> None:
    rows = clear_rows()
    rng = np.random.default_rng(0)
    for r in rows:
        if r["arch"] == "lbl_derf":
            r["final_loss"] = 2.49 + 0.2 * rng.standard_normal()
    derf = by_id(frontier_claims(rows))["DF1"]
    assert derf.outcome is U and derf.verdict.seeds_needed is not None and derf.verdict.seeds_needed > 9


def test_a_missing_comparison_arm_is_not_tested_with_its_reason() -> None:
    rows = [r for r in clear_rows() if r["arch"] not in ("lbl_dyt", "lbl_pre_rms+muon", "lbl_softcap")]
    got = by_id(frontier_claims(rows))
    assert got["DF2"].verdict is None and "no dyt arm" in got["DF2"].text
    assert got["NO1"].verdict is None and "pre_rms+muon" in got["NO1"].text
    assert "GM1" not in got  # the soft-cap arm is the group's own: no Gemma claims at all
    only = [r for r in clear_rows() if r["arch"] == "lbl_ngpt"]
    ng = by_id(frontier_claims(only))
    assert set(ng) == {"NG1", "NG2"} and all(c.verdict is None for c in ng.values())
    unset = by_id(frontier_claims([dict(r, target_loss=None) for r in clear_rows()]))
    assert "analysis.target_loss is not set" in unset["NG1"].text


def test_censored_steps_count_against_nGPT_only_when_decidable() -> None:
    """A run that never reached the target needed more than its steps: nGPT never reaching it is a cell where
    Pre-LN was first; Pre-LN never reaching it decides "4x fewer" only when nGPT's steps x 4 fit in Pre-LN's."""
    rows = [frow("pre", 1e-3, s, steps_to_target=None) for s in SEEDS]
    rows += [frow("ngpt", 1e-3, 0, steps_to_target=50), frow("ngpt", 1e-3, 1, steps_to_target=200),
             frow("ngpt", 1e-3, 2, steps_to_target=None)]  # fmt: skip
    got = by_id(frontier_claims(rows))
    assert got["NG1"].verdict.estimate.successes == 2 and got["NG1"].verdict.estimate.n == 2  # neither: left out
    assert got["NG2"].verdict.estimate.successes == 1 and got["NG2"].verdict.estimate.n == 1  # 4 x 200 > 301


def test_studies_without_the_new_options_keep_the_canons_claims() -> None:
    canon = [frow("pre", lr, s) for lr in LRS for s in SEEDS] + [frow("post", lr, s) for lr in LRS for s in SEEDS]
    for r in canon:  # a summary written before the new columns: none of them
        for key in ("optimizer", "mlp_placement", "v_norm", "hyper", "output_gate", "attn_softcap", "norm_alpha"):
            r.pop(key)
    assert not uses_frontier_options(canon)
    assert [c.id for c in study_claims(canon, [])] == [f"X{i}" for i in range(6, 9)]
    assert uses_frontier_options(clear_rows()) and {c.id[:2] for c in study_claims(clear_rows(), [])} == {
        "DF", "NO", "HN", "SN", "NG", "HC", "GA", "OL", "GM"}  # fmt: skip
