"""``memform plot`` and ``memform compare -o x.png``: per-stage stacked bars as a PNG/SVG/PDF
picture (matplotlib, Agg backend).

The same pictures as the HTML reports' inline SVG (colours and axis from :mod:`memform.report.chart`),
for slides and papers: one stacked bar per stage, or for a comparison one group per stage with
a bar per variant. matplotlib is an optional extra (``memform[plot]``); without it the command
says so instead of failing with an import traceback.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine.interpreter import CATEGORIES
from ..engine.model import Estimate
from ..errors import MemformError
from ..units import GIB, human_bytes
from .chart import CAPACITY_COLOR, CATEGORY_COLORS, CATEGORY_LABELS, PEAK_COLOR, axis_for, gib_near, near_bytes, verdict
from .render import setup_line

if TYPE_CHECKING:
    from ..analysis.compare import Comparison

FORMATS = ("png", "svg", "pdf")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise MemformError("memform plot needs matplotlib: install the 'plot' extra "
                           "(pip install 'memform[plot]')") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def _target(output: str | Path) -> tuple[Path, str]:
    out = Path(output)
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise MemformError(f"cannot plot to '{out.name}': the output file must end in "
                           f"{', '.join('.' + f for f in FORMATS)}")
    return out, fmt


def headline(est: Estimate) -> str:
    """``llama3-70b: 1f1b, pp=4, recompute=selective`` (the first line of a chart title)."""
    st = est.model.structure
    vpp = f", vpp={st.vpp}" if st.vpp > 1 else ""
    return f"{est.name}: {st.schedule}, pp={st.pp}{vpp}, recompute={st.recompute}"


def chart_title(first: str, setup: str, width_in: float) -> str:
    """A title line plus the setup line, wrapped to the figure's width (about 12 characters per
    inch at the 10-point title font), breaking at its ``; `` and then between its ``, `` parts."""
    chars = max(40, int(width_in * 12))
    lines = [first]
    for part in setup.split("; "):
        line = ""
        for piece in part.split(", "):
            if line and len(line) + 2 + len(piece) > chars:
                lines.append(line + ",")
                line = piece
            else:
                line = f"{line}, {piece}" if line else piece
        lines.append(line)
    return "\n".join(lines)


def _finish_axes(ax: Any, axis: Any, xlabel: str = "pipeline stage") -> None:
    ax.set_ylim(0, axis.top / GIB)
    ax.set_yticks([t / GIB for t in axis.ticks])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("GiB per device")
    ax.grid(axis="y", color="#e3e3e3", zorder=0)
    ax.spines[["top", "right"]].set_visible(False)


def _save(fig: Any, out: Path, fmt: str, dpi: int) -> None:
    try:
        fig.savefig(out, dpi=dpi, format=fmt)
    except OSError as exc:
        raise MemformError(f"cannot write {out}: {exc.strerror or exc}") from None


def _legend(ax: Any) -> None:
    """Bars listed top-down as they stack, then the lines."""
    handles, labels = ax.get_legend_handles_labels()
    by_label = dict(zip(labels, handles))
    order = [CATEGORY_LABELS[c] for c in reversed(CATEGORIES)] + [x for x in labels if x not in
                                                                    CATEGORY_LABELS.values()]
    ax.legend([by_label[x] for x in order], order, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
              fontsize=9)


def plot_stages(est: Estimate, output: str | Path, *, dpi: int = 150) -> Path:
    """Draw every stage's breakdown as one stacked bar, with device-capacity and peak lines."""
    out, fmt = _target(output)
    plt = _pyplot()
    n = len(est.stages)
    axis = axis_for(est.capacity_bytes, est.peak_bytes)
    width = max(6.5, min(18.0, 2.4 + 0.75 * n))
    fig, ax = plt.subplots(figsize=(width, 4.8), layout="constrained")
    try:
        xs = list(range(n))
        bottom = [0.0] * n
        for c in CATEGORIES:
            heights = [s.values[c] / GIB for s in est.stages]
            ax.bar(xs, heights, bottom=bottom, width=0.68, color=CATEGORY_COLORS[c], label=CATEGORY_LABELS[c],
                   zorder=2)
            bottom = [b + h for b, h in zip(bottom, heights)]
        if n <= 24:
            for x, total, stage in zip(xs, bottom, est.stages):
                ax.annotate(gib_near(stage.peak_bytes, est.capacity_bytes), (x, total), xytext=(0, 3), textcoords="offset points",
                            ha="center", va="bottom", fontsize=8 if n > 12 else 9, zorder=4,
                            bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.85})
        ax.axhline(est.capacity_bytes / GIB, color=CAPACITY_COLOR, linestyle=(0, (6, 3)), linewidth=1.6,
                   label=f"device {human_bytes(est.capacity_bytes)}", zorder=3)
        ax.axhline(est.peak_bytes / GIB, color=PEAK_COLOR, linestyle=(0, (2, 2)), linewidth=1.4,
                   label=f"predicted peak {near_bytes(est.peak_bytes, est.capacity_bytes)} (stage {est.peak_stage}): "
                         f"{verdict(est.peak_bytes, est.capacity_bytes, est.fits)}", zorder=3)
        step = 1 if n <= 32 else max(1, n // 16)
        ax.set_xticks(xs[::step])
        ax.set_xlim(-0.6, n - 0.4)
        _finish_axes(ax, axis)
        fig.suptitle(chart_title(f"{headline(est)}: {'fits' if est.fits else 'does NOT fit'}", setup_line(est), width),
                     fontsize=10)
        _legend(ax)
        _save(fig, out, fmt, dpi)
    finally:
        plt.close(fig)
    return out


def plot_comparison(cmp: "Comparison", output: str | Path, *, dpi: int = 150) -> Path:
    """One group of bars per stage, one stacked bar per variant that estimated (lettered as in
    the tables), with each device capacity and the baseline's peak as lines; the legend says
    which letter is which variant (and which failed)."""
    from matplotlib.lines import Line2D

    out, fmt = _target(output)
    plt = _pyplot()
    index = [j for j, v in enumerate(cmp.variants) if v.ok]
    shown = [cmp.variants[j] for j in index]
    k, n = len(shown), len(cmp.stages)
    base = cmp.variants[cmp.baseline]
    ests = [v.est for v in shown]
    axis = axis_for(*[e.capacity_bytes for e in ests], *[e.peak_bytes for e in ests])
    width = max(7.5, min(18.0, 3.6 + 0.42 * n * k + 0.3 * n))
    fig, ax = plt.subplots(figsize=(width, 5.2), layout="constrained")
    try:
        bw = 0.8 / k
        totals: list[tuple[float, float]] = []
        for j, v in enumerate(shown):
            xs, results = [], []
            for i, d in enumerate(cmp.stages):
                r = d.results[index[j]]
                if r is not None:
                    xs.append(i - 0.4 + bw * (j + 0.5))
                    results.append(r)
            bottom = [0.0] * len(xs)
            for c in CATEGORIES:
                heights = [r.values[c] / GIB for r in results]
                ax.bar(xs, heights, bottom=bottom, width=bw * 0.88, color=CATEGORY_COLORS[c],
                       label=CATEGORY_LABELS[c], zorder=2, edgecolor="white", linewidth=0.4)
                bottom = [b + h for b, h in zip(bottom, heights)]
            totals += [(x, t, gib_near(r.peak_bytes, v.est.capacity_bytes)) for x, t, r in zip(xs, bottom, results)]
            for x in xs:
                ax.text(x, -0.012, v.key, transform=ax.get_xaxis_transform(), ha="center", va="top",
                        fontsize=7 if k * n > 24 else 8, color="#333")
        if len(totals) <= 24:
            for x, total, text in totals:
                ax.annotate(text, (x, total), xytext=(0, 2), textcoords="offset points", ha="center",
                            va="bottom", fontsize=7 if len(totals) > 12 else 8, zorder=4,
                            bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.85})
        capacities = sorted({e.capacity_bytes for e in ests})
        for cap, dash in zip(capacities, [(0, (6, 3)), (0, (2, 2)), (0, (1, 3)), (0, (8, 2, 2, 2))] * 8):
            ax.axhline(cap / GIB, color=CAPACITY_COLOR, linestyle=dash, linewidth=1.6,
                       label=f"device {human_bytes(cap)}", zorder=3)
        ax.axhline(base.est.peak_bytes / GIB, color=PEAK_COLOR, linestyle=(0, (2, 2)), linewidth=1.2,
                   label=f"peak of {base.key} (baseline) {near_bytes(base.est.peak_bytes, base.est.capacity_bytes)}: "
                         f"{'fits' if base.est.fits else 'does not fit'}", zorder=3)
        ax.set_xticks(list(range(n)))
        ax.tick_params(axis="x", length=0, pad=14)
        ax.set_xlim(-0.6, n - 0.4)
        _finish_axes(ax, axis)
        fig.suptitle(chart_title(f"Comparison: {cmp.title}", f"{base.key} (baseline): {setup_line(base.est)}",
                                 width), fontsize=10)
        handles, labels = ax.get_legend_handles_labels()
        by_label = dict(zip(labels, handles))
        order = [CATEGORY_LABELS[c] for c in reversed(CATEGORIES)] + [x for x in by_label if x not in
                                                                        CATEGORY_LABELS.values()]
        blank = Line2D([], [], linestyle="none")
        names = [textwrap.shorten(f"{v.key} = {v.label}" + ("" if v.ok else ", failed"), 60, placeholder="…")
                 for v in cmp.variants]
        ax.legend([by_label[x] for x in order] + [blank] * len(names), order + names, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8, handlelength=1.6)
        _save(fig, out, fmt, dpi)
    finally:
        plt.close(fig)
    return out
