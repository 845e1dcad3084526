"""Cost of the study's diagnostics: training step time with every diagnostic on (grad norms per layer and group,
update/weight ratios, residual-stream norms, eager-attention probe for attention-logit maxima, output logits; every
10 steps) against a plain training step, as a ratio in one run. Target: <= 1.15x.

    .venv/bin/python benchmarks/study/bench_study.py [--depths 3 12] [--steps 100] [--repeats 3] [--threads 1]

Times are CPU seconds of this process per training step (robust on a shared machine; equal to wall time on an
idle core with one thread), median over repeats, alternating the settings. "Every step" logs at every step (an
upper bound that makes the per-log cost visible, and ``1 + (that - 1) / 10`` is the every-10 ratio it implies,
steadier than the direct ratio on a busy machine); the one-off init cost (Xiong's expected gradient over 4 batches)
is reported separately.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

import torch

from lnblocks.study import RunConfig, train_run


def run_config(depth: int, steps: int, every: int, init_batches: int) -> RunConfig:
    return RunConfig.from_dict(
        {
            "data": {"source": "shakespeare", "seq_len": 64, "batch_size": 16, "eval_batches": 1},
            "model": {"depth": depth, "dim": 64, "n_heads": 4, "placement": "post", "init": "xavier"},
            "train": {"steps": steps, "lr": 1e-3, "optimizer": {"name": "adam", "beta2": 0.98}},
            "diagnostics": {"every": every, "init_grad_batches": init_batches},
        }
    )


def measure(depth: int, steps: int, repeats: int) -> dict[str, float]:
    plain, diag, every_step, init = [], [], [], []
    train_run(run_config(depth, 5, 0, 0), show_progress=False)  # warm-up: corpus load, allocator
    for _ in range(repeats):
        plain.append(train_run(run_config(depth, steps, 0, 0), show_progress=False).time["step_cpu_ms"])
        rec = train_run(run_config(depth, steps, 10, 0), show_progress=False)
        diag.append(rec.time["step_cpu_ms"])
        every_step.append(train_run(run_config(depth, steps // 4, 1, 0), show_progress=False).time["step_cpu_ms"])
        with_init = train_run(run_config(depth, 1, 0, 4), show_progress=False).time["cpu_s"]
        without = train_run(run_config(depth, 1, 0, 0), show_progress=False).time["cpu_s"]
        init.append(max(with_init - without, 0.0))
    p, d, e = statistics.median(plain), statistics.median(diag), statistics.median(every_step)
    return {"plain_ms": p, "diag_ms": d, "ratio": d / p, "every1": e / p, "init_s": statistics.median(init)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--depths", type=int, nargs="+", default=[3, 12])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), d=64, 4 heads, T=64, batch 16, Post-LN, Adam; "
        f"{args.steps} steps, median of {args.repeats}"
    )
    print(
        "| depth | plain step (CPU ms) | diagnostics every 10 (CPU ms) | ratio | ratio, every step "
        "| every 10 implied by the per-log cost | init grad (s) |"
    )
    print("|---|---|---|---|---|---|---|")
    for depth in args.depths:
        m = measure(depth, args.steps, args.repeats)
        print(
            f"| {depth} | {m['plain_ms']:.1f} | {m['diag_ms']:.1f} | {m['ratio']:.3f}x | {m['every1']:.2f}x "
            f"| {1 + (m['every1'] - 1) / 10:.3f}x | {m['init_s']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
