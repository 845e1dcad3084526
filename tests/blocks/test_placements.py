"""Every placement against its hand-written formula, for one block, bit for bit in fp32.

The block's own submodules (attention, MLP, norms, each called plainly) are the f's; what is checked is the wiring:
which norm sits where, the fused residual adds, DeepNorm's alpha, LayerNorm Scaling, ReZero gates, ResiDual's
second stream. The fused path (``norm(b, residual=x)``) must give the same bits as ``norm(x + b)``.
"""

from __future__ import annotations

import pytest
import torch

from lnblocks import Block, BlockConfig
from lnblocks.blocks import PLACEMENTS, Stream, l2_normalize
from tests.blocks.block_helpers import randomize_

N_LAYERS = 6
# nGPT's block (Loshchilov et al. 2024): no biases, a SwiGLU MLP
NGPT = {"attention": {"qkv_bias": False, "out_bias": False}, "mlp": {"activation": "swiglu", "bias": False}}


def pre(b, x):
    h = x + b.attn(b.attn_in_norm(x))
    return h + b.mlp(b.mlp_in_norm(h))


def post(b, x):
    h = b.attn_post_norm(x + b.attn(x))
    return b.mlp_post_norm(h + b.mlp(h))


def sandwich(b, x):
    h = x + b.attn_out_norm(b.attn(b.attn_in_norm(x)))
    return h + b.mlp_out_norm(b.mlp(b.mlp_in_norm(h)))


def reordered(b, x):
    h = x + b.attn_out_norm(b.attn(x))
    return h + b.mlp_out_norm(b.mlp(h))


def deepnorm(b, x):
    alpha = (2 * N_LAYERS) ** 0.25  # Wang et al. 2022, decoder-only
    h = b.attn_post_norm(alpha * x + b.attn(x))
    return b.mlp_post_norm(alpha * h + b.mlp(h))


def parallel(b, x):
    return x + (b.attn(b.attn_in_norm(x)) + b.mlp(b.mlp_in_norm(x)))


def parallel_shared(b, x):
    u = b.attn_in_norm(x)
    return x + (b.attn(u) + b.mlp(u))


def none(b, x):
    h = x + b.attn(x)
    return h + b.mlp(h)


def normed_residual(b, x):
    u = b.attn_in_norm(x)
    h = u + b.attn(u)
    u = b.mlp_in_norm(h)
    return u + b.mlp(u)


def siamese(b, x):  # y starts at the input; the value is the Post-like stream x
    y, c = x, (2 * (b.layer_idx + 1)) ** 0.5
    for post, dual, inn, f in ((b.attn_post_norm, b.attn_dual_norm, b.attn_in_norm, b.attn),
                               (b.mlp_post_norm, b.mlp_dual_norm, b.mlp_in_norm, b.mlp)):  # fmt: skip
        x_hat = post(x)
        z = f(inn(x_hat + dual(y)))
        x, y = x_hat + z / c, y + z
    return x


def ngpt(b, x):
    for f, alpha in ((b.attn, b.alpha_attn), (b.mlp, b.alpha_mlp)):
        x = l2_normalize(x + alpha() * (l2_normalize(f(x)) - x))
    return x


FORMULAS = {
    "pre": ({}, pre),
    "post": ({}, post),
    "sandwich": ({}, sandwich),
    "reordered": ({}, reordered),
    "deepnorm": ({}, deepnorm),
    "resi_dual": ({}, post),  # its post-norm stream is a Post-LN block; the dual stream is tested below
    "parallel": ({}, parallel),
    "parallel_shared": ({"shared_norm": True}, parallel_shared),
    "none": ({}, none),
    "normed_residual": ({}, normed_residual),
    "siamese": ({}, siamese),
    "ngpt": (NGPT, ngpt),
}
OPTIONS = {"ngpt": NGPT}


def _block(placement: str, norm: str, layer_idx: int = 2, **options) -> Block:
    torch.manual_seed(0)
    attention = {"n_heads": 4, **options.pop("attention", {})}
    cfg = BlockConfig(dim=32, placement=placement, norm=norm, attention=attention, **options)
    return randomize_(Block(cfg, layer_idx=layer_idx, n_layers=N_LAYERS)).eval()


