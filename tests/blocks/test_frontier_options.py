"""The 2025-26 block options against direct fp64 transcriptions of their papers' formulas (in
``tests/blocks/reference.py``): V-norm and HybridNorm (arXiv 2503.04598), the gated attention output (2505.06708),
attention soft-capping (Gemma 2, 2408.00118), nGPT's block (2410.01131), SiameseNorm (2602.08064), hyper-connections
(2409.19606) and mHC (2512.24880), with mHC also against DeepSeek-V4's module in ``transformers``."""

from __future__ import annotations

import math

import pytest
import torch

from lnblocks import Block, BlockConfig
from lnblocks.blocks import Stream, composite_gain, rope_cache, sinkhorn_knopp
from lnblocks.models import hybridnorm
from tests.blocks import reference as ref
from tests.blocks.block_helpers import randomize_

RMS = {"kind": "rmsnorm", "eps": 1e-6}
NGPT = {"attention": {"qkv_bias": False, "out_bias": False}, "mlp": {"activation": "swiglu", "bias": False}}
TOL = {"rtol": 1e-12, "atol": 1e-12}


def _block(cfg: BlockConfig | dict, layer_idx: int = 1, n_layers: int = 4) -> Block:
    torch.manual_seed(0)
    return randomize_(Block(cfg, layer_idx, n_layers)).double().eval()


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64)


@pytest.mark.parametrize("gate", [None, "headwise", "elementwise"])
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_attention_options_equal_the_transcription(gate: str | None, softcap: float | None) -> None:
    """QKV-norm per head (HybridNorm), the output gate ``Y * sigmoid(X W_theta)`` at position G1 (gated attention)
    and the logit cap ``c tanh(s / c)`` before the mask (Gemma 2), alone and together."""
    att = {"n_heads": 4, "output_gate": gate, "softcap": softcap}
    blk = _block(BlockConfig(dim=32, qk_norm=RMS, v_norm=RMS, attention=att))
    x = _x(2, 9, 32)
    with torch.no_grad():
        torch.testing.assert_close(blk.attn(x), ref.attention(blk.attn, x), **TOL)
    assert blk.attn.last_backend == ("eager" if softcap else "sdpa")  # sdpa cannot cap: the eager path runs


def test_softcap_bounds_the_recorded_logits_and_first_token_mass_is_the_sink() -> None:
    blk = _block(BlockConfig(dim=32, attention={"n_heads": 4, "softcap": 0.5, "backend": "eager"}))
    x = _x(3, 8, 32) * 10
    with torch.no_grad():
        blk.attn(x)
    stats = blk.attn.last_stats
    assert stats.max_logit.max() <= 0.5
    # the probability on key 0, averaged over batch and queries 1.. (query 0 sees key 0 alone)
    wq, wk, _ = blk.attn.split_qkv(blk.attn.qkv.weight)
    bq, bk, _ = blk.attn.split_qkv(blk.attn.qkv.bias)
    q = (x @ wq.T + bq).view(3, 8, 4, 8).transpose(1, 2)
    k = (x @ wk.T + bk).view(3, 8, 4, 8).transpose(1, 2)
    s = 0.5 * torch.tanh(q @ k.transpose(-1, -2) / 8**0.5 / 0.5)
    p = torch.softmax(s.masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), float("-inf")), -1)
    torch.testing.assert_close(stats.first_token_mass, p[:, :, 1:, 0].mean(dim=(0, 2)).float())


