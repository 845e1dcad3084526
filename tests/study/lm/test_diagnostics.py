"""Diagnostics against quantities recomputed by hand from the model's own tensors, and the guarantee that
logging them does not change training."""

from __future__ import annotations

import math

import pytest
import torch

from lnblocks.models import GPT, GPTConfig
from lnblocks.study import RunConfig, train_run
from lnblocks.study.lm.run import diagnostics as diag


def tiny_gpt(placement: str = "post", n_layers: int = 3, **block: object) -> GPT:
    cfg = GPTConfig(
        vocab_size=32,
        max_seq_len=16,
        n_layers=n_layers,
        init="xavier",
        block={"dim": 32, "placement": placement, "attention": {"n_heads": 4}, **block},
    )
    return GPT(cfg)


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 32, (4, 16), generator=g)
    return x, torch.roll(x, -1, dims=1)


@pytest.mark.parametrize("placement", ["pre", "post", "sandwich"])
def test_grad_norms_match_the_parameter_grads(placement: str) -> None:
    model = tiny_gpt(placement)
    x, y = batch()
    model(x, y)[1].backward()
    got = diag.grad_norms(model)
    for i, blk in enumerate(model.blocks):
        q, _, v = blk.attn.qkv.weight.grad.chunk(3, dim=0)  # rows [q; k; v], no GQA here
        assert got["grad_norm"]["W_Q"][i] == pytest.approx(float(q.norm()), rel=1e-5)
        assert got["grad_norm"]["W_V"][i] == pytest.approx(float(v.norm()), rel=1e-5)
        assert got["grad_norm"]["W_O"][i] == pytest.approx(float(blk.attn.proj.weight.grad.norm()), rel=1e-5)
        assert got["grad_norm"]["W_2"][i] == pytest.approx(float(blk.mlp.fc2.weight.grad.norm()), rel=1e-5)
        gains = [p.grad for n, p in blk.named_parameters() if "norm" in n]
        assert got["grad_norm"]["norm"][i] == pytest.approx(
            float(torch.cat([g.flatten() for g in gains]).norm()), rel=1e-5
        )
    total = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    assert got["grad_norm_total"] == pytest.approx(float(total), rel=1e-5)


def test_expected_gradient_is_the_norm_of_the_mean_gradient() -> None:
    model = tiny_gpt("post")
    batches = [batch(s) for s in range(3)]
    got = diag.expected_grad(model, batches)
    assert all(p.grad is None for p in model.parameters())
    grads = []
    for x, y in batches:
        model.zero_grad()
        model(x, y)[1].backward()
        grads.append([blk.mlp.fc2.weight.grad.clone() for blk in model.blocks])
    for i in range(3):
        mean_grad = sum(g[i] for g in grads) / 3
        assert got["expected"]["W_2"][i] == pytest.approx(float(mean_grad.norm()), rel=1e-5)
        assert got["per_batch"]["W_2"][i] == pytest.approx(sum(float(g[i].norm()) for g in grads) / 3, rel=1e-5)
        assert got["expected"]["W_2"][i] <= got["per_batch"]["W_2"][i] + 1e-6  # triangle inequality


def test_update_ratio_matches_the_weight_change() -> None:
    model = tiny_gpt("pre")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()
    model(x, y)[1].backward()
    before = diag.snapshot(model)
    w2 = [blk.mlp.fc2.weight.detach().clone() for blk in model.blocks]
    opt.step()
    got = diag.update_ratios(model, before)
    for i, blk in enumerate(model.blocks):
        expected = (blk.mlp.fc2.weight.detach() - w2[i]).norm() / w2[i].norm()
        assert got["W_2"][i] == pytest.approx(float(expected), rel=1e-4)


@torch.no_grad()
def test_probe_against_hand_computed_stream_and_attention_logits() -> None:
    model = tiny_gpt("pre", n_layers=2)
    x, _ = batch()
    got = diag.probe(model, x)
    assert model.blocks[0].attn.config.backend == "sdpa"  # restored after the eager probe
    _, _, hidden = model(x, return_hidden=True)
    for i, h in enumerate(hidden):
        assert got["residual_rms"][i] == pytest.approx(float(h.pow(2).mean().sqrt()), rel=1e-5)
        assert got["residual_max"][i] == pytest.approx(float(h.abs().max()), rel=1e-5)
    # layer 0's attention logits by hand: q.k / sqrt(hd) of the first block's normalised input, causal pairs only
    blk = model.blocks[0]
    u = blk.attn_in_norm(hidden[0])  # (B, T, C)
    q, k, _ = (u @ blk.attn.qkv.weight.T + blk.attn.qkv.bias).chunk(3, dim=-1)
    q = q.view(4, 16, 4, 8).transpose(1, 2)
    k = k.view(4, 16, 4, 8).transpose(1, 2)
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(8)  # (B, H, T, T)
    causal = torch.ones(16, 16, dtype=torch.bool).tril()
    assert got["attn_max_logit"][0] == pytest.approx(float(logits[..., causal].max()), rel=1e-4)
    probs = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)
    entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1).mean()
    assert got["attn_entropy"][0] == pytest.approx(float(entropy), rel=1e-4)
    logits_out, _ = model(x)
    assert got["max_output_logit"] == pytest.approx(float(logits_out.max()), rel=1e-5)
    assert got["log_z"] == pytest.approx(float(torch.logsumexp(logits_out, -1).mean()), rel=1e-5)


def test_eager_attention_restores_the_backend_after_an_error() -> None:
    model = tiny_gpt("pre")
    with pytest.raises(RuntimeError), diag.eager_attention(model):
        assert model.blocks[0].attn.config.backend == "eager"
        raise RuntimeError("boom")
    assert {b.attn.config.backend for b in model.blocks} == {"sdpa"}


def test_logging_diagnostics_does_not_change_the_training_trajectory() -> None:
    base = {
        "data": {"source": "markov", "seq_len": 16, "batch_size": 8, "eval_batches": 1},
        "model": {"depth": 2, "dim": 32, "placement": "post"},
        "train": {"steps": 12, "lr": 3e-3},
    }
    off = train_run(
        RunConfig.from_dict({**base, "diagnostics": {"every": 0, "init_grad_batches": 0}}), show_progress=False
    )
    on = train_run(
        RunConfig.from_dict({**base, "diagnostics": {"every": 3, "init_grad_batches": 2}}), show_progress=False
    )
    assert on.result.loss == off.result.loss
    assert [d["step"] for d in on.result.diagnostics] == [0, 3, 6, 9, 11]
    assert off.result.diagnostics == [] and off.result.init_grad is None
