"""The worked example of ``docs/sharding.md`` runs under ``torchrun`` with 2 processes and as a plain script, and a
wrong world size stops both ranks with the ``ValueError`` instead of a hang."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.models.parallel_launch import torchrun

DOC = Path(__file__).resolve().parents[2] / "docs" / "sharding.md"
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


def example(tmp_path: Path) -> Path:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1, "docs/sharding.md should hold the one worked example"
    script = tmp_path / "sharded_train.py"
    script.write_text(blocks[0])
    return script


def check_output(out: str) -> None:
    steps = re.findall(r"step (\d): loss ([\d.]+), one process ([\d.]+)", out)
    assert [s[0] for s in steps] == ["0", "1", "2"], out
    for _, sharded, single in steps:
        assert abs(float(sharded) - float(single)) <= 2e-6, out  # printed to 6 decimals
    err = float(re.search(r"difference from the one-process run ([\d.e+-]+)", out).group(1))
    assert err <= 5e-5, out  # measured 1.8e-6 (FSDP2), 8.8e-6 (TP): AdamW steps of 3e-3 on near-zero gradients


def test_example_under_torchrun_two_processes(tmp_path: Path) -> None:
    proc = torchrun(example(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check_output(proc.stdout)
    assert (tmp_path / "sharded_ckpt" / ".metadata").exists()


def test_example_as_a_plain_script_in_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Without torchrun the script makes a one-process group (FSDP2 over one rank) and prints the same checks."""
    monkeypatch.chdir(tmp_path)
    for name in ("RANK", "WORLD_SIZE", "PARALLEL"):
        monkeypatch.delenv(name, raising=False)
    exec(compile(example(tmp_path).read_text(), "docs/sharding.md", "exec"), {"__name__": "__main__"})
    assert not dist.is_initialized()
    check_output(capsys.readouterr().out)


def test_wrong_world_size_stops_every_rank_promptly(tmp_path: Path) -> None:
    start = time.monotonic()
    proc = torchrun(example(tmp_path), cwd=tmp_path, env={"PARALLEL": '{"dp_shard": 4}'}, timeout=120)
    assert proc.returncode != 0
    message = "ValueError: dp_shard * tp must equal the world size 2: got dp_shard=4 * tp=1 = 4"
    assert proc.stderr.count(message) >= 2, proc.stderr[-3000:]  # one per rank
    assert time.monotonic() - start < 60  # both ranks exit; nobody waits for the group's timeout
