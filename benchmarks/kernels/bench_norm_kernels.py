"""Fused norm kernels against torch eager, torch.compile, Liger-Kernel, flash-attn, quack and cuDNN (through
Transformer Engine), as percentages of a device copy of the same bytes.

    python benchmarks/kernels/bench_norm_kernels.py [--out PREFIX] [--budget-s 420] [--variants] [--smoke] [--no-flush]

Times forward, backward and forward+backward of every norm in ``contenders.OPS`` (LayerNorm, RMSNorm, and the
gated RMSNorm, l2norm, DyT and Derf at N = 4096 and 16384), with and without the fused residual add (where the kind
has one), in bf16 and fp32, for M = 16384 and 1024 rows and N in {1024, ..., 16384}. Each cell
is the median of CUDA-event timings with the L2 cache flushed before every repetition (a 256 MiB write outside the
timed region, ``benchmarks.common.timing``), reported as time, GB/s of the bytes the pass must move (read x, write y,
and so on: ``traffic.min_bytes``, the same count for every contender) and percent of a copy that moves the same
bytes, timed the same way (``bandwidth.CopyBaseline``); a 1 GiB copy is quoted as the device's ceiling. Cells whose
backward may read from L2 what their forward wrote are marked (``bandwidth.l2_mark``); ``--no-flush`` times with a
warm L2 and marks every cell that fits in it. Writes ``PREFIX.md``, ``PREFIX.json`` (rewritten after every
configuration, so an interrupted run keeps what it measured) and ``PREFIX.png``.

Contenders (``contenders.CONTENDERS``): ``ours`` (``lnblocks.kernels.fused_add_norm``, ``fused_gated_rms_norm``),
``torch`` (``x + r`` then ``F.layer_norm`` / ``F.rms_norm``, or the kind's torch ops), ``compile``
(``torch.compile`` of that; skipped once ``--budget-s`` is spent), and ``liger``, ``flash-attn``, ``quack`` and
``cudnn (TE)`` where importable (each missing one is named with the reason). ``--variants`` checks the single-block
limits: ``ours-looped`` (the chunked path forced with ``max_block_n=4096``) at N = 8192, and ``ours-single`` (one
block of 16384, the tile that spills 88-784 bytes, see kernel_resources.py) at N = 16384, where ``ours`` loops.
Without CUDA (or with ``--smoke``) it runs a tiny CPU version in seconds, the kernels under ``TRITON_INTERPRET=1``
(the new kinds without their residual form there).
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

from benchmarks.common.env import environment
from benchmarks.common.timing import Timer
from benchmarks.kernels.bandwidth import PEAK_COPY_BYTES, CopyBaseline, l2_mark, pct_of_copy
from benchmarks.kernels.contenders import OPS, Context, Fn, Inputs, build_all
from benchmarks.kernels.kernel_report import PASSES, markdown, plot
from benchmarks.kernels.traffic import min_bytes


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench_norm_kernels", help="output prefix for .md/.json/.png")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run (automatic without CUDA)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop compiling torch.compile after this many s")
    ap.add_argument("--variants", action="store_true", help="also time other tiles at N = 8192 and 16384")
    ap.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS), help="norms to time")
    ap.add_argument("--no-flush", action="store_true", help="keep L2 warm between repetitions (cells marked L2)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--report-only", action="store_true", help="rebuild PREFIX.md/.png from PREFIX.json (cut-off run)")
    ap.add_argument("--no-plot", action="store_true", help="write no PREFIX.png")
    return ap.parse_args()


class Bench:
    """The run's clock and copy baseline, and what every row records about where its bytes may come from."""

    def __init__(self, device: torch.device, reps: int, warmup: int, flush: bool, deadline: float) -> None:
        self.device, self.deadline = device, deadline
        self.timer = Timer(device, reps, warmup, flush_l2=flush)
        self.copy = CopyBaseline(device, self.timer)
        # the ceiling: a copy reading and writing PEAK_COPY_BYTES each (64 MiB on CPU)
        self.peak_bytes = 2 * (PEAK_COPY_BYTES if device.type == "cuda" else 64 * 2**20)
        self.peak_gbps = self.copy.gbps(self.peak_bytes)

    def cell(self, row: dict, fwd_bytes: int, fn: Callable[[], object]) -> None:
        """Time ``fn`` into ``row``: µs, GB/s, % of the same-size copy and of the peak copy, and the L2 mark."""
        secs = self.timer(fn)
        copy_gbps = self.copy.gbps(row["bytes"])
        row.update(time_us=secs * 1e6, gbps=row["bytes"] / secs / 1e9, copy_gbps=copy_gbps)
        row.update(pct_copy=pct_of_copy(row["gbps"], copy_gbps), pct_peak=pct_of_copy(row["gbps"], self.peak_gbps))
        row["l2"] = l2_mark(row["pass_"], row["bytes"], fwd_bytes, self.timer.l2_bytes, self.timer.flushes)


