"""What the multi-rank framework tests share: a harness's quick cases run on their gloo ranks and every row
held to its recorded bound (bench/validate.py --frameworks --record)."""

from __future__ import annotations

from typing import Any


def quick_rows_within_bounds(mod: Any) -> list[Any]:
    """Run ``mod.quick_sweep()`` (one spawned group per world size) and assert every category of every row
    within its own recorded bound; the rows, for the caller's own checks."""
    from memform.validation import frameworks

    cases = mod.quick_sweep()
    mod.run(cases)
    rows = [frameworks.compare(c, mod) for c in cases]
    over = [f"{r.case.label()}: {c} {r.error(c):+.2%}" for r in rows for c in r.failures()]
    assert not over, "\n".join(over) + "\n" + frameworks.format_table(rows)
    assert all(r.measured["comm"] > 0 and r.measured["params"] > 0 for r in rows)
    return rows
