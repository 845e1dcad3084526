"""``chunked_loss=True``, the select step: find the causal LM in a model (a PEFT model's base) and check that its
loss can run through the chunked LM head (``lnblocks.hf.chunked_loss``), changing nothing.

The checks, each refusal naming its reason: the model's ``forward`` has the form ``lnblocks.hf.head_source`` reads;
its ``loss_function`` is transformers' ``ForCausalLMLoss``; its head is a direct submodule, a bias-free
``torch.nn.Linear`` (each copy a PEFT ``ModulesToSaveWrapper`` holds), whose outputs are ``config.vocab_size``; no
other tool replaced the model's or the head's forward on the instance (accelerate's device hooks are kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from lnblocks.hf.chunked_loss import LossForward, LossFunction, is_head
from lnblocks.hf.head_source import read_head
from lnblocks.hf.wrappers import hooked_by_accelerate, wrapped_copies


@dataclass
class LossPlan:
    """What ``plan_loss`` found: the causal LM (``name`` in the patched model), its head's attribute name and its
    logit map; or ``reason`` why there is none to patch."""

    name: str = ""
    module: nn.Module | None = None
    head: str = ""
    logit_map: tuple[tuple[str, str], ...] = ()
    reason: str = ""
    tied: bool = False
    copies: list[nn.Module] = field(default_factory=list)


def _causal_lm(model: nn.Module) -> tuple[str, nn.Module] | None:
    """The outermost module of ``model`` that is a transformers model with an LM head (PEFT: the base model)."""
    for name, module in model.named_modules():
        if hasattr(type(module), "loss_function") and callable(getattr(type(module), "get_output_embeddings", None)):
            try:
                head = module.get_output_embeddings()
            except (NotImplementedError, AttributeError):
                continue
            if isinstance(head, nn.Module):
                return name, module
    return None


def _is_causal_lm_loss(fn: Any) -> bool:
    return getattr(fn, "__qualname__", "") == "ForCausalLMLoss" and fn.__module__ == "transformers.loss.loss_utils"


def _head_reason(name: str, copy: nn.Module) -> str:
    """Why ``copy`` cannot be the chunked head ('' if it can)."""
    if type(copy).forward is not nn.Linear.forward or not isinstance(getattr(copy, "weight", None), Tensor):
        cls = f"{type(copy).__module__}.{type(copy).__qualname__}"
        return (
            f"its {name} is a {cls}, not a torch.nn.Linear (an adapter on the head, a quantized or non-linear head): "
            "the chunked loss computes hidden @ weight.T only"
        )
    if copy.bias is not None:
        return f"its {name} has a bias, which the chunked loss does not add"
    if "forward" in copy.__dict__ and not hooked_by_accelerate(copy) and not is_head(copy):
        return f"the forward of its {name} is already replaced on the instance (another patcher or hook)"
    return ""


def plan_loss(model: nn.Module) -> LossPlan:
    """Find the causal LM in ``model`` and check that its loss can run through the chunked head (changes nothing)."""
    found = _causal_lm(model)
    if found is None:
        return LossPlan(reason="no transformers model with an LM head (get_output_embeddings) in it")
    name, lm = found
    plan = LossPlan(name=name, module=lm)
    head = lm.get_output_embeddings()
    plan.head = next((k for k, m in lm._modules.items() if m is head), "")
    if not plan.head:
        where = next((n for n, m in lm.named_modules() if m is head), "?")
        plan.reason = (
            f"its output embedding {where} ({type(head).__name__}) is not a direct submodule: a head of more than "
            "one layer (a transform before the output projection) is not reproduced"
        )
        return plan
    form = read_head(type(lm), plan.head)
    plan.logit_map, plan.reason = form.steps, form.reason
    if plan.reason:
        return plan
    loss_function = lm.loss_function
    if not (_is_causal_lm_loss(loss_function) or isinstance(loss_function, LossFunction)):
        plan.reason = (
            f"its loss_function is {getattr(loss_function, '__qualname__', type(loss_function).__name__)}, not "
            "transformers' ForCausalLMLoss (a custom loss_type or loss function)"
        )
        return plan
    replaced = lm.__dict__.get("forward")
    if replaced is not None and not hooked_by_accelerate(lm) and not isinstance(replaced, LossForward):
        plan.reason = "its forward is already replaced on the instance (another patcher or hook)"
        return plan
    plan.copies = wrapped_copies(head)
    plan.reason = next((r for r in (_head_reason(plan.head, c) for c in plan.copies) if r), "")
    if plan.reason:
        return plan
    weight, vocab = plan.copies[0].weight, lm.config.vocab_size
    if weight.shape[0] != vocab:
        plan.reason = f"its {plan.head} has {weight.shape[0]} outputs but config.vocab_size is {vocab}"
    try:
        embed = lm.get_input_embeddings()
    except (NotImplementedError, AttributeError):
        embed = None
    plan.tied = getattr(embed, "weight", None) is weight
    return plan
