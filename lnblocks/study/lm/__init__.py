"""The language-model norm-placement study (task ``lm``): Pre-LN vs Post-LN and the other placements of
``lnblocks.blocks`` at CPU scale (Xiong et al. 2020, arXiv 2002.04745; Wortsman et al. 2023, arXiv 2309.14322).

``task``: the task and its study files; ``config`` / ``model_config``: a run's typed config; ``source`` / ``data`` /
``corpus``: the tokens a run trains on; ``train``: one run; ``result``: what a run records; ``diagnostics``,
``curves``: what a run measures and logs; ``analysis``, ``init_profile``, ``findings``: the numbers and claims of
the report; ``plots``, ``report``: the report; ``docs_results``: the results committed under ``docs/results`` and
the README's claims tables."""
