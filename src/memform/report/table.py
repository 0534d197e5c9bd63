"""The terminal table of ``memform estimate``, and the setup line every output shows.

Kept apart from :mod:`memform.report.render` because it needs no closed forms: it renders
any estimate's numbers (:class:`memform.engine.results.EstimateNumbers`, interpreted or from
the cached fast path) without importing sympy, which is most of a cold start.
"""

from __future__ import annotations

import re
import textwrap
from functools import lru_cache
from typing import Any

import jinja2

from ..resources import templates_dir
from ..units import common_unit, human_bytes, human_count

#: the default table, within WIDTH columns
TABLE_TEMPLATE = "estimate_narrow.txt.j2"
#: every category on one line per stage, layer groups unabridged, each figure with its unit (``--wide``; the
#: template reports and ``--template`` users know as estimate.txt.j2)
WIDE_TEMPLATE = "estimate.txt.j2"
#: the default table fits a terminal this wide (labels and long lines wrap; ``--wide`` does not)
WIDTH = 100
#: the narrowest layers column before the table gives up on WIDTH (many extra categories)
MIN_LABEL = 12


def setup_line(est: Any) -> str:
    """The run's shape and the model's size on one line, e.g. ``tp=8 dp=4 pp=4 cp=1, micro-batch 1 ×
    16 micro-batches, seq 8192, 128 devices; 70.55 B parameters (70553706496)``."""
    st = est.setup
    degrees = " ".join(f"{k}={st[k]}" for k in ("tp", "dp", "pp", "vpp", "cp", "ep") if k in st)
    parts = [degrees] if degrees else []
    if "micro_batch_size" in st:
        batching = f"micro-batch {st['micro_batch_size']}"
        if "num_micro_batches" in st:
            batching += f" x {st['num_micro_batches']} micro-batches"
        parts.append(batching)
    if "seq_length" in st:
        parts.append(f"seq {st['seq_length']}")
    if "devices" in st:
        parts.append(f"{st['devices']} devices")
    p = est.parameters
    params = f"{human_count(p['total'])} parameters ({p['total']:,})"
    if p["expert"]:
        params += f": {human_count(p['expert'])} expert, {human_count(p['dense'])} dense"
    return ", ".join(parts) + "; " + params


def _cell(value: int, size: int) -> str:
    if value == 0:
        return "0"
    if size == 1:
        return f"{value:,}"
    x = value / size
    return f"{x:.2f}" if abs(x) < 10 ** 5 else f"{x:.3g}"


#: spaces a line of prose does not break at: a figure stays with its name and its unit ("pp 0.0107",
#: "44.80 GiB", "MFU 42.8 %")
_KEEP = re.compile(r" (?=[\d%(])|(?<=\d) (?=(?:s|[KMGTP]iB|B|tokens/s|x)\b)|(?<=\w) (?==)")


def wrap_prose(text: str, width: int, indent: str = "") -> list[str]:
    """``text`` as lines of at most ``width`` characters, the later ones starting with ``indent``,
    never breaking between a figure and its name or unit (the ``wrap_prose`` filter of templates)."""
    wrapper = textwrap.TextWrapper(width, subsequent_indent=indent, break_on_hyphens=False)
    return [line.replace("\u00a0", " ") for line in wrapper.wrap(_KEEP.sub("\u00a0", str(text)))]


def _setup_lines(line: str, width: int) -> list[str]:
    """The setup line, or its shape and its parameter count on lines of their own where it is too long."""
    if len(line) <= width:
        return [line]
    shape, _, params = line.partition("; ")
    return [x for part in (shape + ";", params) if part
            for x in textwrap.wrap(part, width, break_on_hyphens=False)]


#: a stage with more layer groups than this (a hybrid pattern alternates kinds layer by layer: 52 groups for
#: Nemotron-H-8B) is labelled with each block's count, in first-appearance order (``--wide``: every group)
MAX_GROUPS = 4


def _summarised(label: str) -> str:
    """``1xembedding 1xmamba_layer 1xmlp_layer 1xmamba_layer ...`` as ``1xembedding 24xmamba_layer
    24xmlp_layer 4xattn_layer 1xoutput (54 groups)`` where there are more than :data:`MAX_GROUPS` groups."""
    groups = label.split()
    if len(groups) <= MAX_GROUPS:
        return label
    counts: dict[str, int] = {}
    for g in groups:
        n, _, block = g.partition("x")
        counts[block] = counts.get(block, 0) + int(n)
    return " ".join(f"{n}x{block}" for block, n in counts.items()) + f" ({len(groups)} groups)"


