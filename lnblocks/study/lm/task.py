"""The ``lm`` task, the language-model norm-placement study (Xiong et al. 2020 at CPU scale): study file ->
``RunConfig``s -> ``train_run`` -> report.

A study file of this task has the run sections ``data``, ``model``, ``train``, ``diagnostics`` (the fields of its run
type, ``lnblocks.study.lm.config.RunConfig``), an ``analysis`` section for the report (``AnalysisConfig``), and a
``grid`` over dotted keys of the sections: the core reads it (``lnblocks.study.core.study_config.read_sections``).
Its runs train with DDP under ``torchrun``, log curves (``lm.curves``) and tokenize a corpus once before any run.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from lnblocks.study.core.records import RunRecord
from lnblocks.study.core.tasks import Task
from lnblocks.study.lm.config import BUILTIN_SOURCES, PATH_KEYS, AnalysisConfig, RunConfig
from lnblocks.study.lm.report.analysis import check_arm_labels
from lnblocks.study.lm.report.build import build_lm_report
from lnblocks.study.lm.result import LMResult, upgrade_record
from lnblocks.study.lm.run.curves import replay
from lnblocks.study.lm.run.train import train


def check_grid(runs: list[RunConfig]) -> None:
    """Refuse a grid whose arms the report cannot tell apart (``lm.report.analysis.check_arm_labels``)."""
    check_arm_labels([r.label_dict for r in runs])


def resolve_runs(runs: list[RunConfig], show_progress: bool = False) -> list[RunConfig]:
    """The runs with what they train on fixed: each corpus run gets its prepared corpus's digest (``data.corpus``,
    part of its id), so a changed corpus makes new runs instead of mixing with the old records."""
    from lnblocks.study.lm.data.corpus import corpus_digest

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
    A corpus too short for a run's ``seq_len`` (or otherwise unfit: ``lm.data.corpus.verify``) fails here."""
    from lnblocks.study.lm.data.corpus import prepare_corpus

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
    run_type=RunConfig,
    analysis_type=AnalysisConfig,
    check_grid=check_grid,
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
