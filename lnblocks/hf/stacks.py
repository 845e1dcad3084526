"""Entry points for the stacks HF models are trained in: a one-line loader and a ``transformers.Trainer`` callback.

``patch_norms`` itself already meets PEFT (``PeftModel``, ``ModulesToSaveWrapper``) and accelerate (``device_map``
hooks, offloading); these are the places users reach for, as with Liger-Kernel's ``AutoLigerKernelForCausalLM``
and ``TrainingArguments(use_liger_kernel=True)``:

    model = lnblocks.hf.from_pretrained("path/to/model", fuse_residual=True)        # load, then patch
    trainer = Trainer(model, args, callbacks=[lnblocks.hf.PatchNormsCallback()])    # patch what the Trainer trains

``chunked_loss=True`` in either also runs the labelled loss through the chunked LM head (``lnblocks.hf.chunked_loss``).

Both raise ``ValueError`` when there is no norm to patch (a model whose norm classes lnblocks does not recognise),
instead of training silently without lnblocks. transformers is imported only when they are used.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from typing import Any

from torch import nn

from lnblocks._optional import require
from lnblocks.config import check_bool
from lnblocks.hf.patch import PatchOptions, plan_patch, unpatch_norms
from lnblocks.hf.report import PatchReport

log = logging.getLogger("lnblocks.hf")


def from_pretrained(
    name_or_path: Any,
    *model_args: Any,
    model_class: Any = None,
    backend: str = "auto",
    fuse_residual: bool = False,
    include: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
    chunked_loss: bool = False,
    memory_efficient: bool = False,
    **kwargs: Any,
) -> nn.Module:
    """``model_class.from_pretrained(name_or_path, *model_args, **kwargs)`` with its norms patched by lnblocks.

    ``model_class``: a transformers model class (default ``AutoModelForCausalLM``). ``kwargs`` go to transformers
    unchanged (``dtype``, ``device_map``, ``attn_implementation``, ``local_files_only``, ...). The other options are
    ``patch_norms``'s; the patch report is logged (``logging.getLogger("lnblocks.hf")``, INFO) and returned again by
    ``patch_norms(model, <same options>)``.
    """
    extra = {"chunked_loss": chunked_loss, "memory_efficient": memory_efficient}
    options = PatchOptions(backend, include, exclude, fuse_residual, on_empty="raise", **extra)
    if model_class is None:
        model_class = require("transformers").AutoModelForCausalLM
    if not callable(getattr(model_class, "from_pretrained", None)):
        raise TypeError(f"model_class must be a transformers model class, got {model_class!r}")
    model = model_class.from_pretrained(name_or_path, *model_args, **kwargs)
    plan = plan_patch(model, options)
    plan.apply()
    log.info("%s", plan.report)
    return model


class _Options:
    """The options of a ``PatchNormsCallback``, checked when it is built (not at the first training step)."""

    def __init__(
        self,
        backend: str = "auto",
        fuse_residual: bool = False,
        include: str | Iterable[str] | None = None,
        exclude: str | Iterable[str] | None = None,
        unpatch_at_end: bool = False,
        chunked_loss: bool = False,
        memory_efficient: bool = False,
    ) -> None:
        options = {"on_empty": "raise", "chunked_loss": chunked_loss, "memory_efficient": memory_efficient}
        self.options = PatchOptions(backend, include, exclude, fuse_residual, **options)
        check_bool("unpatch_at_end", unpatch_at_end)
        self.unpatch_at_end = unpatch_at_end
        self.report: PatchReport | None = None

    def _apply(self, model: nn.Module | None) -> None:
        if model is None:
            return
        plan = plan_patch(model, self.options)
        plan.apply()
        self.report = plan.report


@functools.cache
def _callback_class() -> type:
    transformers = require("transformers")

    class PatchNormsCallback(_Options, transformers.TrainerCallback):
        """``Trainer(..., callbacks=[PatchNormsCallback(backend=..., fuse_residual=..., chunked_loss=...)])`` (and
        ``memory_efficient=``, each as in ``patch_norms``): the
        Trainer's model is patched when the Trainer is built and again when training starts (a ``model_init`` model,
        or options refused there, surface before the first step); ``unpatch_at_end=True`` restores it after
        training. ``report``: the latest ``PatchReport``."""

        def on_init_end(self, args: Any, state: Any, control: Any, model: nn.Module | None = None, **kw: Any) -> None:
            self._apply(model)

        def on_train_begin(
            self, args: Any, state: Any, control: Any, model: nn.Module | None = None, **kw: Any
        ) -> None:
            self._apply(model)

        def on_train_end(self, args: Any, state: Any, control: Any, model: nn.Module | None = None, **kw: Any) -> None:
            if self.unpatch_at_end and model is not None:
                unpatch_norms(model)

    PatchNormsCallback.__module__ = __name__
    PatchNormsCallback.__qualname__ = "PatchNormsCallback"
    return PatchNormsCallback


def __getattr__(name: str) -> Any:  # PatchNormsCallback subclasses transformers.TrainerCallback: built on first use
    if name == "PatchNormsCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
