"""Experiments on lnblocks' norms: a study file (YAML grid) -> one run per grid point -> typed run records -> report.

Three parts with one-way imports: ``core`` (study files, ``StudyConfig``, the task registry, the one run loop and its
executors: local pool, Ray, torchrun; run records, statistics, claims) knows no task; the tasks ``lm`` (the Pre-LN
vs Post-LN placement study of language models: ``configs/xiong2020_quick.yaml``, the demo) and ``digits`` (task
``cnn_digits``, the CNN small-batch study: ``configs/cnn_digits.yaml``) import the core and the library, never each
other. The library (norms, kernels, blocks, models, hf, cnn) never imports this package.

``load_study(path, overrides=...)`` validates a study file, ``run_study(config, out_dir, workers, executor="local" |
"ray")`` trains what has no valid record yet and builds the report, ``build_report(out_dir)`` rebuilds the report
from the records alone; ``train_run(RunConfig)`` is one run of the ``lm`` task, ``RunRecord`` what every run
produces. The names below load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from lnblocks.study.core.tasks import register_task

register_task("lm", "lnblocks.study.lm.task", default=True)
register_task("cnn_digits", "lnblocks.study.digits.task")

_PUBLIC = {
    "AnalysisConfig": "lnblocks.study.lm.config",
    "DataConfig": "lnblocks.study.lm.config",
    "DiagnosticsConfig": "lnblocks.study.lm.config",
    "ModelConfig": "lnblocks.study.lm.model_config",
    "OptimizerConfig": "lnblocks.study.lm.config",
    "RunConfig": "lnblocks.study.lm.config",
    "TrainConfig": "lnblocks.study.lm.config",
    "DivergenceMonitor": "lnblocks.study.lm.run.loop_state",
    "detect_divergence": "lnblocks.study.lm.run.loop_state",
    "lr_sensitivity": "lnblocks.study.lm.report.analysis",
    "max_stable_lr": "lnblocks.study.lm.report.analysis",
    "lr_at": "lnblocks.study.lm.run.optim",
    "train_run": "lnblocks.study.lm.run.train",
    "StudyConfig": "lnblocks.study.core.study_config",
    "load_study": "lnblocks.study.core.study_config",
    "study_from_dict": "lnblocks.study.core.study_config",
    "RecordError": "lnblocks.study.core.records",
    "RunRecord": "lnblocks.study.core.records",
    "read_record": "lnblocks.study.core.tasks",
    "write_record": "lnblocks.study.core.records",
    "build_report": "lnblocks.study.core.report",
    "run_study": "lnblocks.study.core.runner",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'lnblocks.study' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
