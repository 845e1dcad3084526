"""The kinds the 2025-26 families brought, fused: gated RMSNorm (gate before/after, silu/sigmoid, groups), l2norm,
per-head and grouped statistics, DyT and Derf, the Cohere and Nemotron-1P LayerNorms, forward and backward (the
gate's and the scalars' gradients too) against fp64 and eager, with the residual add fused where the kind takes one.
Outputs are NaN-poisoned (tests/kernels/conftest.py), so an element a kernel forgets to write fails."""

from __future__ import annotations

import pytest
import torch

from lnblocks.kernels.functional import fused_add_norm, fused_gated_rms_norm
from lnblocks.norms import functional as LF
from lnblocks.norms.spec import DerfSpec, DyTSpec, GatedRMSNormSpec, L2NormSpec, RMSNormSpec
from tests.kernels.kernel_helpers import ATOL, DEVICE, DTYPES, assert_close_to_fp64
from tests.kernels.module_helpers import check_call, randn

N = 48


def _plain(m, x):
    return m(x)


def _with_residual(m, x, r):
    return m(x, residual=r)


def _gated(m, x, g):
    return m(x, g)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("preset", "options"),
    [
        ("mamba2_gated", {}),  # gate before, silu, llama cast
        ("mamba2_gated", {"group_size": 16}),  # Mamba2 / NemotronH groups
        ("qwen3_next_gated", {}),  # gate after, llama cast (the product rounded)
        ("falcon_h1_gated", {"group_size": 12}),  # gate after, fp32 cast, groups
        ("falcon_h1_gated", {"gate": "before", "activation": "sigmoid"}),
        ("qwen3_next_gated", {"activation": "sigmoid", "elementwise_affine": False}),
    ],
    ids=["before", "before-groups", "after-llama", "after-fp32-groups", "before-sigmoid", "after-no-weight"],
)
def test_gated_rmsnorm(preset: str, options: dict, dtype: torch.dtype) -> None:
    x, g = randn(3, 5, N, dtype=dtype, offset=0.3), randn(3, 5, N, dtype=dtype)
    check_call(preset, N, dtype, _gated, [x, g], **options)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_gated_rmsnorm_without_a_gate_and_fp32_weights(dtype: torch.dtype) -> None:
    """``norm(x)`` without a gate is the grouped RMSNorm; fp32 weights with half inputs (mixed precision)."""
    check_call("mamba2_gated", N, torch.float32, _plain, [randn(4, N, dtype=dtype)], group_size=24)
    check_call("qwen3_next_gated", N, torch.float32, _gated, [randn(4, N, dtype=dtype), randn(4, N, dtype=dtype)])


