"""The 2-process worker of ``test_parallel_faults.py``: ``torchrun --nproc_per_node 2 parallel_faults.py OUT.json``.

Ranks given different inputs (configs, models, one rank's bad input) must all stop with the same one error before
any sharded collective; generation and the whole-weight readers on a sharded model must either work (against the
unsharded model) or refuse by name. Each check returns ``{"ok", "detail"}`` on every rank; the process group has a
60 s timeout, so a check that hangs on an old lnblocks fails in a minute instead of gloo's thirty.
"""

from __future__ import annotations

import copy
import datetime
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parallel_cases import batches, gpt_config

from lnblocks import GPT
from lnblocks.models.parallel import ParallelConfig, build_mesh, parallelize, split_batch
from lnblocks.process_exit import exit_process


def raises(fn: Callable[[], object], error: type, *needles: str) -> dict:
    try:
        fn()
    except error as err:
        msg = str(err)
        return {"ok": all(n in msg for n in needles) and "\n" not in msg, "detail": msg}
    except Exception as err:
        return {"ok": False, "detail": f"{type(err).__name__}: {err}"}
    return {"ok": False, "detail": f"no {error.__name__}"}


def per_rank(rank0: object, rank1: object) -> object:
    return rank0 if dist.get_rank() == 0 else rank1


# ---- ranks that disagree --------------------------------------------------------------------------------------------


def disagreeing_meshes() -> dict:
    config = per_rank(ParallelConfig(dp_shard=2), ParallelConfig(tp=2))
    return raises(lambda: build_mesh(config), ValueError, "build_mesh: the ranks disagree on ParallelConfig.dp_shard",
                  "rank 0 has 2, rank 1 has 1")  # fmt: skip


def disagreeing_options() -> dict:
    mesh = build_mesh(ParallelConfig(dp_shard=2))
    config = per_rank(ParallelConfig(dp_shard=2), ParallelConfig(dp_shard=2, param_dtype="bfloat16"))
    return raises(lambda: parallelize(GPT(gpt_config("pre")), mesh, config), ValueError,
                  "parallelize: the ranks disagree on ParallelConfig.param_dtype", "rank 1 has 'bfloat16'")  # fmt: skip


def disagreeing_models() -> dict:
    config = ParallelConfig(dp_shard=2)
    mesh = build_mesh(config)
    cfg = gpt_config("pre")
    model = GPT(per_rank(cfg, cfg.replace(n_layers=3)))
    return raises(lambda: parallelize(model, mesh, config), ValueError, "the ranks disagree on GPTConfig.n_layers",
                  "rank 0 has 2, rank 1 has 3")  # fmt: skip


def one_rank_bad_model() -> dict:
    config = ParallelConfig(dp_shard=2)
    mesh = build_mesh(config)
    model = per_rank(GPT(gpt_config("pre")), torch.nn.Linear(2, 2))
    return raises(lambda: parallelize(model, mesh, config), TypeError, "model must be an lnblocks GPT", "on rank 1")


def one_rank_wrong_world_size() -> dict:
    config = per_rank(ParallelConfig(dp_shard=2), ParallelConfig(dp_shard=4))
    return raises(lambda: build_mesh(config), ValueError, "world size 2", "dp_shard=4", "on rank 1")


# ---- generation and whole-weight readers on a sharded model ----------------------------------------------------------


def _sharded(config: ParallelConfig, case: str = "pre") -> tuple[GPT, GPT]:
    torch.manual_seed(0)
    ref = GPT(gpt_config(case))
    return parallelize(copy.deepcopy(ref), build_mesh(config), config), ref


def _loss_after(model: GPT, ref: GPT, config: ParallelConfig) -> tuple[float, float]:
    """The global mean loss of a training forward/backward on the sharded model, and the one-process loss."""
    idx, targets = batches()[0]
    _, loss = model(*split_batch(build_mesh(config), idx, targets))
    loss.backward()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    return mean.item() / dist.get_world_size(), ref(idx, targets)[1].item()


