"""``snapshot(model)``: everything a patcher could change, to prove that a refused call changed nothing."""

from __future__ import annotations

from typing import Any

from torch import nn


def snapshot(model: nn.Module) -> tuple[Any, ...]:
    """Per module: its class and the identity of every instance attribute (forwards, hooks, parameter dicts,
    lnblocks' own keys); and every parameter and buffer by identity and value."""
    modules = {name: (type(m), {k: id(v) for k, v in vars(m).items()}) for name, m in model.named_modules()}
    tensors = {k: (id(v), v.detach().clone()) for k, v in [*model.named_parameters(), *model.named_buffers()]}
    return modules, {k: i for k, (i, _) in tensors.items()}, _Values({k: t for k, (_, t) in tensors.items()})


class _Values(dict):
    """Tensor values compared with ``torch.equal`` (a dict of tensors cannot be compared with ``==``)."""

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, dict)
            and self.keys() == other.keys()
            and all(
                v.shape == other[k].shape and v.dtype == other[k].dtype and v.equal(other[k]) for k, v in self.items()
            )
        )

    __hash__ = None  # type: ignore[assignment]
