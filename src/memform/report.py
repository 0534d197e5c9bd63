"""Rendering estimates for people: Jinja2 templates shipped in ``memform/templates``."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import jinja2

from .api import Estimate
from .engine import CATEGORIES
from .resources import templates_dir
from .symbolic import closed_form_latex, closed_form_text

_UNITS = (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10))


def human_bytes(n: int | float) -> str:
    """Bytes in binary units, e.g. ``56.95 GiB`` (no unit below 1 KiB)."""
    for unit, size in _UNITS:
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), autoescape=False,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["bytes"] = human_bytes
    env.filters["closed_form"] = closed_form_text
    env.filters["latex"] = closed_form_latex
    return env


def context(est: Estimate) -> dict[str, Any]:
    """What every template sees (documented in the README)."""
    st = est.model.structure
    return {
        "est": est,
        "name": est.name,
        "schedule": st.schedule,
        "pp": st.pp,
        "vpp": st.vpp,
        "recompute": st.recompute,
        "capacity_bytes": est.capacity_bytes,
        "peak_bytes": est.peak_bytes,
        "peak_stage": est.peak_stage,
        "fits": est.fits,
        "categories": CATEGORIES,
        "stages": est.stages,
        "partition": est.partition,
        "assumptions": est.assumptions,
    }


def render(template: str, est: Estimate, **extra: Any) -> str:
    return environment().get_template(template).render(**context(est), **extra)
