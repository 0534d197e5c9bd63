"""``memform search --format html``: the ranked plans and a chart of peak memory against step time.

Every fitting plan is a point (step time across, peak memory up); the plans no other beats in
both are the Pareto front, drawn as a line; the rows the command printed are marked. An axis whose
values span more than :data:`LOG_SPAN` times is logarithmic (ticks at 1, 2, 5 × 10^k), so that the
fast plans are not crowded against the axis by one slow one. The page is self-contained (inline
SVG, no scripts, no network).

The table keeps its step time and MFU in view at a 1280 px window: figures in one unit per column
(in its head), short column names (the field name as a tooltip), columns that hold one value for
every listed plan said once above the table instead, peak_gib (the peak again) dropped, and the
long per-stage layer lists and merged alternatives wrapping at the end of the row.
"""

from __future__ import annotations

import math
from typing import Any

from ..resources import VERSION
from ..units import GIB, human_bytes
from .chart import CAPACITY_COLOR, axis_for
from .render import _render, environment

TEMPLATE = "search.html.j2"
#: the plot area of the chart, in SVG user units
WIDTH, HEIGHT, LEFT, BOTTOM, TOP, RIGHT = 760, 420, 70, 50, 20, 20
#: an axis whose largest value is more than this many times its smallest is drawn logarithmic
LOG_SPAN = 20.0
#: the table's column heads (the field names of ``--format json``/csv are the tooltips)
HEADS = {"micro_batch_size": "mbs", "num_micro_batches": "m", "devices_used": "used", "devices_wasted": "idle",
         "peak_bytes": "peak", "peak_stage": "peak stage", "headroom_bytes": "headroom", "step_seconds": "step",
         "mfu": "MFU", "tokens_per_second": "tokens/s", "stage_layers": "layers per stage",
         "equivalent": "same memory and time with"}
#: columns never folded into the "every plan" line: what the ranking is about
KEY_FIELDS = ("dp", "tp", "pp", "peak_bytes", "step_seconds", "mfu", "tokens_per_second")
#: long text columns: they wrap, last in the row
TEXT_FIELDS = ("stage_layers", "equivalent")


def chart_points(rows: list[dict[str, Any]], front: list[dict[str, Any]], shown: list[dict[str, Any]],
                 capacity: int) -> dict[str, Any]:
    """SVG coordinates of every timed row (x: step seconds, y: peak bytes), the front and the axes."""
    timed = [r for r in rows if r["step_seconds"] is not None]
    if not timed:
        return {"points": [], "front": "", "xticks": [], "yticks": [], "capacity_y": None}
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    steps = [r["step_seconds"] for r in timed]
    xlog = log_axis(steps)
    if xlog is not None:
        xlo, xhi, xt = xlog

        def x(v: float) -> float:
            return round(LEFT + w * (math.log10(max(v, 10 ** xlo)) - xlo) / (xhi - xlo), 1)
        xticks = [{"x": x(t), "label": f"{t:g}"} for t in xt]
    else:
        xmax = max(steps) * 1.05
        xstep = _nice(xmax / 6)
        xmax = xstep * math.ceil(xmax / xstep)

        def x(v: float) -> float:
            return round(LEFT + w * v / xmax, 1)
        xticks = [{"x": x(k * xstep), "label": f"{k * xstep:.3g}"} for k in range(int(round(xmax / xstep)) + 1)]
    peaks = [r["peak_bytes"] / GIB for r in timed]
    ylog = log_axis(peaks + [capacity / GIB])
    if ylog is not None:
        ylo, yhi, yt = ylog

        def y(v: float) -> float:
            return round(TOP + h * (1 - (math.log10(max(v / GIB, 10 ** ylo)) - ylo) / (yhi - ylo)), 1)
        yticks = [{"y": y(t * GIB), "label": f"{t:g}"} for t in yt]
        top = GIB * 10 ** yhi
    else:
        axis = axis_for(max(r["peak_bytes"] for r in timed), capacity)
        top = axis.top

        def y(v: float) -> float:
            return round(TOP + h * (1 - v / axis.top), 1)
        yticks = [{"y": y(t), "label": f"{t / GIB:.0f}" if axis.step >= GIB else axis.label(t)} for t in axis.ticks]

    ids_front, ids_shown = set(map(id, front)), set(map(id, shown))
    points = [{"x": x(r["step_seconds"]), "y": y(r["peak_bytes"]), "front": id(r) in ids_front,
               "shown": id(r) in ids_shown,
               "label": _label(r)} for r in timed]
    line = " ".join(f"{x(r['step_seconds'])},{y(r['peak_bytes'])}"
                    for r in sorted(front, key=lambda r: r["step_seconds"]))
    return {"points": points, "front": line,
            "xticks": xticks, "yticks": yticks, "xlog": xlog is not None, "ylog": ylog is not None,
            "capacity_y": y(capacity) if 0 < capacity <= top else None,
            "width": WIDTH, "height": HEIGHT, "left": LEFT, "right": WIDTH - RIGHT, "top": TOP,
            "bottom": HEIGHT - BOTTOM, "capacity_color": CAPACITY_COLOR}