def recipe_before_the_first_forward() -> dict:
    """The documented ``unshard(); generate; reshard()`` before any forward, then training: both as one process."""
    config = ParallelConfig(dp_shard=2)
    model, ref = _sharded(config)
    idx = batches()[0][0][:, :3]
    model.unshard()
    got = model.generate(idx, 4, temperature=0)
    model.reshard()
    want = ref.generate(idx, 4, temperature=0)
    loss, ref_loss = _loss_after(model, ref, config)
    ok = torch.equal(got, want) and abs(loss - ref_loss) < 1e-5
    return {"ok": ok, "detail": f"tokens {got.tolist()} vs {want.tolist()}; loss {loss} vs {ref_loss}"}


def generate_without_unshard() -> dict:
    config = ParallelConfig(dp_shard=2)
    model, ref = _sharded(config, "llama")
    idx = batches()[0][0][:, :3]
    got, want = model.generate(idx, 4, temperature=0), ref.generate(idx, 4, temperature=0)
    again = model.generate(idx, 4, temperature=0, use_cache=False)
    loss, ref_loss = _loss_after(model, ref, config)
    ok = torch.equal(got, want) and torch.equal(again, want) and abs(loss - ref_loss) < 1e-5
    return {"ok": ok, "detail": f"tokens {got.tolist()} vs {want.tolist()}; loss {loss} vs {ref_loss}"}


def generate_under_tensor_parallelism() -> dict:
    model, ref = _sharded(ParallelConfig(tp=2, sequence_parallel=False), "llama")
    idx = batches()[0][0][:, :3]
    got, want = model.generate(idx, 4, temperature=0), ref.generate(idx, 4, temperature=0)
    return {"ok": torch.equal(got, want), "detail": f"tokens {got.tolist()} vs {want.tolist()}"}


def generate_under_sequence_parallelism() -> dict:
    model, _ = _sharded(ParallelConfig(tp=2))
    idx = batches()[0][0][:, :3]
    return raises(lambda: model.generate(idx, 2), ValueError, "generate is not supported under sequence parallelism")


def whole_weights_of_a_sharded_model() -> dict:
    results = []
    for config in (ParallelConfig(dp_shard=2), ParallelConfig(tp=2)):
        model, _ = _sharded(config)
        for what, fn in (("matrices()", model.matrices), ("to_hf()", model.to_hf)):
            results.append(raises(fn, ValueError, f"{what} needs the unsharded model", "full_state_dict=True"))
    return {"ok": all(r["ok"] for r in results), "detail": " | ".join(r["detail"] for r in results)}


CHECKS: dict[str, Callable[[], dict]] = {
    "disagree/meshes": disagreeing_meshes,
    "disagree/options": disagreeing_options,
    "disagree/models": disagreeing_models,
    "disagree/one_rank_bad_model": one_rank_bad_model,
    "disagree/one_rank_wrong_world_size": one_rank_wrong_world_size,
    "sharded/recipe_before_the_first_forward": recipe_before_the_first_forward,
    "sharded/generate_without_unshard": generate_without_unshard,
    "sharded/generate_under_tensor_parallelism": generate_under_tensor_parallelism,
    "sharded/generate_under_sequence_parallelism": generate_under_sequence_parallelism,
    "sharded/whole_weights": whole_weights_of_a_sharded_model,
}


def main(out_path: Path) -> None:
    results: dict[str, list] = {}
    for name, check in CHECKS.items():
        try:
            result = check()
        except Exception as err:
            result = {"ok": False, "detail": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, result)
        results[name] = gathered
    if dist.get_rank() == 0:
        out_path.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        main(Path(sys.argv[1]))
    finally:
        dist.destroy_process_group()
    exit_process(0)  # no interpreter teardown, where gloo can abort a finished rank (lnblocks.process_exit)
