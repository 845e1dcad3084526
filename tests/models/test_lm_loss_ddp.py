"""The chunked LM head under DDP: two gloo processes, each with half of the batch, through
``GPT.forward(..., return_logits=False, z_loss=...)``, end with the gradients (all-reduced) of one process computing
today's full-logits loss + the study's z-loss on the whole batch (tied and untied head; max|diff| <= 1e-5 *
max|reference|: the all-reduce averages in another order)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import lnblocks.models.lm_head as L
from lnblocks import GPT, BlockConfig, GPTConfig
from tests.gloo_helpers import run_gloo

WORLD, B, T, V, COEF = 2, 4, 16, 97, 1e-2


def _model(tie: bool) -> GPT:
    torch.manual_seed(0)
    block = BlockConfig(dim=16, attention={"n_heads": 2})
    return GPT(GPTConfig(vocab_size=V, max_seq_len=T, n_layers=2, block=block, tie_weights=tie))


def _check(rank: int, tie: bool) -> None:
    g = torch.Generator().manual_seed(1)
    idx, targets = torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)
    ref = _model(tie)
    logits, loss = ref(idx, targets)
    (loss + COEF * torch.logsumexp(logits.float(), dim=-1).pow(2).mean()).backward()

    ddp = DDP(_model(tie))
    half = slice(rank * B // WORLD, (rank + 1) * B // WORLD)
    stats, loss = ddp(idx[half], targets[half], return_logits=False, z_loss=COEF)
    (loss + stats.z_loss).backward()
    want = F.cross_entropy(ref(idx[half])[0].flatten(0, 1), targets[half].flatten())
    assert abs(loss.item() - want.item()) <= 1e-6 * want.item()
    for (n, p), (_, p_ref) in zip(ddp.module.named_parameters(), ref.named_parameters(), strict=True):
        err = (p.grad - p_ref.grad).abs().max().item()
        assert err <= 1e-5 * p_ref.grad.abs().max().item(), f"{n}: {err:.3g}"


def _worker(rank: int) -> None:
    L.SINGLE_CHUNK_ELEMENTS = 0  # chunk these small logits (2 rows per chunk: 1/16 of a rank's 32)
    for tie in (False, True):
        try:
            _check(rank, tie)
        except AssertionError as err:
            raise AssertionError(f"tie_weights={tie}, rank {rank}: {err}") from err


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
def test_two_gloo_processes_equal_the_full_loss_on_the_whole_batch() -> None:
    run_gloo(_worker, WORLD)
