"""Sharded models under inputs that used to hang or fail obscurely (2 gloo processes, ``parallel_faults.py``): ranks
given different configs, models or one bad input all stop with the same one error before any sharded collective;
``generate`` on an FSDP2 model works with or without ``unshard()`` and before the first forward (tokens equal the
unsharded model's, training afterwards equal to one process); ``matrices()`` and ``to_hf()`` refuse shards by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.models.parallel_faults import CHECKS
from tests.models.parallel_launch import torchrun

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("parallel_faults") / "results.json"
    proc = torchrun(HERE / "parallel_faults.py", str(out), timeout=240)  # a hang: the 60 s group timeout, then here
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


def test_every_check_reports(results: dict) -> None:
    assert sorted(results) == sorted(CHECKS)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_check(results: dict, name: str) -> None:
    for rank, result in enumerate(results[name]):
        assert result["ok"], f"{name}, rank {rank}: {result['detail']}\n{result.get('traceback', '')}"
