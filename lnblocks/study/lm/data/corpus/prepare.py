"""``prepare_corpus``: tokenize a ``text`` / ``hf_dataset`` corpus once into nanoGPT-format token files in the cache (or
check a ``tokens`` corpus), count its tokens and compute its reference losses; ``open_corpus``: the
``TokenFileSource`` a run trains on.

A prepared corpus is the folder ``<cache_dir>/<source>-<key>/`` holding ``train.bin``, ``val.bin`` and
``meta.json``. The key hashes everything that decides the ids: each input file's path, size and mtime (not its
content: hashing a 10 GB corpus would take longer than checking it), the tokenizer's files, ``eos_token``, the
split settings and ``CORPUS_FORMAT``. ``meta.json`` (the manifest) is written last, so its presence means the
corpus is complete; a lock file makes a second process wait and then reuse the first one's work. The manifest
carries its own sha256 and each token file's size and sha256: every open checks the sizes, ``prepare_corpus`` also the
checksums, and an entry that fails is named on stderr and rebuilt (``lnblocks.study.lm.data.corpus.verify``). The
cache is bounded (``lnblocks.study.lm.data.corpus.evict``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lnblocks.study.core.atomic import remove_stale_tmp, tmp_path, write_json_atomic
from lnblocks.study.lm.data.corpus.cache import TokenWriter, corpus_lock, seal, unseal
from lnblocks.study.lm.data.corpus.config import CorpusConfig, expand_patterns, text_files
from lnblocks.study.lm.data.corpus.evict import Lease, evict, keep_limit, touch
from lnblocks.study.lm.data.corpus.tokenizer import TextTokenizer
from lnblocks.study.lm.data.corpus.tokenizing import tokenize_dataset, tokenize_text, undecodable_error
from lnblocks.study.lm.data.corpus.tokens import (
    TokenFileSource,
    check_sample,
    reference_entry,
    reference_from_counts,
    same_content,
    token_count,
)
from lnblocks.study.lm.data.corpus.verify import check_vocab, check_windows, data_warnings, entry_problem

# 2: the held-out tail of a text file starts at the line start nearest its target (1 was the next unindented line),
# and the manifest carries sha256s, max_id, the lineage and the files left out.
CORPUS_FORMAT = "lnblocks.corpus/2"
SPLITS = ("train", "val")
SHOWN_SKIPPED = 5  # undecodable files named in the description (all are in the manifest)


@dataclasses.dataclass(frozen=True)
class CorpusSummary:
    """What ``prepare_corpus`` found or made: the token files, their sizes, vocabulary and reference losses.

    ``cached``: the corpus was already in the cache (nothing tokenized); ``seconds``: time spent tokenizing;
    ``skipped``: text files left out as not UTF-8 (``skip_undecodable``); ``excluded``: files ``exclude`` left out;
    ``warnings``: what looks wrong without being certainly wrong (printed once before any run); ``sha256``: of the
    train and val token files; ``files``: how many input files (text / dataset files) went in.
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
    skipped: tuple[str, ...] = ()
    excluded: int = 0
    warnings: tuple[str, ...] = ()
    sha256: tuple[str, str] = ("", "")
    files: int | None = None

    @property
    def digest(self) -> str:
        """What a run trained on: ``sha256:<32 hex>`` over both token files' sha256, the token type and the
        vocabulary (``data.corpus``, part of the run's id): equal for equal tokens, whatever their paths."""
        body = {"train": self.sha256[0], "val": self.sha256[1], "token_dtype": self.token_dtype,
                "vocab_size": self.vocab_size}  # fmt: skip
        return "sha256:" + _digest(body, 32)

    def record(self) -> dict[str, Any]:
        """What a run record keeps of its corpus (``result.corpus``): the digest and a summary, never the list of
        input files (a ``text`` corpus of thousands of files would make every record that long)."""
        return {
            "digest": self.digest, "source": self.source, "tokenizer": self.tokenizer, "files": self.files,
            "excluded": self.excluded, "skipped": len(self.skipped), "token_dtype": self.token_dtype,
            "vocab_size": self.vocab_size, "train_tokens": self.train_tokens, "val_tokens": self.val_tokens,
            "train_path": str(self.train_path), "val_path": str(self.val_path),
        }  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["train_path"], d["val_path"] = str(self.train_path), str(self.val_path)
        d["skipped"], d["warnings"], d["sha256"] = list(self.skipped), list(self.warnings), list(self.sha256)
        return d

    def describe(self) -> str:
        """The lines ``lnblocks data prepare`` prints."""
        how = "found in cache" if self.cached else f"tokenized in {self.seconds:.1f} s"
        if self.source == "tokens":
            how = "token files checked"
        lines = [
            f"corpus: {self.source} ({how}), tokenizer: {self.tokenizer or '-'}",
            f"tokens: train {self.train_tokens:,}, val {self.val_tokens:,} ({self.token_dtype})",
            f"vocabulary: {self.vocab_size:,}",
            f"reference losses (nats/token): uniform ln V = {self.reference['uniform']:.4f}, "
            f"unigram plateau = {self.reference['unigram']:.4f}",
            f"train: {self.train_path}",
            f"val:   {self.val_path}",
        ]
        if self.excluded:
            lines.append(f"excluded: {self.excluded:,} file(s) matched by exclude")
        if self.skipped:
            more = f" and {len(self.skipped) - SHOWN_SKIPPED} more" if len(self.skipped) > SHOWN_SKIPPED else ""
            named = ", ".join(repr(s) for s in self.skipped[:SHOWN_SKIPPED])
            lines.append(f"skipped: {len(self.skipped):,} file(s) not UTF-8 (skip_undecodable): {named}{more}")
        return "\n".join(lines + [f"warning: {w}" for w in self.warnings])


