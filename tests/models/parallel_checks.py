"""The 2-process worker of ``test_parallel.py``: ``torchrun --nproc_per_node 2 parallel_checks.py OUT.json DIR``.

One launch runs every check (a launch costs seconds, a check milliseconds). Each check runs on both ranks and
returns ``{"ok": bool, "detail": str, ...measured numbers}``; rank 0 writes ``{check: [rank0, rank1]}`` to OUT.json.
Checks compare with the same model trained in this process on the whole batch (the one-process reference), and
compute every collective before any comparison, so a failing comparison on one rank never leaves the other rank
waiting in a collective.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parallel_cases import MODES, MODES_2D, TRITON_MODES, batches, gpt_config
from parallel_state import state_dict_checks

from lnblocks import GPT
from lnblocks.models.parallel import (
    ParallelConfig,
    build_mesh,
    full_grads,
    loss_context,
    parallelize,
    split_batch,
)
from lnblocks.process_exit import exit_process

# fp32: the sharded run against the one-process run, worst |g - g_ref| / max|g_ref| over every parameter and step
# (measured <= 9e-6, on scalar norm gains: reduction order); a lost, doubled or twice-averaged reduction is O(1).
GRAD_TOL, LOSS_TOL = 1e-4, 1e-5
# bf16 (FSDP2 MixedPrecisionPolicy): both bf16 runs against the fp32 one; the sharded run's error may be at most
# twice the one-process bf16 run's own error (plus a little), as kernel tests bound errors against PyTorch's.
BF16_FACTOR, BF16_SLACK = 2.0, 1e-3


def train(model: GPT, config: ParallelConfig | None = None, mesh=None, corrupt=None) -> list[tuple[float, dict]]:
    """``STEPS`` SGD-with-momentum steps (scale-sensitive: a gradient scaled by 2 changes the trajectory);
    returns per step the global mean loss and every parameter's full gradient."""
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    out = []
    for idx, targets in batches():
        if mesh is not None:
            idx, targets = split_batch(mesh, idx, targets)
        with loss_context(config):
            _, loss = model(idx, targets)
            loss.backward()
        if corrupt is not None:
            corrupt(model)
        grads = full_grads(model)
        loss = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
        loss = loss.detach().clone()
        if mesh is not None:
            dist.all_reduce(loss)  # tp ranks hold equal losses, dp ranks their rows' mean: the world mean is global
            loss /= dist.get_world_size()
        out.append((loss.item(), grads))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return out


def errors(run: list, ref: list) -> dict:
    """Worst loss difference and worst per-parameter gradient error relative to that gradient's largest entry, over
    all steps; parameters with a gradient on one side only are listed."""
    loss_err, grad_err, worst, missing = 0.0, 0.0, "", []
    for (loss, grads), (loss_ref, grads_ref) in zip(run, ref, strict=True):
        loss_err = max(loss_err, abs(loss - loss_ref))
        missing += sorted(set(grads_ref) ^ set(grads))
        for name, g_ref in grads_ref.items():
            if name in grads:
                err = (grads[name].float() - g_ref.float()).abs().max().item()
                scale = g_ref.float().abs().max().item()
                rel = err / scale if scale > 0 else (0.0 if err == 0 else float("inf"))  # zero grads: exactly zero
                if rel > grad_err:
                    grad_err, worst = rel, name
    return {"loss_err": loss_err, "grad_err": grad_err, "worst": worst, "missing": missing}


