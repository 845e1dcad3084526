"""Each HF norm class against the lnblocks preset that claims its math: bit-identical outputs, dtypes and grads.

The HF classes are imported from ``transformers`` itself (not copied), in the weight/input dtype pairs that occur in
practice: a half-precision model, an fp32 model, and fp32 master weights receiving half-precision activations.
"""

from __future__ import annotations

import importlib

import pytest
import torch

import lnblocks
from tests.norms.helpers import SIZES, copy_params, randomize_, run_fwd_bwd

pytest.importorskip("transformers")

HF_CLASSES = {
    # preset: (module path, class name, eps attribute name)
    "llama": ("transformers.models.llama.modeling_llama", "LlamaRMSNorm"),
    "mistral": ("transformers.models.mistral.modeling_mistral", "MistralRMSNorm"),
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", "Qwen2RMSNorm"),
    "phi3": ("transformers.models.phi3.modeling_phi3", "Phi3RMSNorm"),
    "gemma": ("transformers.models.gemma.modeling_gemma", "GemmaRMSNorm"),
    "olmo2": ("transformers.models.olmo2.modeling_olmo2", "Olmo2RMSNorm"),
    "t5": ("transformers.models.t5.modeling_t5", "T5LayerNorm"),
}
DTYPE_PAIRS = [  # (input dtype, weight dtype)
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float16),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float32),
]


def _hf_norm(preset: str, n: int, eps: float) -> torch.nn.Module:
    module_path, name = HF_CLASSES[preset]
    cls = getattr(importlib.import_module(module_path), name)
    return cls(n, eps=eps)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize(("x_dtype", "w_dtype"), DTYPE_PAIRS)
@pytest.mark.parametrize("preset", list(HF_CLASSES))
def test_against_hf_norm_class(preset: str, n: int, x_dtype: torch.dtype, w_dtype: torch.dtype) -> None:
    eps = 1e-6
    hf = randomize_(_hf_norm(preset, n, eps)).to(w_dtype)
    ours = lnblocks.build_norm(preset, n, eps=eps, dtype=w_dtype)
    copy_params(hf, ours)
    x = torch.randn(2, 3, n).to(x_dtype) * 3
    y_hf, grads_hf = run_fwd_bwd(hf, x)
    g = torch.randn_like(y_hf)
    y_hf, grads_hf = run_fwd_bwd(hf, x, g)
    y, grads = run_fwd_bwd(ours, x, g)
    assert y.dtype == y_hf.dtype == ours.output_dtype(x_dtype)
    assert torch.equal(y, y_hf)
    for a, b in zip(grads, grads_hf, strict=True):
        assert torch.equal(a, b)


def test_gemma_offset_is_added_in_fp32() -> None:
    """A bf16 weight of 2^-8 must act as 1.00390625, not round 1 + w back to 1.0 (Liger-Kernel#1462)."""
    norm = lnblocks.build_norm("gemma", 4, dtype=torch.bfloat16)
    with torch.no_grad():
        norm.weight.fill_(2.0**-8)
    x = torch.full((1, 4), 3.0, dtype=torch.float32)
    y = norm(x)
    assert y.dtype == torch.float32
    assert torch.allclose(y, torch.full_like(y, 1.0 + 2.0**-8), rtol=0, atol=1e-6)
    rounded_first = (torch.ones(4, dtype=torch.bfloat16) + norm.weight.detach()).float()
    assert torch.equal(rounded_first, torch.ones(4))  # the wrong order would give exactly 1.0


def test_llama_and_fp32_cast_orders_differ_in_bf16() -> None:
    """The cast order is observable: a test that cannot tell the modes apart would prove nothing."""
    x = torch.randn(64, 512).bfloat16() * 3
    a, b = lnblocks.RMSNorm(512, eps=1e-6, cast="llama"), lnblocks.RMSNorm(512, eps=1e-6, cast="fp32")
    with torch.no_grad():
        a.weight.normal_()
        b.weight.copy_(a.weight)
    a.to(torch.bfloat16), b.to(torch.bfloat16)
    assert not torch.equal(a(x), b(x))


@pytest.mark.parametrize("preset", list(HF_CLASSES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_row_blocks_are_bit_identical(preset: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU inference path for half inputs (cache-sized row blocks) must not change a single bit; training, fp32
    inputs and multi-threaded runs do not take it."""
    from lnblocks.norms import functional, modules

    n = 96
    monkeypatch.setattr(modules, "CPU_BLOCK_BYTES", 4 * n * 3)  # 3-row blocks; 50 rows leave a 2-row remainder
    blocks = []
    math = functional._rms_norm  # the function a route runs, counted (routes take it when they are made)
    monkeypatch.setattr(functional, "_rms_norm", lambda h, *args: blocks.append(h.numel() // n) or math(h, *args))
    hf = randomize_(_hf_norm(preset, n, 1e-6)).to(dtype)
    ours = lnblocks.build_norm(preset, n, eps=1e-6, dtype=dtype)
    copy_params(hf, ours)
    x = torch.randn(5, 10, n).to(dtype)
    g = torch.randn(5, 10, n).to(dtype)
    with torch.no_grad():
        assert torch.equal(ours(x), hf(x))
    blocks.clear()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    with torch.inference_mode():
        ours(x)
    assert blocks == [50], "row blocks are for single-threaded CPU inference only"
    blocks.clear()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            ours(x.float())  # an fp32 input: no blocks
            assert blocks == [50], "row blocks are for half-precision inputs only"
            blocks.clear()
            y = ours(x)
    finally:
        torch.set_num_threads(threads)
    assert blocks == [3] * 16 + [2], "the row-block path was not taken"
    assert torch.equal(y, hf(x)) and y.shape == (5, 10, n)
    y_hf, grads_hf = run_fwd_bwd(hf, x, g)
    y, grads = run_fwd_bwd(ours, x, g)
    assert torch.equal(y, y_hf)
    for a, b in zip(grads, grads_hf, strict=True):
        assert torch.equal(a, b)
