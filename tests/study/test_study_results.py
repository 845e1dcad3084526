"""Committed results and the README's verdict tables: the claims recomputed from an exported summary equal the
report's, and every README claims block equals what the claim code renders from docs/results (never hand-typed)."""

from __future__ import annotations

import json
from pathlib import Path

from lnblocks.study import run_study
from lnblocks.study.lm.docs_results import RESULTS, claims, export, readme_blocks, render_block, update_readme

ROOT = Path(__file__).resolve().parents[2]
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


def test_readme_claims_tables_equal_the_committed_results() -> None:
    text = (ROOT / "README.md").read_text()
    blocks = readme_blocks(text)
    assert set(blocks) == {"xiong2020_quick", "wortsman2023_quick", "placements", "xiong2020_heldout"}
    for name, block in blocks.items():
        assert block == render_block(RESULTS / name), f"README claims block {name!r} is stale: run " + (
            "python -m lnblocks.study.lm.docs_results readme README.md"
        )
    assert update_readme(text) == text
