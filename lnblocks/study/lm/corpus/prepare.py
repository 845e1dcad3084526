"""``prepare_corpus``: tokenize a ``text`` / ``hf_dataset`` corpus once into nanoGPT-format token files in the cache (or
check a ``tokens`` corpus), count its tokens and compute its reference losses; ``open_corpus``: the
``TokenFileSource`` a run trains on.

A prepared corpus is the folder ``<cache_dir>/<source>-<key>/`` holding ``train.bin``, ``val.bin`` and
``meta.json``. The key hashes everything that decides the ids: each input file's path, size and mtime (not its
content: hashing a 10 GB corpus would take longer than checking it), the tokenizer's files, ``eos_token``, the
split settings and ``CORPUS_FORMAT``. ``meta.json`` is written last, so its presence means the corpus is complete;
a lock file makes a second process wait and then reuse the first one's work.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from lnblocks._optional import require
from lnblocks.study.core.atomic import write_json_atomic
from lnblocks.study.lm.corpus import documents as docs
from lnblocks.study.lm.corpus.cache import TokenWriter, corpus_lock
from lnblocks.study.lm.corpus.config import CorpusConfig, expand_patterns
from lnblocks.study.lm.corpus.tokenizer import TextTokenizer
from lnblocks.study.lm.corpus.tokens import (
    TokenFileSource,
    check_sample,
    reference_from_counts,
    reference_losses,
    token_count,
)

CORPUS_FORMAT = "lnblocks.corpus/1"
SPLITS = ("train", "val")


@dataclasses.dataclass(frozen=True)
class CorpusSummary:
    """What ``prepare_corpus`` found or made: the token files, their sizes, vocabulary and reference losses.

    ``cached``: the corpus was already in the cache (nothing tokenized); ``seconds``: time spent tokenizing.
    """

    source: str
    train_path: Path
    val_path: Path
    token_dtype: str
    vocab_size: int
    train_tokens: int
    val_tokens: int
    reference: dict[str, float]
    tokenizer: str | None = None
    cached: bool = False
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["train_path"], d["val_path"] = str(self.train_path), str(self.val_path)
        return d

    def describe(self) -> str:
        """The lines ``lnblocks data prepare`` prints."""
        how = "found in cache" if self.cached else f"tokenized in {self.seconds:.1f} s"
        if self.source == "tokens":
            how = "token files checked"
        return "\n".join(
            [
                f"corpus: {self.source} ({how}), tokenizer: {self.tokenizer or '-'}",
                f"tokens: train {self.train_tokens:,}, val {self.val_tokens:,} ({self.token_dtype})",
                f"vocabulary: {self.vocab_size:,}",
                f"reference losses (nats/token): uniform ln V = {self.reference['uniform']:.4f}, "
                f"unigram plateau = {self.reference['unigram']:.4f}",
                f"train: {self.train_path}",
                f"val:   {self.val_path}",
            ]
        )


def _stat(path: Path, root: Path | None = None) -> list[Any]:
    st = path.stat()
    name = str(path.relative_to(root)) if root is not None else str(path.resolve())
    return [name, st.st_size, st.st_mtime_ns]


def _inputs(cfg: CorpusConfig) -> dict[str, Any]:
    """The input files (path, size, mtime) whose change must invalidate the cache entry."""
    if cfg.source == "text":
        out: dict[str, Any] = {"files": [_stat(f) for f in expand_patterns("files", cfg.files)]}
        if cfg.val_files:
            out["val_files"] = [_stat(f) for f in expand_patterns("val_files", cfg.val_files)]
        return out
    if cfg.resolved_format == "disk":
        root = Path(os.path.expanduser(cfg.dataset or ""))
        files = sorted(p for p in root.rglob("*") if p.is_file())
        return {"dataset": str(root.resolve()), "files": [_stat(f, root) for f in files]}
    return {"files": [_stat(f) for f in expand_patterns("dataset", (cfg.dataset or "",))]}


def cache_key(cfg: CorpusConfig, tokenizer: TextTokenizer) -> dict[str, Any]:
    """Everything that decides the token ids of a ``text`` / ``hf_dataset`` corpus (hashed into its folder name)."""
    split = {"val_fraction": cfg.val_fraction} if not (cfg.val_files or cfg.val_split) else {}
    if cfg.source == "hf_dataset":
        split |= {"format": cfg.resolved_format, "split": cfg.split, "val_split": cfg.val_split}
        split["text_column"] = cfg.text_column
    return {
        "format": CORPUS_FORMAT,
        "source": cfg.source,
        "inputs": _inputs(cfg),
        "tokenizer": tokenizer.identity,
        "vocab_size": cfg.vocab_size or tokenizer.vocab_size,
        "eos_token": cfg.eos_token,
        **split,
    }


def corpus_folder(cfg: CorpusConfig, key: Mapping[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cfg.resolved_cache_dir / f"{cfg.source}-{digest}"


def _read_meta(folder: Path, key: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    complete = all((folder / f"{s}.bin").is_file() for s in SPLITS)
    return meta if complete and meta.get("key") == key else None


def _summary(folder: Path, meta: Mapping[str, Any], cached: bool) -> CorpusSummary:
    return CorpusSummary(
        source=meta["key"]["source"],
        train_path=folder / "train.bin",
        val_path=folder / "val.bin",
        token_dtype=meta["token_dtype"],
        vocab_size=meta["vocab_size"],
        train_tokens=meta["tokens"]["train"],
        val_tokens=meta["tokens"]["val"],
        reference=meta["reference"],
        tokenizer=meta["tokenizer"],
        cached=cached,
        seconds=0.0 if cached else meta["seconds"],
    )


def _bar(show: bool, total: int, unit: str, desc: str) -> Any:
    if not show:
        return nullcontext(None)
    return require("tqdm").tqdm(total=total, unit=unit, unit_scale=True, desc=desc, dynamic_ncols=True)


def _tokenize_text(
    cfg: CorpusConfig, tok: TextTokenizer, writers: dict[str, TokenWriter], eos: Any, show: bool
) -> None:
    ranges = docs.text_documents(cfg)
    total = sum(end - start for split in SPLITS for _, start, end in ranges[split])
    n_files = len({p for split in SPLITS for p, _, _ in ranges[split]})
    with _bar(show, total, "B", f"tokenizing {n_files} file(s)") as bar:
        for split in SPLITS:
            for path, start, end in ranges[split]:
                for pieces in docs.read_pieces(path, start, end, bar):
                    writers[split].write(tok.encode_pieces(pieces, where=f"files: {str(path)!r}"))
                if eos is not None:
                    writers[split].write(eos)


def _tokenize_dataset(
    cfg: CorpusConfig, tok: TextTokenizer, writers: dict[str, TokenWriter], eos: Any, show: bool
) -> None:
    rows = docs.dataset_rows(cfg)
    total = sum(end - start for _, start, end in rows.values())
    with _bar(show, total, "rows", f"tokenizing {total} rows") as bar:
        for split in SPLITS:
            ds, start, end = rows[split]
            for texts in docs.row_batches(ds, start, end, cfg.text_column, bar):
                parts = []
                for ids in tok.encode(texts):
                    parts.append(ids)
                    if eos is not None:
                        parts.append(eos)
                if parts:
                    writers[split].write(np.concatenate(parts))


def _tokenize_into_cache(cfg: CorpusConfig, show_progress: bool) -> CorpusSummary:
    tok = TextTokenizer(cfg.tokenizer)
    vocab_size = cfg.vocab_size or tok.vocab_size
    if vocab_size < tok.vocab_size:
        raise ValueError(f"vocab_size: {vocab_size} is smaller than the tokenizer's {tok.vocab_size} ids")
    eos = None if cfg.eos_token is None else np.array([tok.token_id(cfg.eos_token)], dtype=np.int64)
    key = cache_key(cfg, tok)
    folder = corpus_folder(cfg, key)
    with corpus_lock(folder):
        meta = _read_meta(folder, key)
        if meta is not None:
            return _summary(folder, meta, cached=True)
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob(".*.tmp-*"):  # left by a killed preparer (we hold the lock: nobody writes now)
            stale.unlink(missing_ok=True)
        (folder / "meta.json").unlink(missing_ok=True)
        dtype = np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
        t0 = time.perf_counter()
        with (
            TokenWriter(folder / "train.bin", dtype, vocab_size) as train,
            TokenWriter(folder / "val.bin", dtype, vocab_size) as val,
        ):
            writers = {"train": train, "val": val}
            tokenize = _tokenize_text if cfg.source == "text" else _tokenize_dataset
            tokenize(cfg, tok, writers, eos, show_progress)
            for split, w in writers.items():
                if w.tokens < 2:
                    raise ValueError(f"the {split} split of the corpus has {w.tokens} token(s): nothing to train on")
            train.commit()
            val.commit()
        meta = {
            "format": CORPUS_FORMAT,
            "key": key,
            "tokenizer": tok.name,
            "tokenizer_kind": tok.kind,
            "token_dtype": dtype.name,
            "vocab_size": vocab_size,
            "tokens": {"train": train.tokens, "val": val.tokens},
            "reference": reference_from_counts(train.counts, val.counts),
            "seconds": round(time.perf_counter() - t0, 3),
        }
        write_json_atomic(folder / "meta.json", meta)
        return _summary(folder, meta, cached=False)


def _check_token_files(cfg: CorpusConfig, show_progress: bool) -> CorpusSummary:
    dtype = np.dtype(cfg.token_dtype)
    assert cfg.train_path is not None and cfg.val_path is not None and cfg.vocab_size is not None
    train, val = Path(os.path.expanduser(cfg.train_path)), Path(os.path.expanduser(cfg.val_path))
    check_sample(train, dtype, cfg.vocab_size, "train_path")
    check_sample(val, dtype, cfg.vocab_size, "val_path")
    reference = reference_losses(
        train, val, dtype, cfg.vocab_size, cache_dir=cfg.resolved_cache_dir, show_progress=show_progress
    )
    return CorpusSummary(
        source="tokens",
        train_path=train,
        val_path=val,
        token_dtype=dtype.name,
        vocab_size=cfg.vocab_size,
        train_tokens=token_count(train, dtype, "train_path"),
        val_tokens=token_count(val, dtype, "val_path"),
        reference=reference,
    )


def prepare_corpus(cfg: CorpusConfig | Mapping[str, Any], *, show_progress: bool = True) -> CorpusSummary:
    """Tokenize (``text``, ``hf_dataset``: once, then from the cache) or check (``tokens``: sizes, every id, and the
    reference losses, cached) the corpus ``cfg`` describes. What ``lnblocks data prepare CONFIG`` runs."""
    cfg = CorpusConfig.from_dict(cfg, key="data") if not isinstance(cfg, CorpusConfig) else cfg
    if cfg.source == "tokens":
        return _check_token_files(cfg, show_progress)
    return _tokenize_into_cache(cfg, show_progress)


def open_corpus(
    cfg: CorpusConfig | Mapping[str, Any],
    *,
    seq_len: int,
    batch_size: int,
    eval_batches: int = 8,
    data_seed: int = 0,
    show_progress: bool = False,
) -> TokenFileSource:
    """The training source of a corpus (prepared first if needed): a drop-in sibling of the study's built-in
    sources (``batch(B, generator)``, ``eval_set()``, ``reference``, ``vocab_size``)."""
    cfg = CorpusConfig.from_dict(cfg, key="data") if not isinstance(cfg, CorpusConfig) else cfg
    summary = prepare_corpus(cfg, show_progress=show_progress)
    return TokenFileSource(
        summary.train_path,
        summary.val_path,
        vocab_size=summary.vocab_size,
        token_dtype=summary.token_dtype,
        seq_len=seq_len,
        batch_size=batch_size,
        eval_batches=eval_batches,
        data_seed=data_seed,
        reference=summary.reference,
    )
