"""The CNN small-batch study as a runner task: thirteen arms (BatchNorm, GroupNorm, LayerNorm2d, InstanceNorm,
BatchRenorm, SwitchableNorm, FRN + TLU, EvoNorm-S0/B0, GroupNorm + weight standardization, normalizer-free with AGC,
weight norm, LRN; ``lnblocks.study.digits.arms``) on sklearn's digits across batch sizes and seeds, testing what
their papers claim about batch-size dependence (``lnblocks.study.digits.claims``) at toy scale::

    lnblocks study run configs/cnn_digits.yaml --out runs/cnn_digits

A study file of this task (``task: cnn_digits``) holds the keys of ``DigitsStudyConfig``: the training settings and
the grid lists ``norms``, ``batch_sizes``, ``seeds``. The report (``results.csv``, ``summary.csv``, ``table.md``,
``accuracy_vs_batch.png``, ``report.md``) is built from the run records, and its verdicts are printed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from lnblocks.config import ConfigValueError
from lnblocks.study.digits.config import GRID_KEYS, NORM_LABELS, DigitsRunConfig, DigitsSettings, DigitsStudyConfig
from lnblocks.study.grid import GridAxis, StudyConfig
from lnblocks.study.records import RunRecord, write_json_atomic
from lnblocks.study.tasks import Task

AXES = {"norms": "norm", "batch_sizes": "batch_size", "seeds": "seed"}


def check_key(key: str, where: str) -> None:
    names = [*DigitsSettings.field_names(), *AXES.values()]
    if key not in names:
        raise ConfigValueError(key, f"is not a config key (in {where}); valid keys of a digits run: {names}")


def make_run(tree: dict[str, Any], labels: tuple[tuple[str, str], ...]) -> DigitsRunConfig:
    return DigitsRunConfig.from_dict(tree).with_labels(labels)


def study_config(cfg: DigitsStudyConfig, *, name: str, description: str = "", source: str = "") -> StudyConfig:
    """The runner's ``StudyConfig`` of a ``DigitsStudyConfig``: axes norm x batch_size x seed."""
    axes = tuple(GridAxis(axis, tuple((str(v), ((axis, v),)) for v in getattr(cfg, key))) for key, axis in AXES.items())
    study = StudyConfig(
        name=name,
        task="cnn_digits",
        options=cfg.settings(),
        make_run=make_run,
        check_key=check_key,
        axes=axes,
        analysis=cfg,
        description=description,
        source=source,
    )
    study.runs()
    return study


def study_from_dict(raw: dict[str, Any], *, name: str, description: str = "", source: str = "") -> StudyConfig:
    if "grid" in raw:
        raise ConfigValueError("grid", f"a cnn_digits study sets its grid with the lists {list(GRID_KEYS)}")
    return study_config(DigitsStudyConfig.from_dict(raw), name=name, description=description, source=source)


def train(run: DigitsRunConfig, show_progress: bool = False, position: int = 0) -> RunRecord:
    from lnblocks.study.digits.train import train_run

    return train_run(run)


def outcome(record: RunRecord) -> str:
    r = record.result
    return f"{record.id}: test accuracy {r.test_acc:.1f}% ({r.steps} steps, {record.time['wall_s']:.0f} s)"


def row(record: RunRecord) -> dict[str, Any]:
    """The flat row of ``results.csv`` (the columns of the digits study before the runner; SwitchableNorm's
    ``switch_weights`` as a JSON string, empty for the other arms)."""
    c, r = record.config, record.result
    result = dataclasses.asdict(r)
    result["switch_weights"] = json.dumps(r.switch_weights) if r.switch_weights is not None else ""
    result["agc_grad_ratio"] = "" if r.agc_grad_ratio is None else r.agc_grad_ratio
    return {"run_id": record.id, "norm": c["norm"], "batch_size": c["batch_size"], "seed": c["seed"],
            **result, "seconds": record.time["wall_s"], "cpu_s": record.time.get("cpu_s", "")}  # fmt: skip


def report(
    out: Path, records: list[RunRecord], manifest: dict[str, Any], problems: list[str], plots: bool, echo: bool
) -> int:
    from lnblocks.study.digits.claims import claims, switch_weight_table
    from lnblocks.study.digits.report import markdown_table, plot, summarize, write_csv

    cfg = DigitsStudyConfig.from_dict(manifest.get("analysis") or {})
    rows = [row(r) for r in records]
    cells = summarize(rows)
    verdicts = "\n".join(c.line() for c in claims(rows))
    write_csv(out / "results.csv", rows)
    write_csv(out / "summary.csv", [dataclasses.asdict(c) for c in cells])
    table = markdown_table(cells)
    (out / "table.md").write_text(table + "\n")
    if plots:
        plot(cells, out / "accuracy_vs_batch.png")
    write_json_atomic(out / "config.json", cfg.to_dict())
    loss_table = markdown_table(summarize(rows, "final_train_loss"), "training loss, last epoch, train mode", 3)
    topped_up = sorted({c.batch_size for c in cells if c.epochs > cfg.epochs})
    if topped_up:
        table += (
            f"\n\nProtocol note: batch size(s) {topped_up} trained for more than {cfg.epochs} epochs to reach "
            f"min_steps={cfg.min_steps}, so they had more SGD time (lr x steps) than the others; differences between "
            "those columns and the rest partly reflect the training budget, not the normalization."
        )
    if problems:
        table += f"\n\n{len(problems)} runs have no valid record and are not in the table:\n" + "\n".join(
            f"- {p}" for p in problems
        )
    cpu_s = sum(float(r["cpu_s"] or r["seconds"]) for r in rows)
    sn_table = switch_weight_table(rows)
    (out / "report.md").write_text(_report(cfg, table, loss_table, sn_table, verdicts, cpu_s, len(rows)))
    if echo:
        print(table.split("\n\n")[0])
        print(verdicts)
        print(f"report: {out / 'report.md'}")
    return 0


