"""``lnblocks patch-check MODEL_DIR``: load a local HF model, patch its norms, and show what changed (nothing should).

Prints the patch report, the largest difference of the model's main output (``logits``, else
``last_hidden_state``) patched vs unpatched on fixed token ids, and the forward time ratio patched/unpatched
(median of interleaved runs, so both sides see the same machine load).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lnblocks._optional import require
from lnblocks.hf.patch import patch_norms, unpatch_norms

# largest |patched - unpatched| accepted, relative to max |unpatched|; the torch backend is bit-identical (0), the
# fused kernels round differently, within these
_TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _load(path: Path) -> nn.Module:
    transformers = require("transformers")
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    arch = (getattr(config, "architectures", None) or [None])[0]
    model_cls = getattr(transformers, arch, None) if isinstance(arch, str) and arch else None
    is_model = isinstance(model_cls, type) and issubclass(model_cls, transformers.PreTrainedModel)
    if model_cls is not None and not (is_model and getattr(model_cls, "config_class", None) is not None):
        raise ValueError(
            f"config.json's architectures names {arch!r}, which is not a transformers model class; name the "
            "model's class there (e.g. LlamaForCausalLM), or drop the key to load it with AutoModel"
        )
    if model_cls is None:  # a class transformers does not have (remote code): its base model
        model_cls = transformers.AutoModel
    return model_cls.from_pretrained(path, local_files_only=True)


def _inputs(model: nn.Module, device: torch.device, batch: int = 2, seq: int = 32) -> dict[str, torch.Tensor]:
    config = model.config
    vocab = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", 1000)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, min(int(vocab), 1000), (batch, seq), generator=g).to(device)
    inputs = {"input_ids": ids}
    if getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = ids[:, : seq // 2]
    return inputs


def _main_output(out: Any) -> tuple[str, torch.Tensor]:
    for key in ("logits", "last_hidden_state"):
        value = getattr(out, key, None)
        if isinstance(value, torch.Tensor):
            return key, value
    value = out[0] if isinstance(out, (tuple, list)) else out
    return "output[0]", value


def _time_forward(model: nn.Module, inputs: dict[str, torch.Tensor], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    with torch.inference_mode():
        model(**inputs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _one_line(err: BaseException) -> str:
    """``Type: message`` on one line (library messages span lines; the CLI prints one)."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _cannot_check(message: str) -> int:
    print(f"patch-check: {message}", file=sys.stderr)
    return 2


def patch_check(model_dir: str, backend: str = "auto", rounds: int = 5) -> int:
    """Patch the model in ``model_dir`` and compare with the original; returns 0 if the outputs match.

    Exit codes: 0 outputs match (within the dtype's tolerance), 1 they differ, 2 the folder cannot be checked (no
    model there, it cannot be loaded or run, transformers is missing); for 2 the reason is one line on stderr.
    """
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        return _cannot_check(f"{model_dir!r} is not a local HF model folder (no config.json)")
    try:
        require("transformers")
    except ImportError as err:
        return _cannot_check(str(err))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        model = _load(path).to(device).eval()
    except Exception as err:  # a config without weights, a bad config.json, truncated safetensors, ...
        return _cannot_check(f"cannot load the model in {model_dir!r}: {_one_line(err)}")
    inputs = _inputs(model, device)
    try:
        with torch.inference_mode():
            key, reference = _main_output(model(**inputs))
    except Exception as err:  # a model that needs more than token ids (images, audio)
        return _cannot_check(f"cannot run {type(model).__name__} on token ids: {_one_line(err)}")
    try:
        report = patch_norms(model, backend=backend)
    except (TypeError, ValueError) as err:
        return _cannot_check(_one_line(err))
    print(report)
    with torch.inference_mode():
        _, patched = _main_output(model(**inputs))

    times: dict[str, list[float]] = {"unpatched": [], "patched": []}
    for _ in range(rounds):  # interleaved: patched and unpatched see the same load
        times["patched"].append(_time_forward(model, inputs, device))
        unpatch_norms(model)
        times["unpatched"].append(_time_forward(model, inputs, device))
        patch_norms(model, backend=backend)
    ratio = statistics.median(times["patched"]) / statistics.median(times["unpatched"])

    diff = (patched.double() - reference.double()).abs().max().item()
    scale = max(reference.double().abs().max().item(), 1.0)
    tolerance = _TOLERANCE.get(reference.dtype, 1e-5) * scale
    verdict = "identical" if diff == 0 else ("within tolerance" if diff <= tolerance else "DIFFERENT")
    print(f"max |{key} patched - unpatched| = {diff:.3g} ({verdict}; {reference.dtype}, {device.type})")
    print(
        f"forward time patched / unpatched = {ratio:.3f} "
        f"(median of {rounds}: {statistics.median(times['patched']) * 1e3:.2f} ms vs "
        f"{statistics.median(times['unpatched']) * 1e3:.2f} ms)"
    )
    return 0 if diff <= tolerance else 1
