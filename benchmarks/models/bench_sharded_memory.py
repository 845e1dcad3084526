"""Per-rank memory of a sharded GPT: parameters, gradients and AdamW state against the mesh, and activation bytes
with and without sequence parallelism (``lnblocks.models.parallel``).

Every number is read off the tensors a rank holds, not computed by hand: the model is built on the meta device
(parameter state) or under ``FakeTensorMode`` (activations: shapes, dtypes and CPU dispatch, no storage) as rank 0
of PyTorch's fake process group of the wanted world size (collectives are no-ops), sharded by ``parallelize`` /
``apply_tensor_parallel`` as on a real mesh, and then

- parameters: the local shards' bytes (``DTensor.to_local()``);
- gradients: one per parameter in the parameter's sharding, which is where FSDP2's reduce-scatter puts it (fp32);
- optimizer: the AdamW state tensors after one ``step()`` (``exp_avg``, ``exp_avg_sq``, ``step``);
- activations: bytes of the distinct storages autograd saves for backward during one forward (``saved_tensors_hooks``,
  as ``bench_memory.py``), per layer = (2-layer model - 1-layer model), the rest = embeddings, final norm, head and
  loss. Tensor parallelism only (FSDP does not change activations: a rank holds its ``B / dp_shard`` rows), one
  sequence of ``--seq`` tokens, bf16 weights and activations (the loss's fp32 logits included).

    python benchmarks/models/bench_sharded_memory.py          # GPT-2 small (vocab 50304) and a Llama-3.2-1B shape
    python benchmarks/models/bench_sharded_memory.py --quick  # tiny shapes (seconds)
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore
from tqdm import tqdm

from lnblocks import GPT, GPTConfig
from lnblocks.models.parallel import ParallelConfig, apply_tensor_parallel, build_mesh, loss_context, parallelize

MiB = 2**20
GPT2_SMALL = GPTConfig(
    vocab_size=50304, max_seq_len=1024, n_layers=12, positions="learned", tie_weights=True,
    block={"dim": 768, "norm": "layernorm", "attention": {"n_heads": 12}, "mlp": {"activation": "gelu_tanh"}},
)  # fmt: skip
LLAMA_1B = GPTConfig(  # Llama-3.2-1B's shape: 1.24e9 parameters
    vocab_size=128256, max_seq_len=4096, n_layers=16, positions="rope", rope_theta=500000.0, tie_weights=True,
    block={
        "dim": 2048, "norm": {"kind": "rmsnorm", "eps": 1e-5, "cast": "llama"},
        "attention": {"n_heads": 32, "n_kv_heads": 8, "qkv_bias": False, "out_bias": False},
        "mlp": {"activation": "swiglu", "hidden_dim": 8192, "bias": False},
    },
)  # fmt: skip
TINY = GPTConfig(vocab_size=64, max_seq_len=64, n_layers=2, block={"dim": 32, "attention": {"n_heads": 4}})
MESHES = [(1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (1, 4), (1, 8), (4, 2), (2, 4)]


@contextlib.contextmanager
def fake_world(parallel: ParallelConfig, fake_tensors: bool = True) -> Iterator[DeviceMesh]:
    """Rank 0 of PyTorch's fake process group of ``parallel.world_size`` ranks and its mesh; ``fake_tensors``:
    tensors without storage that dispatch as CPU tensors (the mesh is built first: it reads real rank tensors)."""
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=parallel.world_size)
    try:
        mesh = build_mesh(parallel)
        with FakeTensorMode(allow_non_fake_inputs=True) if fake_tensors else contextlib.nullcontext():
            yield mesh
    finally:
        dist.destroy_process_group()


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def nbytes(tensors) -> int:
    return sum(local(t).numel() * t.element_size() for t in tensors)


def build(config: GPTConfig, dtype: torch.dtype = torch.float32) -> GPT:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return GPT(config)
    finally:
        torch.set_default_dtype(previous)


def state_bytes(config: GPTConfig, dp: int, tp: int) -> dict[str, float]:
    """Per-rank parameter, gradient and AdamW bytes under FSDP2 (``dp``) x tensor parallelism (``tp``), on the
    meta device (FSDP2 shards meta parameters; its fake-tensor initialisation is not supported)."""
    parallel = ParallelConfig(dp_shard=dp, tp=tp)
    with fake_world(parallel, fake_tensors=False) as mesh:
        with torch.device("meta"):
            model = GPT(config)
        model = parallelize(model, mesh, parallel)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)  # FSDP2 reduce-scatters each gradient into its parameter's sharding
        opt = torch.optim.AdamW(model.parameters())
        opt.step()
        states = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        return {
            "params": nbytes(model.parameters()) / MiB,
            "grads": nbytes(p.grad for p in model.parameters()) / MiB,
            "adamw": nbytes(states) / MiB,
        }


def saved_bytes(model: GPT, run: Callable[[], torch.Tensor]) -> int:
    """Bytes of the distinct storages autograd saves while ``run()`` builds its graph (parameters left out)."""
    params = {local(p).untyped_storage()._cdata for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = local(t).untyped_storage()
        if storage._cdata not in params:
            storages[storage._cdata] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(storages.values())


def activation_bytes(config: GPTConfig, tp: int, sp: bool, loss_parallel: bool, seq: int) -> tuple[float, float]:
    """(per layer, rest of the model) MiB saved for backward by one rank, one sequence of ``seq`` tokens, bf16."""
    totals = []
    for n_layers in (1, 2):
        parallel = ParallelConfig(tp=tp, sequence_parallel=sp, loss_parallel=loss_parallel and tp > 1)
        with fake_world(parallel) as mesh:
            model = build(config.replace(n_layers=n_layers), torch.bfloat16)
            if tp > 1:
                parallel.check_model(model.config)
                apply_tensor_parallel(model, mesh["tp"], parallel)
            idx = torch.zeros(1, seq, dtype=torch.long)
            with loss_context(parallel):
                totals.append(saved_bytes(model, lambda m=model, i=idx: m(i, i)[1]))
    per_layer = totals[1] - totals[0]
    return per_layer / MiB, (totals[0] - per_layer) / MiB


def state_table(name: str, config: GPTConfig) -> list[str]:
    lines = [
        f"{name}: {build_count(config) / 1e6:,.0f}M parameters; per-rank MiB (fp32 parameters, gradients, AdamW)",
        "",
        "| dp_shard x tp | params | grads | AdamW | total | vs 1 rank |",
        "|---|---|---|---|---|---|",
    ]
    base = None
    for dp, tp in tqdm(MESHES, desc=f"{name} states", leave=False):
        try:
            r = state_bytes(config, dp, tp)
        except ValueError as err:  # the plan refuses this split (e.g. 12 heads over 8 ranks)
            lines.append(f"| {dp} x {tp} | - | - | - | - | {err} |")
            continue
        total = sum(r.values())
        base = base or total
        lines.append(
            f"| {dp} x {tp} | {r['params']:,.1f} | {r['grads']:,.1f} | {r['adamw']:,.1f} | {total:,.1f} | "
            f"{total / base:.3f} |"
        )
    return lines


def activation_table(name: str, config: GPTConfig, seq: int) -> list[str]:
    lines = [
        f"{name}: activation MiB saved for backward per rank, one sequence of {seq} tokens, bf16",
        "",
        "| tp | per layer, no SP | per layer, SP | rest, no SP | rest, SP | rest, SP + loss_parallel |",
        "|---|---|---|---|---|---|",
    ]
    for tp in tqdm((1, 2, 4, 8), desc=f"{name} activations", leave=False):
        try:
            rows = [activation_bytes(config, tp, sp, lp, seq) for sp, lp in ((False, False), (True, False))]
            rows.append(activation_bytes(config, tp, True, True, seq) if tp > 1 else rows[1])
        except ValueError as err:
            lines.append(f"| {tp} | - | - | - | - | {err} |")
            continue
        (layer, rest), (layer_sp, rest_sp), (_, rest_lp) = rows
        lines.append(f"| {tp} | {layer:,.2f} | {layer_sp:,.2f} | {rest:,.1f} | {rest_sp:,.1f} | {rest_lp:,.1f} |")
    return lines


def build_count(config: GPTConfig) -> int:
    with torch.device("meta"):
        return GPT(config).num_params()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes only")
    parser.add_argument("--seq", type=int, default=1024, help="tokens in the sequence (default 1024)")
    args = parser.parse_args()
    shapes = {"tiny": TINY} if args.quick else {"GPT-2 small": GPT2_SMALL, "Llama-3.2-1B shape": LLAMA_1B}
    seq = min(args.seq, 64) if args.quick else args.seq
    for name, config in shapes.items():
        print("\n".join(state_table(name, config)), end="\n\n")
        print("\n".join(activation_table(name, config, seq)), end="\n\n")


if __name__ == "__main__":
    main()
