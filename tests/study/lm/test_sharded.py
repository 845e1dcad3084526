"""``train.parallel``: an lm study under ``torchrun`` with 2 gloo processes, sharded with FSDP2
(``{dp_shard: 2}``) or tensor + sequence parallelism (``{tp: 2}``), or with DDP (null), gives the one-process run's
record up to float reduction order; a run checkpointed under FSDP2 and killed resumes in one process, and a
one-process checkpoint resumes under tensor parallelism (DCP and full state dicts reshard), each to the
uninterrupted run's record; a layout that does not fit the processes or the model is refused with one line naming
``train.parallel`` on every rank, before any process group, within a timeout. bf16 autocast under FSDP2, with no
diagnostic that reads whole weights (so no unsharded copy on rank 0), gives the one-process bf16 record within
bf16's tolerance (measured: 1.1e-3 on a loss, 1.8e-3 on a gradient norm). ``{dp_shard: 2, tp: 2}`` on 4 processes (a
2 x 2 mesh) gives the one-process record too, and so does ``{tp: 2, loss_parallel: true}`` (the cross-entropy and
the z-loss on vocabulary-split logits).

Tolerance: every number of ``result`` within ``ATOL + RTOL * |reference|``. Measured on 2 CPU cores (torch 2.13,
8 steps): see MEASURED; the tolerance is about 10x the largest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lnblocks.config import ConfigValueError
from lnblocks.models.parallel.config import ParallelConfig
from lnblocks.study import load_study, read_record, run_study
from tests.models.parallel_launch import torchrun
from tests.study.study_helpers import child_env

SCRIPT = Path(__file__).with_name("sharded_run.py")
STUDY = """
name: sharded
data: {source: markov, vocab_size: 16, seq_len: 16, batch_size: 8, eval_batches: 2}
model: {dim: 32, depth: 2, n_heads: 2}
train: {steps: 8, lr: 3.0e-3, warmup: 2, grad_clip: 0.5, grad_accum: 2, eval_every: 4, log_every: 3}
diagnostics: {every: 3, init_grad_batches: 2, probe_batch_size: 4, layer_ablation: true}
"""
ATOL, RTOL = 1e-5, 2e-3
TIMEOUT = 120


def numbers(a: Any, b: Any, path: str = "") -> Iterator[tuple[str, float, float]]:
    """Every pair of numbers at the same place of two JSON trees (the rest must be equal)."""
    if isinstance(a, dict):
        assert set(a) == set(b), (path, set(a) ^ set(b))
        for k in a:
            yield from numbers(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            yield from numbers(x, y, f"{path}[{i}]")
    elif isinstance(a, (int, float)) and not isinstance(a, bool):
        yield path, a, b
    else:
        assert a == b, (path, a, b)


def assert_close(record: Any, reference: Any, atol: float = ATOL, rtol: float = RTOL) -> None:
    """Every number of the two results within the tolerance (the largest differences are printed: ``-s``)."""
    a, b = record.to_json(), reference.to_json()
    assert a["status"] == b["status"] and a["config"] == b["config"]
    worst: dict[str, tuple[float, float, str]] = {}
    for path, x, y in numbers(a["result"], b["result"]):
        assert abs(x - y) <= atol + rtol * abs(y), f"{path}: {x} vs {y}"
        key = path.split(".")[1].split("[")[0]
        d = abs(x - y)
        if d > worst.get(key, (0.0, 0.0, ""))[0]:
            worst[key] = (d, d / abs(y), path)
    print({k: f"{d:.1e} abs ({r:.1e} rel) at {p}" for k, (d, r, p) in worst.items()})


def the_record(out: Path) -> Any:
    (path,) = (out / "runs").glob("*.json")
    return read_record(path)


def launch(cfg: Path, out: Path, overrides: dict, nproc: int = 2, fault: str | None = None) -> Any:
    env = {"LNBLOCKS_CHECKPOINT_FAULT": fault} if fault else None
    if nproc == 1:  # a plain process (killed by the fault: not in this one)
        cmd = [sys.executable, str(SCRIPT), str(cfg), str(out), json.dumps(overrides)]
        return subprocess.run(cmd, env=child_env(**(env or {})), capture_output=True, text=True, timeout=TIMEOUT)
    return torchrun(SCRIPT, str(cfg), str(out), json.dumps(overrides), nproc=nproc, env=env, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def sharded_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = tmp_path_factory.mktemp("sharded") / "sharded.yaml"
    cfg.write_text(STUDY)
    return cfg


@pytest.fixture(scope="module")
def sharded_reference(sharded_study: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("one_process")
    assert run_study(sharded_study, out, show_progress=False, report=False) == 0
    return the_record(out)


@pytest.mark.parametrize(
    "parallel",
    [{"dp_shard": 2}, {"tp": 2}, {"tp": 2, "loss_parallel": True}],
    ids=["fsdp2", "tp2", "tp2-loss-parallel"],
)
def test_two_processes_give_the_one_process_record(
    sharded_study: Path, sharded_reference: Any, tmp_path: Path, parallel
) -> None:
    proc = launch(sharded_study, tmp_path, {"train.parallel": parallel})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = the_record(tmp_path)
    assert rec.env["world_size"] == 2 and rec.env["parallel"] == {**ParallelConfig().to_dict(), **parallel}
    assert rec.id == sharded_reference.id  # train.parallel is not part of the run's id
    assert_close(rec, sharded_reference)


def test_a_two_dimensional_mesh_on_four_processes(sharded_study: Path, sharded_reference: Any, tmp_path: Path) -> None:
    """FSDP2 x tensor parallelism on a 2 x 2 mesh (4 gloo processes on the 2-core machine)."""
    proc = launch(sharded_study, tmp_path, {"train.parallel": {"dp_shard": 2, "tp": 2}}, nproc=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = the_record(tmp_path)
    assert rec.env["world_size"] == 4 and rec.env["parallel"]["dp_shard"] == rec.env["parallel"]["tp"] == 2
    assert rec.id == sharded_reference.id
    assert_close(rec, sharded_reference)


def test_loss_parallel_with_the_z_loss(sharded_study: Path, sharded_reference: Any, tmp_path: Path) -> None:
    """The z-loss on vocabulary-split logits (``logsumexp`` over the shards) back-propagates what one process does."""
    z = {"train.z_loss": 1e-2}
    assert run_study(sharded_study, tmp_path / "one", show_progress=False, report=False, overrides=z) == 0
    proc = launch(sharded_study, tmp_path / "two", {**z, "train.parallel": {"tp": 2, "loss_parallel": True}})
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = the_record(tmp_path / "one")
    assert ref.result.loss != sharded_reference.result.loss  # the z-loss changed the run
    assert_close(the_record(tmp_path / "two"), ref)


BF16 = {"train.dtype": "bf16", "diagnostics.every": 0, "diagnostics.layer_ablation": False}
BF16_ATOL, BF16_RTOL = 1e-3, 3e-2  # bf16 autocast: a product rounded to 8 bits, summed in another order per rank


def test_bf16_under_fsdp_without_the_full_copy(sharded_study: Path, tmp_path: Path) -> None:
    """bf16 autocast sharded, and a run whose diagnostics read no whole weight (no unsharded copy on rank 0)."""
    assert run_study(sharded_study, tmp_path / "one", show_progress=False, report=False, overrides=BF16) == 0
    proc = launch(sharded_study, tmp_path / "two", {**BF16, "train.parallel": {"dp_shard": 2}})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec, ref = the_record(tmp_path / "two"), the_record(tmp_path / "one")
    assert rec.id == ref.id and rec.config["train"]["dtype"] == "bf16" and not rec.result.diagnostics
    assert_close(rec, ref, BF16_ATOL, BF16_RTOL)


@pytest.mark.parametrize(
    ("first", "then"),
    [({"dp_shard": 2}, None), (None, {"tp": 2}), ({"dp_shard": 2}, {"tp": 2})],
    ids=["fsdp2-then-one-process", "one-process-then-tp2", "fsdp2-then-tp2"],
)
def test_a_checkpoint_resumes_under_another_world_size_or_layout(
    sharded_study: Path,
    sharded_reference: Any,
    tmp_path: Path,
    first: dict | None,
    then: dict | None,
    capfd: pytest.CaptureFixture,
) -> None:
    """Killed at step 6 (checkpoint of step 4) under one layout, resumed under the other: another world size, or
    another layout at the same world size (the manifest records the layout), and stderr says it is resharded."""
    ckpt = {"train.checkpoint": {"every": 4}}
    killed = launch(
        sharded_study, tmp_path, {**ckpt, "train.parallel": first}, 1 if first is None else 2, "kill-at-step@6"
    )
    assert killed.returncode != 0 and not list((tmp_path / "runs").glob("*.json")), killed.stderr[-3000:]
    if then is None:  # in this process
        assert run_study(sharded_study, tmp_path, show_progress=False, report=False, overrides=ckpt) == 0
        assert "resharded" in capfd.readouterr().err
    else:
        again = launch(sharded_study, tmp_path, {**ckpt, "train.parallel": then})
        assert again.returncode == 0 and "resharded" in again.stderr, again.stderr[-3000:]
    rec = the_record(tmp_path)
    assert rec.env["resumed_from"] == [4] and rec.env["world_size"] == (1 if then is None else 2)
    assert_close(rec, sharded_reference)


def test_a_layout_that_does_not_fit_is_refused_on_every_rank(sharded_study: Path, tmp_path: Path) -> None:
    """tp=2 and 3 heads, under torchrun (the world-size mismatch: in one process, in the next test)."""
    parallel, words = {"tp": 2}, "train.parallel (tp=2) cannot split this model: block[0].attention.n_heads (3) must"
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(sharded_study.read_text().replace("n_heads: 2", "n_heads: 3").replace("dim: 32", "dim: 48"))
    cmd = ["-m", "lnblocks.cli", "study", "run", str(cfg), "--out", str(tmp_path / "out"), "--set"]
    proc = torchrun(Path(cmd[0]), *cmd[1:], f"train.parallel={json.dumps(parallel)}", timeout=TIMEOUT)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("lnblocks: error: ")]
    assert proc.returncode != 0 and len(errors) == 2 and all(words in line for line in errors), proc.stderr[-3000:]
    assert not (tmp_path / "out" / "runs").exists() or not list((tmp_path / "out" / "runs").glob("*.json"))


def test_train_parallel_is_checked_where_the_run_is_built_and_is_no_part_of_the_id(sharded_study: Path) -> None:
    """``train.parallel`` is the library's ``ParallelConfig``; the run config checks it against the model and the batch
    once, when it is built, and against the number of processes before any process group (``check_world``)."""
    (run,) = load_study(sharded_study).runs()
    (sharded,) = load_study(sharded_study, overrides={"train.parallel": {"dp_shard": 2}}).runs()
    assert isinstance(sharded.train.parallel, ParallelConfig) and sharded.train.parallel.dp_shard == 2
    assert sharded.run_id == run.run_id and sharded.digest == run.digest
    sharded.check_world(2)
    run.check_world(2)  # null: DDP, any world size
    with pytest.raises(ConfigValueError, match=r"train\.parallel\.dp_shard must be"):
        load_study(sharded_study, overrides={"train.parallel": {"dp_shard": 0}})
    with pytest.raises(ConfigValueError, match=r"train\.parallel\.fsdp is not a config key"):
        load_study(sharded_study, overrides={"train.parallel": {"fsdp": 2}})  # one name per axis: the library's
    with pytest.raises(ConfigValueError, match=r"train\.parallel\.loss_parallel .*needs tp > 1"):
        load_study(sharded_study, overrides={"train.parallel": {"dp_shard": 2, "loss_parallel": True}})
    with pytest.raises(ConfigValueError, match=r"train\.parallel\.param_dtype would change what the run computes"):
        load_study(sharded_study, overrides={"train.parallel": {"dp_shard": 2, "param_dtype": "bfloat16"}})
    with pytest.raises(ConfigValueError, match=r"train\.parallel\.compile is train\.compile's"):
        load_study(sharded_study, overrides={"train.parallel": {"dp_shard": 2, "compile": True}})
    (compiled,) = load_study(sharded_study, overrides={"train.parallel": {"dp_shard": 2}, "train.compile": True}).runs()
    assert compiled.train.parallel.compile
    with pytest.raises(ConfigValueError, match=r"train\.parallel needs dp_shard=2 \* tp=1 = 2 processes, but .* has 1"):
        run_study(
            sharded_study, "unused", show_progress=False, report=False, overrides={"train.parallel": {"dp_shard": 2}}
        )
    with pytest.raises(ConfigValueError, match=r"splits data\.batch_size \(8\) over dp_shard=16 ranks"):
        load_study(sharded_study, overrides={"train.parallel": {"dp_shard": 16}, "train.grad_accum": 1})
    with pytest.raises(ConfigValueError, match=r"train\.dtype 'fp16' .* not supported with train\.parallel"):
        load_study(sharded_study, overrides={"train.parallel": {"dp_shard": 2}, "train.dtype": "fp16"})
    with pytest.raises(ConfigValueError, match=r"train\.parallel \(tp=2\) cannot split this model: .*n_heads \(3\)"):
        load_study(sharded_study, overrides={"train.parallel": {"tp": 2}, "model.n_heads": 3, "model.dim": 48})
