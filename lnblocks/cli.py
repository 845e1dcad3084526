"""The ``lnblocks`` command: argument parsing only; every subcommand calls into its package lazily."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _cmd_demo(args: argparse.Namespace) -> int:
    from lnblocks.demo import main as demo_main

    return demo_main()


def _cmd_parity(args: argparse.Namespace) -> int:
    from lnblocks.parity import print_parity_table

    return print_parity_table()


def _cmd_patch_check(args: argparse.Namespace) -> int:
    from lnblocks.hf.check import patch_check

    return patch_check(args.model_dir, backend=args.backend)


def _cmd_study_run(args: argparse.Namespace) -> int:
    from lnblocks.study.runner import run_study

    return run_study(args.config, args.out, workers=args.workers)


def _cmd_study_report(args: argparse.Namespace) -> int:
    from lnblocks.study.report import build_report

    return build_report(args.out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lnblocks", description="Normalization for Transformers.")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("demo", help="the library's main job (what `make demo` runs)").set_defaults(func=_cmd_demo)
    sub.add_parser("parity", help="print the norm parity table against torch and HF").set_defaults(func=_cmd_parity)

    check = sub.add_parser("patch-check", help="patch a local HF model folder's norms and compare with the original")
    check.add_argument("model_dir", help="a local folder holding an HF model (config.json + weights)")
    check.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"])
    check.set_defaults(func=_cmd_patch_check)

    study = sub.add_parser("study", help="Pre/Post-LN stability studies").add_subparsers(dest="study", required=True)
    run = study.add_parser("run", help="run a study grid (skips finished runs) and build its report")
    run.add_argument("config", help="a study YAML config (see configs/)")
    run.add_argument("--out", required=True, help="output folder: runs/, summary.csv, plots, report.md")
    run.add_argument("--workers", type=int, default=1, help="parallel worker processes (default 1)")
    run.set_defaults(func=_cmd_study_run)
    report = study.add_parser("report", help="rebuild summary.csv, plots and report.md from OUT/runs")
    report.add_argument("out", help="a study output folder")
    report.set_defaults(func=_cmd_study_report)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
