"""The norms of the 2025-26 families against the HF classes themselves (imported from transformers, not copied):
outputs, dtypes and gradients bit-identical on the torch backend, for a half-precision model, an fp32 model, and fp32
master weights receiving bf16 activations. The presets are rows of ``MODEL_FAMILIES``."""

from __future__ import annotations

import importlib

import pytest
import torch

import lnblocks
from tests.norms.helpers import copy_params, randomize_

pytest.importorskip("transformers")

N = 48
DTYPE_PAIRS = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)]


def _hf(model: str, name: str, *args, **kwargs) -> torch.nn.Module:
    cls = getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name)
    return cls(*args, **kwargs)


# id: (HF module factory, lnblocks preset and options, input shape, gated)
CASES = {
    "Llama4TextRMSNorm": (lambda: _hf("llama4", "Llama4TextRMSNorm", N), ("llama4", N, {}), (2, 3, N), False),
    "Llama4TextL2Norm": (lambda: _hf("llama4", "Llama4TextL2Norm"), ("llama4_qk", N, {}), (2, 3, N), False),
    "Llama4TextL2Norm-eps": (lambda: _hf("llama4", "Llama4TextL2Norm", 1e-5), ("llama4_qk", N, {"eps": 1e-5}),
                             (4, N), False),
    "NemotronHRMSNorm": (lambda: _hf("nemotron_h", "NemotronHRMSNorm", N), ("nemotron_h", N, {}), (2, 3, N), False),
    "NemotronHRMSNormGated": (lambda: _hf("nemotron_h", "NemotronHRMSNormGated", N, group_size=12),
                              ("nemotron_h_gated", N, {"group_size": 12}), (2, 3, N), True),
    "MambaRMSNormGated": (lambda: _hf("mamba2", "MambaRMSNormGated", N, group_size=N),
                          ("mamba2_gated", N, {}), (2, 3, N), True),
    "MambaRMSNormGated-groups": (lambda: _hf("mamba2", "MambaRMSNormGated", N, group_size=16),
                                 ("mamba2_gated", N, {"group_size": 16}), (2, 3, N), True),
    "BambaRMSNormGated": (lambda: _hf("bamba", "BambaRMSNormGated", N, group_size=24),
                          ("mamba2_gated", N, {"group_size": 24}), (5, N), True),
    "Zamba2RMSNormGated": (lambda: _hf("zamba2", "Zamba2RMSNormGated", N, group_size=8),
                           ("mamba2_gated", N, {"group_size": 8}), (2, 3, N), True),
    "GraniteMoeHybridRMSNormGated": (lambda: _hf("granitemoehybrid", "GraniteMoeHybridRMSNormGated", N, group_size=N),
                                     ("mamba2_gated", N, {}), (2, 3, N), True),
    "Qwen3NextRMSNormGated": (lambda: _hf("qwen3_next", "Qwen3NextRMSNormGated", N),
                              ("qwen3_next_gated", N, {}), (2, 3, N), True),
    "FalconH1RMSNormGated": (lambda: _hf("falcon_h1", "FalconH1RMSNormGated", N, n_groups=4),
                             ("falcon_h1_gated", N, {"group_size": 12}), (2, 3, N), True),
    "FalconH1RMSNormGated-gate-first": (lambda: _hf("falcon_h1", "FalconH1RMSNormGated", N, norm_before_gate=False),
                                        ("falcon_h1_gated", N, {"gate": "before"}), (2, 3, N), True),
    "NemotronLayerNorm1P": (lambda: _hf("nemotron", "NemotronLayerNorm1P", N), ("nemotron", N, {}), (2, 3, N), False),
    "CohereLayerNorm": (lambda: _hf("cohere", "CohereLayerNorm", N), ("cohere", N, {}), (2, 3, N), False),
    "CohereLayerNorm-qk": (lambda: _hf("cohere", "CohereLayerNorm", (4, 12)), ("cohere_qk", (4, 12), {}),
                           (2, 3, 4, 12), False),
    "Cohere2LayerNorm-qk": (lambda: _hf("cohere2", "Cohere2LayerNorm", (2, 24)), ("cohere_qk", (2, 24), {}),
                            (3, 2, 24), False),
}  # fmt: skip


