"""The results committed under ``docs/results/``: what a study's claims are computed from, kept small enough to
version, and the README's verdict tables generated from them (never typed by hand).

``docs/results/<study>/`` holds a study's ``summary.csv`` (one row per run), ``init_profiles.json`` (the per-seed
init gradient profiles of W_2 and the init residual RMS), and the ``report.md`` and ``findings.json`` its report
wrote. ``claims(folder)`` recomputes the claims from the first two; the README holds one marker block per study::

    <!-- claims:placements -->
    | id | claim | ... |
    <!-- /claims:placements -->

    python -m lnblocks.study.lm.docs_results export runs/placements docs/results/placements  # after a study run
    python -m lnblocks.study.lm.docs_results readme README.md                                # refresh every block
    python -m lnblocks.study.lm.docs_results readme README.md --check                        # exit 1 if one is stale
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

from lnblocks.study.core.atomic import write_json_atomic
from lnblocks.study.core.claims import Claim, claims_table
from lnblocks.study.core.records import read_json
from lnblocks.study.lm.analysis import read_summary
from lnblocks.study.lm.findings import study_claims
from lnblocks.study.lm.init_profile import FILE as CACHE_FILE
from lnblocks.study.lm.init_profile import InitProfile

RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results"
PROFILES = "init_profiles.json"
KEEP_GROUPS = ("W_2",)
BLOCK = re.compile(r"(<!-- claims:([\w.-]+) -->\n)(.*?)(<!-- /claims:\2 -->)", re.S)


def export(out_dir: str | Path, dest: str | Path) -> Path:
    """Copy what the claims of the study in ``out_dir`` are computed from (and its report) into ``dest``."""
    out, dest = Path(out_dir), Path(dest)
    if not (out / "summary.csv").is_file():
        raise FileNotFoundError(f"{out / 'summary.csv'} not found: build the report first (lnblocks study report)")
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("summary.csv", "findings.json"):
        if (out / name).is_file():
            shutil.copyfile(out / name, dest / name)
    if (out / "report.md").is_file():  # without the plots, which stay in the study folder
        lines = [line for line in (out / "report.md").read_text().splitlines() if not line.startswith("![")]
        text = "\n".join(lines).replace("## Plots\n", "## Plots\n\nIn the study folder (`plots/`), not committed.")
        (dest / "report.md").write_text(text + "\n")
    profiles = []
    if (out / CACHE_FILE).is_file():
        for e in read_json(out / CACHE_FILE, "init profile cache")["entries"]:
            p = InitProfile.from_dict(e)
            trimmed = {k: v for k, v in p.grad.items() if k in KEEP_GROUPS}
            profiles.append(InitProfile(p.arch, p.depth, p.seeds, trimmed, p.residual_rms, p.batches, p.source))
    write_json_atomic(dest / PROFILES, [p.to_dict() for p in profiles])
    return dest


def load(folder: str | Path) -> tuple[list[dict], list[InitProfile]]:
    """The run rows and init profiles of a results folder."""
    folder = Path(folder)
    rows = read_summary(folder / "summary.csv")
    path = folder / PROFILES
    profiles = [InitProfile.from_dict(d) for d in read_json(path, "init profiles")] if path.is_file() else []
    return rows, profiles


def claims(folder: str | Path) -> list[Claim]:
    """The claims of the study whose results are in ``folder``, recomputed from them."""
    rows, profiles = load(folder)
    return study_claims(rows, profiles)


def render_block(folder: str | Path) -> str:
    """The README block of a results folder: its verdict table."""
    return "\n".join(claims_table(claims(folder))) + "\n"


def update_readme(text: str, root: str | Path = RESULTS) -> str:
    """``text`` with every ``<!-- claims:NAME -->`` block replaced by ``render_block(root / NAME)``."""

    def fill(m: re.Match[str]) -> str:
        return m.group(1) + render_block(Path(root) / m.group(2)) + m.group(4)

    return BLOCK.sub(fill, text)


def readme_blocks(text: str) -> dict[str, str]:
    """``{study name: block content}`` of the README's claims blocks."""
    return {m.group(2): m.group(3) for m in BLOCK.finditer(text)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lnblocks.study.lm.docs_results", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="copy a study's summary, init profiles and report into a results folder")
    ex.add_argument("out_dir")
    ex.add_argument("dest")
    rd = sub.add_parser("readme", help="refresh the README's claims blocks from docs/results")
    rd.add_argument("readme")
    rd.add_argument("--root", default=str(RESULTS))
    rd.add_argument("--check", action="store_true", help="exit 1 if a block differs, change nothing")
    args = ap.parse_args(argv)
    if args.cmd == "export":
        print(export(args.out_dir, args.dest))
        return 0
    path = Path(args.readme)
    text = path.read_text()
    new = update_readme(text, args.root)
    stale = sorted(k for k, v in readme_blocks(new).items() if readme_blocks(text).get(k) != v)
    if args.check:
        if stale:
            print(f"stale claims blocks in {path}: {stale}", file=sys.stderr)
        return 1 if stale else 0
    path.write_text(new)
    print(json.dumps({"updated": stale}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
