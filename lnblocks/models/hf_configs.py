"""Config translation between ``transformers`` configs and ``GPTConfig`` (GPT-2 and the Llama-shaped families).

``config_from_hf`` is the single statement of what each HF family *is* in lnblocks terms. ``hf_config`` goes the
other way; ``to_hf`` then checks the round trip ``config_from_hf(hf_config(cfg)) == cfg`` field by field, so every
option an HF family cannot express is reported by name instead of exported silently wrong.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from lnblocks.blocks import AttentionConfig, BlockConfig, MLPConfig
from lnblocks.models.config import GPTConfig
from lnblocks.models.export_rules import BACKEND, COMPARED, FP32_SAME, INIT_ONLY, block_key_rule, rule
from lnblocks.norms import MODEL_FAMILIES, NORM_PRESETS
from lnblocks.norms.families import family_of_model_type

# The families lnblocks converts: the rows of the family table with a converter, by HF model_type.
FAMILIES: tuple[str, ...] = tuple(f.name for f in MODEL_FAMILIES.values() if f.converter is not None)
LLAMA_LIKE: tuple[str, ...] = tuple(f.name for f in MODEL_FAMILIES.values() if f.converter == "llama")

# HF activation name -> lnblocks MLP activation (the same function; gelu_new's python tanh formula and F.gelu's
# tanh kernel agree to float rounding).
GPT2_ACTS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu", "silu": "silu"}
GPT2_ACTS_BACK = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}
LLAMA_ACTS = {"silu": "swiglu", "gelu": "geglu"}
LLAMA_ACTS_BACK = {v: k for k, v in LLAMA_ACTS.items()}


def family_of(hf_config: Any) -> str:
    """The family-table row (its name) that converts an HF config, from ``config.model_type``."""
    model_type = getattr(hf_config, "model_type", None)
    family = family_of_model_type(model_type)
    if family is None or family.converter is None:
        raise ValueError(f"unsupported model_type {model_type!r}; lnblocks converts {list(FAMILIES)}")
    return family.name


def _gpt2_to_lnblocks(c: Any) -> GPTConfig:
    if getattr(c, "add_cross_attention", False):
        raise ValueError("GPT-2 with add_cross_attention=True has no lnblocks equivalent (decoder-only blocks)")
    if c.activation_function not in GPT2_ACTS:
        raise ValueError(f"GPT-2 activation_function {c.activation_function!r}; supported: {list(GPT2_ACTS)}")
    head_dim = c.n_embd // c.n_head
    base = head_dim**-0.5 if c.scale_attn_weights else 1.0

    def block(i: int) -> BlockConfig:
        scale = base / (i + 1) if c.scale_attn_by_inverse_layer_idx else base
        return BlockConfig(
            dim=c.n_embd,
            placement="pre",
            norm=NORM_PRESETS["gpt2"].replace(eps=c.layer_norm_epsilon),
            attention=AttentionConfig(
                n_heads=c.n_head, dropout=c.attn_pdrop, scale=None if scale == head_dim**-0.5 else scale
            ),
            mlp=MLPConfig(activation=GPT2_ACTS[c.activation_function], hidden_dim=c.n_inner or 4 * c.n_embd),
            dropout=c.resid_pdrop,
        )

    return GPTConfig(
        vocab_size=c.vocab_size,
        max_seq_len=c.n_positions,
        n_layers=c.n_layer,
        block=block,
        positions="learned",
        tie_weights=bool(c.tie_word_embeddings),
        emb_dropout=c.embd_pdrop,
    )


def rope_theta_of(c: Any) -> float:
    """The RoPE base of an HF config (``rope_parameters`` or the older ``rope_theta``)."""
    params = getattr(c, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"rope_type {rope_type!r} is not supported; lnblocks implements the default RoPE only")
    return float(params.get("rope_theta", getattr(c, "rope_theta", 10000.0)))


def _llama_to_lnblocks(c: Any, family: str) -> GPTConfig:
    if c.hidden_act not in LLAMA_ACTS:
        raise ValueError(f"hidden_act {c.hidden_act!r}; supported: {list(LLAMA_ACTS)}")
    theta = rope_theta_of(c)
    default_hd = c.hidden_size // c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or default_hd
    bias = bool(getattr(c, "attention_bias", False))
    qkv_bias, out_bias = {"qwen2": (True, False), "mistral": (False, False)}.get(family, (bias, bias))
    norm = NORM_PRESETS[family].replace(eps=c.rms_norm_eps)  # the family's RMSNorm (cast="llama")
    layer_types = getattr(c, "layer_types", None)

    def window(i: int) -> int | None:
        if family == "mistral":
            return c.sliding_window
        if family in ("qwen2", "qwen3") and layer_types is not None and layer_types[i] == "sliding_attention":
            return c.sliding_window
        return None

    def block(i: int) -> BlockConfig:
        return BlockConfig(
            dim=c.hidden_size,
            placement="pre",
            norm=norm,
            attention=AttentionConfig(
                n_heads=c.num_attention_heads,
                n_kv_heads=c.num_key_value_heads if c.num_key_value_heads != c.num_attention_heads else None,
                head_dim=head_dim if head_dim != default_hd else None,
                dropout=float(c.attention_dropout),
                qkv_bias=qkv_bias,
                out_bias=out_bias,
                sliding_window=window(i),
            ),
            mlp=MLPConfig(
                activation=LLAMA_ACTS[c.hidden_act],
                hidden_dim=c.intermediate_size,
                bias=bool(getattr(c, "mlp_bias", False)) if family == "llama" else False,
            ),
            qk_norm=norm if family == "qwen3" else None,
        )

    return GPTConfig(
        vocab_size=c.vocab_size,
        max_seq_len=c.max_position_embeddings,
        n_layers=c.num_hidden_layers,
        block=block,
        positions="rope",
        rope_theta=theta,
        tie_weights=bool(c.tie_word_embeddings),
    )


def config_from_hf(hf_config: Any) -> GPTConfig:
    """The ``GPTConfig`` whose model computes what the HF model of ``hf_config`` computes."""
    family = family_of(hf_config)
    converter = MODEL_FAMILIES[family].converter
    return _gpt2_to_lnblocks(hf_config) if converter == "gpt2" else _llama_to_lnblocks(hf_config, family)


# Block keys that export exactly by zero-filling: a bias the family has and lnblocks does not.
_ZERO_FILLED = ("attention.qkv_bias", "attention.out_bias", "mlp.bias")


# ---- lnblocks -> HF ---------------------------------------------------------------------------------------------
def token_ids_of(vocab_size: int) -> dict[str, Any]:
    """The special-token ids to pass an HF config of this vocabulary size."""
    # HF warns when the default special ids fall outside a small vocabulary; leave them unset there.
    return {} if vocab_size > 50256 else {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def hf_config(transformers: Any, cfg: GPTConfig, family: str) -> Any:
    """An HF config with the shapes and constants of ``cfg`` (validity is checked by ``config_diff``)."""
    b = cfg.layers[0]
    eps = getattr(b.norm, "eps", None)
    if MODEL_FAMILIES[family].converter == "gpt2":
        if b.mlp.activation not in GPT2_ACTS_BACK:
            raise ValueError(f"cannot export to gpt2: mlp activation {b.mlp.activation!r} (gpt2 takes a plain MLP)")
        scales = [x.attention.scale if x.attention.scale is not None else x.head_dim**-0.5 for x in cfg.layers]
        inverse = (
            len(scales) > 1
            and scales[1] != scales[0]
            and all(math.isclose(sc * (i + 1), scales[0]) for i, sc in enumerate(scales))
        )  # GPT-2's scale_attn_by_inverse_layer_idx
        return getattr(transformers, MODEL_FAMILIES[family].hf_lm_class).config_class(
            scale_attn_weights=scales[0] != 1.0,
            scale_attn_by_inverse_layer_idx=inverse,
            vocab_size=cfg.vocab_size,
            n_positions=cfg.max_seq_len,
            n_embd=b.dim,
            n_layer=cfg.n_layers,
            n_head=b.attention.n_heads,
            n_inner=b.mlp_hidden_dim,
            activation_function=GPT2_ACTS_BACK[b.mlp.activation],
            resid_pdrop=b.dropout,
            embd_pdrop=cfg.emb_dropout,
            attn_pdrop=b.attention.dropout,
            layer_norm_epsilon=eps if eps is not None else 1e-5,
            tie_word_embeddings=cfg.tie_weights,
            **token_ids_of(cfg.vocab_size),
        )
    if b.mlp.activation not in LLAMA_ACTS_BACK:
        raise ValueError(f"cannot export to {family}: mlp activation {b.mlp.activation!r} (needs swiglu or geglu)")
    windows = [x.attention.sliding_window for x in cfg.layers]
    window = next((w for w in windows if w is not None), None)
    kwargs: dict[str, Any] = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": b.dim,
        "intermediate_size": b.mlp_hidden_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": b.attention.n_heads,
        "num_key_value_heads": b.attention.kv_heads,
        "head_dim": b.head_dim,
        "hidden_act": LLAMA_ACTS_BACK[b.mlp.activation],
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": eps if eps is not None else 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_dropout": b.attention.dropout,
        "tie_word_embeddings": cfg.tie_weights,
        **token_ids_of(cfg.vocab_size),
    }
    if family in ("llama", "qwen3"):
        kwargs["attention_bias"] = b.attention.qkv_bias or b.attention.out_bias
    if family == "llama":
        kwargs["mlp_bias"] = b.mlp.bias
    if family == "mistral":
        kwargs["sliding_window"] = window
    if family in ("qwen2", "qwen3"):
        kwargs["use_sliding_window"] = window is not None
        kwargs["sliding_window"] = window
        kwargs["layer_types"] = ["sliding_attention" if w is not None else "full_attention" for w in windows]
        if window is not None:
            kwargs["max_window_layers"] = 0
    config_cls = getattr(transformers, MODEL_FAMILIES[family].hf_lm_class).config_class
    return config_cls(**kwargs)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else k))
        return out
    return {prefix: d}


def _canonical(b: BlockConfig, half: bool) -> dict[str, Any]:
    """``b`` flattened to dotted keys, with defaults resolved and the keys its export rule leaves out dropped."""
    d = _flatten(b.to_dict())
    d["attention.head_dim"] = b.head_dim
    d["attention.n_kv_heads"] = b.attention.kv_heads
    d["mlp.hidden_dim"] = b.mlp_hidden_dim
    d["attention.scale"] = b.attention.scale if b.attention.scale is not None else b.head_dim**-0.5
    for key in list(d):
        decision = block_key_rule(key)
        if key.endswith(".cast"):  # compared, with 'fp32' = 'llama' for fp32 weights (one rounding apart in half)
            d[key] = "llama" if d[key] == "fp32" and not half else d[key]
        elif decision in (BACKEND, INIT_ONLY) or (decision == FP32_SAME and not half):
            del d[key]
    return d


def config_diff(expected: GPTConfig, actual: GPTConfig, family: str, half: bool = False) -> list[str]:
    """Human-readable differences between what ``family`` can express and ``actual``, field by field as
    ``lnblocks.models.export_rules`` decides; ``half``: the weights are fp16/bf16 (fp32-only equalities end)."""
    problems = []
    for f in fields(GPTConfig):
        if rule(GPTConfig, f.name) == COMPARED and getattr(expected, f.name) != getattr(actual, f.name):
            problems.append(f"{f.name}={getattr(actual, f.name)!r} ({family} needs {getattr(expected, f.name)!r})")
    if expected.positions == "rope" and expected.rope_theta != actual.rope_theta:
        problems.append(f"rope_theta={actual.rope_theta!r} ({family} needs {expected.rope_theta!r})")
    if expected.uses_final_norm != actual.uses_final_norm:
        problems.append(f"final norm {actual.uses_final_norm} ({family} needs {expected.uses_final_norm})")
    for i, (e, a) in enumerate(zip(expected.layers, actual.layers)):
        de, da = _canonical(e, half), _canonical(a, half)
        for key in sorted(set(de) | set(da)):
            ve, va = de.get(key), da.get(key)
            if ve == va or (key in _ZERO_FILLED and ve is True and va is False):
                continue
            problems.append(f"layer {i} {key}={va!r} ({family} needs {ve!r})")
    return problems


def warn_fp32_only(expected: GPTConfig, actual: GPTConfig, family: str, half: bool) -> None:
    """A ``UserWarning`` naming what ``family`` cannot express but an export of fp32 weights reproduces exactly (the
    ``FP32_SAME`` and ``CAST`` rules): the HF config cannot carry it, so cast to fp16/bf16 the HF model would round
    where the lnblocks one does not. Said, never dropped without a word; nothing for half-precision weights (there
    ``config_diff`` refuses it)."""
    import warnings

    fp32_only = [] if half else config_diff(expected, actual, family, half=True)
    if fp32_only:
        warnings.warn(
            f"to_hf({family!r}): the export is exact for these fp32 weights, but {family} cannot express "
            + "; ".join(fp32_only)
            + ": cast to fp16/bf16, the HF model rounds where this one does not",
            UserWarning,
            stacklevel=4,
        )