def _report(
    cfg: DigitsStudyConfig, table: str, loss_table: str, sn_table: str, verdicts: str, cpu_s: float, runs: int
) -> str:
    sn = (
        f"""
SwitchableNorm's learned importance weights at the end of training (softmax of the logits; 1/3 each at init),
per layer, mean over seeds:

{sn_table}
"""
        if sn_table
        else ""
    )
    return f"""# Small-batch study on sklearn digits (lnblocks.cnn norms)

What the papers claim about batch-size dependence, tested with 95% t-intervals over seeds (REPRODUCED, DID NOT
REPRODUCE, or INCONCLUSIVE when an interval straddles the claim's threshold; rules in `lnblocks.study.digits.claims`):

{verdicts}

{table}

![test accuracy vs batch size](accuracy_vs_batch.png)
{sn}
The mean training loss of the last epoch, measured in train mode (BatchNorm and BatchRenorm normalise with the
batch's own statistics there, so their noise at small batches shows here even where eval accuracy does not move):

{loss_table}

Setup: sklearn's bundled 8x8 digits, stratified split ({1 - cfg.test_fraction:.0%} train / {cfg.test_fraction:.0%}
test, split seed {cfg.split_seed}); CNN with conv widths {list(cfg.widths)}, one block per width (a 3x3 conv and the
arm's norm and activation, `lnblocks.study.digits.arms`), 2x2 max-pool after the second block, global average pool,
linear head. SGD, momentum {cfg.sgd_momentum}, weight decay {cfg.weight_decay}, linear warm-up over
{cfg.warmup_frac:.0%} of the steps then cosine, lr = {cfg.base_lr} x batch/32 (linear scaling, Wu & He 2018),
{cfg.epochs} epochs (at least {cfg.min_steps} steps); test accuracy in eval mode (batch-statistics norms use their
running statistics, momentum {cfg.bn_momentum}). GroupNorm (with and without WS) and EvoNorm-S0: {cfg.gn_groups}
groups. BatchRenorm: r_max {cfg.renorm_r_max}, d_max {cfg.renorm_d_max}, warm-up {cfg.renorm_warmup_frac:.0%} of the
steps, then a linear ramp over {cfg.renorm_ramp_frac:.0%}. NF: AGC clipping {cfg.agc_clipping} on the blocks, not
the head. WeightNorm: data-dependent init on {cfg.wn_init_images} training images. Seeds {list(cfg.seeds)} set the
initialisation and the batch order. {runs} runs; training CPU time over all runs: {cpu_s / 60:.1f} min.
"""


def legacy_main(argv: list[str] | None = None) -> int:
    """``python -m lnblocks.cnn.digits_study``: the digits study's command before the runner (same options)."""
    import argparse

    from lnblocks.study.grid import load_study
    from lnblocks.study.runner import run_study

    parser = argparse.ArgumentParser(prog="python -m lnblocks.cnn.digits_study", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory (runs/, tables, plot, report)")
    parser.add_argument("--config", help="YAML config (keys of DigitsStudyConfig); default: the built-in one")
    parser.add_argument("--quick", action="store_true", help="smoke version (seconds): 1 seed, batch 4 and 32")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    parser.add_argument("--workers", type=int, default=1, help="parallel worker processes (default 1)")
    args = parser.parse_args(argv)
    if args.config:
        study = load_study(args.config, task="cnn_digits")
        cfg, name, description = study.analysis, study.name, study.description
    else:
        cfg, name, description = DigitsStudyConfig(), "cnn_digits", ""
    if args.quick:
        cfg = cfg.quick()
    study = study_config(cfg, name=name, description=description, source=args.config or "")
    return run_study(study, args.out, workers=args.workers, show_progress=not args.no_progress)


TASK = Task(name="cnn_digits", study_from_dict=study_from_dict, train=train, outcome=outcome, report=report)

__all__ = ["NORM_LABELS", "TASK", "DigitsRunConfig", "DigitsSettings", "DigitsStudyConfig", "legacy_main"]
