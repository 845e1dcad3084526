"""Committed study results: what a study's claims are computed from, kept small enough to version, and the docs'
verdict tables and figures generated from them (never typed or drawn by hand).

``docs/results/<study>/`` holds a study's ``summary.csv`` (one row per run), ``init_profiles.json`` (the per-seed
init gradient profiles of W_2 and the init residual RMS), and the ``report.md`` and ``findings.json`` its report
wrote. ``claims(folder)`` recomputes the claims from the first two. Any page (README.md, docs/*.md) may hold a
marker block per study, refreshed in place::

    <!-- claims:placements -->
    | id | claim | ... |
    <!-- /claims:placements -->

and ``FIGURES`` names the PNGs under ``docs/img/`` drawn from the same folders. Each PNG carries the SHA-256 of the
figure's data (every number, label and title it shows) in its metadata, so a stale one is found without drawing::

    python -m lnblocks.study.lm.report.docs_results export runs/placements docs/results/placements   # after a study run
    python -m lnblocks.study.lm.report.docs_results docs             # refresh every claims block and figure
    python -m lnblocks.study.lm.report.docs_results docs --check     # exit 1 naming what is stale, change nothing
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lnblocks.study.core.atomic import write_json_atomic
from lnblocks.study.core.claims import Claim, claims_table
from lnblocks.study.core.records import read_json
from lnblocks.study.core.stats import mean_interval
from lnblocks.study.lm.report.analysis import capped, lr_label, read_summary
from lnblocks.study.lm.report.findings import study_claims
from lnblocks.study.lm.report.init_profile import FILE as CACHE_FILE
from lnblocks.study.lm.report.init_profile import InitProfile

RESULTS = Path(__file__).resolve().parents[4] / "docs" / "results"
REPO = RESULTS.parents[1]
PROFILES = "init_profiles.json"
KEEP_GROUPS = ("W_2",)
BLOCK = re.compile(r"(<!-- claims:([\w.-]+) -->\n)(.*?)(<!-- /claims:\2 -->)", re.S)
HASH_KEY = "lnblocks-figure-sha256"


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
    """The claims block of a results folder: its verdict table."""
    return "\n".join(claims_table(claims(folder))) + "\n"


def update_blocks(text: str, root: str | Path = RESULTS) -> str:
    """``text`` with every ``<!-- claims:NAME -->`` block replaced by ``render_block(root / NAME)``."""

    def fill(m: re.Match[str]) -> str:
        return m.group(1) + render_block(Path(root) / m.group(2)) + m.group(4)

    return BLOCK.sub(fill, text)


def claims_blocks(text: str) -> dict[str, str]:
    """``{study name: block content}`` of a page's claims blocks."""
    return {m.group(2): m.group(3) for m in BLOCK.finditer(text)}


def doc_pages(repo: str | Path = REPO) -> list[Path]:
    """The pages that may hold claims blocks: README.md, then docs/*.md in name order."""
    repo = Path(repo)
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


# Figures: each a function of one results folder returning the figure as data (plots.draw_figure draws it).
NAMES = {"pre": "Pre-LN", "post": "Post-LN", "deepnorm": "DeepNorm", "sandwich": "Sandwich", "resi_dual": "ResiDual"}
COLORS = {"pre": "tab:blue", "post": "tab:red", "deepnorm": "tab:green"}
PALETTE = ("tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray")


def _color(arch: str, archs: list[str]) -> str:
    others = [a for a in archs if a not in COLORS]
    return COLORS.get(arch) or PALETTE[others.index(arch) % len(PALETTE)]


def _verdicts(found: list[Claim], ids: tuple[str, ...]) -> str:
    """ "<claim> (<id>: <verdict>)" for the claims a figure illustrates, one per line."""
    by_id = {c.id: c for c in found}
    return "\n".join(f"{by_id[i].title} ({i}: {by_id[i].status})" for i in ids if i in by_id)


def _lr_axis(lrs: list[float]) -> dict[str, Any]:
    return {"xscale": "log", "xticks": lrs, "xticklabels": [lr_label(lr) for lr in lrs], "xlabel": "learning rate"}


