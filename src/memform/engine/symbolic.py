"""Presenting closed forms: the light simplification shared by every output format."""

from __future__ import annotations

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
