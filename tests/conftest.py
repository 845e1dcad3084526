"""Test-wide set-up: Triton kernels run in the interpreter on CPU, seeds are fixed, threads are bounded."""

import os

# Must be set before triton decorates any kernel (lnblocks.kernels is imported lazily, after this).
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)  # two workers on two cores: no oversubscription


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
