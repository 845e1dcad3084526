"""The study's core, generic over tasks: study files and ``--set`` overrides (``studyfile``), ``StudyConfig`` and its
grid (``study_config``), run identity (``run_config``), the task interface and registry (``tasks``), the one run loop
(``runner``) over its executors (``executors``: serial and a supervised local pool; ``ray_executor``; ``torchrun``),
the output folder and its locks (``outdir``), run records (``records``), atomic writes (``atomic``), curve writers
(``tracking``), statistics (``stats``), claims and verdicts (``claims``) and the report entry point (``report``).
It imports no task: tasks are registered by module name (``lnblocks/study/__init__.py``)."""
