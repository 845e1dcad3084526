"""``lnblocks.study.lm.corpus``: the user's-own-corpus API under its public name (``CorpusConfig``,
``prepare_corpus``, ``open_corpus``, ``corpus_digest``, ...). It lives in ``lnblocks.study.lm.data.corpus``."""

from lnblocks.study.lm.data.corpus import (
    CORPUS_FORMAT,
    CORPUS_SOURCES,
    CorpusConfig,
    CorpusSummary,
    TextTokenizer,
    TokenFileSource,
    corpus_digest,
    count_tokens,
    default_cache_dir,
    open_corpus,
    prepare_corpus,
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
