"""The kernels inside ``torch.compile(fullgraph=True)`` (custom ops with fake impls: no graph break), the ops'
registration checked by ``torch.library.opcheck``, and the kernels compiled for sm_90 without a GPU
(``benchmarks/kernels/kernel_resources.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from lnblocks.kernels import ops
from lnblocks.kernels.functional import fused_add_norm
from lnblocks.kernels.plan import make_plan
from lnblocks.norms import build_norm
from lnblocks.norms.spec import LayerNormSpec, RMSNormSpec
from tests.kernels.kernel_helpers import DEVICE

N = 32


class PreNormStack(nn.Module):
    """Two pre-norm residual steps with the fused add+norm, as a GPT block stack uses it."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.norms = nn.ModuleList(build_norm(kind, N, backend="triton") for _ in range(2))
        self.mlps = nn.ModuleList(nn.Linear(N, N) for _ in range(2))

    def forward(self, x):
        h, residual = self.norms[0](x), x
        for norm, mlp in zip(self.norms[1:], self.mlps):
            h, residual = norm(mlp(h), residual=residual)
        return self.mlps[-1](h) + residual


@pytest.mark.parametrize("kind", ["layernorm", "llama"])
def test_compiled_fullgraph_matches_eager(kind: str) -> None:
    torch.use_deterministic_algorithms(False)  # Inductor's CPU codegen does not need the poisoned allocator
    model = PreNormStack(kind).to(DEVICE)
    x = torch.randn(2, 3, N, device=DEVICE)
    eager_out = model(x)
    eager_grads = torch.autograd.grad(eager_out.square().sum(), list(model.parameters()))
    compiled = torch.compile(model, fullgraph=True)  # raises on any graph break
    out = compiled(x)
    grads = torch.autograd.grad(out.square().sum(), list(model.parameters()))
    torch.testing.assert_close(out, eager_out, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_compiled_functional_with_dropout_matches_eager() -> None:
    torch.use_deterministic_algorithms(False)
    x, r = torch.randn(4, N, device=DEVICE, requires_grad=True), torch.randn(4, N, device=DEVICE)
    w = torch.randn(N, device=DEVICE, requires_grad=True)
    seed = torch.tensor([123], device=DEVICE)

    def f(x, r, w, seed):
        y, z = fused_add_norm(x, r, w, None, RMSNormSpec(eps=1e-6), dropout_p=0.2, seed=seed)
        return y.sum() + z.square().sum()

    eager = f(x, r, w, seed)
    g_eager = torch.autograd.grad(eager, [x, w])
    out = torch.compile(f, fullgraph=True)(x, r, w, seed)
    g = torch.autograd.grad(out, [x, w])
    torch.testing.assert_close(out, eager)
    for a, b in zip(g, g_eager):
        torch.testing.assert_close(a, b)


def _fwd_args(residual: bool, dropout: bool):
    def randn(*size):
        return torch.randn(*size, device=DEVICE, requires_grad=True)

    x, w, b = randn(5, N), randn(N), randn(N)
    r = randn(5, N) if residual else None
    seed = torch.tensor([9], device=DEVICE) if dropout else None
    plan = make_plan(LayerNormSpec(), x.dtype, None if r is None else r.dtype, w.dtype, None, 0.1 if dropout else 0.0)
    return (x, r, w, b, seed, None, None, None, *plan.op_args())


@pytest.mark.parametrize(("residual", "dropout"), [(False, False), (True, True)], ids=["plain", "residual_dropout"])
def test_opcheck_forward_op(residual: bool, dropout: bool) -> None:
    """Schema, fake impl (shapes, dtypes, strides) and autograd registration of lnblocks::norm_fwd."""
    torch.use_deterministic_algorithms(False)
    torch.library.opcheck(ops.norm_fwd, _fwd_args(residual, dropout))


def test_opcheck_backward_ops() -> None:
    x = torch.randn(5, N, device=DEVICE)
    w = torch.randn(N, device=DEVICE)
    plan = make_plan(LayerNormSpec(), x.dtype, None, w.dtype)
    _, _, mean, rstd = ops.norm_fwd(x, None, w, None, None, None, None, None, *plan.op_args())
    dy = torch.randn(5, N, device=DEVICE)
    args = (dy, None, x, w, None, None, mean, rstd, None, None, None, True, False, False, False, *plan.op_args())
    torch.use_deterministic_algorithms(False)
    torch.library.opcheck(ops.norm_bwd, args)
    torch.library.opcheck(ops.norm_bwd_inplace, args)


ROOT = Path(__file__).resolve().parents[2]
# Slices of benchmarks/kernels/kernel_resources.py's table, for sm_90: the widest single-block rows and the looped
# path, fp32 (the most register pressure) and bf16, every variant that changes the kernel's code (residual, dropout
# with and without a residual), both kernels, both norms; and the backwards that keep more arrays live (the gate, the
# point-wise activation's derivative, the rebuilt x_hat) around their single-block limit, fp32.
_SLICES = {
    "norms": (["--n", "16384", "65536", "--dtype", "float32", "bfloat16", "--variant", "res+dropout", "dropout"],
              2 * 2 * 2 * 2 * 2),  # directions x kinds x sizes x dtypes x variants
    "heavy": (["--n", "4096", "8192", "--dtype", "float32", "--kind", "layernorm", "gated_rmsnorm", "derf",
               "--variant", "memory-efficient", "gate-before", "residual"], 2 * 4 * 2),  # directions x (kind, variant)
    # x sizes: layernorm memory-efficient and residual, gated gate-before, derf residual
}  # fmt: skip


@pytest.mark.parametrize("slice_name", list(_SLICES))
def test_kernel_resources_slice_compiles_without_spills(slice_name: str, tmp_path: Path) -> None:
    """Triton's real compiler + ptxas on the kernels (the interpreter checks neither types nor registers)."""
    script = ROOT / "benchmarks" / "kernels" / "kernel_resources.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    probe = subprocess.run(
        [sys.executable, "-c", "import runpy, sys; m = runpy.run_path(sys.argv[1]); print(m['tools_available']())",
         str(script)], env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if probe.stdout.strip() != "True":
        pytest.skip(f"Triton's NVIDIA tools (ptxas, cuobjdump) are not installed: {probe.stderr[-300:]}")
    out = tmp_path / "resources.json"
    proc = subprocess.run(
        [sys.executable, str(script), "--arch", "90", *_SLICES[slice_name][0], "--no-cache", "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == _SLICES[slice_name][1]
    for r in rows:
        name = f"{r['direction']} {r['kind']} {r['dtype']} {r['variant']} N={r['n']}"
        assert 0 < r["registers"] <= 255, f"{name}: {r['registers']} registers"
        assert r["spill_bytes"] == 0, f"{name}: {r['spill_bytes']} bytes of register spills"
        assert r["programs_per_sm"] >= 1, f"{name}: does not fit on an SM"


class NewKindsStack(nn.Module):
    """The kinds and call forms of the 2025-26 families in one graph: a gated norm (gate from a Linear), Derf with
    the residual fused, norm-then-add, a memory-efficient norm and per-head qk weights."""

    def __init__(self) -> None:
        super().__init__()
        self.gated = build_norm("mamba2_gated", N, group_size=8, backend="triton")
        self.derf = build_norm("derf", N, backend="triton")
        self.post = build_norm("olmo2", N, backend="triton")
        self.efficient = build_norm("llama", N, backend="triton", memory_efficient=True)
        self.qk = build_norm("cohere_qk", (4, N // 4), backend="triton")
        self.proj = nn.Linear(N, 2 * N)

    def forward(self, x):
        h, gate = self.proj(x).chunk(2, dim=-1)
        h = self.gated(h, gate)
        y, residual = self.derf(h, residual=x)
        residual = self.post.norm_then_add(y, residual)
        q = self.qk(self.efficient(residual).unflatten(-1, (4, N // 4)))
        return q.flatten(-2) + residual


def test_compiled_new_kinds_match_eager() -> None:
    torch.use_deterministic_algorithms(False)
    model = NewKindsStack().to(DEVICE)
    x = torch.randn(2, 3, N, device=DEVICE)
    eager_out = model(x)
    eager_grads = torch.autograd.grad(eager_out.square().sum(), list(model.parameters()))
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x)
    grads = torch.autograd.grad(out.square().sum(), list(model.parameters()))
    torch.testing.assert_close(out, eager_out, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def _new_kind_args(case: str):
    """Operands and plan of lnblocks::norm_fwd for the gated, point-wise, norm-then-add and memory-efficient calls."""
    from lnblocks.norms import norm_spec

    def randn(*size):
        return torch.randn(*size, device=DEVICE, requires_grad=True)

    x, w, b = randn(5, N), randn(N), randn(N)
    r = g = a = s = None
    kw = {}
    if case == "gated-groups":
        spec, b, g, kw = norm_spec("qwen3_next_gated"), None, randn(5, N), {"group_size": 8}
    elif case == "derf-residual":
        spec, r, a, s = norm_spec("derf"), randn(5, N), randn(1), randn(1)
    elif case == "norm-then-add":
        spec, r, kw = norm_spec("layernorm"), randn(5, N), {"norm_then_add": True, "write_y": False}
    else:  # memory-efficient
        spec = norm_spec("layernorm", memory_efficient=True)
    plan = make_plan(spec, x.dtype, None if r is None else r.dtype, w.dtype, **kw)
    return (x, r, w, b, None, g, a, s, *plan.op_args())


@pytest.mark.parametrize("case", ["gated-groups", "derf-residual", "norm-then-add", "memory-efficient"])
def test_opcheck_new_kinds(case: str) -> None:
    """Schema, fake impl and autograd registration of the forward op for every new call form, and the backward op
    with a gate and with the point-wise scalars."""
    torch.use_deterministic_algorithms(False)
    args = _new_kind_args(case)
    torch.library.opcheck(ops.norm_fwd, args)
    if case in ("gated-groups", "derf-residual"):
        x, r, w, b, _, g, a, s, *plan_args = args
        _, _, mean, rstd = ops.norm_fwd(*args)
        dy = torch.randn(5, N, device=DEVICE)
        bwd = (dy, r, r if r is not None else x, w, b, None, mean, rstd, g, a, s, True, b is not None, g is not None,
               a is not None, *plan_args)  # fmt: skip
        torch.library.opcheck(ops.norm_bwd, tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in bwd))
