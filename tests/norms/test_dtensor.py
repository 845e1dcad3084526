"""Every lnblocks norm under DTensor (tensor/sequence parallelism) and FSDP2, on two gloo processes.

One spawn of two CPU processes runs every case (``_run_cases``) and records its outcome; the tests below read them.
A case builds a norm, runs it in one process on the full tensors (the reference), then on DTensors: x (and the
residual) sharded on the batch or sequence dim, the parameters replicated (``distribute_module``), and compares the
full forward outputs and the gradients of x, residual, weight and bias with the reference. Tolerances, fp32: y, new
residual, dx and dresidual within 1e-6 (each row is computed by the same ops, in one process or on its shard);
weight/bias gradients within 1e-5 (their sum over rows is split into two partial sums, then all-reduced). Fused ops
run under ``TRITON_INTERPRET=1`` (tests/conftest.py sets it; the spawned processes inherit it).

Under FSDP2 a norm's parameters are sharded between calls and all-gathered by hooks in ``__call__``; the norm (and a
norm patched by ``lnblocks.hf``) must be called as a module, and calling ``forward`` directly gets a clear error
instead of a broadcast or a kernel reading a sharded DTensor (pytorch#157209).
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import socket
import time
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lnblocks.process_exit import exit_process

WORLD = 2
B, T, C = 2, 5, 16  # T = 5: the sequence shards are uneven (3 + 2 rows)
TORCH_KINDS = ["layernorm", "rmsnorm", "llama", "gemma", "t5", "dyt", "scalenorm", "none", "derf", "l2norm", "nemotron"]
FUSED_KINDS = ["layernorm", "rmsnorm", "llama", "gemma", "t5", "dyt", "derf", "l2norm", "nemotron"]
DIMS = {"batch": 0, "sequence": 1}
ATOL_ROWS, ATOL_PARAMS = 1e-6, 1e-5

# (case id, kind, backend, sharded dim of x, residual)
SHARDED = [
    *((f"{k}-torch-{d}-{'res' if r else 'plain'}", k, "torch", d, r) for k in TORCH_KINDS for d, r in
      (("sequence", True), ("batch", False))),
    *((f"{k}-triton-{d}-{'res' if r else 'plain'}", k, "triton", d, r) for k in FUSED_KINDS for d, r in
      (("sequence", True), ("batch", False))),
    ("layernorm-triton-sequence-plain", "layernorm", "triton", "sequence", False),
    ("llama-triton-batch-res", "llama", "triton", "batch", True),
    ("layernorm-triton-replicated-res", "layernorm", "triton", "replicated", True),
    ("rmsnorm-torch-hidden-res", "rmsnorm", "torch", "hidden", True),  # DTensor's own rules (all-reduced stats)
    ("layernorm-torch-hidden-plain", "layernorm", "torch", "hidden", False),
]  # fmt: skip
OTHER = [
    "sequence_parallel_style",
    "fused_add_norm_functional",
    "fused_refuses_hidden_shards",
    "fused_refuses_partial_input",
    "fused_functional_refuses_dropout",
    "plain_weight_with_dtensor_input",
    "fsdp2_call_and_direct_forward",
    "fsdp2_patched_norm",
    "gated_sequence_shard",
    "norm_then_add_sequence_shard",
]


def _build(kind: str, backend: str, **options):
    import lnblocks

    norm = lnblocks.build_norm(kind, C, backend=backend, **({"eps": 1e-6} if kind == "rmsnorm" else {}), **options)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in norm.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    return norm


def _data(seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, T, C, generator=gen) + 0.5 for _ in range(4)]  # x, residual, dy, dnew_residual


def _run(norm, x, r, gy, gz):
    """Outputs and gradients of x, residual and every parameter (None where there is none)."""
    x = x.detach().requires_grad_()
    r = None if r is None else r.detach().requires_grad_()
    out = norm(x) if r is None else norm(x, residual=r)
    y, z = (out, None) if r is None else out
    loss = (y * gy).sum() + (0 if z is None else (z * gz).sum())
    loss.backward()
    grads = {name: p.grad for name, p in norm.named_parameters()}
    return y, z, x.grad, None if r is None else r.grad, grads


def _full(t):
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _compare(got, ref) -> None:
    """Gathers first (collectives, in the same order on every rank), compares after: a rank that fails must not
    leave the other waiting in an all-gather."""
    names = ("y", "new_residual", "dx", "dresidual")
    rows = [None if a is None else _full(a) for a in got[:4]]
    params = {name: _full(g) for name, g in got[4].items()}
    for name, a, b in zip(names, rows, ref[:4]):
        assert (a is None) == (b is None), f"{name}: present in one run only"
        if a is not None:
            torch.testing.assert_close(a, b, atol=ATOL_ROWS, rtol=ATOL_ROWS, msg=lambda m, n=name: f"{n}: {m}")
    assert params.keys() == ref[4].keys()
    for name, g in params.items():
        torch.testing.assert_close(g, ref[4][name], atol=ATOL_PARAMS, rtol=ATOL_PARAMS,
                                   msg=lambda m, n=name: f"d{n}: {m}")  # fmt: skip


def _sharded_case(mesh, kind, backend, dim, residual) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor

    x, r, gy, gz = _data()
    ref = _run(_build(kind, backend), x, r if residual else None, gy, gz)
    norm = distribute_module(_build(kind, backend), mesh)  # parameters replicated
    placement = {"replicated": Replicate(), "hidden": Shard(2)}.get(dim) or Shard(DIMS[dim])
    dt = [distribute_tensor(t, mesh, [placement]) for t in (x, r, gy, gz)]
    got = _run(norm, dt[0], dt[1] if residual else None, dt[2], dt[3])
    assert norm.last_backend == backend, norm.last_backend
    if dim != "hidden":  # (there the torch backend's placements are DTensor's choice)
        assert got[0].placements == (placement,), got[0].placements
    _compare(got, ref)


def _other_case(name: str, mesh) -> None:
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module, distribute_tensor
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

    from lnblocks.kernels import fused_add_norm

    x, r, gy, gz = _data(2)
    if name == "sequence_parallel_style":  # torchtitan's plan for its norms
        ref = _run(_build("llama", "triton"), x, r, gy, gz)
        norm = parallelize_module(_build("llama", "triton"), mesh, SequenceParallel())
        dt = [distribute_tensor(t, mesh, [Shard(1)]) for t in (x, r, gy, gz)]
        _compare(_run(norm, *dt), ref)
    elif name == "fused_add_norm_functional":
        w, b = torch.randn(2, C, generator=torch.Generator().manual_seed(4))  # the same on every rank
        leaves = [t.clone().requires_grad_() for t in (x, r, w, b)]
        y, z = fused_add_norm(*leaves, "layernorm")
        ((y * gy).sum() + (z * gz).sum()).backward()
        placements = ([Shard(0)], [Shard(0)], [Replicate()], [Replicate()])
        dleaves = [distribute_tensor(t, mesh, p).requires_grad_() for t, p in zip((x, r, w, b), placements)]
        yd, zd = fused_add_norm(*dleaves, "layernorm")
        ((yd * distribute_tensor(gy, mesh, [Shard(0)])).sum() + (zd * distribute_tensor(gz, mesh, [Shard(0)])).sum()
         ).backward()  # fmt: skip
        assert yd.placements == zd.placements == (Shard(0),)
        gathered = [_full(t) for t in (yd, zd, *(t.grad for t in dleaves))]
        for a, b_ in zip(gathered, [y, z, *(t.grad for t in leaves)]):
            torch.testing.assert_close(a, b_, atol=ATOL_PARAMS, rtol=ATOL_PARAMS)
    elif name == "fused_refuses_hidden_shards":
        norm = distribute_module(_build("rmsnorm", "triton"), mesh)
        xd = distribute_tensor(x, mesh, [Shard(2)])
        _raises(lambda: norm(xd), r"backend='triton' cannot run here: x is sharded on dim 2, a normalised dim")
        auto = distribute_module(_build("rmsnorm", "auto"), mesh)
        auto(xd)  # on CPU auto is torch; on a GPU it falls back to torch for this input
        assert auto.last_backend == "torch"
        w = distribute_tensor(torch.ones(C), mesh, [Replicate()])
        _raises(lambda: fused_add_norm(xd, None, w, None, "rmsnorm"), r"x is sharded on dim 2")
    elif name == "fused_refuses_partial_input":
        norm = distribute_module(_build("layernorm", "triton"), mesh)
        xd = DTensor.from_local(x / WORLD, mesh, [Partial()])  # each rank holds a part of the sum
        _raises(lambda: norm(xd), r"x is Partial on mesh dim 0 \(a pending sum\): reduce it first")
    elif name == "fused_functional_refuses_dropout":
        xd = distribute_tensor(x, mesh, [Shard(1)])
        _raises(lambda: fused_add_norm(xd, None, None, None, "rmsnorm", dropout_p=0.1), r"dropout: the keep-mask")
    elif name == "plain_weight_with_dtensor_input":
        xd = distribute_tensor(x, mesh, [Shard(1)])
        for backend in ("torch", "triton"):
            norm = _build("layernorm", backend)  # not distributed: its parameters are plain tensors
            _raises(lambda n=norm: n(xd), r"^weight is a plain tensor while x is a DTensor: distribute it")
            norm(x)  # a cached route for plain tensors must not take the DTensor either
            _raises(lambda n=norm: n(xd), r"DTensor", RuntimeError)  # torch's message on that backend
    elif name == "gated_sequence_shard":  # the gate is an activation: sharded like x, its gradient too
        for backend in ("torch", "triton"):
            _gated_case(mesh, backend, x, r, gy)
    elif name == "norm_then_add_sequence_shard":  # the post-norm residual update, each rank on its rows
        for backend in ("torch", "triton"):
            _norm_then_add_case(mesh, backend, x, r, gy)
    elif name == "fsdp2_call_and_direct_forward":
        _fsdp2_case(mesh, x, gy)
    elif name == "fsdp2_patched_norm":
        _fsdp2_patched_case(mesh, x, gy)
    else:
        raise AssertionError(f"unknown case {name}")


def _gated_case(mesh, backend: str, x, gate, gy) -> None:
    from torch.distributed.tensor import Shard, distribute_module, distribute_tensor

    ref_norm, norm = _build("mamba2_gated", backend, group_size=4), _build("mamba2_gated", backend, group_size=4)
    leaves = [t.clone().requires_grad_() for t in (x, gate)]
    (ref_norm(*leaves) * gy).sum().backward()
    norm = distribute_module(norm, mesh)
    dleaves = [distribute_tensor(t, mesh, [Shard(1)]).requires_grad_() for t in (x, gate)]
    y = norm(*dleaves)
    (y * distribute_tensor(gy, mesh, [Shard(1)])).sum().backward()
    assert norm.last_backend == backend and y.placements == (Shard(1),)
    got = [_full(t) for t in (y, dleaves[0].grad, dleaves[1].grad, norm.weight.grad)]
    want = [ref_norm(*leaves), leaves[0].grad, leaves[1].grad, ref_norm.weight.grad]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=ATOL_PARAMS, rtol=ATOL_PARAMS)


def _norm_then_add_case(mesh, backend: str, x, r, gy) -> None:
    from torch.distributed.tensor import Shard, distribute_module, distribute_tensor

    ref_norm, norm = _build("olmo2", backend), distribute_module(_build("olmo2", backend), mesh)
    leaves = [t.clone().requires_grad_() for t in (x, r)]
    (ref_norm.norm_then_add(*leaves) * gy).sum().backward()
    dleaves = [distribute_tensor(t, mesh, [Shard(1)]).requires_grad_() for t in (x, r)]
    new = norm.norm_then_add(*dleaves)
    (new * distribute_tensor(gy, mesh, [Shard(1)])).sum().backward()
    assert norm.last_backend == backend and new.placements == (Shard(1),)
    got = [_full(t) for t in (new, dleaves[0].grad, dleaves[1].grad, norm.weight.grad)]
    want = [ref_norm.norm_then_add(*leaves), leaves[0].grad, leaves[1].grad, ref_norm.weight.grad]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=ATOL_PARAMS, rtol=ATOL_PARAMS)


def _fsdp2_case(mesh, x, gy) -> None:
    """Each rank feeds its half of the batch; FSDP2 averages the gradients over ranks, so times WORLD they must equal
    the one-process gradients of the whole batch (a silent scaling, pytorch#162338, would fail here)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    rank = dist.get_rank()
    for backend in ("torch", "triton"):
        ref = torch.nn.Sequential(_build("layernorm", backend), torch.nn.Linear(C, C), _build("llama", backend))
        model = copy.deepcopy(ref)
        for m in model:
            fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
        (ref(x) * gy).sum().backward()
        (model(x[rank : rank + 1]) * gy[rank : rank + 1]).sum().backward()
        assert model[0].last_backend == backend
        assert all(isinstance(p.grad, DTensor) for p in model.parameters())
        gathered = [p.grad.full_tensor() * WORLD for p in model.parameters()]
        for g, (name, q) in zip(gathered, ref.named_parameters()):
            torch.testing.assert_close(g, q.grad, atol=ATOL_PARAMS, rtol=ATOL_PARAMS, msg=lambda m, n=name: f"{n}: {m}")
        # outside __call__ the parameters are the sharded DTensors: forward() alone is refused, never broadcast
        _raises(lambda m=model: m[0].forward(x), r"^weight is a DTensor but x is a plain tensor.*pytorch#157209")


def _fsdp2_patched_case(mesh, x, gy) -> None:
    """A norm patched by ``lnblocks.hf`` (its instance ``forward`` replaced, as for the HF classes; torch.nn.RMSNorm
    here, which needs no transformers import), sharded by FSDP2: the patched forward runs inside the module's
    ``__call__``, after the all-gather, and the gradients equal the unpatched module's."""
    from torch.distributed.fsdp import fully_shard

    from lnblocks.hf import patch_norms

    rank = dist.get_rank()
    ref = torch.nn.RMSNorm(C, eps=1e-6)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(5))
    holder = torch.nn.Sequential(copy.deepcopy(ref))
    assert patch_norms(holder, backend="torch").patched
    fully_shard(holder[0], mesh=mesh)
    (ref(x) * gy).sum().backward()
    (holder(x[rank : rank + 1]) * gy[rank : rank + 1]).sum().backward()
    grad = holder[0].weight.grad.full_tensor() * WORLD
    torch.testing.assert_close(grad, ref.weight.grad, atol=ATOL_PARAMS, rtol=ATOL_PARAMS)


