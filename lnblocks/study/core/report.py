"""Build a study's report from ``OUT/study.json`` and ``OUT/runs/*.json`` alone, for any task: the valid records
go to the task's ``report``. Rebuildable at any time with ``lnblocks study report OUT``.

Records that are missing or fail validation are named (file and key) on stderr and handed to the task's report,
which names them too; the report is built from the valid ones. The report reads the records ``study.json`` lists,
never others: a folder without one is an error (``runs/`` may hold records of other configs), and so is a
``study.json`` that cannot be read or whose run ids are not plain file names inside ``runs/``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lnblocks.study.core.checkpoint_folders import orphans, orphans_note, study_bases
from lnblocks.study.core.records import RecordError, RunRecord, read_json
from lnblocks.study.core.tasks import get_task, read_record

_RUN_ID = re.compile(r"[^\x00-\x1f./\\][^\x00-\x1f/\\]{0,199}")  # a file name in runs/: not hidden, . or ..


def read_manifest(out: Path) -> dict[str, Any]:
    """``out/study.json``, checked: a JSON object whose ``run_ids`` are file names inside ``runs/`` and whose
    ``task`` (if any) is a string; ``RecordError`` naming the file and key otherwise."""
    path = out / "study.json"
    if not path.exists():
        if (out / "runs").is_dir():
            raise FileNotFoundError(
                f"{out} has no study.json, so which of runs/*.json belong to one study is unknown (the folder may hold "
                f"records of other configs); `lnblocks study run CONFIG --out {out}` rewrites it, keeping finished runs"
            )
        raise FileNotFoundError(f"{out} is not a study output folder (no study.json, no runs/)")
    manifest = read_json(path, "study manifest")
    if not isinstance(manifest, dict):
        raise RecordError(str(path), "", f"must be a JSON object, got {type(manifest).__name__}")
    ids = manifest.get("run_ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise RecordError(str(path), "run_ids", "must be a list of run ids (strings)")
    bad = [i for i in ids if not _RUN_ID.fullmatch(i)]
    if bad:
        raise RecordError(str(path), "run_ids", f"must be file names inside runs/, got {bad[0][:60]!r}")
    if not isinstance(manifest.get("task", ""), str) or not isinstance(manifest.get("analysis", {}) or {}, dict):
        raise RecordError(str(path), "task", "and analysis must be a string and a mapping")
    return manifest


def load_records(out_dir: str | Path) -> tuple[list[RunRecord], dict[str, Any], list[str]]:
    """The valid run records of the study in ``out_dir`` (those ``study.json`` lists), its manifest, and one line
    per listed run without a valid record (missing, truncated, a key missing...)."""
    out = Path(out_dir)
    manifest = read_manifest(out)
    ids = manifest["run_ids"]
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
    out_dir: str | Path,
    *,
    plots: bool = True,
    echo: bool = True,
    show_progress: bool | None = None,
    open_executor: Callable[[int], Any] | None = None,
    note_orphans: bool = True,
) -> int:
    """Rebuild the report of the study in ``out_dir`` from its records (any task); 1 if there is no valid record.
    ``show_progress``: draw progress bars of the report's own work (default: when stderr is a terminal, as the
    runner's bars). ``open_executor(n)``: an executor for ``n`` jobs of the report's own (the lm task's init
    profiles), e.g. the study's; None: the task computes them in this process. ``note_orphans``: name the checkpoint
    folders of runs that are no runs of the study now (``core.checkpoint_folders``; the runner names them when it
    starts)."""
    out = Path(out_dir)
    records, manifest, problems = load_records(out)
    for line in problems:
        print(f"warning: {line}", file=sys.stderr)
    note = orphans_note(out, orphans(study_bases(out, manifest), set(manifest["run_ids"]))) if note_orphans else None
    if note is not None:
        print(note, file=sys.stderr)
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
    show = sys.stderr.isatty() if show_progress is None else show_progress
    return get_task(task).report(
        out, records, manifest, problems, plots=plots, echo=echo, show_progress=show, open_executor=open_executor
    )