def loss_vs_lr_figure(rows: list[dict], profiles: list[InitProfile], found: list[Claim]) -> dict[str, Any]:
    """Final eval loss against LR per placement at the study's deepest depth, one panel per warmup."""
    depth = max(r["depth"] for r in rows)
    deep = [r for r in rows if r["depth"] == depth]
    archs = list(dict.fromkeys(r["arch"] for r in deep))
    lrs = sorted({r["lr"] for r in deep})
    panels = []
    for warmup in sorted({r["warmup"] for r in deep}):
        lines = []
        for arch in archs:
            by_lr = {lr: [capped(r["final_loss"], r["initial_loss"]) for r in deep
                          if r["arch"] == arch and r["warmup"] == warmup and r["lr"] == lr] for lr in lrs}  # fmt: skip
            xs = [lr for lr in lrs if by_lr[lr]]
            ys = [sum(by_lr[lr]) / len(by_lr[lr]) for lr in xs]
            lines.append({"x": xs, "y": ys, "color": _color(arch, archs), "label": NAMES.get(arch, arch)})
        plateau = deep[0]["unigram_loss"]
        ys = [y for line in lines for y in line["y"]]
        panels.append({
            "title": f"L = {depth}, " + (f"{warmup} warmup steps" if warmup else "no warmup"),
            "ylabel": "final eval loss, nats (diverged: initial)", **_lr_axis(lrs), "lines": lines,
            "hlines": [{"y": plateau, "label": "unigram plateau: did not train"}],
            "ylim": [min(ys) - 0.1, max(*ys, plateau) + 0.55], "legend": "upper center", "legend_cols": 2,
        })  # fmt: skip
    return {"title": _verdicts(found, ("X6", "D1")), "panels": panels}


