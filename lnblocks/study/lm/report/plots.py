"""PNG plots of a study (matplotlib, Agg backend: no display needed). Every plot reads run records only."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from lnblocks._optional import require
from lnblocks.study.core.atomic import naming
from lnblocks.study.core.records import RunRecord
from lnblocks.study.lm.report.analysis import arch_of, gradient_profile, grouped, lr_label, mean

STYLES = ("-", "--", ":", "-.")


def _plt() -> Any:
    mpl = require("matplotlib")
    mpl.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _colors(archs: list[str]) -> dict[str, Any]:
    cmap = _plt().get_cmap("tab10")
    fixed = {"post": cmap(3), "pre": cmap(0)}
    return {a: fixed.get(a, cmap((i + 4) % 10)) for i, a in enumerate(archs)}


def _axes(n_rows: int, n_cols: int, w: float = 4.0, h: float = 3.0) -> tuple[Any, Any]:
    plt = _plt()
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(w * n_cols, h * n_rows), squeeze=False)
    return fig, axes


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as err:  # a full disk: name the file (write() names none)
        raise naming(err, path) from None
    finally:
        _plt().close(fig)
    return path


def _nan(values: list[float | None]) -> list[float]:
    """Records store non-finite numbers as null: plot them as gaps."""
    return [float("nan") if v is None else v for v in values]


def _top(values: list[float | None]) -> float:
    finite = [v for v in values if v is not None]
    return max(finite) if finite else float("nan")


def _smooth(values: list[float | None], k: int = 10) -> list[float]:
    out, window = [], []
    for v in values:
        window.append(float("nan") if v is None else v)
        window = window[-k:]
        out.append(sum(window) / len(window))
    return out


def grad_profile_plot(records: list[RunRecord], path: Path) -> Path | None:
    """Xiong et al. 2020 Fig. 3 (a, b): init expected-gradient norm of W_2 by layer, one panel per depth."""
    prof = gradient_profile(records)
    if not prof:
        return None
    depths = sorted({d for _, d in prof})
    colors = _colors(sorted({a for a, _ in prof}))
    fig, axes = _axes(1, len(depths))
    for ax, depth in zip(axes[0], depths):
        for (arch, d), p in prof.items():
            if d == depth and p["ratio"] is not None:  # an arm with no gradient at init has nothing to draw (log y)
                ax.plot(range(1, d + 1), p["layers"], "o-", color=colors[arch], label=f"{arch} ({p['ratio']:.2f}x)")
        ax.set_title(f"L = {depth}: ||grad W_2|| at init")
        ax.set_xlabel("layer")
        ax.set_yscale("log")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, title="arch (last/first)", title_fontsize=7)
    axes[0][0].set_ylabel("expected gradient norm")
    return _save(fig, path)


def loss_vs_lr_plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """Final loss against LR per depth: one line per (arch, warmup) over seed means, dots for single seeds."""
    groups = grouped(rows)
    depths = sorted({d for _, d, _ in groups})
    colors = _colors(sorted({a for a, _, _ in groups}))
    warmups = sorted({w for _, _, w in groups})
    fig, axes = _axes(1, len(depths))
    for ax, depth in zip(axes[0], depths):
        for (arch, d, w), by_lr in groups.items():
            if d != depth:
                continue
            lrs = list(by_lr)
            ys = [
                mean([r["final_loss"] if r["final_loss"] is not None else r["initial_loss"] for r in rs])
                for rs in by_lr.values()
            ]
            ls = STYLES[warmups.index(w) % len(STYLES)]
            ax.plot(lrs, ys, ls, marker="o", color=colors[arch], label=f"{arch}, warmup {w}")
            for lr, rs in by_lr.items():
                ax.scatter(
                    [lr] * len(rs),
                    [r["final_loss"] if r["final_loss"] is not None else r["initial_loss"] for r in rs],
                    s=8,
                    color=colors[arch],
                    alpha=0.4,
                )
        ax.axhline(rows[0]["unigram_loss"], color="gray", ls=":", lw=1, label="unigram plateau")
        ax.axhline(rows[0]["uniform_loss"], color="black", ls=":", lw=1, label="uniform ln V")
        if rows[0].get("floor_loss"):
            ax.axhline(rows[0]["floor_loss"], color="green", ls=":", lw=1, label="entropy floor")
        ax.set_xscale("log")
        ax.set_title(f"L = {depth}")
        ax.set_xlabel("learning rate")
    axes[0][0].set_ylabel("final loss (diverged = initial)")
    axes[0][-1].legend(fontsize=7)
    return _save(fig, path)


def _curve_grid(records: list[RunRecord], path: Path, series: Any, ylabel: str, log: bool) -> Path:
    """Rows = depth, columns = LR; one line per (arch, warmup), first seed only."""
    by: dict[tuple[int, float], list[RunRecord]] = defaultdict(list)
    seed0 = min(r.config["train"]["seed"] for r in records)
    for rec in records:
        if rec.config["train"]["seed"] == seed0:
            by[(rec.config["model"]["depth"], rec.config["train"]["lr"])].append(rec)
    depths = sorted({d for d, _ in by})
    lrs = sorted({lr for _, lr in by})
    colors = _colors(sorted({arch_of(r) for r in records}))
    warmups = sorted({r.config["train"]["warmup"] for r in records})
    fig, axes = _axes(len(depths), len(lrs), 3.6, 2.6)
    for i, depth in enumerate(depths):
        for j, lr in enumerate(lrs):
            ax = axes[i][j]
            for rec in by.get((depth, lr), []):
                xs, ys = series(rec)
                w = rec.config["train"]["warmup"]
                ax.plot(
                    xs,
                    ys,
                    STYLES[warmups.index(w) % len(STYLES)],
                    color=colors[arch_of(rec)],
                    lw=1,
                    label=f"{arch_of(rec)}, wu {w}",
                )
            ax.set_title(f"L = {depth}, lr {lr_label(lr)}", fontsize=9)
            if log:
                ax.set_yscale("log")
            if j == 0:
                ax.set_ylabel(ylabel, fontsize=8)
            if i == len(depths) - 1:
                ax.set_xlabel("step", fontsize=8)
    axes[0][-1].legend(fontsize=6)
    return _save(fig, path)


def loss_curves_plot(records: list[RunRecord], path: Path) -> Path:
    def series(rec: RunRecord) -> tuple[list[int], list[float]]:
        return list(range(len(rec.result.loss))), _smooth(rec.result.loss)

    return _curve_grid(records, path, series, "train loss (10-step mean)", log=False)


def grad_norm_curves_plot(records: list[RunRecord], path: Path) -> Path:
    def series(rec: RunRecord) -> tuple[list[int], list[float]]:
        d = rec.result.diagnostics
        return [x["step"] for x in d], _nan([x["grad_norm_total"] for x in d])

    return _curve_grid(records, path, series, "global grad norm", log=True)


def residual_curves_plot(records: list[RunRecord], path: Path) -> Path:
    def series(rec: RunRecord) -> tuple[list[int], list[float]]:
        d = rec.result.diagnostics
        return [x["step"] for x in d], _nan([x["residual_rms"][-1] for x in d])

    return _curve_grid(records, path, series, "last-layer residual RMS", log=True)


def diagnostics_plot(records: list[RunRecord], path: Path) -> Path | None:
    """For the deepest model at its smallest LR (first seed): residual-stream RMS by layer at init and at the end
    (Lemma 2), and over training the last layer's residual RMS, max attention logit and max output logit."""
    recs = [r for r in records if r.result.diagnostics]
    if not recs:
        return None
    deep = max(r.config["model"]["depth"] for r in recs)
    lr0 = min(r.config["train"]["lr"] for r in recs if r.config["model"]["depth"] == deep)
    seed0 = min(r.config["train"]["seed"] for r in recs)
    pick = [
        r
        for r in recs
        if r.config["model"]["depth"] == deep and r.config["train"]["lr"] == lr0 and r.config["train"]["seed"] == seed0
    ]
    colors = _colors(sorted({arch_of(r) for r in records}))
    warmups = sorted({r.config["train"]["warmup"] for r in recs})
    fig, axes = _axes(1, 4, 3.6, 2.8)
    panels = [
        ("residual_rms", "residual RMS at init (o) / end (x)"),
        ("residual_rms", "last-layer residual RMS"),
        ("attn_max_logit", "max attention logit"),
        ("max_output_logit", "max output logit"),
    ]
    for rec in pick:
        d, w = rec.result.diagnostics, rec.config["train"]["warmup"]
        c, ls = colors[arch_of(rec)], STYLES[warmups.index(w) % len(STYLES)]
        label = f"{arch_of(rec)}, wu {w}"
        axes[0][0].plot(_nan(d[0]["residual_rms"]), "o" + ls, color=c, ms=3, lw=1, label=label)
        axes[0][0].plot(_nan(d[-1]["residual_rms"]), "x" + ls, color=c, ms=3, lw=1)
        steps = [x["step"] for x in d]
        axes[0][1].plot(steps, _nan([x["residual_rms"][-1] for x in d]), ls, color=c, lw=1)
        if "attn_max_logit" in d[0]:
            axes[0][2].plot(steps, [_top(x["attn_max_logit"]) for x in d], ls, color=c, lw=1)
        axes[0][3].plot(steps, _nan([x["max_output_logit"] for x in d]), ls, color=c, lw=1)
    for ax, (_, title) in zip(axes[0], panels):
        ax.set_title(title, fontsize=9)
    axes[0][0].set_xlabel("layer (0 = embedding)")
    for ax in axes[0][1:]:
        ax.set_xlabel("step")
    axes[0][0].legend(fontsize=6)
    fig.suptitle(f"L = {deep}, lr {lr_label(lr0)}, seed {seed0}", fontsize=9)
    return _save(fig, path)


