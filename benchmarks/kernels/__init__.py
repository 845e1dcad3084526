"""Benchmarks of lnblocks' kernels (numbers in README.md next to this file)."""