def _stat(path: Path, root: Path | None = None) -> list[Any]:
    st = path.stat()
    name = str(path.relative_to(root)) if root is not None else str(path.resolve())
    return [name, st.st_size, st.st_mtime_ns]


def _inputs(cfg: CorpusConfig) -> dict[str, Any]:
    """The input files (path, size, mtime) whose change must invalidate the cache entry."""
    if cfg.source == "text":
        files, val_files, _ = text_files(cfg)
        out: dict[str, Any] = {"files": [_stat(f) for f in files]}
        if cfg.val_files:
            out["val_files"] = [_stat(f) for f in val_files]
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


def _digest(obj: Any, n: int) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:n]


def lineage(cfg: CorpusConfig, key: Mapping[str, Any]) -> str:
    """The key with the input files' sizes and mtimes and the tokenizer's content replaced by the patterns and the
    tokenizer's path: the same for every version of one corpus config (older versions can never be hit again)."""

    def where(p: str) -> str:
        return os.path.abspath(os.path.expanduser(p))

    patterns = {k: [where(p) for p in getattr(cfg, k)] for k in ("files", "val_files", "exclude")}
    tokenizer = cfg.tokenizer if cfg.tokenizer == "bytes" else where(cfg.tokenizer)
    inputs = {**patterns, "dataset": cfg.dataset and where(cfg.dataset)}
    return _digest({**key, "inputs": inputs, "tokenizer": tokenizer}, 20)


def corpus_folder(cfg: CorpusConfig, key: Mapping[str, Any]) -> Path:
    return cfg.resolved_cache_dir / f"{cfg.source}-{_digest(key, 20)}"


def _trusted_meta(folder: Path, key: Mapping[str, Any], checksums: bool) -> dict[str, Any] | None:
    """The manifest of ``folder`` if the entry passes its checks; a damaged entry is named on stderr."""
    meta, why = unseal(folder / "meta.json")
    if meta is not None:
        why = entry_problem(folder, meta, key, checksums=checksums)
        if why is None:
            return meta
    if why is not None:
        print(f"warning: corpus cache {str(folder)!r}: {why}; rebuilding it", file=sys.stderr, flush=True)
    return None


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
        skipped=tuple(s["path"] for s in meta.get("skipped", ())),
        excluded=meta.get("excluded", 0),
        warnings=tuple(data_warnings(meta["reference"])),
        sha256=(meta["bin_sha256"]["train"], meta["bin_sha256"]["val"]),
        files=meta.get("files") if isinstance(meta.get("files"), int) else None,
    )


