"""``chunked_loss=True``: an HF causal LM's training loss through lnblocks' chunked LM head, never holding the
``(B, T, V)`` logits (at Llama 3's 128,256 tokens they and their gradient are the largest tensors of a step).

The model's own forward runs, as transformers wrote it; three per-instance callables (reversible, as norms are
patched: ``lnblocks.hf.install``) change what happens when it is called with ``labels``:

- the model's ``forward`` notes the labels and the loss keywords of the call (``num_items_in_batch``,
  ``ignore_index``, ``shift_labels``, as ``ForCausalLMLoss`` takes them) for the duration of the call;
- the head's ``forward`` (``lm_head``: a bias-free ``nn.Linear``; each copy in a PEFT ``ModulesToSaveWrapper``)
  computes the loss from the hidden states it is given, with the weight as it is inside the head's own call (under
  FSDP2 the weight FSDP gathered for that call: no second full copy), and returns the logits of the last position
  only, shape ``(B, 1, V)``: the model's forward maps them (soft-capping, a scale) and returns them, as generation
  would compute them;
- the model's ``loss_function`` (transformers' ``loss_function`` property reads the instance's ``_loss_function``)
  returns that loss where the forward asks for it, so what the forward adds to it (MoE auxiliary losses) is added.

The loss is ``ForCausalLMLoss``'s: labels shifted left (padded with ``ignore_index``) unless ``shift_labels`` is
given, the mean over the counted positions, or with ``num_items_in_batch`` (the Trainer under gradient
accumulation) the sum divided by it; the logits mapped per chunk as the forward maps them (``lnblocks.hf.head_source``
checks the forward's code). Without a logit map it is ``lnblocks.models.lm_head.lm_head_loss``, with one
``lnblocks.models.capped_loss.mapped_lm_head_loss``. Calls without labels, and every call of ``model.loss_function``
outside a labelled forward, are exactly as before.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import types
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnblocks.blocks import softcap
from lnblocks.hf.install import BoundToModule
from lnblocks.hf.record import LOSS_KEY, LossRecord, loss_record_of
from lnblocks.hf.wrappers import hooked_by_accelerate, wrapped_copies
from lnblocks.models.capped_loss import mapped_lm_head_loss
from lnblocks.models.lm_head import check_targets, lm_head_loss

LOSS_KWARGS = ("num_items_in_batch", "ignore_index", "shift_labels")  # what ForCausalLMLoss reads from the kwargs


@dataclass(eq=False)
class _Request:
    """One labelled forward of ``model``: its labels and loss keywords, then the loss its head computed."""

    model: nn.Module
    labels: Tensor
    options: dict[str, Any]
    loss: Tensor | None = None
    used: bool = False


_ACTIVE: contextvars.ContextVar[_Request | None] = contextvars.ContextVar("lnblocks_chunked_loss", default=None)


# ---- the loss ----------------------------------------------------------------------------------------------------
def _value(model: nn.Module, path: str) -> Any:
    return functools.reduce(getattr, path.split("."), model)


def _apply(logits: Tensor, steps: tuple[tuple[str, Any], ...]) -> Tensor:
    """The forward's own ops on a chunk of logits, in its order (``head_source.HeadForm``)."""
    for kind, value in steps:
        if kind == "float":
            logits = logits.float()
        elif kind == "mul":
            logits = logits * value  # Cohere: `logits = logits * self.logit_scale`
        elif kind == "div":
            logits = logits / value  # Granite: `logits = logits / self.config.logits_scaling`
        else:  # the three statements of Gemma 2's soft-capping: / cap, torch.tanh, * cap
            logits = softcap(logits, value)
    return logits


def logit_map_of(model: nn.Module, steps: tuple[tuple[str, str], ...]) -> functools.partial | None:
    """The elementwise map ``model``'s forward applies to the logits now (the values it reads now), or None where
    it applies none (``.float()`` alone: the loss's own ``.float()`` does the same)."""
    values = tuple((kind, _value(model, path) if path else None) for kind, path in steps)
    values = tuple((k, v) for k, v in values if not (k == "softcap" and v is None))  # `if cap is not None`
    if all(k == "float" for k, _ in values):
        return None
    return functools.partial(_apply, steps=values)


