"""GPTs with the 2025-26 options: the model-level wiring of each against its formula (SiameseNorm's output, the
hyper-connections' n streams, nGPT's logit scale and weight renormalisation, HybridNorm's final norm, Gemma 2's
embedding scale and final soft-cap, in full and in chunks), the diagnostic probe, and the config rules."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lnblocks import GPT, BlockConfig, GPTConfig
from lnblocks.blocks import Stream, composite_gain, softcap
from lnblocks.models import hybridnorm, ngpt_block
from tests.blocks.block_helpers import randomize_


def _gpt(block: BlockConfig | dict | tuple, n_layers: int = 2, **options) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, max_seq_len=16, n_layers=n_layers, block=block, **options)
    return randomize_(GPT(cfg), 0.1).eval()


def _ids(b: int = 2, t: int = 9) -> torch.Tensor:
    return torch.randint(0, 64, (b, t))


def test_siamese_model_output_is_the_norm_of_both_normalised_streams() -> None:
    """SiameseNorm: both streams start at the embedding; the head reads ``norm_f(norm_x(x_N) + norm_y(y_N))``."""
    model = _gpt(BlockConfig(dim=32, placement="siamese"))
    idx = _ids()
    with torch.no_grad():
        e = model.tok_emb(idx) + model.pos_emb(torch.arange(9))
        s = Stream(e, None, e)
        for blk in model.blocks:
            s = blk(s)
        h = model.final_norm(model.final_post_norm(s.value()) + model.final_dual_norm(s.dual))
        assert torch.equal(model(idx)[0], model.lm_head(h))


@pytest.mark.parametrize("kind", ["static", "dynamic", "mhc"])
def test_hyper_connection_model_expands_then_sums_the_streams(kind: str) -> None:
    """Hyper-connections: n copies of the embedding; the streams summed before the final norm."""
    model = _gpt(BlockConfig(dim=32, hyper_connections={"n_streams": 3, "kind": kind}))
    idx = _ids()
    with torch.no_grad():
        e = model.tok_emb(idx) + model.pos_emb(torch.arange(9))
        h = e.unsqueeze(-2).expand(2, 9, 3, 32)
        for blk in model.blocks:
            h = blk(h)
        logits, _, hidden = model(idx, return_hidden=True)
        assert torch.equal(logits, model.lm_head(model.final_norm(h.sum(-2))))
        assert torch.equal(hidden[-1], h.sum(-2)) and len(hidden) == 3


def test_ngpt_model_scales_logits_by_s_z_and_renormalises_its_weights() -> None:
    """nGPT: logits ``z * s_z`` (Eq. 3), no final norm; unit-norm embeddings and weight vectors at init and after
    ``normalize_weights_`` (Sec. 2.6), which a step of the optimizer would otherwise leave off the sphere."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, max_seq_len=16, n_layers=2, block=ngpt_block(dim=32), positions="rope"))
    assert model.final_norm is None and model.s_z is not None

    def unit(w: torch.Tensor, dim: int) -> bool:
        return torch.allclose(w.norm(dim=dim), torch.ones(w.shape[1 - dim]), atol=1e-6)

    def all_unit() -> bool:
        blk = model.blocks[0]
        rows = (model.tok_emb.weight, model.lm_head.weight, blk.attn.qkv.weight, blk.mlp.fc1.weight)
        return all(unit(w, 1) for w in rows) and unit(blk.attn.proj.weight, 0) and unit(blk.mlp.fc2.weight, 0)

    assert all_unit()
    idx = _ids()
    logits, loss = model(idx, idx)
    with torch.no_grad():
        _, _, hidden = model(idx, return_hidden=True)
        torch.testing.assert_close(hidden[-1].norm(dim=-1), torch.ones(2, 9))  # the hidden state is on the sphere
        s_z = model.s_z.weight * 32**0.5
        torch.testing.assert_close(logits, model.lm_head(hidden[-1]) * s_z)
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    assert not all_unit()
    model.normalize_weights_()
    assert all_unit()
    _, chunked = model(idx, idx, return_logits=False)
    torch.testing.assert_close(chunked, model(idx, idx)[1], rtol=1e-6, atol=1e-6)


