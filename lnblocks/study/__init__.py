"""Pre-LN vs Post-LN stability studies: a YAML grid -> one run per point -> run records -> report.

``load_study(path)`` validates a config (``configs/*.yaml``), ``run_study(config, out_dir, workers)`` runs what is
not finished yet and builds the report, ``build_report(out_dir)`` rebuilds ``summary.csv``, plots and ``report.md``
from the run records. ``train_run(RunConfig)`` is one run. See configs/xiong2020_quick.yaml for the demo.
"""

from lnblocks.study.config import DataConfig, DiagnosticsConfig, ModelConfig, OptimizerConfig, RunConfig, TrainConfig
from lnblocks.study.grid import AnalysisConfig, StudyConfig, load_study
from lnblocks.study.metrics import DivergenceMonitor, detect_divergence, lr_at, lr_sensitivity, max_stable_lr
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
    "RunConfig",
    "StudyConfig",
    "TrainConfig",
    "build_report",
    "detect_divergence",
    "load_study",
    "lr_at",
    "lr_sensitivity",
    "max_stable_lr",
    "run_study",
    "train_run",
]
