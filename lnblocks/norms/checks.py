"""Argument checks of the reference math (``lnblocks.norms.functional``), as ``torch.nn.functional`` makes them.

``normalized_shape`` must be non-empty and end x's shape, parameters must have that shape: never a broadcast over
something else; errors are ``ValueError``/``TypeError`` naming the argument. Modules check once per route
(``lnblocks.norms.routing``) with the same functions.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _is_int(d: object) -> bool:
    return isinstance(d, numbers.Integral) and not isinstance(d, bool)  # numpy ints too, as torch.nn.LayerNorm


def as_normalized_shape(normalized_shape: object, name: str = "normalized_shape") -> tuple[int, ...]:
    """``normalized_shape`` as a tuple of positive ints (an int, or a non-empty sequence of ints)."""
    if _is_int(normalized_shape):
        shape: tuple = (normalized_shape,)
    elif isinstance(normalized_shape, Sequence) and not isinstance(normalized_shape, str):
        shape = tuple(normalized_shape)
    else:
        shape = ()
    if not shape or not all(_is_int(d) for d in shape):
        raise TypeError(f"{name} must be an int or a non-empty sequence of ints, got {normalized_shape!r}")
    shape = tuple(int(d) for d in shape)
    if any(d <= 0 for d in shape):
        raise ValueError(f"{name} must have positive sizes, got {shape}")
    return shape


def check_float_tensor(name: str, t: object) -> None:
    """``t`` is a floating-point tensor of a dtype the math supports."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor (float16, bfloat16, float32, float64), got {t.dtype}")


def check_trailing(x: Tensor, shape: tuple[int, ...]) -> None:
    """``x``'s trailing dims are ``shape`` (what ``normalized_shape`` means)."""
    k = len(shape)
    if x.dim() < k or tuple(x.shape[-k:]) != shape:
        raise ValueError(f"x: expected trailing dimension(s) {shape} (normalized_shape), got shape {tuple(x.shape)}")


def check_param(name: str, t: object, shape: tuple[int, ...], what: str = "normalized_shape") -> None:
    """A parameter the math reads: None, or a floating-point tensor of exactly ``shape`` (no broadcasting)."""
    if t is None:
        return
    check_float_tensor(name, t)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape} ({what}), got {tuple(t.shape)}")


def checked_shape(x: Tensor, normalized_shape: object, **params: Tensor | None) -> tuple[int, ...]:
    check_float_tensor("x", x)
    shape = as_normalized_shape(normalized_shape)
    check_trailing(x, shape)
    for name, t in params.items():
        check_param(name, t, shape)
    return shape


def check_group_size(group_size: object, normalized_shape: tuple[int, ...]) -> int | None:
    """``group_size`` is None or a positive int dividing the normalised dims' element count."""
    if group_size is None:
        return None
    if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral) or group_size <= 0:
        raise ValueError(f"group_size must be a positive int or None, got {group_size!r}")
    numel = math.prod(normalized_shape)
    if numel % group_size:
        raise ValueError(f"group_size {group_size} must divide the {numel} normalised elements {normalized_shape}")
    return int(group_size)


def check_scalar_param(name: str, t: object) -> None:
    check_float_tensor(name, t)
    if t.numel() != 1:
        raise ValueError(f"{name}: expected a one-element tensor, got shape {tuple(t.shape)}")


def check_pointwise_args(x: Tensor, scalars: dict[str, Tensor], weight: Tensor | None, bias: Tensor | None) -> None:
    check_float_tensor("x", x)
    for name, t in scalars.items():
        check_scalar_param(name, t)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            check_float_tensor(name, t)
            k = t.dim()
            if k == 0 or x.dim() < k or t.shape != x.shape[-k:]:
                raise ValueError(f"{name}: expected the shape of x's trailing dimension(s), got {tuple(t.shape)} "
                                 f"for x of shape {tuple(x.shape)}")  # fmt: skip


def check_gate(gate: object, x: Tensor) -> None:
    """The gate is a floating tensor of exactly x's shape, on x's device (it is never broadcast)."""
    check_float_tensor("gate", gate)
    if gate.shape != x.shape:
        raise ValueError(f"gate: expected the shape of x {tuple(x.shape)}, got {tuple(gate.shape)} (no broadcasting)")
    if gate.device != x.device:
        raise ValueError(f"gate: expected device {x.device} (the device of x), got {gate.device}")
