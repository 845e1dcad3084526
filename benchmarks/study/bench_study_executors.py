"""What the Ray executor costs per run against the local executors, on the same tiny study (records checked equal).

    .venv/bin/python benchmarks/study/bench_study_executors.py [--runs 8] [--steps 60]

Times ``run_study`` of one study (N runs of a tiny Markov-chain model) with: the serial executor (this process), two
local worker processes, and a local Ray instance with 2 CPUs, once with one run at a time (``cpus_per_run: 2``,
comparable to serial) and with two (``cpus_per_run: 1``, comparable to two workers), the first Ray study also
paying for starting its worker processes. Ray's start-up
(``ray.init``) is timed apart; the per-run overhead is (Ray wall - local wall) / N. Every record is compared with the
serial executor's (bit-identical apart from timing and host fields).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

from lnblocks.study import read_record, run_study

TINY = """
data: {{source: markov, vocab_size: 16, seq_len: 16, batch_size: 8, eval_batches: 1}}
model: {{dim: 32, n_heads: 2, depth: 2}}
train: {{steps: {steps}}}
diagnostics: {{every: 20, init_grad_batches: 1, probe_batch_size: 2}}
resources: {{cpus_per_run: 1}}
grid: {{train.seed: {seeds}}}
"""


def timed(cfg: Path, out: Path, **kwargs) -> float:
    t0 = time.perf_counter()
    assert run_study(cfg, out, show_progress=False, report=False, **kwargs) == 0
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best of each is reported")
    args = parser.parse_args()
    import ray

    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cfg = root / "c.yaml"
        cfg.write_text(TINY.format(steps=args.steps, seeds=list(range(args.runs))))
        timed(cfg, root / "warmup")  # first-run costs of this process (allocator, kernels' first calls)
        t0 = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        init_s = time.perf_counter() - t0
        try:
            cold = timed(cfg, root / "cold", executor="ray")  # starts the worker processes (each imports torch)
            contenders = {
                "serial": {},
                "ray, 1 at a time": {"executor": "ray", "overrides": {"resources.cpus_per_run": 2}},
                "local, 2 workers": {"workers": 2},
                "ray, 2 at a time": {"executor": "ray"},
            }
            for r in range(args.rounds):
                for name, kwargs in contenders.items():
                    out = root / f"{name.replace(' ', '_').replace(',', '')}-{r}"
                    best[name] = min(best.get(name, float("inf")), timed(cfg, out, **kwargs))
        finally:
            ray.shutdown()
        reference = sorted((root / "warmup" / "runs").glob("*.json"))
        for out in [p for p in root.iterdir() if p.is_dir() and p.name != "warmup"]:
            for p in reference:
                assert read_record(p).deterministic_json() == read_record(out / "runs" / p.name).deterministic_json()
    n = args.runs
    print(f"{n} runs x {args.steps} steps, best of {args.rounds} rounds; records identical across executors")
    print(f"ray.init(num_cpus=2): {init_s:.1f} s; first Ray study (starts 2 workers): {cold:.1f} s")
    for name, base in (("ray, 1 at a time", "serial"), ("ray, 2 at a time", "local, 2 workers")):
        print(
            f"{base:>18}: {best[base]:5.1f} s  {name:>17}: {best[name]:5.1f} s  "
            f"Ray overhead {(best[name] - best[base]) / n * 1e3:+.0f} ms/run"
        )


if __name__ == "__main__":
    main()
