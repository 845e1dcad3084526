"""Shared helpers for block and model tests."""

from __future__ import annotations

import torch
from torch import nn


def randomize_(module: nn.Module, scale: float = 0.2) -> nn.Module:
    """Perturb every parameter, so that norm gains, biases and gates are not at their trivial init values."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * scale)
    return module
