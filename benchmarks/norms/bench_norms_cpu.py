"""lnblocks norm modules against torch.nn and the HF classes on CPU, as time ratios measured in one run.

    python benchmarks/norms/bench_norms_cpu.py [--threads N] [--rounds R] [--quick] [--json PATH]

For each (rows M, hidden N, dtype) it times inference forward (``torch.inference_mode``) and a training
forward+backward, interleaving the contenders round by round and reporting medians, then prints a markdown table
of times and ratios (reference time / lnblocks time: above 1 means lnblocks is faster). Every pair is also checked
for bit-identical outputs in the same run, so a speed-up can never come from different math.

It also answers "why is F.rms_norm slower than F.layer_norm on CPU?": the row ``rms(F)/ln(F)`` compares the two
functional calls directly, and ``lnblocks RMSNorm, no row blocks`` shows what the cache-sized row blocks buy.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

import torch
import torch.nn.functional as F
from torch import nn

import lnblocks
from lnblocks.norms import modules as norm_modules


def _hf(path: str, name: str) -> Callable[[int], nn.Module] | None:
    try:
        cls = getattr(importlib.import_module(path), name)
    except ImportError:
        return None
    return lambda n: cls(n, eps=1e-6)


PAIRS: list[tuple[str, Callable[[int], nn.Module] | None, Callable[[int], nn.Module]]] = [
    ("torch.nn.LayerNorm", lambda n: nn.LayerNorm(n), lambda n: lnblocks.LayerNorm(n)),
    ("torch.nn.RMSNorm", lambda n: nn.RMSNorm(n, eps=1e-6), lambda n: lnblocks.RMSNorm(n, eps=1e-6)),
    (
        "HF LlamaRMSNorm",
        _hf("transformers.models.llama.modeling_llama", "LlamaRMSNorm"),
        lambda n: lnblocks.build_norm("llama", n),
    ),
    (
        "HF GemmaRMSNorm",
        _hf("transformers.models.gemma.modeling_gemma", "GemmaRMSNorm"),
        lambda n: lnblocks.build_norm("gemma", n),
    ),
    (
        "HF T5LayerNorm",
        _hf("transformers.models.t5.modeling_t5", "T5LayerNorm"),
        lambda n: lnblocks.build_norm("t5", n),
    ),
]


def _time(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median seconds per call; contenders alternate inside each round so machine noise hits all alike."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def _infer(module: nn.Module, x: torch.Tensor) -> Callable[[], object]:
    def run() -> object:
        with torch.inference_mode():
            return module(x)

    return run


def _train(module: nn.Module, x: torch.Tensor, g: torch.Tensor) -> Callable[[], object]:
    xg = x.clone().requires_grad_(True)
    return lambda: module(xg).backward(g)


def bench_case(m: int, n: int, dtype: torch.dtype, rounds: int) -> list[dict]:
    x = torch.randn(m, n).to(dtype)
    g = torch.randn(m, n).to(dtype)
    rows = []
    for ref_name, make_ref, make_ours in PAIRS:
        if make_ref is None:
            continue
        ref, ours = make_ref(n).to(dtype), make_ours(n).to(dtype)
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        ours.load_state_dict(ref.state_dict())
        with torch.inference_mode():
            exact = torch.equal(ref(x), ours(x))
        t_fwd = _time({"ref": _infer(ref, x), "ours": _infer(ours, x)}, rounds)
        t_trn = _time({"ref": _train(ref, x, g), "ours": _train(ours, x, g)}, rounds)
        rows.append(
            {
                "reference": ref_name,
                "M": m,
                "N": n,
                "dtype": str(dtype).removeprefix("torch."),
                "bit_exact": exact,
                "fwd_ref_ms": t_fwd["ref"] * 1e3,
                "fwd_ours_ms": t_fwd["ours"] * 1e3,
                "fwd_speedup": t_fwd["ref"] / t_fwd["ours"],
                "train_ref_ms": t_trn["ref"] * 1e3,
                "train_ours_ms": t_trn["ours"] * 1e3,
                "train_speedup": t_trn["ref"] / t_trn["ours"],
            }
        )
    return rows


def bench_functional(m: int, n: int, dtype: torch.dtype, rounds: int) -> dict:
    """F.rms_norm vs F.layer_norm, and lnblocks RMSNorm with and without CPU row blocks (inference)."""
    x = torch.randn(m, n).to(dtype)
    w, b = torch.randn(n).to(dtype), torch.randn(n).to(dtype)
    ours = lnblocks.RMSNorm(n, eps=1e-6).to(dtype)
    saved = norm_modules.CPU_BLOCK_BYTES

    def unblocked() -> object:
        norm_modules.CPU_BLOCK_BYTES = 1 << 62
        try:
            return ours(x)
        finally:
            norm_modules.CPU_BLOCK_BYTES = saved

    with torch.inference_mode():
        t = _time(
            {
                "F.layer_norm": lambda: F.layer_norm(x, (n,), w, b, 1e-5),
                "F.rms_norm": lambda: F.rms_norm(x, (n,), w, 1e-6),
                "lnblocks RMSNorm": lambda: ours(x),
                "lnblocks RMSNorm, no row blocks": unblocked,
            },
            rounds,
        )
    return {"M": m, "N": n, "dtype": str(dtype).removeprefix("torch."), **{k: v * 1e3 for k, v in t.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small shape, few rounds (a smoke run)")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw numbers here")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds per contender (default 20)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    shapes = [(512, 1024)] if args.quick else [(4096, 1024), (1024, 4096), (256, 8192)]
    rounds = args.rounds or (5 if args.quick else 20)
    dtypes = [torch.float32, torch.bfloat16]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {rounds} interleaved rounds\n")

    rows = [r for m, n in shapes for dt in dtypes for r in bench_case(m, n, dt, rounds)]
    print(
        "| reference | M x N | dtype | bit-exact | fwd ms ref / ours | fwd speed-up | train ms ref / ours "
        "| train speed-up |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['reference']} | {r['M']}x{r['N']} | {r['dtype']} | {'yes' if r['bit_exact'] else 'NO'} "
            f"| {r['fwd_ref_ms']:.2f} / {r['fwd_ours_ms']:.2f} | {r['fwd_speedup']:.2f}x "
            f"| {r['train_ref_ms']:.2f} / {r['train_ours_ms']:.2f} | {r['train_speedup']:.2f}x |"
        )

    funcs = [bench_functional(m, n, dt, rounds) for m, n in shapes for dt in dtypes]
    print(
        "\n| M x N | dtype | F.layer_norm ms | F.rms_norm ms | rms/ln | lnblocks RMSNorm ms | without row blocks ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for f in funcs:
        print(
            f"| {f['M']}x{f['N']} | {f['dtype']} | {f['F.layer_norm']:.2f} | {f['F.rms_norm']:.2f} "
            f"| {f['F.rms_norm'] / f['F.layer_norm']:.1f}x | {f['lnblocks RMSNorm']:.2f} "
            f"| {f['lnblocks RMSNorm, no row blocks']:.2f} |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"modules": rows, "functional": funcs}, indent=2))


if __name__ == "__main__":
    main()
