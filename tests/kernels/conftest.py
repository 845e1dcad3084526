"""Kernel tests: every torch.empty is NaN-filled, so an output element or dW partial row a kernel forgets to write
shows up as NaN (``fill_uninitialized_memory`` works with deterministic algorithms on)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _poison_uninitialized_memory():
    previous = torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    assert torch.empty(4).isnan().all(), "uninitialised memory is not poisoned"
    yield
    torch.use_deterministic_algorithms(previous[0])
    torch.utils.deterministic.fill_uninitialized_memory = previous[1]
