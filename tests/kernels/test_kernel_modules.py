"""``lnblocks.norms`` modules with ``backend="triton"`` against the same modules with ``backend="torch"`` and fp64."""

from __future__ import annotations

import pytest
import torch

from lnblocks.norms import build_norm
from tests.kernels.kernel_helpers import ATOL, DEVICE, assert_close_to_fp64

N = 48
PRESETS = ["layernorm", "rmsnorm", "llama", "gemma", "olmo2", "t5", "bert", "te_layernorm", "te_rmsnorm"]


def _modules(preset: str, dtype: torch.dtype, **options):
    if preset == "rmsnorm":
        options.setdefault("eps", 1e-6)  # eps=None would mean a different eps in fp64
    torch_m = build_norm(preset, N, backend="torch", dtype=dtype, device=DEVICE, **options)
    with torch.no_grad():
        for p in torch_m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    triton_m = build_norm(preset, N, backend="triton", dtype=dtype, device=DEVICE, **options)
    fp64_m = build_norm(preset, N, backend="torch", dtype=torch.float64, device=DEVICE, **options)
    triton_m.load_state_dict(torch_m.state_dict())
    fp64_m.load_state_dict(torch_m.state_dict())
    return torch_m, triton_m, fp64_m


def _run(module, x, r):
    x = x.detach().requires_grad_()
    r = None if r is None else r.detach().requires_grad_()
    out = module(x) if r is None else module(x, residual=r)
    y, z = (out, None) if r is None else out
    gen = torch.Generator().manual_seed(1)
    loss = (y.double() * torch.randn(y.shape, generator=gen, dtype=torch.float64).to(y.device)).sum()
    if z is not None:
        loss = loss + (z.double() * torch.randn(z.shape, generator=gen, dtype=torch.float64).to(z.device)).sum()
    leaves = [x] + ([] if r is None else [r]) + [p for _, p in sorted(module.named_parameters())]
    return y, z, torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("preset", PRESETS)
def test_triton_module_matches_torch_module(preset: str, dtype: torch.dtype, residual: bool) -> None:
    torch_m, triton_m, fp64_m = _modules(preset, dtype)
    x = torch.randn(2, 3, N, dtype=dtype, device=DEVICE) + 0.3
    r = torch.randn(2, 3, N, dtype=dtype, device=DEVICE) if residual else None
    y_t, z_t, g_t = _run(torch_m, x, r)
    y_k, z_k, g_k = _run(triton_m, x, r)
    y_64, _, g_64 = _run(fp64_m, x.double(), None if r is None else r.double())
    assert triton_m.last_backend == "triton" and torch_m.last_backend == "torch"
    assert y_k.dtype == y_t.dtype and y_k.shape == y_t.shape
    assert_close_to_fp64("y", y_k, y_t, y_64, ATOL[dtype])
    if residual:
        assert z_k.dtype == z_t.dtype and torch.equal(z_k, z_t), "new residual differs from eager"
    for i, (a, b, c) in enumerate(zip(g_k, g_t, g_64)):
        assert a.dtype == b.dtype
        assert_close_to_fp64(f"grad {i}", a, b, c, ATOL[dtype] * (2.5 if a.dim() == 1 else 1.0))


@pytest.mark.parametrize("preset", ["layernorm", "llama", "t5"])
def test_residual_in_fp32_module(preset: str) -> None:
    torch_m, triton_m, fp64_m = _modules(preset, torch.bfloat16, residual_in_fp32=True)
    x, r = (torch.randn(4, N, dtype=torch.bfloat16, device=DEVICE) for _ in range(2))
    y_t, z_t, g_t = _run(torch_m, x, r)
    y_k, z_k, g_k = _run(triton_m, x, r)
    y_64, _, g_64 = _run(fp64_m, x.double(), r.double())
    assert z_k.dtype == torch.float32 and torch.equal(z_k, z_t)
    assert y_k.dtype == y_t.dtype
    assert_close_to_fp64("y", y_k, y_t, y_64, ATOL[torch.bfloat16])
    for i, (a, b, c) in enumerate(zip(g_k, g_t, g_64)):
        assert a.dtype == b.dtype
        assert_close_to_fp64(f"grad {i}", a, b, c, ATOL[torch.bfloat16] * 2)


def test_fp32_parameters_with_bf16_input() -> None:
    """Mixed precision: fp32 master weights, bf16 activations; grads come back fp32."""
    torch_m, triton_m, fp64_m = _modules("llama", torch.float32)
    x = torch.randn(4, N, dtype=torch.bfloat16, device=DEVICE)
    y_t, _, g_t = _run(torch_m, x, None)
    y_k, _, g_k = _run(triton_m, x, None)
    y_64, _, g_64 = _run(fp64_m, x.double(), None)
    assert y_k.dtype == y_t.dtype == torch.float32
    assert_close_to_fp64("y", y_k, y_t, y_64, ATOL[torch.bfloat16])
    assert g_k[0].dtype == torch.bfloat16 and g_k[1].dtype == torch.float32
    for i, (a, b, c) in enumerate(zip(g_k, g_t, g_64)):
        assert_close_to_fp64(f"grad {i}", a, b, c, ATOL[torch.bfloat16] * 2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_default_eps_is_the_compute_dtypes(dtype: torch.dtype) -> None:
    """``RMSNorm(eps=None)`` means fp32's machine epsilon for half inputs (``F.rms_norm``); the fused path used the
    half dtype's (bf16: 0.0078), which changes every output of a row with a small mean square."""
    torch_m = build_norm("rmsnorm", N, backend="torch", dtype=dtype, device=DEVICE)
    triton_m = build_norm("rmsnorm", N, backend="triton", dtype=dtype, device=DEVICE)
    x = (torch.randn(4, N, device=DEVICE) * 1e-2).to(dtype)  # mean square ~1e-4, far from either eps
    y_t, y_k = torch_m(x), triton_m(x)
    y_64 = build_norm(
        "rmsnorm", N, backend="torch", dtype=torch.float64, device=DEVICE, eps=torch.finfo(torch.float32).eps
    )(x.double())
    assert_close_to_fp64("y", y_k, y_t, y_64, ATOL[dtype])
