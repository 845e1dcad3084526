"""The report never fails once runs have trained, on any grid: degenerate grids (one depth, one seed, one arm, Mix-LN
with no Post-LN layer), every outcome (all stuck, all diverged, non-finite from the first step), damaged caches,
labels with markdown in them. Claims without enough data are NOT TESTED or INCONCLUSIVE and say why; the JSON is
strict; every markdown table keeps its columns."""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path

import pytest

from lnblocks.study import build_report, load_study, run_study
from lnblocks.study.core.records import RunRecord
from lnblocks.study.core.report import load_records
from lnblocks.study.lm.report.build import build_lm_report
from tests.study.study_helpers import write_study

ARMS = """
    pre: {model.placement: pre}
    post: {model.placement: post}
    sandwich: {model.placement: sandwich}
    deepnorm: {model.placement: deepnorm, model.init: deepnet}
    resi_dual: {model.placement: resi_dual}
    mix_ln: {model.placement: mix_ln}
    none: {model.placement: none}
    rezero: {model.placement: none, model.rezero: true}
    dyt: {model.placement: pre, model.norm: dyt}
    lns: {model.placement: pre, model.depth_scaled_norm: true, diagnostics.layer_ablation: true}
    qk: {model.placement: pre, model.qk_norm: layernorm}
    qk_z: {model.placement: pre, model.qk_norm: layernorm, train.z_loss: 1.0e-4}
"""
STUDY = """
name: {name}
data: {{source: markov, vocab_size: 16, seq_len: 8, batch_size: 4, eval_batches: 1}}
model: {{dim: 8, n_heads: 2}}
train: {{steps: {steps}, log_every: 1}}
diagnostics: {{every: 1, init_grad_batches: 1, probe_batch_size: 2}}
analysis: {{init_profile: {{seeds: {seeds}, batches: 1}}}}
grid:
  variant:{arms}
  model.depth: {depths}
"""
PRE_POST_MIX = "".join(f"\n    {a}: {{model.placement: {a}}}" for a in ("pre", "post", "mix_ln"))
STATUSES = {"reproduced", "did not reproduce", "inconclusive", "not tested"}


def report_study(tmp_path: Path, name: str = "s", arms: str = ARMS, depths: str = "[1, 2]", seeds: int = 0,
               steps: int = 2) -> Path:  # fmt: skip
    return write_study(
        tmp_path, f"{name}.yaml", STUDY.format(name=name, arms=arms, depths=depths, seeds=seeds, steps=steps)
    )


def run(cfg: Path, out: Path) -> int:
    """``run_study`` and the report without plots (they are fuzzed below, on fewer trials)."""
    return run_study(cfg, out, show_progress=False, report=False) or build_report(out, plots=False, echo=False)


def check_report(out: Path) -> list[dict]:
    """findings.json is strict JSON with a verdict and a reason for every claim; report.md's tables keep their
    columns; nothing in the report failed."""
    findings = json.loads((out / "findings.json").read_text(), parse_constant=lambda c: pytest.fail(f"JSON has {c}"))
    for f in findings:
        assert f["status"] in STATUSES, f
        if f["status"] == "not tested":
            assert "Not tested: " in f["text"] and f["estimate"] is None, f
        if f["status"] == "inconclusive":
            assert f["settle"] or f["estimate"]["n"] == 1, f
    text = (out / "report.md").read_text()
    assert "could not be computed" not in text
    table: list[int] = []
    for line in text.splitlines():
        if line.startswith("|"):
            table.append(len(re.findall(r"(?<!\\)\|", line)))
            assert table[-1] == table[0], f"a table row lost its columns: {line}"
        else:
            table = []
    return findings


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[RunRecord], dict]:
    """One short run per (arm, depth) of every placement family: the material the fuzzing below varies."""
    tmp = tmp_path_factory.mktemp("fuzz")
    out = tmp / "out"
    assert run_study(report_study(tmp), out, show_progress=False, report=False) == 0
    records, manifest, problems = load_records(out)
    assert not problems and len(records) == 24
    return records, manifest


