"""The environment a number was measured in, recorded next to it: versions, the device and the checkout's commit."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() or None


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # absent, or broken on this machine: the record says so instead of failing the benchmark
        return None


def environment(device: torch.device) -> dict[str, object]:
    """Python, torch, Triton and CUDA versions, the device (name, SMs, L2 bytes), torch's threads and the commit."""
    env: dict[str, object] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "cuda": torch.version.cuda,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "commit": _commit(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            device=props.name,
            sms=props.multi_processor_count,
            l2_bytes=getattr(props, "L2_cache_size", None),
            memory_bytes=props.total_memory,
        )
    else:
        env["device"] = platform.processor() or "cpu"
    return env
