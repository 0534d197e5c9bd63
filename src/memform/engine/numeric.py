"""The numeric backend of :mod:`memform.engine.walker`: Python ``int`` and ``Fraction``, no sympy.

An estimate's numbers need no computer algebra: with every symbol replaced by its value as it is
read, each formula is a rational number, and exact rational arithmetic gives the same number as
sympy's ``Rational`` (both are exact). This backend is what a cold ``memform estimate`` runs: a
parse plus an evaluation, without the ~0.3 s import of sympy.

Its decisions are the symbolic evaluator's with ``keep=frozenset()`` (every condition is a number
there too, so no assumption is recorded); the walk that makes them is shared. Where a value is not
rational (``log2`` of a number that is not a power of two, a fractional power, a power of zero
with a negative exponent) it raises :class:`Inexact` and the caller evaluates the config with sympy
instead, so such formulas still give sympy's exact irrational answer (or its error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterable

from ..errors import Loc
from .walker import PY_CMP, Value, Walker

Number = int | Fraction


class Inexact(Exception):
    """A value is not a rational number: use the symbolic evaluator for this config."""


def exact(x: Number) -> Number:
    """``x`` with an integral Fraction as an int (the one representation of each integer)."""
    if type(x) is Fraction and x.denominator == 1:
        return x.numerator
    return x


@dataclass
class NumericEvaluator(Walker):
    """The walk with exact Python numbers; every symbol is replaced by its value (``keep`` is ignored:
    nothing stays symbolic), so every condition is decided on the spot."""

    # ---------------------------------------------------------------- numbers
    def integer(self, n: int) -> int:
        return int(n)

    def literal(self, text: str) -> Number:
        return exact(Fraction(text))

    def is_number(self, v: Any) -> bool:
        return type(v) is int or type(v) is Fraction

    def is_integer(self, n: Any) -> bool:
        return type(n) is int or (type(n) is Fraction and n.denominator == 1)

    def total(self, terms: Iterable[Number]) -> Number:
        return exact(sum(terms, 0))

    def at_least(self, lo: int, v: Number) -> Number:
        return max(lo, v)

    def bits(self, v: Any) -> float:
        return max(abs(v.numerator).bit_length(), v.denominator.bit_length())

    def binding(self, name: str) -> Value:
        decl = self.program.bindings[name]
        if decl.keyword == "option":
            return self.options[name]
        return self.values[self.symbols[name]]

    def keeps(self, name: str) -> bool:
        return False

    def number(self, value: Value, loc: Loc | None = None, what: str = "expression") -> Number:
        return self.as_expr(value, loc)

    def _check_value(self, value: Any, label: str, loc: Loc | None) -> None:
        if self.is_number(value):
            self._check_size(value, label, loc)

    # ---------------------------------------------------------------- operators
    def _is_zero(self, b: Number) -> bool:
        return b == 0

    def _is_unit(self, a: Number) -> bool:
        return abs(a) in (0, 1)

    def _arith(self, op: str, a: Number, b: Number) -> Number:
        if op == "+":
            return exact(a + b)
        if op == "-":
            return exact(a - b)
        if op == "*":
            return exact(a * b)
        if op == "/":
            return exact(Fraction(a) / b)
        if op == "%":
            return exact(a % b)
        if not self.is_integer(b):
            raise Inexact("a fractional power")
        if b < 0 and a == 0:
            raise Inexact("a power of zero with a negative exponent")
        return exact(Fraction(a) ** int(b))

    def _compare(self, op: str, a: Number, b: Number, loc: Loc) -> bool:
        return PY_CMP[op](a, b)

    def _truth_other(self, v: Value, loc: Loc) -> bool:
        return self.as_expr(v, loc) != 0

    def _extreme(self, f: str, nums: list[Number], loc: Loc) -> Number:
        return min(nums) if f == "min" else max(nums)

    def _round(self, f: str, x: Number, loc: Loc) -> int:
        return math.ceil(x) if f == "ceil" else math.floor(x)

    def _log2(self, x: Number) -> int:
        x = Fraction(x)
        p, q = x.numerator, x.denominator
        if p == 1 and q & (q - 1) == 0:
            return -(q.bit_length() - 1)
        if q == 1 and p & (p - 1) == 0:
            return p.bit_length() - 1
        raise Inexact("log2 of a number that is not a power of two")

    def _abs(self, x: Number) -> Number:
        return abs(x)

    def _layers_max(self, distinct: list[Number], loc: Loc) -> Number:
        return max(distinct)
