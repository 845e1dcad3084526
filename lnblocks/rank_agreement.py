"""``check_ranks_agree``: every rank about to run the same collectives has the same configuration, checked by one
``all_gather_object`` before the first of them, so a disagreement is one clear error on every rank instead of a hang
(ranks waiting in different collectives until the process group's timeout) or a silent run of rank 0's settings.

Each rank contributes its facts (a flat ``{dotted key: value}`` view of the configs it was given and of the model it
holds) and its own local problem (an input it refused). Every rank then sees every rank's contribution and raises the
same exception: the first rank's problem, else the first key on which a rank differs from rank 0.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

_ERRORS: dict[str, type[Exception]] = {"ValueError": ValueError, "TypeError": TypeError}


def flatten(facts: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a.b": repr(value)}`` of nested mappings (``repr``: exact for floats, comparable across processes)."""
    out: dict[str, str] = {}
    for key, value in facts.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(flatten(value, name))
        else:
            out[name] = repr(value)
    return out


def parameter_digest(model: nn.Module) -> str:
    """sha256 of every parameter's and buffer's name, shape and dtype: what the ranks' models must share."""
    h = hashlib.sha256()
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
    return h.hexdigest()[:16]


def _object_device_ready() -> None:
    """Object collectives on NCCL use the current CUDA device: pick this rank's, as ``init_device_mesh`` would next,
    when the process has not chosen one (launched by torchrun: ``LOCAL_RANK``)."""
    if dist.get_backend() == "nccl" and not torch.cuda.is_initialized() and "LOCAL_RANK" in os.environ:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))


def check_ranks_agree(what: str, facts: Mapping[str, Any], problem: BaseException | None = None) -> None:
    """Raise on every rank of the default process group unless every rank's ``facts`` equal rank 0's and no rank
    has a ``problem``. A collective: every rank must call it at the same point (before the collectives that need
    the ranks in step). The error names ``what`` (the call being checked), the rank and the first differing key.
    Without a process group it raises ``problem`` itself, if any."""
    if not dist.is_initialized():  # no other ranks to wait for: this rank's own problem, as it is
        if problem is not None:
            raise problem
        return
    _object_device_ready()
    kind = next((e.__name__ for e in (TypeError, ValueError) if isinstance(problem, e)), type(problem).__name__)
    local = (flatten(facts), None if problem is None else (kind, str(problem)))
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    failed = [(rank, p) for rank, (_, p) in enumerate(gathered) if p is not None]
    if failed:
        (rank, (kind, message)), others = failed[0], [r for r, _ in failed[1:]]
        if len(failed) < len(gathered):  # not every rank refused: say which did
            also = f" (also ranks {others})" if others else ""
            message = f"{message} [on rank {rank}{also}; the other ranks were given other inputs]"
        raise _ERRORS.get(kind, RuntimeError)(message)
    first = gathered[0][0]
    for rank, (mine, _) in enumerate(gathered):
        keys = sorted(k for k in first.keys() | mine.keys() if first.get(k) != mine.get(k))
        if keys:
            key = keys[0]
            rest = [k for k in keys[1:] if not k.startswith(key + ".")]
            more = f" (and {len(rest)} more key(s))" if rest else ""
            raise ValueError(
                f"{what}: the ranks disagree on {key}: rank 0 has {_shown(first, key)}, rank {rank} has "
                f"{_shown(mine, key)}{more}; every rank must be launched with the same configuration"
            )


def _shown(flat: Mapping[str, str], key: str) -> str:
    """``key``'s value, or the mapping its sub-keys make (a section set on one rank, None on another)."""
    if key in flat:
        return flat[key]
    subs = [f"{k[len(key) + 1 :]}: {v}" for k, v in flat.items() if k.startswith(key + ".")]
    return "{" + ", ".join(subs) + "}" if subs else "nothing"
