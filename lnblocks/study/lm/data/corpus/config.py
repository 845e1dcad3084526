"""``CorpusConfig``: where a study's tokens come from when they are the user's own corpus.

Three sources (the ``data.source`` values of a study file):

- ``tokens``: nanoGPT-format token files, a flat array of token ids with no header (``train_path``, ``val_path``,
  ``token_dtype``, ``vocab_size``);
- ``text``: local text files or globs (``files``, minus those ``exclude`` matches; held-out text from ``val_files``
  or the tail ``val_fraction`` of every file) tokenized with ``tokenizer`` (a local HF tokenizer folder or
  ``tokenizer.json``, or ``"bytes"``); every file is checked to be UTF-8 before any is tokenized, and
  ``skip_undecodable`` leaves out (and counts) those that are not;
- ``hf_dataset``: a ``datasets`` dataset saved with ``save_to_disk``, or local json/jsonl/csv/txt/parquet files,
  read through ``text_column`` (held-out rows from ``val_split`` or the last ``val_fraction`` of the rows).

``text`` and ``hf_dataset`` are tokenized once into the ``tokens`` format under ``cache_dir`` (which also keeps the
reference losses counted over ``tokens`` files). Paths are checked
when the config is built, so a typo fails before any run starts, with the dotted key in the message; so are train
and held-out data that are the same (the same token file twice, ``split == val_split``, a file in both ``files`` and
``val_files``).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lnblocks.config import (
    Config,
    ConfigTypeError,
    ConfigValueError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_str,
)

CORPUS_SOURCES = ("tokens", "text", "hf_dataset")
TOKEN_DTYPES = ("uint16", "uint32")
DATASET_FORMATS = ("disk", "json", "csv", "text", "parquet")
_FORMAT_BY_SUFFIX = {".json": "json", ".jsonl": "json", ".csv": "csv", ".txt": "text", ".parquet": "parquet"}

# Which fields belong to which source: a field set away from its default under another source is an error.
_ONLY_FOR = {
    "train_path": "tokens",
    "val_path": "tokens",
    "token_dtype": "tokens",
    "files": "text",
    "val_files": "text",
    "exclude": "text",
    "skip_undecodable": "text",
    "dataset": "hf_dataset",
    "dataset_format": "hf_dataset",
    "split": "hf_dataset",
    "val_split": "hf_dataset",
    "text_column": "hf_dataset",
}
_TOKENIZED = ("text", "hf_dataset")  # sources that use tokenizer, eos_token, val_fraction
# A vocab_size more than this many times the ids the data can hold is refused unless allow_unused_vocab is set.
UNUSED_VOCAB_RATIO = 4


def _file_id(path: str) -> tuple[int, int] | None:
    """``(device, inode)`` of a regular file (one ``stat``: the same file by any path, link or symlink), else None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


def _folders(base: str) -> Iterator[str]:
    """``base`` and every folder under it that is not hidden, symlinked folders followed, but each folder (its
    ``(device, inode)``) once. Walked depth first with sibling folders in the order of ``name + "/"``, which visits
    paths in sorted order, so a folder is reached first by the path that sorts first: the one Python's glob listed
    first, which ``expand_patterns`` kept. A symlink loop (``ln -s .. up``) or a folder linked twice then ends the
    walk instead of repeating it forever."""
    seen: set[tuple[int, int]] = set()
    stack = [base]
    while stack:
        folder = stack.pop()
        try:
            st = os.stat(folder or os.curdir)
            names = os.listdir(folder or os.curdir)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        yield folder
        subs = sorted((n for n in names if not n.startswith(".")), key=lambda n: n + os.sep)
        stack.extend(reversed([d for d in (os.path.join(folder, n) for n in subs) if os.path.isdir(d)]))


def _glob(pattern: str) -> list[str]:
    """``glob.glob(pattern, recursive=True)`` (``**``: this folder and every folder under it, hidden ones left out)
    with each folder a ``**`` reaches walked once (``_folders``): Python's glob follows symlinked folders with no
    guard, so a symlink loop made it expand forever."""
    parts = pattern.split(os.sep)
    if "**" not in parts:
        return glob.glob(pattern)  # no recursion: a symlink loop cannot repeat
    i = parts.index("**")
    head = os.sep.join(parts[:i]) or (os.sep if pattern.startswith(os.sep) else "")
    tail = parts[i + 1 :] or ["*"]  # a trailing ** matches everything under the folders
    bases = glob.glob(head) if glob.has_magic(head) else [head]
    out = []
    for base in bases:
        if base and not os.path.isdir(base):
            continue
        for folder in _folders(base):
            out += _glob(os.path.join(glob.escape(folder), *tail))
    return out


