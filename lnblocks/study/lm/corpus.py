"""``lnblocks.study.lm.corpus``: the user's-own-corpus API under its public name (``CorpusConfig``,
``prepare_corpus``, ``open_corpus``, ``corpus_digest``, ...). It is the module ``lnblocks.study.lm.data.corpus``
itself, where the code lives, not a copy of its names."""

import sys

from lnblocks.study.lm.data import corpus

sys.modules[__name__] = corpus
