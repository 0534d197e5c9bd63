"""Presenting closed forms: the light simplification shared by every output format."""

from __future__ import annotations

import re
from functools import lru_cache

import sympy


@lru_cache(maxsize=4096)
def tidy(expr: sympy.Expr) -> sympy.Expr:
    """Expand, then pull common factors out: cheap, canonical, readable.

    Cached (sympy expressions are immutable and hashable) because every output format asks for
    the same stage totals and tidying is the slowest step of an estimate.
    """
    return sympy.factor_terms(sympy.expand(expr))


def closed_form_text(expr: sympy.Expr) -> str:
    return sympy.sstr(tidy(expr), order="grlex")


def closed_form_latex(expr: sympy.Expr) -> str:
    return sympy.latex(tidy(expr))


_PROSE = re.compile(r"[A-Za-z]{2,} [A-Za-z]{2,}")


def ordered_assumptions(assumptions: list[str]) -> list[str]:
    """The decisions a closed form rests on, prose ones (``moment backward is the largest at
    stage 0``) first, then the (in)equalities, each group in the order they were taken."""
    prose = [a for a in assumptions if _PROSE.search(a)]
    return prose + [a for a in assumptions if not _PROSE.search(a)]


def assumption_lines(assumptions: list[str], head: str = "valid where:", indent: str = "  ") -> list[str]:
    """``valid where:`` followed by one assumption per line (see :func:`ordered_assumptions`)."""
    return [head] + [indent + a for a in ordered_assumptions(assumptions)]
