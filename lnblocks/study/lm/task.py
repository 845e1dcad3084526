"""The ``lm`` task, the language-model norm-placement study (Xiong et al. 2020 at CPU scale): study file ->
``RunConfig``s -> ``train_run`` -> report.

A study file of this task has the run sections ``data``, ``model``, ``train``, ``diagnostics`` (see
``lnblocks.study.lm.config``), an ``analysis`` section for the report, and a ``grid`` over dotted keys of the sections.
Its runs train with DDP under ``torchrun``, log curves (``lm.curves``) and tokenize a corpus once before any run.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from lnblocks.blocks.config import AttentionConfig, MLPConfig
from lnblocks.config import ConfigTypeError, ConfigValueError
from lnblocks.study.core.checkpoint import CheckpointConfig
from lnblocks.study.core.records import RunRecord
from lnblocks.study.core.study_config import StudyConfig, parse_axis, parse_extra_grids
from lnblocks.study.core.tasks import RunContext, Task
from lnblocks.study.lm.analysis import check_arm_labels
from lnblocks.study.lm.config import BUILTIN_SOURCES, PATH_KEYS, SECTIONS, AnalysisConfig, OptimizerConfig, RunConfig
from lnblocks.study.lm.curves import replay
from lnblocks.study.lm.report import build_lm_report
from lnblocks.study.lm.result import LMResult, upgrade_record

TOP_LEVEL_KEYS = (*SECTIONS, "analysis", "grid", "extra_grids")  # plus the study-wide tracking and resources
# third-level keys a grid may set: section.field.key
NESTED_KEYS: dict[tuple[str, str], Any] = {
    ("train", "optimizer"): OptimizerConfig,
    ("model", "attention"): AttentionConfig,
    ("model", "mlp"): MLPConfig,
    ("train", "checkpoint"): CheckpointConfig,
}


def check_key(key: str, where: str) -> None:
    """A dotted key that names an option of a run section; ``ValueError`` naming it and the valid keys otherwise."""
    parts = key.split(".")
    if parts[0] not in SECTIONS:
        raise ConfigValueError(key, f"is not a config key (in {where}); it must start with one of {list(SECTIONS)}")
    names = SECTIONS[parts[0]].field_names()
    if len(parts) < 2 or parts[1] not in names:
        raise ConfigValueError(key, f"is not a config key (in {where}); valid keys of {parts[0]!r}: {names}")
    nested = NESTED_KEYS.get((parts[0], parts[1]))
    if len(parts) == 3 and nested is not None:
        sub = [f for f in nested.__dataclass_fields__ if nested.__dataclass_fields__[f].init]
        if parts[2] not in sub:
            where_keys = f"valid keys of '{parts[0]}.{parts[1]}': {sub}"
            raise ConfigValueError(key, f"is not a config key (in {where}); {where_keys}")
        return
    if len(parts) != 2:
        raise ConfigValueError(key, f"is not a config key (in {where}): too many dots")


def make_run(tree: dict[str, Any], labels: tuple[tuple[str, str], ...]) -> RunConfig:
    return RunConfig.from_dict(tree).with_labels(labels)


def study_from_dict(raw: dict[str, Any], *, name: str, description: str = "", source: str = "") -> StudyConfig:
    """The ``StudyConfig`` of a merged study file of the ``lm`` task; every grid point is validated now."""
    unknown = sorted(str(k) for k in set(raw) - set(TOP_LEVEL_KEYS))
    if unknown:
        valid = ["name", "description", "task", "extends", *TOP_LEVEL_KEYS, "tracking", "resources"]
        raise ConfigValueError(unknown[0], f"is not a top-level key of an lm study file; valid: {valid}")
    base: dict[str, Any] = {}
    for section in SECTIONS:
        value = raw.get(section)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ConfigTypeError(section, f"must be a mapping of options, got {type(value).__name__} {value!r}")
        base[section] = value
    grid = raw.get("grid")
    if grid is None:
        grid = {}
    if not isinstance(grid, dict):
        got = f"{type(grid).__name__} {grid!r}"
        raise ConfigTypeError("grid", f"must be a mapping of axes (dotted key: [values]), got {got}")
    axes = tuple(parse_axis(k, v, check_key) for k, v in grid.items())
    study = StudyConfig(
        name=name,
        task="lm",
        options=base,
        make_run=make_run,
        check_key=check_key,
        axes=axes,
        analysis=AnalysisConfig.from_dict(raw.get("analysis"), key="analysis"),
        description=description,
        source=source,
        extra_grids=parse_extra_grids(raw.get("extra_grids"), axes, check_key),
    )
    runs = study.runs()  # every grid point must validate now, not halfway through a sweep
    check_arm_labels([r.label_dict for r in runs])
    return study


def train(run: RunConfig, ctx: RunContext) -> RunRecord:
    """One run (``lm.train.train_run``), its curves logged live under ``ctx.out_dir`` when ``ctx.tracking`` is on."""
    from lnblocks.study.core.tracking import open_tracker
    from lnblocks.study.lm.train import train_run

    options = {"dist": ctx.dist, "show_progress": ctx.show_progress, "position": ctx.position}
    if ctx.tracking is None or ctx.out_dir is None:
        return train_run(run, checkpoints=ctx.checkpoints, **options)
    with open_tracker(ctx.tracking, ctx.out_dir, run.run_id, run.to_dict()) as tracker:
        return train_run(run, checkpoints=ctx.checkpoints, tracker=tracker, **options)


def resolve_runs(runs: list[RunConfig], show_progress: bool = False) -> list[RunConfig]:
    """The runs with what they train on fixed: each corpus run gets its prepared corpus's digest (``data.corpus``,
    part of its id), so a changed corpus makes new runs instead of mixing with the old records."""
    from lnblocks.study.lm.corpus import corpus_digest

    out, digests = [], {}  # corpus -> digest, found once per call
    for run in runs:
        if run.data.source in BUILTIN_SOURCES:
            out.append(run)
            continue
        corpus = run.data.corpus_config()
        key = json.dumps(corpus.to_dict(), sort_keys=True)
        if key not in digests:
            digests[key] = corpus_digest(corpus, show_progress=show_progress)
        out.append(run.bind_corpus(digests[key]))
    return out


def before_runs(runs: list[RunConfig], show_progress: bool = False) -> list[str]:
    """Tokenize (or check) every distinct corpus the runs train on, once, before any run starts; one line each.
    A corpus too short for a run's ``seq_len`` (or otherwise unfit: ``lnblocks.study.lm.corpus.verify``) fails here."""
    from lnblocks.study.lm.corpus import prepare_corpus

    lines = [*_degenerate_mix_ln(runs)]
    corpora: dict[str, tuple[Any, int]] = {}  # corpus -> the longest seq_len a run reads from it
    for run in runs:
        if run.data.source not in BUILTIN_SOURCES:
            corpus = run.data.corpus_config()
            key = json.dumps(corpus.to_dict(), sort_keys=True)
            corpora[key] = (corpus, max(run.data.seq_len, corpora.get(key, (None, 0))[1]))
    for corpus, seq_len in corpora.values():
        s = prepare_corpus(corpus, show_progress=show_progress, seq_len=seq_len)
        for warning in s.warnings:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        lines.append(
            f"{s.describe().splitlines()[0]}; {s.train_tokens:,} train / {s.val_tokens:,} val tokens, "
            f"vocabulary {s.vocab_size:,}, unigram plateau {s.reference['unigram']:.4f} nats"
        )
    return lines


