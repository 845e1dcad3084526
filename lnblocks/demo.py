"""What ``make demo`` runs: for now the norm parity table (the stability study replaces it as the main job)."""

from __future__ import annotations

from lnblocks.parity import print_parity_table


def main() -> int:
    print("lnblocks demo: every norm variant against the implementation it must equal\n")
    return print_parity_table()
