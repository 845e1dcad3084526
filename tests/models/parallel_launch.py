"""``torchrun`` with 2 CPU processes on a free local port, for the sharded-training tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the scripts import tests.<area>.<helpers>, as pytest's pythonpath does


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(
    script: Path,
    *args: str,
    nproc: int = 2,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """Run ``script args`` under ``torchrun --nproc_per_node nproc`` (gloo, one thread per process)."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc),
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script), *args,
    ]  # fmt: skip
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