def causal_lm_loss(
    model: nn.Module, steps: tuple[tuple[str, str], ...], hidden: Tensor, weight: Tensor, request: _Request
) -> Tensor:
    """``ForCausalLMLoss(map(hidden @ weight.T), labels, ...)`` of ``request``, in chunks (see the module docstring)."""
    opts = request.options
    ignore_index = opts.get("ignore_index", -100)
    num_items = opts.get("num_items_in_batch")
    shift = opts.get("shift_labels")
    if shift is None:  # tokens < n predict n, as ForCausalLMLoss shifts
        shift = F.pad(request.labels, (0, 1), value=ignore_index)[..., 1:]
    if type(weight) not in (Tensor, nn.Parameter) and not torch.compiler.is_compiling():
        raise TypeError(
            f"chunked_loss: the head's weight inside its call is a {type(weight).__name__} (a tensor-parallel "
            "lm_head?): the chunked loss needs the whole weight there, as FSDP2 gathers it; patch without chunked_loss"
        )
    vocab = model.config.vocab_size
    if weight.shape[0] != vocab:
        raise ValueError(f"chunked_loss: the head has {weight.shape[0]} outputs but config.vocab_size is {vocab}")
    lead = tuple(hidden.shape[:-1])
    what = "shift_labels" if opts.get("shift_labels") is not None else "labels"
    if shift.numel() != hidden.numel() // max(hidden.shape[-1], 1):
        raise ValueError(
            f"chunked_loss: {what} of shape {tuple(shift.shape)} do not match the {lead} positions the head is given"
        )
    targets = check_targets(shift.to(hidden.device).reshape(lead), lead, vocab, ignore_index, name=what)
    reduction = "sum" if num_items is not None else "mean"
    logit_map = logit_map_of(model, steps)
    options = {"ignore_index": ignore_index, "reduction": reduction}
    if logit_map is None:
        loss, _ = lm_head_loss(hidden, weight, targets, **options)
    else:
        loss, _ = mapped_lm_head_loss(hidden, weight, targets, logit_map, **options)
    if num_items is not None:  # ForCausalLMLoss's sum, then the division
        loss = loss / (num_items.to(loss.device) if torch.is_tensor(num_items) else num_items)
    return loss


# ---- the three callables -----------------------------------------------------------------------------------------
def _plain(module: nn.Module, saved: Any) -> Any:
    return saved if saved is not None else types.MethodType(type(module).forward, module)


class LossForward(BoundToModule):
    """The causal LM's forward: its own, with the call's labels noted for its head (see the module docstring)."""

    __slots__ = ()

    @property
    def __signature__(self) -> inspect.Signature:  # the model's own (the Trainer reads it to pick dataset columns)
        return inspect.signature(types.MethodType(type(self.module()).forward, self.module()))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        model, record = self.module(), self.record
        forward = _plain(model, record.saved_forward)
        at = record.labels_at
        labels = kwargs.get("labels") if at is None or len(args) <= at else args[at]
        if labels is None:
            return forward(*args, **kwargs)
        request = _Request(model, labels, {k: kwargs[k] for k in LOSS_KWARGS if k in kwargs})
        token = _ACTIVE.set(request)
        try:
            return forward(*args, **kwargs)
        finally:
            _ACTIVE.reset(token)


@dataclass(eq=False)
class HeadRecord:
    """A head whose forward computes the chunked loss: accelerate's ``_old_forward`` it replaced (None without)."""

    saved_forward: Any = None


class HeadForward(BoundToModule):
    """The head's forward: in a labelled forward of the model it heads, the chunked loss and the last position's
    logits; otherwise its own forward."""

    __slots__ = ()

    def __call__(self, hidden_states: Tensor) -> Tensor:
        head = self.module()
        forward = _plain(head, self.record.saved_forward)
        request = _ACTIVE.get()
        if request is None or request.loss is not None or request.used or not _heads(request.model, head):
            return forward(hidden_states)
        model = request.model
        loss = causal_lm_loss(model, loss_record_of(model).logit_map, hidden_states, head.weight, request)
        last = hidden_states[:, -1:, :] if hidden_states.dim() == 3 else hidden_states[-1:]  # (B, 1, C)
        logits = forward(last)  # (B, 1, V)
        request.loss = _JoinedToHead.apply(loss, logits) if loss.requires_grad and logits.requires_grad else loss
        return logits


class _JoinedToHead(torch.autograd.Function):
    """The loss, joined in the graph to the head call's output: its backward also sends a zero gradient into that
    output, so the head module's backward hooks run before the loss's own backward. FSDP2 unshards a head it
    resharded after the forward in such a hook; the recomputing route (a logit map) needs the weight then."""

    @staticmethod
    def forward(ctx: Any, loss: Tensor, logits: Tensor) -> Tensor:  # type: ignore[override]
        ctx.logits = (logits.shape, logits.dtype, logits.device)
        return loss.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        shape, dtype, device = ctx.logits
        return grad, torch.zeros(shape, dtype=dtype, device=device)


