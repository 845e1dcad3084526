"""The benchmarks, one folder per area of lnblocks (norms, kernels, models, hf, study) and their shared helpers in
``benchmarks.common``; each script runs as ``python benchmarks/<area>/<script>.py`` from the repository root."""
