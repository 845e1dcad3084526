"""Per-call time of small residual blocks, where the Python around the math dominates (width 64, 8 tokens, forward,
no grad, 1 thread): what a change to the blocks costs each call. ``--base DIR`` times another checkout of lnblocks
(a ``git worktree`` of an older commit) in alternating subprocesses, so both see the same machine load.

    python benchmarks/models/bench_block_overhead.py
    git worktree add /tmp/base <commit> && python benchmarks/models/bench_block_overhead.py --base /tmp/base
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLACEMENTS = ("pre", "post", "sandwich", "reordered")
CHILD = """
import json, statistics, sys, time
import torch
from lnblocks import Block, BlockConfig
torch.set_num_threads(1)
out = {}
for placement in sys.argv[1].split(","):
    torch.manual_seed(0)
    block = Block(BlockConfig(dim=64, placement=placement, norm="layernorm", attention={"n_heads": 4})).eval()
    x = torch.randn(1, 8, 64)  # (B, T, C)
    with torch.no_grad():
        for _ in range(200):
            block(x)
        times = []
        for _ in range(int(sys.argv[2])):
            t = time.perf_counter()
            for _ in range(200):
                block(x)
            times.append((time.perf_counter() - t) / 200 * 1e6)
    out[placement] = statistics.median(times)
print(json.dumps(out))
"""


def time_checkout(checkout: Path, repeats: int) -> dict[str, float]:
    """Median µs per forward call of each placement's block, with ``checkout``'s lnblocks."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    cmd = [sys.executable, "-c", CHILD, ",".join(PLACEMENTS), str(repeats)]
    return json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, default=None, help="another checkout to compare with")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (the median is reported)")
    parser.add_argument("--repeats", type=int, default=30, help="timed blocks of 200 calls per round")
    args = parser.parse_args()
    checkouts = {"this": ROOT} | ({"base": args.base.resolve()} if args.base else {})
    results: dict[str, list[dict[str, float]]] = {name: [] for name in checkouts}
    for _ in range(args.rounds):
        for name, path in checkouts.items():
            results[name].append(time_checkout(path, args.repeats))
    print("| placement | " + " | ".join(f"{n} µs" for n in checkouts) + (" | this / base |" if args.base else " |"))
    print("|---" * (len(checkouts) + 1 + bool(args.base)) + "|")
    for p in PLACEMENTS:
        med = {n: statistics.median(r[p] for r in results[n]) for n in checkouts}
        ratio = f" {med['this'] / med['base']:.3f} |" if args.base else ""
        print(f"| {p} | " + " | ".join(f"{med[n]:.1f}" for n in checkouts) + " |" + ratio)


if __name__ == "__main__":
    main()
