"""The small-batch study: BatchNorm, GroupNorm, LayerNorm2d, InstanceNorm and BatchRenorm on sklearn's digits
across batch sizes and seeds, reproducing (or not) Wu & He (2018), Fig. 1, at toy scale. One command::

    python -m lnblocks.cnn.digits_study --out runs/cnn_digits [--config configs/cnn_digits.yaml] [--quick]

Writes ``runs/<run id>.json`` (one per grid point, atomically; existing ones are reused, so an interrupted study
resumes), ``results.csv`` (all runs), ``summary.csv``, ``table.md``, ``accuracy_vs_batch.png`` and ``report.md``,
whose verdict sentence is also printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from lnblocks.cnn.digits_config import NORM_LABELS, DigitsRun, DigitsStudyConfig
from lnblocks.cnn.digits_report import markdown_table, plot, summarize, verdict, write_csv
from lnblocks.cnn.digits_train import load_digits_data, schedule, train_run


@dataclass(frozen=True)
class StudyResult:
    """What a study produced: every run's row, the verdict, the files, how many runs were trained vs reused."""

    rows: list[dict]
    verdict: str
    files: dict[str, Path]
    trained: int
    reused: int


def grid(cfg: DigitsStudyConfig) -> list[DigitsRun]:
    """Every (norm, batch size, seed), in config order."""
    fp = cfg.run_fingerprint()
    return [DigitsRun(n, b, s, fp) for n in cfg.norms for b in cfg.batch_sizes for s in cfg.seeds]


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def run_study(cfg: DigitsStudyConfig, out: str | Path, progress: bool = True) -> StudyResult:
    """Train every grid point not already in ``out/runs/``, then write the table, plot and report."""
    try:
        from tqdm.auto import tqdm
    except ImportError as err:
        raise ImportError("the digits study's progress bar needs tqdm: pip install 'lnblocks[study]'") from err
    out = Path(out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    runs = grid(cfg)
    todo = [r for r in runs if not (out / "runs" / f"{r.run_id}.json").exists()]
    if todo:
        data = load_digits_data(cfg)
        n = data.x_train.shape[0]
        total = sum(schedule(cfg, n, r.batch_size)[1] for r in todo)
        with tqdm(total=total, unit="step", disable=not progress, desc="digits study", mininterval=1.0) as bar:
            for r in todo:
                bar.set_postfix_str(f"{NORM_LABELS[r.norm]} batch {r.batch_size} seed {r.seed}")
                row = train_run(r, cfg, data, on_step=lambda: bar.update(1))
                _write_json_atomic(out / "runs" / f"{r.run_id}.json", row)
    rows = [json.loads((out / "runs" / f"{r.run_id}.json").read_text()) for r in runs]
    cells = summarize(rows)
    text = verdict(cells)
    files = {
        "results": out / "results.csv",
        "summary": out / "summary.csv",
        "table": out / "table.md",
        "plot": out / "accuracy_vs_batch.png",
        "report": out / "report.md",
        "config": out / "config.json",
    }
    write_csv(files["results"], rows)
    write_csv(files["summary"], [dataclasses.asdict(c) for c in cells])
    table = markdown_table(cells)
    files["table"].write_text(table + "\n")
    plot(cells, files["plot"])
    files["config"].write_text(json.dumps(cfg.to_dict(), indent=2))
    loss_table = markdown_table(summarize(rows, "final_train_loss"), "training loss, last epoch, train mode", 3)
    cpu_s = sum(float(r["seconds"]) for r in rows)
    topped_up = sorted({c.batch_size for c in cells if c.epochs > cfg.epochs})
    if topped_up:
        text_note = (
            f"\n\nProtocol note: batch size(s) {topped_up} trained for more than {cfg.epochs} epochs to reach "
            f"min_steps={cfg.min_steps}, so they had more SGD time (lr x steps) than the others; differences between "
            "those columns and the rest partly reflect the training budget, not the normalization."
        )
    else:
        text_note = ""
    files["report"].write_text(_report(cfg, table + text_note, loss_table, text, cpu_s))
    return StudyResult(rows, text, files, len(todo), len(runs) - len(todo))


def _report(cfg: DigitsStudyConfig, table: str, loss_table: str, text: str, seconds: float) -> str:
    return f"""# Small-batch study on sklearn digits (lnblocks.cnn)

{text}

{table}

![test accuracy vs batch size](accuracy_vs_batch.png)

The mean training loss of the last epoch, measured in train mode (BatchNorm and BatchRenorm normalise with the
batch's own statistics there, so their noise at small batches shows here even where eval accuracy does not move):

{loss_table}

Setup: sklearn's bundled 8x8 digits, stratified split ({1 - cfg.test_fraction:.0%} train / {cfg.test_fraction:.0%}
test, split seed {cfg.split_seed}); CNN with conv widths {list(cfg.widths)}, conv3x3-norm-ReLU blocks, 2x2 max-pool
after the second block, global average pool, linear head. SGD, momentum {cfg.sgd_momentum}, weight decay
{cfg.weight_decay}, cosine schedule, lr = {cfg.base_lr} x batch/32 (linear scaling, Wu & He 2018), {cfg.epochs}
epochs (at least {cfg.min_steps} steps); test accuracy in eval mode (BatchNorm and BatchRenorm use running
statistics, momentum {cfg.bn_momentum}). GroupNorm: {cfg.gn_groups} groups. BatchRenorm: r_max {cfg.renorm_r_max},
d_max {cfg.renorm_d_max}, warm-up {cfg.renorm_warmup_frac:.0%} of the steps, then a linear ramp over
{cfg.renorm_ramp_frac:.0%}. Seeds {list(cfg.seeds)} set the initialisation and the batch order. Training time over
all runs: {seconds / 60:.1f} min.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lnblocks.cnn.digits_study", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory (runs/, tables, plot, report)")
    parser.add_argument("--config", help="YAML config (keys of DigitsStudyConfig); default: the built-in one")
    parser.add_argument("--quick", action="store_true", help="smoke version (seconds): 1 seed, batch 4 and 32")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    args = parser.parse_args(argv)
    cfg = DigitsStudyConfig.from_yaml(args.config) if args.config else DigitsStudyConfig()
    if args.quick:
        cfg = cfg.quick()
    start = time.perf_counter()
    result = run_study(cfg, args.out, progress=not args.no_progress)
    print(Path(result.files["table"]).read_text())
    print(result.verdict)
    print(
        f"{result.trained} runs trained, {result.reused} reused, {time.perf_counter() - start:.0f} s; "
        f"report: {result.files['report']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
