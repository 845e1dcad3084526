"""Experiments on lnblocks' norms: a study file (YAML grid) -> one run per grid point -> typed run records -> report.

One runner serves every kind of experiment (a *task*): ``lm``, the Pre-LN vs Post-LN placement study of
language models (``configs/xiong2020_quick.yaml``, the demo), and ``cnn_digits``, the CNN small-batch study
(``configs/cnn_digits.yaml``). ``load_study(path, overrides=...)`` validates a study file, ``run_study(config,
out_dir, workers, executor="local" | "ray")`` trains what has no valid record yet (on this machine or as Ray tasks)
and builds the report, ``build_report(out_dir)`` rebuilds the report from the records alone. Runs train on the
built-in sources or the user's corpus (``lnblocks.study.corpus``), with curves in TensorBoard
(``lnblocks.study.tracking``). ``train_run(RunConfig)`` is one run of the ``lm`` task; ``RunRecord`` is what every
run produces. The library (norms, kernels, blocks, models, hf, cnn) never imports this package.
"""

from lnblocks.study.config import (
    AnalysisConfig,
    DataConfig,
    DiagnosticsConfig,
    ModelConfig,
    OptimizerConfig,
    RunConfig,
    TrainConfig,
)
from lnblocks.study.grid import StudyConfig, load_study, study_from_dict
from lnblocks.study.metrics import DivergenceMonitor, detect_divergence, lr_at, lr_sensitivity, max_stable_lr
from lnblocks.study.records import RecordError, RunRecord, read_record, write_record
from lnblocks.study.report import build_report
from lnblocks.study.runner import run_study
from lnblocks.study.train import train_run

__all__ = [
    "AnalysisConfig",
    "DataConfig",
    "DiagnosticsConfig",
    "DivergenceMonitor",
    "ModelConfig",
    "OptimizerConfig",
    "RecordError",
    "RunConfig",
    "RunRecord",
    "StudyConfig",
    "TrainConfig",
    "build_report",
    "detect_divergence",
    "load_study",
    "lr_at",
    "lr_sensitivity",
    "max_stable_lr",
    "read_record",
    "run_study",
    "study_from_dict",
    "train_run",
    "write_record",
]
