"""What a corpus must pass before it is trusted or trained on, each check a plain function of what
``prepare_corpus`` knows.

- A cache entry (``entry_problem``): its manifest is sound (its own sha256, every field of the right type), each
  token file has the size the manifest says (on every open: one ``stat``), and, when ``prepare_corpus`` runs (``data
  prepare``, and a study's driver once before its runs), the sha256 the manifest says. A reference-loss entry
  (``reference_problem``): ``uniform`` is ln V and ``unigram`` lies in ``(0, ln(N + V)]``, the range of an
  add-one-smoothed cross-entropy over ``N`` training tokens.
- The data fits the runs (``check_windows``): both splits hold at least one ``seq_len + 1`` window.
- ``vocab_size`` fits the data (``check_vocab``): at most ``UNUSED_VOCAB_RATIO`` (4) times the ids the data can
  hold, unless ``allow_unused_vocab``.
- Warnings (``data_warnings``), not errors: a unigram plateau above ln V (held-out tokens rarer than uniform
  guessing: a wrong ``token_dtype``, or the splits from different corpora).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lnblocks.study.lm.data.corpus.cache import file_sha256
from lnblocks.study.lm.data.corpus.config import UNUSED_VOCAB_RATIO

SPLITS = ("train", "val")
TOKEN_DTYPES = {"uint16": 2, "uint32": 4}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def reference_problem(ref: Any, vocab_size: int, train_tokens: int) -> str | None:
    """Why ``ref`` cannot be the reference losses of a corpus of ``vocab_size`` ids and ``train_tokens`` training
    tokens (None if it can)."""
    if not isinstance(ref, Mapping) or set(ref) != {"uniform", "unigram"}:
        return f"reference must hold exactly 'uniform' and 'unigram', got {ref!r}"
    uniform, unigram = ref["uniform"], ref["unigram"]
    if not (_number(uniform) and _number(unigram)):
        return f"reference values must be finite numbers, got {dict(ref)!r}"
    if abs(uniform - math.log(vocab_size)) > 1e-9 * math.log(vocab_size):
        return f"reference uniform {uniform!r} is not ln V = {math.log(vocab_size):.6f}"
    bound = math.log(train_tokens + vocab_size)
    if not 0.0 < unigram <= bound * (1 + 1e-12):
        return f"reference unigram {unigram!r} is outside (0, ln(N + V) = {bound:.4f}]"
    return None


def _count(v: Any, minimum: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= minimum


def entry_problem(folder: Path, meta: Mapping[str, Any], key: Mapping[str, Any], *, checksums: bool) -> str | None:
    """Why the prepared corpus in ``folder`` with manifest ``meta`` is not the corpus of ``key`` (None if it is):
    manifest fields, token file sizes, and with ``checksums`` every file's sha256."""
    if meta.get("key") != key:
        return "its manifest is for another corpus key"
    dtype, vocab = meta.get("token_dtype"), meta.get("vocab_size")
    tokens, digests = meta.get("tokens"), meta.get("bin_sha256")
    if dtype not in TOKEN_DTYPES or not _count(vocab, 2):
        return f"its manifest has token_dtype {dtype!r} and vocab_size {vocab!r}"
    if not isinstance(tokens, Mapping) or not all(_count(tokens.get(s), 2) for s in SPLITS):
        return f"its manifest has token counts {tokens!r}"
    if not isinstance(digests, Mapping) or not all(isinstance(digests.get(s), str) for s in SPLITS):
        return "its manifest has no sha256 of the token files"
    if not _count(meta.get("max_id")) or meta["max_id"] >= vocab:
        return f"its manifest has max_id {meta.get('max_id')!r}"
    why = reference_problem(meta.get("reference"), vocab, tokens["train"])
    if why is not None:
        return f"its manifest's {why}"
    for split in SPLITS:
        path = folder / f"{split}.bin"
        want = tokens[split] * TOKEN_DTYPES[dtype]
        try:
            size = path.stat().st_size
        except OSError:
            return f"{path.name} is missing"
        if size != want:
            return f"{path.name} has {size:,} bytes, the manifest says {want:,} ({tokens[split]:,} {dtype} tokens)"
        if checksums and file_sha256(path) != digests[split]:
            return f"{path.name} does not match the sha256 in its manifest (damaged or rewritten)"
    return None


def check_windows(summary: Any, seq_len: int) -> None:
    """``ValueError`` when a split of the prepared corpus ``summary`` (a ``CorpusSummary``) holds no window of
    ``seq_len + 1`` tokens: every run would fail on its first batch."""
    for split in SPLITS:
        n, path = getattr(summary, f"{split}_tokens"), getattr(summary, f"{split}_path")
        if n < seq_len + 1:
            raise ValueError(
                f"seq_len: {seq_len} needs windows of {seq_len + 1} tokens, but the {split} split of the corpus has "
                f"{n:,} ({str(path)!r}): give more data or a shorter seq_len"
            )


def check_vocab(vocab_size: int, ids: int, allow: bool, what: str) -> None:
    """``ValueError`` when ``vocab_size`` exceeds ``UNUSED_VOCAB_RATIO`` times ``ids`` (the ids the data can hold:
    ``what`` says which) and ``allow`` (``allow_unused_vocab``) is off."""
    if allow or vocab_size <= UNUSED_VOCAB_RATIO * ids:
        return
    raise ValueError(
        f"vocab_size: {vocab_size:,} is more than {UNUSED_VOCAB_RATIO}x the {ids:,} ids {what}: the model would hold "
        "mostly unused embedding rows and ln V would not be the uniform loss of this data; fix vocab_size, or set "
        "allow_unused_vocab: true to keep it"
    )


def data_warnings(reference: Mapping[str, float]) -> list[str]:
    """What looks wrong in a corpus without being certainly wrong (printed once, before any run)."""
    out = []
    if reference["unigram"] > reference["uniform"]:
        out.append(
            f"the unigram plateau {reference['unigram']:.4f} exceeds ln V = {reference['uniform']:.4f}: held-out "
            "tokens are rarer in train than uniform guessing would make them (a token_dtype that does not match the "
            "files, or train and val from different corpora?)"
        )
    return out
