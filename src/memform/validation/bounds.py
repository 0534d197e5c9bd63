"""Per-case bounds: each measured case is held to its own recorded agreement, not to its suite's worst.

A suite's thresholds (``compare.THRESHOLDS``, ``distributed.THRESHOLDS``, ``frameworks.THRESHOLDS``, ...)
are set by its worst case, so one −3.9 % row would let every other row drift by as much unnoticed. The
harnesses' byte counts are deterministic on one build (same torch, same seeds), so each case's signed
error per category is recorded once (``python bench/validate.py [--amp|--fsdp2|--distributed|--frameworks]
--record``, written to ``bounds.yaml`` beside this module) and that case is then held to

    bound = min(|recorded| + SLACK, the suite's threshold),   exactly 0 where the recorded error is 0,

so a formula change that moves one case by more than a tenth of a percentage point fails that case. A case
the file does not know is held to its suite's thresholds (printed as such). A bound looser than its
recorded agreement is written under ``loosened:`` in the file with the reason, and the table says so.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping

#: the recorded agreement of every measured case (``--record`` rewrites the suite it ran)
BOUNDS_FILE = Path(__file__).with_name("bounds.yaml")
#: room above a case's recorded |error| (a fraction: 0.1 percentage point): byte counts repeat exactly
#: on one build; a tenth of a point absorbs a changed library's odd tensor without hiding a formula change
SLACK = 0.001
#: the suites of ``bench/validate.py``: its modes, and the row key each uses
SUITES = ("single", "amp", "fsdp2", "distributed", "frameworks")


@lru_cache(maxsize=1)
def _file() -> dict[str, Any]:
    import yaml
    if not BOUNDS_FILE.exists():
        return {}
    return yaml.safe_load(BOUNDS_FILE.read_text(encoding="utf-8")) or {}


def recorded(suite: str, case: str) -> dict[str, float] | None:
    """The signed errors recorded for ``case`` of ``suite`` (None: never recorded)."""
    return (_file().get("recorded", {}).get(suite) or {}).get(case)


def loosened(suite: str, case: str) -> dict[str, dict[str, Any]]:
    """``{category: {"bound": b, "why": text}}`` for the categories of ``case`` held looser than recorded."""
    return (_file().get("loosened", {}).get(suite) or {}).get(case) or {}


def own_bound(error: float) -> float:
    """The bound a recorded signed ``error`` gives: 0 where exact, else |error| + SLACK rounded up to
    0.01 percentage point."""
    if error == 0:
        return 0.0
    return math.ceil(round((abs(error) + SLACK) * 10_000, 6)) / 10_000   # round first: 244.00000000000003


def limits(suite: str, case: str, defaults: Mapping[str, float]) -> dict[str, float]:
    """The bound of each category of ``case``: its own recorded agreement where recorded (never looser than
    the suite's ``defaults``, which a case over them keeps failing), a ``loosened`` entry where one is
    written, the suite's threshold otherwise."""
    rec = recorded(suite, case) or {}
    out = {}
    for cat, default in defaults.items():
        out[cat] = min(own_bound(rec[cat]), default) if cat in rec else default
    for cat, entry in loosened(suite, case).items():
        if cat in defaults:
            out[cat] = min(float(entry["bound"]), defaults[cat])
    return out


def source(suite: str, case: str) -> str:
    """How ``case`` is bounded, for the tables: ``own`` (its recorded agreement), ``own, loosened: cat``
    or ``suite`` (not recorded)."""
    if recorded(suite, case) is None:
        return "suite"
    loose = loosened(suite, case)
    return "own" + (f", loosened: {', '.join(loose)}" if loose else "")


def record(suite: str, rows: Iterable[tuple[str, Mapping[str, float]]]) -> Path:
    """Write the signed errors of this run's ``rows`` ((case, {category: error})) as ``suite``'s recorded
    agreement, keeping the other suites, the cases this run did not measure and every ``loosened`` entry."""
    import yaml
    data = dict(_file())
    rec = dict(data.get("recorded") or {})
    suite_rec = dict(rec.get(suite) or {})
    for case, errors in rows:
        # four significant digits: a -1e-7 (a few bytes in 12 GiB) must not read as exact
        suite_rec[case] = {c: (0 if e == 0 else float(f"{e:.4g}")) for c, e in errors.items()
                           if e is not None and math.isfinite(e)}
    rec[suite] = dict(sorted(suite_rec.items()))
    data["recorded"] = dict(sorted(rec.items()))
    data.setdefault("loosened", {})
    head = ("# memform.validation.bounds: each measured case's recorded signed error per category (a fraction),\n"
            "# written by `python bench/validate.py [--amp|--fsdp2|--distributed|--frameworks] --record`;\n"
            "# a case is held to |recorded| + 0.1 percentage point (0 where exact), never looser than its suite.\n"
            "# `loosened:` lists bounds set looser than recorded, each with the reason (edit by hand).\n")
    BOUNDS_FILE.write_text(head + yaml.safe_dump({"loosened": data["loosened"], "recorded": data["recorded"]},
                                                 sort_keys=False, width=120, allow_unicode=True), encoding="utf-8")
    _file.cache_clear()
    return BOUNDS_FILE
