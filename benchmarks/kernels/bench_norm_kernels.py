"""Fused LayerNorm/RMSNorm kernels against torch eager, torch.compile, Liger-Kernel and flash-attn's Triton norm.

    python benchmarks/kernels/bench_norm_kernels.py [--out PREFIX] [--budget-s 420] [--variants] [--smoke]

Measures the device's copy bandwidth first (``dst.copy_(src)`` of 1 GiB), then times forward, backward and
forward+backward of LayerNorm and RMSNorm, with and without the fused residual add, in bf16 and fp32, for M = 16384
and 1024 rows and N in {1024, ..., 16384}. Each cell is the median of CUDA-event timings with the L2 cache flushed
before every repetition, reported as time, GB/s of the bytes the pass must move (read x, write y, and so on; the
same count for every contender) and percent of the measured copy bandwidth. Writes ``PREFIX.md``, ``PREFIX.json``
(rewritten after every configuration, so an interrupted run keeps what it measured) and ``PREFIX.png``.

Contenders: ``ours`` (``lnblocks.kernels.fused_add_norm``), ``torch`` (``x + r`` then ``F.layer_norm`` /
``F.rms_norm``), ``compile`` (``torch.compile`` of that eager code; skipped once ``--budget-s`` is spent), and
``liger`` / ``flash-attn`` where importable. ``--variants`` checks the single-block limits: ``ours-looped`` (the
chunked path forced with ``max_block_n=4096``) at N = 8192, and ``ours-single`` (one block of 16384, the tile that
spills 88-784 bytes, see kernel_resources.py) at N = 16384, where ``ours`` loops. Without CUDA (or with
``--smoke``) it runs a tiny CPU version in seconds, the kernels under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

import torch

from benchmarks.common.timing import Timer  # CUDA events with an L2 flush per repetition
from benchmarks.kernels.traffic import Operands, min_bytes  # the one byte count every contender is divided by

PASSES = ("fwd", "bwd", "fwd+bwd")
TARGETS = {"fwd": 90.0, "bwd": 80.0}  # % of copy bandwidth for N >= 2048: near the memory limit


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench_norm_kernels", help="output prefix for .md/.json/.png")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run (automatic without CUDA)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop compiling torch.compile after this many s")
    ap.add_argument("--variants", action="store_true", help="also time other tiles at N = 8192 and 16384")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--report-only", action="store_true", help="rebuild PREFIX.md/.png from PREFIX.json (cut-off run)")
    ap.add_argument("--no-plot", action="store_true", help="write no PREFIX.png")
    return ap.parse_args()


def copy_bandwidth(device: torch.device, timer: Timer, nbytes: int) -> float:
    """GB/s of a device-to-device copy (read + write), the ceiling a memory-bound kernel can approach."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    return 2 * nbytes / timer(lambda: dst.copy_(src)) / 1e9


def bytes_moved(pas: str, m: int, n: int, elem: int, residual: bool, layer_norm: bool) -> int:
    """Bytes a pass must move (``traffic.min_bytes``): fwd reads x (and r), writes y (and x + r) and the fp32 stats;
    bwd reads the saved input, dy (and the new residual's gradient) and the stats, writes dx, dW (and dB)."""
    op = Operands(n, elem, elem if residual else 0, elem, elem if layer_norm else 0, elem, False, layer_norm)
    return min_bytes(pas, m, op)


# ---- contenders -----------------------------------------------------------------------------------------------------
def contenders(layer_norm: bool, n: int, eps: float, args: argparse.Namespace, smoke: bool) -> dict[str, object]:
    """name -> fn(x, r, w, b) returning y or (y, x + r); or a string saying why the contender is missing."""
    import torch.nn.functional as F

    from lnblocks.kernels import fused_add_norm
    from lnblocks.norms.spec import LayerNormSpec, RMSNormSpec

    spec = LayerNormSpec(eps=eps) if layer_norm else RMSNormSpec(eps=eps)

    def eager(x, r, w, b):
        h = x if r is None else x + r
        y = F.layer_norm(h, (n,), w, b, eps) if layer_norm else F.rms_norm(h, (n,), w, eps)
        return y if r is None else (y, h)

    out: dict[str, object] = {
        "ours": lambda x, r, w, b: fused_add_norm(x, r, w, b, spec),
        "torch": eager,
        "compile": "skipped (smoke run)" if smoke else torch.compile(eager, dynamic=False),
    }
    if args.variants and n == 8192:
        out["ours-looped"] = lambda x, r, w, b: fused_add_norm(x, r, w, b, spec, max_block_n=4096)
    if args.variants and n == 16384:
        out["ours-single"] = lambda x, r, w, b: fused_add_norm(x, r, w, b, spec, max_block_n=16384)
    out["liger"] = _liger(layer_norm, eps) if not smoke else "skipped (smoke run)"
    out["flash-attn"] = _flash_attn(layer_norm, eps) if not smoke else "skipped (smoke run)"
    return out