@pytest.mark.parametrize("star", [False, True])
def test_hybridnorm_blocks_equal_the_transcription(star: bool) -> None:
    """HybridNorm: ``Y = X + MHA(QKV-Norm(X))``, ``X' = FFN(Norm(Y)) + Norm(Y)``; HybridNorm*'s first block is
    Pre-Norm in both sublayers."""
    layers = hybridnorm(BlockConfig(dim=32, norm=RMS), 3, star=star)
    assert all(b.v_norm == b.qk_norm == BlockConfig(norm=RMS).norm for b in layers)
    blocks = [_block(b, i, 3) for i, b in enumerate(layers)]
    x = _x(2, 7, 32)
    with torch.no_grad():
        out, expected = x, x
        for i, blk in enumerate(blocks):
            out = blk(out)
            if star and i == 0:
                y = expected + ref.attention(blk.attn, ref.norm_of(blk.attn_in_norm)(expected))
                expected = y + ref.mlp(blk.mlp, ref.norm_of(blk.mlp_in_norm)(y))
            else:
                assert blk.attn_in_norm is None
                y = expected + ref.attention(blk.attn, expected)
                u = ref.norm_of(blk.mlp_in_norm)(y)
                expected = ref.mlp(blk.mlp, u) + u
    torch.testing.assert_close(out, expected, **TOL)


def test_siamese_block_equals_the_transcription() -> None:
    """SiameseNorm's sublayer: ``x^ = N_x(x)``, ``z = F(N_in(x^ + N_y(y)))``, ``x <- x^ + z / sqrt(2 l)``,
    ``y <- y + z`` (l = layer_idx + 1), both sublayers sharing the block's weights across the two streams."""
    blk = _block(BlockConfig(dim=32, placement="siamese", norm="layernorm"), layer_idx=2)
    x, y = _x(2, 7, 32), _x(2, 7, 32)
    with torch.no_grad():
        s = blk(Stream(x, None, y))
        for n_x, n_y, n_in, f in (
            (blk.attn_post_norm, blk.attn_dual_norm, blk.attn_in_norm, lambda u: ref.attention(blk.attn, u)),
            (blk.mlp_post_norm, blk.mlp_dual_norm, blk.mlp_in_norm, lambda u: ref.mlp(blk.mlp, u)),
        ):
            x_hat = ref.norm_of(n_x)(x)
            z = f(ref.norm_of(n_in)(x_hat + ref.norm_of(n_y)(y)))
            x, y = x_hat + z / math.sqrt(6), y + z
    torch.testing.assert_close(s.value(), x, **TOL)
    torch.testing.assert_close(s.dual, y, **TOL)


def test_ngpt_block_equals_the_transcription() -> None:
    """nGPT: ``h <- Norm(h + alpha_A (Norm(ATTN(h)) - h))`` (Eq. 10), the same with the MLP (Eq. 11); q, k unit-norm
    after RoPE times s_qk (Eq. 15-16) with softmax scale sqrt(d_k); u s_u, v s_v sqrt(d) (Eq. 20-21); each scale
    ``stored * (init / scale)`` (Sec. 2.5)."""
    blk = _block(BlockConfig(dim=32, placement="ngpt", **NGPT))
    alpha_a = blk.alpha_attn.weight * (0.05 * math.sqrt(32))
    alpha_m = blk.alpha_mlp.weight * (0.05 * math.sqrt(32))
    h = ref.l2(_x(2, 7, 32))
    rope = rope_cache(8, torch.arange(7), dtype=torch.float64)
    with torch.no_grad():
        out = blk(h, rope)
        h = ref.l2(h + alpha_a * (ref.l2(ref.attention(blk.attn, h, rope=rope)) - h))
        h = ref.l2(h + alpha_m * (ref.l2(ref.mlp(blk.mlp, h)) - h))
    torch.testing.assert_close(out, h, **TOL)
    torch.testing.assert_close(out.norm(dim=-1), torch.ones(2, 7, dtype=torch.float64), **TOL)


