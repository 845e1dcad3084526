"""HF training stacks, patched vs unpatched, as paired ratios from one run:

1. a ``transformers.Trainer`` step of a Llama-shaped model: unpatched, ``PatchNormsCallback`` (norms patched) and
   ``PatchNormsCallback(fuse_residual=True)`` (the residual add before each norm fused into the norm call);
2. the forward of the same model: unpatched, patched, patched + fused residual.

    python benchmarks/hf/bench_hf_training.py                        # CPU, fp32 and bf16, 1 thread
    python benchmarks/hf/bench_hf_training.py --device cuda          # GPU: bf16, backend auto (fused Triton kernels)
    python benchmarks/hf/bench_hf_training.py --smoke --out DIR/hf   # seconds; writes DIR/hf.json (gpu_check.sh)
    python benchmarks/hf/bench_hf_training.py --report DIR/hf.json   # the table again

Pairing: one model object per case; the sides are switched on it (``patch_norms`` / ``unpatch_norms``) between
timed blocks, in an order that rotates every round, so all sides share weights, caches and machine load. A round's
ratio is side / unpatched (< 1: faster); the table gives the median ratio and the mean of the per-round ratios with
its 95% t-interval over the rounds. CPU times are this thread's CPU time with one thread (steadier than wall time on
a shared machine); CUDA times are wall time after a synchronize. Trainer steps are timed inside the Trainer by a
callback (``on_step_begin`` to ``on_step_end``: forward, backward, optimizer step), the first step of every
``train()`` call excluded.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

from lnblocks._optional import require
from lnblocks.hf import patch_norms, unpatch_norms

SIDES = ("unpatched", "patched", "fused")


@dataclass(frozen=True)
class Row:
    bench: str
    device: str
    dtype: str
    side: str
    ms: float  # median time of one call (or step) on this side
    ratio: float  # median over rounds of side / unpatched
    mean: float  # mean of the per-round ratios
    lo: float  # its 95% t-interval
    hi: float
    rounds: int


# Student t 0.975 quantiles by degrees of freedom (scipy.stats.t.ppf; the GPU machine may lack scipy)
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
_T975 |= {11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093}
_T975 |= {20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000}


def _t975(df: int) -> float:
    return _T975.get(df) or next((v for k, v in sorted(_T975.items()) if k >= df), 1.960)


def _interval(ratios: list[float]) -> tuple[float, float, float]:
    mean = statistics.fmean(ratios)
    if len(ratios) < 2:
        return mean, mean, mean
    half = _t975(len(ratios) - 1) * statistics.stdev(ratios) / math.sqrt(len(ratios))
    return mean, mean - half, mean + half


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return time.perf_counter()
    return time.thread_time() if torch.get_num_threads() == 1 else time.perf_counter()


def _set(model: nn.Module, side: str, backend: str) -> None:
    unpatch_norms(model)
    if side != "unpatched":
        patch_norms(model, backend=backend, fuse_residual=side == "fused")


def build_model(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> nn.Module:
    transformers = require("transformers")
    config = transformers.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.width,
        intermediate_size=args.width * 8 // 3,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.width // 64),
        num_key_value_heads=max(1, args.width // 128),
        max_position_embeddings=max(4096, args.seq),
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype)


def _rows(bench: str, device: torch.device, dtype: torch.dtype, times: dict[str, list[float]]) -> list[Row]:
    rows = []
    for side in SIDES:
        ratios = [s / u for s, u in zip(times[side], times["unpatched"])]
        mean, lo, hi = _interval(ratios)
        ms = statistics.median(times[side]) * 1e3
        dtype_name = str(dtype).removeprefix("torch.")
        rows.append(Row(bench, device.type, dtype_name, side, ms, statistics.median(ratios), mean, lo, hi, len(ratios)))
    return rows


def bench_forward(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, progress) -> list[Row]:
    model = build_model(args, device, dtype).eval()
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)

    def block() -> float:
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False)  # warm-up of this side (routes, kernels)
            start = _clock(device)
            for _ in range(args.repeat):
                model(input_ids=ids, use_cache=False)
            return (_clock(device) - start) / args.repeat

    times: dict[str, list[float]] = {s: [] for s in SIDES}
    for r in range(args.rounds):
        for side in SIDES[r % 3 :] + SIDES[: r % 3]:  # rotating order
            _set(model, side, args.backend)
            times[side].append(block())
        progress.update(1)
    unpatch_norms(model)
    return _rows("forward", device, dtype, times)


def bench_trainer(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, progress) -> list[Row]:
    transformers = require("transformers")
    model = build_model(args, device, dtype)
    g = torch.Generator().manual_seed(0)
    data = [
        {"input_ids": (x := torch.randint(0, args.vocab, (args.seq,), generator=g)), "labels": x} for _ in range(64)
    ]
    step_times: list[float] = []

    class StepClock(transformers.TrainerCallback):
        def on_step_begin(self, *a, **k) -> None:
            self.start = _clock(device)

        def on_step_end(self, *a, **k) -> None:
            step_times.append(_clock(device) - self.start)

    out = tempfile.mkdtemp(prefix="bench_hf_training_")
    targs = transformers.TrainingArguments(
        output_dir=out,
        max_steps=args.steps + 1,
        per_device_train_batch_size=args.batch,
        learning_rate=1e-5,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=device.type == "cpu",
        dataloader_num_workers=0,
    )
    trainer = transformers.Trainer(model=model, args=targs, train_dataset=data, callbacks=[StepClock()])
    trainer.remove_callback(transformers.PrinterCallback)  # no metrics line after every train() call
    times: dict[str, list[float]] = {s: [] for s in SIDES}
    for r in range(args.rounds):
        for side in SIDES[r % 3 :] + SIDES[: r % 3]:
            _set(model, side, args.backend)  # what PatchNormsCallback does at on_train_begin
            step_times.clear()
            trainer.train()
            times[side].append(statistics.median(step_times[1:]))  # the first step of a train() call warms up
        progress.update(1)
    unpatch_norms(model)
    return _rows("Trainer step", device, dtype, times)


def table(rows: list[Row], args: argparse.Namespace) -> str:
    shape = f"Llama-shaped, width {args.width}, {args.layers} layers, batch {args.batch} x seq {args.seq}"
    lines = [
        f"{shape}; backend={args.backend}; {rows[0].rounds if rows else 0} rounds "
        "(ratio: side / unpatched, < 1 faster)",
        "",
        "| bench | device | dtype | side | ms | median ratio | mean ratio [95% CI] |",
        "|---|---|---|---|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.bench} | {r.device} | {r.dtype} | {r.side} | {r.ms:.2f} | {r.ratio:.3f} | "
            f"{r.mean:.3f} [{r.lo:.3f}, {r.hi:.3f}] |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtypes", default=None, help="comma list (default: cpu float32,bfloat16; cuda bfloat16)")
    ap.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"])
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--repeat", type=int, default=3, help="forward calls per timed block")
    ap.add_argument("--steps", type=int, default=4, help="timed Trainer steps per train() call")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (1: steadier on a shared machine)")
    ap.add_argument("--benches", default="forward,trainer")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, 2 rounds: checks the script, not speed")
    ap.add_argument("--out", help="write OUT.json (rows and arguments)")
    ap.add_argument("--report", metavar="JSON", help="print the table of an earlier run's OUT.json and exit")
    args = ap.parse_args()
    if args.report:
        payload = json.loads(Path(args.report).read_text())
        print(table([Row(**r) for r in payload["rows"]], argparse.Namespace(**payload["args"])))
        return
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("bench_hf_training: --device cuda but CUDA is not available")
    args.width = args.width or (64 if args.smoke else 2048 if cuda else 256)
    args.seq = args.seq or (32 if args.smoke else 1024 if cuda else 128)
    if args.smoke:
        args.rounds, args.repeat, args.steps, args.layers, args.vocab = 2, 1, 2, 2, 256
    dtypes = args.dtypes.split(",") if args.dtypes else (["bfloat16"] if cuda else ["float32", "bfloat16"])
    torch.set_num_threads(args.threads)
    tqdm = require("tqdm").tqdm
    device = torch.device(args.device)
    benches = {"forward": bench_forward, "trainer": bench_trainer}
    names = [b for b in args.benches.split(",") if b]
    rows: list[Row] = []
    with tqdm(total=len(names) * len(dtypes) * args.rounds, desc="bench_hf_training") as progress:
        for name in names:
            if name == "trainer" and importlib.util.find_spec("accelerate") is None:
                print("bench_hf_training: Trainer step skipped: transformers' Trainer needs accelerate (not installed)")
                progress.update(len(dtypes) * args.rounds)
                continue
            for dtype_name in dtypes:
                rows += benches[name](args, device, getattr(torch, dtype_name), progress)
    print(table(rows, args))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        payload = {"args": vars(args), "rows": [asdict(r) for r in rows]}
        Path(f"{args.out}.json").write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