def _liger(layer_norm: bool, eps: float) -> object:
    """Liger-Kernel's norms (RMSNorm with the residual: its fused add+RMSNorm; LayerNorm: add, then its kernel)."""
    try:
        if layer_norm:
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction as Fn

            def fn(x, r, w, b):
                h = x if r is None else x + r
                y = Fn.apply(h, w, b, eps)
                return y if r is None else (y, h)
        else:
            from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction as AddFn
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction as Fn

            def fn(x, r, w, b):
                if r is not None:
                    return AddFn.apply(x, r, w, eps, 0.0, "llama", False)  # (y, x + r); offset, casting, in_place
                return Fn.apply(x, w, eps, 0.0, "llama", False)  # offset, casting_mode, in_place=False
    except ImportError as err:
        return f"not importable ({err.name})"
    return fn


def _flash_attn(layer_norm: bool, eps: float) -> object:
    try:
        from flash_attn.ops.triton.layer_norm import layer_norm_fn, rms_norm_fn
    except ImportError as err:
        return f"not importable ({err.name})"
    norm_fn = layer_norm_fn if layer_norm else rms_norm_fn

    def fn(x, r, w, b):
        return norm_fn(x, w, b, residual=r, eps=eps, prenorm=r is not None)

    return fn


# ---- one configuration ----------------------------------------------------------------------------------------------
def run_config(cfg: dict, impls: dict[str, object], timer: Timer, copy_gbps: float, device, deadline: float) -> list:
    m, n, dtype = cfg["M"], cfg["N"], getattr(torch, cfg["dtype"])
    layer_norm, residual = cfg["norm"] == "layernorm", cfg["residual"]
    x = torch.randn(m, n, device=device, dtype=dtype, requires_grad=True)
    r = torch.randn(m, n, device=device, dtype=dtype, requires_grad=True) if residual else None
    w = torch.randn(n, device=device, dtype=dtype, requires_grad=True)
    b = torch.randn(n, device=device, dtype=dtype, requires_grad=True) if layer_norm else None
    leaves = [t for t in (x, r, w, b) if t is not None]
    grads = [torch.randn(m, n, device=device, dtype=dtype) for _ in range(2 if residual else 1)]
    rows = []
    for name, fn in impls.items():
        status = fn if isinstance(fn, str) else "ok"
        if status == "ok" and name == "compile":
            if time.monotonic() > deadline:
                status = "skipped (time budget)"
            for t in (x, r):
                if t is not None:
                    torch._dynamo.mark_dynamic(t, 0)
        for pas in PASSES:
            row = dict(
                cfg,
                impl=name,
                pass_=pas,
                bytes=bytes_moved(pas, m, n, dtype.itemsize, residual, layer_norm),
                status=status,
            )
            if status == "ok":
                try:
                    secs = timer(_pass_fn(pas, fn, (x, r, w, b), leaves, grads))
                    row.update(time_us=secs * 1e6, gbps=row["bytes"] / secs / 1e9)
                    row["pct_copy"] = 100 * row["gbps"] / copy_gbps
                except Exception as err:  # a contender failing must not stop the table
                    row["status"] = f"error: {type(err).__name__}: {str(err)[:120]}"
            rows.append(row)
    return rows


