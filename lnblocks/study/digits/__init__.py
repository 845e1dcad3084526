"""The CNN small-batch study (task ``cnn_digits``): thirteen norm arms on scikit-learn's bundled digits across batch
sizes and seeds, testing what their papers claim about batch-size dependence at toy scale (Wu & He 2018 and
others). ``task``: the task and its study files; ``config``: the settings and the grid; ``arms``: each arm's CNN
block; ``train``: one run; ``result``: what a run records; ``claims``: the papers' claims and their verdicts;
``report``: tables, plot and ``report.md`` from the records."""
