"""Sharded training (``lnblocks.models.parallel``) on 2 gloo processes against the same model in one process.

One ``torchrun`` launch (``parallel_checks.py``) runs every check and records, per rank, whether it passed and what it
measured; each test here reports one check. Tolerances and what they guard are stated in ``parallel_checks.py``
(fp32: loss 1e-5, gradients 1e-4 of each parameter's largest gradient entry, measured <= 9e-6; bf16: at most twice
the one-process bf16 run's own error against fp32). A negative control proves the comparison fails on a silently
scaled gradient (pytorch #162338).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.models import parallel_state
from tests.models.parallel_cases import MODES, MODES_2D, TRITON_MODES
from tests.models.parallel_checks import BAD_INPUTS
from tests.models.parallel_launch import torchrun

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

EQUIVALENCE = [f"{mode}/{case}" for mode, (*_, cases) in MODES.items() for case in cases]
TRITON = ["triton/dtensor_probe"] + [f"triton/{mode}/{case}" for mode, cases in TRITON_MODES.items() for case in cases]
OTHERS = [
    "negative_control/fsdp_grad_sum",
    "fsdp_bf16/fp32_residual_between_blocks",
    "fsdp/generate_after_unshard",
]
BAD = [f"bad_input/{name}" for name in BAD_INPUTS]
STATE = [f"state/{name}" for name in parallel_state.STATE_CHECKS]


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """The one 2-process launch; first a one-process DCP checkpoint for it to load."""
    ckpt = tmp_path_factory.mktemp("parallel")
    parallel_state.save_one_process(ckpt)
    proc = torchrun(HERE / "parallel_checks.py", str(ckpt / "results.json"), str(ckpt))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads((ckpt / "results.json").read_text()), ckpt


def passed(launch: tuple[dict, Path], name: str) -> None:
    results, _ = launch
    for rank, result in enumerate(results[name]):
        assert result["ok"], f"{name}, rank {rank}: {result['detail']}\n{result.get('traceback', '')}"


def test_every_check_reports(launch: tuple[dict, Path]) -> None:
    assert sorted(launch[0]) == sorted(EQUIVALENCE + TRITON + OTHERS + BAD + STATE)


@pytest.mark.parametrize("name", EQUIVALENCE)
def test_sharded_training_matches_one_process(launch: tuple[dict, Path], name: str) -> None:
    """Losses and every parameter's gradient over 3 optimizer steps (mode/case: see parallel_cases.py)."""
    passed(launch, name)


def test_negative_control_a_scaled_gradient_fails_the_comparison(launch: tuple[dict, Path]) -> None:
    passed(launch, "negative_control/fsdp_grad_sum")


def test_mixed_precision_keeps_an_fp32_residual_stream_between_blocks(launch: tuple[dict, Path]) -> None:
    passed(launch, "fsdp_bf16/fp32_residual_between_blocks")


def test_generate_under_fsdp_after_unshard(launch: tuple[dict, Path]) -> None:
    passed(launch, "fsdp/generate_after_unshard")


@pytest.mark.parametrize("name", TRITON)
def test_fused_triton_norms_sharded(launch: tuple[dict, Path], name: str) -> None:
    """The fused Triton norms (interpreter) under FSDP2 (plain tensors) and under TP / TP+SP (DTensors: the kernels
    on each rank's rows, the parameter gradients reduced by DTensor), against one process."""
    passed(launch, name)


@pytest.mark.parametrize("name", BAD)
def test_bad_input_raises_on_every_rank_before_any_collective(launch: tuple[dict, Path], name: str) -> None:
    passed(launch, name)


@pytest.mark.parametrize("name", STATE)
def test_state_dicts_and_dcp_checkpoints_between_layouts(launch: tuple[dict, Path], name: str) -> None:
    passed(launch, name)


def test_dcp_checkpoint_of_two_processes_loads_into_one_process(launch: tuple[dict, Path]) -> None:
    """FSDP2 over 2 ranks saved model + AdamW with DCP; one process without a process group loads it bit for bit."""
    assert parallel_state.load_one_process(launch[1]) == []


def test_two_dimensional_mesh_on_four_processes(tmp_path: Path) -> None:
    """FSDP2 x tensor parallelism on a true 2 x 2 mesh, every case (4 gloo processes: ~25 s on 2 cores)."""
    proc = torchrun(HERE / "parallel_checks.py", str(tmp_path / "results.json"), str(tmp_path), nproc=4, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert sorted(results) == sorted(f"{m}/{c}" for m, (*_, cases) in MODES_2D.items() for c in cases)
    for name in results:
        passed((results, tmp_path), name)
