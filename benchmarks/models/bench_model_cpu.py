"""lnblocks GPT vs transformers' GPT2LMHeadModel on CPU, same shape and same weights (equal math).

Measures (1) a training step: forward, backward and AdamW; (2) greedy generation with a KV cache. Times are medians
of interleaved runs in one process (both models see the same machine load); peak memory of the training steps is
measured in a fresh subprocess per model (peak RSS minus RSS after building model and optimizer).
The lnblocks model is built with ``GPT.from_hf`` from the HF model, and the script checks that both produce the same
logits and the same greedy tokens before timing, so the comparison is at equal math.

    python benchmarks/models/bench_model_cpu.py          # nanoGPT's CPU config: 4 layers, d=128, 4 heads, T=64, B=12
    python benchmarks/models/bench_model_cpu.py --quick  # 2 layers, fewer steps (smoke run)
    python benchmarks/models/bench_model_cpu.py --dim 256 --vocab 8192 --seq 128 --batch 8  # bigger: matmuls dominate
    python benchmarks/models/bench_model_cpu.py --threads 1   # on a loaded, shared machine
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

import torch

from lnblocks import GPT


def build(args: argparse.Namespace):
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(
        vocab_size=args.vocab,
        n_positions=args.seq + args.new_tokens + args.prompt,
        n_embd=args.dim,
        n_layer=args.layers,
        n_head=args.heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    cfg._attn_implementation = "sdpa"  # the default; stated for the record
    hf = transformers.GPT2LMHeadModel(cfg)
    return hf, GPT.from_hf(hf)


def train_step(kind: str, model, opt, idx: torch.Tensor) -> None:
    # HF shifts the labels inside; lnblocks takes next-token targets
    loss = model(idx, labels=idx).loss if kind == "hf" else model(idx[:, :-1], idx[:, 1:])[1]
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def generate(kind: str, model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    if kind == "hf":
        mask = torch.ones_like(prompt)
        return model.generate(prompt, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return model.generate(prompt, n, temperature=0)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_worker(args: argparse.Namespace) -> None:
    """Peak extra memory of training steps for one model, printed as JSON (run in a fresh process)."""
    hf, lb = build(args)
    model = hf if args.worker == "hf" else lb
    del lb, hf
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1))
    base = rss_bytes()
    for _ in range(3):
        train_step(args.worker, model, opt, idx)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print(json.dumps({"peak_mib": (peak - base) / 2**20}))


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Defaults: the GPT-2-shaped "baby GPT" nanoGPT's README trains on a CPU (shakespeare_char, vocab 65).
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=65)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--steps", type=int, default=40, help="timed training steps per model")
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--gen-repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--quick", action="store_true", help="2 layers, few steps")
    p.add_argument("--worker", choices=["hf", "lnblocks"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.layers, args.steps, args.new_tokens, args.gen_repeats = 2, 10, 32, 3
    if args.threads:
        torch.set_num_threads(args.threads)  # on a shared machine, 1 thread avoids OpenMP oversubscription stalls
    if args.worker:
        memory_worker(args)
        return

    hf, lb = build(args)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1))
    with torch.no_grad():  # equal math: same logits, same greedy tokens
        hf.eval(), lb.eval()
        diff = (hf(idx[:, :-1]).logits - lb(idx[:, :-1])[0]).abs().max().item()
        prompt = idx[:1, : args.prompt]
        same_tokens = torch.equal(generate("hf", hf, prompt, 16), generate("lnblocks", lb, prompt, 16))
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; logits max|diff| {diff:.2e}, "
        f"greedy tokens equal: {same_tokens}"
    )

    models = {"hf": hf, "lnblocks": lb}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    train_t: dict[str, list[float]] = {k: [] for k in models}
    gen_t: dict[str, list[float]] = {k: [] for k in models}
    for m in models.values():
        m.train()
    for k in models:  # warm-up
        train_step(k, models[k], opts[k], idx)
    for i in range(args.steps):  # interleaved, so that background load hits both alike
        for k in models:
            train_t[k] += timed(lambda k=k: train_step(k, models[k], opts[k], idx), 1)
        print(f"\rtraining steps {i + 1}/{args.steps}", end="", file=sys.stderr)
    print(file=sys.stderr)
    for m in models.values():
        m.eval()
    with torch.no_grad():
        for k in models:
            generate(k, models[k], prompt, 4)  # warm-up
        for _ in range(args.gen_repeats):
            for k in models:
                gen_t[k] += timed(lambda k=k: generate(k, models[k], prompt, args.new_tokens), 1)

    mem = {}
    for k in models:
        cmd = [sys.executable, __file__, "--worker", k, *sys.argv[1:]]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        mem[k] = json.loads(out)["peak_mib"]

    tr = {k: statistics.median(v) * 1e3 for k, v in train_t.items()}
    ge = {k: statistics.median(v) * 1e3 for k, v in gen_t.items()}
    print(
        f"\nGPT-2 shape: {args.layers} layers, d={args.dim}, {args.heads} heads, vocab {args.vocab}, "
        f"batch {args.batch} x T={args.seq}; generation: batch 1, prompt {args.prompt}, {args.new_tokens} new tokens"
    )
    print(f"{'':34s}{'transformers':>14s}{'lnblocks':>12s}{'speed-up':>10s}")
    print(
        f"{'train step (fwd+bwd+AdamW), ms':34s}{tr['hf']:14.1f}{tr['lnblocks']:12.1f}{tr['hf'] / tr['lnblocks']:9.2f}x"
    )
    print(f"{'greedy generation, ms':34s}{ge['hf']:14.1f}{ge['lnblocks']:12.1f}{ge['hf'] / ge['lnblocks']:9.2f}x")
    per_tok = {k: v / args.new_tokens for k, v in ge.items()}
    print(f"{'  per new token, ms':34s}{per_tok['hf']:14.2f}{per_tok['lnblocks']:12.2f}")
    print(
        f"{'train peak extra memory, MiB':34s}{mem['hf']:14.1f}{mem['lnblocks']:12.1f}"
        f"{mem['hf'] / max(mem['lnblocks'], 1e-9):9.2f}x"
    )


if __name__ == "__main__":
    main()