def _raises(fn, pattern: str, other: type[Exception] = ValueError) -> None:
    import re

    try:
        fn()
    except (ValueError, other) as err:
        assert re.search(pattern, str(err)), f"wrong message: {err}"
        return
    raise AssertionError(f"no ValueError matching {pattern!r}")


def _worker(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))  # fmt: skip
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (WORLD,))
    results = {}
    try:
        for case_id, *case in SHARDED:
            results[case_id] = _outcome(lambda c=case: _sharded_case(mesh, *c))
        for name in OTHER:
            results[name] = _outcome(lambda n=name: _other_case(n, mesh))
        Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()
    exit_process(0)  # no interpreter teardown, where gloo can abort a finished rank (lnblocks.process_exit)


def _outcome(fn) -> str:
    start = time.perf_counter()
    torch.manual_seed(0)  # every rank builds the same modules (FSDP2 shards each rank's own values)
    try:
        fn()
    except pytest.skip.Exception as err:
        return f"SKIP {err}"
    except Exception:  # recorded per case, reported by the test of that case
        return traceback.format_exc(limit=6)
    return f"ok {time.perf_counter() - start:.2f}s"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, list[str]]:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    assert os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()
    out = tmp_path_factory.mktemp("dtensor")
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=True)
    ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORLD)]
    return {case: [rank[case] for rank in ranks] for case in ranks[0]}


def _check(outcomes: dict[str, list[str]], case: str) -> None:
    results = outcomes[case]
    if all(r.startswith("SKIP") for r in results):
        pytest.skip(results[0])
    failed = [f"rank {i}: {r}" for i, r in enumerate(results) if not r.startswith("ok")]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("case", [c[0] for c in SHARDED])
def test_sharded_rows_are_normalised_locally(outcomes, case: str) -> None:
    _check(outcomes, case)


@pytest.mark.parametrize("case", OTHER)
def test_dtensor_and_fsdp2(outcomes, case: str) -> None:
    _check(outcomes, case)
