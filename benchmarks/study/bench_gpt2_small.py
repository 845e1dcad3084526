"""What configs/gpt2_small_prepost.yaml costs: its FLOPs per token, measured CPU throughput (full size and shrunk),
and the GPU-hours estimate its header comment gives.

    .venv/bin/python benchmarks/study/bench_gpt2_small.py [--threads 2] [--peak-tflops 989] [--mfu 0.4]

Measured here (CPU): a dense fp32 matmul rate (the machine's ceiling), the full-size model's training step through
the study trainer (batch 1 x 1024, fp32, 4 steps) and the shrunk config's (what the CPU test runs). The FLOP count
6 N + 12 L d T (N: matmul parameters incl. the LM head) is checked against ``torch.utils.flop_counter`` on the model
itself, and turns the measured tokens/s into FLOP/s. The GPU figure is an estimate: an assumed MFU of the GPU's bf16
peak.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

import numpy as np
import torch

from lnblocks.study import load_study, train_run

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "gpt2_small_prepost.yaml"
ONE_RUN = {"variant": ["pre"], "train.lr": [6.0e-4]}
CPU_FULL = {
    **ONE_RUN,
    "train.steps": 4,
    "train.dtype": "fp32",
    "train.compile": False,
    "train.grad_accum": 1,
    "train.device": "cpu",
    "train.log_every": 1,
    "train.eval_every": 0,
    "data.batch_size": 1,
    "data.eval_batches": 1,
    "diagnostics.every": 0,
    "diagnostics.init_grad_batches": 0,
    "tracking.tensorboard": False,
}
SHRUNK = {  # what tests/study/lm/test_gpt2_config.py runs on the CPU
    **CPU_FULL,
    "train.steps": 20,
    "model.depth": 2,
    "model.dim": 32,
    "model.n_heads": 2,
    "data.seq_len": 64,
    "data.batch_size": 8,
    "train.grad_accum": 2,
    "train.dtype": "bf16",
}


def matmul_gflops(threads: int, n: int = 1024, k: int = 768, m: int = 3072, reps: int = 20) -> float:
    torch.set_num_threads(threads)
    a, b = torch.randn(n, k), torch.randn(k, m)
    for _ in range(3):
        a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n * k * m * reps / (time.perf_counter() - t0) / 1e9


def flops_per_token(depth: int, dim: int, vocab: int, seq: int) -> tuple[float, float]:
    """``(N, FLOPs/token)``: N = 12 L d^2 + V d matmul parameters; training FLOPs = 6 N + 12 L d T."""
    n = 12 * depth * dim**2 + vocab * dim
    return n, 6 * n + 12 * depth * dim * seq


def counted_flops_per_token(run) -> float:
    """Training FLOPs per token of the full-size model counted by ``torch.utils.flop_counter`` over one forward and
    backward (batch 1 x T; eager attention, so the score and value matmuls are counted as the formula counts them:
    the whole T x T square, no causal saving)."""
    from torch.utils.flop_counter import FlopCounterMode

    from lnblocks.models import GPT

    model = GPT(run.model.replace(attention={**run.model.attention, "backend": "eager"}).gpt_config(
        run.data.vocab_size, run.data.seq_len))  # fmt: skip
    x = torch.randint(0, run.data.vocab_size, (1, run.data.seq_len))
    with FlopCounterMode(display=False) as counter:
        model(x, x)[1].backward()
    return counter.get_total_flops() / run.data.seq_len


def tokens_per_second(overrides: dict, token_dir: Path, threads: int) -> tuple[float, dict]:
    study = load_study(
        CONFIG,
        overrides={
            **overrides,
            "data.train_path": str(token_dir / "train.bin"),
            "data.val_path": str(token_dir / "val.bin"),
            "train.threads": threads,
        },
    )
    (run,) = study.runs()
    torch.set_num_threads(threads)
    rec = train_run(run, show_progress=False)
    return run.data.batch_size * run.data.seq_len / (rec.time["step_ms"] / 1e3), rec.result.model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="GPU bf16 dense peak (H100/H200 SXM: 989)")
    parser.add_argument("--mfu", type=float, default=0.40, help="assumed model FLOPs utilisation on the GPU")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rng = np.random.default_rng(0)
        rng.integers(0, 50257, size=2_000_000, dtype=np.uint16).tofile(folder / "train.bin")
        rng.integers(0, 50257, size=100_000, dtype=np.uint16).tofile(folder / "val.bin")
        base = load_study(
            CONFIG,
            overrides={
                **ONE_RUN,
                "data.train_path": str(folder / "train.bin"),
                "data.val_path": str(folder / "val.bin"),
            },
        )
        run = base.runs()[0]
        paths = {"data.train_path": str(folder / "train.bin"), "data.val_path": str(folder / "val.bin")}
        n_runs = len(load_study(CONFIG, overrides=paths).runs())
        n, fpt = flops_per_token(run.model.depth, run.model.dim, run.data.vocab_size, run.data.seq_len)
        from lnblocks.models import GPT

        params = GPT(run.model.gpt_config(run.data.vocab_size, run.data.seq_len)).num_params()
        counted = counted_flops_per_token(run)
        mm = matmul_gflops(args.threads)
        tps_full, backends = tokens_per_second(CPU_FULL, folder, args.threads)
        tps_small, _ = tokens_per_second(SHRUNK, folder, args.threads)

    gpu_tps = args.peak_tflops * 1e12 * args.mfu / fpt
    tokens_per_run = run.train.steps * run.data.batch_size * run.data.seq_len
    hours = tokens_per_run / gpu_tps / 3600
    print(f"model: {params / 1e6:.1f}M parameters; matmul parameters N = 12 L d^2 + V d = {n / 1e6:.1f}M")
    print(f"FLOPs/token (training) = 6 N + 12 L d T = {fpt / 1e6:.0f} MFLOP")
    print(f"  counted by torch.utils.flop_counter (forward+backward): {counted / 1e6:.0f} MFLOP ({counted / fpt:.3f}x)")
    print(f"MEASURED, CPU, {args.threads} threads, fp32:")
    print(f"  dense matmul (1024x768 @ 768x3072): {mm:.1f} GFLOP/s")
    print(
        f"  full-size model, batch 1 x 1024: {tps_full:.1f} tokens/s = {tps_full * fpt / 1e9:.1f} GFLOP/s "
        f"({tps_full * fpt / 1e9 / mm:.2f}x the matmul rate); backends {backends}"
    )
    print(f"  shrunk config (test): {tps_small:,.0f} tokens/s")
    print(f"ESTIMATE, GPU at {args.peak_tflops:g} TFLOP/s bf16 peak and an ASSUMED {args.mfu:.0%} MFU:")
    print(
        f"  {gpu_tps:,.0f} tokens/s; {tokens_per_run / 1e6:.0f}M tokens per run -> {hours * 60:.0f} min per run, "
        f"{hours * n_runs:.1f} GPU-hours for the {n_runs} runs (before eval/diagnostics/compile overhead)"
    )


if __name__ == "__main__":
    main()
