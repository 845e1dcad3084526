"""Muon for the hidden matrices, AdamW for everything else, stepped, zeroed and checkpointed as one optimizer.

Muon (Jordan et al. 2024; ``torch.optim.Muon``) orthogonalises each 2-D update by Newton-Schulz iterations; its
docs, and the norm x optimizer study (Abouzeid 2026, arXiv 2604.01563) that pairs it with AdamW, give it the 2-D
weights of the hidden layers only: the embeddings, the LM head, norms, gains, biases and every other non-matrix
parameter go to AdamW. ``muon_split`` makes that split for a ``GPT``: the weights of the ``nn.Linear`` layers inside
``model.blocks`` (q/k/v, output, gate, MLP) to Muon, the rest to AdamW (weight decay on its 2-D ones only, as
``lnblocks.study``'s AdamW). A fused matrix (``attn.qkv``, a gated ``mlp.fc1``) is one Muon matrix.

``build_muon`` returns an ``OptimizerPair``: ``step``, ``zero_grad``, ``param_groups`` (Muon's groups, then AdamW's;
each keeps its peak rate in ``initial_lr``, so a schedule sets ``group["lr"] = group["initial_lr"] * factor``),
``state_dict`` / ``load_state_dict`` (both optimizers' states: a resumed run continues bit for bit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from lnblocks.config import check_float, check_int


def muon_split(model: nn.Module) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """``(muon, adamw)`` named parameters of ``model`` (each parameter once, tied ones under their first name):
    2-D ``nn.Linear`` weights inside ``model.blocks`` to Muon, everything else to AdamW."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.Module):
        raise TypeError(f"model must have its residual blocks in model.blocks (a GPT), got {type(model).__name__}")
    hidden = {id(m.weight) for m in blocks.modules() if isinstance(m, nn.Linear) and m.weight.dim() == 2}
    muon, adamw = [], []
    for name, p in model.named_parameters():  # named_parameters yields a shared parameter once
        if p.requires_grad:
            (muon if id(p) in hidden else adamw).append((name, p))
    return muon, adamw


class OptimizerPair:
    """Two optimizers over disjoint parameters, used as one: ``step``, ``zero_grad``, ``param_groups``,
    ``state_dict`` and ``load_state_dict`` act on both (``muon`` first, then ``adamw``)."""

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer) -> None:
        for name, opt in (("muon", muon), ("adamw", adamw)):
            if not isinstance(opt, torch.optim.Optimizer):
                raise TypeError(f"{name} must be a torch.optim.Optimizer, got {type(opt).__name__}")
        self.muon, self.adamw = muon, adamw
        for group in self.param_groups:
            group.setdefault("initial_lr", group["lr"])

    @property
    def optimizers(self) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
        return self.muon, self.adamw

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Both optimizers' groups (the same dicts: setting ``lr`` here sets it there)."""
        return [*self.muon.param_groups, *self.adamw.param_groups]

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """One step of both; a ``closure`` is evaluated once (with grad enabled) and its loss returned."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or set(state_dict) != {"muon", "adamw"}:
            got = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ValueError(f"state_dict must be an OptimizerPair's, with keys ['adamw', 'muon'], got {got}")
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])

    def __repr__(self) -> str:
        return f"OptimizerPair(\n  muon={self.muon!r},\n  adamw={self.adamw!r}\n)"


def build_muon(
    model: nn.Module,
    *,
    lr: float,
    adamw_lr: float | None = None,
    weight_decay: float = 0.1,
    adamw_weight_decay: float = 0.01,
    momentum: float = 0.95,
    nesterov: bool = True,
    ns_steps: int = 5,
    adjust_lr_fn: str | None = None,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
) -> OptimizerPair:
    """Muon (``lr``, ``weight_decay``, ``momentum``, ``nesterov``, ``ns_steps``, ``adjust_lr_fn``: ``None`` /
    ``"original"`` scales by ``sqrt(max(1, rows / cols))``, ``"match_rms_adamw"`` by ``0.2 sqrt(max(rows, cols))``
    so that AdamW's rate and decay carry over; torch's defaults) on ``muon_split``'s matrices, AdamW (``adamw_lr``,
    default ``lr``; ``betas``, ``eps``; ``adamw_weight_decay`` on its 2-D parameters, none on 1-D ones) on the rest."""
    lr = check_float("lr", lr, lo=0, lo_open=True)
    adamw_lr = lr if adamw_lr is None else check_float("adamw_lr", adamw_lr, lo=0, lo_open=True)
    for name, value in (("weight_decay", weight_decay), ("adamw_weight_decay", adamw_weight_decay)):
        check_float(name, value, lo=0)
    ns_steps = check_int("ns_steps", ns_steps)
    muon_params, adamw_params = muon_split(model)
    if not muon_params:
        raise ValueError("the model has no 2-D nn.Linear weights in model.blocks for Muon")
    muon = torch.optim.Muon(
        [p for _, p in muon_params],
        lr=lr,
        weight_decay=weight_decay,
        momentum=momentum,
        nesterov=nesterov,
        ns_steps=ns_steps,
        adjust_lr_fn=adjust_lr_fn,
    )
    groups = [
        {"params": [p for _, p in adamw_params if p.dim() >= 2], "weight_decay": adamw_weight_decay},
        {"params": [p for _, p in adamw_params if p.dim() < 2], "weight_decay": 0.0},
    ]
    adamw = torch.optim.AdamW([g for g in groups if g["params"]], lr=adamw_lr, betas=betas, eps=eps)
    return OptimizerPair(muon, adamw)
