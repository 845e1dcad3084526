# ruff: noqa: E402  (numpy is checked before the submodules that import it)
"""The user's own corpus for studies: nanoGPT-format token files read through ``numpy.memmap``, or local text files
and ``datasets`` datasets tokenized once (local HF tokenizer or bytes) into that format in a cache folder.

``CorpusConfig`` describes a corpus (the ``data`` section keys of the ``tokens``, ``text`` and ``hf_dataset``
sources), ``prepare_corpus(cfg)`` tokenizes/checks it and returns a ``CorpusSummary`` (tokens, vocabulary, reference
losses), ``open_corpus(cfg, seq_len=..., batch_size=...)`` gives the ``TokenFileSource`` a run trains on, and
``corpus_digest(cfg)`` the digest of the prepared tokens that a run's id includes (``data.corpus``).
What a corpus must pass before it is trusted or trained on is in ``verify``; the cache's bound and ``lnblocks data
clean`` in ``evict``.
"""

from lnblocks._optional import require

require("numpy")  # first, so that a plain install (no study extra) is told which extra to install
from lnblocks.study.lm.data.corpus.config import CORPUS_SOURCES, CorpusConfig, default_cache_dir
from lnblocks.study.lm.data.corpus.prepare import (
    CORPUS_FORMAT,
    CorpusSummary,
    corpus_digest,
    open_corpus,
    prepare_corpus,
)
from lnblocks.study.lm.data.corpus.tokenizer import TextTokenizer
from lnblocks.study.lm.data.corpus.tokens import (
    TokenFileSource,
    count_tokens,
    reference_from_counts,
    reference_losses,
    unigram_from_counts,
)

__all__ = [
    "CORPUS_FORMAT",
    "CORPUS_SOURCES",
    "CorpusConfig",
    "CorpusSummary",
    "TextTokenizer",
    "TokenFileSource",
    "corpus_digest",
    "count_tokens",
    "default_cache_dir",
    "open_corpus",
    "prepare_corpus",
    "reference_from_counts",
    "reference_losses",
    "unigram_from_counts",
]
