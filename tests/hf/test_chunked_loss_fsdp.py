"""``chunked_loss=True`` under FSDP2 on 2 gloo processes against the one-process model (``fsdp_loss_checks.py``).

One ``torchrun`` launch runs every check; each test here reports one. Llama's plain head (its gradients computed in
the forward) and Gemma 2's soft-capped, tied head (recomputed in the backward), with the head in the root's FSDP2
unit, in transformers' own plan (the final norm and the head grouped, kept unsharded after the forward) and alone,
resharded after its forward: 3 SGD steps with each rank's loss and every gradient against one process
(tolerances in ``fsdp_loss_checks.py``), and the all-gathers of one step counted against the unpatched sharded
model's (the chunked loss works on the weight FSDP2 gathered for the head's call, no second full copy); a head
sharded by tensor parallelism is refused with a ``TypeError``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist
from fsdp_loss_checks import all_checks

from tests.models.parallel_launch import torchrun

pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

HERE = Path(__file__).resolve().parent
CHECKS = list(all_checks())


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("fsdp_loss") / "results.json"
    proc = torchrun(HERE / "fsdp_loss_checks.py", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


def test_every_check_reports(launch: dict) -> None:
    assert sorted(launch) == sorted(CHECKS)


@pytest.mark.parametrize("name", CHECKS)
def test_chunked_loss_under_fsdp2_matches_one_process(launch: dict, name: str) -> None:
    for rank, result in enumerate(launch[name]):
        assert result["ok"], f"{name}, rank {rank}: {result['detail']}\n{result.get('traceback', '')}"
