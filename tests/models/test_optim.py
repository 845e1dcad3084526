"""Muon + AdamW as one optimizer: the split (hidden 2-D matrices to Muon, embeddings, head, norms, gains and biases
to AdamW), steps equal to the two torch optimizers built by hand, and a checkpoint that resumes bit for bit."""

from __future__ import annotations

import copy
import io

import pytest
import torch

from lnblocks import GPT, BlockConfig, GPTConfig
from lnblocks.models import OptimizerPair, build_muon, muon_split


def _model(**block) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, max_seq_len=16, n_layers=2, block=BlockConfig(dim=32, **block), tie_weights=True)
    return GPT(cfg)


def _batches(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 64, (4, 9), generator=g) for _ in range(n)]


def _train(model: GPT, opt, batches) -> None:
    for idx in batches:
        opt.zero_grad()
        model(idx[:, :-1], idx[:, 1:])[1].backward()
        opt.step()


def test_split_gives_muon_the_hidden_matrices_and_adamw_the_rest() -> None:
    model = _model(attention={"n_heads": 4, "output_gate": "headwise"})
    muon, adamw = muon_split(model)
    roles = ("attn.qkv.weight", "attn.proj.weight", "attn.gate_proj.weight", "mlp.fc1.weight", "mlp.fc2.weight")
    assert [n for n, _ in muon] == [f"blocks.{i}.{r}" for i in range(2) for r in roles]
    assert all(p.dim() == 2 for _, p in muon)
    names = [n for n, _ in adamw]
    assert "tok_emb.weight" in names and "pos_emb.weight" in names and "lm_head.weight" not in names  # tied: once
    assert "blocks.0.attn_in_norm.weight" in names and "blocks.0.attn.qkv.bias" in names
    assert len(muon) + len(adamw) == len(list(model.parameters()))


def test_pair_steps_as_the_two_torch_optimizers() -> None:
    """``build_muon`` = ``torch.optim.Muon`` on the matrices + ``torch.optim.AdamW`` (decay on 2-D only)."""
    model = _model()
    ref = copy.deepcopy(model)
    pair = build_muon(model, lr=0.02, adamw_lr=3e-3, weight_decay=0.1, adamw_weight_decay=0.05)
    muon_p, adamw_p = muon_split(ref)
    muon = torch.optim.Muon([p for _, p in muon_p], lr=0.02, weight_decay=0.1)
    groups = [{"params": [p for _, p in adamw_p if p.dim() >= 2], "weight_decay": 0.05},
              {"params": [p for _, p in adamw_p if p.dim() < 2], "weight_decay": 0.0}]  # fmt: skip
    adamw = torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    batches = _batches(3)
    _train(model, pair, batches)
    _train(ref, OptimizerPair(muon, adamw), batches)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p, q), name
    assert [g["initial_lr"] for g in pair.param_groups] == [0.02, 3e-3, 3e-3]


def test_checkpoint_resumes_bit_for_bit() -> None:
    """Save model + pair after 3 steps, load both into fresh objects, 3 more steps: equal to 6 uninterrupted."""
    batches = _batches(6)
    straight = _model()
    opt = build_muon(straight, lr=0.02, adamw_lr=1e-3)
    _train(straight, opt, batches)

    first = _model()
    opt1 = build_muon(first, lr=0.02, adamw_lr=1e-3)
    _train(first, opt1, batches[:3])
    buffer = io.BytesIO()
    torch.save({"model": first.state_dict(), "opt": opt1.state_dict()}, buffer)
    buffer.seek(0)
    ckpt = torch.load(buffer, weights_only=True)
    resumed = _model()
    torch.manual_seed(123)  # a fresh process's model: other weights until the checkpoint is loaded
    with torch.no_grad():
        for p in resumed.parameters():
            p.normal_()
    resumed.load_state_dict(ckpt["model"])
    opt2 = build_muon(resumed, lr=0.02, adamw_lr=1e-3)
    opt2.load_state_dict(ckpt["opt"])
    _train(resumed, opt2, batches[3:])
    for (name, p), q in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), name
    assert opt2.muon.state and opt2.adamw.state


def test_schedules_set_each_group_through_param_groups() -> None:
    pair = build_muon(_model(), lr=0.02, adamw_lr=1e-3)
    for group in pair.param_groups:
        group["lr"] = group["initial_lr"] * 0.5
    assert pair.muon.param_groups[0]["lr"] == 0.01 and pair.adamw.param_groups[0]["lr"] == 5e-4


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match=r"^lr must be a finite number > 0"):
        build_muon(_model(), lr=0.0)
    with pytest.raises(TypeError, match=r"model must have its residual blocks in model\.blocks"):
        muon_split(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"state_dict must be an OptimizerPair's"):
        build_muon(_model(), lr=0.02).load_state_dict({"state": {}})
