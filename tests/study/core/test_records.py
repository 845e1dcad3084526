"""Run records: schema-2 round trip, records written by lnblocks before the typed record (schema 1, a fixture made
by that code) still load and report identically, non-finite numbers stored as null, and records that fail
validation named by file and key."""

from __future__ import annotations

import csv
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lnblocks.study import RunConfig, build_report, read_record, run_study, study_from_dict
from lnblocks.study.core.atomic import finite_or_null
from lnblocks.study.core.records import RecordError, RunRecord, write_record
from lnblocks.study.lm.result import LMResult

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "records_v1"
ONE_RUN = {
    "data": {"source": "markov", "vocab_size": 8, "seq_len": 8, "batch_size": 4, "eval_batches": 1},
    "model": {"dim": 16, "n_heads": 2, "depth": 1},
    "train": {"steps": 4},
    "diagnostics": {"every": 2, "init_grad_batches": 1, "probe_batch_size": 2},
}


def lm_record(**result: object) -> RunRecord:
    fields = dict(reference={"uniform": 2.0, "unigram": 1.5}, model={}, steps_done=2, diverged_step=None,
                  initial_loss=2.0, final_train_loss=1.9, eval={"init": 2.0, "final": 1.8, "curve": []},
                  loss=[2.0, 1.9])  # fmt: skip
    return RunRecord(
        id="x", task="lm", status="finished", labels={}, config=RunConfig.from_dict(ONE_RUN).to_dict(),
        result=LMResult(**{**fields, **result}), time={"wall_s": 1, "cpu_s": 1, "step_ms": 1}, env={},
    )  # fmt: skip


def test_schema_1_records_load_and_report_as_before(tmp_path: Path) -> None:
    """The fixture is a study run by lnblocks before this schema (2 finished and 2 diverged runs); every column of
    the summary.csv that code wrote must come out identical (later columns, e.g. final_log_z, are added)."""
    out = tmp_path / "old"
    shutil.copytree(FIXTURE, out)
    recs = [read_record(p) for p in sorted((out / "runs").glob("*.json"))]
    assert {r.format for r in recs} == {"lnblocks.study.run/1"} and {r.task for r in recs} == {"lm"}
    assert sorted(r.status for r in recs) == ["diverged", "diverged", "finished", "finished"]
    assert all(isinstance(r.result, LMResult) and r.result.init_grad for r in recs)
    assert build_report(out, echo=False) == 0
    with open(out / "summary.csv", newline="") as f:
        new = list(csv.DictReader(f))
    with open(FIXTURE / "summary_main.csv", newline="") as f:
        old = list(csv.DictReader(f))
    assert len(new) == len(old) == 4 and set(old[0]) <= set(new[0])
    assert [{k: r[k] for k in old[0]} for r in new] == old
    assert "## Findings" in (out / "report.md").read_text()


def test_older_config_keys_in_records_read_as_todays(tmp_path: Path) -> None:
    """Records keep the config their lnblocks wrote: ``model.qkv_init_gain`` and ``train.amp_dtype`` (schema 1, and
    schema 2 before the keys were renamed) read as ``qkv_init`` / ``dtype``, so the report can rebuild their runs;
    the config classes refuse the old keys."""
    v1 = [read_record(p) for p in sorted((FIXTURE / "runs").glob("*.json"))]
    assert {
        json.loads(p.read_text())["config"]["model"]["qkv_init_gain"] for p in (FIXTURE / "runs").glob("*.json")
    } == {1.0}
    assert {(r.config["model"]["qkv_init"], r.config["train"]["dtype"]) for r in v1} == {("per_matrix", "fp32")}
    assert all("qkv_init_gain" not in r.config["model"] and "amp_dtype" not in r.config["train"] for r in v1)
    assert RunConfig.from_dict(v1[0].config).model.qkv_init == "per_matrix"
    raw = lm_record().to_json()
    raw["config"]["model"]["qkv_init_gain"] = 2**-0.5
    del raw["config"]["train"]["dtype"]
    raw["config"]["train"]["amp_dtype"] = "bfloat16"
    (tmp_path / "x.json").write_text(json.dumps(raw))
    back = read_record(tmp_path / "x.json")
    assert back.config["model"]["qkv_init"] == "stacked" and back.config["train"]["dtype"] == "bf16"
    raw["config"]["train"]["amp_dtype"] = "float16"
    (tmp_path / "x.json").write_text(json.dumps(raw))
    with pytest.raises(
        RecordError, match=r"x\.json: config\.train\.amp_dtype must be one of \['float32', 'bfloat16'\]"
    ):
        read_record(tmp_path / "x.json")
    with pytest.raises(ValueError, match=r"model\.qkv_init_gain is not a config key"):
        RunConfig.from_dict({"model": {"qkv_init_gain": 1.0}})


