"""Ending a process that used ``torch.distributed`` without the interpreter's teardown, where gloo can abort it.

After a gloo collective returns to Python, a worker thread of the process group still releases the collective's
work object, and with it references to tensors that Python holds; that release takes the GIL. If the main thread
has begun finalizing the interpreter by then, CPython ends the waiting worker thread (``pthread_exit``) inside a
``noexcept`` destructor, and the process dies with ``terminate called without an active exception`` (SIGABRT); a
glibc ``double free`` seen once at the same point is most likely the same race. ``destroy_process_group`` cannot
prevent it: it joins the group's threads only when the last reference to the group goes, and DTensor's sharding
caches keep every ``DeviceMesh`` (and so its groups) alive until the interpreter ends. So a rank of a sharded job
that finished its work correctly can still exit with an error. The worked example of ``docs/sharding.md`` did so
in 5 of 144 launches (two at a time on 2 cores) and in 0 of 150 ending with ``end_distributed``. pytorch/pytorch PR
179291 describes the same teardown.

``exit_process`` ends the process the way a finished rank should: the ``atexit`` handlers run (logging, tqdm,
TensorBoard writers that registered one), stdout and stderr are flushed, and ``os._exit`` skips finalization. Files
still open and unflushed are not flushed: close them first, as every writer in lnblocks does. ``exit_rank`` is a
program's last call with its exit status: that ending for a launched rank that succeeded, the ordinary one otherwise.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn


def launched_as_rank() -> bool:
    """True in a process that a distributed launcher started (torchrun, or srun/mpirun setting ``RANK``)."""
    return os.environ.get("RANK") is not None


def _check_status(code: object) -> None:
    if not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= 255:
        raise ValueError(f"code must be an exit status, an int in [0, 255]: got {code!r}")


def exit_process(code: int = 0) -> NoReturn:
    """End this process with exit status ``code`` after its ``atexit`` handlers and a flush of stdout/stderr, but
    without interpreter finalization (see the module docstring for why a process that used gloo needs this)."""
    _check_status(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # None, a closed pipe, a closed file
            stream.flush()
    os._exit(code)


def exit_rank(code: int) -> NoReturn:
    """End the program with exit status ``code``: ``exit_process(0)`` in a rank a launcher started (``RANK`` set)
    that succeeded, else ``sys.exit(code)``. A failing rank exits the ordinary way because torchrun stops every other
    rank once one exits with an error, and the ordinary exit's pace is what lets each of them print its own error."""
    _check_status(code)
    if code == 0 and launched_as_rank():
        exit_process(0)
    sys.exit(code)


def end_distributed() -> None:
    """The last line of a script that torchrun may launch, once its work succeeded: a barrier (every rank has
    finished its collectives), ``destroy_process_group``, then, in a rank a launcher started (``RANK`` is set),
    ``exit_process(0)``. Run as a plain script or inside another program (``RANK`` unset), it returns after
    destroying the group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    if launched_as_rank():
        exit_process(0)
