"""``GPT``: a decoder-only language model built from ``Block``s (nanoGPT-sized, any placement, HF interop).

Parameter names are stable and per layer: ``tok_emb``, ``pos_emb`` (learned positions only), ``emb_norm`` (if set),
``blocks.{i}.attn.qkv`` / ``.attn.proj`` (attention in/out), ``blocks.{i}.mlp.fc1`` / ``.mlp.fc2`` (MLP in/out),
``blocks.{i}.{attn,mlp}_{in,out,post}_norm`` (the norms the placement has), ``final_norm``, ``lm_head``; SiameseNorm
adds ``final_post_norm`` and ``final_dual_norm`` (on its two streams before ``final_norm``), nGPT ``s_z`` (the logit
scale, a ``Scale`` of the vocabulary).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._subclasses.fake_tensor import is_fake

from lnblocks.blocks import AttentionStats, Block, KVCache, Stream, normalize_block_weights_, rope_cache, softcap
from lnblocks.blocks.ngpt import Scale, normalize_rows_
from lnblocks.config import check_bool, check_float, check_int
from lnblocks.models.capped_loss import capped_lm_head_loss
from lnblocks.models.config import GPTConfig
from lnblocks.models.init import init_weights
from lnblocks.models.lm_head import check_targets, lm_head_loss
from lnblocks.norms import build_norm

IGNORE_INDEX = -100  # targets equal to it are skipped, as in F.cross_entropy and HF


class GPT(nn.Module):
    """Token embedding (+ learned positions, + embedding norm) -> blocks -> final norm (placement rule) -> LM head.

    ``forward(idx, targets=None)`` returns ``(logits, loss)``; ``forward(..., return_hidden=True)`` returns
    ``(logits, loss, hidden)``. See ``forward`` for shapes.
    """

    def __init__(self, config: GPTConfig | dict | None = None) -> None:
        super().__init__()
        if config is None:
            config = GPTConfig()
        elif isinstance(config, dict):
            config = GPTConfig.from_dict(config)
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig or a dict, got {type(config).__name__}")
        self.config = config
        layers, dim = config.layers, config.dim
        self.tok_emb = nn.Embedding(config.vocab_size, dim)
        self.pos_emb = nn.Embedding(config.max_seq_len, dim) if config.positions == "learned" else None
        self.emb_norm = build_norm(config.emb_norm, dim) if config.emb_norm is not None else None
        self.emb_drop = nn.Dropout(config.emb_dropout)
        self.blocks = nn.ModuleList(Block(b, i, config.n_layers) for i, b in enumerate(layers))
        self.final_norm = build_norm(layers[-1].norm, dim) if config.uses_final_norm else None
        self._siamese = layers[-1].placement == "siamese"
        if self._siamese:
            self.final_post_norm = build_norm(layers[-1].norm, dim)
            self.final_dual_norm = build_norm(layers[-1].norm, dim)
        self.lm_head = nn.Linear(dim, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        self._ngpt = layers[-1].placement == "ngpt"
        # nGPT's logit scale (its Eq. 3, Sec. 2.5): starts at 1, learns at the rate of 1/sqrt(d_model)
        self.s_z = Scale(config.vocab_size, 1.0, dim**-0.5) if self._ngpt else None
        self._resi_dual = layers[-1].placement == "resi_dual"
        self._head_dim = layers[0].head_dim
        init_weights(self)

    # ---- input checks ---------------------------------------------------------------------------------------
    def _check_idx(self, idx: Any, start: int, name: str = "idx") -> None:
        if not isinstance(idx, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(idx).__name__}")
        if idx.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{name} must hold integer token ids (int64 or int32), got {idx.dtype}")
        if idx.dim() != 2:
            raise ValueError(f"{name} must have shape (B, T), got {tuple(idx.shape)}")
        end = start + idx.shape[1]
        if self.pos_emb is not None and end > self.config.max_seq_len:
            raise ValueError(
                f"sequence of {end} positions is longer than the position table (max_seq_len={self.config.max_seq_len})"
            )
        self._check_token_range(idx, name)

    def _check_token_range(self, idx: Tensor, name: str) -> None:
        """Ids in ``[0, vocab_size)``, checked where it is free: eagerly on CPU (a ``ValueError`` with the offending
        min/max); on an accelerator and inside ``torch.compile`` as a device-side ``torch._assert_async`` (no
        host sync; raises ``RuntimeError`` when the values are checked); not at all on meta or fake tensors (no
        values exist)."""
        vocab = self.config.vocab_size
        compiling = torch.compiler.is_compiling()
        if idx.numel() == 0 or idx.device.type == "meta" or (not compiling and is_fake(idx)):
            return
        if compiling or idx.device.type != "cpu":
            torch._assert_async(((idx >= 0) & (idx < vocab)).all(), f"{name}: token ids must be in [0, {vocab})")
            return
        lo, hi = int(idx.min()), int(idx.max())  # CPU tensor: no device synchronisation
        if lo < 0 or hi >= vocab:
            raise ValueError(f"{name}: token ids must be in [0, vocab_size={vocab}), got min {lo}, max {hi}")

    # ---- forward --------------------------------------------------------------------------------------------
    def _trunk(self, idx: Tensor, start: int, caches: list[KVCache] | None, hidden: list[Tensor] | None) -> Tensor:
        """Embeddings and blocks; returns the LM head's input ``(B, T, C)``."""
        T = idx.shape[1]
        x = self.tok_emb(idx)  # (B, T, C)
        if self.config.emb_scale is not None:  # Gemma: times sqrt(d), the fp32 factor rounded to the model dtype
            x = x * torch.tensor(self.config.emb_scale, device=x.device).to(x.dtype)
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(start, start + T, device=idx.device))
        if self.emb_norm is not None:
            x = self.emb_norm(x)  # BERT/BLOOM: norm of the summed embeddings, then dropout
        x = self.emb_drop(x)
        rope = None
        if self.config.positions == "rope":
            positions = torch.arange(start, start + T, device=idx.device)
            rope = rope_cache(self._head_dim, positions, self.config.rope_theta, dtype=x.dtype)
        if hidden is not None:
            hidden.append(x)
        n = self.config.n_streams
        s = Stream(x if n is None else x.unsqueeze(-2).expand(*x.shape[:-1], n, x.shape[-1]))  # HC: n copies
        for i, blk in enumerate(self.blocks):
            s = blk(s, rope, None if caches is None else caches[i])
            if hidden is not None:
                hidden.append(s.value() if n is None else s.value().sum(dim=-2))
        if n is not None:
            s = Stream(s.value().sum(dim=-2))  # hyper-connections: the streams summed before the final norm
        if self._resi_dual:
            return s.value() + self.final_norm(s.dual)  # ResiDual: x_N + norm(y_N)
        if self._siamese:  # SiameseNorm: norm_f(norm_x(x_N) + norm_y(y_N))
            x = s.hidden if s.residual is None else None
            x = self.final_post_norm(x) if x is not None else self.final_post_norm(s.hidden, residual=s.residual)[0]
            return self.final_norm(x + self.final_dual_norm(s.dual))
        if self.final_norm is None:
            return s.value()
        if s.residual is None:
            return self.final_norm(s.hidden)
        return self.final_norm(s.hidden, residual=s.residual)[0]  # fuses the last block's pending add

    def _logits(self, x: Tensor) -> Tensor:
        """The LM head on ``x`` ``(..., C)``: nGPT's ``s_z`` scale and Gemma 2's final soft-cap when configured."""
        logits = self.lm_head(x)  # (..., V)
        if self.s_z is not None:
            logits = logits * self.s_z().to(logits.dtype)
        if self.config.final_softcap is not None:
            logits = softcap(logits, self.config.final_softcap)
        return logits

    def _head_weight(self) -> Tensor:
        """The weight the chunked head multiplies by: ``lm_head.weight``, rows scaled by nGPT's ``s_z``."""
        w = self.lm_head.weight
        return w if self.s_z is None else w * self.s_z().to(w.dtype).unsqueeze(-1)

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        *,
        return_hidden: bool = False,
        return_logits: bool = True,
        z_loss: float = 0.0,
        head_stats: bool | None = None,
    ) -> tuple[Any, Tensor | None] | tuple[Any, Tensor | None, list[Tensor]]:
        """``idx``: ``(B, T)`` token ids. Returns ``(logits, loss)``: logits ``(B, T, vocab_size)`` in the model dtype;
        loss the mean fp32 cross-entropy against ``targets`` ``(B, T)`` (entries -100 ignored), or None.

        ``return_logits=False``: the LM head and the loss in chunks of rows (``lnblocks.models.lm_head.lm_head_loss``),
        never holding the ``(B, T, V)`` logits; returns ``(LMHeadStats, loss)``, the stats carrying the z-loss
        term (``z_loss`` its coefficient, 0 off) and, with ``head_stats`` (default: without targets), the max
        logit and per-position log Z. The loss is today's within float summation order (see that module).
        ``return_hidden=True`` adds a third item: ``n_layers + 1`` tensors ``(B, T, C)``, the residual stream after
        the embedding and after each block (before any final norm; for ResiDual the post-norm stream, for
        SiameseNorm the Post-like stream x, with hyper-connections the streams summed).
        """
        self._check_idx(idx, 0)
        if targets is not None:
            targets = check_targets(targets, tuple(idx.shape), self.config.vocab_size, IGNORE_INDEX)
        check_bool("return_logits", return_logits)
        if return_logits and (z_loss or head_stats):
            raise ValueError(
                "z_loss and head_stats come from the chunked head: pass return_logits=False (with logits, compute "
                "them from the logits)"
            )
        hidden: list[Tensor] | None = [] if return_hidden else None
        x = self._trunk(idx, 0, None, hidden)  # (B, T, C)
        if return_logits:
            first: Any = self._logits(x)  # (B, T, V)
            loss = None
            if targets is not None:
                loss = F.cross_entropy(first.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
        elif self.config.final_softcap is not None:
            cap = self.config.final_softcap
            loss, first = capped_lm_head_loss(x, self._head_weight(), targets, cap, z_loss=z_loss, stats=head_stats)
        else:
            loss, first = lm_head_loss(x, self._head_weight(), targets, z_loss=z_loss, stats=head_stats)
        if return_hidden:
            return first, loss, hidden
        return first, loss

    # ---- generation -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        *,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Append ``max_new_tokens`` tokens to ``idx`` ``(B, T)`` and return ``(B, T + max_new_tokens)``.

        ``temperature=0`` is greedy (argmax); otherwise sample from ``softmax(logits / temperature)``, restricted to
        the ``top_k`` most likely tokens when given. ``use_cache``: a KV cache per layer (one token per step).
        """
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=0)
        temperature = check_float("temperature", temperature, lo=0)  # finite: nan/inf sample nothing meaningful
        top_k = check_int("top_k", top_k, allow_none=True)
        check_bool("use_cache", use_cache)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        self._check_idx(idx, max_new_tokens)
        parallel = getattr(self, "parallel_config", None)  # set by lnblocks.models.parallel.parallelize
        if parallel is not None and parallel.tp > 1 and parallel.sequence_parallel:
            raise ValueError(
                "generate is not supported under sequence parallelism (each step feeds one token, which tp ranks "
                "cannot split); shard with sequence_parallel=False to generate, or generate from an unsharded copy"
            )
        bidirectional = [i for i, b in enumerate(self.config.layers) if not b.attention.causal]
        if bidirectional:
            raise ValueError(
                f"generate needs causal attention: layers {bidirectional} have attention.causal=False (a token "
                "would see the ones after it, and the KV cache would give other tokens than a full recompute)"
            )
        if idx.shape[1] == 0:
            raise ValueError(
                f"idx must hold at least one token per row to continue (shape (B, T) with T >= 1), got "
                f"{tuple(idx.shape)}; start from a BOS or any token id"
            )
        was_training = self.training
        self.eval()
        try:
            B, T = idx.shape
            caches = None
            if use_cache:
                dtype = self.tok_emb.weight.dtype
                caches = [
                    KVCache(B, b.attn.n_kv_heads, T + max_new_tokens, b.attn.head_dim, dtype=dtype, device=idx.device)
                    for b in self.blocks
                ]
            step_in, start = idx, 0
            for _ in range(max_new_tokens):
                if not use_cache:
                    step_in, start = idx, 0
                logits = self._logits(self._trunk(step_in, start, caches, None)[:, -1])  # (B, V)
                nxt = self._sample(logits, temperature, top_k, generator)  # (B, 1)
                start = idx.shape[1]
                idx = torch.cat((idx, nxt), dim=1)
                step_in = nxt
            return idx
        finally:
            self.train(was_training)

    @staticmethod
    def _sample(logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None) -> Tensor:
        logits = logits.float()
        if temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)
        # shifted so the largest is 0: a tiny temperature gives -inf for the others (greedy-like), never inf - inf
        logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
        if top_k is not None:
            kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)

    @torch.no_grad()
    def normalize_weights_(self) -> None:
        """nGPT's weight renormalisation, for the trainer to call after every optimizer step (Loshchilov et al.
        2024, arXiv 2410.01131, Sec. 2.6): the embedding and LM-head rows and every block's matrices back to unit
        norm along the embedding dimension. Does nothing for a model without placement ``"ngpt"``."""
        if not self._ngpt:
            return
        normalize_rows_(self.tok_emb.weight, 1)
        normalize_rows_(self.lm_head.weight, 1)  # a no-op on the same rows when tied
        for blk in self.blocks:
            normalize_block_weights_(blk)

    # ---- diagnostics ----------------------------------------------------------------------------------------
    def num_params(self, exclude_embeddings: bool = False) -> int:
        """Number of parameters (a tied head counted once); ``exclude_embeddings`` drops token/position tables."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.tok_emb.weight.numel()
            if self.pos_emb is not None:
                n -= self.pos_emb.weight.numel()
        return n

    def matrices(self, grad: bool = False) -> dict[str, Tensor]:
        """``{"blocks.{i}.W_Q": tensor, ...}``: every layer's matrices by role (``Block.matrices``), or their grads.
        Whole matrices only: a sharded model (``parallelize``) is refused, as slices of its shards are not them."""
        self._check_unsharded("matrices()")
        return {f"blocks.{i}.{k}": v for i, blk in enumerate(self.blocks) for k, v in blk.matrices(grad).items()}

    def _check_unsharded(self, what: str) -> None:
        """``ValueError`` naming ``what`` when parameters or buffers are sharded DTensors (FSDP2, tensor
        parallelism): what reads whole weights must be given them, which gathering on every rank does."""
        sharded = [n for n, t in [*self.named_parameters(), *self.named_buffers()] if hasattr(t, "device_mesh")]
        if sharded:
            raise ValueError(
                f"{what} needs the unsharded model, but {len(sharded)} parameter(s) are sharded DTensors (e.g. "
                f"{sharded[0]!r}): on every rank, load get_model_state_dict(model, options=StateDictOptions("
                "full_state_dict=True)) into a plain GPT(model.config) and use that (docs/sharding.md)"
            )

    def probe(self, idx: Tensor) -> Any:
        """Per layer the attention sink (first-token attention mass), max / median ``|h|`` (massive activations) and
        the hyper-connections' composite mixing gain, from one eval-mode forward on ``idx``
        (``lnblocks.models.probe``: a ``ModelProbe``; the eager attention runs for this call only)."""
        from lnblocks.models.probe import probe

        return probe(self, idx)

    def attention_stats(self) -> list[AttentionStats]:
        """Per layer, the ``AttentionStats`` (per-head max logit and entropy) of the latest forward pass.

        Recorded by the eager attention backend only (``AttentionConfig(backend="eager")``), outside torch.compile.
        """
        stats = [blk.attn.last_stats for blk in self.blocks]
        missing = [i for i, s in enumerate(stats) if s is None]
        if missing:
            raise ValueError(
                f"no attention statistics for layers {missing}: they are recorded by the eager backend "
                "(AttentionConfig(backend='eager')) during an uncompiled forward pass"
            )
        return stats

    # ---- HF interop -----------------------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, model: Any) -> GPT:
        """The lnblocks GPT equal to a ``GPT2LMHeadModel``, a Llama-shaped ``*ForCausalLM`` (Llama, Mistral, Qwen2,
        Qwen3) or a ``Gemma2ForCausalLM``, with its weights copied; see ``lnblocks.models.hf_convert``."""
        from lnblocks.models.hf_convert import from_hf

        return from_hf(model, cls)

    def to_hf(self, family: str | None = None) -> Any:
        """The ``transformers`` model equal to this one (``"gpt2"``, ``"llama"``, ``"mistral"``, ``"qwen2"``,
        ``"qwen3"``, ``"gemma2"``; None picks gpt2 or llama from the config), with the weights copied."""
        from lnblocks.models.hf_convert import to_hf

        return to_hf(self, family)
