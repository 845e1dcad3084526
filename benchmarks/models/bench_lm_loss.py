"""The chunked LM head + cross-entropy (``lnblocks.models.loss``) against today's full-logits loss, on CPU.

Per vocabulary size (the study's shape: batch 16, sequence 64, width 64), in one run, contenders interleaved round by
round (medians):

- ``loss``: ``F.linear`` + ``F.cross_entropy(logits.float())`` forward+backward (what ``GPT.forward`` does), against
  ``lm_head_loss``; ``loss+z``: the same with the study's z-loss (``1e-4 * logsumexp(logits.float())^2``);
- ``step``: a whole training step of a 2-layer ``GPT`` (forward, backward, AdamW) with ``return_logits`` True/False.

Each is timed in a fresh process per allocator setting (glibc reads ``MALLOC_*`` at start-up): the default, glibc's
mmap and trim thresholds raised to 1 GiB (no ``mmap``/``munmap`` per step for buffers under 1 GiB, no heap trim),
PyTorch's ``THP_MEM_ALLOC_ENABLE=1`` (2 MiB-aligned, huge-page-advised allocations), and the glibc thresholds set
by the process itself with ``mallopt`` (``set_malloc_thresholds``). Reported: median ms, the
ratio full / chunked, the system-time share ``stime / (utime + stime)`` and minor page faults per call (both from
``resource.getrusage``). Peak memory is measured once, in this process, from the profiler's allocator events
(``profile_memory=True``: every allocation and free of torch's CPU allocator, in order; the peak of the running sum
above what was held before the call), minus the two gradients both versions must return.

    python benchmarks/models/bench_lm_loss.py                      # V = 256, 30522, 50257; 5 rounds; 1 thread
    python benchmarks/models/bench_lm_loss.py --vocab 30522 --rounds 3 --envs default thp
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
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

import torch
import torch.nn.functional as F
from tqdm import tqdm

from benchmarks.common.memory import peak_extra_mib
from lnblocks import GPT, BlockConfig, GPTConfig
from lnblocks.models.loss import lm_head_loss

Z = 1e-4  # PaLM's z-loss coefficient
ENVS: dict[str, dict[str, str]] = {
    "default": {},
    "glibc-1GiB": {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)},
    "thp": {"THP_MEM_ALLOC_ENABLE": "1"},
    "mallopt-1GiB": {"BENCH_MALLOPT": str(1 << 30)},  # the same thresholds set at run time by the process itself
}


def set_malloc_thresholds(nbytes: int) -> bool:
    """glibc's ``mallopt(M_MMAP_THRESHOLD)`` and ``mallopt(M_TRIM_THRESHOLD)``: what a running worker can call
    instead of the ``MALLOC_*_`` variables, which glibc reads only at start-up. False where it is not glibc."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(libc.mallopt(m_mmap_threshold, nbytes)) and bool(libc.mallopt(m_trim_threshold, nbytes))


def loss_call(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, chunked: bool, z: float) -> Callable[[], None]:
    def full() -> None:
        logits = F.linear(h, w)  # (B, T, V)
        loss = F.cross_entropy(logits.float().flatten(0, 1), t.flatten())
        (loss + z * torch.logsumexp(logits.float(), dim=-1).pow(2).mean() if z else loss).backward()

    def chunks() -> None:
        loss, stats = lm_head_loss(h, w, t, z_loss=z)
        (loss + stats.z_loss if z else loss).backward()

    return chunks if chunked else full


def step_call(args: argparse.Namespace, vocab: int, chunked: bool) -> Callable[[], None]:
    torch.manual_seed(0)
    block = BlockConfig(dim=args.dim, attention={"n_heads": 4})
    model = GPT(GPTConfig(vocab_size=vocab, max_seq_len=args.seq, n_layers=args.layers, block=block))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx, y = torch.randint(0, vocab, (2, args.batch, args.seq))

    def step() -> None:
        _, loss = model(idx, y, return_logits=not chunked)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def contenders(args: argparse.Namespace, vocab: int) -> dict[str, Callable[[], None]]:
    h = torch.randn(args.batch, args.seq, args.dim, requires_grad=True)
    w = (torch.randn(vocab, args.dim) * 0.02).requires_grad_()
    t = torch.randint(0, vocab, (args.batch, args.seq))
    out = {}
    for z, name in ((0.0, "loss"), (Z, "loss+z")):
        out[f"{name} full"] = loss_call(h, w, t, False, z)
        out[f"{name} chunked"] = loss_call(h, w, t, True, z)
    out["step full"] = step_call(args, vocab, False)
    out["step chunked"] = step_call(args, vocab, True)
    return out


