"""Benchmarks of lnblocks' norms (numbers in README.md next to this file)."""