def log_axis(values: list[float]) -> tuple[float, float, list[float]] | None:
    """A logarithmic axis for positive ``values`` spanning more than :data:`LOG_SPAN` times: its ends
    (log10 of the 1, 2 or 5 × 10^k at or just beyond the smallest and largest value) and its ticks at
    1, 2 and 5 × 10^k between them (powers of ten only over many decades); None for a linear axis."""
    pos = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not pos or max(pos) <= LOG_SPAN * min(pos):
        return None
    lo_dec, hi_dec = math.floor(math.log10(min(pos))), math.ceil(math.log10(max(pos)))
    nice = [float(f"{m * 10.0 ** k:.12g}") for k in range(lo_dec, hi_dec + 1) for m in (1, 2, 5)]
    low = max(t for t in nice if t <= min(pos) * (1 + 1e-12))
    high = min(t for t in nice if t >= max(pos) * (1 - 1e-12))
    ticks = [t for t in nice if low <= t <= high]
    if len(ticks) > 12:  # many decades: the powers of ten only, and the ends
        ticks = sorted({low, high} | {t for t in ticks if math.log10(t).is_integer()})
    return math.log10(low), math.log10(high), ticks


def table_columns(fields: list[str], rows: list[dict[str, Any]], capacity: int) -> dict[str, Any]:
    """The HTML table's columns: per field its head, tooltip and alignment; the fields with one value in
    every row as ``same`` (said once above the table); the unit of the byte columns."""
    from ..units import common_unit
    cols, same = [], []
    for f in fields:
        if f == "peak_gib":
            continue
        values = [r.get(f) for r in rows]
        if f not in KEY_FIELDS and f not in TEXT_FIELDS and len(rows) > 1 and len({str(v) for v in values}) == 1:
            same.append({"field": f, "head": HEADS.get(f, f), "value": values[0]})
            continue
        if f in TEXT_FIELDS and not any(values):
            continue
        cols.append({"field": f, "head": HEADS.get(f, f), "left": f in ("recompute", "schedule") + TEXT_FIELDS,
                     "wrap": f in TEXT_FIELDS})
    unit, size = common_unit([r[f] for r in rows for f in ("peak_bytes", "headroom_bytes") if r.get(f) is not None]
                             + [capacity])
    for c in cols:
        c["unit"] = {"peak_bytes": unit, "headroom_bytes": unit, "step_seconds": "s", "mfu": "%"}.get(c["field"], "")
    return {"columns": cols, "same": same, "unit_size": size}


def _nice(step: float) -> float:
    """1, 2 or 5 × a power of ten, at least ``step``."""
    if step <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(step))
    return next(k * power for k in (1, 2, 5, 10) if k * power >= step)


def _label(r: dict[str, Any]) -> str:
    degrees = " ".join(f"{k}={r[k]}" for k in ("dp", "tp", "pp", "vpp", "cp", "ep") if r.get(k) not in (None, 1)
                       or k in ("dp", "tp", "pp"))
    return (f"{degrees}, mbs {r['micro_batch_size']}, {r['recompute']}"
            + (f", zero {r['zero']}" if r.get("zero") is not None else "")
            + f": {r['step_seconds']:.4g} s, {human_bytes(r['peak_bytes'])}")


def render_search_html(model: Any, devices: int, result: Any, shown: list[dict[str, Any]],
                       everything: list[dict[str, Any]], fields: list[str]) -> str:
    """The page for ``shown`` (the printed rows) among ``everything`` (all fitting plans, merged)."""
    from ..analysis.search import pareto_front
    front = pareto_front(everything) if result.timed else []
    return _render(environment(), TEMPLATE, {
        "name": model.structure.name, "devices": devices, "capacity": result.capacity_bytes,
        "stats": result.stats, "timed": result.timed, "fields": fields, "rows": shown,
        "total": len(everything), "front_size": len(front), "chart": chart_points(everything, front, shown,
                                                                                  result.capacity_bytes),
        "table": table_columns(fields, shown, result.capacity_bytes),
        "version": VERSION,
    }, TEMPLATE)
