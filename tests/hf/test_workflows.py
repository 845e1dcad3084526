"""End-to-end uses: training a patched model, ``patch_transformers`` before ``from_pretrained``, the CLI."""

from __future__ import annotations

import copy

import pytest
import torch
from hf_tiny import build, inputs

from lnblocks.cli import main as cli_main
from lnblocks.hf import is_patched, patch_norms, patch_transformers, unpatch_norms, unpatch_transformers

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2"])
def test_patched_model_trains_with_the_same_losses(family):
    original = build(family).train()
    patched = copy.deepcopy(original)
    patch_norms(patched)
    batch = inputs(original, batch=4, seq=16)
    losses: dict[str, list[float]] = {"original": [], "patched": []}
    for key, model in (("original", original), ("patched", patched)):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)  # the optimizer holds the (unchanged) Parameters
        for step in range(4):
            torch.manual_seed(step)
            loss = model(**batch).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[key].append(loss.item())
    assert losses["patched"] == losses["original"]
    assert losses["original"][-1] < losses["original"][0]  # it did train
    for p, q in zip(original.parameters(), patched.parameters()):
        assert torch.equal(p, q)


def _norm_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for n, m in model.named_modules() if n.endswith(("layernorm", "norm"))]


def test_patch_transformers_before_from_pretrained_and_its_reversal(tmp_path):
    source = build("llama").eval()
    source.save_pretrained(tmp_path)
    batch = {"input_ids": inputs(source)["input_ids"]}
    eager = {"attn_implementation": "eager"}
    plain = transformers.LlamaForCausalLM.from_pretrained(tmp_path, **eager).eval()
    with torch.no_grad():
        expected = plain(**batch).logits
    original_post_init = transformers.PreTrainedModel.post_init

    with patch_transformers(exclude="final"):
        loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path, **eager).eval()
        auto = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, **eager).eval()
        built = transformers.LlamaForCausalLM(source.config)  # plain construction is covered too
    assert transformers.PreTrainedModel.post_init is original_post_init  # reversed on exit
    for model in (loaded, auto, built):
        assert [is_patched(m) for m in _norm_modules(model)] == [True] * 4 + [False]  # model.norm excluded
    with torch.no_grad():
        assert torch.equal(loaded(**batch).logits, expected)  # the loaded weights are the ones used
        assert torch.equal(auto(**batch).logits, expected)

    after = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    assert not any(is_patched(m) for m in after.modules())
    assert unpatch_norms(loaded) == 4 and not any(is_patched(m) for m in loaded.modules())


def test_patch_transformers_options_and_errors():
    try:
        patch_transformers(backend="torch")
        patch_transformers(backend="torch")  # twice: one hook
        assert transformers.PreTrainedModel.post_init.__wrapped__ is not transformers.PreTrainedModel.post_init
        assert not hasattr(transformers.PreTrainedModel.post_init.__wrapped__, "_lnblocks_hook")
        model = build("bert")
        assert all(is_patched(m) for m in _norm_modules(model) if "LayerNorm" in type(m).__name__)
    finally:
        assert unpatch_transformers() is True
    assert unpatch_transformers() is False
    with pytest.raises(ValueError, match="selects by role only"):
        patch_transformers(include=["model.layers.*"])
    with pytest.raises(ValueError, match="backend must be one of"):
        patch_transformers(backend="fast")
    assert not hasattr(transformers.PreTrainedModel.post_init, "_lnblocks_hook")


def test_patch_check_cli(tmp_path, capsys):
    build("qwen3").save_pretrained(tmp_path)
    assert cli_main(["patch-check", str(tmp_path), "--backend", "torch"]) == 0
    out = capsys.readouterr().out
    assert "9 patched" in out and "q_norm" in out
    assert "max |logits patched - unpatched| = 0 (identical; torch.float32, cpu)" in out
    assert "forward time patched / unpatched = " in out
    assert cli_main(["patch-check", str(tmp_path / "missing")]) == 2
    assert "no config.json" in capsys.readouterr().err
