"""The language-model norm-placement study (task ``lm``): Pre-LN vs Post-LN and the other placements of
``lnblocks.blocks`` at CPU scale (Xiong et al. 2020, arXiv 2002.04745; Wortsman et al. 2023, arXiv 2309.14322).

``task``: the task (its run type, corpus preparation, outcome line); ``config`` / ``model_config``: a run's typed
config; ``result``: what a run records. Three rooms with one-way imports: ``data`` (the tokens a run trains on: the
built-in sources and the user's corpus), ``run`` (one run: the loop, the optimizer and precision, diagnostics,
curves, sharding, the record) and ``report`` (the numbers, claims, plots and ``report.md`` of a study, from its
records). ``data`` imports neither other room; ``report`` reaches ``run`` only through its init profiles.
``corpus``: the corpus API under its public name."""
