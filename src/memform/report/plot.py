"""``memform plot``: per-stage stacked bars as a PNG/SVG/PDF picture (matplotlib, Agg backend).

The same picture as the HTML report's inline SVG (colours and axis from :mod:`memform.report.chart`),
for slides and papers. matplotlib is an optional extra (``memform[plot]``); without it the
command says so instead of failing with an import traceback.
"""

from __future__ import annotations

from pathlib import Path

from ..engine.interpreter import CATEGORIES
from ..engine.model import Estimate
from ..errors import MemformError
from ..units import GIB, human_bytes
from .chart import CAPACITY_COLOR, CATEGORY_COLORS, CATEGORY_LABELS, PEAK_COLOR, axis_for

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


def plot_stages(est: Estimate, output: str | Path, *, dpi: int = 150) -> Path:
    """Draw every stage's breakdown as one stacked bar, with device-capacity and peak lines."""
    out = Path(output)
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise MemformError(f"cannot plot to '{out.name}': the output file must end in "
                           f"{', '.join('.' + f for f in FORMATS)}")
    plt = _pyplot()
    n = len(est.stages)
    axis = axis_for(est.capacity_bytes, est.peak_bytes)
    fig, ax = plt.subplots(figsize=(max(6.5, min(18.0, 2.4 + 0.75 * n)), 4.8), layout="constrained")
    try:
        xs = list(range(n))
        bottom = [0.0] * n
        for c in CATEGORIES:
            heights = [s.values[c] / GIB for s in est.stages]
            ax.bar(xs, heights, bottom=bottom, width=0.68, color=CATEGORY_COLORS[c], label=CATEGORY_LABELS[c],
                   zorder=2)
            bottom = [b + h for b, h in zip(bottom, heights)]
        if n <= 24:
            for x, total in zip(xs, bottom):
                ax.annotate(f"{total:.1f}", (x, total), xytext=(0, 3), textcoords="offset points",
                            ha="center", va="bottom", fontsize=8 if n > 12 else 9, zorder=4,
                            bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.85})
        cap, peak = est.capacity_bytes / GIB, est.peak_bytes / GIB
        ax.axhline(cap, color=CAPACITY_COLOR, linestyle=(0, (6, 3)), linewidth=1.6,
                   label=f"device {human_bytes(est.capacity_bytes)}", zorder=3)
        ax.axhline(peak, color=PEAK_COLOR, linestyle=(0, (2, 2)), linewidth=1.4,
                   label=f"predicted peak {human_bytes(est.peak_bytes)} (stage {est.peak_stage})", zorder=3)
        ax.set_ylim(0, axis.top / GIB)
        ax.set_yticks([t / GIB for t in axis.ticks])
        step = 1 if n <= 32 else max(1, n // 16)
        ax.set_xticks(xs[::step])
        ax.set_xlim(-0.6, n - 0.4)
        ax.set_xlabel("pipeline stage")
        ax.set_ylabel("GiB per device")
        st = est.model.structure
        vpp = f", vpp={st.vpp}" if st.vpp > 1 else ""
        ax.set_title(f"{est.name}: {st.schedule}, pp={st.pp}{vpp}, recompute={st.recompute}", fontsize=11)
        ax.grid(axis="y", color="#e3e3e3", zorder=0)
        ax.spines[["top", "right"]].set_visible(False)
        handles, labels = ax.get_legend_handles_labels()
        by_label = dict(zip(labels, handles))
        # bars listed top-down as they stack, then the two lines
        order = [CATEGORY_LABELS[c] for c in reversed(CATEGORIES)] + [x for x in labels if x not in
                                                                        CATEGORY_LABELS.values()]
        ax.legend([by_label[x] for x in order], order, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9)
        try:
            fig.savefig(out, dpi=dpi, format=fmt)
        except OSError as exc:
            raise MemformError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return out
