"""SIGTERM as a request to stop, not a kill: what Slurm sends a preempted or timed-out job before its SIGKILL.

While a sweep with checkpoints runs on this machine (the serial and local executors), SIGTERM sets a flag instead of
ending the process. A run that checkpoints sees it at its next step: it writes a checkpoint of that step and stops
(``Preempted``), so a requeued job resumes exactly there instead of at the last periodic checkpoint. The runner
forwards the signal to its workers, starts no further run, writes no report and exits with 143 (128 + SIGTERM) after
one line. docs/long-runs.md, "Resume on every executor".

A SIGTERM sent to one worker of a pool alone (a user's ``kill <pid>``, an out-of-memory daemon) stops that worker:
its run checkpoints and stops as above (a run without checkpoints, or an idle worker, ends at once), the worker
exits, and the runner starts another in its place and goes on; the stopped run counts as unfinished in the exit
status (1), and the rerun resumes it.

Under torchrun and Ray the signal keeps its default meaning (those runs lose at most ``every`` / ``every_s``): their
ranks would have to agree on the step to stop at, a collective every step.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable

EXIT_CODE = 128 + signal.SIGTERM
_state: dict = {"requested": False, "installed": False, "previous": signal.SIG_DFL}
_forwarders: list[Callable[[], None]] = []


class Preempted(Exception):
    """A run stopped on SIGTERM after writing the checkpoint of ``step`` (no record: the rerun resumes it)."""

    def __init__(self, run_id: str, step: int) -> None:
        super().__init__(f"stopped by SIGTERM at step {step}, checkpointed there; rerun to resume it")
        self.run_id, self.step = run_id, step


def _on_sigterm(signum: int, frame: object) -> None:
    _state["requested"] = True
    for forward in list(_forwarders):
        forward()


def install() -> bool:
    """Turn SIGTERM into a stop request in this process (idempotent). Only the main thread can install a signal
    handler: elsewhere nothing changes and False is returned."""
    if _state["installed"]:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    _state["previous"] = signal.signal(signal.SIGTERM, _on_sigterm)
    _state["installed"] = True
    return True


def requested() -> bool:
    """Whether a SIGTERM has asked this process to stop."""
    return _state["requested"]


def on_sigterm(callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` in the signal handler when a SIGTERM arrives here (after the flag is set; it may raise, to
    end the process: a worker with nothing to checkpoint); returns the function that removes it."""
    _forwarders.append(callback)
    return lambda: _forwarders.remove(callback)


def forward_to(pids: Callable[[], list[int]]) -> Callable[[], None]:
    """Send SIGTERM on to the processes ``pids()`` names when one arrives here (a pool's busy workers); returns the
    function that stops forwarding."""

    def forward() -> None:
        for pid in pids():
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.kill(pid, signal.SIGTERM)

    return on_sigterm(forward)


def reset() -> None:
    """The SIGTERM handler from before ``install`` back, the flag cleared (a finished sweep; tests)."""
    if _state["installed"] and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _state["previous"])
    _state.update(requested=False, installed=False, previous=signal.SIG_DFL)
    _forwarders.clear()