def all_plots(records: list[RunRecord], rows: list[dict[str, Any]], folder: Path) -> list[Path]:
    """Write every plot into ``folder``; return the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    made = [
        grad_profile_plot(records, folder / "grad_profile.png"),
        loss_vs_lr_plot(rows, folder / "loss_vs_lr.png"),
        loss_curves_plot(records, folder / "loss_curves.png"),
        grad_norm_curves_plot(records, folder / "grad_norm_curves.png"),
        residual_curves_plot(records, folder / "residual_curves.png"),
        diagnostics_plot(records, folder / "diagnostics.png"),
    ]
    return [p for p in made if p is not None]


# Figures for the documentation. A figure is data (``spec``: a title and panels of lines, bands and reference
# lines, every number in it), so what it shows can be hashed and compared without drawing it; ``draw_figure`` is the
# only code that touches matplotlib. The style is fixed here, not read from the user's matplotlibrc.
FIGURE_RC = {
    "font.family": "DejaVu Sans", "font.size": 9, "axes.titlesize": 9.5, "axes.labelsize": 9, "legend.fontsize": 7.5,
    "xtick.labelsize": 8, "ytick.labelsize": 8, "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.6,
    "lines.linewidth": 1.6, "lines.markersize": 4.5, "savefig.dpi": 110, "path.simplify": False,
}  # fmt: skip


def draw_figure(spec: dict[str, Any], path: Path, metadata: dict[str, str] | None = None) -> Path:
    """Draw ``spec`` into a PNG at ``path``: one row of panels, each with its ``bands`` (95% intervals), ``lines``
    (``ls: ""`` draws markers only), ``hlines`` and axis settings. The file holds no date and no software tag, so its
    bytes depend only on ``spec`` and the matplotlib version; ``metadata`` goes into its text chunks."""
    plt = _plt()
    with plt.style.context("default"), plt.rc_context(FIGURE_RC):
        w, h = spec.get("panel_size", (4.6, 3.4))
        fig, axes = _axes(1, len(spec["panels"]), w, h)
        for ax, panel in zip(axes[0], spec["panels"]):
            for band in panel.get("bands", ()):
                ax.fill_between(band["x"], band["lo"], band["hi"], color=band["color"], alpha=0.18, lw=0)
            for line in panel.get("lines", ()):
                ax.plot(
                    line["x"],
                    _nan(line["y"]),
                    linestyle=line.get("ls", "-") or "none",
                    marker=line.get("marker", "o"),
                    color=line["color"],
                    alpha=line.get("alpha", 1.0),
                    ms=line.get("ms", FIGURE_RC["lines.markersize"]),
                    label=line.get("label"),
                )
            for ref in panel.get("hlines", ()):
                ax.axhline(ref["y"], color=ref.get("color", "gray"), ls=":", lw=1.2, label=ref.get("label"))
            ax.set_xscale(panel.get("xscale", "linear"))
            ax.set_yscale(panel.get("yscale", "linear"))
            if "ylim" in panel:
                ax.set_ylim(*panel["ylim"])
            if "xticks" in panel:
                ax.set_xticks(panel["xticks"], panel.get("xticklabels", [str(t) for t in panel["xticks"]]))
                ax.minorticks_off()
            ax.set_title(panel.get("title", ""))
            ax.set_xlabel(panel.get("xlabel", ""))
            ax.set_ylabel(panel.get("ylabel", ""))
            if panel.get("legend"):
                ax.legend(loc=panel["legend"], ncols=panel.get("legend_cols", 1), framealpha=0.9)
        fig.suptitle(spec["title"], fontsize=10)
        fig.tight_layout()
        fig.savefig(path, metadata={"Software": None, **(metadata or {})})
    plt.close(fig)
    return path