def _matches(pattern: str) -> list[str]:
    expanded = os.path.expanduser(pattern)
    return sorted(_glob(expanded)) if glob.has_magic(expanded) else [expanded]


def expand_patterns(key: str, patterns: tuple[str, ...]) -> list[Path]:
    """Files matched by ``patterns`` (paths or globs, ``~`` expanded), in order, each once; a pattern that matches
    no file raises ``ConfigValueError`` naming ``key[i]``."""
    out: list[Path] = []
    seen: set[tuple[int, int]] = set()
    for i, pattern in enumerate(patterns):
        found = [(m, _file_id(m)) for m in _matches(pattern)]
        files = [(m, fid) for m, fid in found if fid is not None]
        if not files:
            what = "matches no file" if glob.has_magic(os.path.expanduser(pattern)) else "is not an existing file"
            raise ConfigValueError(f"{key}[{i}]", f"{what}: {pattern!r}")
        for m, fid in files:
            if fid not in seen:
                seen.add(fid)
                out.append(Path(m))
    return out


def excluded(files: list[Path], exclude: tuple[str, ...]) -> tuple[list[Path], list[Path]]:
    """``(kept, left out)``: ``files`` split by the ``exclude`` paths/globs (expanded like ``files``; a folder leaves
    out every file under it, by any path: through a symlink to the folder, or a folder named through a symlink). A
    pattern that matches nothing is not an error (it may match on another machine)."""
    if not exclude:
        return files, []
    hit: set[tuple[int, int] | None] = set()
    folders: set[str] = set()
    for pattern in exclude:
        for m in _matches(pattern):
            if os.path.isdir(m):
                folders |= {os.path.join(os.path.abspath(m), ""), os.path.join(os.path.realpath(m), "")}
            else:
                hit.add(_file_id(m))
    hit.discard(None)
    under = tuple(folders)
    kept: list[Path] = []
    out: list[Path] = []
    for f in files:
        # a file is under a left-out folder by the path it was found at or by where it really is (a symlinked
        # folder on either side: files reached through a link to the folder, or the folder named by a link)
        places = (os.path.abspath(f), os.path.realpath(f))
        gone = (under and any(p.startswith(under) for p in places)) or (hit and _file_id(str(f)) in hit)
        (out if gone else kept).append(f)
    return kept, out


def text_files(cfg: CorpusConfig) -> tuple[list[Path], list[Path], int]:
    """``(files, val_files, how many exclude left out)`` of a ``text`` corpus: the patterns expanded, ``exclude``
    applied; ``ConfigValueError`` when nothing is left of ``files`` / ``val_files`` or a file is in both."""
    out: dict[str, list[Path]] = {"files": [], "val_files": []}
    n_excluded = 0
    for key in ("files", "val_files") if cfg.val_files else ("files",):
        out[key], dropped = excluded(expand_patterns(key, getattr(cfg, key)), cfg.exclude)
        n_excluded += len(dropped)
        if not out[key]:
            raise ConfigValueError(key, f"every file it matches is left out by exclude ({len(dropped)} file(s))")
    train = {_file_id(str(f)) for f in out["files"]}
    both = sorted(str(f) for f in out["val_files"] if _file_id(str(f)) in train)
    if both:
        raise ConfigValueError("val_files", f"{both[0]!r} is also in files (train and val overlap)")
    return out["files"], out["val_files"], n_excluded


def default_cache_dir() -> Path:
    """``$LNBLOCKS_CACHE``, else ``$XDG_CACHE_HOME/lnblocks``, else ``~/.cache/lnblocks``; corpora go in ``corpus/``."""
    root = os.environ.get("LNBLOCKS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lnblocks"
    )
    return Path(root) / "corpus"


