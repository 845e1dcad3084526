"""The run record: one ``RunRecord`` per finished run, an envelope every task shares around the task's own typed
``result``; its schema version, validation, and reading/writing ``runs/<run id>.json``.

A record is what a task's ``train`` returns for one run. The runner writes records and the report reads them, each
through its task (``core.tasks.read_record``), which gives ``RunRecord.from_json`` its result type
(``Task.result_type``: a frozen dataclass with ``CONFIG``/``TIME``/``SPEC`` class attributes naming the keys to check,
and optionally a ``check_json(record, source)`` classmethod for nested entries and value ranges). This module knows
no task. A record that passes is one every report of its task can read.

JSON layout (schema ``lnblocks.study.run/2``)::

    {"format": "lnblocks.study.run/2", "task": <task name>, "id": ..., "status": "finished" | "diverged",
     "labels": {grid axis: value label}, "config": {the resolved run config}, "result": {task's measurements},
     "time": {"wall_s", "cpu_s", ...}, "env": {"torch", "device", "threads", "host", "pid", ...}}

``env.resumed_from`` (when present): the steps of the checkpoints the run was resumed from; ``env.parallel`` (lm,
when present): the ``train.parallel`` layout it was sharded with (an execution key, not in ``config``).

Non-finite numbers are stored as ``null`` (JSON has no NaN). Every record passes through its task's
``upgrade_record`` (if any) before it is checked (``core.tasks.record_from_json``), so a task reads what older
versions of it wrote; records of schema ``lnblocks.study.run/1`` were written when the study had one task, the
default one (measurements at the top level), and are that task's to upgrade. A record that fails validation raises
``RecordError`` naming the file and the dotted key; the runner redoes such runs.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lnblocks.study.core.atomic import finite_or_null, write_json_atomic

SCHEMA = "lnblocks.study.run/2"
SCHEMA_V1 = "lnblocks.study.run/1"
STATUSES = ("finished", "diverged")
EXECUTION_ENV = ("host", "pid", "resumed_from")  # env fields that say how a run was executed, not what it computed

_NUM = (int, float)


class RecordError(ValueError):
    """A run record (or another file of a study folder) that cannot be used: ``str(err)`` names the file, the dotted
    key and what is wrong."""

    def __init__(self, source: str, key: str, detail: str) -> None:
        self.source, self.key, self.detail = source, key, detail
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key} {detail}" if key else f"{where}{detail}")


# ---- a small declarative checker -------------------------------------------------------------------------------


def _get(obj: Mapping[str, Any], dotted: str, source: str, prefix: str = "") -> Any:
    node: Any = obj
    done = [prefix.rstrip(".")] if prefix else []
    for part in dotted.split("."):
        if not isinstance(node, Mapping):
            raise RecordError(source, ".".join(done), f"must be a mapping, got {type(node).__name__}")
        if part not in node:
            raise RecordError(source, ".".join([*done, part]), "is missing")
        node = node[part]
        done.append(part)
    return node


def check_keys(obj: Mapping[str, Any], spec: Mapping[str, Any], source: str, prefix: str = "") -> None:
    """``spec``: dotted key -> allowed types (``type(None)`` for null), or ``"num?"`` / ``"num"`` / ``"num[]"``;
    ``RecordError`` naming ``source`` and the first key that is missing or of the wrong type."""
    for key, kind in spec.items():
        value = _get(obj, key, source, prefix)
        full = f"{prefix}{key}"
        if kind in ("num", "num?"):
            ok = (isinstance(value, _NUM) and not isinstance(value, bool)) or (value is None and kind == "num?")
            want = "a number" + (" or null" if kind == "num?" else "")
        elif kind == "num[]":
            ok = isinstance(value, list) and all(
                v is None or (isinstance(v, _NUM) and not isinstance(v, bool)) for v in value
            )
            want = "a list of numbers (null for non-finite)"
        else:
            ok = isinstance(value, kind) and not (isinstance(value, bool) and bool not in kind)
            want = " or ".join("null" if t is type(None) else t.__name__ for t in kind)
        if not ok:
            raise RecordError(source, full, f"must be {want}, got {type(value).__name__} {_short(value)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


ENVELOPE: dict[str, Any] = {"task": (str,), "id": (str,), "status": (str,), "labels": (dict,), "config": (dict,),
                            "result": (dict,), "time": (dict,), "env": (dict,)}  # fmt: skip


def check_envelope(obj: Mapping[str, Any], source: str) -> None:
    """``RecordError`` unless ``obj`` has every key of the envelope, of its type, and a known ``status``."""
    check_keys(obj, ENVELOPE, source)
    if obj["status"] not in STATUSES:
        raise RecordError(source, "status", f"must be one of {list(STATUSES)}, got {obj['status']!r}")


# ---- the record ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunRecord:
    """One finished run: identity (``id``, ``task``, ``labels``), the resolved ``config``, ``status``, the task's
    typed ``result``, and ``time`` / ``env`` (the only fields that may differ between two executions of a run)."""

    id: str
    task: str
    status: str
    labels: dict[str, str]
    config: dict[str, Any]
    result: Any  # the task's result_type
    time: dict[str, Any]
    env: dict[str, Any]
    format: str = SCHEMA

    def __post_init__(self) -> None:
        if not dataclasses.is_dataclass(self.result) or isinstance(self.result, type):
            raise RecordError("", "result", f"must be a task's result dataclass, got {type(self.result).__name__}")
        if self.status not in STATUSES:
            raise RecordError("", "status", f"must be one of {list(STATUSES)}, got {self.status!r}")

    def to_json(self) -> dict[str, Any]:
        """The JSON form (non-finite numbers as null)."""
        out = {
            "format": SCHEMA,
            "task": self.task,
            "id": self.id,
            "status": self.status,
            "labels": dict(self.labels),
            "config": self.config,
            "result": dataclasses.asdict(self.result),
            "time": self.time,
            "env": self.env,
        }
        return finite_or_null(out)

    def deterministic_json(self) -> dict[str, Any]:
        """``to_json`` without ``time`` and the host, pid and ``resumed_from`` of ``env``: what must not depend on
        scheduling, nor on whether the run was interrupted and resumed from a checkpoint."""
        out = self.to_json()
        out.pop("time")
        out["env"] = {k: v for k, v in out["env"].items() if k not in EXECUTION_ENV}
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], source: str = "", *, result_type: type) -> RunRecord:
        """Validate a record's JSON object (as its task's ``upgrade_record`` left it) and build it, its ``result`` a
        ``result_type``; ``RecordError`` names ``source`` and the first bad key. A record is read through its task:
        ``core.tasks.read_record`` / ``record_from_json``."""
        check_envelope(obj, source)
        kind = result_type
        check_keys(obj["config"], kind.CONFIG, source, "config.")
        check_keys(obj["time"], kind.TIME, source, "time.")
        check_keys(obj["result"], kind.SPEC, source, "result.")
        names = {f.name for f in dataclasses.fields(kind)}
        unknown = sorted(set(obj["result"]) - names)
        if unknown:
            raise RecordError(source, f"result.{unknown[0]}", f"is not a field of {kind.__name__}")
        if hasattr(kind, "check_json"):  # what the flat key specs cannot say (nested entries, value ranges)
            kind.check_json(obj, source)
        return cls(
            id=obj["id"],
            task=obj["task"],
            status=obj["status"],
            labels={str(k): str(v) for k, v in obj["labels"].items()},
            config=obj["config"],
            result=kind(**obj["result"]),
            time=obj["time"],
            env=obj["env"],
            format=obj.get("format", SCHEMA),
        )


# ---- files ---------------------------------------------------------------------------------------------------


def read_json(path: str | Path, what: str = "file") -> Any:
    """Parse a JSON file of a study folder; an unreadable, truncated or not UTF-8 file (one flipped byte) raises
    ``RecordError`` naming it."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise RecordError(str(path), "", f"cannot be read ({err.strerror or err})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RecordError(
            str(path), "", f"is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}): a corrupt {what}"
        ) from None
    if not text.strip():
        raise RecordError(str(path), "", f"is empty (a {what} cut short)")
    try:
        return json.loads(text)
    except ValueError as err:
        raise RecordError(str(path), "", f"is not valid JSON ({err}): a truncated or corrupt {what}") from None


def write_record(path: str | Path, record: RunRecord) -> None:
    """Write ``record`` to ``path`` atomically."""
    write_json_atomic(path, record.to_json())