def test_every_placement_has_a_formula() -> None:
    assert {k.replace("_shared", "") for k in FORMULAS} == set(PLACEMENTS)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm", "dyt"])
@pytest.mark.parametrize("name", list(FORMULAS))
def test_block_equals_formula(name: str, norm: str) -> None:
    options, formula = FORMULAS[name]
    blk = _block(name.replace("_shared", ""), norm, **options)
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        expected = formula(blk, x)
        out = blk(x)
        deferred = blk(Stream(x)).value()
    assert torch.equal(out, expected)
    assert torch.equal(deferred, expected)


def test_depth_scaled_norm_scales_input_norms_by_inverse_sqrt_layer() -> None:
    """LayerNorm Scaling (Sun et al. 2025): layer index 3 (0-based) -> l = 4 -> scale 1/2."""
    blk = _block("pre", "layernorm", layer_idx=3, depth_scaled_norm=True)
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        h = x + blk.attn(blk.attn_in_norm(x) * 0.5)
        expected = h + blk.mlp(blk.mlp_in_norm(h) * 0.5)
        assert torch.equal(blk(x), expected)


def test_rezero_gates_scale_branches() -> None:
    blk = _block("none", "layernorm", rezero=True)
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        h = x + blk.attn_gate * blk.attn(x)
        expected = h + blk.mlp_gate * blk.mlp(h)
        assert torch.equal(blk(x), expected)
        blk.attn_gate.zero_()
        blk.mlp_gate.zero_()
        assert torch.equal(blk(x), x)  # ReZero at init: identity


def test_resi_dual_dual_stream_accumulates_branch_outputs() -> None:
    """ResiDual (Xie et al. 2023): y starts at the block input (microsoft/ResiDual) and adds every f(x)."""
    blk = _block("resi_dual", "layernorm")
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        a = blk.attn(x)
        h = blk.attn_post_norm(x + a)
        m = blk.mlp(h)
        s = blk(Stream(x))
        assert torch.equal(s.hidden, blk.mlp_post_norm(h + m))
        assert torch.equal(s.dual, x + a + m)


@pytest.mark.parametrize("placement", [k for k, p in PLACEMENTS.items() if not p.siamese])
def test_chained_streams_equal_chained_tensors(placement: str) -> None:
    """Three blocks passing a Stream (adds pending, fused into the next norm) equal three plain calls (not
    SiameseNorm's: its Post-like stream depends on the Pre-like one, which a plain call restarts)."""
    torch.manual_seed(1)
    cfg = BlockConfig(dim=32, placement=placement, **OPTIONS.get(placement, {}))
    blocks = [randomize_(Block(cfg, i, 3)).eval() for i in range(3)]
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        plain, s = x, Stream(x)
        for blk in blocks:
            plain, s = blk(plain), blk(s)
    assert torch.equal(s.value(), plain)


def test_residual_in_fp32_keeps_the_stream_in_fp32() -> None:
    cfg = BlockConfig(dim=32, norm={"kind": "rmsnorm", "residual_in_fp32": True})
    blocks = [Block(cfg, i, 2).to(torch.bfloat16) for i in range(2)]
    x = torch.randn(2, 5, 32).bfloat16()
    s = Stream(x)
    for blk in blocks:
        s = blk(s)
    assert s.hidden.dtype == torch.bfloat16 and s.residual.dtype == torch.float32
    # the same math with every add done in fp32 by hand
    r = x.float()
    for blk in blocks:
        r = r + blk.attn(blk.attn_in_norm(r).bfloat16()).float()
        r = r + blk.mlp(blk.mlp_in_norm(r).bfloat16()).float()
    torch.testing.assert_close(s.value(), r, rtol=0, atol=0)


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_gradient_reaches_every_block_parameter(placement: str) -> None:
    options = {"rezero": True} if placement == "none" else OPTIONS.get(placement, {})
    attention = {"n_heads": 2, **options.get("attention", {})}
    cfg = BlockConfig(dim=16, placement=placement, **{**options, "attention": attention})
    blk = randomize_(Block(cfg))
    x = torch.randn(2, 5, 16, requires_grad=True)
    blk(x).square().sum().backward()
    for name, p in blk.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert x.grad.abs().sum() > 0