def infer_dataset_format(path: str) -> str:
    """``disk`` for a folder (``save_to_disk``), else the ``load_dataset`` builder of the file suffix."""
    expanded = os.path.expanduser(path)
    if not glob.has_magic(expanded) and Path(expanded).is_dir():
        return "disk"
    suffix = Path(expanded).suffix.lower()
    if suffix not in _FORMAT_BY_SUFFIX:
        raise ConfigValueError(
            "dataset_format",
            f"cannot be inferred from {path!r}: name a folder written by save_to_disk, or files ending in "
            f"{sorted(_FORMAT_BY_SUFFIX)}, or set dataset_format to one of {list(DATASET_FORMATS)}",
        )
    return _FORMAT_BY_SUFFIX[suffix]


def _paths(key: str, value: Any) -> tuple[str, ...]:
    """A path or list of paths -> tuple of non-empty strings."""
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, (list, tuple)):
        raise ConfigTypeError(key, f"must be a path or a list of paths, got {type(value).__name__} {value!r}")
    return tuple(check_str(f"{key}[{i}]", v) for i, v in enumerate(value))


@dataclass(frozen=True, kw_only=True)
class CorpusFields:
    """The keys that locate and tokenize the user's corpus, written once for the two configs that hold them: a
    study's ``data`` section (``lnblocks.study.lm.config.DataConfig``) and ``CorpusConfig``, which adds ``source``,
    ``vocab_size`` and ``val_fraction`` and validates them all. Fields and defaults only: ``CorpusConfig`` checks
    them (``DataConfig`` builds a ``CorpusConfig`` to do so)."""

    # tokens
    train_path: str | None = None
    val_path: str | None = None
    token_dtype: str = "uint16"
    # text
    files: tuple[str, ...] = ()
    val_files: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    skip_undecodable: bool = False
    # hf_dataset
    dataset: str | None = None
    dataset_format: str | None = None
    split: str = "train"
    val_split: str | None = None
    text_column: str = "text"
    # text and hf_dataset
    tokenizer: str = "bytes"
    eos_token: str | None = None
    cache_dir: str | None = None
    allow_unused_vocab: bool = False

    def corpus_fields(self) -> dict[str, Any]:
        """The values of the corpus keys (``CORPUS_KEYS``)."""
        return {name: getattr(self, name) for name in CORPUS_KEYS}


CORPUS_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(CorpusFields))


