"""Shared look of the per-stage memory charts: colours, labels and a readable value axis.

The HTML report draws its bars in SVG from a Jinja template and ``memform plot`` draws them
with matplotlib; both take their colours and axis ticks from here so the two pictures agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..units import GIB

#: one colour per breakdown category (Tableau 10, distinguishable in print and for most
#: colour-vision deficiencies), in stacking order from the bottom of a bar
CATEGORY_COLORS: dict[str, str] = {
    "params": "#4E79A7",
    "grads": "#F28E2B",
    "optimizer": "#59A14F",
    "activations": "#B07AA1",
    "comm": "#9C755F",
    "runtime": "#BAB0AC",
}
CATEGORY_LABELS: dict[str, str] = {
    "params": "parameters",
    "grads": "gradients",
    "optimizer": "optimizer states",
    "activations": "activations",
    "comm": "comm buffers",
    "runtime": "runtime (context, allocator, margin)",
}
CAPACITY_COLOR = "#D62728"
PEAK_COLOR = "#222222"


@dataclass(frozen=True)
class Axis:
    """A value axis in bytes: its top and the tick positions, all on whole 'nice' GiB steps."""

    top: int
    ticks: list[int]
    step: int

    def label(self, value: int) -> str:
        gib = value / GIB
        return f"{gib:g}" if self.step >= GIB else f"{gib:.2f}".rstrip("0").rstrip(".")


def axis_for(*values: int, max_ticks: int = 8) -> Axis:
    """The smallest axis with steps of 1, 2 or 5 × 10^k GiB that shows every value with headroom."""
    high = max([v for v in values if v is not None] + [1]) * 1.05
    gib = high / GIB
    base = 1.0
    # walk up or down decades until max_ticks steps of the coarsest fitting multiple cover high
    while gib / base > max_ticks * 5:
        base *= 10
    while gib / base < 1 and base > 1e-6:
        base /= 10
    for mult in (1, 2, 5, 10, 20, 50):
        step_gib = base * mult
        if gib / step_gib <= max_ticks:
            break
    step = max(1, int(round(step_gib * GIB)))
    n = int(-(-high // step))
    return Axis(n * step, [i * step for i in range(n + 1)], step)


def gib_near(value: int, capacity: int | None = None, digits: int = 1) -> str:
    """``value`` bytes in GiB with ``digits`` decimals, or as many more as it takes for the figure to
    compare with the capacity's figure as the bytes do: 80.04 GiB on an 80 GiB device reads
    ``80.04`` (not ``80.0``, which looks like it fits), 79.996 GiB reads ``79.996``."""
    gib = value / GIB
    if capacity is None or capacity <= 0:
        return f"{gib:.{digits}f}"
    cap = capacity / GIB
    want = (value > capacity) - (value < capacity)
    d = digits
    while d < 10:
        shown, shown_cap = float(f"{gib:.{d}f}"), float(f"{cap:.{d}f}")
        if (shown > shown_cap) - (shown < shown_cap) == want:
            break
        d += 1
    return f"{gib:.{d}f}"


def near_bytes(value: int, capacity: int) -> str:
    """``value`` as ``human_bytes`` prints it, unless that reads the same as the capacity's figure
    while the bytes differ: then in GiB with the digits :func:`gib_near` needs (``80.004 GiB``)."""
    from ..units import human_bytes
    text = human_bytes(value)
    if value != capacity and text == human_bytes(capacity):
        return f"{gib_near(value, capacity, 2)} GiB"
    return text


def verdict(peak: int, capacity: int, fits: bool | None = None) -> str:
    """The fit verdict a chart states: ``fits (39.46 GiB to spare)`` or ``does not fit (short by 41.00 MiB)``;
    ``fits`` overrides the comparison where the verdict uses other bytes (the allocator's reserved ones)."""
    from ..units import human_bytes
    ok = peak <= capacity if fits is None else fits
    if ok:
        return f"fits ({human_bytes(max(capacity - peak, 0))} to spare)" if peak <= capacity else "fits"
    return f"does not fit (short by {human_bytes(peak - capacity)})" if peak > capacity else "does not fit"
