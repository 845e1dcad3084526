"""The kernel benchmark's report: one table per pass (time, GB/s, % of a copy of the same bytes, L2 marks), the
targets' summary and a plot, from the rows ``bench_norm_kernels.py`` writes (also rebuilt from its JSON)."""

from __future__ import annotations

import statistics
from pathlib import Path

PASSES = ("fwd", "bwd", "fwd+bwd")
TARGETS = {"fwd": 90.0, "bwd": 80.0}  # % of the same-size copy for N >= 2048: near the memory limit
KEY = ("norm", "residual", "dtype", "M", "N")
MARKS = {"L2 reuse": " †", "L2": " ‡"}


def _cell(row: dict) -> str:
    if row["status"] != "ok":
        return "–"
    pct = row.get("pct_copy")
    mark = MARKS.get(row.get("l2", ""), "")
    return f"{row['time_us']:.1f} µs · {row['gbps']:.3g} GB/s · {pct:.0f}%{mark}"


def _copy_line(payload: dict) -> str:
    peak = payload.get("copy_peak_bytes")
    by_size = {int(k): v for k, v in payload.get("copy_by_bytes", {}).items() if int(k) != peak}
    if not by_size:
        return ""
    lo, hi = min(by_size, key=by_size.get), max(by_size, key=by_size.get)
    return (
        f"Copy of the cells' sizes ({len(by_size)} sizes): {by_size[lo]:.0f} GB/s at {lo / 2**20:.1f} MiB to "
        f"{by_size[hi]:.0f} GB/s at {hi / 2**20:.1f} MiB, median {statistics.median(by_size.values()):.0f} GB/s."
    )


def markdown(payload: dict) -> str:
    rows = payload["rows"]
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    flushed = payload.get("flushed", True)
    half = payload.get("copy_peak_bytes", 2**31) / 2**21  # MiB read (and as many written) by the peak copy
    l2 = f"L2 {payload['l2_bytes'] / 2**20:.0f} MiB" if payload.get("l2_bytes") else "L2 size not reported"
    lines = [
        f"Device: {payload['device']}; copy bandwidth {payload['copy_gbps']:.0f} GB/s ({half:.0f} MiB read + "
        f"{half:.0f} MiB written); {l2}. Command: `{payload['command']}`",
        "",
        "Each cell: median time · GB/s of the bytes the pass must move · % of a copy moving the same bytes, timed the "
        + ("same way (L2 flushed before every repetition)." if flushed else "same way (L2 not flushed)."),
        "† fwd+bwd whose forward fits in L2: its backward may read what the forward wrote from L2. "
        "‡ not flushed and the cell's bytes fit in L2: its operands may be read from L2.",
        _copy_line(payload),
        "",
    ]
    missing = {r["impl"]: r["status"] for r in rows if r["status"] != "ok" and not r["status"].startswith("error")}
    lines += [f"- `{impl}`: {why}" for impl, why in missing.items()]
    for pas in PASSES:
        lines += ["", f"### {pas}", "", "| norm | residual | dtype | M | N | " + " | ".join(impls) + " |"]
        lines.append("|---" * (len(KEY) + len(impls)) + "|")
        for key in dict.fromkeys(tuple(r[k] for k in KEY) for r in rows):
            cells = {r["impl"]: r for r in rows if r["pass_"] == pas and tuple(r[k] for k in KEY) == key}
            timed = [c for c in cells.values() if c["status"] == "ok"]
            best = min(timed, key=lambda c: c["time_us"])["impl"] if timed else None
            row = [str(k) for k in key] + [
                (f"**{_cell(cells[i])}**" if i == best else _cell(cells[i])) if i in cells else "" for i in impls
            ]
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", "### Summary", "", *summary(rows)]
    return "\n".join(lines) + "\n"


def summary(rows: list[dict]) -> list[str]:
    """The targets: fwd >= 90% and bwd >= 80% of the same-size copy for N >= 2048, and fastest in every cell."""
    out = []
    ours = [r for r in rows if r["impl"] == "ours" and r["status"] == "ok"]
    for pas, target in TARGETS.items():
        cells = [r for r in ours if r["pass_"] == pas and r["N"] >= 2048]
        met = [r for r in cells if r["pct_copy"] >= target]
        out.append(f"- {pas} >= {target:.0f}% of the same-size copy (N >= 2048): {len(met)}/{len(cells)} cells")
        out += [
            f"  - below: {r['norm']} res={r['residual']} {r['dtype']} M={r['M']} N={r['N']}: {r['pct_copy']:.0f}%"
            for r in cells
            if r["pct_copy"] < target
        ][:12]
    losses = []
    for r in ours:
        rivals = [
            o
            for o in rows
            if o["status"] == "ok" and not o["impl"].startswith("ours") and all(o[k] == r[k] for k in (*KEY, "pass_"))
        ]
        faster = [o for o in rivals if o["time_us"] < r["time_us"]]
        if faster:
            best = min(faster, key=lambda o: o["time_us"])
            losses.append(
                f"{r['norm']} res={r['residual']} {r['dtype']} M={r['M']} N={r['N']} {r['pass_']}: "
                f"{best['impl']} {best['time_us']:.1f} µs vs ours {r['time_us']:.1f} µs"
            )
    out.append(f"- ours fastest in {len(ours) - len(losses)}/{len(ours)} cells")
    out += [f"  - slower: {line}" for line in losses[:40]]
    if len(losses) > 40:
        out.append(f"  - ... and {len(losses) - 40} more (see the JSON)")
    marked = [r for r in ours if r.get("l2")]
    if marked:
        out.append(f"- cells of ours that may read from L2 (marked † / ‡): {len(marked)}/{len(ours)}")
    return out


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    big_m = max(r["M"] for r in rows)
    norms = list(dict.fromkeys(r["norm"] for r in rows))
    fig, axes = plt.subplots(len(norms), 3, figsize=(14, 3.5 * len(norms)), sharey=True, squeeze=False)
    for i, norm in enumerate(norms):
        for j, pas in enumerate(PASSES):
            ax = axes[i][j]
            for impl in dict.fromkeys(r["impl"] for r in rows):
                for residual, style in ((False, "-"), (True, "--")):
                    pts = sorted(
                        (r["N"], r["pct_copy"])
                        for r in rows
                        if r["impl"] == impl
                        and r["norm"] == norm
                        and r["pass_"] == pas
                        and r["residual"] == residual
                        and r["status"] == "ok"
                        and r["M"] == big_m
                        and r["dtype"] == "bfloat16"
                    )
                    if pts:
                        ax.plot(*zip(*pts), style, marker="o", label=f"{impl}{' +res' if residual else ''}")
            ax.set_title(f"{norm} {pas} (bf16, M={big_m})")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("N")
            ax.set_ylabel("% of a same-size copy")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
