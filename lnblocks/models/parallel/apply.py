"""``parallelize``: FSDP2 and tensor/sequence parallelism on a ``GPT``, and the helpers a training loop needs.

The plan, per module (``stream`` is ``Shard(1)`` with sequence parallelism, ``Replicate()`` without)::

    tok_emb        RowwiseParallel (vocabulary-split table)          -> stream
    pos_emb        ReplicateParallel (learned positions)              -> Shard(0) / Replicate() of (T, C)
    every norm     NormParallel(stream), the residual= input included (emb_norm, the blocks', final_norm)
    attn.qkv       FusedColwiseParallel([q; k; v])  (whole heads per rank; GQA: whole KV heads); with sequence
                   parallelism it gathers the sequence itself and saves only its shard for backward
    attn.q/k_norm  NormParallel(Shard(1)) over the rank's heads
    attn.proj      RowwiseParallel                                   -> stream
    mlp.fc1        FusedColwiseParallel([gate; up]) or one block
    mlp.fc2        RowwiseParallel                                   -> stream
    ReZero gates   replicated
    lm_head        input gathered, ColwiseParallel -> logits Replicate(), or Shard(-1) with loss_parallel

The residual stream between modules is a DTensor, so the block code (every placement, ResiDual's second stream,
DeepNorm's alpha, LayerNorm Scaling, ReZero) runs unchanged on it. This follows torchtitan's Llama plan (norms
``SequenceParallel``, output projections ``RowwiseParallel(output_layouts=Shard(1))``, head
``ColwiseParallel(input_layouts=Shard(1))``), with the norms' fused-residual call and the fused projections added.
Then ``fully_shard`` per block and at the root over the ``dp_shard`` mesh dimension (a tied head shares the root's
group). A study calls::

    config = ParallelConfig.from_dict(run_config["parallel"])
    mesh = build_mesh(config)                      # ValueError on every rank if the world size does not match
    model = parallelize(GPT(model_config), mesh, config)
    idx, targets = split_batch(mesh, idx, targets) # this rank's rows (every tp rank gets the same ones)
    with loss_context(config):
        model(idx, targets)[1].backward()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    loss_parallel,
    parallelize_module,
)

from lnblocks.models.gpt import GPT
from lnblocks.models.parallel.config import MESH_DIMS, ParallelConfig, as_parallel_config
from lnblocks.models.parallel.styles import (
    FusedColwiseParallel,
    GatherInput,
    NormParallel,
    ReplicateParallel,
    replicate_parameters,
)
from lnblocks.rank_agreement import check_ranks_agree, parameter_digest

BLOCK_NORMS = ("attn_in_norm", "attn_out_norm", "attn_post_norm", "mlp_in_norm", "mlp_out_norm", "mlp_post_norm")


def build_mesh(config: ParallelConfig | dict | None = None, device_type: str = "cpu") -> DeviceMesh:
    """The ``(dp_shard, tp)`` mesh of ``config`` over the initialised process group. ``ValueError`` on every rank,
    before the mesh's collectives, when ``dp_shard * tp`` is not the world size or the ranks were given different
    configs (``check_ranks_agree``: they would build different process groups and wait in them forever)."""
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call dist.init_process_group() (torchrun sets it up)")
    problem: BaseException | None = None
    try:
        config = as_parallel_config(config)
        config.check_world_size(dist.get_world_size())
    except (TypeError, ValueError) as err:
        problem = err
    facts = {} if problem else {"ParallelConfig": config.to_dict(), "device_type": device_type}
    check_ranks_agree("build_mesh", facts, problem)
    return init_device_mesh(device_type, config.mesh_shape, mesh_dim_names=MESH_DIMS)


def parallelize(model: GPT, mesh: DeviceMesh, config: ParallelConfig | dict | None = None) -> GPT:
    """Shard ``model`` in place over ``mesh`` (from ``build_mesh``) as ``config`` says, and return it.

    Parameter names, state-dict keys and shapes stay those of the unsharded model (DTensors in place of tensors),
    so ``torch.distributed.checkpoint`` state dicts load into any other world size or layout. Rank 0's initial
    values are copied to every rank. Every check runs before anything is sharded, with the same outcome on every
    rank. ``forward`` then takes this rank's batch rows (``split_batch``) and, with ``loss_parallel``, must run
    inside ``loss_context``; logits are DTensors when ``tp > 1``. Every rank of the process group calls it: before
    any sharded collective the ranks compare their ``ParallelConfig``, model config and parameters
    (``check_ranks_agree``), so ranks given different settings all stop with one error instead of hanging or
    training rank 0's. ``generate`` runs FSDP2's hooks like ``forward`` (no ``unshard()`` needed).
    """
    try:
        config = _checked(model, mesh, config)
        problem = None
    except (TypeError, ValueError) as err:
        problem = err
    facts = {} if problem else {"ParallelConfig": config.to_dict(), "GPTConfig": model.config.to_dict(),
                                "parameters": parameter_digest(model), "mesh": tuple(mesh.shape)}  # fmt: skip
    check_ranks_agree("parallelize", facts, problem)
    _copy_from_rank0(model)
    if config.tp > 1:
        apply_tensor_parallel(model, mesh["tp"], config)
    if config.compile:
        for block in model.blocks:
            block.compile(backend=config.compile_backend)
    apply_fsdp(model, mesh["dp_shard"], config)
    model.register_forward_pre_hook(_sequence_check(config), prepend=True, with_kwargs=True)
    model.parallel_config = config
    return model


def _checked(model: Any, mesh: Any, config: Any) -> ParallelConfig:
    """The checks of ``parallelize`` this rank can make alone (the same outcome on every rank given the same
    inputs); returns the config."""
    config = as_parallel_config(config)
    if not isinstance(model, GPT):
        raise TypeError(f"model must be an lnblocks GPT, got {type(model).__name__}")
    if getattr(model, "parallel_config", None) is not None:
        raise ValueError("model is already parallelized; build a new GPT to shard it differently")
    check_mesh(mesh, config)
    config.check_model(model.config)
    return config


def check_mesh(mesh: Any, config: ParallelConfig) -> None:
    """``ValueError`` unless ``mesh`` is a ``DeviceMesh`` of shape ``(dp_shard, tp)`` named ``MESH_DIMS``."""
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"mesh must be a DeviceMesh (lnblocks.models.parallel.build_mesh), got {type(mesh).__name__}")
    config.check_world_size(mesh.size())
    if mesh.mesh_dim_names != MESH_DIMS or tuple(mesh.shape) != config.mesh_shape:
        raise ValueError(
            f"mesh must have dims {MESH_DIMS} of shape {config.mesh_shape} (dp_shard, tp); got dims "
            f"{mesh.mesh_dim_names} of shape {tuple(mesh.shape)}"
        )


def apply_tensor_parallel(model: GPT, tp_mesh: DeviceMesh, config: ParallelConfig) -> None:
    """Tensor (and sequence) parallelism over the 1-D ``tp_mesh`` (see the module docstring for the plan)."""
    stream = Shard(1) if config.sequence_parallel else Replicate()
    plan: dict[str, ParallelStyle] = {
        "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=stream, use_local_output=False)
    }
    if model.pos_emb is not None:
        plan["pos_emb"] = ReplicateParallel(output=Shard(0) if config.sequence_parallel else Replicate())
    for name in ("emb_norm", "final_norm"):
        if getattr(model, name) is not None:
            plan[name] = NormParallel(stream)
    for i, block in enumerate(model.blocks):
        plan.update({f"blocks.{i}.{k}": v for k, v in _block_plan(block, stream).items()})
        replicate_parameters(block, tp_mesh, recurse=False)  # ReZero gates
    plan["lm_head"] = ColwiseParallel(
        input_layouts=Replicate(),  # gathered by GatherInput first
        output_layouts=Shard(-1) if config.loss_parallel else Replicate(),
        use_local_output=not config.loss_parallel,
    )
    parallelize_module(model, tp_mesh, plan)
    GatherInput(stream)._apply(model.lm_head, tp_mesh)
    if model.config.tie_weights:  # both split the vocabulary (Shard(0)): one parameter again
        model.lm_head.weight = model.tok_emb.weight


def _block_plan(block: nn.Module, stream: Any) -> dict[str, ParallelStyle]:
    attn, mlp = block.attn, block.mlp
    hd = attn.head_dim
    plan: dict[str, ParallelStyle] = {n: NormParallel(stream) for n in BLOCK_NORMS if getattr(block, n) is not None}
    plan["attn.qkv"] = FusedColwiseParallel((attn.n_heads * hd, attn.n_kv_heads * hd, attn.n_kv_heads * hd))
    if attn.q_norm is not None:
        plan["attn.q_norm"] = NormParallel(Shard(1), use_local_output=True)  # (B, H, T, hd): split over heads
        plan["attn.k_norm"] = NormParallel(Shard(1), use_local_output=True)
    plan["attn.proj"] = RowwiseParallel(output_layouts=stream, use_local_output=False)
    plan["mlp.fc1"] = FusedColwiseParallel((mlp.hidden_dim,) * (2 if mlp.gated else 1))
    plan["mlp.fc2"] = RowwiseParallel(output_layouts=stream, use_local_output=False)
    return plan


def apply_fsdp(model: GPT, dp_mesh: DeviceMesh, config: ParallelConfig) -> None:
    """``fully_shard`` each block, then the root (embeddings, final norm, head) over ``dp_mesh``."""
    options = {"mesh": dp_mesh, "mp_policy": config.mp_policy(), "reshard_after_forward": config.reshard_after_forward}
    for block in model.blocks:
        fully_shard(block, **options)
    fully_shard(model, **options)
    # generate runs the trunk without forward: give it forward's FSDP2 hooks (the root's lazy init and all-gather),
    # so it needs no unshard() and never lazily initialises a block as a root (which broke every later forward)
    register_fsdp_forward_method(model, "generate")


def _copy_from_rank0(model: nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank (FSDP2 keeps each rank's own values; TP would copy rank 0's
    within each tp group only). Nothing to copy on the meta device."""
    for t in [*model.parameters(), *model.buffers()]:
        if t.device.type != "meta":
            dist.broadcast(t.data, src=0)


