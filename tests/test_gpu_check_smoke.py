"""``benchmarks/gpu_check.sh --smoke``: the one-call GPU check runs end to end on CPU (tiny shapes, interpreter), so
the script that a GPU turn depends on cannot rot. Not under tests/kernels: the GPU run executes that folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("tests", "kernels", "models", "study", "hf", "resume", "vocab", "hfloss")


@pytest.mark.slow
def test_gpu_check_smoke(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTEST_XDIST_WORKER")}
    env["PYTHON"] = sys.executable
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--smoke", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8, files
    assert {"summary.txt", "check.log", "tests.log", "kernels.md", "kernels.json", "models.json", "hf.json"} <= set(
        files
    )
    summary = (out / "summary.txt").read_text()
    for name in SECTIONS:
        assert f"{name}: exit 0" in summary, (
            f"section {name} failed:\n{summary}\n{(out / 'check.log').read_text()[-3000:]}"
        )
    assert "### Summary" in summary and "GPT train step" in summary  # the summary is printed last, with both reports
    assert "of the same-size copy" in summary  # kernels quoted against a copy of their bytes, not a 1 GiB one
    kernels = json.loads((out / "kernels.json").read_text())
    timed = [r for r in kernels["rows"] if r["status"] == "ok"]
    assert timed and all(r["pct_copy"] == 100 * r["gbps"] / r["copy_gbps"] for r in timed)
    assert {"quack", "cudnn (TE)"} <= {r["impl"] for r in kernels["rows"]}  # optional contenders named, not dropped
    assert proc.stdout.rstrip().endswith(summary.rstrip().splitlines()[-1])
    assert "study record: status=finished" in summary
    assert "| Trainer step | cpu | float32 | fused |" in summary  # the HF stacks table (bench_hf_training.py)
    assert "| 70,000 | 1 |" in summary  # the study step table (bench_study_step.py)
    assert "| 65,536 | loss |" in summary  # the HF chunked-loss table (bench_hf_chunked_loss.py)