def _pass_fn(pas: str, fn, inputs, leaves, grads) -> Callable[[], object]:
    def outputs():
        out = fn(*inputs)
        return [out] if isinstance(out, torch.Tensor) else list(out)

    if pas == "fwd":
        return outputs
    if pas == "fwd+bwd":
        return lambda: torch.autograd.grad(outputs(), leaves, grads)
    saved = outputs()  # bwd only: one forward, backward repeated on the retained graph
    return lambda: torch.autograd.grad(saved, leaves, grads, retain_graph=True)


# ---- reporting ------------------------------------------------------------------------------------------------------
def _cell(row: dict) -> str:
    if row["status"] != "ok":
        return "–"
    t = row["time_us"]
    return f"{t:.1f} µs · {row['gbps']:.3g} GB/s · {row['pct_copy']:.0f}%"


def markdown(rows: list[dict], copy_gbps: float, device_name: str, command: str) -> str:
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    lines = [f"Device: {device_name}; measured copy bandwidth {copy_gbps:.0f} GB/s. Command: `{command}`", ""]
    missing = {r["impl"]: r["status"] for r in rows if r["status"] != "ok" and not r["status"].startswith("error")}
    for impl, why in missing.items():
        lines.append(f"- `{impl}`: {why}")
    for pas in PASSES:
        lines += [
            "",
            f"### {pas}",
            "",
            "| norm | residual | dtype | M | N | " + " | ".join(impls) + " |",
            "|---" * (5 + len(impls)) + "|",
        ]
        keys = list(dict.fromkeys((r["norm"], r["residual"], r["dtype"], r["M"], r["N"]) for r in rows))
        for key in keys:
            cells = {
                r["impl"]: r
                for r in rows
                if r["pass_"] == pas and (r["norm"], r["residual"], r["dtype"], r["M"], r["N"]) == key
            }
            timed = [c for c in cells.values() if c["status"] == "ok"]
            best = min(timed, key=lambda c: c["time_us"])["impl"] if timed else None
            row = [str(k) for k in key] + [
                (f"**{_cell(cells[i])}**" if i == best else _cell(cells[i])) if i in cells else "" for i in impls
            ]
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", "### Summary", "", *summary(rows)]
    return "\n".join(lines) + "\n"


def summary(rows: list[dict]) -> list[str]:
    """The targets: fwd >= 90% and bwd >= 80% of copy bandwidth for N >= 2048, and fastest in every cell."""
    out = []
    ours = [r for r in rows if r["impl"] == "ours" and r["status"] == "ok"]
    for pas, target in TARGETS.items():
        cells = [r for r in ours if r["pass_"] == pas and r["N"] >= 2048]
        met = [r for r in cells if r["pct_copy"] >= target]
        out.append(f"- {pas} >= {target:.0f}% of copy bandwidth (N >= 2048): {len(met)}/{len(cells)} cells")
        out += [
            f"  - below: {r['norm']} res={r['residual']} {r['dtype']} M={r['M']} N={r['N']}: {r['pct_copy']:.0f}%"
            for r in cells
            if r["pct_copy"] < target
        ][:12]
    losses = []
    for r in ours:
        rivals = [
            o
            for o in rows
            if o["status"] == "ok"
            and not o["impl"].startswith("ours")
            and all(o[k] == r[k] for k in ("norm", "residual", "dtype", "M", "N", "pass_"))
        ]
        faster = [o for o in rivals if o["time_us"] < r["time_us"]]
        if faster:
            best = min(faster, key=lambda o: o["time_us"])
            losses.append(
                f"{r['norm']} res={r['residual']} {r['dtype']} M={r['M']} N={r['N']} {r['pass_']}: "
                f"{best['impl']} {best['time_us']:.1f} µs vs ours {r['time_us']:.1f} µs"
            )
    out.append(f"- ours fastest in {len(ours) - len(losses)}/{len(ours)} cells")
    out += [f"  - slower: {line}" for line in losses[:40]]
    if len(losses) > 40:
        out.append(f"  - ... and {len(losses) - 40} more (see the JSON)")
    return out


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    big_m = max(r["M"] for r in rows)
    fig, axes = plt.subplots(2, 3, figsize=(14, 7), sharey=True, squeeze=False)
    for i, norm in enumerate(("layernorm", "rmsnorm")):
        for j, pas in enumerate(PASSES):
            ax = axes[i][j]
            for impl in dict.fromkeys(r["impl"] for r in rows):
                for residual, style in ((False, "-"), (True, "--")):
                    pts = sorted(
                        (r["N"], r["pct_copy"])
                        for r in rows
                        if r["impl"] == impl
                        and r["norm"] == norm
                        and r["pass_"] == pas
                        and r["residual"] == residual
                        and r["status"] == "ok"
                        and r["M"] == big_m
                        and r["dtype"] == "bfloat16"
                    )
                    if pts:
                        ax.plot(*zip(*pts), style, marker="o", label=f"{impl}{' +res' if residual else ''}")
            ax.set_title(f"{norm} {pas} (bf16, M={big_m})")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("N")
            ax.set_ylabel("% of copy bandwidth")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---- main ----------------------------------------------------------------------------------------------------------
