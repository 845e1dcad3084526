"""The ``lm`` task's report, built from its run records alone (``lnblocks study report OUT``): ``summary.csv``,
``plots/*.png``, ``report.md`` (``lnblocks.study.lm.report.markdown``) and ``findings.json``, with the LR table and
the findings printed. Runs without a valid record are named in ``report.md``; the numbers come from the valid ones.
The report never fails once runs have trained: a claim family or plot that raises is named in the report and on
stderr and the rest is written."""

from __future__ import annotations

import csv
import io
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lnblocks.study.core.atomic import write_json_atomic, write_text_atomic
from lnblocks.study.core.records import RunRecord
from lnblocks.study.lm.config import AnalysisConfig
from lnblocks.study.lm.report.analysis import run_row
from lnblocks.study.lm.report.init_profile import study_profiles
from lnblocks.study.lm.report.markdown import lr_table, nothing_trained, render_markdown


def write_summary_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """``summary.csv``: one row per run, columns in ``run_row``'s order (atomically)."""
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    write_text_atomic(path, text.getvalue())


def _guarded(what: str, failures: list[str], fn: Any, default: Any) -> Any:
    """``fn()``, or ``default`` with one line in ``failures`` (and the traceback on stderr) when it raises: the
    report is still written. An ``OSError`` (a full disk) is not a bug to report: it propagates."""
    try:
        return fn()
    except OSError:  # the disk or the folder, not a bug: the report stops with one line naming the file
        raise
    except Exception as err:  # a bug in one claim family or plot must not cost the whole report
        line = f"{what} could not be computed ({type(err).__name__}: {' '.join(str(err).split())[:200]})"
        failures.append(line + "; please report it with this study's records")
        print(f"warning: {line}\n{traceback.format_exc()}", file=sys.stderr)
        return default


def build_lm_report(
    out: Path,
    records: list[RunRecord],
    manifest: dict[str, Any],
    problems: list[str],
    *,
    plots: bool = True,
    echo: bool = True,
    show_progress: bool | None = None,
    open_executor: Callable[[int], Any] | None = None,
) -> int:
    """Write ``summary.csv``, ``plots/``, ``report.md`` and ``findings.json`` of an ``lm`` study into ``out`` and
    print the summary. ``show_progress``: draw the init-profile bar (default: when stderr is a terminal).
    ``open_executor(n)``: the study's executor for the ``n`` init-profile jobs (None: here)."""
    analysis = AnalysisConfig.from_dict(manifest.get("analysis"), key="analysis")
    rows = [run_row(r, analysis) for r in records]
    write_summary_csv(rows, out / "summary.csv")
    from lnblocks._optional import require

    require("numpy")  # the statistics behind the findings
    from lnblocks.study.lm.report.findings import study_claims

    show = sys.stderr.isatty() if show_progress is None else show_progress
    failures: list[str] = []
    profiles = _guarded(
        "the init gradient profiles", failures,
        lambda: study_profiles(
            out, records, analysis.init_profile, show_progress=show, open_executor=open_executor
        ), [],
    )  # fmt: skip
    findings = _guarded("the claims", failures, lambda: study_claims(rows, profiles), [])
    made = []
    if plots:
        from lnblocks.study.lm.report.plots import all_plots

        made = _guarded("the plots", failures, lambda: all_plots(records, rows, out / "plots"), [])
    text = render_markdown(manifest, records, rows, findings, made, analysis, problems, profiles, failures)
    write_text_atomic(out / "report.md", text)
    write_json_atomic(out / "findings.json", [f.to_dict() for f in findings])
    if echo:
        if not any(r["outcome"] == "trained" for r in rows):
            print(nothing_trained(rows, analysis))
        print("\n".join(lr_table(rows)))
        for f in findings:
            settle = f"; would settle it: {f.settle()}" if f.settle() else ""
            print(f"- {f.id} {f.title}: {f.status}" + (f" ({f.estimate}{settle})" if f.estimate else ""))
        print(f"report: {out / 'report.md'}  summary: {out / 'summary.csv'}  plots: {out / 'plots'}")
    return 0
