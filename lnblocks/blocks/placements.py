"""Where the norms go in a residual block: one table, read by ``Block`` and ``GPT``.

Each placement is data: which norms a sublayer (attention or MLP) has, whether both sublayers read the same input,
whether a second residual stream is kept, and whether a model built from it ends with a final norm. ``Block`` has
one forward pass that follows these flags, so a new placement is one row here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """One row of ``PLACEMENTS``.

    ``in_norm``: norm on the branch input, ``f(norm(x))``. ``out_norm``: norm on the branch output before the add,
    ``x + norm(f(.))``. ``post_norm``: norm after the add, ``norm(x + f(.))``. ``parallel``: attention and MLP read
    the same stream and their outputs are summed. ``dual``: ResiDual's second, un-normalised stream.
    ``final_norm``: a model whose last block has this placement applies a final norm (the rule, stated per row).
    ``residual_after_norm``: the stream itself is replaced by its input norm before the add, ``u + f(u)`` with
    ``u = norm(x)``. ``siamese``: SiameseNorm's two streams sharing the block's weights. ``normalized``: nGPT's
    hypersphere update (no norm modules; unit-norm hidden states and weights). ``sublayer``: the row can be the
    placement of one sublayer (``BlockConfig.mlp_placement``) and carry hyper-connections: one stream, no
    block-level constant.
    """

    name: str
    formula: str
    source: str
    final_norm_rule: str
    in_norm: bool = False
    out_norm: bool = False
    post_norm: bool = False
    parallel: bool = False
    dual: bool = False
    final_norm: bool = False
    residual_after_norm: bool = False
    siamese: bool = False
    normalized: bool = False
    sublayer: bool = False


PLACEMENTS: dict[str, Placement] = {
    p.name: p
    for p in (
        Placement(
            "pre",
            "x + f(norm(x))",
            "GPT-2 (Radford et al. 2019), Llama; analysed by Xiong et al. 2020",
            "final norm: the stream is never normalised, so the model normalises it once before the head",
            in_norm=True,
            final_norm=True,
            sublayer=True,
        ),
        Placement(
            "post",
            "norm(x + f(x))",
            "original Transformer (Vaswani et al. 2017), BERT",
            "no final norm: every block already ends with a norm",
            post_norm=True,
            sublayer=True,
        ),
        Placement(
            "sandwich",
            "x + norm_out(f(norm_in(x)))",
            "CogView (Ding et al. 2021), Gemma 2, Peri-LN (Kim et al. 2025)",
            "final norm, as for pre: the stream itself is not normalised",
            in_norm=True,
            out_norm=True,
            final_norm=True,
            sublayer=True,
        ),
        Placement(
            "reordered",
            "x + norm(f(x))",
            "OLMo 2 (OLMo et al. 2025): no input norm",
            "final norm (OLMo 2's model.norm)",
            out_norm=True,
            final_norm=True,
            sublayer=True,
        ),
        Placement(
            "deepnorm",
            "norm(alpha * x + f(x))",
            "DeepNet (Wang et al. 2022): alpha = (2N)^(1/4), init gain beta = (8N)^(-1/4) for a decoder of N layers",
            "no final norm: every block already ends with a norm",
            post_norm=True,
        ),
        Placement(
            "resi_dual",
            "x <- norm(x + f(x)); y <- y + f(x); output x_N + norm(y_N)",
            "ResiDual (Xie et al. 2023; microsoft/ResiDual: y starts at the embedding)",
            "final norm on the dual stream y, added to the post-norm stream x",
            post_norm=True,
            dual=True,
            final_norm=True,
        ),
        Placement(
            "parallel",
            "x + (attn(norm(x)) + mlp(norm'(x)))",
            "GPT-J, GPT-NeoX (separate norms), Falcon-7B / Phi (shared_norm=True)",
            "final norm, as for pre",
            in_norm=True,
            parallel=True,
            final_norm=True,
        ),
        Placement(
            "none",
            "x + f(x)",
            "norm-free stacks: ReZero (Bachlechner et al. 2020, with rezero=True), DyT-style ablations",
            "no final norm (set GPTConfig.final_norm=True to add one)",
            sublayer=True,
        ),
        Placement(
            "normed_residual",
            "u = norm(x); u + f(u)",
            "HybridNorm's FFN sublayer (Zhuo et al. 2025, arXiv 2503.04598: FFN(Norm(Y)) + Norm(Y); its code's "
            "ffn_residual_after_norm)",
            "final norm: the stream after the add is not normalised",
            in_norm=True,
            final_norm=True,
            residual_after_norm=True,
            sublayer=True,
        ),
        Placement(
            "siamese",
            "x^ = norm_x(x); z = f(norm_in(x^ + norm_y(y))); x <- x^ + z / sqrt(2(l+1)); y <- y + z; "
            "output norm_f(norm_x'(x_N) + norm_y'(y_N))",
            "SiameseNorm (Li et al. 2026, arXiv 2602.08064; Qwen-Applications/SiameseNorm: both streams start at "
            "the embedding)",
            "final norm over the two normalised streams' sum",
            in_norm=True,
            post_norm=True,
            siamese=True,
            final_norm=True,
        ),
        Placement(
            "ngpt",
            "h <- Norm(h + alpha * (Norm(f(h)) - h)), Norm(v) = v / ||v||",
            "nGPT (Loshchilov et al. 2024, arXiv 2410.01131): unit-norm hidden states and weight vectors",
            "no final norm: the hidden state is unit-norm; the logits are scaled by s_z",
            normalized=True,
        ),
    )
}


def deepnorm_alpha(n_layers: int) -> float:
    """DeepNet's residual scale for a decoder-only stack of ``n_layers`` blocks: ``(2N)^(1/4)`` (Wang et al. 2022)."""
    return (2.0 * n_layers) ** 0.25


def deepnorm_beta(n_layers: int) -> float:
    """DeepNet's init gain for v, out, fc1, fc2 of a decoder-only stack: ``(8N)^(-1/4)`` (Wang et al. 2022)."""
    return (8.0 * n_layers) ** -0.25


def depth_scale(layer_idx: int) -> float:
    """LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth"): ``1/sqrt(l)`` with ``l = layer_idx + 1``."""
    return 1.0 / math.sqrt(layer_idx + 1)


def siamese_divisor(layer_idx: int) -> float:
    """SiameseNorm's Post-like stream takes each branch output divided by ``sqrt(2 l)``, ``l = layer_idx + 1`` (both
    sublayers of a block; the authors' code, Qwen-Applications/SiameseNorm, in its LM, ViT and DiT models)."""
    return math.sqrt(2.0 * (layer_idx + 1))
