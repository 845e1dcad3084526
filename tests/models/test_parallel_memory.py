"""``benchmarks/models/bench_sharded_memory.py`` reads what a rank holds: checked here at a tiny shape against what
FSDP2 and Korthikanti et al. (arXiv 2205.05198) say a rank must hold."""

from __future__ import annotations

import math

import pytest
import torch

from lnblocks import GPT


@pytest.fixture(scope="module")
def bench():
    from benchmarks.models import bench_sharded_memory

    return bench_sharded_memory


def test_fsdp_shards_are_torch_chunks_of_dim_0(bench) -> None:
    """Rank 0 holds ``torch.chunk(p, N)[0]`` of every parameter: ceil(d0 / N) rows (fp32; AdamW keeps two such)."""
    world = 4
    with torch.device("meta"):
        params = list(GPT(bench.TINY).parameters())
    want = sum(math.ceil(p.shape[0] / world) * p[0].numel() * 4 for p in params) / bench.MiB
    got = bench.state_bytes(bench.TINY, world, 1)
    assert got["params"] == pytest.approx(want, rel=1e-12)
    assert got["grads"] == pytest.approx(want, rel=1e-12)
    assert got["adamw"] == pytest.approx(2 * want + len(params) * 4 / bench.MiB, rel=1e-12)  # + a step per parameter


def test_sequence_parallel_divides_a_layers_activations_by_tp(bench) -> None:
    one, _ = bench.activation_bytes(bench.TINY, 1, False, False, 64)
    sp, _ = bench.activation_bytes(bench.TINY, 2, True, False, 64)
    no_sp, _ = bench.activation_bytes(bench.TINY, 2, False, False, 64)
    assert sp * 2 == pytest.approx(one, rel=1e-12)
    assert sp < no_sp < one  # without SP the norms' inputs stay whole on every rank