def child(args: argparse.Namespace) -> None:
    """Time every contender at every vocabulary size; one JSON line per (V, contender) on stdout."""
    torch.set_num_threads(args.threads)
    if os.environ.get("BENCH_MALLOPT") and not set_malloc_thresholds(int(os.environ["BENCH_MALLOPT"])):
        raise SystemExit("mallopt failed (not glibc?)")
    for vocab in args.vocab:
        calls = contenders(args, vocab)
        inner = 20 if vocab <= 1024 else 1  # small V: several calls per sample
        samples: dict[str, list[float]] = {k: [] for k in calls}
        usage = {k: [0.0, 0.0, 0] for k in calls}  # utime, stime, minflt
        for fn in calls.values():
            fn()  # warm-up: first-touch of the weights, optimizer state
        for _ in range(args.rounds):
            for name, fn in calls.items():
                r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                for _ in range(inner):
                    fn()
                dt, r1 = (time.perf_counter() - t0) / inner, resource.getrusage(resource.RUSAGE_SELF)
                samples[name].append(dt)
                u = usage[name]
                u[0] += r1.ru_utime - r0.ru_utime
                u[1] += r1.ru_stime - r0.ru_stime
                u[2] += r1.ru_minflt - r0.ru_minflt
        for name in calls:
            ut, st, flt = usage[name]
            row = {"vocab": vocab, "name": name, "ms": 1e3 * statistics.median(samples[name])}
            row.update(sys_share=st / max(ut + st, 1e-9), faults=flt / (args.rounds * inner))
            print(json.dumps(row), flush=True)


def memory_table(args: argparse.Namespace) -> list[str]:
    lines = [
        "| V | fp32 logits MiB | full loss extra MiB | chunked extra MiB | chunked / logits | +z full | +z chunked |"
    ]
    lines.append("|---|---|---|---|---|---|---|")
    for vocab in args.vocab:
        h = torch.randn(args.batch, args.seq, args.dim, requires_grad=True)
        w = torch.randn(vocab, args.dim, requires_grad=True)
        t = torch.randint(0, vocab, (args.batch, args.seq))
        keep = (h.numel() + w.numel()) * 4  # grad_hidden and grad_weight: returned by both
        logits = args.batch * args.seq * vocab * 4 / 2**20
        got = []
        for z in (0.0, Z):
            for chunked in (False, True):
                h.grad = w.grad = None
                got.append(peak_extra_mib(loss_call(h, w, t, chunked, z), keep))
        full, chunk, zfull, zchunk = got
        lines.append(
            f"| {vocab} | {logits:.1f} | {full:.1f} | {chunk:.1f} | {chunk / logits:.3f} | {zfull:.1f} | {zchunk:.1f} |"
        )
    return lines


def time_tables(args: argparse.Namespace) -> list[str]:
    rows: dict[tuple[str, int, str], dict] = {}
    base = [sys.executable, os.path.abspath(__file__), "--child", "--rounds", str(args.rounds)]
    base += ["--threads", str(args.threads), "--batch", str(args.batch), "--seq", str(args.seq)]
    base += ["--dim", str(args.dim), "--layers", str(args.layers), "--vocab", *map(str, args.vocab)]
    for env_name in tqdm(args.envs, desc="allocator settings", file=sys.stderr):
        env = {**os.environ, **ENVS[env_name], "OMP_NUM_THREADS": str(args.threads)}
        proc = subprocess.run(base, env=env, capture_output=True, text=True, check=True)
        for line in proc.stdout.splitlines():
            r = json.loads(line)
            rows[(env_name, r["vocab"], r["name"])] = r
    lines = ["| allocator | V | what | full ms | chunked ms | full / chunked | sys share full | sys share chunked |"]
    lines[0] += " faults/call full | faults/call chunked |"
    lines.append("|---" * 10 + "|")
    for env_name in args.envs:
        for vocab in args.vocab:
            for what in ("loss", "loss+z", "step"):
                f, c = rows[(env_name, vocab, f"{what} full")], rows[(env_name, vocab, f"{what} chunked")]
                lines.append(
                    f"| {env_name} | {vocab} | {what} | {f['ms']:.1f} | {c['ms']:.1f} | {f['ms'] / c['ms']:.2f}x | "
                    f"{f['sys_share']:.0%} | {c['sys_share']:.0%} | {f['faults']:.0f} | {c['faults']:.0f} |"
                )
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, nargs="+", default=[256, 30522, 50257])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    torch.set_num_threads(args.threads)
    print(f"B={args.batch} T={args.seq} C={args.dim}, {args.threads} thread(s), torch {torch.__version__}")
    print("\n".join(memory_table(args)))
    print()
    print("\n".join(time_tables(args)))


if __name__ == "__main__":
    main()
