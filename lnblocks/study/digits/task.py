"""The ``cnn_digits`` task: thirteen CNN norm arms (``lnblocks.study.digits.arms``) on sklearn's digits across batch
sizes and seeds, testing what their papers claim about batch-size dependence (``lnblocks.study.digits.claims``)::

    lnblocks study run configs/cnn_digits.yaml --out runs/cnn_digits

A study file of this task (``task: cnn_digits``) holds the keys of ``DigitsStudyConfig``: the training settings
(``DigitsSettings``, every run's options) and the grid lists ``norms``, ``batch_sizes``, ``seeds`` (the axes
``norm`` x ``batch_size`` x ``seed``). The report (``lnblocks.study.digits.report``) is built from the run records.
"""

from __future__ import annotations

from typing import Any

from lnblocks.config import ConfigValueError
from lnblocks.study.core.grid import GridAxis
from lnblocks.study.core.records import RunRecord
from lnblocks.study.core.tasks import RunContext, Task
from lnblocks.study.digits.config import GRID_KEYS, DigitsRunConfig, DigitsStudyConfig
from lnblocks.study.digits.report import build_digits_report
from lnblocks.study.digits.result import DigitsResult

AXES = {"norms": "norm", "batch_sizes": "batch_size", "seeds": "seed"}


def read_grid(raw: dict[str, Any]) -> tuple[dict[str, Any], tuple[GridAxis, ...], tuple]:
    """What a ``cnn_digits`` file holds in place of ``grid:``: the settings (``DigitsSettings``) and the lists
    ``norms``, ``batch_sizes``, ``seeds``, validated as a ``DigitsStudyConfig``; returns the settings as the base
    options and the axes ``norm`` x ``batch_size`` x ``seed`` (the core's reading otherwise)."""
    if "grid" in raw:
        raise ConfigValueError("grid", f"a cnn_digits study sets its grid with the lists {list(GRID_KEYS)}")
    cfg = DigitsStudyConfig.from_dict(raw)
    axes = tuple(GridAxis(axis, tuple((str(v), ((axis, v),)) for v in getattr(cfg, key))) for key, axis in AXES.items())
    return cfg.settings(), axes, ()


def train(run: DigitsRunConfig, ctx: RunContext) -> RunRecord:
    from lnblocks.study.digits.train import train_run

    return train_run(run)


def outcome(record: RunRecord) -> str:
    r = record.result
    return f"{record.id}: test accuracy {r.test_acc:.1f}% ({r.steps} steps, {record.time['wall_s']:.0f} s)"


TASK = Task(
    name="cnn_digits",
    run_type=DigitsRunConfig,
    read_grid=read_grid,
    train=train,
    outcome=outcome,
    report=build_digits_report,
    result_type=DigitsResult,
)