def test_round_trip_and_non_finite_numbers_become_null(tmp_path: Path) -> None:
    entry = {"step": 0, "lr": 1e-3, "residual_rms": [1.0, float("nan")], "residual_max": [1.0, 2.0], "log_z": 1.0,
             "grad_norm": {"W_2": [0.5]}, "update_ratio": {}, "grad_norm_total": float("inf"),
             "max_output_logit": 2.0}  # fmt: skip
    rec = lm_record(loss=[2.0, float("nan")], diagnostics=[entry])
    write_record(tmp_path / "x.json", rec)
    raw = json.loads((tmp_path / "x.json").read_text())
    assert raw["format"] == "lnblocks.study.run/2" and raw["result"]["loss"] == [2.0, None]
    assert raw["result"]["diagnostics"][0]["grad_norm_total"] is None
    back = read_record(tmp_path / "x.json")
    assert back.result.loss == [2.0, None] and back.config == rec.config
    assert finite_or_null({"a": (1.0, -math.inf)}) == {"a": [1.0, None]}


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda r: r["result"].pop("eval"), r"x\.json: result\.eval is missing"),
        (lambda r: r["result"]["eval"].update(final="low"), r"x\.json: result\.eval\.final must be a number or null"),
        (lambda r: r["config"]["model"].pop("depth"), r"x\.json: config\.model\.depth is missing"),
        (lambda r: r.update(status="running"), r"x\.json: status must be one of \['finished', 'diverged'\]"),
        (lambda r: r.update(format="lnblocks.study.run/9"), r"x\.json: format must be 'lnblocks\.study\.run/2'"),
        (lambda r: r["result"].update(extra=1), r"x\.json: result\.extra is not a field of LMResult"),
        (lambda r: r["time"].pop("wall_s"), r"x\.json: time\.wall_s is missing"),
    ],
)
def test_invalid_records_name_the_file_and_key(tmp_path: Path, edit, match: str) -> None:
    path = tmp_path / "x.json"
    raw = lm_record().to_json()
    edit(raw)
    path.write_text(json.dumps(raw))
    with pytest.raises(RecordError, match=match):
        read_record(path)


def test_schema_1_record_missing_a_key_is_named(tmp_path: Path) -> None:
    raw = json.loads(next((FIXTURE / "runs").glob("*ok*.json")).read_text())
    del raw["eval"]
    (tmp_path / "y.json").write_text(json.dumps(raw))
    with pytest.raises(RecordError, match=r"y\.json: eval is missing \(a record of schema 'lnblocks\.study\.run/1'\)"):
        read_record(tmp_path / "y.json")


def test_report_names_bad_and_missing_records_and_run_redoes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record with a key removed, a truncated one and a missing one are each named (file and
    what is wrong) by ``study report``; ``study run`` redoes exactly those, with the same numbers."""
    study = study_from_dict({**ONE_RUN, "grid": {"model.placement": ["pre", "post"], "train.seed": [0, 1]}})
    out = tmp_path / "out"
    assert run_study(study, out, show_progress=False, report=False) == 0
    paths = [out / "runs" / f"{r.run_id}.json" for r in study.runs()]
    originals = [json.loads(p.read_text()) for p in paths]
    keyless = dict(originals[0])
    keyless["result"] = {k: v for k, v in keyless["result"].items() if k != "eval"}
    paths[0].write_text(json.dumps(keyless))
    paths[1].write_text(paths[1].read_text()[:200])
    paths[2].unlink()
    capsys.readouterr()
    assert build_report(out, plots=False, echo=False) == 0  # built from the one valid record
    err = capsys.readouterr().err
    assert f"{paths[0]}: result.eval is missing" in err
    assert f"{paths[1]}: is not valid JSON" in err and f"{paths[2]}: no record" in err
    assert "3 of 4 runs have no valid record" in err
    assert "3 runs of this study have no valid record" in (out / "report.md").read_text()
    assert run_study(study, out, show_progress=False, report=False) == 0
    captured = capsys.readouterr()
    assert "4 runs, 1 already finished, 3 to run" in captured.out and "result.eval is missing" in captured.err
    for path, old in zip(paths, originals):
        assert json.loads(path.read_text())["result"] == old["result"]


def test_corrupt_study_json_is_one_clear_line(tmp_path: Path) -> None:
    out = tmp_path / "old"
    shutil.copytree(FIXTURE, out)
    (out / "study.json").write_text('{"name": "x", "run_ids": [')
    cmd = [sys.executable, "-m", "lnblocks.cli", "study", "report", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"lnblocks: error: {out / 'study.json'}: is not valid JSON (Expecting value: line 1 column 27 (char 26)): "
        "a truncated or corrupt study manifest"
    )


def test_a_non_utf8_byte_in_a_record_or_the_manifest_is_named_and_redone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One flipped byte (0xff) in a record or in ``study.json``: each file is named on stderr and the run redone
    (the manifest rewritten), to the same numbers, instead of ``study run`` stopping at ``'utf-8' codec can't
    decode``."""
    study = study_from_dict({**ONE_RUN, "grid": {"train.seed": [0, 1]}})
    out = tmp_path / "out"
    assert run_study(study, out, show_progress=False, report=False) == 0
    path = out / "runs" / f"{study.runs()[0].run_id}.json"
    original = path.read_bytes()
    path.write_bytes(original[:40] + b"\xff" + original[41:])
    capsys.readouterr()
    assert build_report(out, plots=False, echo=False) == 0  # from the other record
    bad = f"{path}: is not UTF-8 text (byte 0xff at offset 40): a corrupt run record"
    assert bad in capsys.readouterr().err
    manifest = out / "study.json"
    manifest.write_bytes(b"\xff" + manifest.read_bytes()[1:])
    with pytest.raises(RecordError, match=r"study\.json: is not UTF-8 text"):
        build_report(out, plots=False, echo=False)
    assert run_study(study, out, show_progress=False, report=False) == 0
    err = capsys.readouterr().err
    assert f"warning: {manifest}: is not UTF-8 text (byte 0xff at offset 0)" in err
    assert f"{bad}; the run is redone" in err
    assert json.loads(path.read_text())["result"] == json.loads(original)["result"]
