"""Patched vs unpatched HF models: forward and training-step time, as ratios measured in one run.

    .venv/bin/python benchmarks/hf/bench_hf_patch.py                 # CPU (and CUDA when present)
    .venv/bin/python benchmarks/hf/bench_hf_patch.py --rounds 20 --json out.json

Models: a small Llama-shaped (RMSNorm, Llama cast order) and a small GPT-2-shaped (nn.LayerNorm) model with random
weights. One model object per case; the patch is toggled between timed runs (``patch_norms`` / ``unpatch_norms``),
in alternating order, so both sides share weights, caches and machine load. A ratio < 1 means patched is faster.
On CPU both sides run the same PyTorch ops (``backend="auto"`` picks torch there), so the ratio measures the
dispatch overhead of the patch; on CUDA ``auto`` runs lnblocks' fused Triton kernels. CPU times are thread CPU time
with one thread (see ``_timer``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

import torch
from torch import nn

from lnblocks._optional import require
from lnblocks.hf import patch_norms, unpatch_norms


@dataclass(frozen=True)
class Case:
    model: str
    device: str
    dtype: str
    mode: str
    unpatched_ms: float
    patched_ms: float

    @property
    def ratio(self) -> float:
        return self.patched_ms / self.unpatched_ms


def build_model(kind: str, width: int, layers: int, vocab: int) -> nn.Module:
    transformers = require("transformers")
    if kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=vocab,
            hidden_size=width,
            intermediate_size=width * 8 // 3,
            num_hidden_layers=layers,
            num_attention_heads=width // 64,
            num_key_value_heads=width // 128,
            max_position_embeddings=4096,
        )
        return transformers.LlamaForCausalLM(config)
    config = transformers.GPT2Config(
        vocab_size=vocab, n_embd=width, n_layer=layers, n_head=width // 64, n_positions=4096
    )
    return transformers.GPT2LMHeadModel(config)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timer(fn: Callable[[], None], device: torch.device, repeat: int) -> float:
    """ms per call: CUDA wall time after a sync; on CPU this thread's CPU time (``--threads 1`` runs the ops inline),
    which other processes on a shared machine disturb far less than wall time."""
    clock = time.perf_counter if device.type == "cuda" or torch.get_num_threads() > 1 else time.thread_time
    _sync(device)
    start = clock()
    for _ in range(repeat):
        fn()
    _sync(device)
    return (clock() - start) / repeat * 1e3


def bench_case(
    kind: str, device: torch.device, dtype: torch.dtype, args: argparse.Namespace, progress: object
) -> list[Case]:
    torch.manual_seed(0)
    model = build_model(kind, args.width, args.layers, args.vocab).to(device=device, dtype=dtype)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def forward() -> None:
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False)

    def train_step() -> None:
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    cases = []
    for mode, fn in (("forward", forward), ("train step", train_step)):
        model.train(mode != "forward")
        times: dict[str, list[float]] = {"unpatched": [], "patched": []}
        for side in ("unpatched", "patched"):  # warm-up both
            _set(model, side == "patched")
            fn()
        for r in range(args.rounds):
            order = ("unpatched", "patched") if r % 2 == 0 else ("patched", "unpatched")
            for side in order:
                _set(model, side == "patched")
                times[side].append(_timer(fn, device, args.repeat))
            progress.update(1)
        unpatch_norms(model)
        med = {k: statistics.median(v) for k, v in times.items()}
        cases.append(Case(kind, device.type, str(dtype).removeprefix("torch."), mode, med["unpatched"], med["patched"]))
    return cases


def _set(model: nn.Module, patched: bool) -> None:
    if patched:
        patch_norms(model)
    else:
        unpatch_norms(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds per side (median reported)")
    parser.add_argument("--repeat", type=int, default=3, help="calls per timed round")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (1: steadier on a shared machine)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()
    tqdm = require("tqdm").tqdm
    torch.set_num_threads(args.threads)

    targets = [(torch.device("cpu"), torch.float32)]
    if torch.cuda.is_available():
        targets.append((torch.device("cuda"), torch.bfloat16))
    cases: list[Case] = []
    with tqdm(total=len(targets) * 2 * 2 * args.rounds, desc="bench_hf_patch") as progress:
        for device, dtype in targets:
            for kind in ("llama", "gpt2"):
                cases += bench_case(kind, device, dtype, args, progress)

    shape = f"width {args.width}, {args.layers} layers, batch {args.batch} x seq {args.seq}"
    print(f"\nPatched / unpatched time ({shape}; median of {args.rounds} rounds, < 1 = patched faster)\n")
    print("| model | device | dtype | mode | unpatched ms | patched ms | ratio |")
    print("|---|---|---|---|---:|---:|---:|")
    for c in cases:
        print(
            f"| {c.model} | {c.device} | {c.dtype} | {c.mode} | {c.unpatched_ms:.2f} | {c.patched_ms:.2f} "
            f"| {c.ratio:.3f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "cases": [asdict(c) | {"ratio": c.ratio} for c in cases]}, f, indent=2)


if __name__ == "__main__":
    main()
