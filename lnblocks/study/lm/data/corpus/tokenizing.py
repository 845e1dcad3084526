"""The tokenizing passes of ``prepare_corpus``: the files of a ``text`` corpus (after every one is checked to be
UTF-8) and the rows of an ``hf_dataset`` corpus, streamed into the ``TokenWriter`` of each split.

The UTF-8 check reads every file once before the first is tokenized, so a corpus with bad files fails in the time
of a read, naming all of them (up to ``MAX_NAMED``), not after a long tokenizing pass naming the first;
``skip_undecodable`` leaves them out instead, and the manifest lists them.
"""

from __future__ import annotations

import shutil
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from lnblocks._optional import require
from lnblocks.study.lm.data.corpus import documents as docs
from lnblocks.study.lm.data.corpus.cache import TokenWriter
from lnblocks.study.lm.data.corpus.config import CorpusConfig, text_files
from lnblocks.study.lm.data.corpus.tokenizer import BYTES, TextTokenizer

SPLITS = ("train", "val")
MAX_NAMED = 10  # undecodable files named in one message


def bar(show: bool, total: int, unit: str, desc: str) -> Any:
    """A tqdm bar, or a context yielding None when progress is off."""
    if not show:
        return nullcontext(None)
    return require("tqdm").tqdm(total=total, unit=unit, unit_scale=True, desc=desc, dynamic_ncols=True)


def undecodable_error(skipped: list[dict[str, Any]], n_files: int) -> ValueError:
    """The one-line refusal of a corpus with files that are not UTF-8, naming up to ``MAX_NAMED`` of them."""
    named = ", ".join(f"{s['path']!r} (byte {s['byte']} at offset {s['offset']:,})" for s in skipped[:MAX_NAMED])
    more = f" and {len(skipped) - MAX_NAMED} more" if len(skipped) > MAX_NAMED else ""
    return ValueError(
        f"files: {len(skipped)} of {n_files:,} file(s) are not UTF-8 text: {named}{more}; leave them out with "
        "skip_undecodable: true or exclude, re-encode them, or use tokenizer: bytes"
    )


def _check_utf8(files: list[Path], show: bool) -> list[dict[str, Any]]:
    total = sum(f.stat().st_size for f in files)
    with bar(show, total, "B", f"checking UTF-8 of {len(files)} file(s)") as b:
        bad = docs.undecodable(files, b)
    return [{"path": str(p), "offset": at, "byte": repr(byte)} for p, at, byte in bad]


def tokenize_text(
    cfg: CorpusConfig, tok: TextTokenizer, writers: dict[str, TokenWriter], eos: Any, show: bool
) -> dict[str, Any]:
    """Tokenize the files of a ``text`` corpus; returns what the manifest records about them (files tokenized,
    excluded, skipped as not UTF-8)."""
    files, val_files, n_excluded = text_files(cfg)
    skipped: list[dict[str, Any]] = []
    if tok.kind != BYTES:
        skipped = _check_utf8(files + val_files, show)
        if skipped and not cfg.skip_undecodable:
            raise undecodable_error(skipped, len(files) + len(val_files))
        bad = {s["path"] for s in skipped}
        for key, given in (("files", files), ("val_files", val_files)):
            if given and all(str(f) in bad for f in given):
                raise ValueError(f"{key}: none of its {len(given)} file(s) is UTF-8 text")
        files, val_files = [f for f in files if str(f) not in bad], [f for f in val_files if str(f) not in bad]
    ranges = docs.text_documents(files, val_files, cfg.val_fraction)
    total = sum(end - start for split in SPLITS for _, start, end in ranges[split])
    with bar(show, total, "B", f"tokenizing {len(files) + len(val_files)} file(s)") as b:
        for split in SPLITS:
            for path, start, end in ranges[split]:
                for pieces in docs.read_pieces(path, start, end, b, cuts=tok.kind != BYTES):  # bytes: no cut
                    writers[split].write(tok.encode_pieces(pieces, where=f"files: {str(path)!r}"))
                if eos is not None:
                    writers[split].write(eos)
    return {"files": len(files) + len(val_files), "excluded": n_excluded, "skipped": skipped}


def tokenize_dataset(
    cfg: CorpusConfig, tok: TextTokenizer, writers: dict[str, TokenWriter], eos: Any, show: bool, hf_cache: Path
) -> dict[str, Any]:
    """Tokenize the rows of an ``hf_dataset`` corpus (datasets' arrow copy of files goes to ``hf_cache``, removed
    when done: the token files are what the cache keeps)."""
    try:
        rows = docs.dataset_rows(cfg, hf_cache)
        total = sum(end - start for _, start, end in rows.values())
        with bar(show, total, "rows", f"tokenizing {total} rows") as b:
            for split in SPLITS:
                ds, start, end = rows[split]
                for texts in docs.row_batches(ds, start, end, cfg.text_column, b):
                    parts = []
                    for ids in tok.encode(texts):
                        parts.append(ids)
                        if eos is not None:
                            parts.append(eos)
                    if parts:
                        writers[split].write(np.concatenate(parts))
        return {"rows": total}
    finally:
        shutil.rmtree(hf_cache, ignore_errors=True)
