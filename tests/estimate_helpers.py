"""Estimates for tests that read NUMBERS only (issue 32/35: the suite within its time budget at equal power).

:func:`numbers` is the interpreter's numeric path (``memform.engine.model.estimate(..., numeric=True)``:
plain ints and fractions, no sympy, no compile of the fast path). tests/test_numeric.py proves its numbers
equal to the sympy evaluator's on every bundled config under every framework profile (every category,
moment, layer group, per-layer value, parameter count and reserve) and tests/test_fastpath.py ties those to
the full symbolic interpreter's and to the compiled fast path's, so a test that compares numbers loses no
power by reading them here (3-12x cheaper than the symbolic estimate, and no per-structure compile as
``memform.estimate`` does the second time a process asks for a structure). Tests of closed forms, of the
public ``memform.estimate`` object or of its fast path keep calling those.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any


def numbers(config: Any, overrides: Any = None) -> Any:
    """The :class:`memform.engine.model.Estimate` of ``config`` with ``overrides``, numbers only (every stage's
    ``exprs`` and each layer group's ``per_layer_values`` are plain numbers; no closed forms). Where a formula's
    value is irrational the sympy evaluator with every symbol replaced by its value answers instead."""
    from memform.engine.model import estimate_numbers
    return estimate_numbers(config, overrides)


def numeric_model(config: Any, overrides: Any = None) -> Any:
    """``memform.engine.model.load_model(..., numeric=True)``: a model whose evaluator gives plain numbers."""
    from memform.engine.model import load_model
    return load_model(config, overrides, numeric=True)


@lru_cache(maxsize=None)
def bundled(config: Path) -> Any:
    """``memform.estimate(config)`` of a bundled config file as a process's first call answers it
    (:func:`memform.fastpath.fastcache.numeric_estimate`: a ``FastEstimate`` with the numeric path's numbers
    whose closed forms, ``.full``, are the symbolic interpreter's, built on first use), once per process: the
    every-bundled-config loops of tests/test_reports.py, test_fastpath.py, test_table_width.py and
    test_fuzz_formulas.py read the same object, so each config's symbolic estimate (0.1-2 CPU-s) is built
    once, not once per loop. Read-only: a test must not change it. bench/mutate.py clears it before each test it
    runs (a mutant is served in the same process)."""
    from memform.fastpath.fastcache import numeric_estimate
    est = numeric_estimate(config)
    assert est is not None, f"{config}: the bundled config is refused"
    return est
