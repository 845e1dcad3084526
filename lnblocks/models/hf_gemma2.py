"""Gemma 2 (arXiv 2408.00118) to and from ``transformers.Gemma2ForCausalLM``: config translation and weights.

Gemma 2 in lnblocks terms: ``"sandwich"`` blocks (input, post-attention, pre- and post-feedforward norms) of the
``gemma2`` RMSNorm (``1 + w`` in fp32), a GeGLU MLP (``gelu_pytorch_tanh`` = ``"geglu_tanh"``), RoPE, the token
embeddings times ``sqrt(hidden_size)`` (``emb_scale``), logit scale ``query_pre_attn_scalar ** -0.5``,
attention-logit soft-capping (``attention.softcap``), sliding windows on the ``"sliding_attention"`` layers, a final
norm and final-logit soft-capping (``final_softcap``). ``config_from_hf`` states that; ``hf_config`` goes back, and
``to_hf`` checks the round trip field by field (``hf_configs.config_diff``), naming what Gemma 2 cannot hold.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from lnblocks._optional import require
from lnblocks.blocks import AttentionConfig, BlockConfig, MLPConfig
from lnblocks.models.config import GPTConfig
from lnblocks.models.hf_configs import config_diff, rope_theta_of, token_ids_of, warn_fp32_only
from lnblocks.norms import NORM_PRESETS

M = TypeVar("M", bound=nn.Module)  # the GPT class, passed by GPT.from_hf (this module does not import it)

FAMILY = "gemma2"
HF_LM_CLASS = "Gemma2ForCausalLM"
ACTS = {"gelu_pytorch_tanh": "geglu_tanh", "gelu": "geglu"}  # HF hidden_activation -> lnblocks MLP activation
ACTS_BACK = {v: k for k, v in ACTS.items()}
Entry = tuple[str, tuple[str, ...]]  # (lnblocks key, HF keys concatenated on dim 0)


def is_gemma2(hf_config: Any) -> bool:
    return getattr(hf_config, "model_type", None) == FAMILY


def config_from_hf(c: Any) -> GPTConfig:
    """The ``GPTConfig`` whose model computes what a ``Gemma2ForCausalLM`` of config ``c`` computes."""
    if c.hidden_activation not in ACTS:
        raise ValueError(f"Gemma 2 hidden_activation {c.hidden_activation!r}; supported: {list(ACTS)}")
    if getattr(c, "use_bidirectional_attention", False):
        raise ValueError("Gemma 2 with use_bidirectional_attention=True is not converted (a decoder-only LM)")
    default_hd = c.hidden_size // c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or default_hd
    scale = c.query_pre_attn_scalar**-0.5
    bias = bool(c.attention_bias)

    def block(i: int) -> BlockConfig:
        return BlockConfig(
            dim=c.hidden_size,
            placement="sandwich",
            norm=NORM_PRESETS[FAMILY].replace(eps=c.rms_norm_eps),
            attention=AttentionConfig(
                n_heads=c.num_attention_heads,
                n_kv_heads=c.num_key_value_heads if c.num_key_value_heads != c.num_attention_heads else None,
                head_dim=head_dim if head_dim != default_hd else None,
                dropout=float(c.attention_dropout),
                qkv_bias=bias,
                out_bias=bias,
                sliding_window=c.sliding_window if c.layer_types[i] == "sliding_attention" else None,
                scale=None if scale == head_dim**-0.5 else scale,
                softcap=c.attn_logit_softcapping,
            ),
            mlp=MLPConfig(activation=ACTS[c.hidden_activation], hidden_dim=c.intermediate_size, bias=False),
        )

    return GPTConfig(
        vocab_size=c.vocab_size,
        max_seq_len=c.max_position_embeddings,
        n_layers=c.num_hidden_layers,
        block=block,
        positions="rope",
        rope_theta=rope_theta_of(c),
        tie_weights=bool(c.tie_word_embeddings),
        emb_scale=c.hidden_size**0.5,
        final_softcap=c.final_logit_softcapping,
    )


def hf_config(transformers: Any, cfg: GPTConfig) -> Any:
    """A ``Gemma2Config`` with the shapes and constants of ``cfg`` (validity is checked by ``config_diff``)."""
    b = cfg.layers[0]
    if b.mlp.activation not in ACTS_BACK:
        raise ValueError(f"cannot export to gemma2: mlp activation {b.mlp.activation!r} (needs geglu_tanh or geglu)")
    scale = b.attention.scale if b.attention.scale is not None else b.head_dim**-0.5
    scalar = scale**-2
    windows = [x.attention.sliding_window for x in cfg.layers]
    return transformers.Gemma2Config(
        vocab_size=cfg.vocab_size,
        hidden_size=b.dim,
        intermediate_size=b.mlp_hidden_dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=b.attention.n_heads,
        num_key_value_heads=b.attention.kv_heads,
        head_dim=b.head_dim,
        hidden_activation=ACTS_BACK[b.mlp.activation],
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=getattr(b.norm, "eps", None) or 1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        attention_bias=b.attention.qkv_bias or b.attention.out_bias,
        attention_dropout=b.attention.dropout,
        query_pre_attn_scalar=int(scalar) if float(scalar).is_integer() else scalar,
        sliding_window=next((w for w in windows if w is not None), None),
        layer_types=["sliding_attention" if w is not None else "full_attention" for w in windows],
        attn_logit_softcapping=b.attention.softcap,
        final_logit_softcapping=cfg.final_softcap,
        tie_word_embeddings=cfg.tie_weights,
        **token_ids_of(cfg.vocab_size),
    )


def weight_table(n_layers: int) -> list[Entry]:
    """``(lnblocks key, HF keys)`` of every weight; q/k/v concatenate into ``qkv``, gate/up into ``fc1``."""
    t: list[Entry] = [("tok_emb.weight", ("model.embed_tokens.weight",))]
    for i in range(n_layers):
        h, b = f"model.layers.{i}", f"blocks.{i}"
        for lb, hf in (
            ("attn_in_norm", "input_layernorm"),
            ("attn_out_norm", "post_attention_layernorm"),
            ("mlp_in_norm", "pre_feedforward_layernorm"),
            ("mlp_out_norm", "post_feedforward_layernorm"),
        ):
            t.append((f"{b}.{lb}.weight", (f"{h}.{hf}.weight",)))
        for p in ("weight", "bias"):
            t.append((f"{b}.attn.qkv.{p}", tuple(f"{h}.self_attn.{x}_proj.{p}" for x in "qkv")))
            t.append((f"{b}.attn.proj.{p}", (f"{h}.self_attn.o_proj.{p}",)))
        t.append((f"{b}.mlp.fc1.weight", (f"{h}.mlp.gate_proj.weight", f"{h}.mlp.up_proj.weight")))
        t.append((f"{b}.mlp.fc2.weight", (f"{h}.mlp.down_proj.weight",)))
    t.append(("final_norm.weight", ("model.norm.weight",)))
    t.append(("lm_head.weight", ("lm_head.weight",)))
    return t


def from_hf(model: Any, gpt_class: type[M]) -> M:
    """The lnblocks ``GPT`` (``gpt_class``) computing what the ``Gemma2ForCausalLM`` ``model`` computes, with its
    weights."""
    cfg = config_from_hf(model.config)
    param = next(model.parameters())
    gpt = gpt_class(cfg).to(device=param.device, dtype=param.dtype)
    hf_sd, target = model.state_dict(), gpt.state_dict()
    sd: dict[str, Tensor] = {}
    for lb, hf_keys in weight_table(cfg.n_layers):
        present = [k for k in hf_keys if k in hf_sd]
        if lb not in target:
            if present:
                raise ValueError(f"HF weights {present} have no place in the lnblocks model (expected none)")
            continue
        if len(present) != len(hf_keys):
            raise ValueError(f"HF state_dict lacks {sorted(set(hf_keys) - set(present))} needed for {lb}")
        sd[lb] = torch.cat([hf_sd[k] for k in hf_keys], dim=0)
    gpt.load_state_dict(sd, strict=True)
    gpt.train(model.training)
    return gpt


def to_hf(gpt: nn.Module) -> Any:
    """The ``Gemma2ForCausalLM`` computing what ``gpt`` computes (a bias Gemma 2 has and ``gpt`` lacks exports as
    zeros); options Gemma 2 cannot express raise ``ValueError`` naming each."""
    transformers = require("transformers")
    hf_cfg = hf_config(transformers, gpt.config)
    param = next(gpt.parameters())
    half = param.dtype in (torch.float16, torch.bfloat16)
    expected = config_from_hf(hf_cfg)
    problems = config_diff(expected, gpt.config, FAMILY, half=half)
    if problems:
        raise ValueError(f"cannot export to {FAMILY}: " + "; ".join(problems))
    warn_fp32_only(expected, gpt.config, FAMILY, half)
    model = getattr(transformers, HF_LM_CLASS)(hf_cfg).to(device=param.device, dtype=param.dtype)
    target, ours = model.state_dict(), gpt.state_dict()
    sd: dict[str, Tensor] = {}
    for lb, hf_keys in weight_table(gpt.config.n_layers):
        hf_keys = tuple(k for k in hf_keys if k in target)
        if not hf_keys:
            continue
        sizes = [target[k].shape[0] for k in hf_keys]
        w = ours.get(lb)
        if w is None:  # a bias Gemma 2 has and lnblocks does not: zeros compute the same
            w = torch.zeros(sum(sizes), dtype=param.dtype, device=param.device)
        for k, part in zip(hf_keys, torch.split(w, sizes, dim=0)):
            sd[k] = part.contiguous()
    model.load_state_dict(sd, strict=True)
    model.train(gpt.training)
    return model
