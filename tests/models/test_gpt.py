"""GPT: forward/loss against hand computation for every placement, the final-norm rule, hidden states, gradients,
generation (KV cache vs recompute), diagnostics, and every bad input as a ValueError/TypeError."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lnblocks import GPT, BlockConfig, GPTConfig
from lnblocks.blocks import PLACEMENTS, Stream, rope_cache
from lnblocks.models import mix_ln, ngpt_block
from tests.blocks.block_helpers import randomize_

V, T = 50, 12


def small(placement: str = "pre", n_layers: int = 3, **options) -> GPT:
    if placement == "ngpt":  # nGPT: its block (no biases, SwiGLU) and RoPE
        options.setdefault("block", ngpt_block(dim=32, attention={"n_heads": 4}))
        options["positions"] = "rope"
    block = options.pop("block", None) or BlockConfig(dim=32, placement=placement, attention={"n_heads": 4})
    init = "deepnet" if placement == "deepnorm" else "gpt2"
    cfg = GPTConfig(vocab_size=V, max_seq_len=16, n_layers=n_layers, block=block, init=init, **options)
    return randomize_(GPT(cfg), 0.05).eval()


def manual_logits(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """Plain-tensor chain of blocks plus the final-norm rule written out."""
    x = model.tok_emb(idx)
    if model.pos_emb is not None:
        x = x + model.pos_emb(torch.arange(idx.shape[1]))
    if model.config.layers[0].placement == "resi_dual":
        y = x
        for b in model.blocks:
            a = b.attn(x)
            y = y + a
            x = b.attn_post_norm(x + a)
            m = b.mlp(x)
            y = y + m
            x = b.mlp_post_norm(x + m)
        return model.lm_head(x + model.final_norm(y))
    if model.config.layers[0].placement == "siamese":  # both streams from the embedding; norm_f(N(x) + N(y))
        s = Stream(x, None, x)
        for b in model.blocks:
            s = b(s)
        return model.lm_head(model.final_norm(model.final_post_norm(s.value()) + model.final_dual_norm(s.dual)))
    if model.config.layers[0].placement == "ngpt":  # RoPE in the blocks, logits times s_z
        rope = rope_cache(8, torch.arange(idx.shape[1]))
        for b in model.blocks:
            x = b(x, rope)
        return model.lm_head(x) * model.s_z()
    for b in model.blocks:
        x = b(x)
    if model.final_norm is not None:
        x = model.final_norm(x)
    return model.lm_head(x)


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_forward_equals_manual_chain_and_final_norm_rule(placement: str) -> None:
    model = small(placement)
    assert (model.final_norm is not None) == PLACEMENTS[placement].final_norm
    idx = torch.randint(0, V, (2, T))
    with torch.no_grad():
        logits, loss = model(idx)
        assert loss is None and logits.shape == (2, T, V)
        assert torch.equal(logits, manual_logits(model, idx))


def test_loss_is_mean_cross_entropy_ignoring_minus_100() -> None:
    model = small()
    idx, targets = torch.randint(0, V, (2, T)), torch.randint(0, V, (2, T))
    targets[0, :5] = -100
    logits, loss = model(idx, targets)
    expected = F.cross_entropy(logits.double().view(-1, V), targets.view(-1), ignore_index=-100)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-6, atol=1e-6)
    assert loss.dtype == torch.float32


def test_int32_targets_give_the_int64_loss() -> None:
    model, idx = small(), torch.randint(0, V, (2, T))
    targets = torch.randint(0, V, (2, T))
    assert torch.equal(model(idx, targets.int())[1], model(idx, targets)[1])


def test_return_hidden_gives_the_stream_after_each_block() -> None:
    model = small("pre", n_layers=4, final_norm=True)
    idx = torch.randint(0, V, (2, T))
    logits, _, hidden = model(idx, return_hidden=True)
    assert len(hidden) == 5 and all(h.shape == (2, T, 32) for h in hidden)
    x = hidden[0]
    for blk, h in zip(model.blocks, hidden[1:]):
        x = blk(x)
        assert torch.equal(h, x)
    assert torch.equal(logits, model.lm_head(model.final_norm(hidden[-1])))


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_gradient_reaches_every_parameter(placement: str) -> None:
    if placement == "ngpt":
        block = ngpt_block(dim=16, attention={"n_heads": 2})
    else:
        block = BlockConfig(dim=16, placement=placement, attention={"n_heads": 2}, rezero=placement == "none")
    model = small(placement, n_layers=2, block=block, positions="rope" if placement == "parallel" else "learned")
    idx = torch.randint(0, V, (2, 8))
    _, loss = model(idx, idx)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_mix_ln_and_per_layer_configs() -> None:
    """Mix-LN (Li et al. 2024): Post-LN in the first floor(0.25 L) layers, Pre-LN after; final norm from the last."""
    layers = mix_ln(BlockConfig(dim=32, attention={"n_heads": 4}), 12)
    assert [b.placement for b in layers] == ["post"] * 3 + ["pre"] * 9
    model = small(n_layers=12, block=layers)
    assert model.blocks[2].attn_post_norm is not None and model.blocks[3].attn_in_norm is not None
    assert model.final_norm is not None
    idx = torch.randint(0, V, (2, T))
    with torch.no_grad():
        assert torch.equal(model(idx)[0], manual_logits(model, idx))
    by_fn = GPTConfig(n_layers=4, block=lambda i: BlockConfig(placement="post" if i == 0 else "pre"))
    assert [b.placement for b in by_fn.layers] == ["post", "pre", "pre", "pre"]
    assert GPTConfig.from_dict(by_fn.to_dict()) == by_fn


def test_generate_with_a_tiny_temperature_is_greedy_not_nan() -> None:
    """logits / 1e-40 overflows fp32; the shifted logits give -inf instead, i.e. the argmax token."""
    model = small()
    idx = torch.randint(0, V, (2, 4))
    assert torch.equal(model.generate(idx, 4, temperature=1e-40), model.generate(idx, 4, temperature=0))


def test_generate_greedy_cache_equals_recompute_and_argmax() -> None:
    model = small(positions="rope", block=BlockConfig(dim=32, attention={"n_heads": 4, "n_kv_heads": 2}))
    idx = torch.randint(0, V, (2, 4))
    cached = model.generate(idx, 8, temperature=0)
    recomputed = model.generate(idx, 8, temperature=0, use_cache=False)
    assert torch.equal(cached, recomputed) and cached.shape == (2, 12)
    with torch.no_grad():
        for t in range(4, 12):  # every generated token is the argmax of a full forward on its prefix
            assert torch.equal(cached[:, t], model(cached[:, :t])[0][:, -1].argmax(-1))
    assert torch.equal(model.generate(idx, 8, temperature=1.0, top_k=1), cached)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(model.generate(idx, 6, 0.8, 5, generator=g1), model.generate(idx, 6, 0.8, 5, generator=g2))
    model.train()
    model.generate(idx, 1)
    assert model.training  # mode restored


def test_attention_stats_per_layer_from_eager_backend() -> None:
    model = small(block=BlockConfig(dim=32, attention={"n_heads": 4, "backend": "eager"}))
    model(torch.randint(0, V, (2, T)))
    stats = model.attention_stats()
    assert len(stats) == 3 and all(s.max_logit.shape == (4,) and s.entropy.shape == (4,) for s in stats)
    assert all(0 <= e <= torch.log(torch.tensor(float(T))) for s in stats for e in s.entropy)
    with pytest.raises(ValueError, match="recorded by the eager backend"):
        small().attention_stats()


def test_num_params_and_tied_head() -> None:
    model = small(tie_weights=True)
    assert model.lm_head.weight is model.tok_emb.weight
    unique = {id(p): p.numel() for p in model.parameters()}
    assert model.num_params() == sum(unique.values())
    emb = model.tok_emb.weight.numel() + model.pos_emb.weight.numel()
    assert model.num_params(exclude_embeddings=True) == model.num_params() - emb
    assert small().num_params() == model.num_params() + V * 32  # untied head: one more V x C matrix
    assert set(model.matrices()) >= {"blocks.0.W_Q", "blocks.2.W_2"}


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda m: m(torch.randint(0, V, (2, 17))), ValueError, r"longer than the position table \(max_seq_len=16\)"),
        (lambda m: m(torch.full((1, 4), V)), ValueError, r"token ids must be in \[0, vocab_size=50\), got min 50"),
        (lambda m: m(torch.full((1, 4), -1)), ValueError, "got min -1"),
        (lambda m: m(torch.zeros(1, 4)), TypeError, "integer token ids"),
        (lambda m: m(torch.zeros(4, dtype=torch.long)), ValueError, r"shape \(B, T\)"),
        (lambda m: m([1, 2]), TypeError, "must be a torch.Tensor"),
        (lambda m: m(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long)), ValueError, "targets"),
        (lambda m: m(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4)), TypeError, "^targets must hold integer"),
        (
            lambda m: m(torch.zeros(1, 4, dtype=torch.long), torch.full((1, 4), V)),
            ValueError,
            r"got 4 outside \(min 50",
        ),
        (
            lambda m: m(torch.zeros(1, 4, dtype=torch.long), torch.tensor([[0, -1, -100, -7]])),
            ValueError,
            "min -7, max -1",
        ),
        (
            lambda m: m(torch.zeros(1, 4, dtype=torch.long), [[0, 1, 2, 3]]),
            TypeError,
            "^targets must be a torch.Tensor",
        ),
        (lambda m: m.generate(torch.zeros(1, 10, dtype=torch.long), 7), ValueError, "longer than the position table"),
        (lambda m: m.generate(torch.zeros(1, 2, dtype=torch.long), 1, temperature=-1), ValueError, "temperature"),
        (lambda m: m.generate(torch.zeros(1, 2, dtype=torch.long), 1, top_k=0), ValueError, "top_k"),
        (lambda m: m.generate(torch.zeros(1, 2, dtype=torch.long), -1), ValueError, "max_new_tokens"),
        (
            lambda m: m.generate(torch.zeros(2, 0, dtype=torch.long), 3),
            ValueError,
            r"at least one token .*got \(2, 0\)",
        ),
        (lambda m: m.generate(torch.zeros(1, 2, dtype=torch.long), 1, float("nan")), ValueError, "^temperature must"),
        (lambda m: m.generate(torch.zeros(1, 2, dtype=torch.long), 1, float("inf")), ValueError, "^temperature must"),
        (lambda m: m.generate(torch.zeros(1, 2, dtype=torch.long), 1, "hot"), TypeError, "^temperature must be a"),
        (lambda m: m.generate(torch.zeros(1, 2, dtype=torch.long), 1, top_k=2.0), TypeError, "^top_k must be an int"),
        (lambda m: m.generate(torch.zeros(1, 2, dtype=torch.long), 2.0), TypeError, "^max_new_tokens must be an int"),
        (lambda m: m.generate(torch.zeros(1, 2, dtype=torch.long), 1, generator=0), TypeError, "torch.Generator"),
        (
            lambda m: m.blocks[0](torch.randn(4, 32)),
            ValueError,
            r"shape \(B, T, C\) with C = dim = 32, got \(4, 32\)",
        ),
        (
            lambda m: m.blocks[0].attn(torch.randn(4, 32)),
            ValueError,
            r"shape \(B, T, C\) with C = dim = 32, got \(4, 32\)",
        ),
    ],
)
def test_bad_model_inputs(call, error: type, match: str) -> None:
    """Targets too: out of range or float ones gave raw torch errors (IndexError, RuntimeError)."""
    with pytest.raises(error, match=match):
        call(small())


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"block": [BlockConfig()] * 3}, r"got 3 BlockConfigs for n_layers=4"),
        ({"block": [BlockConfig(dim=32)] + [BlockConfig()] * 3}, r"same dim; got dims \[32, 64\]"),
        ({"block": lambda i: BlockConfig(placement="resi_dual" if i else "pre")}, "cannot be mixed with"),
        ({"block": BlockConfig(placement="resi_dual"), "final_norm": False}, "^final_norm must not be False"),
        ({"block": BlockConfig(placement="deepnorm")}, "^init must be 'deepnet' with placement 'deepnorm'"),
        ({"positions": "rope", "block": BlockConfig(dim=60, attention={"n_heads": 4})}, "one even head_dim"),
        ({"positions": "alibi"}, r"positions must be one of \['learned', 'rope', 'none'\]"),
        ({"init": "kaiming"}, r"init must be one of \['gpt2', 'xavier', 'deepnet'\]"),
        ({"vocab_size": 0}, "vocab_size must be >= 1"),
        ({"rope_theta": -1.0}, "^rope_theta must be a finite number > 0"),
        ({"block": {"placement": "pst"}}, r"^block\.placement must be one of \['pre'.*got 'pst'"),
        (
            {"block": [BlockConfig()] * 3 + [{"attention": {"n_heads": 0}}]},
            r"^block\[3\]\.attention\.n_heads must be >= 1",
        ),
    ],
)
def test_bad_gpt_config(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GPTConfig(**options)


def test_gpt_config_from_dict_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match=r"^layers_n is not a config key; valid keys of GPTConfig"):
        GPTConfig.from_dict({"layers_n": 3})
    with pytest.raises(TypeError, match="config must be a GPTConfig or a dict"):
        GPT("gpt2")
    assert GPT({"n_layers": 1, "block": {"dim": 16, "attention": {"n_heads": 2}}}).config.dim == 16
