"""The per-call routing of ``lnblocks.norms`` modules: the backend decision is cached per (device kind, dtypes), and
everything that could make a cached decision wrong either invalidates it or is still checked on every call."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lnblocks.norms import build_norm
from tests.kernels.kernel_helpers import DEVICE

N = 32


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_wrong_shapes_are_errors_after_the_first_call(backend: str) -> None:
    norm = build_norm("llama", N, backend=backend, device=DEVICE)
    norm(torch.randn(2, N, device=DEVICE))  # the decision is now cached
    with pytest.raises(ValueError, match=r"x: expected trailing dimension\(s\) \(32,\)"):
        norm(torch.randn(2, 1, device=DEVICE))  # would broadcast against the weight
    with pytest.raises(ValueError, match="x: expected trailing"):
        norm(torch.tensor(1.0, device=DEVICE))
    x = torch.randn(2, N, device=DEVICE)
    norm(x, residual=torch.randn(2, N, device=DEVICE))
    with pytest.raises(ValueError, match="residual: expected the same shape"):
        norm(x, residual=torch.randn(1, N, device=DEVICE))
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor"):
        norm([1.0] * N)


def test_a_new_spec_takes_effect() -> None:
    """``lnblocks.hf`` replaces ``norm.spec`` (eps, backend) on patched modules: the cached plan must follow."""
    norm = build_norm("rmsnorm", N, backend="triton", device=DEVICE, eps=1e-6)
    x = torch.randn(3, N, device=DEVICE) * 1e-2
    y_small_eps = norm(x)
    norm.spec = norm.spec.replace(eps=1.0)
    y_big_eps = norm(x)
    ref = build_norm("rmsnorm", N, backend="torch", device=DEVICE, eps=1.0)(x)
    torch.testing.assert_close(y_big_eps, ref, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(y_small_eps, y_big_eps)
    norm.spec = norm.spec.replace(backend="torch")
    norm(x)
    assert norm.last_backend == "torch"


def test_moving_or_replacing_parameters_takes_effect() -> None:
    norm = build_norm("llama", N, backend="triton", device=DEVICE)
    x = torch.randn(3, N, device=DEVICE, dtype=torch.bfloat16)
    assert norm(x).dtype == torch.float32  # llama: fp32 weight * bf16 x_hat
    norm.to(torch.bfloat16)
    assert norm(x).dtype == torch.bfloat16 and norm.last_backend == "triton"
    norm.weight = nn.Parameter(torch.ones(N, device=DEVICE, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"backend='triton' cannot run here: weight is torch.float64"):
        norm(x)


def test_weight_changed_in_place_is_replanned_not_a_wrong_answer() -> None:
    """``weight.data = ...`` bypasses every hook and keeps the Parameter object: the fused call checks the weight's
    dtype, size and device on every call and plans again (or names the problem), never reads it as the old dtype or
    past its end."""
    norm = build_norm("llama", N, backend="triton", device=DEVICE)
    ref = build_norm("llama", N, backend="torch", device=DEVICE)
    x = torch.randn(3, N, device=DEVICE)
    norm(x)
    for m in (norm, ref):
        m.weight.data = torch.linspace(0.5, 1.5, N, device=DEVICE).to(torch.bfloat16)
    y = norm(x)
    assert y.dtype == ref(x).dtype == torch.float32  # llama: bf16 weight * fp32 x_hat
    torch.testing.assert_close(y, ref(x), rtol=1e-5, atol=1e-5)
    norm.weight.data = torch.ones(N + 1, device=DEVICE)  # one element too many: the kernel would read N of them
    with pytest.raises(ValueError, match=r"^weight: expected shape \(32,\) \(normalized_shape\), got \(33,\)"):
        norm(x)


def test_auto_backend_decides_per_device_kind() -> None:
    norm = build_norm("layernorm", N, backend="auto")
    norm(torch.randn(2, N))
    assert norm.last_backend == "torch"  # CPU: auto never runs the interpreter
    if torch.cuda.is_available():
        norm.cuda()(torch.randn(2, N, device="cuda"))
        assert norm.last_backend == "triton"


class _Doubled(nn.Module):
    def forward(self, w):
        return 2 * w


@pytest.mark.parametrize("preset", ["llama", "layernorm"])
def test_parametrized_weight_is_used(preset: str) -> None:
    """The fast parameter read (``_parameters`` instead of ``nn.Module.__getattr__``) must still see
    ``torch.nn.utils.parametrize`` (which moves the weight out of ``_parameters``)."""
    norm = build_norm(preset, N)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, N)
    y = norm(x)
    torch.nn.utils.parametrize.register_parametrization(norm, "weight", _Doubled())
    y2 = norm(x)
    expected = build_norm(preset, N)
    expected.load_state_dict({k.replace("parametrizations.weight.original", "weight"): v for k, v in
                              norm.state_dict().items()})  # fmt: skip
    with torch.no_grad():
        expected.weight.mul_(2)
    torch.testing.assert_close(y2, expected(x), rtol=0, atol=0)
    assert not torch.equal(y, y2)
