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
from lnblocks.study.core.records import RunRecord
from lnblocks.study.core.study_config import GridAxis, StudyConfig
from lnblocks.study.core.tasks import RunContext, Task
from lnblocks.study.digits.config import GRID_KEYS, DigitsRunConfig, DigitsSettings, DigitsStudyConfig
from lnblocks.study.digits.report import build_digits_report
from lnblocks.study.digits.result import DigitsResult

AXES = {"norms": "norm", "batch_sizes": "batch_size", "seeds": "seed"}


def check_key(key: str, where: str) -> None:
    names = [*DigitsSettings.field_names(), *AXES.values()]
    if key not in names:
        raise ConfigValueError(key, f"is not a config key (in {where}); valid keys of a digits run: {names}")


def make_run(tree: dict[str, Any], labels: tuple[tuple[str, str], ...]) -> DigitsRunConfig:
    return DigitsRunConfig.from_dict(tree).with_labels(labels)


def digits_study(cfg: DigitsStudyConfig, *, name: str, description: str = "", source: str = "") -> StudyConfig:
    """The ``StudyConfig`` of a ``DigitsStudyConfig``: its settings as the base options, axes norm x batch_size x
    seed from its lists."""
    axes = tuple(GridAxis(axis, tuple((str(v), ((axis, v),)) for v in getattr(cfg, key))) for key, axis in AXES.items())
    study = StudyConfig(
        name=name,
        task="cnn_digits",
        options=cfg.settings(),
        make_run=make_run,
        check_key=check_key,
        axes=axes,
        description=description,
        source=source,
    )
    study.runs()
    return study


def study_from_dict(raw: dict[str, Any], *, name: str, description: str = "", source: str = "") -> StudyConfig:
    if "grid" in raw:
        raise ConfigValueError("grid", f"a cnn_digits study sets its grid with the lists {list(GRID_KEYS)}")
    return digits_study(DigitsStudyConfig.from_dict(raw), name=name, description=description, source=source)


def train(run: DigitsRunConfig, ctx: RunContext) -> RunRecord:
    from lnblocks.study.digits.train import train_run

    return train_run(run)


def outcome(record: RunRecord) -> str:
    r = record.result
    return f"{record.id}: test accuracy {r.test_acc:.1f}% ({r.steps} steps, {record.time['wall_s']:.0f} s)"


TASK = Task(
    name="cnn_digits",
    study_from_dict=study_from_dict,
    train=train,
    outcome=outcome,
    report=build_digits_report,
    result_type=DigitsResult,
)
