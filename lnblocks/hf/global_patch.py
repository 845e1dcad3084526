"""``patch_transformers``: patch the norms of every HF model built from now on (Trainer scripts, pipelines).

Liger-Kernel swaps norm classes in the ``modeling_*`` modules, which breaks ``isinstance`` and misses models built
before the call (Liger PR #170), and cannot be scoped (Liger #242). Here the hook sits on
``PreTrainedModel.post_init``, which every HF model runs at the end of its ``__init__``: the freshly built model is
patched per instance by ``patch_norms``, before ``from_pretrained`` loads the weights (the patched modules share
their Parameter dicts, so the loaded weights are the ones used). Undo with ``unpatch_transformers()`` or use the
returned handle as a context manager; models built meanwhile stay patched until ``unpatch_norms(model)``.

``fuse_residual=True`` fuses the residual adds of every model built whose decoder layers can be fused, and patches
the others' norms alone (logged at INFO): the hook meets every model built, sub-models (a vision tower, an encoder)
included, and an unfusable one must not make its construction fail.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from lnblocks._optional import require
from lnblocks.hf.families import ROLES
from lnblocks.hf.patch import PatchOptions, plan_patch

_state: dict[str, Any] = {"options": None, "original": None}  # the PatchOptions in force, the unhooked post_init


def _roles_only(arg: str | Iterable[str] | None, what: str) -> tuple[str, ...] | None:
    if arg is None:
        return None
    items = (arg,) if isinstance(arg, str) else tuple(arg)
    bad = [i for i in items if i not in ROLES]
    if bad:
        raise ValueError(
            f"{what}: patch_transformers selects by role only (module names differ between a model and its "
            f"sub-models); unknown role(s) {bad}, valid roles: {list(ROLES)}. Use patch_norms for name patterns."
        )
    return items


def _hooked(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def post_init(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        options: PatchOptions | None = _state["options"]
        if options is not None:
            plan_patch(self, options).apply()
        return result

    post_init._lnblocks_hook = True  # type: ignore[attr-defined]
    return post_init


class TransformersPatch:
    """Handle returned by ``patch_transformers``; ``with patch_transformers(): ...`` undoes the hook on exit."""

    def __enter__(self) -> TransformersPatch:
        return self

    def __exit__(self, *exc: object) -> None:
        unpatch_transformers()


def patch_transformers(
    backend: str = "auto",
    include: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
    *,
    fuse_residual: bool = False,
    chunked_loss: bool = False,
    memory_efficient: bool = False,
) -> TransformersPatch:
    """Patch the norms of every ``transformers`` model constructed after this call (see ``patch_norms``).

    ``include``/``exclude`` take role names (``lnblocks.hf.ROLES``). ``fuse_residual=True`` also fuses the residual
    adds of the decoder layers that can be fused (a model with none is patched without, and logged). Calling it
    again replaces the options; the hook is installed once. Reversed by ``unpatch_transformers()`` or by leaving the
    ``with`` block. ``chunked_loss=True``: every causal LM built whose loss can run through the chunked LM head
    does (``lnblocks.hf.chunked_loss``); the others, sub-models included, keep their loss (logged at INFO).
    ``memory_efficient=True``: as in ``patch_norms`` (needs backend "auto" or "triton").
    """
    options = PatchOptions(
        backend,
        _roles_only(include, "include"),
        _roles_only(exclude, "exclude"),
        fuse_residual,
        on_empty="log",
        on_unfusable="log",
        chunked_loss=chunked_loss,
        on_unchunkable="log",
        memory_efficient=memory_efficient,
    )
    pretrained = require("transformers").PreTrainedModel
    if not getattr(pretrained.post_init, "_lnblocks_hook", False):
        _state["original"] = pretrained.post_init
        pretrained.post_init = _hooked(pretrained.post_init)
    _state["options"] = options
    return TransformersPatch()


def unpatch_transformers() -> bool:
    """Remove the hook installed by ``patch_transformers``; returns False if none was active."""
    active = _state["options"] is not None
    _state["options"] = None  # an inert hook stays only if someone wrapped post_init on top of ours
    original = _state["original"]
    if original is not None:
        pretrained = require("transformers").PreTrainedModel
        if getattr(pretrained.post_init, "_lnblocks_hook", False):
            pretrained.post_init = original
            _state["original"] = None
    return active