def _run(module, inputs, grad_out=None):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    y = module(*leaves)
    if grad_out is None:
        grad_out = torch.randn_like(y)
    params = [p for _, p in sorted(module.named_parameters())]
    return y, torch.autograd.grad(y, leaves + params, grad_out), grad_out


@pytest.mark.parametrize(("x_dtype", "w_dtype"), DTYPE_PAIRS, ids=["fp32", "bf16", "bf16-fp32-weights"])
@pytest.mark.parametrize("case", list(CASES))
def test_bit_identical_with_the_hf_class(case: str, x_dtype: torch.dtype, w_dtype: torch.dtype) -> None:
    make_hf, (preset, shape, options), x_shape, gated = CASES[case]
    hf = randomize_(make_hf()).to(w_dtype)
    ours = lnblocks.build_norm(preset, shape, dtype=w_dtype, backend="torch", **options)
    if list(hf.parameters()):
        copy_params(hf, ours)
    x = (torch.randn(x_shape) * 3 + 0.5).to(x_dtype)
    inputs = [x, torch.randn(x_shape).to(x_dtype)] if gated else [x]
    y_hf, g_hf, grad_out = _run(hf, inputs)
    y, g, _ = _run(ours, inputs, grad_out)
    assert y.dtype == y_hf.dtype == ours.output_dtype(x_dtype)
    assert torch.equal(y, y_hf)
    for a, b in zip(g, g_hf, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("case", ["MambaRMSNormGated-groups", "FalconH1RMSNormGated"])
def test_gated_without_a_gate(case: str) -> None:
    """``forward(x, gate=None)``: the HF classes skip the gate; so does the module."""
    make_hf, (preset, shape, options), x_shape, _ = CASES[case]
    hf = randomize_(make_hf()).to(torch.bfloat16)
    ours = lnblocks.build_norm(preset, shape, dtype=torch.bfloat16, **options)
    copy_params(hf, ours)
    x = torch.randn(x_shape).bfloat16()
    assert torch.equal(ours(x), hf(x))


@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_nemotron_autocast_rule_on_cpu(w_dtype: torch.dtype) -> None:
    """NemotronLayerNorm1P reads ``torch.is_autocast_enabled()`` (CUDA's flag: no cast under CPU autocast) and turns
    autocast off around ``F.layer_norm``; the module does the same (the CUDA cast: tests/kernels, on a GPU)."""
    hf = randomize_(_hf("nemotron", "NemotronLayerNorm1P", N)).to(w_dtype)
    ours = lnblocks.build_norm("nemotron", N, dtype=w_dtype)
    copy_params(hf, ours)
    for x in (torch.randn(3, N).bfloat16(), torch.randn(3, N)):
        if x.dtype == torch.float32 and w_dtype == torch.bfloat16:
            continue  # F.layer_norm on CPU refuses fp32 input with bf16 parameters (so does the class)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y_hf, y = hf(x), ours(x)
        assert y.dtype == y_hf.dtype == x.dtype and torch.equal(y, y_hf)


def test_the_rounding_is_observable() -> None:
    """Tests that cannot tell the variants apart would prove nothing: the gate position, the cast order and
    Nemotron's ``1 + w`` in the weight's dtype each change bf16 outputs."""

    def out(preset, dtype=torch.bfloat16, **options):
        norm = lnblocks.build_norm(preset, N, dtype=dtype, **options)
        torch.manual_seed(0)
        with torch.no_grad():
            for p in norm.parameters():
                p.copy_(torch.randn_like(p) * 0.5 + 1)
        x, g = torch.randn(64, N).to(dtype) * 3, torch.randn(64, N).to(dtype)
        return norm(x, g) if "gated" in preset else norm(x)

    assert not torch.equal(out("mamba2_gated"), out("qwen3_next_gated"))
    assert not torch.equal(out("qwen3_next_gated"), out("falcon_h1_gated"))
    assert not torch.equal(out("nemotron"), out("te_layernorm"))
    assert not torch.equal(out("cohere", torch.float32), out("layernorm", torch.float32, bias=False))
