"""Build a study's report from ``OUT/study.json`` and ``OUT/runs/*.json`` alone, for any task: the valid records
go to the task's ``report``. Rebuildable at any time with ``lnblocks study report OUT``.

Records that are missing or fail validation are named (file and key) on stderr and handed to the task's report,
which names them too; the report is built from the valid ones. A ``study.json`` that cannot be read is an error
naming it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lnblocks.study.core.records import RecordError, RunRecord, read_json, read_record
from lnblocks.study.core.tasks import get_task


def load_records(out_dir: str | Path) -> tuple[list[RunRecord], dict[str, Any], list[str]]:
    """The valid run records of the study in ``out_dir`` (those listed in ``study.json`` when it exists), its
    manifest, and one line per listed run without a valid record (missing, truncated, a key missing...)."""
    out = Path(out_dir)
    manifest: dict[str, Any] = {}
    if (out / "study.json").exists():
        manifest = read_json(out / "study.json", "study manifest")
        if not isinstance(manifest, dict) or not isinstance(manifest.get("run_ids", []), list):
            raise RecordError(str(out / "study.json"), "run_ids", "must be a list of run ids in a JSON object")
    elif not (out / "runs").is_dir():
        raise FileNotFoundError(f"{out} is not a study output folder (no study.json, no runs/)")
    ids = manifest.get("run_ids") or [p.stem for p in sorted((out / "runs").glob("*.json"))]
    records, problems = [], []
    for run_id in ids:
        path = out / "runs" / f"{run_id}.json"
        if not path.exists():
            problems.append(f"{path}: no record (not run yet, running, or failed)")
            continue
        try:
            records.append(read_record(path))
        except RecordError as err:
            problems.append(str(err))
    return records, manifest, problems


def build_report(
    out_dir: str | Path, *, plots: bool = True, echo: bool = True, open_executor: Callable[[int], Any] | None = None
) -> int:
    """Rebuild the report of the study in ``out_dir`` from its records (any task); 1 if there is no valid record.
    ``open_executor(n)``: an executor for ``n`` jobs of the report's own (the lm task's init profiles), e.g. the
    study's; None: the task computes them in this process."""
    out = Path(out_dir)
    records, manifest, problems = load_records(out)
    for line in problems:
        print(f"warning: {line}", file=sys.stderr)
    if problems:
        print(
            f"warning: {len(problems)} of {len(problems) + len(records)} runs have no valid record; "
            "`lnblocks study run` redoes them",
            file=sys.stderr,
        )
    if not records:
        print(f"no finished runs under {out / 'runs'}")
        return 1
    tasks = sorted({r.task for r in records})
    task = manifest.get("task") or tasks[0]
    if tasks != [task]:
        raise RecordError(str(out / "runs"), "task", f"records of several tasks {tasks} in one study folder")
    return get_task(task).report(out, records, manifest, problems, plots=plots, echo=echo, open_executor=open_executor)