def grad_profile_figure(rows: list[dict], profiles: list[InitProfile], found: list[Claim]) -> dict[str, Any]:
    """Xiong et al. 2020 Fig. 3: the expected gradient norm of W_2 by layer at init, Pre- vs Post-LN, per depth,
    as the mean over the init-profile seeds with its 95% t-interval."""
    panels = []
    for depth in sorted({p.depth for p in profiles}):
        lines, bands = [], []
        for p in sorted((p for p in profiles if p.depth == depth and p.arch in ("pre", "post")), key=lambda p: p.arch):
            layers = list(range(1, depth + 1))
            est = [mean_interval([seed[i] for seed in p.w2]) for i in range(depth)]
            color = COLORS[p.arch]
            bands.append({"x": layers, "lo": [e.low for e in est], "hi": [e.high for e in est], "color": color})
            label = f"{NAMES[p.arch]} (mean of {len(p.seeds)} inits, 95% band)"
            lines.append({"x": layers, "y": [e.value for e in est], "color": color, "label": label})
        ticks = list(range(1, depth + 1, max(1, depth // 6)))
        panels.append({
            "title": f"L = {depth}", "xlabel": "layer (1 = nearest the input)", "xticks": ticks,
            "ylabel": "‖∇W₂‖ at init (expected gradient)", "lines": lines, "bands": bands,
            "legend": "upper left",
        })  # fmt: skip
    return {"title": _verdicts(found, ("X1", "X2")), "panels": panels}


def attn_logit_figure(rows: list[dict], profiles: list[InitProfile], found: list[Claim]) -> dict[str, Any]:
    """Wortsman et al. 2023 Fig. 1: the final max attention logit against LR with and without qk-layernorm, one
    line per model size (geometric mean over seeds; each seed a dot). Runs with z-loss are left out."""
    runs = [r for r in rows if not r["z_loss"]]
    lrs = sorted({r["lr"] for r in runs})
    sizes = sorted({(r["dim"], r["depth"]) for r in runs})
    styles = ("-", "--", ":", "-.")
    lines = []
    for qk in (False, True):
        color = "tab:blue" if qk else "tab:red"
        for k, (dim, depth) in enumerate(sizes):
            cell = [r for r in runs if r["qk_norm"] == qk and (r["dim"], r["depth"]) == (dim, depth)]
            if not cell:
                continue
            by_lr = {lr: [r["final_attn_max_logit"] for r in cell if r["lr"] == lr] for lr in lrs}
            xs = [lr for lr in lrs if by_lr[lr]]
            geo = [_geomean(by_lr[lr]) for lr in xs]
            label = f"{'with' if qk else 'without'} qk-layernorm, d={dim}, L={depth}"
            lines.append({"x": xs, "y": geo, "color": color, "ls": styles[k % len(styles)], "label": label})
            seeds = [(lr, v) for lr in xs for v in by_lr[lr]]
            dots = {"x": [s[0] for s in seeds], "y": [s[1] for s in seeds], "ls": "", "ms": 2.5, "alpha": 0.45}
            lines.append({**dots, "color": color})
    steps = max(r["steps_done"] for r in runs)
    panel = {
        "title": f"max attention logit after {steps} steps (Pre-LN; dots: single seeds)", **_lr_axis(lrs),
        "ylabel": "max attention logit (log scale)", "yscale": "log", "lines": lines, "legend": "upper left",
    }  # fmt: skip
    return {"title": _verdicts(found, ("W1", "W2a")), "panels": [panel], "panel_size": (7.2, 4.4)}


# the 2025-26 arms (findings.frontier_arms names), by panel: (arm, legend label or None, color, line style)
FRONTIER_PANELS: tuple[tuple[str, tuple[tuple[str, str | None, str, str], ...]], ...] = (
    ("norms: Adam (solid) and Muon (dashed)", (
        ("pre", "LayerNorm", "tab:blue", "-"), ("pre_rms", "RMSNorm", "tab:green", "-"),
        ("dyt", "DyT", "tab:orange", "-"), ("derf", "Derf", "tab:red", "-"),
        ("derf_a0.3", "Derf, alpha_0 0.3", "tab:purple", "-"),
        ("pre_rms+muon", None, "tab:green", "--"), ("dyt+muon", None, "tab:orange", "--"),
        ("derf+muon", None, "tab:red", "--"), ("derf_a0.3+muon", None, "tab:purple", "--"))),
    ("placements and residual streams", (
        ("pre", "Pre-LN", "tab:blue", "-"), ("post", "Post-LN", "tab:gray", "-"),
        ("hybridnorm", "HybridNorm", "tab:green", "-"), ("siamese", "SiameseNorm", "tab:red", "-"),
        ("ngpt", "nGPT", "tab:olive", "-"), ("hc", "HC (4 streams)", "tab:orange", "-"),
        ("mhc", "mHC", "tab:purple", "-"))),
    ("attention", (
        ("pre", "Pre-LN", "tab:blue", "-"), ("gated", "output gate", "tab:red", "-"),
        ("softcap", "soft-caps", "tab:orange", "-"), ("qk", "QK-norm", "tab:green", "-"),
        ("olmo2", "OLMo 2 recipe", "tab:purple", "-"))),
)  # fmt: skip


def frontier_figure(rows: list[dict], profiles: list[InitProfile], found: list[Claim]) -> dict[str, Any]:
    """The 2025-26 arms' final eval loss against LR (mean over seeds; a diverged run counts at its initial loss),
    one panel per group of claims: the norms under Adam and Muon, the placements and residual streams, attention."""
    from lnblocks.study.lm.report.findings.frontier_arms import frontier_arm

    by_arm: dict[str, list[dict]] = {}
    for r in rows:
        by_arm.setdefault(frontier_arm(r) or "", []).append(r)
    plateau = rows[0]["unigram_loss"]
    panels = []
    for title, arms in FRONTIER_PANELS:
        # the LRs of the panel's own arms (the Pre-LN baseline, first, shown at those only)
        lines, lrs = [], sorted({r["lr"] for arm, *_ in arms[1:] for r in by_arm.get(arm, [])})
        for arm, label, color, ls in arms:
            runs = [r for r in by_arm.get(arm, []) if r["lr"] in lrs]
            xs = sorted({r["lr"] for r in runs})
            per_lr = [[capped(r["final_loss"], r["initial_loss"]) for r in runs if r["lr"] == lr] for lr in xs]
            ys = [sum(vals) / len(vals) for vals in per_lr]
            lines.append({"x": xs, "y": ys, "color": color, "ls": ls, "label": label})
        ys = [y for line in lines for y in line["y"]]
        panels.append({
            "title": title, "ylabel": "final eval loss, nats (diverged: initial)", **_lr_axis(lrs), "lines": lines,
            "hlines": [{"y": plateau, "label": "unigram plateau"}], "legend": "upper left", "legend_cols": 2,
            "ylim": [min(ys) - 0.1, max(*ys, plateau) + 0.6],
        })  # fmt: skip
    return {"title": _verdicts(found, ("DF1", "NO1", "HN1", "GA3")), "panels": panels, "panel_size": (4.8, 3.8)}


def _geomean(values: list[float | None]) -> float | None:
    vals = [math.log(v) for v in values if v is not None and v > 0]
    return math.exp(sum(vals) / len(vals)) if vals else None


Figure = Callable[[list[dict], list[InitProfile], list[Claim]], dict[str, Any]]
FIGURES: dict[str, tuple[str, Figure]] = {  # docs/img/<name>.png: (results folder, figure)
    "loss_vs_lr_deepest": ("placements", loss_vs_lr_figure),
    "init_grad_profile": ("xiong2020_quick", grad_profile_figure),
    "attn_logit_vs_lr": ("wortsman2023_quick", attn_logit_figure),
    "frontier_loss_vs_lr": ("frontier_quick", frontier_figure),
}


def figure_spec(name: str, root: str | Path = RESULTS) -> dict[str, Any]:
    """The figure ``name`` of ``FIGURES`` as data, computed from its results folder under ``root``."""
    folder, make = FIGURES[name]
    rows, profiles = load(Path(root) / folder)
    return make(rows, profiles, study_claims(rows, profiles))


def spec_hash(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, ensure_ascii=True).encode()).hexdigest()


def write_figures(img_dir: str | Path, root: str | Path = RESULTS) -> list[Path]:
    """Draw every figure of ``FIGURES`` into ``img_dir`` (its data's hash in the PNG's metadata)."""
    from lnblocks.study.lm.report.plots import draw_figure

    img_dir = Path(img_dir)
    img_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for name in FIGURES:
        spec = figure_spec(name, root)
        out.append(draw_figure(spec, img_dir / f"{name}.png", {HASH_KEY: spec_hash(spec)}))
    return out


def _pixels(path: Path) -> Any:
    from matplotlib import image

    return image.imread(path)


def stale_figures(img_dir: str | Path, root: str | Path = RESULTS, tolerance: float = 0.002) -> list[str]:
    """Names of the figures in ``img_dir`` that are missing, whose recorded data hash differs from what the results
    give now, or whose pixels differ from a fresh drawing in more than ``tolerance`` of them (a font renderer may
    move a few edge pixels; a changed line, label or style moves many)."""
    img_dir, stale = Path(img_dir), []
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.stem: p for p in write_figures(tmp, root)}  # needs matplotlib (and so Pillow), or names its extra
        from PIL import Image

        for name in FIGURES:
            path = img_dir / f"{name}.png"
            if not path.is_file():
                stale.append(name)
                continue
            with Image.open(path) as im:
                recorded = im.text.get(HASH_KEY)
            old, new = _pixels(path), _pixels(fresh[name])
            with Image.open(fresh[name]) as im:
                same_data = recorded == im.text.get(HASH_KEY)
            moved = 1.0 if old.shape != new.shape else float((abs(old - new).max(axis=-1) > 0.1).mean())
            if not same_data or moved > tolerance:
                stale.append(name)
    return stale


def refresh_docs(repo: str | Path = REPO, root: str | Path = RESULTS, check: bool = False) -> list[str]:
    """Refresh every claims block of ``doc_pages(repo)`` and every figure under ``repo/docs/img``; with ``check``
    change nothing. Returns what was (or would be) stale: ``"<page>.md:<block>"`` and ``"docs/img/<figure>.png"``."""
    repo = Path(repo)
    stale = []
    for page in doc_pages(repo):
        if not page.is_file():
            continue
        text = page.read_text()
        new = update_blocks(text, root)
        old_blocks = claims_blocks(text)
        names = sorted(k for k, v in claims_blocks(new).items() if old_blocks.get(k) != v)
        stale += [f"{page.relative_to(repo)}:{k}" for k in names]
        if names and not check:
            page.write_text(new)
    img = repo / "docs" / "img"
    figures = stale_figures(img, root)
    stale += [f"docs/img/{name}.png" for name in figures]
    if figures and not check:
        write_figures(img, root)
    return stale


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m lnblocks.study.lm.report.docs_results", description=__doc__.split("\n\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="copy a study's summary, init profiles and report into a results folder")
    ex.add_argument("out_dir")
    ex.add_argument("dest")
    dc = sub.add_parser("docs", help="refresh the claims blocks of README.md + docs/*.md and docs/img/ figures")
    dc.add_argument("--repo", default=str(REPO), help="the folder holding README.md and docs/")
    dc.add_argument("--root", default=str(RESULTS), help="the committed results folders")
    dc.add_argument("--check", action="store_true", help="exit 1 naming what is stale, change nothing")
    args = ap.parse_args(argv)
    if args.cmd == "export":
        print(export(args.out_dir, args.dest))
        return 0
    stale = refresh_docs(args.repo, args.root, check=args.check)
    if args.check:
        if stale:
            print(f"stale (run python -m lnblocks.study.lm.report.docs_results docs): {stale}", file=sys.stderr)
        return 1 if stale else 0
    print(json.dumps({"updated": stale}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