@pytest.mark.parametrize("position", ["before", "after"])
def test_gated_looped_path(position: str) -> None:
    """Groups wider than one register block: the chunk loop (``max_block_n``), the gate in both passes."""
    spec = GatedRMSNormSpec(gate=position, group_size=40, eps=1e-6)
    leaves = [randn(3, 80, dtype=torch.bfloat16).requires_grad_() for _ in range(2)]
    w = randn(80, dtype=torch.bfloat16, scale=0.3, offset=1.0).requires_grad_()
    leaves.append(w)
    y = fused_gated_rms_norm(leaves[0], leaves[1], w, spec, max_block_n=16)

    def ref(x, g, w):
        return LF.gated_rms_norm(x, g, (80,), w, 1e-6, position, "silu", "llama", 40)

    eager, ref64 = ref(*leaves), ref(*(t.double() for t in leaves))
    assert_close_to_fp64("y", y, eager, ref64, ATOL[torch.bfloat16])
    gy = torch.randn(y.shape, dtype=torch.float64, device=DEVICE)
    grads = [torch.autograd.grad(out, leaves if out is not ref64 else None, gy.to(out.dtype)) for out in (y, eager)]
    leaves64 = [t.double().detach().requires_grad_() for t in leaves]
    g64 = torch.autograd.grad(ref(*leaves64), leaves64, gy)
    for name, a, b, c in zip(("dx", "dgate", "dweight"), grads[0], grads[1], g64, strict=True):
        assert_close_to_fp64(name, a, b, c, ATOL[torch.bfloat16] * (2 if name == "dweight" else 1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_l2norm(reduction: str, dtype: torch.dtype) -> None:
    check_call("l2norm", N, dtype, _plain, [randn(2, 3, N, dtype=dtype)], reduction=reduction)
    if reduction == "mean":  # the residual add fused in front, as for every kind the kernels run
        check_call("llama4_qk", N, dtype, _with_residual, [randn(6, N, dtype=dtype), randn(6, N, dtype=dtype)])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("preset", ["cohere_qk", "rmsnorm"])
def test_per_head_weights(preset: str, dtype: torch.dtype) -> None:
    """Weights of shape (heads, head_dim), statistics over head_dim: Cohere's qk-norm (and the RMS form)."""
    x = randn(2, 3, 4, 12, dtype=dtype, offset=0.5)  # (B, T, heads, head_dim)
    check_call(preset, (4, 12), dtype, _plain, [x], per_head=True, **({"eps": 1e-6} if preset == "rmsnorm" else {}))


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_grouped_statistics_with_residual(kind: str) -> None:
    x, r = randn(5, N, dtype=torch.bfloat16), randn(5, N, dtype=torch.bfloat16)
    check_call(kind, N, torch.bfloat16, _with_residual, [x, r], group_size=12, **({"eps": 1e-6} if kind == "rmsnorm"
                                                                                   else {}))  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("preset", ["nemotron", "cohere"])
def test_hf_layernorm_variants(preset: str, dtype: torch.dtype) -> None:
    """Nemotron's ``1 + w`` rounded to the weight's dtype, Cohere's written-out LayerNorm: fused like LayerNorm."""
    x, r = randn(5, N, dtype=dtype, offset=0.5), randn(5, N, dtype=dtype)
    check_call(preset, N, dtype, _plain, [x])
    check_call(preset, N, dtype, _with_residual, [x, r])


def test_nemotron_one_plus_w_is_rounded_in_the_weights_dtype() -> None:
    """A bf16 w of 2^-9: ``weight + 1`` in bf16 is 1.0 (NemotronLayerNorm1P), in fp32 it is not (zero_centered)."""
    x = randn(4, N, dtype=torch.bfloat16)
    outs = []
    for preset in ("nemotron", "te_layernorm"):
        from lnblocks.norms import build_norm

        norm = build_norm(preset, N, backend="triton", dtype=torch.bfloat16, device=DEVICE)
        with torch.no_grad():
            norm.weight.fill_(2.0**-9)
            norm.bias.zero_()
        outs.append(norm(x.float()))
    plain = build_norm("layernorm", N, backend="triton", device=DEVICE)(x.float())
    assert torch.equal(outs[0], plain) and not torch.equal(outs[1], plain)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["dyt", "derf"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_pointwise_norms(kind: str, residual: bool, dtype: torch.dtype) -> None:
    """DyT and Derf: no statistics; the gradients of alpha (and shift) are sums over every element."""
    x = randn(3, 7, N, dtype=dtype, scale=2.0)
    if residual:
        check_call(kind, N, dtype, _with_residual, [x, randn(3, 7, N, dtype=dtype)])
    else:
        check_call(kind, N, dtype, _plain, [x])


@pytest.mark.parametrize("kind", ["dyt", "derf"])
def test_pointwise_options_and_looped_path(kind: str) -> None:
    """No affine / no bias, and rows wider than a register block (the chunk loop, one pass)."""
    check_call(kind, N, torch.float32, _plain, [randn(4, N, dtype=torch.float32)], elementwise_affine=False)
    check_call(kind, N, torch.float32, _plain, [randn(4, N, dtype=torch.float32)], bias=False)
    spec = DyTSpec() if kind == "dyt" else DerfSpec()
    x = randn(3, 100, dtype=torch.float32, scale=2.0).requires_grad_()
    alpha = torch.tensor([0.7], device=DEVICE, requires_grad=True)
    shift = torch.tensor([0.2], device=DEVICE, requires_grad=True) if kind == "derf" else None
    w, b = (randn(100, dtype=torch.float32).requires_grad_() for _ in range(2))
    leaves = [t for t in (x, alpha, shift, w, b) if t is not None]

    def ref(x, alpha, *rest):
        return LF.dyt(x, alpha, *rest) if kind == "dyt" else LF.derf(x, alpha, *rest)

    y = fused_add_norm(x, None, w, b, spec, alpha=alpha, shift=shift, max_block_n=32)
    eager = ref(*leaves)
    leaves64 = [t.double().detach().requires_grad_() for t in leaves]
    ref64 = ref(*leaves64)
    assert_close_to_fp64("y", y, eager, ref64, ATOL[torch.float32])
    gy = torch.randn(y.shape, dtype=torch.float64, device=DEVICE)
    g_k, g_t = (torch.autograd.grad(o, leaves, gy.float()) for o in (y, eager))
    g_64 = torch.autograd.grad(ref64, leaves64, gy)
    for i, (a, b_, c) in enumerate(zip(g_k, g_t, g_64, strict=True)):
        assert_close_to_fp64(f"grad {i}", a, b_, c, ATOL[torch.float32] * (20 if a.numel() <= 100 else 1))


def test_l2norm_sum_functional_against_the_formula() -> None:
    """The unit-L2 reduction written out in fp64: ``x / sqrt(sum(x^2) + eps)``."""
    x = randn(4, 24, dtype=torch.float32, scale=3.0)
    y = fused_add_norm(x, None, None, None, L2NormSpec(reduction="sum", eps=1e-6))
    x64 = x.double()
    ref = x64 / (x64.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    assert (y.double() - ref).abs().max().item() <= 1e-6
    assert torch.allclose(y.double().norm(dim=-1), torch.ones(4, dtype=torch.float64), atol=1e-5)
    with pytest.raises(ValueError, match="weight: the spec \\(l2norm\\) has no weight"):
        fused_add_norm(x, None, torch.ones(24, device=DEVICE), None, L2NormSpec())
    assert RMSNormSpec(group_size=8).group_size == 8


@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA autocast: the flag NemotronLayerNorm1P reads is CUDA's")
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_nemotron_under_cuda_autocast(backend: str) -> None:
    """Under CUDA autocast the input, ``1 + w`` and the bias go to the autocast dtype: bit-identical with the class on
    the torch backend, within the kernel rule on the fused one (its gradients flow through the casts)."""
    import importlib

    from lnblocks.norms import build_norm

    pytest.importorskip("transformers")
    cls = importlib.import_module("transformers.models.nemotron.modeling_nemotron").NemotronLayerNorm1P
    hf = cls(N).to(DEVICE)
    ours = build_norm("nemotron", N, backend=backend, device=DEVICE)
    with torch.no_grad():
        hf.weight.normal_(0, 0.3)
        hf.bias.normal_(0, 0.3)
    ours.load_state_dict(hf.state_dict())
    x = randn(4, N, dtype=torch.float32)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y_hf, y = hf(x), ours(x)
    assert y.dtype == y_hf.dtype == torch.bfloat16
    if backend == "torch":
        assert torch.equal(y, y_hf)
    else:
        ref = build_norm("nemotron", N, dtype=torch.float64, device=DEVICE)
        ref.load_state_dict(hf.state_dict())
        assert_close_to_fp64("y", y, y_hf, ref(x.double()), ATOL[torch.bfloat16])