# ---- one configuration ----------------------------------------------------------------------------------------------
def run_config(cfg: dict, impls: dict[str, Fn | str], bench: Bench) -> list[dict]:
    op, dtype = OPS[cfg["norm"]], getattr(torch, cfg["dtype"])
    m, n, residual = cfg["M"], cfg["N"], cfg["residual"]
    inputs = op.inputs(m, n, dtype, bench.device, residual)
    grads = [torch.randn(m, n, device=bench.device, dtype=dtype) for _ in range(2 if residual else 1)]
    operands = op.operands(n, dtype.itemsize, residual)
    fwd_bytes = min_bytes("fwd", m, operands)
    rows = []
    for name, fn in impls.items():
        status = fn if isinstance(fn, str) else "ok"
        if status == "ok" and name == "compile":
            if time.monotonic() > bench.deadline:
                status = "skipped (time budget)"
            for t in (inputs.x, inputs.residual):  # one compile for both M (N static)
                if t is not None:
                    torch._dynamo.mark_dynamic(t, 0)
        for pas in PASSES:
            row = dict(cfg, impl=name, pass_=pas, bytes=min_bytes(pas, m, operands), status=status)
            if status == "ok":
                try:
                    bench.cell(row, fwd_bytes, _pass_fn(pas, fn, inputs, grads))
                except Exception as err:  # a contender failing must not stop the table
                    row["status"] = f"error: {type(err).__name__}: {str(err)[:120]}"
            rows.append(row)
    return rows


def _pass_fn(pas: str, fn: Fn, inputs: Inputs, grads: list[torch.Tensor]) -> Callable[[], object]:
    leaves = inputs.leaves()

    def outputs() -> list[torch.Tensor]:
        out = fn(inputs)
        return [out] if isinstance(out, torch.Tensor) else list(out)

    if pas == "fwd":
        return outputs
    if pas == "fwd+bwd":
        return lambda: torch.autograd.grad(outputs(), leaves, grads)
    saved = outputs()  # bwd only: one forward, backward repeated on the retained graph
    return lambda: torch.autograd.grad(saved, leaves, grads, retain_graph=True)


# ---- main ----------------------------------------------------------------------------------------------------------
def _configure_compile() -> None:
    """One compile per (norm, residual, dtype, N) with M marked dynamic (both M share it), N static; a high cache
    limit so that no configuration silently falls back to eager."""
    from torch._dynamo import config as dynamo_config
    from torch._functorch import config as functorch_config

    dynamo_config.automatic_dynamic_shapes = False
    functorch_config.donated_buffer = False  # the backward is replayed on a retained graph
    dynamo_config.cache_size_limit = 512
    if hasattr(dynamo_config, "accumulated_cache_size_limit"):
        dynamo_config.accumulated_cache_size_limit = 4096


def _write(out: Path, payload: dict) -> None:
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    tmp.replace(out.with_suffix(".json"))


def _report(out: Path, payload: dict, no_plot: bool) -> None:
    text = markdown(payload)
    out.with_suffix(".md").write_text(text)
    if not no_plot:
        plot(payload["rows"], out.with_suffix(".png"))
    print(text)


def main() -> None:
    args = _parse()
    out = Path(args.out)
    if args.report_only:
        _report(out, json.loads(out.with_suffix(".json").read_text()), args.no_plot)
        return
    smoke = args.smoke or not torch.cuda.is_available()
    if smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before lnblocks.kernels decorates its kernels
    _configure_compile()
    device = torch.device("cpu" if smoke else "cuda")
    if smoke:
        ms, ns, dtypes, reps, warmup = (64,), (256,), ["bfloat16"], 2, 1
    else:
        ms, ns, dtypes, reps, warmup = (16384, 1024), (1024, 2048, 4096, 8192, 16384), ["bfloat16", "float32"], 20, 3
    bench = Bench(device, args.reps or reps, warmup, not args.no_flush, time.monotonic() + args.budget_s)
    env = environment(device)
    device_name = env["device"] if device.type == "cuda" else "CPU (smoke run, interpreter)"
    print(f"{device_name}: copy bandwidth {bench.peak_gbps:.0f} GB/s; L2 {env.get('l2_bytes')} B", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    flags = (f"--out {args.out}", "--smoke" if args.smoke else "", "--variants" if args.variants else "",
             "--no-flush" if args.no_flush else "")  # fmt: skip
    command = "python benchmarks/kernels/bench_norm_kernels.py " + " ".join(a for a in flags if a)
    payload = dict(device=device_name, copy_gbps=bench.peak_gbps, copy_peak_bytes=bench.peak_bytes,
                   l2_bytes=bench.timer.l2_bytes,
                   flushed=bench.timer.flushes, command=command, torch=torch.__version__, env=env, rows=[])  # fmt: skip
    # bf16 first: if the time budget stops torch.compile, the most used dtype has its column complete.
    configs = [
        dict(norm=norm, residual=res, dtype=dt, M=m, N=n)
        for dt in dtypes
        for norm in args.ops
        for res in ((False, True) if OPS[norm].takes_residual and not (smoke and OPS[norm].sizes) else (False,))
        for n in (ns if smoke or OPS[norm].sizes is None else OPS[norm].sizes)
        for m in ms
    ]
    for i, cfg in enumerate(configs):
        impls = build_all(OPS[cfg["norm"]], Context(cfg["N"], device, smoke, args.variants))
        new = run_config(cfg, impls, bench)
        payload["rows"] += new
        payload["copy_by_bytes"] = dict(sorted(bench.copy.measured.items()))
        ours = {r["pass_"]: r for r in new if r["impl"] == "ours" and r["status"] == "ok"}
        print(
            f"[{i + 1}/{len(configs)}] {cfg} ours: "
            + ", ".join(f"{p} {ours[p]['pct_copy']:.0f}%" for p in PASSES if p in ours),
            flush=True,
        )
        _write(out, payload)
    _report(out, payload, args.no_plot)


if __name__ == "__main__":
    main()
