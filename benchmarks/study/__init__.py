"""Benchmarks of lnblocks' study (numbers in README.md next to this file)."""
