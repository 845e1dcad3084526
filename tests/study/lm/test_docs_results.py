"""Committed results and the docs made from them: the claims recomputed from an exported summary equal the report's,
every claims block of README.md / docs/*.md equals what the claim code renders from docs/results, and every figure
under docs/img is what its results draw now (never hand-typed or hand-drawn), and a stale one is found."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

from PIL import Image

from lnblocks.study import run_study
from lnblocks.study.lm.report.docs_results import (
    FIGURES,
    HASH_KEY,
    RESULTS,
    claims,
    claims_blocks,
    doc_pages,
    export,
    figure_spec,
    main,
    render_block,
    spec_hash,
    stale_figures,
    update_blocks,
)
from lnblocks.study.lm.report.plots import draw_figure

ROOT = Path(__file__).resolve().parents[3]
IMG = ROOT / "docs" / "img"
STUDIES = {"xiong2020_quick", "wortsman2023_quick", "placements", "xiong2020_heldout", "frontier_quick",
           "frontier_heldout"}  # fmt: skip
TINY = """
name: tiny_claims
data: {source: markov, vocab_size: 16, seq_len: 16, batch_size: 8, eval_batches: 1}
model: {dim: 32, n_heads: 4}
train: {steps: 12}
diagnostics: {every: 4, init_grad_batches: 2, probe_batch_size: 4}
analysis: {init_profile: {seeds: 3, batches: 2}}
grid:
  model.placement: [pre, post]
  model.depth: [1, 2]
  train.lr: [1.0e-3, 1.0e-1]
  train.warmup: [0, 4]
"""


def test_exported_results_give_the_reports_claims(tmp_path: Path) -> None:
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    assert run_study(cfg, tmp_path / "out", workers=1, show_progress=False) == 0
    dest = export(tmp_path / "out", tmp_path / "results")
    reported = json.loads((tmp_path / "out" / "findings.json").read_text())
    recomputed = [c.to_dict() for c in claims(dest)]
    assert recomputed == reported and len(reported) == 8
    profiles = json.loads((dest / "init_profiles.json").read_text())
    assert {tuple(p["grad"]) for p in profiles} == {("W_2",)} and len(profiles) == 4


def test_docs_claims_tables_equal_the_committed_results() -> None:
    seen: dict[str, str] = {}
    for page in doc_pages(ROOT):
        text = page.read_text()
        for name, block in claims_blocks(text).items():
            assert name not in seen, f"claims block {name!r} is in both {seen[name]} and {page.name}"
            seen[name] = page.name
            assert block == render_block(RESULTS / name), f"{page.name}: claims block {name!r} is stale: run " + (
                "python -m lnblocks.study.lm.report.docs_results docs"
            )
        assert update_blocks(text) == text
    assert set(seen) == STUDIES


def test_docs_figures_are_what_the_committed_results_draw() -> None:
    assert stale_figures(IMG) == [], "stale figures: run python -m lnblocks.study.lm.report.docs_results docs"
    readme = (ROOT / "README.md").read_text()
    pages = "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    for name in FIGURES:  # each on the README or on a docs page
        shown = f"](docs/img/{name}.png)" in readme or f"](img/{name}.png)" in pages
        assert shown, f"neither README.md nor a docs page embeds docs/img/{name}.png"
        with Image.open(IMG / f"{name}.png") as im:
            assert im.text[HASH_KEY] == spec_hash(figure_spec(name))
            assert "Software" not in im.text  # no version tag or date: the bytes depend on the data only


def test_a_stale_figure_is_found(tmp_path: Path) -> None:
    """Changed results make exactly the figure drawn from them stale; so does a PNG whose pixels were changed."""
    root = tmp_path / "results"
    shutil.copytree(RESULTS, root)
    summary = root / "wortsman2023_quick" / "summary.csv"
    with open(summary, newline="") as f:
        rows = list(csv.DictReader(f))
    rows[0]["final_attn_max_logit"] = str(float(rows[0]["final_attn_max_logit"]) * 50)
    with open(summary, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert stale_figures(IMG, root) == ["attn_logit_vs_lr"]

    img = tmp_path / "img"
    shutil.copytree(IMG, img)
    spec = figure_spec("init_grad_profile")
    draw_figure({**spec, "title": "a different title"}, img / "init_grad_profile.png", {HASH_KEY: spec_hash(spec)})
    assert stale_figures(img) == ["init_grad_profile"]


def test_docs_command_refreshes_blocks_and_figures_wherever_they_are(tmp_path: Path, capsys) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "# r\n\n<!-- claims:xiong2020_quick -->\nold\n<!-- /claims:xiong2020_quick -->\n"
    )
    page = tmp_path / "docs" / "a.md"
    page.write_text("text\n<!-- claims:placements -->\n<!-- /claims:placements -->\nmore\n")
    args = ["docs", "--repo", str(tmp_path)]
    assert main([*args, "--check"]) == 1
    assert "README.md:xiong2020_quick" in capsys.readouterr().err
    assert main(args) == 0
    updated = json.loads(capsys.readouterr().out)["updated"]
    scratch_page = f"{page.relative_to(tmp_path).as_posix()}:placements"  # a page of the scratch repo only
    assert updated == ["README.md:xiong2020_quick", scratch_page] + [f"docs/img/{n}.png" for n in FIGURES]
    assert claims_blocks(page.read_text())["placements"] == render_block(RESULTS / "placements")
    assert page.read_text().startswith("text\n") and page.read_text().endswith("more\n")
    for name in FIGURES:
        assert (tmp_path / "docs" / "img" / f"{name}.png").read_bytes() == (IMG / f"{name}.png").read_bytes()
    assert main([*args, "--check"]) == 0


# Studies whose committed summary was exported with today's run ids (the placements, Wortsman and held-out Xiong
# summaries were exported before changes that moved their ids; their claims are recomputed from the summary's
# columns, which hold no config)
IDS_PINNED = ("xiong2020_quick",)


def test_committed_results_are_the_configs_runs() -> None:
    """The pinned studies' committed run ids are their configs': a library change that moved a stored field (and so
    every id) would orphan the committed results and every user's records."""
    from lnblocks.study import load_study

    for name in IDS_PINNED:
        with open(RESULTS / name / "summary.csv", newline="") as f:
            committed = sorted(row["id"] for row in csv.DictReader(f))
        assert committed == sorted(r.run_id for r in load_study(ROOT / "configs" / f"{name}.yaml").runs()), name
