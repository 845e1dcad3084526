"""Module-level parity: every HF norm class, patched, computes exactly what its own forward computes.

Reference: the HF class itself (and ``torch.nn.LayerNorm`` / ``RMSNorm``). The replacements reproduce each class's
cast order op for op (see ``lnblocks.norms.functional``), so outputs, input grads and weight grads are bit-identical
in every dtype (``torch.equal``), not merely close.
"""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from torch import nn

from lnblocks.hf import is_patched, patch_norms
from lnblocks.hf.recognition import math_of_class, recognise
from lnblocks.hf.record import record_of

transformers = pytest.importorskip("transformers")

# (module, class, expected origin, eps attribute)
HF_CLASSES = [
    ("llama", "LlamaRMSNorm", "LlamaRMSNorm math", "variance_epsilon"),
    ("mistral", "MistralRMSNorm", "LlamaRMSNorm math", "variance_epsilon"),
    ("qwen2", "Qwen2RMSNorm", "LlamaRMSNorm math", "variance_epsilon"),
    ("qwen3", "Qwen3RMSNorm", "LlamaRMSNorm math", "variance_epsilon"),
    ("phi3", "Phi3RMSNorm", "LlamaRMSNorm math", "variance_epsilon"),
    ("gemma", "GemmaRMSNorm", "GemmaRMSNorm math", "eps"),
    ("gemma2", "Gemma2RMSNorm", "GemmaRMSNorm math", "eps"),
    ("gemma3", "Gemma3RMSNorm", "GemmaRMSNorm math", "eps"),
    ("olmo2", "Olmo2RMSNorm", "Olmo2RMSNorm math", "variance_epsilon"),
    ("t5", "T5LayerNorm", "T5LayerNorm math", "variance_epsilon"),
]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _hf_class(module: str, name: str) -> type:
    return getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)


def _make(kind: str, dim: int, eps: float) -> nn.Module:
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps)
    if kind == "layernorm_nobias":
        return nn.LayerNorm(dim, eps=eps, bias=False)
    if kind == "layernorm_noaffine":
        return nn.LayerNorm(dim, eps=eps, elementwise_affine=False)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    if kind == "rmsnorm_eps_none":
        return nn.RMSNorm(dim)
    module, name = kind.split(".")
    return _hf_class(module, name)(dim, eps=eps)


def _run(module: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    x = x.clone().requires_grad_()
    y = module(x)
    y.backward(grad)
    weight_grad = [p.grad.clone() for p in module.parameters()]
    for p in module.parameters():
        p.grad = None
    return (y.detach(), x.grad, *weight_grad)


@pytest.mark.parametrize("module_name,cls_name,origin,eps_attr", HF_CLASSES)
def test_hf_classes_recognised_by_their_math(module_name, cls_name, origin, eps_attr):
    math = math_of_class(_hf_class(module_name, cls_name))
    assert math is not None and math.origin == origin and math.eps_attr == eps_attr


KINDS = [
    "layernorm",
    "layernorm_nobias",
    "layernorm_noaffine",
    "rmsnorm",
    "rmsnorm_eps_none",
    *[f"{m}.{c}" for m, c, _, _ in HF_CLASSES],
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 5, 64), (2, 7, 96)], ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_patched_module_bit_identical(kind, shape, dtype):
    torch.manual_seed(0)
    original = _make(kind, shape[-1], eps=1e-5).to(dtype)
    with torch.no_grad():
        for p in original.parameters():
            p.normal_(0.0, 0.02 if "Gemma" in kind else 1.0)  # small Gemma w: a bf16 `1 + w` would round to 1
    patched = copy.deepcopy(original)
    patch_norms(patched)
    assert is_patched(patched)
    x = torch.randn(shape, dtype=dtype) * 3 + 0.5
    grad = torch.randn(shape, dtype=dtype)
    for a, b in zip(_run(original, x, grad), _run(patched, x, grad), strict=True):
        assert a.dtype == b.dtype
        assert torch.equal(a, b)


@pytest.mark.parametrize("kind", ["llama.LlamaRMSNorm", "gemma.GemmaRMSNorm", "olmo2.Olmo2RMSNorm", "t5.T5LayerNorm"])
def test_fp64_inputs_keep_the_hf_fp32_compute(kind):
    # the HF classes compute in fp32 even for fp64 inputs; lnblocks would use fp64, so fp64 runs the original forward
    original = _make(kind, 32, 1e-6).double()
    patched = copy.deepcopy(original)
    patch_norms(patched)
    x = torch.randn(4, 32, dtype=torch.float64)
    assert torch.equal(original(x), patched(x))


def test_eps_is_read_from_the_live_attribute():
    llama = _make("llama.LlamaRMSNorm", 16, 1e-6)
    gemma = _make("gemma.GemmaRMSNorm", 16, 1e-6)
    reference = [copy.deepcopy(llama), copy.deepcopy(gemma)]
    patch_norms(llama)
    patch_norms(gemma)
    x = torch.randn(4, 16) * 1e-2  # small rows: eps matters
    llama.variance_epsilon = reference[0].variance_epsilon = 0.5
    gemma.eps = reference[1].eps = 0.5
    assert torch.equal(llama(x), reference[0](x))
    assert torch.equal(gemma(x), reference[1](x))


@pytest.mark.parametrize("kind", ["gemma2.Gemma2RMSNorm", "olmo2.Olmo2RMSNorm", "layernorm"])
def test_post_branch_norms_do_not_write_their_input(kind):
    # sandwich norms normalise a branch output whose value is still needed (Liger needs in_place=False there)
    module = _make(kind, 32, 1e-6).to(torch.bfloat16)
    patch_norms(module)
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    before, version = x.clone(), x._version
    module(x)
    assert x._version == version and torch.equal(x, before)