def main() -> None:
    args = _parse()
    out = Path(args.out)
    if args.report_only:
        data = json.loads(out.with_suffix(".json").read_text())
        text = markdown(data["rows"], data["copy_gbps"], data["device"], data["command"])
        out.with_suffix(".md").write_text(text)
        if not args.no_plot:
            plot(data["rows"], out.with_suffix(".png"))
        print(text)
        return
    smoke = args.smoke or not torch.cuda.is_available()
    if smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before lnblocks.kernels decorates its kernels
    from torch._dynamo import config as dynamo_config
    from torch._functorch import config as functorch_config

    # torch.compile: one compile per (norm, residual, dtype, N) with M marked dynamic (both M share it), N static;
    # a high cache limit so that no configuration silently falls back to eager.
    dynamo_config.automatic_dynamic_shapes = False
    functorch_config.donated_buffer = False  # the backward is replayed on a retained graph
    dynamo_config.cache_size_limit = 512
    if hasattr(dynamo_config, "accumulated_cache_size_limit"):
        dynamo_config.accumulated_cache_size_limit = 4096
    device = torch.device("cpu" if smoke else "cuda")
    if smoke:
        ms, ns, dtypes, reps, warmup, copy_bytes = (64,), (256,), ["bfloat16"], 2, 1, 64 * 2**20
    else:
        ms, ns = (16384, 1024), (1024, 2048, 4096, 8192, 16384)
        dtypes, reps, warmup, copy_bytes = ["bfloat16", "float32"], 20, 3, 2**30
    timer = Timer(device, args.reps or reps, warmup)
    copy_gbps = copy_bandwidth(device, timer, copy_bytes)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke run, interpreter)"
    print(f"{device_name}: copy bandwidth {copy_gbps:.0f} GB/s", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    flags = (f"--out {args.out}", "--smoke" if args.smoke else "", "--variants" if args.variants else "")
    command = "python benchmarks/kernels/bench_norm_kernels.py " + " ".join(a for a in flags if a)
    deadline = time.monotonic() + args.budget_s
    rows: list[dict] = []
    # bf16 first: if the time budget stops torch.compile, the most used dtype has its column complete.
    configs = [
        dict(norm=norm, residual=res, dtype=dt, M=m, N=n)
        for dt in dtypes
        for norm in ("layernorm", "rmsnorm")
        for res in (False, True)
        for n in ns
        for m in ms
    ]
    for i, cfg in enumerate(configs):
        eps = 1e-5 if cfg["norm"] == "layernorm" else 1e-6
        new = run_config(
            cfg, contenders(cfg["norm"] == "layernorm", cfg["N"], eps, args, smoke), timer, copy_gbps, device, deadline
        )
        rows += new
        ours = {r["pass_"]: r for r in new if r["impl"] == "ours" and r["status"] == "ok"}
        print(
            f"[{i + 1}/{len(configs)}] {cfg} ours: "
            + ", ".join(f"{p} {ours[p]['pct_copy']:.0f}%" for p in PASSES if p in ours),
            flush=True,
        )
        payload = dict(device=device_name, copy_gbps=copy_gbps, command=command, torch=torch.__version__, rows=rows)
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(payload, indent=1, default=str))
        tmp.replace(out.with_suffix(".json"))
    text = markdown(rows, copy_gbps, device_name, command)
    out.with_suffix(".md").write_text(text)
    if not args.no_plot:
        plot(rows, out.with_suffix(".png"))
    print(text)


if __name__ == "__main__":
    main()