def _hc_reference(blk: Block, streams: torch.Tensor) -> torch.Tensor:
    """Hyper-connections around Pre-LN sublayers (arXiv 2409.19606, Appendix J Algorithm 2): ``A = s_a tanh(norm(H)
    W_a) + [A_m | A_r]``, ``B = s_b tanh(norm(H) W_b) + B`` (dynamic; static: the constants),
    ``h0 = sum_n A_m[n] H_n``, ``H'_m = sum_n A_r[n, m] H_n + B_m f(h0)``."""
    H = streams
    for hc, n_in, f in (
        (blk.attn_hc, blk.attn_in_norm, lambda u: ref.attention(blk.attn, u)),
        (blk.mlp_hc, blk.mlp_in_norm, lambda u: ref.mlp(blk.mlp, u)),
    ):
        a, b = hc.static_alpha, hc.static_beta
        if hc.config.kind == "dynamic":
            hn = ref.norm_of(hc.norm)(H)
            a = hc.alpha_scale * torch.tanh(torch.einsum("btnc,ck->btnk", hn, hc.dynamic_alpha)) + a
            b = hc.beta_scale * torch.tanh(torch.einsum("btnc,c->btn", hn, hc.dynamic_beta)) + b
        a_m, a_r = a[..., 0], a[..., 1:]
        out = f(ref.norm_of(n_in)(torch.einsum("...n,...nc->...c", a_m, H)))
        H = torch.einsum("...nm,...nc->...mc", a_r, H) + b[..., :, None] * out[..., None, :]
    return H


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_hyper_connections_equal_the_transcription(kind: str) -> None:
    blk = _block(BlockConfig(dim=32, norm=RMS, hyper_connections={"n_streams": 3, "kind": kind}))
    streams = _x(2, 5, 3, 32)
    with torch.no_grad():
        torch.testing.assert_close(blk(streams), _hc_reference(blk, streams), **TOL)


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_hyper_connections_start_as_pre_ln(kind: str) -> None:
    """At init (``A_m = e_{k mod n}``, ``A_r = I``, ``B = 1``, ``W = 0``) n equal streams each follow Pre-LN."""
    torch.manual_seed(0)
    hc = Block(BlockConfig(dim=32, hyper_connections={"n_streams": 2, "kind": kind}), 1, 4).double()
    pre = Block(BlockConfig(dim=32), 1, 4).double()
    pre.load_state_dict({k: v for k, v in hc.state_dict().items() if "_hc." not in k})
    x = _x(2, 5, 32)
    with torch.no_grad():
        out = hc(x.unsqueeze(-2).expand(2, 5, 2, 32))
        torch.testing.assert_close(out, pre(x).unsqueeze(-2).expand(2, 5, 2, 32), **TOL)


