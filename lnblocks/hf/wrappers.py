"""What other tools put around a model's modules, as lnblocks.hf meets it: PEFT's ``PeftModel`` and
``ModulesToSaveWrapper``, and accelerate's device hooks. Duck-typed: neither package is imported here.

- accelerate's ``add_hook_to_module`` keeps the module's forward as ``_old_forward``, sets ``_hf_hook`` and puts a
  wrapper calling both into the instance's ``forward``;
- PEFT's ``modules_to_save`` replaces a module (a norm that is trained fully next to LoRA adapters) by a
  ``ModulesToSaveWrapper`` holding the frozen ``original_module`` and one trainable copy per adapter in
  ``modules_to_save``; its forward passes ``*args, **kwargs`` on to the active one. Liger-Kernel patches the copies
  inside the wrapper the same way (``monkey_patch.py``).
"""

from __future__ import annotations

import re

from torch import nn
from torch.nn.modules import module as _torch_module

from lnblocks.hf.record import RECORD_KEY

_PEFT_SUFFIX = re.compile(r"\.(?:original_module|modules_to_save\.[^.]+)$")


def hooked_by_accelerate(module: nn.Module) -> bool:
    """accelerate's ``add_hook_to_module`` convention: ``forward`` wraps ``_old_forward`` and ``_hf_hook`` is set."""
    return "forward" in module.__dict__ and "_old_forward" in module.__dict__ and hasattr(module, "_hf_hook")


def is_modules_to_save_wrapper(module: nn.Module) -> bool:
    return "original_module" in module._modules and "modules_to_save" in module._modules


def wrapped_copies(module: nn.Module) -> list[nn.Module]:
    """The modules a ``ModulesToSaveWrapper`` may run (the original and each adapter's copy); else ``[module]``."""
    if not is_modules_to_save_wrapper(module):
        return [module]
    return [module._modules["original_module"], *module._modules["modules_to_save"].children()]


def takes_residual(module: nn.Module) -> bool:
    """True if calling ``module(x, residual=r)`` runs an lnblocks norm, whichever copy a PEFT wrapper picks, and no
    hook would see the call.

    Hooks see a call's arguments and result, so a fused call ``norm(x, residual=r)`` would show them ``x`` instead of
    the norm's input ``x + r``: any forward or backward hook on the module (or a copy a PEFT wrapper runs), or a global
    one (``torch.nn.modules.module.register_module_forward_pre_hook`` and its kin), makes this False. Runs at every
    fused call, so it reads the hook dicts directly.
    """
    g = _torch_module
    if g._global_forward_pre_hooks or g._global_forward_hooks or g._global_backward_pre_hooks:
        return False
    if g._global_backward_hooks or _hooked(module):
        return False
    if not is_modules_to_save_wrapper(module):
        return RECORD_KEY in module.__dict__
    return all(RECORD_KEY in m.__dict__ and not _hooked(m) for m in wrapped_copies(module))


def _hooked(module: nn.Module) -> bool:
    return bool(
        module._forward_pre_hooks or module._forward_hooks or module._backward_pre_hooks or module._backward_hooks
    )


def role_name(name: str) -> str:
    """The name a norm has in the base model: ``...input_layernorm.modules_to_save.default`` -> ``...input_layernorm``
    (role maps match the tail of a name)."""
    return _PEFT_SUFFIX.sub("", name)


def is_peft_model(model: nn.Module) -> bool:
    """A PEFT ``PeftModel`` (or a model it wraps with LoRA layers): it carries ``peft_config``."""
    return hasattr(model, "peft_config") and isinstance(getattr(model, "peft_config", None), dict)


def base_model_name(model: nn.Module) -> str:
    """``PeftModel(LlamaForCausalLM)`` for a PEFT model, the class name otherwise."""
    if not is_peft_model(model):
        return type(model).__name__
    base = getattr(getattr(model, "base_model", None), "model", None)
    return f"{type(model).__name__}({type(base).__name__})" if isinstance(base, nn.Module) else type(model).__name__
