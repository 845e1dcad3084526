"""The memory-efficient backward (``memory_efficient=True``, Apex's scheme): the forward saves y instead of the norm's
input and the backward rebuilds x_hat = (y - b) / w. Its gradients are held to the kernel rule against fp64 and
against the default backward; a weight it cannot invert is refused with the element named; and what autograd keeps
is measured with ``torch.autograd.graph.saved_tensors_hooks``: one (M, N) activation less per norm when the next
layer keeps y anyway."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lnblocks.config import ConfigValueError
from lnblocks.kernels.functional import fused_add_norm
from lnblocks.norms import build_norm, norm_spec
from tests.kernels.kernel_helpers import ATOL, DEVICE, DTYPES, assert_close_to_fp64
from tests.kernels.module_helpers import randn, run, triple

N = 48


def _with_residual(m, x, r):
    return m(x, residual=r)


def _plain(m, x):
    return m(x)


def _away_from_zero(module: nn.Module) -> None:
    """Weights in +-[0.5, 1.5] (random signs) and small biases: what the rule accepts."""
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in module.named_parameters():
            r = torch.rand(p.shape, generator=gen)
            if name == "weight":
                sign = torch.where(torch.rand(p.shape, generator=gen) < 0.5, -1.0, 1.0)
                value = sign * (0.5 + r) - (1.0 if module.spec.zero_centered else 0.0)
            else:
                value = r * 0.2 - 0.1
            p.copy_(value.to(p.dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("preset", "options"),
    [("layernorm", {}), ("llama", {}), ("gemma", {}), ("rmsnorm", {"eps": 1e-6, "group_size": 12}),
     ("l2norm", {}), ("t5", {})],
    ids=["layernorm", "llama", "gemma-zero-centred", "rms-groups", "l2norm", "t5"],
)  # fmt: skip
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_gradients_within_the_kernel_tolerance(preset: str, options: dict, dtype: torch.dtype, residual: bool) -> None:
    efficient, eager, fp64 = triple(preset, N, dtype, memory_efficient=False, **options)
    default = build_norm(preset, N, backend="triton", dtype=dtype, device=DEVICE, **options)
    for m in (efficient, eager, fp64, default):
        _away_from_zero(m)
    efficient.spec = efficient.spec.replace(memory_efficient=True)
    x, r = randn(3, 5, N, dtype=dtype, offset=0.3), randn(3, 5, N, dtype=dtype)
    call, inputs = (_with_residual, [x, r]) if residual else (_plain, [x])
    (o_me, g_me), (o_d, g_d), (_, g_t), (_, g_64) = (
        run(m, call, inputs if m is not fp64 else [t.double() for t in inputs]) for m in (efficient, default, eager,
                                                                                           fp64)
    )  # fmt: skip
    rows = x.numel() // N
    for i, (a, b) in enumerate(zip(o_me, o_d, strict=True)):
        assert torch.equal(a, b), f"output {i}: the forward must not change"
    for i, (a, d, t, c) in enumerate(zip(g_me, g_d, g_t, g_64, strict=True)):
        tol = ATOL[dtype] * (rows**0.5 if a.dim() == 1 else 1.0)
        assert_close_to_fp64(f"grad {i} vs eager", a, t, c, tol)
        assert_close_to_fp64(f"grad {i} vs the default backward", a, d, c, tol)


def test_dropout_and_fp32_weights() -> None:
    """Dropout without a residual: x_hat comes from y, the mask still from the seed (dx); fp32 master weights."""
    spec = norm_spec("layernorm", memory_efficient=True)
    x = randn(6, N, dtype=torch.bfloat16).requires_grad_()
    w = (torch.rand(N, device=DEVICE) + 0.5).requires_grad_()
    b = (torch.rand(N, device=DEVICE) * 0.2).requires_grad_()
    specs = (spec, spec.replace(memory_efficient=False))
    outs = [fused_add_norm(x, None, w, b, s, dropout_p=0.2, seed=7) for s in specs]
    gy = torch.randn(outs[0].shape, device=DEVICE).to(torch.bfloat16)
    grads = [torch.autograd.grad(y, [x, w, b], gy) for y in outs]
    assert torch.equal(outs[0], outs[1])
    for a, d in zip(*grads):
        torch.testing.assert_close(a.float(), d.float(), atol=ATOL[torch.bfloat16] * 2, rtol=2e-2)


def _saved_bytes(stack: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd keeps for the backward (a tensor two ops save counts once)."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        stack(x).sum().backward()
    return sum(storages.values())


class _PreNormStack(nn.Module):
    """``layers`` pre-norm residual steps: the fused add+norm, then a Linear that keeps the norm's output."""

    def __init__(self, preset: str, layers: int, memory_efficient: bool) -> None:
        super().__init__()
        self.norms = nn.ModuleList(build_norm(preset, N, backend="triton", device=DEVICE, dtype=torch.bfloat16,
                                              memory_efficient=memory_efficient) for _ in range(layers))  # fmt: skip
        self.linears = nn.ModuleList(nn.Linear(N, N, device=DEVICE, dtype=torch.bfloat16) for _ in range(layers))
        for norm in self.norms:
            _away_from_zero(norm)

    def forward(self, x):
        h, residual = self.norms[0](x), x
        for norm, linear in zip(self.norms[1:], self.linears):
            h, residual = norm(linear(h), residual=residual)
        return self.linears[-1](h) + residual


