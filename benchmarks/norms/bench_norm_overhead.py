"""Per-call overhead of lnblocks norm modules against the HF / torch modules they replace, on the same ATen ops.

    python benchmarks/norms/bench_norm_overhead.py [--rounds 400] [--calls 20] [--threads 1]

Each pair (``lnblocks.build_norm(preset)`` with the reference's weights, and the reference module) runs the same
ATen ops, so the time difference is the Python work around them: input checks, backend choice, dispatch. Small inputs
(a one-token decode step, a few rows) make that work visible. Per round, ``--calls`` calls of one module are timed
(thread CPU time, so other processes on a shared machine do not count), then the same of the other, in alternating
order; the table gives per-call medians and the paired difference
(median over rounds, 95% interval of the median by order statistics). Every pair is first checked bit-identical.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

import lnblocks


def _references(hidden: int) -> dict[str, tuple[str, torch.nn.Module]]:
    """preset -> (name of the reference, reference module)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    return {
        "llama": ("HF LlamaRMSNorm", LlamaRMSNorm(hidden, eps=1e-6)),
        "rmsnorm": ("torch.nn.RMSNorm", torch.nn.RMSNorm(hidden, eps=1e-6)),
        "layernorm": ("torch.nn.LayerNorm", torch.nn.LayerNorm(hidden)),
    }


def _per_call_us(module: torch.nn.Module, x: torch.Tensor, calls: int) -> float:
    t0 = time.thread_time_ns()
    for _ in range(calls):
        module(x)
    return (time.thread_time_ns() - t0) / calls / 1e3


def median_interval(values: list[float]) -> tuple[float, float, float]:
    """Median and its distribution-free 95% interval (order statistics of the binomial(n, 1/2))."""
    v = sorted(values)
    n = len(v)
    half = 1.96 * math.sqrt(n) / 2
    lo, hi = max(0, int(n / 2 - half)), min(n - 1, math.ceil(n / 2 + half))
    return statistics.median(v), v[lo], v[hi]


def compare(ours, ref, x: torch.Tensor, rounds: int, calls: int) -> dict[str, float]:
    for _ in range(20):  # warm-up (and the first call's one-time checks)
        ours(x)
        ref(x)
    a, b, d = [], [], []
    for i in range(rounds):
        if i % 2:
            tb, ta = _per_call_us(ref, x, calls), _per_call_us(ours, x, calls)
        else:
            ta, tb = _per_call_us(ours, x, calls), _per_call_us(ref, x, calls)
        a.append(ta)
        b.append(tb)
        d.append(ta - tb)
    med, lo, hi = median_interval(d)
    return dict(ours=statistics.median(a), ref=statistics.median(b), diff=med, lo=lo, hi=hi)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--presets", nargs="+", default=["llama", "rmsnorm", "layernorm"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shapes = {"decode (1, 1, H)": (1, 1, args.hidden), "8 rows (8, H)": (8, args.hidden)}
    setup = f"{args.threads} thread(s), H={args.hidden}, {args.rounds} rounds x {args.calls} calls"
    print(f"torch {torch.__version__}, {setup}")
    print()
    print("| reference | input | mode | reference µs | lnblocks µs | lnblocks - reference µs (median, 95% CI) |")
    print("|---|---|---|---:|---:|---:|")
    refs = _references(args.hidden)
    for preset in args.presets:
        name, ref = refs[preset]
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        ours = lnblocks.build_norm(preset, args.hidden, eps=1e-6 if preset != "layernorm" else 1e-5)
        ours.load_state_dict(ref.state_dict())
        for label, shape in shapes.items():
            x = torch.randn(shape)
            assert torch.equal(ours(x), ref(x)), f"{preset}: outputs differ"
            for mode in ("no_grad", "grad"):
                ctx = torch.no_grad() if mode == "no_grad" else torch.enable_grad()
                with ctx:
                    r = compare(ours, ref, x, args.rounds, args.calls)
                print(
                    f"| {name} | {label} | {mode} | {r['ref']:.2f} | {r['ours']:.2f} | "
                    f"{r['diff']:+.2f} [{r['lo']:+.2f}, {r['hi']:+.2f}] |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
