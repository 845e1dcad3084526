"""Tiny GPTs for the sharded-training checks: every placement and the options that change what tensor parallelism
must split (GQA, QK-norm, RoPE, tied embeddings, gated MLP, LayerNorm Scaling, ReZero, mix-LN, embedding norm),
and the parallel modes they run under. Shared by ``parallel_checks.py`` (the 2-process worker) and the tests."""

from __future__ import annotations

import copy
import os
from typing import Any

import torch

from lnblocks.blocks import BlockConfig
from lnblocks.models import GPTConfig, mix_ln

VOCAB, SEQ, BATCH, STEPS = 32, 8, 4, 3
ATTN = {"n_heads": 4, "n_kv_heads": 2}  # GQA everywhere: tp=2 splits both the query and the KV heads

CASES: dict[str, dict[str, Any]] = {
    "pre": {"block": {"placement": "pre"}, "tie_weights": True},
    "post": {"block": {"placement": "post"}},
    "sandwich": {"block": {"placement": "sandwich", "norm": "rmsnorm"}},
    "reordered": {"block": {"placement": "reordered", "norm": "scalenorm"}},
    "deepnorm": {"block": {"placement": "deepnorm"}, "init": "deepnet"},
    "resi_dual": {"block": {"placement": "resi_dual"}},
    "parallel": {"block": {"placement": "parallel", "norm": "dyt"}},
    "parallel_shared": {"block": {"placement": "parallel", "shared_norm": True}},
    "rezero": {"block": {"placement": "none", "rezero": True}},
    "mix_ln": {"block": "mix_ln"},
    "layernorm_scaling": {"block": {"placement": "pre", "depth_scaled_norm": True}, "emb_norm": "layernorm"},
    "llama": {
        "block": {
            "placement": "pre",
            "norm": {"kind": "rmsnorm", "cast": "llama", "residual_in_fp32": True},
            "qk_norm": "rmsnorm",
            "mlp": {"activation": "swiglu", "hidden_dim": 32, "bias": False},
            "attention": {**ATTN, "qkv_bias": False, "out_bias": False},
        },
        "positions": "rope",
        "tie_weights": True,
    },
}

# mode -> (dp_shard, tp, ParallelConfig options, cases run under it)
ALL = tuple(CASES)
MODES: dict[str, tuple[int, int, dict[str, Any], tuple[str, ...]]] = {
    "fsdp": (2, 1, {}, ALL),
    "tp_sp": (1, 2, {"sequence_parallel": True}, ALL),
    "tp": (1, 2, {"sequence_parallel": False}, ("pre", "resi_dual", "parallel_shared", "llama")),
    "tp_sp_loss_parallel": (1, 2, {"loss_parallel": True}, ("pre", "llama")),
    "fsdp_bf16": (2, 1, {"param_dtype": "bfloat16", "reduce_dtype": "float32"}, ("pre", "llama")),
    "tp_sp_bf16": (1, 2, {"param_dtype": "bfloat16", "reduce_dtype": "float32"}, ("llama",)),
    # torch.compile of every sharded block (AOT autograd; inductor passes too but compiles for ~35 s on 2 cores:
    # LNBLOCKS_PARALLEL_INDUCTOR=1 adds it)
    "fsdp_compiled": (2, 1, {"compile": True, "compile_backend": "aot_eager"}, ("llama",)),
    "tp_sp_compiled": (1, 2, {"compile": True, "compile_backend": "aot_eager"}, ("llama",)),
}
if os.environ.get("LNBLOCKS_PARALLEL_INDUCTOR") == "1":
    MODES["tp_sp_compiled_inductor"] = (1, 2, {"compile": True}, ("llama",))
# a true 2-D mesh needs 4 processes (test_two_dimensional_mesh_on_four_processes): FSDP2 x TP (+ SP)
MODES_2D: dict[str, tuple[int, int, dict[str, Any], tuple[str, ...]]] = {
    "fsdp_tp_sp": (2, 2, {}, ALL),
    "fsdp_tp": (2, 2, {"sequence_parallel": False}, ("resi_dual", "llama")),
    "fsdp_tp_loss_parallel_bf16": (
        2,
        2,
        {"loss_parallel": True, "param_dtype": "bfloat16", "reduce_dtype": "float32"},
        ("llama",),
    ),
}
# the fused Triton norms (TRITON_INTERPRET=1 on CPU): FSDP hands them plain tensors; tensor parallelism hands them
# DTensors (sequence-sharded, their local tensors possibly still in flight), which the fused path runs row-wise
TRITON_MODES: dict[str, tuple[str, ...]] = {"fsdp": ("pre",), "tp_sp": ("llama",), "tp": ("pre",)}


def _with_backend(norm: Any, backend: str) -> Any:
    if norm is None:
        return None
    spec = {"kind": norm} if isinstance(norm, str) else dict(norm)
    return {**spec, "backend": backend}


def gpt_config(case: str, backend: str = "torch") -> GPTConfig:
    """The case's ``GPTConfig`` (2 layers, width 16) with every norm on ``backend``."""
    options = copy.deepcopy(CASES[case])
    block = options.pop("block")
    if block == "mix_ln":
        base = BlockConfig(dim=16, attention=ATTN, norm=_with_backend("layernorm", backend))
        return GPTConfig(vocab_size=VOCAB, max_seq_len=SEQ, n_layers=2, block=mix_ln(base, 2, 0.5), **options)
    block = {"dim": 16, "attention": ATTN, **block}
    block["norm"] = _with_backend(block.get("norm", "layernorm"), backend)
    if "qk_norm" in block:
        block["qk_norm"] = _with_backend(block["qk_norm"], backend)
    if "emb_norm" in options:
        options["emb_norm"] = _with_backend(options["emb_norm"], backend)
    return GPTConfig(vocab_size=VOCAB, max_seq_len=SEQ, n_layers=2, block=block, **options)


def batches(seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``STEPS`` global batches ``(idx, targets)`` of shape ``(BATCH, SEQ)``, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(0, VOCAB, (BATCH, SEQ), generator=g))
        for _ in range(STEPS)
    ]