def _build(cfg: CorpusConfig, tok: TextTokenizer, folder: Path, key: dict[str, Any], show: bool) -> dict[str, Any]:
    """Tokenize the corpus into ``folder`` (its lock held) and write its sealed manifest."""
    vocab_size = key["vocab_size"]
    eos = None if cfg.eos_token is None else np.array([tok.token_id(cfg.eos_token)], dtype=np.int64)
    folder.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(folder, every=True)  # left by a killed preparer (we hold the lock: nobody writes now)
    (folder / "meta.json").unlink(missing_ok=True)
    dtype = np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
    t0 = time.perf_counter()
    with (
        TokenWriter(folder / "train.bin", dtype, vocab_size) as train,
        TokenWriter(folder / "val.bin", dtype, vocab_size) as val,
    ):
        writers = {"train": train, "val": val}
        if cfg.source == "text":
            inputs = tokenize_text(cfg, tok, writers, eos, show)
        else:
            hf_cache = tmp_path(folder / "datasets")
            inputs = tokenize_dataset(cfg, tok, writers, eos, show, hf_cache)
        for split, w in writers.items():
            if w.tokens < 2:
                raise ValueError(f"the {split} split of the corpus has {w.tokens} token(s): nothing to train on")
        train.commit()
        val.commit()
    meta = {
        "format": CORPUS_FORMAT,
        "key": key,
        "lineage": lineage(cfg, key),
        "tokenizer": tok.name,
        "tokenizer_kind": tok.kind,
        "token_dtype": dtype.name,
        "vocab_size": vocab_size,
        "max_id": int(np.flatnonzero(train.counts + val.counts).max()),
        "tokens": {"train": train.tokens, "val": val.tokens},
        "bin_sha256": {"train": train.sha256.hexdigest(), "val": val.sha256.hexdigest()},
        "reference": reference_from_counts(train.counts, val.counts),
        "seconds": round(time.perf_counter() - t0, 3),
        **inputs,
    }
    write_json_atomic(folder / "meta.json", seal(meta))
    return meta


def _tokenize_into_cache(
    cfg: CorpusConfig, show_progress: bool, checksums: bool, hold: bool
) -> tuple[CorpusSummary, Lease | None]:
    keep = keep_limit()  # a bad $LNBLOCKS_CORPUS_KEEP fails before any work
    tok = TextTokenizer(cfg.tokenizer)
    vocab_size = cfg.vocab_size or tok.vocab_size
    if vocab_size < tok.vocab_size:
        raise ValueError(f"vocab_size: {vocab_size} is smaller than the tokenizer's {tok.vocab_size} ids")
    check_vocab(vocab_size, tok.vocab_size, cfg.allow_unused_vocab, f"the tokenizer {tok.name!r} can produce")
    key = cache_key(cfg, tok)
    folder = corpus_folder(cfg, key)
    with corpus_lock(folder):
        meta = _trusted_meta(folder, key, checksums)
        built = meta is None
        if meta is None:
            meta = _build(cfg, tok, folder, key, show_progress)
        elif meta.get("skipped") and not cfg.skip_undecodable:  # refused now as it would be if not cached
            raise undecodable_error(meta["skipped"], meta["files"] + len(meta["skipped"]))
        touch(folder)
        lease = Lease(folder) if hold else None
    if built:
        evict(cfg.resolved_cache_dir, keep, folder, meta["lineage"])
    return _summary(folder, meta, cached=not built), lease


