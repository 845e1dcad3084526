"""Benchmarks of lnblocks' hf (numbers in README.md next to this file)."""