@dataclass(frozen=True, kw_only=True)
class CorpusConfig(CorpusFields, Config):
    """The user's corpus (see the module docstring for the three sources): the corpus keys (``CorpusFields``) plus
    ``source``, ``vocab_size`` and ``val_fraction``.

    ``vocab_size``: required for ``tokens``; for ``text``/``hf_dataset`` it comes from the tokenizer (256 for
    ``bytes``), and a value given here must be at least that (a model may have spare rows). ``eos_token``: a token
    of the tokenizer appended after every document (file or row), e.g. ``"<|endoftext|>"`` or ``"[SEP]"``; for
    ``bytes`` a one-byte string such as ``"\\n"``.

    ``exclude`` (text): paths or globs of files to leave out of ``files`` and ``val_files``. ``skip_undecodable``
    (text): leave out the files that are not UTF-8 (they are counted and named in the corpus description) instead of
    refusing the corpus; no effect with ``tokenizer: bytes``, which never decodes. ``allow_unused_vocab``: accept a
    ``vocab_size`` more than ``UNUSED_VOCAB_RATIO`` (4) times the ids the data can hold (``max id + 1`` of the token
    files, the tokenizer's vocabulary for text/hf_dataset); refused otherwise, as a typo that would allocate an
    embedding of mostly unused rows and move the uniform reference ln V.
    """

    source: str = "tokens"
    vocab_size: int | None = None
    val_fraction: float = 0.1

    def __post_init__(self) -> None:
        check_choice("source", self.source, CORPUS_SOURCES)
        self._set("files", _paths("files", self.files))
        self._set("val_files", _paths("val_files", self.val_files))
        self._set("exclude", _paths("exclude", self.exclude))
        check_bool("skip_undecodable", self.skip_undecodable)
        check_bool("allow_unused_vocab", self.allow_unused_vocab)
        self._set("vocab_size", check_int("vocab_size", self.vocab_size, minimum=2, allow_none=True))
        check_choice("token_dtype", self.token_dtype, TOKEN_DTYPES)
        self._set("val_fraction", check_float("val_fraction", self.val_fraction, lo=0.0, hi=0.5, lo_open=True))
        for name in ("split", "text_column", "tokenizer"):
            check_str(name, getattr(self, name))
        for name in ("train_path", "val_path", "dataset", "val_split", "cache_dir"):
            check_str(name, getattr(self, name), allow_none=True)
        if self.eos_token is not None:
            check_str("eos_token", self.eos_token)
        check_choice("dataset_format", self.dataset_format, DATASET_FORMATS, allow_none=True)
        self._check_fields_belong_to_source()
        {"tokens": self._check_tokens, "text": self._check_text, "hf_dataset": self._check_dataset}[self.source]()

    def _check_fields_belong_to_source(self) -> None:
        defaults = CorpusConfig.__dataclass_fields__
        for name, owner in _ONLY_FOR.items():
            if owner != self.source and getattr(self, name) != defaults[name].default:
                raise ConfigValueError(name, f"is only used with source {owner!r}, not {self.source!r}")
        if self.source not in _TOKENIZED:
            for name in ("tokenizer", "eos_token", "val_fraction"):
                if getattr(self, name) != defaults[name].default:
                    raise ConfigValueError(name, f"is only used with sources {list(_TOKENIZED)}, not 'tokens'")

    def _check_tokens(self) -> None:
        for name in ("train_path", "val_path"):
            path = getattr(self, name)
            if path is None:
                raise ConfigValueError(name, "is required for source 'tokens' (a nanoGPT-format .bin file)")
            if not Path(os.path.expanduser(path)).is_file():
                raise ConfigValueError(name, f"is not an existing file: {path!r}")
        if self.vocab_size is None:
            raise ConfigValueError("vocab_size", "is required for source 'tokens' (token files carry no header)")
        train, val = (Path(os.path.expanduser(p)) for p in (self.train_path, self.val_path))  # type: ignore[arg-type]
        if os.path.samefile(train, val):
            raise ConfigValueError(
                "val_path", f"is the same file as train_path ({str(val)!r}): held-out data must not be trained on"
            )
        if self.token_dtype == "uint16" and self.vocab_size > 2**16:
            raise ConfigValueError(
                "token_dtype", f"uint16 cannot hold the ids of vocab_size {self.vocab_size}; use uint32"
            )

    def _check_tokenizer(self) -> None:
        if self.tokenizer == "bytes":
            return
        path = Path(os.path.expanduser(self.tokenizer))
        if not path.exists():
            raise ConfigValueError(
                "tokenizer", f"must be 'bytes' or a local tokenizer folder or tokenizer.json file: {self.tokenizer!r}"
            )

    def _check_text(self) -> None:
        if not self.files:
            raise ConfigValueError("files", "is required for source 'text' (paths or globs of text files)")
        text_files(self)
        self._check_tokenizer()

    def _check_dataset(self) -> None:
        if self.dataset is None:
            raise ConfigValueError("dataset", "is required for source 'hf_dataset' (a save_to_disk folder or files)")
        fmt = self.dataset_format or infer_dataset_format(self.dataset)
        if fmt == "disk":
            if not Path(os.path.expanduser(self.dataset)).is_dir():
                raise ConfigValueError("dataset", f"is not a folder written by save_to_disk: {self.dataset!r}")
        else:
            expand_patterns("dataset", (self.dataset,))
            if self.val_split is not None:
                raise ConfigValueError("val_split", "names a split of a save_to_disk DatasetDict; not for files")
        if self.val_split == self.split:
            raise ConfigValueError(
                "val_split",
                f"is the split trained on ({self.split!r}, the key split): name another split, or leave val_split "
                "unset to hold out the last val_fraction of the rows",
            )
        self._check_tokenizer()

    # ---- derived ---------------------------------------------------------------------------------------------
    @property
    def resolved_format(self) -> str | None:
        """The dataset format actually used (``dataset_format`` or the one inferred from ``dataset``)."""
        if self.source != "hf_dataset":
            return None
        return self.dataset_format or infer_dataset_format(self.dataset or "")

    @property
    def resolved_cache_dir(self) -> Path:
        return Path(os.path.expanduser(self.cache_dir)) if self.cache_dir else default_cache_dir()
