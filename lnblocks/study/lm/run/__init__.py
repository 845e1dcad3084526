"""One ``lm`` run as it trains: the loop (``train``), the optimizer, LR schedule and precision (``optim``), what a
checkpoint holds of the loop (``loop_state``), what the run measures (``diagnostics``, ``stability``) and logs
(``curves``), sharding (``sharding``), and the record it returns (``record``).
"""
