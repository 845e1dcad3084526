"""State-dict and DCP checks for ``parallel_checks.py`` (2 processes) and the one-process side of the DCP round
trip (``save_one_process`` / ``load_one_process``, called by ``test_parallel.py``).

Keys and values must be those of the unsharded model exactly: ``get_model_state_dict(full_state_dict=True)`` of a
sharded model equals ``state_dict()`` of the same model unsharded, bit for bit, and a DCP checkpoint written by
either side loads into the other (FSDP over 2 ranks, tensor parallel over 2 ranks, one process without a process
group) with model and AdamW state equal bit for bit.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from lnblocks import GPT
from lnblocks.models.parallel import ParallelConfig, build_mesh, parallelize, split_batch
from tests.models.parallel_cases import batches, gpt_config

CASE = "llama"  # fused [q; k; v] with GQA, QK-norm, RoPE, gated MLP, tied head: the layout that is easiest to get wrong
FULL = StateDictOptions(full_state_dict=True)
STATE_CHECKS = (
    "full_round_trip/fsdp", "full_round_trip/tp_sp", "dcp_one_process_to_fsdp", "dcp_one_process_to_tp_sp",
    "dcp_fsdp_to_tp_sp",
)  # fmt: skip
LAYOUTS = {"fsdp": ParallelConfig(dp_shard=2), "tp_sp": ParallelConfig(tp=2)}


def model_and_optimizer(seed: int = 0) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = GPT(gpt_config(CASE))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def one_step(model: GPT, opt: torch.optim.Optimizer, mesh: Any = None) -> None:
    idx, targets = batches(seed=7)[0]
    if mesh is not None:
        idx, targets = split_batch(mesh, idx, targets)
    model(idx, targets)[1].backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths where two nested state dicts differ (tensors compared bit for bit)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(map(str, set(a) ^ set(b)))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same = a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
        return [] if same else [f"{path}: max diff {(a.float() - b.float()).abs().max().item():.3g}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def result(diffs: list[str]) -> dict:
    return {"ok": not diffs, "detail": "; ".join(diffs[:5]) or "equal bit for bit"}


# ---- one process (the pytest process, no process group) ----------------------------------------------------------
def save_one_process(ckpt: Path) -> None:
    """A DCP checkpoint of an unsharded model + AdamW after one step, and its full state for comparison."""
    model, opt = model_and_optimizer(seed=3)
    one_step(model, opt)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt / "one")
    torch.save({"model": msd, "optim": osd}, ckpt / "one_full.pt")


def load_one_process(ckpt: Path) -> list[str]:
    """Load the 2-process FSDP checkpoint ``two`` into one process; differences from its full state."""
    model, opt = model_and_optimizer(seed=5)  # other values: the load must overwrite all of them
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=ckpt / "two")
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    expected = torch.load(ckpt / "two_full.pt", weights_only=False)
    msd, osd = get_state_dict(model, opt)
    return differences({"model": msd, "optim": osd}, expected)


# ---- two processes -----------------------------------------------------------------------------------------------
def state_dict_checks(ckpt: Path) -> dict[str, Callable[[], dict]]:
    meshes = {name: build_mesh(cfg) for name, cfg in LAYOUTS.items()}

    def sharded(layout: str, seed: int = 0) -> tuple[GPT, torch.optim.Optimizer]:
        model = parallelize(model_and_optimizer(seed)[0], meshes[layout], LAYOUTS[layout])
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    def full_round_trip(layout: str) -> dict:
        ref, _ = model_and_optimizer(0)
        model, _ = sharded(layout)
        diffs = differences(get_model_state_dict(model, options=FULL), ref.state_dict())
        other, _ = model_and_optimizer(seed=1)
        set_model_state_dict(model, other.state_dict(), options=FULL)
        diffs += differences(get_model_state_dict(model, options=FULL), other.state_dict())
        idx = batches()[0][0]
        logits = model(*split_batch(meshes[layout], idx))[0]
        logits = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
        want = other(idx)[0]
        if layout == "fsdp":  # this rank's rows
            want = split_batch(meshes[layout], want)[0]
        err = (logits - want).abs().max().item()
        if err > 1e-5:
            diffs.append(f"logits after set_model_state_dict: max diff {err:.3g}")
        return result(diffs) | {"logits_err": err}

    def load_from_one_process(layout: str) -> dict:
        model, opt = sharded(layout, seed=5)
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=ckpt / "one")
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        msd, osd = get_state_dict(model, opt, options=FULL)
        return result(differences({"model": msd, "optim": osd}, torch.load(ckpt / "one_full.pt", weights_only=False)))

    def save_and_reshard() -> dict:
        """FSDP-sharded model + AdamW saved after a step (``two``, loaded by one process later), then loaded into a
        tensor-parallel model: same full state."""
        model, opt = sharded("fsdp", seed=2)
        one_step(model, opt, meshes["fsdp"])
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt / "two")
        full_m, full_o = get_state_dict(model, opt, options=FULL)
        if dist.get_rank() == 0:
            torch.save({"model": full_m, "optim": full_o}, ckpt / "two_full.pt")
        tp_model, tp_opt = sharded("tp_sp", seed=5)
        msd, osd = get_state_dict(tp_model, tp_opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=ckpt / "two")
        set_state_dict(tp_model, tp_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        msd, osd = get_state_dict(tp_model, tp_opt, options=FULL)
        return result(differences({"model": msd, "optim": osd}, {"model": full_m, "optim": copy.deepcopy(full_o)}))

    return {
        "full_round_trip/fsdp": lambda: full_round_trip("fsdp"),
        "full_round_trip/tp_sp": lambda: full_round_trip("tp_sp"),
        "dcp_one_process_to_fsdp": lambda: load_from_one_process("fsdp"),
        "dcp_one_process_to_tp_sp": lambda: load_from_one_process("tp_sp"),
        "dcp_fsdp_to_tp_sp": save_and_reshard,
    }
