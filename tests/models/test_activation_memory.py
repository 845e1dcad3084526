"""Activation memory against HF at the same shape: a GPT converted with ``GPT.from_hf`` saves no more bytes for
backward per layer than the HF model (counted exactly: distinct storages seen by ``saved_tensors_hooks``).
``benchmarks/models/bench_memory.py`` prints the full table; this guards the two regressions it found (K/V repeated for
GQA before sdpa, and a view of the fused qkv output keeping all of it alive)."""

from __future__ import annotations

import pytest
import torch

from lnblocks import GPT

transformers = pytest.importorskip("transformers")
NO_IDS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def _saved_bytes(model: torch.nn.Module, run) -> int:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in params:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(storages.values())


def _hf(family: str, n_layers: int) -> torch.nn.Module:
    if family == "llama":
        config = transformers.LlamaConfig(
            vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=n_layers, num_attention_heads=6,
            num_key_value_heads=2, max_position_embeddings=32, **NO_IDS,
        )  # fmt: skip
        return transformers.LlamaForCausalLM(config)
    config = transformers.GPT2Config(
        vocab_size=64, n_embd=48, n_layer=n_layers, n_head=6, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, **NO_IDS,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_saved_bytes_per_layer_not_more_than_hf(family: str) -> None:
    idx = torch.randint(0, 64, (2, 16))
    targets = torch.cat([idx[:, 1:], torch.full_like(idx[:, :1], -100)], dim=1)
    per_layer = {}
    for side in ("hf", "lnblocks"):
        counts = []
        for n_layers in (1, 2):
            torch.manual_seed(0)
            hf = _hf(family, n_layers).train()
            model = hf if side == "hf" else GPT.from_hf(hf).train()
            run = (lambda m=model: m(idx, labels=idx).loss) if side == "hf" else (lambda m=model: m(idx, targets)[1])
            counts.append(_saved_bytes(model, run))
        per_layer[side] = counts[1] - counts[0]
    assert per_layer["lnblocks"] <= per_layer["hf"], per_layer
    if family == "llama":  # the same tensors as HF exactly (the GPT-2 model saves fewer: one-kernel GELU)
        assert per_layer["lnblocks"] == per_layer["hf"]