def _sequence_check(config: ParallelConfig):
    def check(module: nn.Module, args: tuple, kwargs: dict) -> None:
        idx = args[0] if args else kwargs.get("idx")
        if isinstance(idx, Tensor) and idx.dim() == 2:
            config.check_sequence(idx.shape[1])

    return check


def split_batch(mesh: DeviceMesh, *tensors: Tensor) -> tuple[Tensor, ...]:
    """This rank's rows of global-batch tensors (``(B, ...)`` each): the ``dp_shard`` coordinate's ``B / dp_shard``
    rows; every tp rank of a data-parallel group gets the same rows. ``ValueError`` unless ``dp_shard`` divides B."""
    n, rank = mesh["dp_shard"].size(), mesh.get_local_rank("dp_shard")
    out = []
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor) or t.dim() == 0 or t.shape[0] % n:
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"tensors[{i}]: batch size must be divisible by dp_shard={n}, got shape {got}")
        out.append(t.chunk(n)[rank])
    return tuple(out)


@contextlib.contextmanager
def loss_context(config: ParallelConfig | dict | None) -> Iterator[None]:
    """PyTorch's ``loss_parallel()`` when ``config.loss_parallel`` (the forward that computes the loss and its
    backward both run inside), otherwise nothing."""
    config = as_parallel_config(config)
    with loss_parallel() if config.loss_parallel else contextlib.nullcontext():
        yield


def full_grads(model: nn.Module) -> dict[str, Tensor]:
    """``{name: gradient}`` of every parameter with a gradient, DTensors gathered (a collective: call it on every
    rank). For comparisons against an unsharded run."""
    out = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            g = p.grad
            out[name] = g.full_tensor() if hasattr(g, "full_tensor") else g
    return out
