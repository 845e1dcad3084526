"""Benchmarks of lnblocks' models (numbers in README.md next to this file)."""
