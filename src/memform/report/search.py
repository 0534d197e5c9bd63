"""``memform search --format html``: the ranked plans and a chart of peak memory against step time.

Every fitting plan is a point (step time across, peak memory up); the plans no other beats in
both are the Pareto front, drawn as a line; the rows the command printed are marked. The page is
self-contained (inline SVG, no scripts, no network).
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


def chart_points(rows: list[dict[str, Any]], front: list[dict[str, Any]], shown: list[dict[str, Any]],
                 capacity: int) -> dict[str, Any]:
    """SVG coordinates of every timed row (x: step seconds, y: peak bytes), the front and the axes."""
    timed = [r for r in rows if r["step_seconds"] is not None]
    if not timed:
        return {"points": [], "front": "", "xticks": [], "yticks": [], "capacity_y": None}
    xmax = max(r["step_seconds"] for r in timed) * 1.05
    xstep = _nice(xmax / 6)
    xmax = xstep * math.ceil(xmax / xstep)
    axis = axis_for(max(r["peak_bytes"] for r in timed), capacity)
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(v: float) -> float:
        return round(LEFT + w * v / xmax, 1)

    def y(v: float) -> float:
        return round(TOP + h * (1 - v / axis.top), 1)

    ids_front, ids_shown = set(map(id, front)), set(map(id, shown))
    points = [{"x": x(r["step_seconds"]), "y": y(r["peak_bytes"]), "front": id(r) in ids_front,
               "shown": id(r) in ids_shown,
               "label": _label(r)} for r in timed]
    line = " ".join(f"{x(r['step_seconds'])},{y(r['peak_bytes'])}"
                    for r in sorted(front, key=lambda r: r["step_seconds"]))
    return {"points": points, "front": line,
            "xticks": [{"x": x(k * xstep), "label": f"{k * xstep:.3g}"} for k in range(int(round(xmax / xstep)) + 1)],
            "yticks": [{"y": y(t), "label": f"{t / GIB:.0f}"} for t in axis.ticks],
            "capacity_y": y(capacity) if capacity <= axis.top else None,
            "width": WIDTH, "height": HEIGHT, "left": LEFT, "right": WIDTH - RIGHT, "top": TOP,
            "bottom": HEIGHT - BOTTOM, "capacity_color": CAPACITY_COLOR}


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
        "version": VERSION,
    }, TEMPLATE)