def _check_token_files(cfg: CorpusConfig, show_progress: bool, verify: bool) -> CorpusSummary:
    dtype = np.dtype(cfg.token_dtype)
    assert cfg.train_path is not None and cfg.val_path is not None and cfg.vocab_size is not None
    train, val = Path(os.path.expanduser(cfg.train_path)), Path(os.path.expanduser(cfg.val_path))
    layout = [check_sample(p, dtype, cfg.vocab_size, name) for p, name in ((train, "train_path"), (val, "val_path"))]
    if same_content(train, val):
        raise ValueError(
            f"val_path: {str(val)!r} holds the same tokens as train_path {str(train)!r}: held-out data must not be "
            "trained on"
        )
    entry = reference_entry(
        train, val, dtype, cfg.vocab_size, cache_dir=cfg.resolved_cache_dir, show_progress=show_progress, verify=verify
    )
    max_id = entry["max_id"]
    check_vocab(cfg.vocab_size, max_id + 1, cfg.allow_unused_vocab, f"the token files use (max id {max_id:,})")
    return CorpusSummary(
        source="tokens",
        train_path=train,
        val_path=val,
        token_dtype=dtype.name,
        vocab_size=cfg.vocab_size,
        train_tokens=token_count(train, dtype, "train_path"),
        val_tokens=token_count(val, dtype, "val_path"),
        reference=entry["reference"],
        warnings=tuple([w for w in layout if w] + data_warnings(entry["reference"])),
        sha256=(entry["bin_sha256"]["train"], entry["bin_sha256"]["val"]),
        files=2,
    )


def _find_or_make(
    cfg: CorpusConfig | Mapping[str, Any], show_progress: bool, checksums: bool, hold: bool, digest: bool = False
) -> tuple[CorpusSummary, Lease | None]:
    """``checksums``: verify what the cache holds (sha256 of its token files); ``digest``: the summary gives a run
    its id, so a ``tokens`` corpus's own files are hashed (once per process and file version: a study's driver)."""
    cfg = CorpusConfig.from_dict(cfg, key="data") if not isinstance(cfg, CorpusConfig) else cfg
    if cfg.source == "tokens":
        return _check_token_files(cfg, show_progress, verify=checksums or digest), None
    return _tokenize_into_cache(cfg, show_progress, checksums, hold)


def prepare_corpus(
    cfg: CorpusConfig | Mapping[str, Any], *, show_progress: bool = True, seq_len: int | None = None
) -> CorpusSummary:
    """Tokenize (``text``, ``hf_dataset``: once, then from the cache, its checksums verified) or check (``tokens``:
    sizes, every id, and the reference losses, cached) the corpus ``cfg`` describes; with ``seq_len``, also that
    both splits hold a window of ``seq_len + 1`` tokens. What ``lnblocks data prepare CONFIG`` runs, and a study's
    driver before any run."""
    summary, _ = _find_or_make(cfg, show_progress, checksums=True, hold=False)
    if seq_len is not None:
        check_windows(summary, seq_len)
    return summary


def corpus_digest(cfg: CorpusConfig | Mapping[str, Any], *, show_progress: bool = False) -> str:
    """The digest of the prepared corpus ``cfg`` describes (``CorpusSummary.digest``; prepared first if it is not in
    the cache, else found by its cache key: a ``stat`` of each input file; a ``tokens`` corpus's files are hashed,
    once per process while they are unchanged): what ``data.corpus`` of a run holds."""
    summary, _ = _find_or_make(cfg, show_progress, checksums=False, hold=False, digest=True)
    return summary.digest


def open_corpus(
    cfg: CorpusConfig | Mapping[str, Any],
    *,
    seq_len: int,
    batch_size: int,
    eval_batches: int = 8,
    data_seed: int = 0,
    show_progress: bool = False,
    digest: str | None = None,
) -> TokenFileSource:
    """The training source of a corpus (prepared first if needed; a cached one is checked by its sizes, the
    checksums being ``prepare_corpus``'s): a drop-in sibling of the study's built-in sources (``batch(B, generator)``,
    ``eval_set()``, ``reference``, ``vocab_size``), with ``corpus`` (``CorpusSummary.record()``). It holds the cache
    entry in use while it lives. ``digest``: the corpus the run was given (``data.corpus``); another is refused."""
    summary, lease = _find_or_make(cfg, show_progress, checksums=False, hold=True)
    if digest is not None and summary.digest != digest:
        if lease is not None:
            lease.close()
        raise ValueError(
            f"data.corpus: the corpus changed since this run was set up (it was {digest}, the files now give "
            f"{summary.digest}); rerun the study to train on the new corpus as new runs"
        )
    source = TokenFileSource(
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
    source.lease = lease
    source.corpus = summary.record()
    return source
