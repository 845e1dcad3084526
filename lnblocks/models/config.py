"""``GPTConfig``: a decoder-only LM built from one ``BlockConfig`` per layer, plus ``mix_ln`` (Li et al. 2024)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from lnblocks.blocks import PLACEMENTS, BlockConfig
from lnblocks.blocks.config import _check_bool, _check_choice, _check_int, _check_prob

Positions = Literal["learned", "rope", "none"]
InitScheme = Literal["gpt2", "xavier", "deepnet"]
QKVInit = Literal["per_matrix", "stacked"]
POSITIONS: tuple[str, ...] = get_args(Positions)
INIT_SCHEMES: tuple[str, ...] = get_args(InitScheme)
QKV_INITS: tuple[str, ...] = get_args(QKVInit)

BlockSpec = BlockConfig | dict | Sequence[BlockConfig | dict] | Callable[[int], BlockConfig | dict]


def _as_block(value: Any, where: str) -> BlockConfig:
    if isinstance(value, BlockConfig):
        return value
    if isinstance(value, dict):
        return BlockConfig.from_dict(value)
    raise TypeError(f"{where} must be a BlockConfig or a dict, got {type(value).__name__}")


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """A GPT: token embedding, positions, ``n_layers`` blocks, final norm by placement rule, LM head.

    ``block``: one ``BlockConfig`` for every layer, a sequence of ``n_layers`` of them, or a function of the 0-based
    layer index (per-depth mixes such as ``mix_ln``). After validation ``block`` holds one ``BlockConfig`` (all
    layers equal) or a tuple; ``layers`` always gives the tuple.
    ``positions``: ``"learned"`` (a ``max_seq_len`` table, GPT-2), ``"rope"`` (rotary, in every block; Llama) or
    ``"none"``. ``final_norm``: None follows the last block's placement rule (``PLACEMENTS[...].final_norm_rule``);
    True/False forces it. ``init``: ``"gpt2"``, ``"xavier"`` or ``"deepnet"`` (see ``lnblocks.models.init``);
    ``init_std``: GPT-2's 0.02; ``emb_init_std``: embedding std (None: ``init_std`` for gpt2, 1.0 otherwise).
    ``qkv_init`` (Xavier schemes): ``"per_matrix"`` Xavier for W_Q, W_K, W_V each (fan ``d + d``), or
    ``"stacked"`` Xavier over the stacked ``(3d, d)`` in-projection, as ``torch.nn.MultiheadAttention`` does.
    """

    vocab_size: int = 256
    max_seq_len: int = 256
    n_layers: int = 4
    block: BlockSpec = field(default_factory=BlockConfig)
    positions: Positions = "learned"
    rope_theta: float = 10000.0
    tie_weights: bool = False
    final_norm: bool | None = None
    init: InitScheme = "gpt2"
    init_std: float = 0.02
    emb_init_std: float | None = None
    emb_dropout: float = 0.0
    qkv_init: QKVInit = "per_matrix"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_seq_len", "n_layers"):
            _check_int(name, getattr(self, name))
        _check_choice("positions", self.positions, POSITIONS)
        _check_choice("init", self.init, INIT_SCHEMES)
        _check_choice("qkv_init", self.qkv_init, QKV_INITS)
        if self.qkv_init == "stacked" and self.init == "gpt2":
            raise ValueError("qkv_init='stacked' is a Xavier variant: it needs init='xavier' or 'deepnet'")
        _check_bool("tie_weights", self.tie_weights)
        if self.final_norm is not None:
            _check_bool("final_norm", self.final_norm)
        _check_prob("emb_dropout", self.emb_dropout)
        for name in ("rope_theta", "init_std", "emb_init_std"):
            value = getattr(self, name)
            if value is None and name == "emb_init_std":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite float > 0, got {value!r}")
        layers = self._resolve_layers()
        object.__setattr__(self, "block", layers[0] if all(b == layers[0] for b in layers) else layers)
        self._check_layers(layers)

    def _resolve_layers(self) -> tuple[BlockConfig, ...]:
        b = self.block
        if isinstance(b, (BlockConfig, dict)):
            return (_as_block(b, "block"),) * self.n_layers
        if callable(b):
            return tuple(_as_block(b(i), f"block({i})") for i in range(self.n_layers))
        if isinstance(b, Sequence) and not isinstance(b, str):
            if len(b) != self.n_layers:
                raise ValueError(f"block: got {len(b)} BlockConfigs for n_layers={self.n_layers}")
            return tuple(_as_block(x, f"block[{i}]") for i, x in enumerate(b))
        raise TypeError(f"block must be a BlockConfig, dict, sequence or function of the layer index, got {type(b)}")

    def _check_layers(self, layers: tuple[BlockConfig, ...]) -> None:
        dims = sorted({b.dim for b in layers})
        if len(dims) > 1:
            raise ValueError(f"every layer must have the same dim; got dims {dims}")
        if self.positions == "rope":
            head_dims = sorted({b.head_dim for b in layers})
            if len(head_dims) > 1 or head_dims[0] % 2:
                raise ValueError(f"positions='rope' needs one even head_dim for all layers; got {head_dims}")
        placements = [b.placement for b in layers]
        if "resi_dual" in placements and set(placements) != {"resi_dual"}:
            raise ValueError(
                f"placement 'resi_dual' carries a second stream through every layer; it cannot be mixed with "
                f"{sorted(set(placements) - {'resi_dual'})}"
            )
        if placements[-1] == "resi_dual" and self.final_norm is False:
            raise ValueError("placement 'resi_dual' outputs x_N + norm(y_N): final_norm=False is not allowed")
        if "deepnorm" in placements and self.init != "deepnet":
            raise ValueError(
                f"placement 'deepnorm' is DeepNet's residual scale alpha together with its init gain beta "
                f"(Wang et al. 2022): set init='deepnet' (got init={self.init!r})"
            )

    @property
    def layers(self) -> tuple[BlockConfig, ...]:
        """One ``BlockConfig`` per layer."""
        return self.block if isinstance(self.block, tuple) else (self.block,) * self.n_layers

    @property
    def dim(self) -> int:
        return self.layers[0].dim

    @property
    def uses_final_norm(self) -> bool:
        """Whether the model applies a final norm: ``final_norm`` or the last block's placement rule."""
        return self.final_norm if self.final_norm is not None else PLACEMENTS[self.layers[-1].placement].final_norm

    @classmethod
    def from_dict(cls, options: dict[str, Any]) -> GPTConfig:
        """Build from a plain dict (``block`` a dict or a list of dicts); unknown keys raise ``ValueError``."""
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - valid)
        if unknown:
            raise ValueError(f"unknown GPTConfig option(s) {unknown}; valid options: {sorted(valid)}")
        return cls(**options)

    def replace(self, **changes: Any) -> GPTConfig:
        """A copy with ``changes`` applied (validated again); unknown fields raise ``ValueError``."""
        current = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return GPTConfig.from_dict({**current, **changes})

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        b = self.block
        out["block"] = [x.to_dict() for x in b] if isinstance(b, tuple) else b.to_dict()
        return out


def mix_ln(block: BlockConfig, n_layers: int, post_fraction: float = 0.25) -> tuple[BlockConfig, ...]:
    """Mix-LN (Li et al. 2024): Post-LN in the first ``floor(post_fraction * n_layers)`` layers, Pre-LN after.

    The paper's scripts use ``post_fraction=0.25`` (3 of 12, 6 of 24 layers). Pass the result as ``GPTConfig.block``.
    """
    _check_int("n_layers", n_layers)
    if not 0.0 <= post_fraction <= 1.0:
        raise ValueError(f"post_fraction must be in [0, 1], got {post_fraction!r}")
    n_post = math.floor(post_fraction * n_layers)
    return tuple(block.replace(placement="post" if i < n_post else "pre") for i in range(n_layers))
