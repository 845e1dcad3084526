"""Alias kept for ``python -m lnblocks.cnn.digits_study``: the CNN small-batch study now runs on the study runner
(``lnblocks study run configs/cnn_digits.yaml --out DIR``; see ``lnblocks.study.digits``). Nothing in the library
imports this module."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from lnblocks.study.digits import legacy_main

    return legacy_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