def _variant(rec: RunRecord, rng: random.Random, lr: float, warmup: int, seed: int) -> RunRecord:
    """``rec`` moved to (lr, warmup, seed) with a random outcome: trained, stuck, diverged, or non-finite from the
    first step; sometimes without diagnostics or an init gradient, or with a zero one."""
    res, plateau = rec.result, rec.result.reference["unigram"]
    config = {**rec.config, "train": {**rec.config["train"], "lr": lr, "warmup": warmup, "seed": seed}}
    labels = {**rec.labels, "train.lr": f"{lr:g}", "train.warmup": str(warmup), "train.seed": str(seed)}
    kind = rng.choice(["trained", "trained", "stuck", "diverged", "nan_start", "bare", "zero_grad"])
    status, change = "finished", {}
    if kind == "trained":
        change = {"eval": {**res.eval, "final": plateau - rng.uniform(0.4, 1.5)}}
    elif kind == "stuck":
        change = {"eval": {**res.eval, "final": plateau + rng.uniform(-0.2, 0.5)}}
    elif kind in ("diverged", "nan_start"):
        status = "diverged"
        change = {"eval": {**res.eval, "final": None}, "final_train_loss": None, "diverged_step": 0}
        if kind == "nan_start":
            change.update(loss=[None], initial_loss=None, eval={**res.eval, "init": None, "final": None})
    elif kind == "bare":
        change = {"diagnostics": [], "init_grad": None, "layer_ablation": None}
    elif res.init_grad:
        change = {"init_grad": {"expected": {g: [0.0] * len(v) for g, v in res.init_grad["expected"].items()}}}
    digest = f"{rng.getrandbits(40):010x}"
    return dataclasses.replace(
        rec, id=f"{rec.id}-{digest}", status=status, labels=labels, config=config,
        result=dataclasses.replace(res, **change),
    )  # fmt: skip