def equivalence(mode: str, case: str, backend: str = "torch", *, corrupt=None) -> dict:
    """The sharded run of ``case`` under ``mode`` against the one-process run (``corrupt(model)``, for the negative
    control, runs after each backward)."""
    dp, tp, options, _ = {**MODES, **MODES_2D}[mode]
    config = ParallelConfig(dp_shard=dp, tp=tp, **options)
    torch.manual_seed(0)
    ref = GPT(gpt_config(case, backend))
    model = copy.deepcopy(ref)
    mesh = build_mesh(config)
    torch._dynamo.reset()
    model = parallelize(model, mesh, config)
    e = errors(train(model, config, mesh, corrupt), ref_run := train(ref))
    out = {**e, "detail": f"loss err {e['loss_err']:.2e}, worst grad rel err {e['grad_err']:.2e} ({e['worst']})"}
    ok = not e["missing"] and e["loss_err"] <= LOSS_TOL and e["grad_err"] <= GRAD_TOL
    if config.compile:  # really compiled: one graph per block at least (FSDP2's hooks stay outside)
        stats = torch._dynamo.utils.counters["stats"]
        out["graphs"], out["graph_breaks"] = (
            stats["unique_graphs"],
            sum(torch._dynamo.utils.counters["graph_break"].values()),
        )
        out["detail"] += f"; {out['graphs']} graphs, {out['graph_breaks']} graph breaks"
        ok = ok and out["graphs"] >= len(model.blocks)
    if config.param_dtype is None:
        return out | {"ok": ok}
    torch.manual_seed(0)  # the one-process run in param_dtype, against the same fp32 reference
    own = errors(train(GPT(gpt_config(case, backend)).to(getattr(torch, config.param_dtype))), ref_run)
    ok = not e["missing"] and all(e[k] <= BF16_FACTOR * own[k] + BF16_SLACK for k in ("loss_err", "grad_err"))
    detail = (
        f"{out['detail']}; one-process {config.param_dtype}: loss err {own['loss_err']:.2e}, grad {own['grad_err']:.2e}"
    )
    return out | {"ok": ok, "detail": detail, "own_loss_err": own["loss_err"], "own_grad_err": own["grad_err"]}


def negative_control() -> dict:
    """The comparison must catch a silent gradient scaling on one rank (the class of pytorch #162338: FSDP2 on
    gloo averaging wrongly): rank 1's gradient shards doubled after FSDP's reduce-scatter."""

    def double_rank1(model: GPT) -> None:
        if dist.get_rank() == 1:
            for p in model.parameters():
                p.grad.to_local().mul_(2)

    r = equivalence("fsdp", "pre", corrupt=double_rank1)
    return {
        "ok": r["grad_err"] > 0.5,
        "detail": f"with rank 1's shards doubled: {r['detail']}",
        "grad_err": r["grad_err"],
    }


def fp32_residual_between_blocks() -> dict:
    """FSDP2 in bf16 must not round a ``residual_in_fp32`` stream to bf16 where it enters a block."""
    config = ParallelConfig(dp_shard=2, param_dtype="bfloat16", reduce_dtype="float32")
    torch.manual_seed(0)
    model = parallelize(GPT(gpt_config("llama")), build_mesh(config), config)  # llama: residual_in_fp32
    seen = []
    model.blocks[1].register_forward_pre_hook(lambda mod, args: seen.append(args[0].residual.dtype))
    model(*split_batch(build_mesh(config), *batches()[0]))
    return {"ok": seen == [torch.float32], "detail": f"residual entering block 1: {seen}"}


def generate_under_fsdp() -> dict:
    """``GPT.generate`` calls the trunk directly, not ``forward``, which skips FSDP2's root all-gather (the class of
    pytorch #157209): after ``model.unshard()`` greedy decoding equals the unsharded model's token for token."""
    config = ParallelConfig(dp_shard=2)
    torch.manual_seed(0)
    ref = GPT(gpt_config("pre"))
    model = parallelize(copy.deepcopy(ref), build_mesh(config), config)
    idx = batches()[0][0][:, :3]
    model.unshard()
    got = model.generate(idx, 4, temperature=0)
    model.reshard()
    want = ref.generate(idx, 4, temperature=0)
    return {"ok": torch.equal(got, want), "detail": f"sharded {got.tolist()} vs one process {want.tolist()}"}


def triton_dtensor_probe() -> dict:
    """Whether a fused Triton norm with replicated parameters (what ``SequenceParallel`` makes of them) accepts a
    sequence-sharded DTensor input (ok: it does, and matches torch)."""
    from torch.distributed.tensor import DTensor, Shard, distribute_module

    from lnblocks.norms import LayerNorm

    mesh = build_mesh(ParallelConfig(tp=2))["tp"]
    x = torch.randn(2, 8, 16)
    try:
        norm = distribute_module(LayerNorm(16, backend="triton"), mesh)  # parameters replicated on the mesh
        y = norm(DTensor.from_local(x, mesh, [Shard(1)])).to_local()
    except Exception as err:
        return {"ok": False, "detail": f"{type(err).__name__}: {str(err).splitlines()[0]}"}
    err = (y - torch.nn.functional.layer_norm(x, (16,))).abs().max().item()
    return {"ok": err < 1e-5, "detail": f"max err {err:.2e} against F.layer_norm"}


BAD_INPUTS = (
    "world_size", "heads", "kv_heads", "mlp_width", "vocab", "mlp_norm_under_tp", "mesh_shape",
    "loss_parallel_without_tp", "batch", "sequence",
)  # fmt: skip


