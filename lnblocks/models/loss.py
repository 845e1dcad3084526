"""The old path of ``lnblocks.models.lm_head`` (the LM head and its cross-entropy in chunks), kept for code that
imports it. It is that very module, not a copy: setting a threshold here (``SINGLE_CHUNK_ELEMENTS``) sets it there."""

import sys

from lnblocks.models import lm_head

sys.modules[__name__] = lm_head
