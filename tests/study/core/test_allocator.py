"""``lnblocks.study.core.allocator``: the glibc thresholds every process that trains a run sets. A buffer
freed and allocated again is faulted in again page by page with glibc's defaults, and not once the thresholds are
raised; a user's own malloc settings are left alone."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from lnblocks.study.core import allocator

GLIBC = platform.libc_ver()[0] == "glibc"

CHILD = """
import resource, torch
from lnblocks.study.core.allocator import tune_allocator

def faults(n_mib, times=6):  # minor page faults of allocating, touching and freeing a buffer, after the first time:
    counts = []               # the median, so that one pass disturbed by the machine (memory pressure) does not count
    for _ in range(times):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.empty(n_mib << 18).fill_(1.0)  # n_mib MiB of fp32, freed at once
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return sorted(counts[1:])[(times - 1) // 2]

default = faults(64)
outcome = tune_allocator()
faults(64, 2)  # the heap grows once
print(default, faults(64), outcome)
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_raised_thresholds_stop_the_refaulting_of_a_freed_buffer() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != allocator.OPT_OUT}
    env.pop("GLIBC_TUNABLES", None)
    root = str(Path(__file__).resolve().parents[3])  # this checkout's lnblocks, whatever is installed
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    default, tuned, outcome = out.stdout.split(maxsplit=2)
    assert outcome.strip() == "glibc thresholds 1024 MiB"
    assert float(default) > 10_000  # 64 MiB is above glibc's mmap threshold: 16,384 pages faulted in every time
    assert float(tuned) < float(default) / 100


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"MALLOC_TRIM_THRESHOLD_": "0"}, "MALLOC_TRIM_THRESHOLD_ is set"),
        ({"MALLOC_MMAP_THRESHOLD_": "65536"}, "MALLOC_MMAP_THRESHOLD_ is set"),
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}, "GLIBC_TUNABLES sets malloc"),
        ({allocator.OPT_OUT: "default"}, f"{allocator.OPT_OUT}=default"),
        ({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"}, None),
    ],
)
def test_a_users_malloc_settings_are_left_alone(monkeypatch: pytest.MonkeyPatch, env: dict, why: str | None) -> None:
    for name in (*allocator._USER_SET, "GLIBC_TUNABLES", allocator.OPT_OUT):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert allocator._user_choice() == why
