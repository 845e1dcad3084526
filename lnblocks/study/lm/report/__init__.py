"""An ``lm`` study's report, from its run records alone: the numbers (``analysis``), the init gradient profiles
(``init_profile``: the only module here that trains, so the only one that imports ``run``), the claims (``findings``),
the plots (``plots``), ``report.md`` and its sections (``markdown``), the files written (``build``), and the results
committed under ``docs/results`` (``docs_results``).
"""
