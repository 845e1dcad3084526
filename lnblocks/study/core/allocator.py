"""glibc's malloc thresholds for the processes that train runs: keep a step's big buffers instead of handing them
back to the kernel and faulting them in again at the next step.

PyTorch's CPU allocator is plain ``malloc``. glibc serves a request above ``M_MMAP_THRESHOLD`` (128 KiB, raised at
run time up to 32 MiB by the sizes freed) with a fresh ``mmap`` that ``free`` unmaps, and returns the top of its
heap to the kernel once more than ``M_TRIM_THRESHOLD`` of it is free; either way the next step's buffer of the same
size is faulted in again page by page, zeroed by the kernel. A training step that allocates and frees the same
multi-MiB buffers every step (the LM head's weight gradient, the optimizer's temporaries, and full logits where they
are still built) then spends a large share of its CPU time in the kernel (measured before this module existed: 43% of
a study's CPU time at vocabulary 30,522; benchmarks/study/README.md, ``bench_study_step.py``).

``tune_allocator`` sets both thresholds to ``THRESHOLD`` with ``mallopt`` in the running process, once. The
``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` variables do the same but glibc reads them only when a process
starts, so they would have to be in the environment of every worker before it is spawned (the local pool's, Ray's
raylet-started workers, each torchrun rank); ``mallopt`` is called where every executor already goes, in
``core.executors.train_job``. The cost: a process keeps the heap memory it freed (up to ``THRESHOLD``) instead of
returning it, so its resident size stays at its peak. It changes no number a run computes.

Left alone when the user chose: any ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or malloc entry of
``GLIBC_TUNABLES`` in the environment, or ``LNBLOCKS_MALLOC=default``. Not glibc (macOS, musl): nothing to do.
"""

from __future__ import annotations

import ctypes
import os

THRESHOLD = 1 << 30  # 1 GiB: above every buffer of a study step (the full logits at V = 50k, B x T = 1k: 196 MiB)
OPT_OUT = "LNBLOCKS_MALLOC"  # "default": leave glibc's thresholds as they are
_USER_SET = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
_done: list[str] = []  # what this process did, once


def _user_choice() -> str | None:
    """Why the thresholds are left alone (the environment sets them), or None."""
    if os.environ.get(OPT_OUT, "").strip().lower() == "default":
        return f"{OPT_OUT}=default"
    for name in _USER_SET:
        if name in os.environ:
            return f"{name} is set"
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES sets malloc"
    return None


def tune_allocator(nbytes: int = THRESHOLD) -> str:
    """Set glibc's mmap and trim thresholds to ``nbytes`` in this process (once; later calls return the first
    outcome). Returns what was done: ``"glibc thresholds N MiB"``, ``"left alone: <why>"`` or ``"not glibc"``."""
    if _done:
        return _done[0]
    why = _user_choice()
    if why is not None:
        outcome = f"left alone: {why}"
    else:
        try:
            mallopt = ctypes.CDLL(None).mallopt  # the process's own libc
        except (OSError, AttributeError):
            mallopt = None
        if mallopt is None:
            outcome = "not glibc"
        elif mallopt(_M_MMAP_THRESHOLD, nbytes) and mallopt(_M_TRIM_THRESHOLD, nbytes):
            outcome = f"glibc thresholds {nbytes >> 20} MiB"
        else:
            outcome = "left alone: mallopt refused"
    _done.append(outcome)
    return outcome