class RenamedCopy(nn.Module):
    """Llama's math with other names and a docstring: recognised by its code, not its name."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Normalise."""
        orig: torch.dtype = inputs.dtype
        inputs = inputs.to(torch.float32)
        ms = inputs.pow(2).mean(-1, keepdim=True)
        inputs = inputs * torch.rsqrt(ms + self.variance_epsilon)
        return self.weight * inputs.to(orig)


class WrongCastNorm(RenamedCopy):
    """Same as Llama except the weight multiply happens in fp32: must not be patched with Llama's cast order."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        orig = inputs.dtype
        inputs = inputs.to(torch.float32)
        ms = inputs.pow(2).mean(-1, keepdim=True)
        inputs = inputs * torch.rsqrt(ms + self.variance_epsilon)
        return self.weight.float() * inputs.to(orig)


class CustomLayerNorm(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.float()).to(x.dtype)


def test_recognition_is_by_math_not_by_name():
    assert recognise(RenamedCopy(8)).math.cast == "llama"
    assert recognise(WrongCastNorm(8)).status == "unknown"
    assert recognise(CustomLayerNorm(8)).status == "unknown"
    assert recognise(nn.GroupNorm(2, 8)).status == "skipped"
    assert recognise(nn.Linear(8, 8)) is None
    original = RenamedCopy(24).to(torch.bfloat16)
    with torch.no_grad():
        original.weight.normal_()
    patched = copy.deepcopy(original)
    patch_norms(patched)
    x = torch.randn(3, 24, dtype=torch.bfloat16)
    assert torch.equal(original(x), patched(x))


# ---- LayerNorm classes of OLMo (non-parametric, arXiv 2402.00838) and Cohere ------------------------------------
LAYERNORM_CLASSES = [
    ("olmo", "OlmoLayerNorm", "fp32_input", {}),
    ("cohere", "CohereLayerNorm", "lnblocks", {"eps": 1e-5}),
    ("cohere2", "Cohere2LayerNorm", "lnblocks", {"eps": 1e-5}),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("module_name,cls_name,route,kwargs", LAYERNORM_CLASSES, ids=lambda v: str(v))
def test_olmo_and_cohere_layernorms_patch_bit_identical(module_name, cls_name, route, kwargs, dtype):
    cls = _hf_class(module_name, cls_name)
    math = math_of_class(cls, params=() if route == "fp32_input" else ("weight",))
    assert math is not None and math.kind == "layernorm" and math.torch_route == route
    torch.manual_seed(0)
    original = cls(96, **kwargs).to(dtype)
    with torch.no_grad():
        for p in original.parameters():
            p.normal_(0.0, 1.0)
    patched = copy.deepcopy(original)
    report = patch_norms(patched, backend="torch")
    assert len(report.patched) == 1 and is_patched(patched)
    expected_spec = "layernorm(eps=1e-05, bias=False" + (", affine=False" if route == "fp32_input" else "")
    assert report.patched[0].math.startswith(expected_spec)
    x = torch.randn(3, 7, 96, dtype=dtype) * 3 + 0.5
    grad = torch.randn(3, 7, 96, dtype=dtype)
    for a, b in zip(_run(original, x, grad), _run(patched, x, grad), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    # the fused call a decoder layer makes: (norm(x + r), x + r), the add in the input dtype as HF does it
    r = torch.randn(3, 7, 96, dtype=dtype)
    y, total = patched(x, residual=r)
    assert torch.equal(total, x + r) and torch.equal(y, original(x + r))
    assert torch.equal(patched(x.double()), original(x.double()))  # fp64: the class's fp32 compute


@pytest.mark.parametrize("module_name,cls_name", [("cohere", "CohereLayerNorm"), ("olmo", "OlmoLayerNorm")])
def test_layernorm_classes_without_a_bias_run_the_kernel_route(module_name, cls_name):
    """``backend="triton"`` (``"auto"`` on CUDA): the kernel reads the class's Parameters, and a bias the class
    does not have at all (Cohere) or no Parameter at all (OLMo) is none; the kernel's fp32 math with one rounding
    is within fp32 rounding of the class's."""
    cls = _hf_class(module_name, cls_name)
    torch.manual_seed(0)
    original = cls(96, **({"eps": 1e-5} if module_name == "cohere" else {}))
    with torch.no_grad():
        for p in original.parameters():
            p.normal_(0.0, 1.0)
    patched = copy.deepcopy(original)
    patch_norms(patched, backend="triton")
    x = torch.randn(3, 7, 96) * 3 + 0.5
    torch.testing.assert_close(patched(x), original(x), rtol=1e-5, atol=1e-5)
    assert record_of(patched).norm.last_backend == "triton"


def test_cohere_per_head_layernorm_patches_per_head():
    # Cohere's QK-norm: a (heads, head_dim) weight, normalised over head_dim only: LayerNorm(cast="cohere", per_head)
    original = _hf_class("cohere", "CohereLayerNorm")((4, 16), eps=1e-5).to(torch.bfloat16)
    with torch.no_grad():
        original.weight.normal_()
    patched = copy.deepcopy(original)
    report = patch_norms(patched, backend="torch")
    assert report.patched[0].math == "layernorm(eps=1e-05, bias=False, cast=cohere, per_head)"
    assert record_of(patched).norm.normalized_shape == (4, 16)
    x = torch.randn(2, 3, 4, 16, dtype=torch.bfloat16)
    grad = torch.randn(2, 3, 4, 16, dtype=torch.bfloat16)
    for a, b in zip(_run(original, x, grad), _run(patched, x, grad), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
