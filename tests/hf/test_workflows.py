"""End-to-end uses: training a patched model, ``patch_transformers`` before ``from_pretrained``, the CLI."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch
from hf_tiny import build, inputs

from lnblocks.cli import main as cli_main
from lnblocks.hf import is_patched, patch_norms, patch_transformers, unpatch_norms, unpatch_transformers
from lnblocks.hf.record import is_fused

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


def _broken_folders(tmp_path):
    """A config without weights, a config.json that is not JSON, and truncated safetensors."""
    model = build("llama")
    model.config.save_pretrained(tmp_path / "config_only")
    for name in ("bad_config", "truncated"):
        model.save_pretrained(tmp_path / name)
    (tmp_path / "bad_config" / "config.json").write_text("{not json")
    weights = tmp_path / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return {
        "config_only": "no file named model.safetensors",
        "bad_config": "not a valid JSON file",
        "truncated": "SafetensorError",
    }


@pytest.mark.parametrize("arch", ["AutoTokenizer", "LlamaConfig", "logging", "is_torch_available", "PreTrainedModel"])
def test_patch_check_on_an_architecture_that_is_not_a_model(tmp_path, capsys, arch):
    build("llama").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": [arch]}))  # save_pretrained sets it
    assert cli_main(["patch-check", str(tmp_path), "--backend", "torch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"patch-check: cannot load the model in '{tmp_path}': ValueError: config.json's architectures names {arch!r}, "
        "which is not a transformers model class; name the model's class there (e.g. LlamaForCausalLM), or drop the "
        "key to load it with AutoModel"
    )


def test_patch_check_cannot_load_is_one_line_and_exit_2(tmp_path, capsys):
    for name, reason in _broken_folders(tmp_path).items():
        assert cli_main(["patch-check", str(tmp_path / name), "--backend", "torch"]) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(f"patch-check: cannot load the model in '{tmp_path / name}': ") and reason in err[-1]


_HIDE_TRANSFORMERS = "import sys; sys.modules['transformers'] = None; "


def test_without_transformers_patch_check_names_the_extra(tmp_path):
    """transformers hidden in a subprocess: one line naming the extra, exit 2 (cannot check); lnblocks.hf imports."""
    build("llama").save_pretrained(tmp_path)
    code = _HIDE_TRANSFORMERS + f"from lnblocks.cli import main; sys.exit(main(['patch-check', {str(tmp_path)!r}]))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "patch-check: HuggingFace interop needs the optional package 'transformers': pip install 'lnblocks[hf]'"
    ]
    code = _HIDE_TRANSFORMERS + (
        "import lnblocks.hf as H\n"
        "try:\n    H.patch_transformers()\n"
        "except ImportError as e:\n    print(e, e.name, e.__cause__ is None and e.__suppress_context__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == (
        "HuggingFace interop needs the optional package 'transformers': pip install 'lnblocks[hf]' transformers True"
    )


def test_patch_check_passes_on_eps_zero_models(tmp_path, capsys):
    model = build("bert")
    model.config.layer_norm_eps = 0.0
    model.save_pretrained(tmp_path)
    assert cli_main(["patch-check", str(tmp_path), "--backend", "torch"]) == 0
    assert "(identical; torch.float32, cpu)" in capsys.readouterr().out


def test_patch_transformers_fuses_residual_adds_bit_identically(tmp_path, caplog):
    """``patch_transformers(fuse_residual=True)``: every model built fuses where its layers can be fused (the logits
    bit-identical to the unpatched model's); a model whose layers cannot is built with its norms patched alone."""
    source = build("llama").eval()
    source.save_pretrained(tmp_path)
    batch = {"input_ids": inputs(source)["input_ids"]}
    eager = {"attn_implementation": "eager"}
    with torch.no_grad():
        expected = transformers.LlamaForCausalLM.from_pretrained(tmp_path, **eager).eval()(**batch).logits
    with caplog.at_level("INFO", logger="lnblocks.hf"), patch_transformers(backend="torch", fuse_residual=True):
        loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path, **eager).eval()
        cohere = build("cohere_qk")  # one norm feeding both branches, one add of both: nothing to fuse
    assert [is_fused(layer) for layer in loaded.model.layers] == [True, True]
    assert all(is_patched(m) for m in _norm_modules(loaded))
    with torch.no_grad():
        assert torch.equal(loaded(**batch).logits, expected)
    assert all(is_patched(m) for m in _norm_modules(cohere)) and not any(is_fused(m) for m in cohere.modules())
    assert "CohereDecoderLayer" in caplog.text and "those adds stay as they are" in caplog.text
    assert patch_norms(loaded, backend="torch", fuse_residual=True).layers  # the same options: the report again
