"""The chunked LM-head loss of ``lnblocks.hf`` (``patch_norms(model, chunked_loss=True)``) against the full logits,
on an HF Llama-shaped ``LlamaForCausalLM`` at V = 32,768, 131,072 and 262,144 (Llama 3 has 128,256 tokens, Gemma 3
262,144), as paired ratios from one run:

1. ``step``: ``model(input_ids, labels=labels).loss.backward()`` and an SGD step (no optimizer state: AdamW's would
   be most of the memory at V = 256k, on both sides alike). The two sides are one model object: its norms patched
   with ``backend="torch"`` on both, the loss toggled (``unpatch_norms`` / ``patch_norms(chunked_loss=...)``)
   between timed blocks in an order that alternates every round, so only the loss differs. Time: median over
   rounds of chunked / full; memory: the peak above what was held before the step, chunked / full.
2. ``loss``: the head and loss alone, forward and backward from the final hidden states: full, ``model.lm_head``
   and ``model.loss_function`` (transformers' ``ForCausalLMLoss``, logits upcast to fp32); chunked,
   ``lnblocks.models.lm_head.lm_head_loss`` on the shifted labels (what the patched head runs for a Llama). Memory:
   the peak above what was held before, less the two gradients both return (hidden states, head weight), as a
   fraction of the fp32 logits ``B * T * V * 4`` bytes (the target: at most 1/8).

CPU: fp32, one thread, this thread's CPU time, peaks from the allocator's events (``benchmarks.common.memory``).
CUDA: bf16, wall time after a synchronize, peaks from ``torch.cuda.max_memory_allocated``.

    python benchmarks/hf/bench_hf_chunked_loss.py                   # CPU: the table in benchmarks/hf/README.md
    python benchmarks/hf/bench_hf_chunked_loss.py --device cuda     # GPU (gpu_check.sh, section hfloss)
    python benchmarks/hf/bench_hf_chunked_loss.py --batch 2 --seq 128 --vocab 131072  # few tokens: small chunks
    python benchmarks/hf/bench_hf_chunked_loss.py --smoke           # seconds: tiny sizes, one round
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

from benchmarks.common.memory import peak_extra_mib
from lnblocks._optional import require
from lnblocks.hf import patch_norms, unpatch_norms
from lnblocks.models.lm_head import lm_head_loss

SIDES = ("full", "chunked")
VOCABS = (32_768, 131_072, 262_144)


@dataclass(frozen=True)
class Row:
    vocab: int
    bench: str
    full_ms: float
    chunked_ms: float
    time_ratio: float  # median over rounds of chunked / full (< 1: faster)
    full_mib: float
    chunked_mib: float
    logits_mib: float  # the fp32 logits, B * T * V * 4 bytes


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return time.perf_counter()
    return time.thread_time() if torch.get_num_threads() == 1 else time.perf_counter()


def _peak_mib(device: torch.device, fn: Callable[[], None], keep_bytes: int = 0) -> float:
    """MiB held at the peak of ``fn()`` above what was held before, less ``keep_bytes``."""
    if device.type != "cuda":
        return peak_extra_mib(fn, keep_bytes)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before - keep_bytes) / 2**20


def build_model(args: argparse.Namespace, vocab: int, device: torch.device, dtype: torch.dtype) -> nn.Module:
    transformers = require("transformers")
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=args.width,
        intermediate_size=args.width * 8 // 3,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.width // 64),
        num_key_value_heads=max(1, args.width // 128),
        max_position_embeddings=max(4096, args.seq),
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.LlamaForCausalLM(config).to(dtype)


def _set(model: nn.Module, side: str) -> None:
    unpatch_norms(model)
    patch_norms(model, backend="torch", chunked_loss=side == "chunked")


def bench_step(args: argparse.Namespace, vocab: int, device: torch.device, dtype: torch.dtype) -> Row:
    model = build_model(args, vocab, device, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (args.batch, args.seq), generator=g).to(device)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    calls = {side: (lambda s=side: _set(model, s), step) for side in SIDES}
    row = _paired(vocab, "step", calls, 0, device, args)
    unpatch_norms(model)
    return row


def _paired(vocab: int, bench: str, calls: dict, keep: int, device: torch.device, args: argparse.Namespace) -> Row:
    """Per side ``(set_up, call)``: the peak of the first call (which warms the side up), then rounds of timed
    blocks in alternating order; ``call`` cleans up after itself."""
    times: dict[str, list[float]] = {s: [] for s in SIDES}
    peaks: dict[str, float] = {}
    for r in range(args.rounds):
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            set_up, call = calls[side]
            set_up()
            if side not in peaks:
                peaks[side] = _peak_mib(device, call, keep)
            if r == 0 and device.type == "cuda":
                call()  # a second warm-up on the GPU (allocator caching)
            start = _clock(device)
            for _ in range(args.repeat):
                call()
            times[side].append((_clock(device) - start) / args.repeat)
    return _row(vocab, bench, times, peaks, args)


def bench_loss(args: argparse.Namespace, vocab: int, device: torch.device, dtype: torch.dtype) -> Row:
    """The head and the loss alone, from the hidden states (see the module docstring)."""
    model = build_model(args, vocab, device, dtype)
    head = model.lm_head
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(args.batch, args.seq, args.width, generator=g).to(device, dtype).requires_grad_()
    labels = torch.randint(0, vocab, (args.batch, args.seq), generator=g).to(device)
    shifted = F.pad(labels, (0, 1), value=-100)[..., 1:]  # ForCausalLMLoss's shift

    def full() -> None:
        model.loss_function(head(hidden), labels, vocab).backward()

    def chunked() -> None:
        lm_head_loss(hidden, head.weight, shifted)[0].backward()

    def then_clear(fn: Callable[[], None]) -> Callable[[], None]:
        def call() -> None:
            fn()
            hidden.grad = head.weight.grad = None

        return call

    # the peak holds the two gradients both return (cleared after each call): less them
    grads = hidden.numel() * hidden.element_size() + head.weight.numel() * head.weight.element_size()
    calls = {"full": (lambda: None, then_clear(full)), "chunked": (lambda: None, then_clear(chunked))}
    return _paired(vocab, "loss", calls, grads, device, args)


def _row(vocab: int, bench: str, times: dict, peaks: dict, args: argparse.Namespace) -> Row:
    ratio = statistics.median(c / f for c, f in zip(times["chunked"], times["full"]))
    ms = {s: statistics.median(times[s]) * 1e3 for s in SIDES}
    logits = args.batch * args.seq * vocab * 4 / 2**20
    return Row(vocab, bench, ms["full"], ms["chunked"], ratio, peaks["full"], peaks["chunked"], logits)


def table(rows: list[Row], args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> str:
    shape = f"Llama-shaped, width {args.width}, {args.layers} layers, batch {args.batch} x seq {args.seq}"
    lines = [
        f"{shape}; {device.type} {str(dtype).removeprefix('torch.')}; {args.rounds} rounds of {args.repeat} calls",
        "",
        "| V | bench | full ms | chunked ms | time chunked/full | full MiB | chunked MiB | memory chunked/full | "
        "chunked / fp32 logits |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.vocab:,} | {r.bench} | {r.full_ms:.1f} | {r.chunked_ms:.1f} | {r.time_ratio:.3f} | "
            f"{r.full_mib:.1f} | {r.chunked_mib:.1f} | {r.chunked_mib / r.full_mib:.3f} | "
            f"{r.chunked_mib / r.logits_mib:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--vocab", type=int, nargs="+", default=None, help=f"vocabulary sizes (default {VOCABS})")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=None, help="calls per timed block")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one round: seconds")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device")
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    # CPU: small enough for a 2-core machine (V = 256k: 2 s a step); CUDA: a real width and batch
    # (width, layers, batch, seq); CPU: 2,048 tokens (fewer would give chunks of under 64 rows: each chunk re-reads
    # the weight, and small chunks are slower than the full logits on a CPU), V = 256k at ~20 s a call
    shape = (2048, 4, 4, 1024) if cuda else (32, 1, 2, 64) if args.smoke else (256, 2, 4, 512)
    args.width, args.layers = shape[:2]
    args.batch, args.seq = args.batch or shape[2], args.seq or shape[3]
    args.vocab = args.vocab or ([65_536] if args.smoke else list(VOCABS))
    args.rounds = args.rounds or (1 if args.smoke else 5 if cuda else 3)
    args.repeat = args.repeat or (1 if args.smoke or not cuda else 5)
    if not cuda:
        torch.set_num_threads(1)
    rows = []
    for vocab in args.vocab:
        rows.append(bench_step(args, vocab, device, dtype))
        rows.append(bench_loss(args, vocab, device, dtype))
        if cuda:
            torch.cuda.empty_cache()
    print(table(rows, args, device, dtype))


if __name__ == "__main__":
    main()
