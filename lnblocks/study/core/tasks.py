"""The kinds of experiment the runner knows: a ``Task`` turns a study file into run configs, one run config into a
``RunRecord``, and a folder of records into a report. Tasks load lazily (each imports torch and its own modules).

- ``lm``: the language-model norm-placement study (Xiong et al. 2020 at CPU scale; ``lnblocks.study.lm``);
- ``cnn_digits``: the CNN small-batch study on scikit-learn's digits (Wu & He 2018; ``lnblocks.study.digits``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lnblocks.config import ConfigValueError

_TASKS = {"lm": "lnblocks.study.lm", "cnn_digits": "lnblocks.study.digits"}


@dataclass(frozen=True)
class Task:
    """What the runner and the report need from one kind of experiment.

    ``study_from_dict(raw, name=, description=, source=)``: the ``StudyConfig`` of a merged study file;
    ``train(run, show_progress, position)``: one run's ``RunRecord`` (in whichever process trains it);
    ``outcome(record)``: a one-line summary; ``report(out, records, manifest, problems, plots, echo)``: write the
    report files from records alone and return an exit code. ``path_keys``: dotted option keys whose values are file
    paths (relative ones resolve against the study file's folder), each with the values that are not paths;
    ``prepare(runs, show_progress)``: make the runs' inputs ready before any run starts (tokenize a corpus once),
    returning one line per input.
    """

    name: str
    study_from_dict: Callable[..., Any]
    train: Callable[..., Any]
    outcome: Callable[[Any], str]
    report: Callable[..., int]
    path_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    prepare: Callable[..., list[str]] | None = None


def task_names() -> list[str]:
    return list(_TASKS)


def get_task(name: str) -> Task:
    """The task called ``name``; ``ValueError`` listing the valid names otherwise."""
    if name not in _TASKS:
        raise ConfigValueError("task", f"must be one of {list(_TASKS)}, got {name!r}")
    return importlib.import_module(_TASKS[name]).TASK
