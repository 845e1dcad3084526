"""The tokens an ``lm`` run trains on: the source interface every source meets (``source``), the built-in sources and
``lnblocks data prepare`` (``builtin``), and the user's own corpus (``corpus``). Imports neither ``run`` nor ``report``.
"""