def bad_input_checks() -> dict[str, Callable[[], dict]]:
    """Each bad input must raise ValueError naming the value on every rank, before any collective: the process
    group still works afterwards (the all_gather of the results would hang otherwise)."""

    def expect(fn: Callable[[], object], *needles: str) -> dict:
        try:
            fn()
        except ValueError as err:
            msg = str(err)
            return {"ok": all(n in msg for n in needles), "detail": msg}
        return {"ok": False, "detail": "no ValueError"}

    def model(case: str = "pre", **block: object) -> GPT:
        cfg = gpt_config(case)
        return GPT(cfg.replace(block=cfg.layers[0].replace(**block)) if block else cfg)

    tp2 = ParallelConfig(tp=2)
    mesh = build_mesh(tp2)
    seq_model = parallelize(model(), mesh, tp2)
    return {
        "world_size": lambda: expect(lambda: build_mesh(ParallelConfig(dp_shard=4)), "world size 2", "dp_shard=4"),
        "heads": lambda: expect(
            lambda: parallelize(model(dim=12, attention={"n_heads": 3}), mesh, tp2), "n_heads", "(3)", "tp=2"
        ),
        "kv_heads": lambda: expect(
            lambda: parallelize(model(attention={"n_heads": 4, "n_kv_heads": 1}), mesh, tp2), "n_kv_heads", "(1)"
        ),
        "mlp_width": lambda: expect(
            lambda: parallelize(model(mlp={"hidden_dim": 33}), mesh, tp2), "mlp hidden width", "(33)"
        ),
        "vocab": lambda: expect(
            lambda: parallelize(GPT(gpt_config("pre").replace(vocab_size=33)), mesh, tp2), "vocab_size", "(33)"
        ),
        "mlp_norm_under_tp": lambda: expect(lambda: parallelize(model(mlp_norm=True), mesh, tp2), "mlp_norm"),
        "mesh_shape": lambda: expect(
            lambda: parallelize(model(), build_mesh(ParallelConfig(dp_shard=2)), tp2), "shape (1, 2)"
        ),
        "loss_parallel_without_tp": lambda: expect(lambda: ParallelConfig(loss_parallel=True), "tp > 1"),
        "batch": lambda: expect(
            lambda: split_batch(build_mesh(ParallelConfig(dp_shard=2)), torch.zeros(3, 8)), "dp_shard=2", "(3, 8)"
        ),
        "sequence": lambda: expect(lambda: seq_model(torch.zeros(2, 7, dtype=torch.long)), "T=7", "tp=2"),
    }


def all_checks(ckpt_dir: Path) -> dict[str, Callable[[], dict]]:
    """Every check of a 2-process launch, by name (a 4-process launch runs the 2-D mesh modes only)."""
    checks: dict[str, Callable[[], dict]] = {}
    modes = MODES_2D if dist.get_world_size() == 4 else MODES
    for mode, (_, _, _, cases) in modes.items():
        for case in cases:
            checks[f"{mode}/{case}"] = lambda m=mode, c=case: equivalence(m, c)
    if dist.get_world_size() == 4:
        return checks
    checks["negative_control/fsdp_grad_sum"] = negative_control
    checks["fsdp_bf16/fp32_residual_between_blocks"] = fp32_residual_between_blocks
    checks["fsdp/generate_after_unshard"] = generate_under_fsdp
    checks["triton/dtensor_probe"] = triton_dtensor_probe
    for mode, cases in TRITON_MODES.items():
        for case in cases:
            checks[f"triton/{mode}/{case}"] = lambda m=mode, c=case: equivalence(m, c, "triton")
    checks.update({f"bad_input/{k}": v for k, v in bad_input_checks().items()})
    checks.update({f"state/{k}": v for k, v in state_dict_checks(ckpt_dir).items()})
    return checks


def run_checks(out_path: Path, ckpt_dir: Path) -> None:
    checks = all_checks(ckpt_dir)
    results: dict[str, list] = {}
    for name, check in checks.items():
        start = time.perf_counter()
        try:
            result = check()
        except Exception as err:  # recorded, and the other rank (same code, same data) fails the same way
            result = {"ok": False, "detail": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        result["seconds"] = round(time.perf_counter() - start, 2)
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, result)
        results[name] = gathered
    if dist.get_rank() == 0:
        out_path.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        run_checks(Path(sys.argv[1]), Path(sys.argv[2]))
    finally:
        dist.destroy_process_group()
    exit_process(0)  # no interpreter teardown, where gloo can abort a finished rank (lnblocks.process_exit)
