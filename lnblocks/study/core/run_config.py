"""What every task's run config shares: grid ``labels`` and an id hashed from the resolved config, stable across
sessions and machines (``<readable labels>-<10 hex of sha256>``), and the seed range the study accepts.

A task's run config is a frozen ``lnblocks.config.Config`` dataclass that also derives from ``LabelledRun`` and has
``labels``, ``threads`` (torch threads of the process that trains it, pinned by the executors) and ``cost``
(relative, for scheduling the most expensive runs first); a task that runs under ``torchrun`` gives it a ``device``
too (``"cpu"``, ``"cuda"`` or ``"auto"``), and one whose runs checkpoint a ``checkpoint``
(``core.checkpoint.CheckpointConfig`` or None).

Ids that survive upgrades: the id hashes ``identity()``, by default ``to_dict()``. A key added to a config after
records were written is left out of ``to_dict()`` while it holds the value that does what runs did before it
existed (``drop_added`` with the task's table of such keys), so the ids of earlier runs do not change and their
records are reused; a key set to anything else, or a key whose default changed, changes the id. A task whose key
kept its name and value but changed what it does adds a version for it to ``identity()`` (the lm task's
``KEY_VERSIONS``), which moves the ids of the affected runs only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any, TypeVar

from lnblocks.config import ConfigValueError, check_int

# Seeds feed torch.Generator.manual_seed (64 bits) after a task adds its stream offsets (< 2**21).
MAX_SEED = 2**62

_Run = TypeVar("_Run", bound="LabelledRun")


def check_seed(key: str, value: Any) -> int:
    """An int in ``[0, 2**62]``: what ``torch.Generator.manual_seed`` takes once a task adds its offsets."""
    value = check_int(key, value, minimum=0)
    if value > MAX_SEED:
        raise ConfigValueError(
            key, f"must be in [0, 2**62] (a torch.Generator seed plus the study's offsets), got {value}"
        )
    return value


def config_digest(resolved: dict[str, Any]) -> str:
    """sha256 (64 hex digits) over the resolved config as canonical JSON."""
    blob = json.dumps(resolved, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def config_hash(resolved: dict[str, Any]) -> str:
    """10 hex digits of sha256 over the resolved config as canonical JSON."""
    return config_digest(resolved)[:10]


def drop_added(resolved: dict[str, Any], added: Mapping[str, Any]) -> dict[str, Any]:
    """``resolved`` without each dotted key of ``added`` whose value equals the one given there (the value that does
    what runs did before the key existed): their ids stay what they were before it was added."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in resolved.items()}
    for dotted, legacy in added.items():
        section, _, key = dotted.partition(".")
        node = out.get(section)
        if isinstance(node, dict) and key in node and _same(node[key], legacy):
            del node[key]
    return out


def _same(value: Any, legacy: Any) -> bool:
    if isinstance(value, (list, tuple)) and isinstance(legacy, (list, tuple)):
        return list(value) == list(legacy)
    return type(value) is type(legacy) and value == legacy


def run_id(labels: tuple[tuple[str, str], ...], digest: str) -> str:
    """``<axis=label_...>-<digest>`` with file-name-safe characters."""
    slug = "_".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in labels)
    slug = "".join(c if c.isalnum() or c in "=._-+" else "-" for c in slug)[:80]
    return f"{slug}-{digest}" if slug else digest


class LabelledRun:
    """Mixin of every task's run config: ``labels`` (grid axis -> value label, for tables; not hashed) and an id
    hashed from ``to_dict()``, the resolved config."""

    labels: tuple[tuple[str, str], ...]

    def check_world(self, world_size: int) -> None:
        """``ValueError`` when the run cannot train on ``world_size`` processes (a sharding layout of another size);
        called on every rank before any process group exists. Any world size by default."""

    def with_labels(self: _Run, labels: tuple[tuple[str, str], ...]) -> _Run:
        return dataclasses.replace(self, labels=labels)

    def identity(self) -> dict[str, Any]:
        """What the id hashes: the resolved config (a task may add the versions of keys whose behaviour changed)."""
        return self.to_dict()  # type: ignore[attr-defined]

    @property
    def digest(self) -> str:
        """sha256 of ``identity()``: what a checkpoint of this run is checked against."""
        return config_digest(self.identity())

    @property
    def hash(self) -> str:
        return self.digest[:10]

    @property
    def run_id(self) -> str:
        """``<readable labels>-<10 hex of sha256(resolved config)>``: stable across sessions and machines."""
        return run_id(self.labels, self.hash)

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)
