"""The terminal table of ``memform estimate``, and the setup line every output shows.

Kept apart from :mod:`memform.report.render` because it needs no closed forms: it renders
any estimate's numbers (:class:`memform.engine.results.EstimateNumbers`, interpreted or from
the cached fast path) without importing sympy, which is most of a cold start.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import jinja2

from ..resources import templates_dir
from ..units import human_bytes, human_count

TABLE_TEMPLATE = "estimate.txt.j2"


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
        line += f", MFU {100 * d['mfu']:.1f} %"
    if d["tokens_per_second"] is not None:
        line += f", {d['tokens_per_second']:,.0f} tokens/s"
    return line


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    env.filters["bytes"] = human_bytes
    return env


def render_table(est: Any) -> str:
    """The per-stage table ``memform estimate`` prints."""
    return _environment().get_template(TABLE_TEMPLATE).render(**table_context(est))