def _sinkhorn_reference(r: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """mHC's Sinkhorn-Knopp from ``exp(r)``: rows, then columns normalised in turn (the eps guards of DeepSeek-V4)."""
    m = torch.exp(r - r.amax(-1, keepdim=True))
    m = m / m.sum(-1, keepdim=True) + eps
    m = m / (m.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        m = m / (m.sum(-1, keepdim=True) + eps)
        m = m / (m.sum(-2, keepdim=True) + eps)
    return m


def test_mhc_equals_the_transcription() -> None:
    """mHC: x~ = RMSNorm(vec(H)); H_pre = sigmoid(a_pre x~ phi_pre + b_pre), H_post = 2 sigmoid(a_post x~ phi_post +
    b_post), H_res = SK(a_res mat(x~ phi_res) + b_res); ``H' = H_res H + H_post^T f(H_pre H)``."""
    blk = _block(BlockConfig(dim=16, norm=RMS, attention={"n_heads": 2}, hyper_connections={"kind": "mhc"}))
    H = _x(2, 3, 4, 16)
    with torch.no_grad():
        out = blk(H)
        for hc, n_in, f in (
            (blk.attn_hc, blk.attn_in_norm, lambda u: ref.attention(blk.attn, u)),
            (blk.mlp_hc, blk.mlp_in_norm, lambda u: ref.mlp(blk.mlp, u)),
        ):
            flat = H.flatten(-2)
            flat = flat / torch.sqrt((flat**2).mean(-1, keepdim=True) + 1e-6)
            pre, post, res = (flat @ hc.phi.T).split([4, 4, 16], -1)
            b_pre, b_post, b_res = hc.bias.split([4, 4, 16])
            h_pre = torch.sigmoid(hc.scale[0] * pre + b_pre) + 1e-6
            h_post = 2 * torch.sigmoid(hc.scale[1] * post + b_post)
            h_res = _sinkhorn_reference((hc.scale[2] * res + b_res).unflatten(-1, (4, 4)), 20, 1e-6).transpose(-1, -2)
            y = f(ref.norm_of(n_in)(torch.einsum("...n,...nc->...c", h_pre, H)))
            H = h_res @ H + h_post[..., :, None] * y[..., None, :]
    torch.testing.assert_close(out, H, **TOL)


def test_mhc_mapping_equals_deepseek_v4_in_transformers() -> None:
    """The same weights in ``DeepseekV4HyperConnection``: the collapsed input, post and comb (= H_res^T)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection

    blk = Block(BlockConfig(dim=16, attention={"n_heads": 2}, hyper_connections={"kind": "mhc", "n_streams": 3}))
    hc = blk.attn_hc
    with torch.no_grad():
        hc.bias.normal_()
        hc.scale.uniform_(0.5, 2.0)
    cfg = transformers.DeepseekV4Config(hidden_size=16, hc_mult=3, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6)
    theirs = DeepseekV4HyperConnection(cfg)
    theirs.load_state_dict({"fn": hc.phi.detach(), "base": hc.bias.detach(), "scale": hc.scale.detach()})
    H = torch.randn(2, 5, 3, 16)
    with torch.no_grad():
        h0, mix = hc.width(H)
        post, comb, collapsed = theirs(H)
    torch.testing.assert_close(h0, collapsed, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(mix.post, post, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(mix.residual, comb.transpose(-1, -2), rtol=1e-6, atol=1e-6)


def test_sinkhorn_gives_doubly_stochastic_matrices() -> None:
    r = _x(50, 4, 4)
    m = sinkhorn_knopp(r, iters=20, eps=0.0)
    torch.testing.assert_close(m, _sinkhorn_reference(r, 20, 0.0), **TOL)
    assert (m >= 0).all()
    torch.testing.assert_close(m.sum(-2), torch.ones(50, 4, dtype=torch.float64), **TOL)  # the last pass: columns
    torch.testing.assert_close(m.sum(-1), torch.ones(50, 4, dtype=torch.float64), rtol=0, atol=1e-3)
    assert composite_gain([m[i] for i in range(50)]).value.item() == pytest.approx(1.0, abs=1e-2)


def test_composite_gain_is_the_largest_row_and_column_sum_of_the_product() -> None:
    m1 = torch.tensor([[2.0, 0.0], [0.0, -1.0]])
    m2 = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    gain = composite_gain([m1, m2])  # P = m2 @ m1 = [[2, -1], [0, -1]]
    assert gain.forward.item() == 3.0 and gain.backward.item() == 2.0 and gain.value.item() == 3.0
    per_token = composite_gain([torch.stack([m1, m2]), torch.stack([m2, m1])])  # leading dims broadcast
    assert per_token.forward.tolist() == [3.0, 4.0]  # the second token: m1 @ m2 = [[2, 2], [0, -1]]
    with pytest.raises(ValueError, match=r"mixing\[1\] must be a square"):
        composite_gain([m1, torch.ones(2, 3)])
    with pytest.raises(ValueError, match="at least one"):
        composite_gain([])


def test_hyper_block_records_its_mixing_only_when_asked() -> None:
    blk = Block(BlockConfig(dim=16, attention={"n_heads": 2}, hyper_connections={"kind": "dynamic", "n_streams": 2}))
    H = torch.randn(1, 3, 2, 16)
    blk(H)
    assert blk.attn_hc.last_mixing is None
    blk.attn_hc.record = True
    blk(H)
    assert blk.attn_hc.last_mixing.shape == (1, 3, 2, 2)
    with pytest.raises(ValueError, match=r"shape \(B, T, n_streams=2, C\)"):
        blk(torch.randn(1, 3, 16))
