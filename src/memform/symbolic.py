"""Presenting closed forms: the light simplification shared by every output format."""

from __future__ import annotations

import sympy


def tidy(expr: sympy.Expr) -> sympy.Expr:
    """Expand, then pull common factors out: cheap, canonical, readable."""
    return sympy.factor_terms(sympy.expand(expr))


def closed_form_text(expr: sympy.Expr) -> str:
    return sympy.sstr(tidy(expr), order="grlex")


def closed_form_latex(expr: sympy.Expr) -> str:
    return sympy.latex(tidy(expr))