class LossFunction(BoundToModule):
    """The causal LM's ``loss_function``: the chunked loss of the labelled forward that asks for it; else the loss
    function the model had (``ForCausalLMLoss``)."""

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        model = self.module()
        request = _ACTIVE.get()
        if request is None or request.model is not model or request.used:
            return self.record.loss_function(*args, **kwargs)
        if request.loss is None:
            head = self.record.head
            raise RuntimeError(
                f"chunked_loss: {type(model).__name__}.{head} did not compute the loss in this forward (was {head} "
                "replaced or wrapped after patching, e.g. by a LoRA adapter? unpatch_norms(model) and patch again)"
            )
        loss, request.loss, request.used = request.loss, None, True
        return loss


def _heads(model: nn.Module, head: nn.Module) -> bool:
    """``head`` is ``model``'s head, or a copy a PEFT wrapper in its place runs."""
    record = loss_record_of(model)
    current = model._modules.get(record.head) if record is not None else None
    return current is not None and any(c is head for c in wrapped_copies(current))


# ---- install / uninstall -----------------------------------------------------------------------------------------
def _set_forward(module: nn.Module, forward: Any) -> Any:
    """Put ``forward`` on ``module`` (accelerate's ``_old_forward`` under its hook); returns what it replaced there
    (None: the class's forward)."""
    if hooked_by_accelerate(module):
        saved = module.__dict__["_old_forward"]
        module.__dict__["_old_forward"] = forward
        return saved
    module.__dict__["forward"] = forward
    return None


def _reset_forward(module: nn.Module, kind: type, saved: Any) -> None:
    if isinstance(module.__dict__.get("forward"), kind):
        del module.__dict__["forward"]
    elif isinstance(module.__dict__.get("_old_forward"), kind):
        module.__dict__["_old_forward"] = saved if saved is not None else types.MethodType(type(module).forward, module)


def _labels_at(cls: type) -> int | None:
    params = list(inspect.signature(cls.forward).parameters.values())[1:]  # without self
    at = next((i for i, p in enumerate(params) if p.name == "labels"), None)
    return at if at is not None and params[at].kind == inspect.Parameter.POSITIONAL_OR_KEYWORD else None


def install_loss(model: nn.Module, head: str, logit_map: tuple[tuple[str, str], ...]) -> None:
    """Make ``model`` compute its labelled loss through the chunked head (checked by ``plan_loss`` before)."""
    record = LossRecord(head, logit_map, model.loss_function, _labels_at(type(model)))
    record.saved_loss_function = model.__dict__.get("_loss_function")
    for copy in wrapped_copies(model._modules[head]):
        if not isinstance(copy.__dict__.get("forward"), HeadForward):
            head_record = HeadRecord()
            head_record.saved_forward = _set_forward(copy, HeadForward(copy, head_record))
    model.__dict__["_loss_function"] = LossFunction(model, record)
    record.saved_forward = _set_forward(model, LossForward(model, record))
    model.__dict__[LOSS_KEY] = record


def uninstall_loss(model: nn.Module) -> None:
    """Remove exactly what ``install_loss`` added (heads put in place since included)."""
    record: LossRecord = model.__dict__.pop(LOSS_KEY)
    _reset_forward(model, LossForward, record.saved_forward)
    if record.saved_loss_function is None:
        model.__dict__.pop("_loss_function", None)
    else:
        model.__dict__["_loss_function"] = record.saved_loss_function
    current = model._modules.get(record.head)
    for copy in wrapped_copies(current) if current is not None else []:
        uninstall_head(copy)


def uninstall_head(module: nn.Module) -> None:
    """Give a head its own forward back (a no-op on a module whose forward is not a ``HeadForward``)."""
    ours = module.__dict__.get("forward")
    ours = ours if isinstance(ours, HeadForward) else module.__dict__.get("_old_forward")
    if isinstance(ours, HeadForward):
        _reset_forward(module, HeadForward, ours.record.saved_forward)


def is_head(module: nn.Module) -> bool:
    """True if ``module``'s forward is a chunked-loss head's."""
    return isinstance(module.__dict__.get("forward"), HeadForward) or isinstance(
        module.__dict__.get("_old_forward"), HeadForward
    )
