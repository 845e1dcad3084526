"""Cost of mid-run checkpoints (``train.checkpoint``, docs/long-runs.md), on CPU.

1. Size and write time of one checkpoint at the GPT-2 small shape (12 layers, width 768, V = 50,257, untied: 163M
   parameters, AdamW), through ``Checkpoints.save`` (the whole write: state dicts, ``torch.save``, fsync, the
   manifest's sha256 of every file, rename, fsync of the folders), and the same state through
   ``torch.distributed.checkpoint`` (DCP, what a ``torchrun`` run writes, here in one process), plus the read back.
2. The training step time with ``checkpoint: {every: 50}`` against none, on the demo's shape (configs/base.yaml:
   width 64, depth 3, byte-level Shakespeare, T = 64, batch 16, diagnostics every 10): a ratio in one run, median
   of alternating pairs, and the save time accounted directly (seconds in ``save`` / training seconds). Target < 2%.
3. The stability monitor's per-step cost: the global gradient norm every step (``stability.grad_norm``, kept on the
   device) against one forward + backward of the demo shape, depths 3 and 12.

    python benchmarks/study/bench_checkpoint.py [--skip-gpt2] [--depth 3] [--steps 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

import torch

from lnblocks.models import GPT
from lnblocks.study import RunConfig
from lnblocks.study.core.checkpoint import CheckpointConfig, Checkpoints
from lnblocks.study.core.executors import Job, train_job
from lnblocks.study.core.tasks import DistContext
from lnblocks.study.lm.run.optim import build_optimizer

GPT2 = {"depth": 12, "dim": 768, "n_heads": 12, "activation": "gelu", "positions": "learned"}


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def gpt2_checkpoint(root: Path, repeats: int) -> None:
    run = RunConfig.from_dict({"model": GPT2, "data": {"seq_len": 1024}, "train": {"optimizer": {"weight_decay": 0.1}}})
    model = GPT(run.model.gpt_config(50257, 1024))
    opt = build_optimizer(model, run.train)
    for p in model.parameters():  # AdamW's state (exp_avg, exp_avg_sq, step) without a 1024-token step on a CPU
        p.grad = torch.zeros_like(p)
    opt.step()
    n = sum(p.numel() for p in model.parameters())
    ck = Checkpoints(root / "ckpt", CheckpointConfig(every=1, keep=1), "0" * 64, DistContext())
    saves, loads, dcp_saves = [], [], []
    for i in range(repeats):
        t = time.perf_counter()
        ck.save(i + 1, model, opt, {"step": i + 1})
        saves.append(time.perf_counter() - t)
        t = time.perf_counter()
        assert ck.latest() == i + 1  # validates every file's sha256
        ck.load(i + 1, model, opt)
        loads.append(time.perf_counter() - t)
        dcp_saves.append(dcp_save(model, opt, root / f"dcp{i}"))
    step = root / "ckpt" / f"step-{repeats:09d}"
    size = folder_bytes(step)
    print(f"GPT-2 small shape: {n / 1e6:.1f}M parameters, AdamW; median of {repeats}")
    print("| writer | checkpoint size | write (s) | write GB/s | validate + load (s) |")
    print("|---|---|---|---|---|")
    w = statistics.median(saves)
    print(f"| Checkpoints.save (torch.save, fsync, sha256) | {size / 2**30:.2f} GiB | {w:.2f} | "
          f"{size / 1e9 / w:.2f} | {statistics.median(loads):.2f} |")  # fmt: skip
    d = statistics.median(dcp_saves)
    dsize = folder_bytes(root / "dcp0")
    print(f"| DCP (torch.distributed.checkpoint), model + optimizer only | {dsize / 2**30:.2f} GiB | {d:.2f} | "
          f"{dsize / 1e9 / d:.2f} | – |")  # fmt: skip


def dcp_save(model: torch.nn.Module, opt: torch.optim.Optimizer, path: Path) -> float:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    t = time.perf_counter()
    msd, osd = get_state_dict(model, opt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ...: a single process"
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path), no_dist=True)
    return time.perf_counter() - t


def demo_run(depth: int, steps: int, every: int | None, out: Path) -> tuple[float, float]:
    """(training seconds, seconds spent saving checkpoints) of one demo-shape run."""
    train: dict = {"steps": steps, "lr": 1e-3, "optimizer": {"name": "adam", "beta2": 0.98}}
    if every:
        train["checkpoint"] = {"every": every}
    run = RunConfig.from_dict({
        "data": {"source": "shakespeare", "seq_len": 64, "batch_size": 16, "eval_batches": 1},
        "model": {"depth": depth, "dim": 64, "n_heads": 4, "init": "xavier", "qkv_init": "stacked"},
        "train": train, "diagnostics": {"every": 10, "init_grad_batches": 0},
    })  # fmt: skip
    spent = [0.0]
    save = Checkpoints.save

    def timed(self, *args, **kwargs):  # the seconds inside save, accounted directly
        t = time.perf_counter()
        save(self, *args, **kwargs)
        spent[0] += time.perf_counter() - t

    Checkpoints.save = timed
    try:
        folder = out / f"ck{time.monotonic_ns()}"
        rec = train_job(Job("lm", run, checkpoint_dir=str(folder) if every else None))
    finally:
        Checkpoints.save = save
        shutil.rmtree(folder, ignore_errors=True)
    return rec.time["step_ms"] * steps / 1e3, spent[0]


def overhead(root: Path, depth: int, steps: int, repeats: int) -> None:
    demo_run(depth, 10, None, root)  # warm-up: corpus load, allocator
    ratios, shares, plain_ms, ck_ms = [], [], [], []
    for _ in range(repeats):
        base, _ = demo_run(depth, steps, None, root)
        with_ck, spent = demo_run(depth, steps, 50, root)
        ratios.append(with_ck / base)
        shares.append(spent / with_ck)
        plain_ms.append(1e3 * base / steps)
        ck_ms.append(1e3 * with_ck / steps)
    saves = (steps - 1) // 50
    print(f"\ndemo shape (depth {depth}, width 64, T 64, batch 16), {steps} steps, {saves} checkpoints, "
          f"median of {repeats} alternating pairs")  # fmt: skip
    print("| step, no checkpoints (ms) | step, every 50 (ms) | ratio | time in save / training time |")
    print("|---|---|---|---|")
    print(f"| {statistics.median(plain_ms):.2f} | {statistics.median(ck_ms):.2f} | {statistics.median(ratios):.4f}x "
          f"| {100 * statistics.median(shares):.2f}% |")  # fmt: skip


def grad_norm_cost(depths: tuple[int, ...] = (3, 12), reps: int = 200) -> None:
    from lnblocks.study.lm.run.stability import grad_norm

    print("\n| depth | grad norm (ms) | forward + backward (ms) | share |\n|---|---|---|---|")
    for depth in depths:
        run = RunConfig.from_dict({"model": {"depth": depth, "dim": 64, "n_heads": 4}})
        model = GPT(run.model.gpt_config(256, 64))
        x = torch.randint(0, 256, (16, 64), generator=torch.Generator().manual_seed(0))
        step = []
        for _ in range(5):
            t = time.perf_counter()
            model.zero_grad()
            model(x, x)[1].backward()
            step.append(time.perf_counter() - t)
        t = time.perf_counter()
        for _ in range(reps):
            grad_norm(model)
        norm = (time.perf_counter() - t) / reps
        s = statistics.median(step)
        print(f"| {depth} | {1e3 * norm:.3f} | {1e3 * s:.1f} | {100 * norm / s:.2f}% |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-gpt2", action="store_true")
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="lnblocks-ckpt-", dir=args.dir))
    print(f"torch {torch.__version__}, 1 thread, writing under {root}")
    try:
        if not args.skip_gpt2:
            gpt2_checkpoint(root, args.repeats)
        overhead(root, args.depth, args.steps, args.repeats)
        grad_norm_cost()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