def test_normalize_weights_leaves_other_models_alone() -> None:
    model = _gpt(BlockConfig(dim=32))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.normalize_weights_()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_hybridnorm_model_ends_with_a_final_norm() -> None:
    model = _gpt(hybridnorm(BlockConfig(dim=32, norm="rmsnorm"), 2))
    assert model.config.uses_final_norm and model.blocks[0].attn_in_norm is None
    idx = _ids()
    with torch.no_grad():
        h = model.tok_emb(idx) + model.pos_emb(torch.arange(9))
        for blk in model.blocks:
            h = blk(h)
        assert torch.equal(model(idx)[0], model.lm_head(model.final_norm(h)))


@pytest.mark.parametrize("rows", [None, 5])
def test_final_softcap_in_full_and_in_chunks(rows: int | None) -> None:
    """Gemma 2's final cap ``c tanh(z / c)``: the logits, and the chunked head's loss, z-loss, max logit and log Z
    (one chunk, or chunks of 5 rows under checkpointing) against the full capped logits, gradients included."""
    from lnblocks.models.capped_loss import capped_lm_head_loss

    model = _gpt(BlockConfig(dim=32), final_softcap=0.7, emb_scale=2.0)
    idx, targets = _ids(), _ids()
    targets[0, :3] = -100
    logits, loss = model(idx, targets)
    h = model._trunk(idx, 0, None, None)  # (B, T, C): the head's input
    full = softcap(model.lm_head(h), 0.7)  # the reference: the full capped logits
    ref_loss = F.cross_entropy(full.float().flatten(0, 1), targets.flatten())
    assert torch.equal(logits, full) and torch.equal(loss, ref_loss) and logits.abs().max() < 0.7
    grads = torch.autograd.grad(ref_loss + 0.1 * torch.logsumexp(full.float(), -1).pow(2).mean(), [h])
    c_loss, stats = capped_lm_head_loss(h, model.lm_head.weight, targets, 0.7, z_loss=0.1, stats=True, chunk_rows=rows)
    torch.testing.assert_close(c_loss, ref_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(stats.max_logit, full.detach().amax())
    torch.testing.assert_close(stats.log_z, torch.logsumexp(full.detach().float(), -1), rtol=1e-6, atol=1e-6)
    c_grads = torch.autograd.grad(c_loss + stats.z_loss, [h])
    torch.testing.assert_close(c_grads[0], grads[0], rtol=1e-5, atol=1e-7)
    _, chunked = model(idx, targets, return_logits=False, z_loss=0.1)
    torch.testing.assert_close(chunked, loss, rtol=1e-6, atol=1e-6)
    with torch.no_grad():  # the embedding scale: token embeddings times 2 before the positions
        e = model.tok_emb(idx) * 2.0 + model.pos_emb(torch.arange(9))
        assert torch.equal(model(idx, return_hidden=True)[2][0], e)


def test_probe_reads_the_sink_massive_activations_and_the_mixing_gain() -> None:
    model = _gpt(BlockConfig(dim=32, hyper_connections={"n_streams": 2, "kind": "dynamic"}), n_layers=3).train()
    idx = _ids()
    result = model.probe(idx)
    assert model.training and all(b.attn.config.backend == "sdpa" for b in model.blocks)  # restored
    assert all(hc.last_mixing is None and not hc.record for b in model.blocks for hc in (b.attn_hc, b.mlp_hc))
    model.eval()
    with torch.no_grad():
        _, _, hidden = model(idx, return_hidden=True)
    assert len(result.layers) == 3
    for layer, h in zip(result.layers, hidden[1:]):
        mass = layer.first_token_mass
        assert mass.shape == (4,) and ((mass > 0) & (mass < 1)).all()
        # the probe's pass runs eager attention: the stream within rounding of the sdpa pass
        torch.testing.assert_close(layer.max_abs_hidden, h.abs().max())
        torch.testing.assert_close(layer.median_abs_hidden, h.abs().flatten().median())
    # the gain of the 6 sublayers' residual matrices, per token
    mixing = []
    with torch.no_grad():
        h = (model.tok_emb(idx) + model.pos_emb(torch.arange(9))).unsqueeze(-2).expand(2, 9, 2, 32)
        for blk in model.blocks:
            mixing.append(blk.attn_hc.width(h)[1].residual)
            h0, mix = blk.attn_hc.width(h)
            h = blk.attn_hc.depth(blk.attn(blk.attn_in_norm(h0)), h, mix)
            mixing.append(blk.mlp_hc.width(h)[1].residual)
            h0, mix = blk.mlp_hc.width(h)
            h = blk.mlp_hc.depth(blk.mlp(blk.mlp_in_norm(h0)), h, mix)
    expected = composite_gain(mixing)
    torch.testing.assert_close(result.mixing_gain.forward, expected.forward)
    assert result.mixing_gain.value.shape == (2, 9)
    assert _gpt(BlockConfig(dim=32)).probe(idx).mixing_gain is None


@pytest.mark.parametrize(
    ("options", "block", "match"),
    [
        ({}, lambda i: BlockConfig(placement="siamese" if i else "pre"), r"^block placement 'siamese' carries its"),
        ({}, lambda i: ngpt_block() if i else BlockConfig(), r"^block placement 'ngpt' carries its streams"),
        ({}, ngpt_block(), r"^positions does not go with placement 'ngpt'"),
        ({"positions": "rope", "final_norm": True}, ngpt_block(), r"^final_norm does not go with placement 'ngpt'"),
        ({"final_norm": False}, BlockConfig(placement="siamese"), r"^final_norm must not be False with placement"),
        (
            {},
            lambda i: BlockConfig(hyper_connections={"n_streams": 2 + i}),
            r"^block hyper_connections must give all layers one n_streams",
        ),
        ({"emb_scale": 0.0}, BlockConfig(), r"^emb_scale must be a finite number > 0"),
        ({"final_softcap": -1.0}, BlockConfig(), r"^final_softcap must be a finite number > 0"),
    ],
)
def test_bad_model_configs_name_the_key(options: dict, block, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GPTConfig(n_layers=2, block=block, **options)


def test_added_model_fields_stay_out_of_the_stored_form_at_their_defaults() -> None:
    assert not {"emb_scale", "final_softcap"} & set(GPTConfig().to_dict())
    cfg = GPTConfig(final_softcap=30.0)
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg and cfg.to_dict()["final_softcap"] == 30.0


def test_cross_entropy_reference_for_the_capped_head_counts_ignored_rows_out() -> None:
    """All targets ignored: NaN, as F.cross_entropy."""
    from lnblocks.models.capped_loss import capped_lm_head_loss

    h, w = torch.randn(6, 8), torch.randn(10, 8)
    t = torch.full((6,), -100)
    loss, _ = capped_lm_head_loss(h, w, t, 2.0)
    assert loss.isnan() and F.cross_entropy(softcap(h @ w.T, 2.0), t).isnan()


@pytest.mark.parametrize(
    ("block", "positions"),
    [
        (BlockConfig(dim=32, placement="siamese"), "learned"),
        (ngpt_block(dim=32), "rope"),
        (BlockConfig(dim=32, hyper_connections={"kind": "mhc", "n_streams": 2}), "learned"),
        (BlockConfig(dim=32, attention={"softcap": 2.0, "output_gate": "elementwise"}), "rope"),
    ],
    ids=["siamese", "ngpt", "mhc", "gate_softcap"],
)
def test_generation_with_the_kv_cache_equals_recompute(block: BlockConfig, positions: str) -> None:
    model = _gpt(block, positions=positions, final_softcap=5.0)
    idx = _ids(2, 5)
    cached = model.generate(idx, 6, temperature=0)
    assert torch.equal(cached, model.generate(idx, 6, temperature=0, use_cache=False))