@pytest.mark.parametrize("preset", ["llama", "layernorm"])
def test_saved_bytes_per_layer(preset: str) -> None:
    """Each memory-efficient norm saves y, which the next Linear keeps anyway, instead of the new residual: one (M, N)
    activation less per layer (M * N * 2 bytes in bf16), measured on what autograd keeps."""
    x = randn(4, 16, N, dtype=torch.bfloat16)  # M = 64 rows
    layers = 3
    default = _saved_bytes(_PreNormStack(preset, layers, False), x.requires_grad_())
    efficient = _saved_bytes(_PreNormStack(preset, layers, True), x)
    per_layer = (default - efficient) / layers
    activation = x.numel() * x.element_size()
    # LayerNorm: its fp32 mean per row is not saved either, but its bias is (N elements): x_hat = (y - b) / w
    mean_less_bias = 0 if preset == "llama" else 4 * x.numel() // N - N * x.element_size()
    assert per_layer == activation + mean_less_bias, (default, efficient, per_layer)


def test_weights_it_cannot_invert_are_refused() -> None:
    norm = build_norm("layernorm", N, backend="triton", device=DEVICE, memory_efficient=True)
    x = randn(3, N, dtype=torch.float32)
    norm(x.requires_grad_()).sum().backward()  # ones / zeros: fine
    with torch.no_grad():
        norm.weight[5] = 0.0
    with pytest.raises(ValueError, match=r"memory_efficient=True: .*element 5 has weight 0.*memory_efficient=False"):
        norm(x)
    with torch.no_grad():
        norm(x)  # no backward will run: nothing to refuse
        norm.weight[5] = 0.05
        norm.bias[5] = 1.0  # |w| < |b| / 8: the rebuilt x_hat would carry 20x y's rounding
    with pytest.raises(ValueError, match=r"element 5 has weight 0.05, bias 1"):
        norm(x)
    with torch.no_grad():
        norm.bias[5] = 0.1  # a new version of the bias: checked again, and fine
    norm(x).sum().backward()
    rms = build_norm("gemma", N, backend="triton", device=DEVICE, memory_efficient=True)
    with torch.no_grad():
        rms.weight[2] = -1.0  # zero-centred: the effective weight 1 + w is 0
    with pytest.raises(ValueError, match="element 2 has weight 0"):
        rms(x)


def test_refused_where_it_cannot_apply() -> None:
    with pytest.raises(ConfigValueError, match="memory_efficient needs the fused kernels"):
        build_norm("layernorm", N, backend="torch", memory_efficient=True)
    with pytest.raises(ValueError, match="memory_efficient is not a config key"):
        build_norm("dyt", N, memory_efficient=True)  # y = w * tanh(a x) + b: not invertible near saturation
    norm = build_norm("rmsnorm", N, backend="triton", device=DEVICE, memory_efficient=True, eps=1e-6)
    x = randn(3, N, dtype=torch.float32).requires_grad_()
    with pytest.raises(RuntimeError, match="memory_efficient=True has no double backward"):
        torch.autograd.grad(norm(x).pow(2).sum(), [x], create_graph=True)


def test_the_check_runs_once_per_parameter_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """No reduction per micro-batch: the weight is checked again only after it changed (an optimizer step)."""
    from lnblocks.kernels import run as run_module

    calls = []
    original = run_module.torch.full_like
    monkeypatch.setattr(run_module.torch, "full_like", lambda *a, **k: calls.append(1) or original(*a, **k))
    norm = build_norm("llama", N, backend="triton", device=DEVICE, memory_efficient=True)
    x = randn(2, N, dtype=torch.float32).requires_grad_()
    for _ in range(3):
        norm(x).sum().backward()
    assert len(calls) == 1
    with torch.no_grad():
        norm.weight.mul_(1.5)  # what an optimizer step does: a new version
    norm(x).sum().backward()
    assert len(calls) == 2


def test_weight_data_replaced_is_checked_again() -> None:
    norm = build_norm("rmsnorm", N, backend="triton", device=DEVICE, memory_efficient=True, eps=1e-6)
    x = randn(2, N, dtype=torch.float32).requires_grad_()
    norm(x).sum().backward()
    norm.weight.data = torch.zeros(N, device=DEVICE)  # bypasses every hook: a new storage
    with pytest.raises(ValueError, match="element 0 has weight 0"):
        norm(x)
