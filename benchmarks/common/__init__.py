"""Helpers the benchmarks share: the clock (CUDA events with an L2 flush, or perf_counter), peak memory and the
environment a number was measured in."""