@pytest.mark.parametrize("trial", range(24))
def test_report_fuzzed_over_small_degenerate_grids(trained, tmp_path: Path, trial: int) -> None:
    records, manifest = trained
    rng = random.Random(trial)
    by_arm: dict[str, list[RunRecord]] = {}
    for r in records:
        by_arm.setdefault(r.labels["variant"], []).append(r)
    arms = rng.sample(sorted(by_arm), rng.randint(1, 4))
    depths = rng.choice([[1], [2], [1, 2]])
    lrs = rng.sample([1e-3, 1e-2, 1e-1], rng.randint(1, 3))
    warmups, seeds = rng.choice([[0], [2], [0, 2]]), rng.choice([[0], [0, 1]])
    recs = [
        _variant(r, rng, lr, w, s)
        for a in arms
        for r in by_arm[a]
        if r.config["model"]["depth"] in depths
        for lr in lrs
        for w in warmups
        for s in seeds
    ]
    if rng.random() < 0.3:  # some cells missing
        recs = rng.sample(recs, max(1, len(recs) // 2))
    if rng.random() < 0.2:  # labels that are markdown
        recs = [dataclasses.replace(r, labels={**r.labels, "variant": r.labels["variant"] + "|a\nb"}) for r in recs]
    analysis = {
        "init_profile": {"seeds": rng.choice([0, 0, 1, 2]), "batches": 1},
        "final_loss": rng.choice(["eval", "train"]),
        "stuck_margin": rng.choice([0.3, 3.0]),
    }
    out = tmp_path / "out"
    out.mkdir()
    assert build_lm_report(out, recs, {**manifest, "analysis": analysis}, [], plots=trial % 6 == 0, echo=False) == 0
    check_report(out)


def test_one_depth_grids_and_one_init_seed(tmp_path: Path) -> None:
    """Depth 1 with [post, resi_dual] or [pre, post, mix_ln] (no slope over one layer), and one init seed (an
    unbounded interval: null in findings.json, 'unknown (n=1)' in the report)."""
    arms = {
        "pr": "\n    post: {model.placement: post}\n    resi_dual: {model.placement: resi_dual}",
        "ppm": PRE_POST_MIX,
    }
    for name, arm in arms.items():
        out = tmp_path / name
        assert run(report_study(tmp_path, name, arm, "[1]", seeds=2), out) == 0
        claims = {f["id"]: f for f in check_report(out)}
        why = "at a depth >= 2" if name == "pr" else "Mix-LN mixes at no depth of the grid: at L = 1"
        for cid in ("R1",) if name == "pr" else ("M1", "M1b"):
            assert claims[cid]["status"] == "not tested" and why in claims[cid]["text"], claims[cid]
    out = tmp_path / "one_seed"
    assert run(report_study(tmp_path, "one", arms["ppm"], "[2]", seeds=1), out) == 0
    claims = {f["id"]: f for f in check_report(out)}
    assert claims["X1"]["status"] == "inconclusive" and claims["X1"]["settle"] == "unknown (n=1)"
    assert claims["X1"]["estimate"]["low"] is None and claims["X1"]["estimate"]["high"] is None


def test_mix_ln_without_post_ln_layers_is_said_and_not_tested(tmp_path: Path, capsys) -> None:
    arms, out = PRE_POST_MIX, tmp_path / "out"
    assert run(report_study(tmp_path, "m", arms, "[2, 3]", seeds=2), out) == 0
    assert "note: mix_ln at depth 3 with mix_post_fraction 0.25 has 0 Post-LN layer(s) of 3" in capsys.readouterr().out
    claims = {f["id"]: f for f in check_report(out)}
    for cid in ("M1", "M1b"):
        assert claims[cid]["status"] == "not tested", claims[cid]
        assert "Mix-LN mixes at no depth of the grid" in claims[cid]["text"]
    # at depth 4 one layer of four is Post-LN: M1 is judged there, depth 2 is named as left out
    cfg = report_study(tmp_path, "m4", arms, "[2, 4]", seeds=2)
    assert run(cfg, tmp_path / "m4") == 0
    m1 = {f["id"]: f for f in check_report(tmp_path / "m4")}["M1"]
    assert m1["status"] != "not tested" and "At init, L=4" in m1["text"] and "Left out: at L = 2 floor(" in m1["text"]
    assert len(load_study(cfg).runs()) == 6


def test_nothing_trained_is_said_first(tmp_path: Path) -> None:
    out = tmp_path / "out"
    arms = "\n    pre: {model.placement: pre}\n    post: {model.placement: post}"
    assert run(report_study(tmp_path, "stuck", arms, "[1]", steps=2), out) == 0
    text = (out / "report.md").read_text()
    first = text.split("## Findings")[0]
    assert "No run of this study trained: 2 stuck on the unigram plateau" in first
    assert "more steps (train.steps; they ran 2) or a higher learning rate (the largest tried is 1e-3)" in first


def test_markdown_in_labels_keeps_the_tables(tmp_path: Path) -> None:
    arms = "\n    'a|b': {model.placement: pre}\n    \"x\\ny\": {model.placement: post}"
    out = tmp_path / "out"
    assert run(report_study(tmp_path, "md", arms, "[1]"), out) == 0
    check_report(out)
    text = (out / "report.md").read_text()
    assert "| a\\|b | 1 | 0 |" in text and "| x y | 1 | 0 |" in text


def test_damaged_records_and_caches_are_named_and_redone(tmp_path: Path, capsys) -> None:
    arms = "\n    pre: {model.placement: pre}\n    post: {model.placement: post}"
    cfg, out = report_study(tmp_path, "d", arms, "[2]", seeds=2), tmp_path / "out"
    assert run(cfg, out) == 0
    path = next((out / "runs").glob("variant=pre*.json"))
    good = json.loads(path.read_text())
    res, config, entry = good["result"], good["config"], good["result"]["diagnostics"][0]
    for key, damaged in (
        ("result.diagnostics", {"result": {**res, "diagnostics": [{}]}}),
        ("result.diagnostics", {"result": {**res, "diagnostics": [{**entry, "residual_rms": "x"}]}}),
        ("result.diagnostics", {"result": {**res, "diagnostics": [{**entry, "grad_norm": {"W_2": [1, "a"]}}]}}),
        ("result.init_grad", {"result": {**res, "init_grad": {"expected": 5}}}),
        ("result.eval", {"result": {**res, "eval": {**res["eval"], "curve": [[0]]}}}),
        ("result.layer_ablation", {"result": {**res, "layer_ablation": {"base": 1.0}}}),
        ("result.reference.floor", {"result": {**res, "reference": {**res["reference"], "floor": "x"}}}),
        ("result.reference.uniform", {"result": {**res, "reference": {**res["reference"], "uniform": 1e6}}}),
        ("config.train.lr", {"config": {**config, "train": {**config["train"], "lr": 0}}}),
    ):  # fmt: skip
        path.write_text(json.dumps({**good, **damaged}))
        capsys.readouterr()
        assert run(cfg, out) == 0
        captured = capsys.readouterr()
        assert f"warning: {path}: {key}" in captured.err and "1 already finished, 1 to run" in captured.out
        assert json.loads(path.read_text())["result"] == good["result"]  # redone, the same numbers
    cache = out / "init_profile.json"
    intact = cache.read_text()
    for damage in ('{"entries": 5}', "[]", '{"format": "lnblocks.study.lm.init_profile/1", "entries": [{"key": "k"}]}',
                   intact.replace('"depth": 2', '"depth": 7', 1), "{"):  # fmt: skip
        cache.write_text(damage)
        capsys.readouterr()
        assert run(cfg, out) == 0
        assert f"warning: {cache}" in capsys.readouterr().err
        assert json.loads(cache.read_text()) == json.loads(intact)  # measured again, the same


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full, a device every write to fails (ENOSPC)")
def test_a_plot_that_cannot_be_written_is_one_line_naming_it(tmp_path: Path, capsys) -> None:
    """A full disk under ``plots/`` (a plot linked to /dev/full, where every write fails with ENOSPC) is not a bug
    of the report: one line naming the file and exit 2, not a traceback, "please report it" and exit 0."""
    from lnblocks.cli import main as cli_main

    cfg = report_study(tmp_path, arms=PRE_POST_MIX, depths="[1]")
    out = tmp_path / "out"
    assert run_study(cfg, out, show_progress=False, report=False) == 0
    (out / "plots").mkdir()
    (out / "plots" / "loss_curves.png").symlink_to("/dev/full")
    capsys.readouterr()
    assert cli_main(["study", "report", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    path = out / "plots" / "loss_curves.png"
    assert err == f"lnblocks: error: [Errno 28] No space left on device: '{path}'", err
