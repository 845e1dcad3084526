"""test_against_hf_*: every family's tiny model, patched, gives the unpatched model's logits and grads exactly.

fp32 and bf16 are both bit-identical (``torch.equal``): each replacement runs its class's own cast order op for op,
so there is no rounding difference to bound. (The one place where the op *graph* differs is the backward of
``T5LayerNorm``: HF adds the two gradient paths of a bf16 input in bf16, lnblocks adds them in fp32 before the
cast; the bound is one bf16 rounding of the input grad, and it measured 0 on these models and in 200 random trials.)
"""

from __future__ import annotations

import copy

import pytest
import torch
from hf_tiny import FAMILIES, build, inputs
from safetensors.torch import load_file

from lnblocks.hf import patch_norms
from lnblocks.hf.record import record_of

pytest.importorskip("transformers")


def _step(model: torch.nn.Module, batch: dict[str, torch.Tensor], seed: int = 5) -> tuple[torch.Tensor, dict]:
    torch.manual_seed(seed)  # the same dropout masks on both sides
    out = model(**batch)
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return out.logits, grads


def _assert_same(a: tuple[torch.Tensor, dict], b: tuple[torch.Tensor, dict]) -> None:
    assert torch.equal(a[0], b[0]), f"logits differ by {(a[0] - b[0]).abs().max().item()}"
    assert a[1].keys() == b[1].keys() and a[1]
    for name in a[1]:
        assert torch.equal(a[1][name], b[1][name]), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_against_hf(family, dtype):
    original = build(family, dtype)
    patched = copy.deepcopy(original)
    report = patch_norms(patched)
    n_norms, roles = FAMILIES[family].patched, FAMILIES[family].roles
    assert {role: len(names) for role, names in report.by_role().items()} == roles
    assert len(report.patched) == n_norms and not report.unknown and not report.skipped
    batch = inputs(original)
    original.eval(), patched.eval()
    _assert_same(_step(original, batch), _step(patched, batch))


def _enable_checkpointing(model: torch.nn.Module) -> None:
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing


# BERT, T5 and OPT have dropout 0.1 by default: train mode draws masks, seeded alike on both sides
@pytest.mark.parametrize("family", ["llama", "gemma2", "bert", "t5", "opt_post"])
def test_train_mode_and_gradient_checkpointing(family):
    original = build(family)
    patched = copy.deepcopy(original)
    patch_norms(patched)
    batch = inputs(original)
    for model in (original, patched):
        model.train()
    _assert_same(_step(original, batch), _step(patched, batch))
    for model in (original, patched):
        model.zero_grad()
        _enable_checkpointing(model)
    _assert_same(_step(original, batch, seed=7), _step(patched, batch, seed=7))


@pytest.mark.parametrize("family", ["llama", "gemma3", "bert", "t5"])
def test_save_pretrained_writes_the_same_keys_and_values(family, tmp_path):
    original = build(family)
    patched = copy.deepcopy(original)
    patch_norms(patched)
    params_before = {n: p for n, p in patched.named_parameters()}
    original.save_pretrained(tmp_path / "original")
    patched.save_pretrained(tmp_path / "patched")
    a = load_file(tmp_path / "original" / "model.safetensors")
    b = load_file(tmp_path / "patched" / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert patched.state_dict().keys() == original.state_dict().keys()
    assert all(p is params_before[n] for n, p in patched.named_parameters())  # identity kept


def test_opt_roles_follow_do_layer_norm_before():
    pre = patch_norms(build("opt_pre")).by_role()
    post = patch_norms(build("opt_post")).by_role()
    # the same attribute names, opposite placements
    assert pre["pre_attn"] == [n.replace("final_layer_norm", "self_attn_layer_norm") for n in pre["pre_mlp"]]
    assert [n.split(".")[-1] for n in post["post_ln_attn"]] == ["self_attn_layer_norm"] * 2
    assert [n.split(".")[-1] for n in post["post_ln_mlp"]] == ["final_layer_norm"] * 2
    assert pre["final"] == ["model.decoder.final_layer_norm"] and "final" not in post


def test_same_attribute_name_different_roles():
    llama = patch_norms(build("llama")).by_role()
    gemma2 = patch_norms(build("gemma2")).by_role()
    olmo2 = patch_norms(build("olmo2")).by_role()
    name = "model.layers.0.post_attention_layernorm"
    assert name in llama["pre_mlp"] and name in gemma2["post_attn"] and name in olmo2["post_attn"]


def test_qk_norms_per_head_and_over_all_heads():
    qwen3, olmo2 = build("qwen3"), build("olmo2")
    patch_norms(qwen3), patch_norms(olmo2)
    attn = qwen3.model.layers[0].self_attn
    assert record_of(attn.q_norm).norm.normalized_shape == (8,)  # Qwen3: per head, on (B, T, H, D)
    attn = olmo2.model.layers[0].self_attn
    assert record_of(attn.q_norm).norm.normalized_shape == (4 * 8,)  # OLMo2: over num_heads * head_dim
    assert record_of(attn.k_norm).norm.normalized_shape == (2 * 8,)  # and num_kv_heads * head_dim
