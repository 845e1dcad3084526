"""The ``lnblocks`` command: argument parsing only; every subcommand calls into its package lazily.

A user error (a bad config value, a missing file, a missing optional package, an unreadable record) prints one line
``lnblocks: error: ...`` on stderr and exits with status 2; ``--debug`` (or ``LNBLOCKS_DEBUG=1``) shows the traceback
instead. Other exit statuses are the subcommand's: ``study run`` 1 when a run failed, ``patch-check`` 1 when the
patched model's outputs differ.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

USER_ERRORS = (ValueError, TypeError, OSError, ImportError)
EXIT_USER_ERROR = 2
SET_HELP = (
    "override a config key before validation (repeatable), e.g. --set train.steps=2 --set model.dim=32; "
    "a grid axis takes a list (--set train.lr=[1e-3]); values are read as YAML"
)


def _cmd_demo(args: argparse.Namespace) -> int:
    from lnblocks.demo import main as demo_main

    return demo_main()


def _cmd_parity(args: argparse.Namespace) -> int:
    from lnblocks.parity import print_parity_table

    return print_parity_table()


def _cmd_patch_check(args: argparse.Namespace) -> int:
    from lnblocks.hf.check import patch_check

    return patch_check(args.model_dir, backend=args.backend)


def _overrides(pairs: list[str] | None) -> dict[str, object]:
    """``--set key=value`` pairs -> ``{dotted key: value}``, values read as YAML (``1e-3``, ``[pre, post]``)."""
    from lnblocks.study.core.studyfile import parse_value

    out: dict[str, object] = {}
    for pair in pairs or []:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set takes key=value (e.g. --set train.steps=2), got {pair!r}")
        key = key.strip()
        if key in out:
            raise ValueError(f"--set {key} is given twice")
        out[key] = parse_value(text, where=f"--set {key}")
    return out


def _cmd_study_run(args: argparse.Namespace) -> int:
    from lnblocks.study.core.runner import run_study

    return run_study(
        args.config,
        args.out,
        workers=args.workers,
        overrides=_overrides(args.set),
        executor=args.executor,
        ray_address=args.ray_address,
    )


def _cmd_data_prepare(args: argparse.Namespace) -> int:
    from lnblocks.study.lm.data.builtin import data_prepare_command

    return data_prepare_command(args.config, _overrides(args.set))


def _cmd_data_clean(args: argparse.Namespace) -> int:
    from lnblocks.study.lm.data.corpus.evict import clean_command

    return clean_command(args.cache_dir, args.keep, args.all)


def _cmd_study_report(args: argparse.Namespace) -> int:
    from lnblocks.study.core.executors import make_executor
    from lnblocks.study.core.report import build_report

    return build_report(args.out, open_executor=lambda n: make_executor(min(args.workers, max(n, 1))))


def _cmd_study_clean(args: argparse.Namespace) -> int:
    from lnblocks.study.core.outdir import clean_study

    return clean_study(args.out, remove=args.remove)


def _workers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback of an error"
    )
    parser = argparse.ArgumentParser(prog="lnblocks", description="Normalization for Transformers.", parents=[debug])
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("demo", parents=[debug], help="the library's main job (what `make demo` runs)").set_defaults(
        func=_cmd_demo
    )
    sub.add_parser("parity", parents=[debug], help="print the norm parity table against torch and HF").set_defaults(
        func=_cmd_parity
    )

    check = sub.add_parser(
        "patch-check", parents=[debug], help="patch a local HF model folder's norms and compare with the original"
    )
    check.add_argument("model_dir", help="a local folder holding an HF model (config.json + weights)")
    check.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"])
    check.set_defaults(func=_cmd_patch_check)

    _add_study_commands(sub, debug)
    _add_data_commands(sub, debug)
    return parser


def _add_study_commands(sub: Any, debug: argparse.ArgumentParser) -> None:
    """``lnblocks study run | report | clean``."""
    study = sub.add_parser("study", parents=[debug], help="experiments: the Pre/Post-LN study, the CNN digits study")
    study_sub = study.add_subparsers(dest="study", required=True)
    run = study_sub.add_parser("run", parents=[debug], help="run a study grid (skips finished runs) and its report")
    run.add_argument("config", help="a study YAML config (see configs/): task lm or cnn_digits")
    run.add_argument("--out", required=True, help="output folder: study.json, runs/, report files")
    run.add_argument(
        "--workers", type=_workers, default=1, help="parallel worker processes of --executor local (default 1)"
    )
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help=SET_HELP)
    run.add_argument(
        "--executor",
        choices=["local", "ray", "torchrun"],
        default="local",
        help="local: this machine (--workers processes); ray: one Ray task per run (pip install 'lnblocks[ray]'); "
        "torchrun: every run with DDP over the ranks (what local means when launched by torchrun)",
    )
    run.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="a running Ray cluster (HEAD:6379, or auto); default: start a local Ray instance",
    )
    run.set_defaults(func=_cmd_study_run)
    report = study_sub.add_parser("report", parents=[debug], help="rebuild the report of OUT from its records")
    report.add_argument("out", help="a study output folder")
    report.add_argument(
        "--workers", type=_workers, default=1, help="worker processes for the init profiles it measures (default 1)"
    )
    report.set_defaults(func=_cmd_study_report)
    tidy = study_sub.add_parser(
        "clean",
        parents=[debug],
        help="list the checkpoints of runs that are no runs of the study in OUT now (left by a config changed "
        "between a kill and its resume); --remove deletes them",
    )
    tidy.add_argument("out", help="a study output folder")
    tidy.add_argument("--remove", action="store_true", help="delete them (refused while a runner uses OUT)")
    tidy.set_defaults(func=_cmd_study_clean)


def _add_data_commands(sub: Any, debug: argparse.ArgumentParser) -> None:
    """``lnblocks data prepare | clean``."""
    data = sub.add_parser("data", parents=[debug], help="the data of a study: tokenize a corpus once")
    data_sub = data.add_subparsers(dest="data", required=True)
    prep = data_sub.add_parser(
        "prepare",
        parents=[debug],
        help="tokenize (or check) the corpus of a study file; print its tokens, vocabulary and reference losses",
    )
    prep.add_argument("config", help="a study YAML config whose data section names a corpus")
    prep.add_argument("--set", action="append", metavar="KEY=VALUE", help=SET_HELP)
    prep.set_defaults(func=_cmd_data_prepare)
    clean = data_sub.add_parser(
        "clean",
        parents=[debug],
        help="remove prepared corpora from the cache (never one in use); by default keep $LNBLOCKS_CORPUS_KEEP (8)",
    )
    clean.add_argument("--keep", metavar="N", default=None, help="keep the N most recently used corpora")
    clean.add_argument("--all", action="store_true", help="remove every corpus not in use")
    clean.add_argument("--cache-dir", default=None, metavar="DIR", help="a data.cache_dir (default: the default cache)")
    clean.set_defaults(func=_cmd_data_clean)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, FileNotFoundError) and err.filename and str(err.filename) not in text:
        text = f"{text}: {err.filename}"
    return text


def _say(line: str) -> None:
    """``line`` on stderr in one write (``print`` makes two: the text, then the newline), so the lines of several
    processes sharing a stderr (the ranks of a torchrun job) never run into each other."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    debug = getattr(args, "debug", False) or os.environ.get("LNBLOCKS_DEBUG", "") not in ("", "0")
    if debug:
        return int(args.func(args) or 0)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        _say("lnblocks: interrupted")
        return 130
    except USER_ERRORS as err:
        _say(f"lnblocks: error: {_one_line(err)}")
        return EXIT_USER_ERROR
    except Exception as err:  # a bug: still one line, the traceback is one flag away
        _say(
            f"lnblocks: internal error ({type(err).__name__}): {_one_line(err)} "
            "(rerun with --debug or LNBLOCKS_DEBUG=1 for the traceback)"
        )
        return 1


def run() -> NoReturn:
    """The ``lnblocks`` command (and ``python -m lnblocks.cli``): ``main``'s status becomes the exit status, and a
    torchrun rank that succeeded ends without interpreter finalization, where gloo can abort a process that finished
    its work (``lnblocks.process_exit.exit_rank``)."""
    code = main()
    from lnblocks.process_exit import exit_rank

    exit_rank(code)


if __name__ == "__main__":
    run()
