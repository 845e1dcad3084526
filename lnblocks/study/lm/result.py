"""What one ``lm`` run measured: ``LMResult``, the ``result`` of its ``RunRecord``; and how records that older
lnblocks wrote are read (``upgrade_record``): schema 1 (these measurements at the top level) in the schema-2 layout,
and the config keys those versions used, ``model.qkv_init_gain`` and ``train.amp_dtype``, as today's ``qkv_init``
and ``dtype`` (the config classes themselves accept only today's keys)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from lnblocks.study.core.records import SCHEMA_V1, RecordError, check_keys


@dataclass(frozen=True)
class LMResult:
    """The measurements of one run (see ``lnblocks.study.lm.run.train``).

    ``loss``: training loss per step; ``eval``: held-out loss ``init``, ``final`` (null when diverged) and
    ``curve`` ``[[step, loss], ...]``; ``reference``: ``uniform`` (ln V), ``unigram`` (the context-free plateau) and,
    for the Markov source, ``floor``; ``diagnostics``: one dict per logged step; ``init_grad``: Xiong et al.'s
    expected gradient at init (or null); ``diverged_reason``: why a diverged run stopped; ``layer_ablation``: the
    final eval loss ``base`` and, per layer, the eval loss with that block skipped (``skip``), or null.
    ``grad_norm``: the global gradient norm per step (before clipping); ``stability``: spike scores of the loss and
    the gradient norm, the largest Adam update RMS and the share of norm inputs with variance under eps
    (``lnblocks.study.lm.run.stability.summary``); ``corpus``: for a corpus source, its digest and a summary
    (``CorpusSummary.record``). These three are null in records older lnblocks wrote. ``train_eval``: the final
    eval-mode loss on fixed windows of the training split (``eval.final`` minus it is the train-val gap), null when
    diverged and in older records. Diagnostics entries written since hold ``residual_median`` and ``attn_sink`` (the
    first-token attention mass per layer) and, with hyper-connections, ``mixing_gain``.
    """

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
    grad_norm: list[float | None] | None = None
    stability: dict[str, Any] | None = None
    corpus: dict[str, Any] | None = None
    train_eval: float | None = None

    # keys of one diagnostics entry (what train_run logs at a diagnostic step); attn_* only with attention probes
    DIAGNOSTICS: ClassVar[dict[str, Any]] = {
        "step": (int,), "lr": "num?", "residual_rms": "num[]", "residual_max": "num[]", "grad_norm": (dict,),
        "grad_norm_total": "num?", "update_ratio": (dict,), "max_output_logit": "num?", "log_z": "num?",
    }  # fmt: skip

    @classmethod
    def check_json(cls, record: Mapping[str, Any], source: str) -> None:
        """What ``SPEC`` cannot say: every diagnostics entry, eval point, init gradient and ablation has the
        keys and types the report and the curves read, and the numbers the report takes logs or exponents of are
        in range; ``RecordError`` naming ``source`` and the key otherwise."""
        result, config = record["result"], record["config"]
        for key, ok, want in (
            ("config.train.lr", 0 < config["train"]["lr"] < math.inf, "a finite number > 0"),
            ("config.model.depth", config["model"]["depth"] >= 1, "an int >= 1"),
            ("config.train.steps", config["train"]["steps"] >= 1, "an int >= 1"),
            ("result.reference.uniform", 0 < result["reference"]["uniform"] <= 64 * math.log(2), "ln V, in (0, 44.4]"),
            ("result.reference.unigram", math.isfinite(result["reference"]["unigram"]), "a finite number"),
        ):
            if not ok:
                raise RecordError(source, key, f"must be {want}")
        if "floor" in result["reference"]:
            check_keys(result["reference"], {"floor": "num?"}, source, "result.reference.")
        for i, point in enumerate(result["eval"]["curve"]):
            if not (isinstance(point, list) and len(point) == 2 and _is_int(point[0]) and _num_or_none(point[1])):
                raise RecordError(source, f"result.eval.curve[{i}]", f"must be [step, loss], got {point!r:.60}")
        for i, entry in enumerate(result["diagnostics"]):
            where = f"result.diagnostics[{i}]"
            if not isinstance(entry, dict):
                raise RecordError(source, where, f"must be a mapping, got {type(entry).__name__}")
            check_keys(entry, cls.DIAGNOSTICS, source, where + ".")
            if entry["step"] < 0 or not entry["residual_rms"]:
                raise RecordError(source, where, "must have a step >= 0 and a non-empty residual_rms")
            optional = {k: "num[]" for k in ("attn_max_logit", "attn_entropy", "attn_sink", "residual_median")}
            check_keys(entry, {k: v for k, v in optional.items() if k in entry}, source, where + ".")
            check_keys(entry, {"mixing_gain": "num?"} if "mixing_gain" in entry else {}, source, where + ".")
            for key in ("grad_norm", "update_ratio", "update_rms"):
                if key in entry:
                    _check_groups(entry[key], source, f"{where}.{key}")
            check_keys(entry, {"var_below_eps": "num[]"} if "var_below_eps" in entry else {}, source, where + ".")
        grad = result.get("init_grad")
        if grad is not None:
            if not isinstance(grad, dict) or not isinstance(grad.get("expected"), dict):
                raise RecordError(source, "result.init_grad", "must be null or a mapping with 'expected'")
            for key in ("expected", "per_batch"):
                _check_groups(grad.get(key, {}), source, f"result.init_grad.{key}")
        ablation = result.get("layer_ablation")
        if ablation is not None:
            if not isinstance(ablation, dict):
                raise RecordError(source, "result.layer_ablation", "must be null or a mapping")
            check_keys(ablation, {"base": "num?", "skip": "num[]"}, source, "result.layer_ablation.")
        if not isinstance(result.get("diverged_reason"), (str, type(None))):
            raise RecordError(source, "result.diverged_reason", "must be a string or null")
        _check_long_run_fields(result, source)


def _check_long_run_fields(result: Mapping[str, Any], source: str) -> None:
    """The fields added with stability monitoring and corpus digests (null in older records), as the report, the
    curves and the init profile read them."""
    if result.get("grad_norm") is not None:
        check_keys(result, {"grad_norm": "num[]"}, source, "result.")
        if len(result["grad_norm"]) != len(result["loss"]):
            raise RecordError(source, "result.grad_norm", "must have one value per step of result.loss")
    stability = result.get("stability")
    if stability is not None:
        if not isinstance(stability, dict):
            raise RecordError(source, "result.stability", "must be null or a mapping")
        spec = {"max_update_rms": "num?", "var_below_eps": "num?"}
        for series in ("loss", "grad_norm"):
            spec |= {f"{series}.score": "num?", f"{series}.spikes": "num[]", f"{series}.scored": (int,)}
        check_keys(stability, spec, source, "result.stability.")
    corpus = result.get("corpus")
    if corpus is not None:
        if not isinstance(corpus, dict):
            raise RecordError(source, "result.corpus", "must be null or a mapping")
        spec = {"digest": (str,), "train_path": (str,), "val_path": (str,), "token_dtype": (str,), "vocab_size": (int,)}
        check_keys(corpus, spec, source, "result.corpus.")
    if result.get("train_eval") is not None:
        check_keys(result, {"train_eval": "num?"}, source, "result.")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num_or_none(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _check_groups(groups: Any, source: str, where: str) -> None:
    """``{group: [number or null per layer]}`` (gradient norms, update ratios by weight group)."""
    if not isinstance(groups, dict):
        raise RecordError(source, where, f"must be a mapping of weight groups, got {type(groups).__name__}")
    check_keys(groups, {str(k): "num[]" for k in groups}, source, where + ".")


_V1_RESULT_KEYS = (
    "reference", "model", "steps_done", "diverged_step", "initial_loss", "final_train_loss", "eval", "loss",
    "diagnostics", "init_grad",
)  # fmt: skip


def upgrade_record(obj: Mapping[str, Any], source: str) -> dict[str, Any]:
    """A record of this task as the current code reads it: schema 1 in the schema-2 layout (as task ``lm``), and
    the recorded config with the older keys renamed; ``RecordError`` naming ``source`` for values no version wrote."""
    out = _from_v1(obj, source) if obj.get("format") == SCHEMA_V1 else dict(obj)
    config = out.get("config")
    if isinstance(config, dict):
        out["config"] = _current_keys(config, source)
    return out


def _from_v1(obj: Mapping[str, Any], source: str) -> dict[str, Any]:
    for key in ("id", "status", "labels", "config", "time", "env", *_V1_RESULT_KEYS[:-1]):
        if key not in obj:  # every key but init_grad was always written
            raise RecordError(source, key, f"is missing (a record of schema {SCHEMA_V1!r})")
    out = {k: obj[k] for k in ("format", "id", "status", "labels", "config", "time", "env")}
    out["task"] = "lm"
    out["result"] = {k: obj[k] for k in _V1_RESULT_KEYS if k in obj}
    return out


# (section, older key, current key, older value -> current value, the current key's default)
_RENAMED = (
    ("model", "qkv_init_gain", "qkv_init", {1.0: "per_matrix", 2**-0.5: "stacked"}, "per_matrix"),
    ("train", "amp_dtype", "dtype", {"float32": "fp32", "bfloat16": "bf16"}, "fp32"),
)


def _current_keys(config: dict[str, Any], source: str) -> dict[str, Any]:
    """``config`` with each older key replaced by the current one (an older key set to null is dropped)."""
    out = dict(config)
    for section, old, new, table, default in _RENAMED:
        if not isinstance(out.get(section), dict) or old not in out[section]:
            continue
        values = dict(out[section])
        value = values.pop(old)
        if value is not None:
            match = [v for k, v in table.items() if k == value or (isinstance(k, float) and _close(k, value))]
            if not match:
                raise RecordError(source, f"config.{section}.{old}", f"must be one of {list(table)}, got {value!r}")
            if values.get(new, default) not in (default, match[0]):
                raise RecordError(source, f"config.{section}.{old}", f"({value!r}) contradicts {new}={values[new]!r}")
            values[new] = match[0]
        out[section] = values
    return out


def _close(a: float, b: Any) -> bool:
    return isinstance(b, (int, float)) and not isinstance(b, bool) and math.isclose(a, b, rel_tol=1e-12)
