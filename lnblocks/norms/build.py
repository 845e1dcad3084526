"""``build_norm``: the one way blocks, models, configs and the HF patcher construct a norm."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lnblocks.norms.kinds import Derf, GatedRMSNorm, L2Norm
from lnblocks.norms.modules import MODULE_TYPES, Norm
from lnblocks.norms.spec import NormSpec, norm_spec

# every kind's module: the torch.nn-style ones, and the kinds of the 2025-26 families
NORM_MODULES: dict[str, type[Norm]] = {
    **MODULE_TYPES,
    "gated_rmsnorm": GatedRMSNorm,
    "l2norm": L2Norm,
    "derf": Derf,
}


def build_norm(
    kind: str | NormSpec | dict[str, Any],
    /,
    dim: int | Sequence[int] | None,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    **options: Any,
) -> Norm:
    """Build a norm module from a kind name (``"layernorm"``, ``"rmsnorm"``, ``"gated_rmsnorm"``, ``"l2norm"``,
    ``"dyt"``, ``"derf"``, ``"scalenorm"``, ``"none"``), a family preset (``"llama"``, ``"gemma"``, ``"olmo2"``,
    ``"t5"``, ``"gpt2"``, ``"bert"``, ``"nemotron_h_gated"``, ...), a spec dataclass, or a config dict
    ``{"kind": ..., **options}``.

    ``options`` override spec fields (``build_norm("rmsnorm", 512, eps=1e-6, cast="llama")``); an unknown kind or
    option raises ``ValueError`` listing the valid ones, and so does a ``kind=`` option naming another kind.
    """
    spec = norm_spec(kind, **options)
    if dim is None and spec.kind != "none":
        raise ValueError(f"dim is required for norm kind {spec.kind!r}")
    return NORM_MODULES[spec.kind].from_spec(spec, dim, device=device, dtype=dtype)
