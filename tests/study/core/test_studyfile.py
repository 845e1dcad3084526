"""Study files and ``--set`` values: the YAML 1.2 core schema in both (numbers, bools, null), merge keys, files that
are not UTF-8 or not a mapping, ``extends`` values, which keys ``--set`` may change and what it blames, and grid
labels that the run ids, ``--set`` and the report would write alike."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from lnblocks.cli import main as cli_main
from lnblocks.study import load_study
from lnblocks.study.core.studyfile import StudyFileError, parse_value, read_yaml

BASE = """
data: {source: markov, vocab_size: 16, seq_len: 16, batch_size: 8, eval_batches: 1}
model: {dim: 16, n_heads: 2, depth: 1}
train: {steps: 2}
diagnostics: {every: 0, init_grad_batches: 0, attention: false}
"""

# YAML text -> what YAML 1.2's core schema reads (PyYAML's safe_load, YAML 1.1, reads the ones marked differently)
CORE_SCHEMA = [
    ("010", 10),  # 1.1: octal 8
    ("0o17", 15),
    ("0x1f", 31),
    ("-0x1f", "-0x1f"),  # 1.2: hex and octal take no sign
    ("+7", 7),
    ("007", 7),
    ("1:30", "1:30"),  # 1.1: base 60, 90
    ("1_000", "1_000"),  # 1.1: 1000
    ("0b101", "0b101"),  # 1.1: 5
    ("1e-3", 1e-3),  # 1.1: a string
    ("3E+4", 3e4),
    ("1.5", 1.5),
    (".5", 0.5),
    ("-1.", -1.0),
    ("yes", "yes"),  # 1.1: True
    ("no", "no"),
    ("on", "on"),
    ("Off", "Off"),
    ("y", "y"),
    ("true", True),
    ("False", False),
    ("TRUE", True),
    ("null", None),
    ("~", None),
    ("2024-01-02", "2024-01-02"),  # 1.1: a date
    ("=", "="),
    ("[010, 1:30, yes]", [10, "1:30", "yes"]),
    ("{a: 010}", {"a": 10}),
]


@pytest.mark.parametrize(("text", "expected"), CORE_SCHEMA)
def test_set_values_and_study_files_read_yaml_1_2_scalars(tmp_path: Path, text: str, expected: object) -> None:
    assert parse_value(text) == expected and type(parse_value(text)) is type(expected)
    path = tmp_path / "f.yaml"
    path.write_text(f"v: {text}\n")
    assert read_yaml(path) == {"v": expected}


def test_special_floats_and_explicit_tags() -> None:
    assert parse_value(".inf") == math.inf and parse_value("-.Inf") == -math.inf and math.isnan(parse_value(".nan"))
    assert parse_value("!!int 010") == 10 and parse_value("!!str 10") == "10" and parse_value("!!float 1") == 1.0


def test_numbers_reach_the_config_as_written(tmp_path: Path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text(BASE.replace("steps: 2", "steps: 010"))
    assert load_study(cfg).base.train.steps == 10
    assert load_study(cfg, overrides={"train.steps": parse_value("012")}).base.train.steps == 12
    with pytest.raises(TypeError, match=r"model\.depth must be an int, got str '1:30'"):
        load_study(cfg, overrides={"model.depth": parse_value("1:30")})
    with pytest.raises(TypeError, match=r"train\.compile must be a bool, got str 'yes'"):
        load_study(cfg, overrides={"train.compile": parse_value("yes")})


def test_merge_keys_work_and_own_keys_win(tmp_path: Path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text(
        "data: &d {source: markov, vocab_size: 16, seq_len: 16, batch_size: 8, eval_batches: 1}\n"
        "model: {dim: 16, n_heads: 2, depth: 1}\ntrain: {steps: 2}\n"
        "grid:\n  variant:\n    a: &a {model.placement: pre, train.lr: 1.0e-3}\n"
        "    b: {<<: *a, model.placement: post}\n"
    )
    runs = load_study(cfg).runs()
    assert [(r.model.placement, r.train.lr) for r in runs] == [("pre", 1e-3), ("post", 1e-3)]
    cfg.write_text("a: {x: 1, x: 2}\n")  # a key twice is still refused, merge keys or not
    with pytest.raises(StudyFileError, match=r"s\.yaml:1: duplicate key 'x'"):
        read_yaml(cfg)


def test_unreadable_study_files_are_named_and_never_quoted_whole(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(StudyFileError, match=r"latin1\.yaml: not UTF-8 text \(byte 0xe9 at offset 9\)"):
        load_study(bad)
    text = tmp_path / "notes.txt"
    text.write_text("secret line one\n" * 200)
    child = tmp_path / "child.yaml"
    for extends, match in (
        (str(text), r"notes\.txt: a study config must be a mapping .* got text \(\d+ characters\)$"),
        ('""', r"extends must be a file name or a list of file names, got ''"),
        ("['base.yaml', '  ']", r"extends must be a file name or a list of file names, got \['base.yaml'"),
        ("{a: 1}", r"extends must be a file name or a list of file names, got \{'a': 1\}"),
    ):
        child.write_text(f"extends: {extends}\n" + BASE)
        with pytest.raises(StudyFileError, match=match) as err:
            load_study(child)
        assert "secret" not in str(err.value)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ("extends=other.yaml", "extends cannot be overridden"),
        ("task=cnn_digits", "task cannot be overridden"),
        ("grid.model.depth=[2]", r"grid.model.depth cannot be overridden: give a grid axis by its own name"),
        ("model=3", r"model must be a mapping of options, got int 3"),
        ("model={placement: post}", r"model.placement is set by the grid axis 'variant' in every run"),
        ("model.placement=post", r"model.placement is set by the grid axis 'variant' in every run"),
        ("model.norm.eps=1e-6", r"model.norm.eps is set by the grid axis 'model.norm'"),
    ],
)
def test_set_refusals_name_the_real_reason(tmp_path: Path, change: str, match: str, capsys) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text(
        BASE + "grid:\n  variant:\n    pre: {model.placement: pre}\n    deep: {model.placement: deepnorm, "
        "model.init: deepnet}\n  model.norm: [layernorm, rmsnorm]\n"
    )
    assert cli_main(["study", "run", str(cfg), "--out", str(tmp_path / "o"), "--set", change]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("lnblocks: error: ")
    assert re.search(match, err), err


def test_set_a_key_some_bundles_set_and_sections_as_mappings(tmp_path: Path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text(
        BASE + "grid:\n  variant:\n    pre: {model.placement: pre}\n    deep: {model.placement: deepnorm, "
        "model.init: deepnet}\n"
    )
    # model.init is set by one bundle only: the override changes the base, the bundle keeps its own value
    runs = load_study(cfg, overrides={"model.init": "gpt2"}).runs()
    assert [r.model.init for r in runs] == ["gpt2", "deepnet"]
    runs = load_study(cfg, overrides={"model": {"dim": 8, "depth": 2}}).runs()  # a section: each key it names
    assert [(r.model.dim, r.model.depth, r.model.n_heads) for r in runs] == [(8, 2, 2), (8, 2, 2)]
    runs = load_study(cfg, overrides={"variant": {"post": {"model.placement": "post"}}}).runs()  # an axis: whole
    assert [(r.labels, r.model.placement) for r in runs] == [((("variant", "post"),), "post")]
    # a file that sets what one bundle of an inherited named axis sets is not refused either
    child = tmp_path / "child.yaml"
    child.write_text("extends: s.yaml\nmodel: {init: gpt2}\n")
    assert [r.model.init for r in load_study(child).runs()] == ["gpt2", "deepnet"]
    child.write_text("extends: s.yaml\nmodel: {placement: post}\n")
    with pytest.raises(StudyFileError, match=r"sets model\.placement, but the grid axis 'variant'"):
        load_study(child)


@pytest.mark.parametrize(
    "labels",
    [
        "1: {model.placement: pre}\n    '1': {model.placement: post}",
        "true: {model.placement: pre}\n    'True': {model.placement: post}",
        "1.5: {model.placement: pre}\n    '1.5': {model.placement: post}",
        "null: {model.placement: pre}\n    'None': {model.placement: post}",
        "'': {model.placement: pre}\n    b: {model.placement: post}",
    ],
)
def test_named_axis_labels_must_differ_as_written(tmp_path: Path, labels: str) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text(BASE + f"grid:\n  variant:\n    {labels}\n")
    with pytest.raises(ValueError, match=r"grid.variant (labels .* are both|labels must be non-empty)"):
        load_study(cfg)
    with pytest.raises(ValueError, match=r"grid.variant"):  # --set variant=1 selected both before
        load_study(cfg, overrides={"variant": [1]})


def test_arm_labels_of_several_axes_must_not_join_alike(tmp_path: Path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text(
        BASE + "grid:\n  a: {x/y: {model.placement: pre}, x: {model.placement: post}}\n"
        "  b: {z: {model.norm: layernorm}, y/z: {model.norm: rmsnorm}}\n"
    )
    with pytest.raises(ValueError, match=r"share the arm 'x/y/z' in the report"):
        load_study(cfg)
