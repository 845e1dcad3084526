"""The run record: one typed ``RunRecord`` per finished run, its schema version, validation, atomic read/write.

A record is what a task returns for one run and what ``runs/<run id>.json`` holds. The runner writes records and the
report reads them; both import this module, which imports nothing from the rest of the study (no torch either).

JSON layout (schema ``lnblocks.study.run/2``)::

    {"format": "lnblocks.study.run/2", "task": "lm", "id": ..., "status": "finished" | "diverged",
     "labels": {grid axis: value label}, "config": {the resolved run config}, "result": {task's measurements},
     "time": {"wall_s", "cpu_s", ...}, "env": {"torch", "device", "threads", "host", "pid", ...}}

Non-finite numbers are stored as ``null`` (JSON has no NaN). Records of schema ``lnblocks.study.run/1`` (written by
lnblocks before the typed record: the language-model task's measurements at the top level) load as ``task: "lm"``.
A record that fails validation raises ``RecordError`` naming the file and the dotted key; the runner redoes such runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

SCHEMA = "lnblocks.study.run/2"
LEGACY_SCHEMAS = ("lnblocks.study.run/1",)
STATUSES = ("finished", "diverged")
TMP_MARK = ".tmp-"

_NUM = (int, float)


class RecordError(ValueError):
    """A run record that cannot be used: ``str(err)`` names the file, the dotted key and what is wrong."""

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


def _check(obj: Mapping[str, Any], spec: Mapping[str, tuple[type, ...] | str], source: str, prefix: str = "") -> None:
    """``spec``: dotted key -> allowed types (``type(None)`` for null), or ``"num?"`` / ``"num"`` / ``"num[]"``."""
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


# ---- task results --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LMResult:
    """The language-model placement study's measurements of one run (see ``lnblocks.study.train``).

    ``loss``: training loss per step; ``eval``: held-out loss ``init``, ``final`` (null when diverged) and
    ``curve`` ``[[step, loss], ...]``; ``reference``: ``uniform`` (ln V), ``unigram`` (the context-free plateau) and,
    for the Markov source, ``floor``; ``diagnostics``: one dict per logged step; ``init_grad``: Xiong et al.'s
    expected gradient at init (or null); ``diverged_reason``: why a diverged run stopped; ``layer_ablation``: the
    final eval loss ``base`` and, per layer, the eval loss with that block skipped (``skip``), or null.
    """

    TASK: ClassVar[str] = "lm"
    # config keys the report reads: checked when a record is loaded
    CONFIG: ClassVar[dict[str, Any]] = {
        "data.source": (str,), "data.seq_len": (int,), "data.batch_size": (int,),
        "model.placement": (str,), "model.depth": (int,), "model.dim": (int,), "model.norm.kind": (str,),
        "train.lr": "num", "train.warmup": (int,), "train.schedule": (str,), "train.seed": (int,),
        "train.steps": (int,),
    }  # fmt: skip
    TIME: ClassVar[dict[str, Any]] = {"wall_s": "num", "cpu_s": "num", "step_ms": "num"}
    SPEC: ClassVar[dict[str, Any]] = {
        "reference.uniform": "num", "reference.unigram": "num", "model": (dict,), "steps_done": (int,),
        "diverged_step": (int, type(None)), "initial_loss": "num?", "final_train_loss": "num?",
        "eval.init": "num?", "eval.final": "num?", "eval.curve": (list,), "loss": "num[]", "diagnostics": (list,),
    }  # fmt: skip

    reference: dict[str, float]
    model: dict[str, Any]
    steps_done: int
    diverged_step: int | None
    initial_loss: float | None
    final_train_loss: float | None
    eval: dict[str, Any]
    loss: list[float | None]
    diagnostics: list[dict[str, Any]] = field(default_factory=list)
    init_grad: dict[str, Any] | None = None
    diverged_reason: str | None = None
    layer_ablation: dict[str, Any] | None = None


@dataclass(frozen=True)
class DigitsResult:
    """The CNN small-batch study's measurements of one run (see ``lnblocks.study.digits``): the learning rate used,
    epochs and SGD steps, the mean train-mode loss of the last epoch, and eval-mode accuracies in percent.
    ``switch_weights`` (SwitchableNorm arm): per layer, the learned ``{"mean"|"var": {"in"|"ln"|"bn": weight}}`` at
    the end of training; ``agc_grad_ratio`` (NF arm): mean over steps of the blocks' gradient norm after AGC over
    before it (1.0: AGC never clipped). Both null for the other arms and absent from older records."""

    TASK: ClassVar[str] = "cnn_digits"
    CONFIG: ClassVar[dict[str, Any]] = {"norm": (str,), "batch_size": (int,), "seed": (int,)}
    TIME: ClassVar[dict[str, Any]] = {"wall_s": "num", "cpu_s": "num"}
    SPEC: ClassVar[dict[str, Any]] = {
        "lr": "num", "epochs": (int,), "steps": (int,), "final_train_loss": "num?", "train_acc": "num",
        "test_acc": "num",
    }  # fmt: skip

    lr: float
    epochs: int
    steps: int
    final_train_loss: float | None
    train_acc: float
    test_acc: float
    switch_weights: list[dict[str, dict[str, float]]] | None = None
    agc_grad_ratio: float | None = None


RESULTS: dict[str, type] = {"lm": LMResult, "cnn_digits": DigitsResult}


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
    result: Any  # LMResult | DigitsResult
    time: dict[str, Any]
    env: dict[str, Any]
    format: str = SCHEMA

    def __post_init__(self) -> None:
        if self.task not in RESULTS:
            raise RecordError("", "task", f"must be one of {list(RESULTS)}, got {self.task!r}")
        if not isinstance(self.result, RESULTS[self.task]):
            raise RecordError("", "result", f"must be a {RESULTS[self.task].__name__} for task {self.task!r}")
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
        """``to_json`` without ``time`` and the host/pid of ``env``: what must not depend on scheduling."""
        out = self.to_json()
        out.pop("time")
        out["env"] = {k: v for k, v in out["env"].items() if k not in ("host", "pid")}
        return out

    @classmethod
    def from_json(cls, obj: Any, source: str = "") -> RunRecord:
        """Validate and build; ``RecordError`` names ``source`` and the first bad key. Schema-1 records load too."""
        if not isinstance(obj, Mapping):
            raise RecordError(source, "", f"a run record must be a JSON object, got {type(obj).__name__}")
        fmt = obj.get("format")
        if fmt in LEGACY_SCHEMAS:
            obj = _upgrade_v1(obj, source)
        elif fmt != SCHEMA:
            raise RecordError(
                source, "format", f"must be {SCHEMA!r} (or the older {list(LEGACY_SCHEMAS)}), got {fmt!r}"
            )
        _check(obj, {"task": (str,), "id": (str,), "status": (str,), "labels": (dict,), "config": (dict,),
                     "result": (dict,), "time": (dict,), "env": (dict,)}, source)  # fmt: skip
        task = obj["task"]
        if task not in RESULTS:
            raise RecordError(source, "task", f"must be one of {list(RESULTS)}, got {task!r}")
        if obj["status"] not in STATUSES:
            raise RecordError(source, "status", f"must be one of {list(STATUSES)}, got {obj['status']!r}")
        kind = RESULTS[task]
        _check(obj["config"], kind.CONFIG, source, "config.")
        _check(obj["time"], kind.TIME, source, "time.")
        _check(obj["result"], kind.SPEC, source, "result.")
        names = {f.name for f in dataclasses.fields(kind)}
        unknown = sorted(set(obj["result"]) - names)
        if unknown:
            raise RecordError(source, f"result.{unknown[0]}", f"is not a field of {kind.__name__}")
        return cls(
            id=obj["id"],
            task=task,
            status=obj["status"],
            labels={str(k): str(v) for k, v in obj["labels"].items()},
            config=obj["config"],
            result=kind(**obj["result"]),
            time=obj["time"],
            env=obj["env"],
            format=fmt,
        )


_V1_RESULT_KEYS = (
    "reference", "model", "steps_done", "diverged_step", "initial_loss", "final_train_loss", "eval", "loss",
    "diagnostics", "init_grad",
)  # fmt: skip


def _upgrade_v1(obj: Mapping[str, Any], source: str) -> dict[str, Any]:
    """A schema-1 record (language-model measurements at the top level) in the schema-2 layout."""
    for key in ("id", "status", "labels", "config", "time", "env", *_V1_RESULT_KEYS[:-1]):
        if key not in obj:  # every key but init_grad was always written
            raise RecordError(source, key, f"is missing (a record of schema {obj['format']!r})")
    out = {k: obj[k] for k in ("id", "status", "labels", "config", "time", "env")}
    out["task"] = "lm"
    out["result"] = {k: obj[k] for k in _V1_RESULT_KEYS if k in obj}
    return out


# ---- JSON files ----------------------------------------------------------------------------------------------


def finite_or_null(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None (recursively through dicts, lists and tuples)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as strict JSON to ``path`` atomically: a reader sees the old file or the complete new one."""
    path = Path(path)
    text = json.dumps(obj, indent=1, allow_nan=False)  # fails before anything is written
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str | Path, what: str = "file") -> Any:
    """Parse a JSON file; an unreadable or truncated file raises ``RecordError`` naming it."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise RecordError(str(path), "", f"cannot be read ({err.strerror or err})") from None
    if not text.strip():
        raise RecordError(str(path), "", f"is empty (a {what} cut short)")
    try:
        return json.loads(text)
    except ValueError as err:
        raise RecordError(str(path), "", f"is not valid JSON ({err}): a truncated or corrupt {what}") from None


def write_record(path: str | Path, record: RunRecord) -> None:
    """Write ``record`` to ``path`` atomically."""
    write_json_atomic(path, record.to_json())


def read_record(path: str | Path) -> RunRecord:
    """Load and validate the record at ``path``; ``RecordError`` (naming the file and key) if it is unusable."""
    return RunRecord.from_json(read_json(path, "run record"), source=str(path))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_tmp(folder: str | Path) -> list[Path]:
    """Delete temp files left by processes that no longer run (a killed run); return what was removed."""
    removed = []
    for p in Path(folder).glob(f".*{TMP_MARK}*"):
        pid = p.name.rpartition(TMP_MARK)[2]
        if not pid.isdigit() or not _pid_alive(int(pid)) or int(pid) == os.getpid():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed
