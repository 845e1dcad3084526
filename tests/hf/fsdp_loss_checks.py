"""The 2-process worker of ``test_chunked_loss_fsdp.py``: ``torchrun --nproc_per_node 2 fsdp_loss_checks.py OUT.json``.

Each check shards a tiny HF causal LM with FSDP2 (``fully_shard`` on each decoder layer, on the head as set out below,
and on the root), patches it with ``chunked_loss=True`` and runs ``STEPS`` SGD steps, each rank on its half of the
batch; the one-process reference is the unpatched, unsharded model trained on the whole batch (the mean of the two
halves' losses: what FSDP2's gradient average gives). Per step: each rank's loss against the reference model's loss
on that rank's half, and every parameter's gathered gradient against the reference's. Every collective runs before
any comparison, so a failing comparison never leaves the other rank waiting. Rank 0 writes
``{check: [rank0, rank1]}`` with ``{"ok", "detail", ...}`` per rank.
"""

from __future__ import annotations

import copy
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, init_device_mesh
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_tiny import VOCAB, build

import lnblocks.models.lm_head as L
from lnblocks.hf import patch_norms
from lnblocks.process_exit import exit_process

STEPS, B, T = 3, 4, 64
# fp32, worst |g - g_ref| / max|g_ref| per parameter and step (measured <= 2e-6: FSDP2's average and the chunked
# head's row sums reduce in other orders); a lost or doubled reduction is O(1). The loss: each rank's half, 1e-6.
GRAD_TOL, LOSS_TOL = 1e-5, 1e-6
# the head's FSDP2 unit: none (the head in the root's), HF's own plan (the final norm and the head grouped, kept
# unsharded after the forward: transformers.distributed.fsdp), or the head alone, resharded after its forward
HEAD_PLANS = ("root", "hf_plan", "head_resharded")


def _batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(3, VOCAB, (B, T), generator=g)
        ids[0, :7] = -100  # ignored labels on one rank only: the two halves count different numbers of tokens
        out.append(ids)
    return out


def _shard(model: torch.nn.Module, plan: str, mesh) -> None:
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    if plan == "hf_plan":  # tied: the head's weight is sharded with the input embedding, as transformers does it
        tail = [model.model.embed_tokens, model.lm_head] if tied else [model.lm_head]
        fully_shard([model.model.norm, *tail], mesh=mesh, reshard_after_forward=False)
    elif plan == "head_resharded":
        fully_shard(model.lm_head, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh)


def _full(grad: torch.Tensor) -> torch.Tensor:
    return grad.full_tensor() if isinstance(grad, DTensor) else grad


def _train(model: torch.nn.Module, half: slice | None) -> list[tuple[float, dict[str, torch.Tensor]]]:
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    out = []
    for labels in _batches():
        ids = labels.clamp(min=3)
        if half is None:  # the reference: the mean of the two halves' losses, and each half's loss alone
            losses = [model(input_ids=ids[h], labels=labels[h]).loss for h in (slice(0, B // 2), slice(B // 2, B))]
            (sum(losses) / 2).backward()
            record = [x.item() for x in losses]
        else:
            loss = model(input_ids=ids[half], labels=labels[half]).loss
            loss.backward()
            record = loss.item()
        grads = {n: _full(p.grad).detach().clone() for n, p in model.named_parameters()}
        out.append((record, grads))
        opt.step()
        opt.zero_grad()
    return out


def _compare(run: list, ref: list, rank: int) -> dict:
    worst_loss = worst_grad = 0.0
    for (loss, grads), (ref_losses, ref_grads) in zip(run, ref, strict=True):
        worst_loss = max(worst_loss, abs(loss - ref_losses[rank]) / abs(ref_losses[rank]))
        for name, g in grads.items():
            r = ref_grads[name]
            worst_grad = max(worst_grad, ((g - r).abs().max() / r.abs().max().clamp_min(1e-30)).item())
    ok = worst_loss <= LOSS_TOL and worst_grad <= GRAD_TOL
    detail = f"loss rel err {worst_loss:.3g} (<= {LOSS_TOL}), grad rel err {worst_grad:.3g} (<= {GRAD_TOL})"
    return {"ok": ok, "detail": detail, "loss_err": worst_loss, "grad_err": worst_grad}


def equivalence(family: str, plan: str, **options: object) -> dict:
    rank = dist.get_rank()
    base = build(family, **options)
    reference = _train(copy.deepcopy(base), None)
    model = copy.deepcopy(base)
    _shard(model, plan, init_device_mesh("cpu", (dist.get_world_size(),)))
    report = patch_norms(model, backend="torch", chunked_loss=True)
    assert report.loss is not None and report.loss.status == "patched", report.loss
    half = slice(rank * B // 2, (rank + 1) * B // 2)
    return _compare(_train(model, half), reference, rank)


def _gathers(model: torch.nn.Module, ids: torch.Tensor, gather_head: bool = False) -> int:
    """All-gathers in one forward and backward of ``model`` (profiler events of the gloo collectives); with
    ``gather_head``, one more full copy of the (sharded) head weight gathered besides: the negative control."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(input_ids=ids.clamp(min=3), labels=ids).loss.backward()
        if gather_head:
            model.lm_head.weight.full_tensor()
    return sum(1 for e in prof.events() if "all_gather" in e.name or "allgather" in e.name)


def no_extra_gather(family: str) -> dict:
    """The chunked loss uses the head weight FSDP2 gathered for the head's own call: as many all-gathers (and as
    many bytes) as the unpatched sharded model, whose full logits need that same weight."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    base = build(family)
    plain, patched = copy.deepcopy(base), copy.deepcopy(base)
    for model in (plain, patched):
        _shard(model, "hf_plan", mesh)
    patch_norms(patched, backend="torch", chunked_loss=True)
    ids = _batches()[0][dist.get_rank() * B // 2 : (dist.get_rank() + 1) * B // 2]
    counts = (_gathers(plain, ids), _gathers(patched, ids), _gathers(patched, ids, gather_head=True))
    ok = counts[0] == counts[1] and counts[0] > 0 and counts[2] > counts[1]  # the control's extra gather is seen
    detail = f"all-gathers unpatched {counts[0]}, chunked {counts[1]}, chunked + one head gather {counts[2]}"
    return {"ok": ok, "detail": detail, "counts": counts}


def tensor_parallel_head_refused() -> dict:
    """A head sharded by tensor parallelism (a DTensor weight inside its call) is refused with a TypeError."""
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    model = build("llama")
    parallelize_module(model, init_device_mesh("cpu", (dist.get_world_size(),)), {"lm_head": ColwiseParallel()})
    patch_norms(model, backend="torch", chunked_loss=True)
    ids = _batches()[0][:2]
    try:
        model(input_ids=ids.clamp(min=3), labels=ids)
    except TypeError as err:
        ok = "chunked_loss: the head's weight inside its call is a DTensor (a tensor-parallel lm_head?)" in str(err)
        return {"ok": ok, "detail": str(err)}
    return {"ok": False, "detail": "no TypeError"}


def all_checks() -> dict[str, Callable[[], dict]]:
    checks: dict[str, Callable[[], dict]] = {}
    for family in ("llama", "gemma2"):  # the plain head (gradients in the forward); soft-capped, tied (recomputed)
        for plan in HEAD_PLANS[:2]:
            checks[f"{family}/{plan}"] = lambda f=family, p=plan: equivalence(f, p)
        checks[f"{family}/no_extra_gather"] = lambda f=family: no_extra_gather(f)
    checks["llama/head_resharded"] = lambda: equivalence("llama", "head_resharded")
    untied = {"tie_word_embeddings": False}  # the soft-capped head on its own, resharded after its forward
    checks["gemma2_untied/head_resharded"] = lambda: equivalence("gemma2", "head_resharded", **untied)
    checks["tensor_parallel_head/refused"] = tensor_parallel_head_refused
    return checks


def main(out_path: Path) -> None:
    torch.set_num_threads(1)
    L.SINGLE_CHUNK_ELEMENTS = 0  # chunk these tiny logits: 8 rows per chunk of a rank's 128
    dist.init_process_group("gloo")
    results: dict[str, list[dict]] = {}
    for name, check in all_checks().items():
        try:
            result = check()
        except Exception as err:  # reported per check, so one failure does not hide the others
            result = {"ok": False, "detail": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, result)
        results[name] = gathered
    if dist.get_rank() == 0:
        out_path.write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_process(0)  # no interpreter teardown, where gloo can abort a finished rank (lnblocks.process_exit)
