"""``ParallelConfig`` and the model checks, in one process (the 2-process tests check that the same errors stop
every rank before any collective)."""

from __future__ import annotations

import pytest
import torch

import lnblocks.models
from lnblocks import GPT, GPTConfig
from lnblocks.models.parallel import ParallelConfig

LLAMA = GPTConfig(
    vocab_size=64, n_layers=2, positions="rope",
    block={"dim": 32, "attention": {"n_heads": 4, "n_kv_heads": 2}, "mlp": {"activation": "swiglu", "hidden_dim": 48}},
)  # fmt: skip


def test_lazy_exports_from_lnblocks_models() -> None:
    assert lnblocks.models.ParallelConfig is ParallelConfig
    assert callable(lnblocks.models.parallelize) and callable(lnblocks.models.build_mesh)


def test_yaml_form_round_trips_and_builds_the_mixed_precision_policy() -> None:
    config = ParallelConfig.from_dict({"dp_shard": 2, "tp": 4, "param_dtype": "bfloat16", "reduce_dtype": "float32"})
    assert (config.world_size, config.mesh_shape) == (8, (2, 4))
    assert ParallelConfig.from_dict(config.to_dict()) == config
    policy = config.mp_policy()
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert ParallelConfig().mp_policy().param_dtype is None


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"tp": 0}, ValueError, "tp must be >= 1, got 0"),
        ({"dp_shard": 2.0}, TypeError, "dp_shard must be an int"),
        ({"loss_parallel": True}, ValueError, "loss_parallel .* needs tp > 1"),
        ({"param_dtype": "fp8"}, ValueError, "param_dtype must be one of"),
        ({"fsdp": 2}, ValueError, "fsdp is not a config key; valid keys of ParallelConfig"),
        ({"sequence_parallel": 1}, TypeError, "sequence_parallel must be a bool"),
    ],
)
def test_bad_options_name_the_key(options: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ParallelConfig.from_dict(options)


def test_world_size_must_match() -> None:
    ParallelConfig(dp_shard=2, tp=2).check_world_size(4)
    with pytest.raises(ValueError, match=r"dp_shard \* tp must equal the world size 2: got dp_shard=2 \* tp=2 = 4"):
        ParallelConfig(dp_shard=2, tp=2).check_world_size(2)


def layer(**changes: object) -> dict:
    return {"block": LLAMA.layers[0].replace(**changes)}


@pytest.mark.parametrize(
    ("tp", "change", "match"),
    [
        (4, {}, r"block\[0\]\.attention\.n_kv_heads \(2\) must be divisible by tp=4"),
        (8, {}, r"block\[0\]\.attention\.n_heads \(4\) must be divisible by tp=8"),
        (2, layer(mlp={"activation": "swiglu", "hidden_dim": 47}), r"mlp hidden width .*\(47\)"),
        (2, {"vocab_size": 63}, r"vocab_size \(63\) must be divisible by tp=2"),
        (2, layer(mlp_norm=True), r"block\[0\]\.mlp_norm .* not supported with tp > 1"),
    ],
)
def test_model_that_tp_cannot_split_is_refused(tp: int, change: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ParallelConfig(tp=tp).check_model(LLAMA.replace(**change))


def test_fsdp_alone_accepts_any_shape_and_sequence() -> None:
    ParallelConfig(dp_shard=3).check_model(LLAMA.replace(vocab_size=63))
    ParallelConfig(dp_shard=3).check_sequence(7)
    ParallelConfig(tp=2, sequence_parallel=False).check_sequence(7)
    with pytest.raises(ValueError, match="sequence length T=7 must be divisible by tp=2"):
        ParallelConfig(tp=2).check_sequence(7)


def test_parallelize_takes_a_gpt_and_a_mesh() -> None:
    from lnblocks.models.parallel import parallelize

    with pytest.raises(TypeError, match="model must be an lnblocks GPT, got Linear"):
        parallelize(torch.nn.Linear(2, 2), None)
    with pytest.raises(TypeError, match="mesh must be a DeviceMesh"):
        parallelize(GPT(LLAMA), "cpu")


def test_attention_reads_its_local_heads_from_the_projection_width() -> None:
    """Tensor parallelism gives a rank whole heads of q, k and v: (H + 2 Hkv) hd / tp columns of the qkv output."""
    attn = GPT(LLAMA).blocks[0].attn  # 4 query heads, 2 KV heads, head_dim 8: qkv width 64
    assert attn.local_heads(64) == (4, 2)
    assert attn.local_heads(32) == (2, 1)
    for width in (16, 48, 0, 128):  # 4 shards would split a KV head; 48 is no equal share
        with pytest.raises(ValueError, match=f"qkv output width {width} is not the full width 64"):
            attn.local_heads(width)
