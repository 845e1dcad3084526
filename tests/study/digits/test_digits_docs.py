"""The small-batch results of docs/cnn.md are the report's output, not typed by hand: the committed per-run results of
the shipped config (``docs/results/cnn_digits_results.csv``, the ``results.csv`` of ``lnblocks study run
configs/cnn_digits.yaml``) rebuild that page's accuracy table, SwitchableNorm table and verdicts exactly."""

from __future__ import annotations

import csv
from pathlib import Path

from lnblocks.study import load_study
from lnblocks.study.digits.claims import claim_line, claims, switch_weight_table
from lnblocks.study.digits.report import markdown_table, summarize

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "docs" / "results" / "cnn_digits_results.csv"


def test_docs_small_batch_section_is_the_reports_output() -> None:
    with open(RESULTS, newline="") as f:
        rows = list(csv.DictReader(f))
    study = load_study(REPO / "configs" / "cnn_digits.yaml")
    assert sorted(r["run_id"] for r in rows) == sorted(r.run_id for r in study.runs())  # every run of that config
    section = (REPO / "docs" / "cnn.md").read_text().split("\n## Small-batch study\n")[1].split("\n## ")[0]
    assert markdown_table(summarize(rows)) in section
    assert switch_weight_table(rows) in section
    for claim in claims(rows):
        assert claim_line(claim) in section, f"docs/cnn.md lacks the report's line:\n{claim_line(claim)}"