def narrow_context(est: Any) -> dict[str, Any]:
    """What ``estimate_narrow.txt.j2`` reads: the table within :data:`WIDTH` columns. Figures share one unit
    named above the table, categories get short titles, layer groups and long lines wrap."""
    stages = est.stages
    extra = [c for c, attr in (("runtime", "runtime_bytes"), ("host", "host_bytes"))
             if any(getattr(s, attr) for s in stages)]
    reserved = any(s.reserve is not None for s in stages)
    spec = [("params", lambda s: s.values["params"]), ("grads", lambda s: s.values["grads"]),
            ("optim", lambda s: s.values["optimizer"]), ("acts", lambda s: s.values["activations"]),
            ("comm", lambda s: s.values["comm"])]
    spec += [(c, (lambda s: s.runtime_bytes) if c == "runtime" else (lambda s: s.host_bytes)) for c in extra]
    spec += [("peak", lambda s: s.peak_bytes)] + ([("reserved", lambda s: s.reserved_bytes)] if reserved else [])
    figures = [[get(s) for _, get in spec] for s in stages]
    unit, size = common_unit([v for row in figures for v in row])
    cells = [[_cell(v, size) for v in row] for row in figures]
    widths = [max(7, len(title), *(len(row[i]) for row in cells)) for i, (title, _) in enumerate(spec)]
    labels = [_summarised(est.terminal_label(s.stage)) for s in stages]
    fixed = 5 + 2 + sum(w + 1 for w in widths) + len("  fits")
    label_width = max(MIN_LABEL, min(WIDTH - fixed, max([len("layers")] + [len(x) for x in labels])))
    rows, released = [], []
    for s, label, row in zip(stages, labels, cells):
        fits = "yes" if s.fits else "NO"
        if s.fits and s.reserve_releases:
            fits += "*"
            released.append(f"stage {s.stage}: {s.reserve_releases} x")
        rows.append({"stage": s.stage, "cells": row, "fits": fits,
                     "labels": textwrap.wrap(label, label_width, break_on_hyphens=False) or [""]})
    peak = (f"peak: stage {est.peak_stage}, {human_bytes(est.peak_bytes)}"
            + (f" allocated, {human_bytes(stages[est.peak_stage].reserved_bytes)} reserved by the caching allocator"
               if reserved else "")
            + f" of {human_bytes(est.capacity_bytes)} ({'fits' if est.fits else 'does NOT fit'})"
            + ("; host memory is not counted in the peak" if "host" in extra else ""))
    notes = [peak]
    if released:
        notes.append("* fits once the allocator releases its cached segments (" + ", ".join(released) + ")")
    step = time_line(est)
    if step:
        notes.append(step)
    return {
        "name": est.name, "schedule": est.schedule, "pp": est.pp, "vpp": est.vpp, "recompute": est.recompute,
        "framework": est.framework, "capacity_bytes": est.capacity_bytes,
        "setup_lines": _setup_lines(setup_line(est), WIDTH - 2),
        "unit": unit, "label_width": label_width, "rows": rows,
        "columns": [{"title": t, "width": w} for (t, _), w in zip(spec, widths)],
        "note_lines": [line for n in notes for line in wrap_prose(n, WIDTH, "  ")],
    }


def table_context(est: Any) -> dict[str, Any]:
    """What ``estimate.txt.j2`` reads (a subset of :func:`memform.report.render.context`)."""
    return {
        "name": est.name, "schedule": est.schedule, "pp": est.pp, "vpp": est.vpp, "recompute": est.recompute,
        "framework": est.framework, "capacity_bytes": est.capacity_bytes, "setup_line": setup_line(est),
        "stages": est.stages, "layer_labels": [est.terminal_label(s.stage) for s in est.stages],
        "peak_stage": est.peak_stage, "peak_bytes": est.peak_bytes, "fits": est.fits,
        "reserved": any(s.reserve is not None for s in est.stages),
        "reserved_bytes": est.stages[est.peak_stage].reserved_bytes,
        "time_line": time_line(est),
    }


def time_line(est: Any) -> str:
    """``step ≈ 4.37 s (compute 2.64, tp 0.85, bubble 0.66, ...; slowest stage 3), MFU 45.7 %, 120,081 tokens/s``,
    or "" without a time model (no device peak FLOP/s)."""
    if not est.has_time:
        return ""
    d = est.time_dict()
    parts = ", ".join(f"{k} {v:.3g}" for k, v in sorted(d["parts"].items(), key=lambda kv: -kv[1]) if v > 0)
    line = f"step ≈ {d['step_seconds']:.3g} s ({parts}; slowest stage {d['slowest_stage']})"
    if d["mfu"] is not None:
        line += f", MFU {100 * d['mfu']:.1f} % of the dense BF16 peak"   # time.mf: one peak, FP8 recipes too
    if d["tokens_per_second"] is not None:
        line += f", {d['tokens_per_second']:,.0f} tokens/s"
    return line


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    env.filters["bytes"] = human_bytes
    env.filters["wrap_prose"] = wrap_prose
    return env


def render_table(est: Any, *, wide: bool = False) -> str:
    """The per-stage table ``memform estimate`` prints: within :data:`WIDTH` columns, or with ``wide``
    every figure with its unit and every layer group on one line (``memform estimate --wide``)."""
    if wide:
        return _environment().get_template(WIDE_TEMPLATE).render(**table_context(est))
    return _environment().get_template(TABLE_TEMPLATE).render(**narrow_context(est))