def test_deepnorm_alpha_override_and_final_norm_rules() -> None:
    blk = Block(BlockConfig(placement="deepnorm", deepnorm_alpha=3.0), 0, 4)
    assert blk.alpha == 3.0
    assert Block(BlockConfig(placement="deepnorm"), 0, 4).alpha == pytest.approx(8**0.25)
    assert {k for k, p in PLACEMENTS.items() if p.final_norm} == {
        "pre",
        "sandwich",
        "reordered",
        "resi_dual",
        "parallel",
        "normed_residual",
        "siamese",
    }
    assert all(p.final_norm_rule and p.formula and p.source for p in PLACEMENTS.values())


def test_siamese_block_carries_both_streams() -> None:
    """SiameseNorm (Li et al. 2026), each sublayer as its authors' code: x^ = norm_x(x), z = f(norm_in(x^ +
    norm_y(y))), x <- x^ + z / sqrt(2 l), y <- y + z; a Stream carries y (its ``dual``) to the next block."""
    blk = _block("siamese", "layernorm", layer_idx=3)
    x, y = torch.randn(2, 7, 32), torch.randn(2, 7, 32)
    with torch.no_grad():
        s = blk(Stream(x, None, y))
        for post, dual, inn, f in ((blk.attn_post_norm, blk.attn_dual_norm, blk.attn_in_norm, blk.attn),
                                   (blk.mlp_post_norm, blk.mlp_dual_norm, blk.mlp_in_norm, blk.mlp)):  # fmt: skip
            x_hat = post(x)
            z = f(inn(x_hat + dual(y)))
            x, y = x_hat + z / 8**0.5, y + z
    assert torch.equal(s.value(), x) and torch.equal(s.dual, y)


@pytest.mark.parametrize(("attn_p", "mlp_p"), [("post", "pre"), ("pre", "post"), ("none", "normed_residual")])
def test_per_sublayer_placement_follows_each_sublayers_row(attn_p: str, mlp_p: str) -> None:
    blk = _block(attn_p, "rmsnorm", mlp_placement=mlp_p)
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        sub = {"pre": lambda f, n_in, n_post, x: x + f(n_in(x)), "post": lambda f, n_in, n_post, x: n_post(x + f(x)),
               "none": lambda f, n_in, n_post, x: x + f(x),
               "normed_residual": lambda f, n_in, n_post, x: n_in(x) + f(n_in(x))}  # fmt: skip
        h = sub[attn_p](blk.attn, blk.attn_in_norm, blk.attn_post_norm, x)
        expected = sub[mlp_p](blk.mlp, blk.mlp_in_norm, blk.mlp_post_norm, h)
        assert torch.equal(blk(x), expected) and torch.equal(blk(Stream(x)).value(), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["sandwich", "reordered"])
def test_output_norms_add_with_norm_then_add_bit_for_bit(name: str, dtype: torch.dtype) -> None:
    """``x + norm_out(b)`` runs as one ``norm_then_add`` call per sublayer, with the formula's bits: values and the
    gradients of the input and every parameter (chained through three blocks: the next block's norms meet it)."""
    torch.manual_seed(3)
    cfg = BlockConfig(dim=32, placement=name, norm="rmsnorm", attention={"n_heads": 4})
    blocks = [randomize_(Block(cfg, i, 3)).to(dtype) for i in range(3)]
    calls: list[int] = []
    for blk in blocks:
        for norm in (blk.attn_out_norm, blk.mlp_out_norm):
            method = norm.norm_then_add
            norm.norm_then_add = lambda *a, _m=method, **k: (calls.append(1), _m(*a, **k))[1]
    formula = FORMULAS[name][1]
    x = torch.randn(2, 5, 32, dtype=dtype)
    results = []
    for run in ("block", "formula"):
        xs = x.clone().requires_grad_()
        s, h = Stream(xs), xs
        for blk in blocks:
            if run == "block":
                s = blk(s)
            else:
                h = formula(blk, h)
        out = s.value() if run == "block" else h
        params = [p for blk in blocks for p in blk.parameters()]
        results.append([out, *torch.autograd.grad(out.float().square().sum(), [xs, *params])])
    assert len(calls) == 2 * len(blocks)  # each output norm's add ran as norm_then_add (the formula calls norm(b))
    for a, b in zip(*results, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
