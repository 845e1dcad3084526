"""Run a study grid: skip finished runs, train the rest (in parallel over local cores, or with DDP under
``torchrun``), write one JSON per run atomically, then build the report.

Layout of ``OUT``: ``study.json`` (the resolved study and its run ids), ``runs/<run id>.json`` (one per finished
run), and what ``build_report`` writes (``summary.csv``, ``report.md``, ``plots/``). A run writes its file only when
it ends (``tmp`` file + ``os.replace``), so a killed run leaves no partial result: the next invocation removes the
dead process's temp file and redoes that run from scratch, and never touches a finished one.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from lnblocks.study.config import RunConfig
from lnblocks.study.grid import StudyConfig, load_study
from lnblocks.study.train import RECORD_FORMAT, DistContext, train_run

TMP_MARK = ".tmp-"


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically: a reader sees the old file or the complete new one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, allow_nan=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_tmp(folder: Path) -> list[Path]:
    """Delete temp files left by processes that no longer run (a killed run); return what was removed."""
    removed = []
    for p in folder.glob(f".*{TMP_MARK}*"):
        pid = p.name.rpartition(TMP_MARK)[2]
        if not pid.isdigit() or not _pid_alive(int(pid)) or int(pid) == os.getpid():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def load_record(path: Path) -> dict[str, Any] | None:
    """The run record at ``path`` if it is complete and readable, else None (then the run is redone)."""
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if (
        not isinstance(rec, dict)
        or rec.get("format") != RECORD_FORMAT
        or rec.get("status") not in ("finished", "diverged")
    ):
        return None
    return rec


def pending_runs(study: StudyConfig, runs_dir: Path) -> tuple[list[RunConfig], int]:
    """Runs without a complete record, most expensive first (balances parallel workers); and how many are done."""
    runs = study.runs()
    todo = [r for r in runs if load_record(runs_dir / f"{r.run_id}.json") is None]
    todo.sort(key=lambda r: -(r.model.depth * r.model.dim**2 * r.train.steps))
    return todo, len(runs) - len(todo)


def _outcome_line(rec: dict[str, Any]) -> str:
    ev = rec["eval"]["final"]
    msg = f"diverged at step {rec['diverged_step']}" if rec["status"] == "diverged" else f"eval loss {ev:.3f}"
    return f"{rec['id']}: {msg} ({rec['time']['wall_s']:.0f} s)"


def _execute(run: RunConfig, runs_dir: str, show: bool, position: int) -> tuple[str, str | None, str | None]:
    """Train one run and write its record; returns ``(run id, outcome line, error)`` (errors do not stop a sweep)."""
    try:
        rec = train_run(run, show_progress=show, position=position)
        write_json_atomic(Path(runs_dir) / f"{run.run_id}.json", rec)
        return run.run_id, _outcome_line(rec), None
    except Exception:  # a bug or a config the model rejects: report it, keep the other runs going
        return run.run_id, None, traceback.format_exc()


_POSITION = 0


def _init_worker(threads: int, positions: Any) -> None:
    global _POSITION
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # denormals made the pilot's sweep several times slower (stability.md §7)
    _POSITION = positions.get()


def _work(args: tuple[RunConfig, str, bool]) -> tuple[str, str | None, str | None]:
    run, runs_dir, show = args
    return _execute(run, runs_dir, show, _POSITION)


def _bar(total: int, initial: int, show: bool) -> Any:
    from lnblocks._optional import require

    return require("tqdm").tqdm(
        total=total, initial=initial, desc="runs", position=0, disable=not show, dynamic_ncols=True
    )


def dist_from_env() -> DistContext:
    """The ``torchrun`` rank/world size from the environment (world size 1 when not launched by torchrun)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return DistContext(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))


def _prepare(study: StudyConfig, out: Path) -> Path:
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(runs_dir)
    remove_stale_tmp(out)
    write_json_atomic(out / "study.json", {**study.to_dict(), "run_ids": [r.run_id for r in study.runs()]})
    return runs_dir


