"""What ``make demo`` runs: the Pre-LN vs Post-LN stability study of ``configs/xiong2020_quick.yaml``.

Byte-level Shakespeare, width 64, depths 3 and 12, Pre-LN and Post-LN, two learning rates with and without warmup,
two seeds (Xiong et al. 2020 at CPU scale). Runs go to ``runs/xiong2020_quick`` (a rerun skips finished runs and
only rebuilds the report); the LR table and the findings, each with its estimate and 95% interval, are printed at
the end.
The norm parity table of the earlier demo is ``lnblocks parity``.
"""

from __future__ import annotations

import os
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "xiong2020_quick.yaml"
OUT = Path("runs") / "xiong2020_quick"


def main(out_dir: str | Path = OUT, workers: int | None = None) -> int:
    """Run (or resume) the quick study into ``out_dir`` with one worker per CPU core, then print its findings."""
    from lnblocks.study import run_study

    if not CONFIG.is_file():
        raise FileNotFoundError(f"{CONFIG} not found: the demo runs from a source checkout of lnblocks")
    workers = workers or max(1, min(os.cpu_count() or 1, 8))
    print(
        f"lnblocks demo: Pre-LN vs Post-LN warmup sensitivity and gradient norms across depth\n"
        f"config {CONFIG.name}, {workers} worker(s), results in {out_dir}/ (about 6 min on 2 idle CPU cores)\n",
        flush=True,
    )
    code = run_study(CONFIG, out_dir, workers=workers)  # prints the LR table and each finding with its numbers
    print(f"\nEvery number behind the findings, and the rules that judge them: {Path(out_dir) / 'report.md'}")
    return code
