"""Bad input to the study, as a hostile user would give it: every case is
a clear one-line error naming the file and key, or the right result; never a silently different study."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lnblocks.cli import main as cli_main
from lnblocks.study import RunConfig, load_study, run_study, train_run
from lnblocks.study.lm.report.analysis import arch_of
from tests.study.study_helpers import write_study

ROOT = Path(__file__).resolve().parents[3]
TINY = (
    "data: {source: markov, vocab_size: 8, seq_len: 8, batch_size: 4, eval_batches: 1}\n"
    "model: {dim: 16, n_heads: 2, depth: 1}\n"
    "train: {steps: 4}\n"
    "diagnostics: {every: 2, init_grad_batches: 1, probe_batch_size: 2}\n"
)


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lnblocks.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


# ---- YAML that is not a study --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[]\n", r"bad\.yaml: a study config must be a mapping of sections .*got a list \[\]"),
        ("0\n", r"bad\.yaml: a study config must be a mapping .*got a int 0"),
        ("false\n", r"bad\.yaml: a study config must be a mapping .*got a bool False"),
        ("", r"bad\.yaml: the file is empty"),
        ("# only a comment\n", r"bad\.yaml: the file is empty"),
        ("grid: []\n", r"bad\.yaml: grid must be a mapping of axes"),
        ("grid: {}\nmodel: 3\n", r"bad\.yaml: model must be a mapping of options, got int 3"),
        ("model: {depth: 2}\nmodel: {dim: 16}\n", r"bad\.yaml:2: duplicate key 'model' \(first given at line 1\)"),
        ("train: {lr: 1.0e-3, lr: 3.0e-3}\n", r"bad\.yaml:1: duplicate key 'lr'"),
        ("model: [depth: 2\n", r"bad\.yaml: not valid YAML"),
    ],
)
def test_yaml_that_is_not_a_study_is_refused(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        load_study(write_study(tmp_path, "bad.yaml", text))


def test_exponent_floats_are_floats_not_strings(tmp_path: Path) -> None:
    s = load_study(write_study(tmp_path, "f.yaml", "train: {lr: 3e-3, steps: 10}\ngrid: {train.lr: [1e-3, 1E-2]}\n"))
    assert [r.train.lr for r in s.runs()] == [1e-3, 1e-2] and s.base.train.lr == 3e-3
    with pytest.raises(TypeError, match=r"train\.lr must be a number, got str '1e-3'"):
        RunConfig.from_dict({"train": {"lr": "1e-3"}})  # configs do not coerce strings


# ---- grid labels, inherited axes -----------------------------------------------------------------------


def test_dict_values_get_labels_that_tell_them_apart(tmp_path: Path) -> None:
    text = TINY + "grid: {model.norm: [{kind: dyt, alpha_init: 0.5}, {kind: dyt, alpha_init: 5.0}, rmsnorm]}\n"
    runs = load_study(write_study(tmp_path, "c.yaml", text)).runs()
    labels = [r.label_dict["model.norm"] for r in runs]
    assert labels == ["dyt(alpha_init=0.5)", "dyt(alpha_init=5)", "rmsnorm"]
    archs = {arch_of(train_run(r, show_progress=False)) for r in runs[:2]}
    assert len(archs) == 2  # the report groups them apart instead of averaging them as seeds


def test_float_values_with_the_same_short_label_get_full_labels(tmp_path: Path) -> None:
    runs = load_study(write_study(tmp_path, "g.yaml", TINY + "grid: {train.lr: [1.0e-3, 1.0000001e-3]}\n")).runs()
    assert [r.label_dict["train.lr"] for r in runs] == ["0.001", "0.0010000001"]


def test_a_value_an_inherited_grid_axis_overrides_is_refused(tmp_path: Path) -> None:
    base = TINY.replace("train: {steps: 4}", "train: {steps: 4, lr: 1.0e-3}")
    write_study(tmp_path, "base.yaml", base + "grid: {train.lr: [1.0e-3, 3.0e-3]}\n")
    child = write_study(tmp_path, "child.yaml", "extends: base.yaml\ntrain: {lr: 1.0e-2}\n")
    with pytest.raises(ValueError, match=r"child\.yaml: sets train\.lr, but the grid axis 'train\.lr' inherited from "):
        load_study(child)
    ok = write_study(tmp_path, "ok.yaml", "extends: base.yaml\ntrain: {lr: 1.0e-2}\ngrid: {train.lr: null}\n")
    assert [r.train.lr for r in load_study(ok).runs()] == [1e-2]
    redefined = write_study(
        tmp_path, "re.yaml", "extends: base.yaml\ntrain: {lr: 1.0e-2}\ngrid: {train.lr: [1.0e-2]}\n"
    )
    assert [r.train.lr for r in load_study(redefined).runs()] == [1e-2]
    named = write_study(tmp_path, "n.yaml", "extends: base.yaml\ngrid: {v: {a: {model.depth: 2}}}\n")
    load_study(named)  # an axis over another key: fine
    write_study(tmp_path, "b2.yaml", TINY + "grid: {v: {a: {model.placement: post}, b: {model.placement: pre}}}\n")
    with pytest.raises(ValueError, match=r"sets model\.placement, but the grid axis 'v'"):
        load_study(write_study(tmp_path, "c2.yaml", "extends: b2.yaml\nmodel: {placement: sandwich}\n"))


# ---- divergence is a result ----------------------------------------------------------------------------


def test_diverging_run_with_diagnostics_every_step_is_recorded(tmp_path: Path) -> None:
    text = TINY.replace("every: 2", "every: 1").replace("train: {steps: 4}", "train: {steps: 8, lr: 1.0e+3, "
                                                         "optimizer: {name: sgd}}")  # fmt: skip
    cfg = write_study(tmp_path, "d.yaml", text + "grid: {model.placement: [pre]}\n")
    out = tmp_path / "out"
    assert cli_main(["study", "run", str(cfg), "--out", str(out)]) == 0
    rec = json.loads(next((out / "runs").glob("*.json")).read_text())
    res = rec["result"]
    assert rec["status"] == "diverged" and res["diverged_reason"] == "non-finite loss"
    step = res["diverged_step"]
    assert res["steps_done"] == step + 1 == len(res["loss"]) and res["loss"][-1] is None
    assert [d["step"] for d in res["diagnostics"]] == list(range(step + 1))  # nothing after the divergence
    assert "div" in (out / "report.md").read_text()


def test_short_exploding_run_is_diverged_not_finished() -> None:
    """``steps <= divergence_patience``: the patience rule cannot fire, but an eval loss far above its start can."""
    base = {"data": {"source": "markov", "vocab_size": 16, "seq_len": 16, "batch_size": 8, "eval_batches": 1},
            "model": {"depth": 2, "dim": 32}, "diagnostics": {"every": 0, "init_grad_batches": 0}}  # fmt: skip
    rec = train_run(RunConfig.from_dict({**base, "train": {"steps": 5, "lr": 10.0, "optimizer": {"name": "sgd"}}}),
                    show_progress=False)  # fmt: skip
    r = rec.result
    assert rec.status == "diverged" and r.diverged_step == 1 and r.eval["final"] is None
    assert r.diverged_reason.startswith("final eval loss") and r.loss[-1] > 1e3 * r.loss[0]
    calm = train_run(RunConfig.from_dict({**base, "train": {"steps": 5, "lr": 1e-3}}), show_progress=False)
    assert calm.status == "finished"


# ---- losses read every log_every steps ----------------------------------------------------------------


@pytest.mark.parametrize("lr", [3e-3, 1e3])
def test_log_every_does_not_change_the_record(lr: float) -> None:
    base = {"data": {"source": "markov", "vocab_size": 16, "seq_len": 16, "batch_size": 8, "eval_batches": 1},
            "model": {"depth": 2, "dim": 32}, "diagnostics": {"every": 3, "init_grad_batches": 0}}  # fmt: skip
    recs = [
        train_run(RunConfig.from_dict({**base, "train": {"steps": 12, "lr": lr, "log_every": k,
                                                         "optimizer": {"name": "sgd"}}}), show_progress=False)
        for k in (1, 5, 100)
    ]  # fmt: skip
    results = [r.to_json()["result"] for r in recs]  # JSON form: NaN diagnostics are null, so they compare equal
    assert results[0] == results[1] == results[2]
    assert recs[0].status == ("finished" if lr < 1 else "diverged")


# ---- seeds, CLI errors --------------------------------------------------------------------------------


def test_huge_seed_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"train\.seed must be in \[0, 2\*\*62\]"):
        RunConfig.from_dict({"train": {"seed": 2**70}})
    with pytest.raises(ValueError, match=r"data\.data_seed must be in \[0, 2\*\*62\]"):
        RunConfig.from_dict({"data": {"data_seed": 2**64}})
    cfg = write_study(tmp_path, "s.yaml", TINY + "grid: {train.seed: [0, 1180591620717411303424]}\n")
    proc = cli("study", "run", str(cfg), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "s.yaml: grid point (train.seed=1180591620717411303424): train.seed must be in [0, 2**62]" in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["study", "run", "missing.yaml", "--out", "o"], "study config '{tmp}/missing.yaml' not found"),
        (["study", "run", "bad.yaml", "--out", "o"], "{tmp}/bad.yaml: model.depht is not a config key"),
        (["study", "report", "nowhere"], "nowhere is not a study output folder"),
        (["patch-check", "."], "is not a local HF model folder"),
    ],
)
def test_cli_user_errors_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    write_study(tmp_path, "bad.yaml", "model: {depht: 3}\n")
    proc = cli(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert message.format(tmp=tmp_path.resolve()) in proc.stderr


def test_debug_flag_and_env_show_the_traceback(tmp_path: Path) -> None:
    write_study(tmp_path, "bad.yaml", "model: {depht: 3}\n")
    for args, env in (
        (["--debug", "study", "run", "bad.yaml", "--out", "o"], None),
        (["study", "run", "bad.yaml", "--out", "o", "--debug"], None),
        (["study", "run", "bad.yaml", "--out", "o"], {**os.environ, "LNBLOCKS_DEBUG": "1"}),
    ):
        proc = cli(*args, env=env, cwd=tmp_path)
        assert proc.returncode != 0 and "Traceback (most recent call last)" in proc.stderr
        assert "ConfigValueError: " in proc.stderr


def test_bad_workers_value(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="workers must be an int >= 1"):
        run_study(ROOT / "configs" / "tiny.yaml", tmp_path, workers=0)
    proc = cli("study", "run", "x.yaml", "--out", "o", "--workers", "0")
    assert proc.returncode == 2 and "--workers: must be an int >= 1, got 0" in proc.stderr


# ---- a plain install without the extras ---------------------------------------------------------------

BLOCKER = """
import importlib.abc, sys
HIDDEN = {"yaml", "numpy", "matplotlib", "tqdm", "sklearn", "transformers", "scipy", "pandas"}
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Hide())
"""


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["study", "run", "{root}/configs/tiny.yaml", "--out", "o"], "study"),
        (["study", "report", "{fixture}"], "study"),
        (["demo"], "study"),
        (["patch-check", "{fixture}"], "hf"),
    ],
)
def test_every_command_names_the_missing_extra(tmp_path: Path, args: list[str], extra: str) -> None:
    """``pip install .`` without extras: the optional packages are hidden by a meta-path finder in a
    sitecustomize on PYTHONPATH; each command says in one line which extra to install and exits non-zero."""
    write_study(tmp_path, "sitecustomize.py", BLOCKER)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "bert"}')
    fixture = tmp_path / "records_v1"  # a copy: the command must not write into the repository's fixture
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "records_v1", fixture)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "PYTHONWARNINGS": "ignore"}
    fmt = {"root": str(ROOT), "fixture": str(fixture if args[0] == "study" else tmp_path / "model")}
    proc = cli(*(a.format(**fmt) for a in args), env=env, cwd=tmp_path)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"pip install 'lnblocks[{extra}]'" in lines[0]
