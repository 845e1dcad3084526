"""``ParallelConfig``: how a ``GPT`` is sharded, and the checks that refuse a model or mesh it cannot shard.

Every check here is a pure function of the config, the model's ``GPTConfig`` and the world size, so it raises the
same ``ValueError`` on every rank before any collective runs: a bad shape ends all ranks with one message instead
of leaving some of them waiting in a collective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

import torch

from lnblocks.config import Config, ConfigValueError, check_bool, check_choice, check_int, check_str

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from lnblocks.models.config import GPTConfig

DType = Literal["float32", "bfloat16", "float16"]
DTYPES: tuple[str, ...] = get_args(DType)
MESH_DIMS: tuple[str, str] = ("dp_shard", "tp")


@dataclass(frozen=True, kw_only=True)
class ParallelConfig(Config):
    """A 2-D device mesh ``(dp_shard, tp)`` and what runs on it.

    ``dp_shard``: FSDP2 degree (``fully_shard`` per block and at the root; each rank gets ``1/dp_shard`` of the
    batch). ``tp``: tensor-parallel degree (Megatron-LM's column/row split of attention heads and MLP units,
    Shoeybi et al. 2019, arXiv 1909.08053; every tp rank sees the same batch). ``sequence_parallel`` (tp > 1): the
    residual stream, norms and dropout between the sublayers are split along the sequence (Korthikanti et al. 2022,
    arXiv 2205.05198). ``loss_parallel`` (tp > 1): logits stay split over the vocabulary and the cross-entropy runs
    on the shards (run forward and backward inside ``loss_context``). ``param_dtype``/``reduce_dtype``: FSDP2's
    ``MixedPrecisionPolicy`` (None: the parameters' own dtype); ``reshard_after_forward``: FSDP2's option of the
    same name. ``compile``: ``torch.compile`` every block (with ``compile_backend``) after tensor parallelism and
    before FSDP, torchtitan's order (FSDP2's hooks are not traced: ``torch._dynamo.config.skip_fsdp_hooks``).
    """

    dp_shard: int = 1
    tp: int = 1
    sequence_parallel: bool = True
    loss_parallel: bool = False
    param_dtype: DType | None = None
    reduce_dtype: DType | None = None
    reshard_after_forward: bool = True
    compile: bool = False
    compile_backend: str = "inductor"

    def __post_init__(self) -> None:
        self._set("dp_shard", check_int("dp_shard", self.dp_shard))
        self._set("tp", check_int("tp", self.tp))
        for name in ("sequence_parallel", "loss_parallel", "reshard_after_forward", "compile"):
            check_bool(name, getattr(self, name))
        for name in ("param_dtype", "reduce_dtype"):
            check_choice(name, getattr(self, name), DTYPES, allow_none=True)
        check_str("compile_backend", self.compile_backend)
        if self.loss_parallel and self.tp == 1:
            raise ConfigValueError("loss_parallel", "splits the logits over tensor-parallel ranks: it needs tp > 1")

    @property
    def world_size(self) -> int:
        return self.dp_shard * self.tp

    @property
    def mesh_shape(self) -> tuple[int, int]:
        return (self.dp_shard, self.tp)

    def mp_policy(self) -> MixedPrecisionPolicy:
        """FSDP2's ``MixedPrecisionPolicy`` for ``param_dtype`` / ``reduce_dtype``. Block inputs are not cast
        (``cast_forward_inputs=False``): the stream already has the dtype of the bf16 embeddings, and a residual kept
        in fp32 (``norm.residual_in_fp32``) must stay fp32 between the blocks, as in the unsharded model."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(
            param_dtype=_dtype(self.param_dtype), reduce_dtype=_dtype(self.reduce_dtype), cast_forward_inputs=False
        )

    def check_world_size(self, world_size: int) -> None:
        """``ValueError`` unless ``dp_shard * tp`` is the number of processes."""
        if world_size != self.world_size:
            raise ConfigValueError(
                "dp_shard * tp",
                f"must equal the world size {world_size}: got dp_shard={self.dp_shard} * tp={self.tp} = "
                f"{self.world_size}",
            )

    def check_model(self, model: GPTConfig) -> None:
        """``ValueError`` naming the value when ``model`` cannot be split ``tp`` ways (nothing to check for FSDP:
        it pads uneven shards)."""
        tp = self.tp
        if tp == 1:
            return
        for i, layer in enumerate(model.layers):
            att = layer.attention
            for name, value in (
                ("attention.n_heads", att.n_heads),
                ("attention.n_kv_heads", att.kv_heads),
                ("mlp hidden width (mlp.hidden_dim or 4 * dim)", layer.mlp_hidden_dim),
            ):
                if value % tp:
                    raise ConfigValueError(f"block[{i}].{name}", f"({value}) must be divisible by tp={tp}")
            if layer.mlp_norm_spec is not None:
                raise ConfigValueError(
                    f"block[{i}].mlp_norm",
                    f"normalises the MLP hidden units, which tensor parallelism splits over the tp={tp} ranks "
                    "(its statistics would need an all-reduce): not supported with tp > 1",
                )
        if model.vocab_size % tp:
            raise ConfigValueError(
                "vocab_size",
                f"({model.vocab_size}) must be divisible by tp={tp}: the embedding and LM head are split over the "
                "vocabulary (pad it, e.g. GPT-2's 50257 to 50304 as nanoGPT does)",
            )

    def check_sequence(self, seq_len: int) -> None:
        """``ValueError`` when sequence parallelism cannot split ``seq_len`` positions evenly."""
        if self.tp > 1 and self.sequence_parallel and seq_len % self.tp:
            raise ValueError(
                f"sequence length T={seq_len} must be divisible by tp={self.tp} with sequence_parallel=True "
                "(each rank holds T / tp positions of the residual stream)"
            )


def _dtype(name: str | None) -> torch.dtype | None:
    return None if name is None else getattr(torch, name)


def as_parallel_config(config: Any) -> ParallelConfig:
    """A ``ParallelConfig`` from itself, a mapping (the YAML form) or None (defaults)."""
    return ParallelConfig.from_dict(config)