def _degenerate_mix_ln(runs: list[RunConfig]) -> list[str]:
    """A note per (depth, fraction) at which Mix-LN has one kind of layer only (``floor(fraction * depth)`` is 0 or
    the depth): those runs are plain Pre-LN (Post-LN), and claim M1 leaves that depth out."""
    seen = sorted({(r.model.depth, r.model.mix_post_fraction) for r in runs if r.model.placement == "mix_ln"})
    out = []
    for depth, fraction in seen:
        n = math.floor(fraction * depth)
        if not 0 < n < depth:
            kind = "Pre-LN" if n == 0 else "Post-LN"
            out.append(
                f"note: mix_ln at depth {depth} with mix_post_fraction {fraction:g} has {n} Post-LN layer(s) of "
                f"{depth} (floor({fraction:g} * {depth})): those runs are plain {kind}, and claim M1 leaves that "
                "depth out"
            )
    return out


def check_runs(runs: list[RunConfig]) -> None:
    """Refuse, before any run starts, runs that ask for a device this machine lacks (``train.device: cuda``)."""
    import torch

    cuda = sorted({r.run_id for r in runs if r.train.device == "cuda"})
    if cuda and not torch.cuda.is_available():
        raise ValueError(
            f"train.device is 'cuda' in {len(cuda)} run(s) (e.g. {cuda[0]}) but this machine has no CUDA device "
            "(torch.cuda.is_available() is False); use train.device: auto or cpu, or --executor ray on a cluster "
            "with GPUs"
        )


def outcome(record: RunRecord) -> str:
    r = record.result
    msg = f"diverged at step {r.diverged_step}" if record.status == "diverged" else f"eval loss {r.eval['final']:.3f}"
    return f"{record.id}: {msg} ({record.time['wall_s']:.0f} s)"


TASK = Task(
    name="lm",
    study_from_dict=study_from_dict,
    train=train,
    outcome=outcome,
    report=build_lm_report,
    result_type=LMResult,
    path_keys={**{f"data.{k}": ("bytes",) if k == "tokenizer" else () for k in PATH_KEYS}, "train.checkpoint.dir": ()},
    before_runs=before_runs,
    resolve_runs=resolve_runs,
    replay_curves=replay,
    check_runs=check_runs,
    ddp=True,
    upgrade_record=upgrade_record,
)
