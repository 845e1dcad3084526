"""``lnblocks study run CONFIG --set key=value``: dotted overrides read as YAML values, applied to
the study file before validation (so a file whose data paths do not exist here can be pointed elsewhere), a grid
axis shrunk by a list, errors that name the key in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lnblocks.cli import _overrides
from lnblocks.cli import main as cli_main
from lnblocks.config import ConfigValueError
from lnblocks.study import load_study
from lnblocks.study.core.studyfile import StudyFileError, parse_value

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "configs" / "tiny.yaml"


def test_values_are_read_as_in_a_study_file() -> None:
    got = _overrides(
        [
            "train.steps=2",
            "train.lr=1e-3",
            "model.bias=true",
            "train.grad_clip=null",
            "model.placement=[pre, post]",
            "train.optimizer={name: adam, beta2: 0.99}",
            "name=a=b",
        ]
    )
    assert got == {
        "train.steps": 2,
        "train.lr": 1e-3,
        "model.bias": True,
        "train.grad_clip": None,
        "model.placement": ["pre", "post"],
        "train.optimizer": {"name": "adam", "beta2": 0.99},
        "name": "a=b",
    }
    assert isinstance(got["train.lr"], float)  # YAML 1.2, as the study loader reads files
    with pytest.raises(ValueError, match=r"--set takes key=value"):
        _overrides(["train.steps"])
    with pytest.raises(ValueError, match=r"--set train\.steps is given twice"):
        _overrides(["train.steps=2", "train.steps=3"])
    with pytest.raises(StudyFileError, match=r"--set model\.placement: not a valid YAML value"):
        parse_value("[pre, post", where="--set model.placement")


def test_overrides_shrink_the_grid_and_change_options() -> None:
    full = load_study(TINY)
    assert len(full.runs()) == 8
    small = load_study(TINY, overrides={"model.depth": [2], "train.lr": 1.0e-2, "train.steps": 2, "model.dim": 16})
    runs = small.runs()
    assert len(runs) == 2 and {r.model.placement for r in runs} == {"pre", "post"}
    assert all(r.model.depth == 2 and r.train.lr == 1e-2 and r.train.steps == 2 and r.model.dim == 16 for r in runs)
    assert runs[0].label_dict == {"model.placement": "pre", "model.depth": "2", "train.lr": "0.01"}
    assert small.override({"model.placement": ["post"]}).runs()[0].model.placement == "post"


def test_a_named_axis_keeps_the_labels_given() -> None:
    study = load_study(
        ROOT / "configs" / "placements.yaml",
        overrides={"variant": ["pre", "dyt"], "model.depth": 3, "train.lr": 1.0e-3, "train.warmup": 0},
    )
    assert [r.label_dict["variant"] for r in study.runs()] == ["pre", "dyt"]
    with pytest.raises(ConfigValueError, match=r"grid\.variant has no value labelled 'dyx'; its labels: \['pre'"):
        load_study(ROOT / "configs" / "placements.yaml", overrides={"variant": ["dyx"]})
    with pytest.raises(ConfigValueError, match=r"model\.placement is set by the grid axis 'variant' in every run"):
        load_study(ROOT / "configs" / "placements.yaml", overrides={"model.placement": "post"})


def test_overrides_apply_before_validation_and_paths_resolve_against_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "cfg" / "s.yaml"
    cfg.parent.mkdir()
    cfg.write_text(
        "data: {source: tokens, train_path: /no/such/train.bin, val_path: /no/such/val.bin, vocab_size: 50}\n"
    )
    with pytest.raises(ConfigValueError, match=r"s\.yaml: data\.train_path is not an existing file: '/no/such"):
        load_study(cfg)
    (tmp_path / "tok").mkdir()
    np.arange(100, dtype=np.uint16).__mod__(50).astype(np.uint16).tofile(tmp_path / "tok" / "t.bin")
    np.arange(50, dtype=np.uint16).tofile(tmp_path / "tok" / "v.bin")  # held-out data may not be the train file
    monkeypatch.chdir(tmp_path)
    run = load_study(cfg, overrides={"data.train_path": "tok/t.bin", "data.val_path": "tok/v.bin"}).base
    tok = tmp_path / "tok"
    assert (run.data.train_path, run.data.val_path) == (str(tok / "t.bin"), str(tok / "v.bin"))


def test_study_wide_sections_take_overrides_and_are_not_hashed() -> None:
    base = load_study(TINY)
    study = base.override({"tracking.tensorboard": True, "resources.gpus_per_run": 0.5})
    assert study.tracking.tensorboard and study.resources.gpus_per_run == 0.5
    assert [r.run_id for r in study.runs()] == [r.run_id for r in base.runs()]
    with pytest.raises(ConfigValueError, match=r"resources\.gpus_per_run must be a finite number >= 0"):
        base.override({"resources.gpus_per_run": -1})
    with pytest.raises(ConfigValueError, match=r"tracking\.tensorbord is not a config key"):
        base.override({"tracking.tensorbord": True})


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["study", "run", str(TINY), "--out", str(tmp_path / "o")]
    for extra, message in [
        (["--set", "train.stpes=2"], "train.stpes is not a config key"),
        (["--set", "train.steps=two"], "train.steps must be an int, got str 'two'"),
        (["--set", "model.depth=[]"], "grid.model.depth must be a non-empty list"),
        (["--executor", "ray", "--workers", "2"], "--workers is for --executor local"),
        (["--ray-address", "localhost:1"], "--ray-address is for --executor ray"),
    ]:
        assert cli_main(args + extra) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("lnblocks: error: ") and message in lines[0], (extra, lines)
    assert not (tmp_path / "o").exists()  # nothing written before the config is valid