def run_study(
    config: str | Path | StudyConfig,
    out_dir: str | Path,
    workers: int = 1,
    *,
    show_progress: bool | None = None,
    report: bool = True,
) -> int:
    """Run every unfinished run of ``config`` into ``out_dir`` and build the report; 0 if every run has a record.

    ``workers`` > 1: a pool of spawned processes, each with ``cpu_count // workers`` torch threads. Launched by
    ``torchrun`` (WORLD_SIZE > 1): every run trains with DDP over the ranks (gloo on CPU, nccl on GPU).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    study = config if isinstance(config, StudyConfig) else load_study(config)
    out = Path(out_dir)
    show = sys.stderr.isatty() if show_progress is None else show_progress
    dist = dist_from_env()
    if dist.enabled:
        return _run_distributed(study, out, dist, show, report)
    runs_dir = _prepare(study, out)
    todo, done = pending_runs(study, runs_dir)
    total = done + len(todo)
    print(f"study {study.name!r}: {total} runs, {done} already finished, {len(todo)} to run -> {out}", flush=True)
    errors: list[tuple[str, str]] = []
    bar = _bar(total, done, show)

    def finished(run_id: str, line: str | None, err: str | None) -> None:
        bar.update(1)
        if err is not None:
            errors.append((run_id, err))
            bar.write(f"{run_id}: FAILED\n{err}")
        else:
            bar.write(line or run_id)

    try:
        if workers == 1 or len(todo) <= 1:
            torch.set_flush_denormal(True)  # denormals made the pilot's sweep several times slower (stability.md §7)
            try:
                for run in todo:
                    finished(*_execute(run, str(runs_dir), show, 1))
            finally:
                torch.set_flush_denormal(False)  # torch's default: leave the caller's process as it was
        else:
            n = min(workers, len(todo))
            threads = max(1, (os.cpu_count() or 1) // n)
            ctx = mp.get_context("spawn")
            positions = ctx.Manager().Queue()
            for i in range(n):
                positions.put(i + 1)
            with ctx.Pool(n, initializer=_init_worker, initargs=(threads, positions)) as pool:
                for result in pool.imap_unordered(_work, [(r, str(runs_dir), show) for r in todo]):
                    finished(*result)
    finally:
        bar.close()
    for run_id, _ in errors:
        print(f"run {run_id} failed (see the traceback above); rerun the same command to retry it", file=sys.stderr)
    code = 1 if errors else 0
    if report:
        from lnblocks.study.report import build_report

        code = build_report(out) or code
    return code


def _run_distributed(study: StudyConfig, out: Path, dist: DistContext, show: bool, report: bool) -> int:
    import torch.distributed as td

    use_cuda = torch.cuda.is_available() and study.base.train.device != "cpu"
    if not td.is_initialized():
        td.init_process_group("nccl" if use_cuda else "gloo")
    if use_cuda:
        torch.cuda.set_device(dist.local_rank)
    torch.set_flush_denormal(True)
    try:
        payload: list[Any] = [None]
        if dist.is_main:
            runs_dir = _prepare(study, out)
            todo, done = pending_runs(study, runs_dir)
            print(
                f"study {study.name!r} with DDP over {dist.world_size} ranks ({td.get_backend()}): "
                f"{done + len(todo)} runs, {done} already finished, {len(todo)} to run -> {out}",
                flush=True,
            )
            payload = [[r.run_id for r in todo]]
        td.broadcast_object_list(payload, src=0)
        by_id = {r.run_id: r for r in study.runs()}
        for run_id in payload[0]:
            rec = train_run(by_id[run_id], dist=dist, show_progress=show)
            if dist.is_main:
                write_json_atomic(out / "runs" / f"{run_id}.json", rec)
                print(_outcome_line(rec), flush=True)
            td.barrier()
        code = 0
        if report and dist.is_main:
            from lnblocks.study.report import build_report

            code = build_report(out)
        td.barrier()
        return code
    finally:
        td.destroy_process_group()
