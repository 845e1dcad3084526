"""Weight conversion between ``GPT`` and ``transformers`` (``GPT2LMHeadModel``, ``LlamaForCausalLM`` and the
Llama-shaped ``MistralForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``; ``Gemma2ForCausalLM`` through
``lnblocks.models.hf_gemma2``). transformers is imported lazily.

The weight map is one table per family of ``(lnblocks key, HF keys, transpose)``: several HF keys are concatenated
along rows (q/k/v into ``qkv``, gate/up into ``fc1``); GPT-2's ``Conv1D`` stores weights transposed.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from lnblocks._optional import require
from lnblocks.models.hf_configs import FAMILIES, config_diff, config_from_hf, family_of, hf_config, warn_fp32_only
from lnblocks.norms import MODEL_FAMILIES

M = TypeVar("M", bound=nn.Module)  # the GPT class: GPT.from_hf passes itself, so this module need not import it

Entry = tuple[str, tuple[str, ...], bool]  # (lnblocks key, HF keys concatenated on dim 0, transposed)


def _gpt2_table(n_layers: int) -> list[Entry]:
    t: list[Entry] = [("tok_emb.weight", ("transformer.wte.weight",), False)]
    t.append(("pos_emb.weight", ("transformer.wpe.weight",), False))
    for i in range(n_layers):
        h, b = f"transformer.h.{i}", f"blocks.{i}"
        for lb, hf, tr in (
            ("attn_in_norm", "ln_1", False),
            ("attn.qkv", "attn.c_attn", True),
            ("attn.proj", "attn.c_proj", True),
            ("mlp_in_norm", "ln_2", False),
            ("mlp.fc1", "mlp.c_fc", True),
            ("mlp.fc2", "mlp.c_proj", True),
        ):
            t.append((f"{b}.{lb}.weight", (f"{h}.{hf}.weight",), tr))
            t.append((f"{b}.{lb}.bias", (f"{h}.{hf}.bias",), False))
    t += [(f"final_norm.{p}", (f"transformer.ln_f.{p}",), False) for p in ("weight", "bias")]
    t.append(("lm_head.weight", ("lm_head.weight",), False))
    return t


def _llama_table(n_layers: int) -> list[Entry]:
    t: list[Entry] = [("tok_emb.weight", ("model.embed_tokens.weight",), False)]
    for i in range(n_layers):
        h, b = f"model.layers.{i}", f"blocks.{i}"
        t.append((f"{b}.attn_in_norm.weight", (f"{h}.input_layernorm.weight",), False))
        for p in ("weight", "bias"):
            t.append((f"{b}.attn.qkv.{p}", tuple(f"{h}.self_attn.{x}_proj.{p}" for x in "qkv"), False))
            t.append((f"{b}.attn.proj.{p}", (f"{h}.self_attn.o_proj.{p}",), False))
            t.append((f"{b}.mlp.fc1.{p}", (f"{h}.mlp.gate_proj.{p}", f"{h}.mlp.up_proj.{p}"), False))
            t.append((f"{b}.mlp.fc2.{p}", (f"{h}.mlp.down_proj.{p}",), False))
        t.append((f"{b}.attn.q_norm.weight", (f"{h}.self_attn.q_norm.weight",), False))
        t.append((f"{b}.attn.k_norm.weight", (f"{h}.self_attn.k_norm.weight",), False))
        t.append((f"{b}.mlp_in_norm.weight", (f"{h}.post_attention_layernorm.weight",), False))
    t.append(("final_norm.weight", ("model.norm.weight",), False))
    t.append(("lm_head.weight", ("lm_head.weight",), False))
    return t


def _table(family: str, n_layers: int) -> list[Entry]:
    return _gpt2_table(n_layers) if MODEL_FAMILIES[family].converter == "gpt2" else _llama_table(n_layers)


def _check_lm(model: Any) -> Any:
    config = getattr(model, "config", None)
    if config is None or not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a transformers PreTrainedModel, got {type(model).__name__}")
    if getattr(model, "lm_head", None) is None:
        raise ValueError(f"{type(model).__name__} has no lm_head: pass the *LMHeadModel / *ForCausalLM class")
    return config


def from_hf(model: Any, gpt_class: type[M]) -> M:
    """The lnblocks ``GPT`` (``gpt_class``) computing what ``model`` computes, with its weights (same dtype, same
    train/eval mode)."""
    require("transformers")
    from lnblocks.models import hf_gemma2

    config = _check_lm(model)
    if hf_gemma2.is_gemma2(config):  # Gemma 2: its own config translation and weight table
        return hf_gemma2.from_hf(model, gpt_class)
    family = family_of(config)
    gpt_cfg = config_from_hf(config)
    hf_sd = model.state_dict()
    param = next(model.parameters())
    gpt = gpt_class(gpt_cfg).to(device=param.device, dtype=param.dtype)
    target = gpt.state_dict()
    sd: dict[str, Tensor] = {}
    for lb, hf_keys, transpose in _table(family, gpt_cfg.n_layers):
        if lb not in target:
            present = [k for k in hf_keys if k in hf_sd]
            if present:
                raise ValueError(f"HF weights {present} have no place in the lnblocks model (expected none)")
            continue
        missing = [k for k in hf_keys if k not in hf_sd]
        if missing:
            raise ValueError(f"HF state_dict lacks {missing} needed for {lb}")
        w = torch.cat([hf_sd[k] for k in hf_keys], dim=0) if len(hf_keys) > 1 else hf_sd[hf_keys[0]]
        sd[lb] = w.t() if transpose else w
    gpt.load_state_dict(sd, strict=True)  # strict: every lnblocks parameter came from the HF model
    gpt.train(model.training)
    return gpt


def to_hf(gpt: nn.Module, family: str | None = None) -> Any:
    """The ``transformers`` model of ``family`` computing what ``gpt`` (a ``GPT``) computes (weights copied; a bias the
    HF family has and ``gpt`` lacks is exported as zeros). Options the family cannot express raise ``ValueError``
    naming each."""
    transformers = require("transformers")
    from lnblocks.models import hf_gemma2

    gpt._check_unsharded("to_hf()")
    cfg = gpt.config
    if family is None:
        family = "gpt2" if cfg.positions == "learned" else "llama"
    if family == hf_gemma2.FAMILY:
        return hf_gemma2.to_hf(gpt)
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choices: {[*FAMILIES, hf_gemma2.FAMILY]}")
    hf_cfg = hf_config(transformers, cfg, family)
    half = next(gpt.parameters()).dtype in (torch.float16, torch.bfloat16)
    expected = config_from_hf(hf_cfg)
    problems = config_diff(expected, cfg, family, half=half)
    if problems:
        raise ValueError(f"cannot export to {family}: " + "; ".join(problems))
    warn_fp32_only(expected, cfg, family, half)
    model_cls = getattr(transformers, MODEL_FAMILIES[family].hf_lm_class)
    param = next(gpt.parameters())
    model = model_cls(hf_cfg).to(device=param.device, dtype=param.dtype)
    target = model.state_dict()
    ours = gpt.state_dict()
    sd: dict[str, Tensor] = {}
    for lb, hf_keys, transpose in _table(family, cfg.n_layers):
        hf_keys = tuple(k for k in hf_keys if k in target)
        if not hf_keys:
            continue
        w = ours.get(lb)
        if w is None:  # a bias HF has and lnblocks does not: zeros compute the same
            sizes = [target[k].shape[0] for k in hf_keys]
            w = torch.zeros(sum(sizes), dtype=param.dtype, device=param.device)
        w = w.t() if transpose else w
        for k, part in zip(hf_keys, torch.split(w, [target[k].shape[0] for k in hf_keys], dim=0)):
            sd[k] = part.contiguous()
    model.load_state_dict(sd, strict=True)
    model.train(gpt.training)
    return model
