"""Formula AST → sympy, for one bound config (the symbolic backend of :mod:`memform.engine.walker`).

Two ways to treat a condition that involves symbols (``if p > 1 ...``, ``min(p - stage, m)``):

* ``resolve=True`` (default): decide it at the config's values and keep only the branch that
  applies, recording the decision as an *assumption* (``p >= 2``). The closed form is then
  the one a paper would print for this strategy, valid wherever the assumptions hold.
* ``resolve=False``: keep ``Piecewise``/``Min``/``Max`` so the expression is valid for every
  value (what a planner evaluating many strategies needs).

Symbols not in ``keep`` are replaced by their numbers as they are read, so ``keep=set()``
gives a plain numeric evaluation with exact rationals. The numbers alone, without sympy, come
from :class:`memform.engine.numeric.NumericEvaluator` (same walk, same decisions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable

import sympy

from ..errors import Loc, MemformError
from .walker import MAX_BITS, MAX_DEPTH, Ctx, LayerSlot, Value, Walker  # noqa: F401 (re-exported)

_CMP: dict[str, Callable[[Any, Any], Any]] = {
    "==": sympy.Eq, "!=": sympy.Ne, "<": sympy.Lt, "<=": sympy.Le, ">": sympy.Gt, ">=": sympy.Ge,
}


@dataclass
class Evaluator(Walker):
    """The walk with sympy arithmetic: symbols in ``keep`` stay symbolic (closed forms)."""

    #: :func:`_point` of sub-expressions at this evaluator's values (a stage's sums repeat its layers'
    #: closed forms: each is evaluated once); rational values as Fractions, None where it declines
    _point_memo: dict = field(default_factory=dict)

    # ---------------------------------------------------------------- numbers
    def integer(self, n: int) -> sympy.Integer:
        return sympy.Integer(n)

    def literal(self, text: str) -> sympy.Rational:
        return sympy.Rational(text)

    def is_number(self, v: Any) -> bool:
        return bool(v.is_number)

    def is_integer(self, n: Any) -> bool:
        return bool(n.is_integer)

    def total(self, terms: Any) -> sympy.Expr:
        return sympy.Add(*terms)

    def at_least(self, lo: int, v: Any) -> sympy.Expr:
        return sympy.Max(lo, v)

    def bits(self, v: Any) -> float:
        return _bits(v, self.values, self._bits_memo)

    def is_finite_real(self, n: Any) -> bool:
        return not (n is sympy.nan or n.has(sympy.zoo, sympy.oo, -sympy.oo) or not n.is_real)

    def approx(self, n: Any) -> str:
        return str(n.evalf(3))

    def number(self, value: Value, loc: Loc | None = None, what: str = "expression") -> sympy.Expr:
        """The exact numeric value of ``value`` at the config."""
        v = self.as_expr(value, loc)
        if not v.is_Rational:
            # the rational value by plain Fraction arithmetic over the tree (no substitution, no
            # free-symbol scan); anything it does not evaluate exactly (a division by zero, log2,
            # a fractional power, ...) goes the way below, which also words the errors
            r = _point(v, self.values, self._point_memo)
            if r is not None:
                return sympy.Rational(r.numerator, r.denominator)
        free = v.free_symbols
        if free:
            key = (v, tuple(sorted(((s, self.values.get(s)) for s in free), key=lambda p: p[0].name)))
            hit = _NUMBERS.get(key)
            if hit is not None:
                return hit
        n = self._number(v, free, loc, what)
        if free:
            if len(_NUMBERS) > 50_000:
                _NUMBERS.clear()
            _NUMBERS[key] = n
        return n

    def _number(self, v: sympy.Expr, free: set, loc: Loc | None, what: str) -> sympy.Expr:
        try:
            n = v.xreplace(self.values) if free else v
            if not n.is_number:
                raise MemformError(f"{what} does not reduce to a number: {n}", loc)
            if n.is_Rational:
                return n
            # e.g. log(8)/log(2) -> 3 log(2)/log(2) = 3: exact where it can be, and cheap (unlike
            # simplify(), which can run for minutes on an irrational sum)
            n = sympy.expand_log(n, force=True)
            finite = n.is_Rational or _finite_real(n)
        except (TypeError, ValueError, ZeroDivisionError) as exc:
            reason = "division by zero" if isinstance(exc, ZeroDivisionError) else str(exc)
            raise MemformError(f"{what} cannot be evaluated for this config: {reason}", loc) from None
        if not finite:
            shown = ("infinity (zoo)" if n.has(sympy.zoo, sympy.oo, -sympy.oo) else "NaN" if n.has(sympy.nan)
                     else str(n))
            raise MemformError(f"{what} evaluates to {shown} for this config, which is not a finite real number "
                               f"(a division by zero, log2 of 0 or of a negative number, ...?)", loc)
        return n

    def _check_value(self, value: Any, label: str, loc: Loc | None) -> None:
        if isinstance(value, sympy.Expr):
            self._check_size(value, label, loc)
            if not value.is_Rational and _may_be_singular(value):
                self.number(value, loc, label)

    # ---------------------------------------------------------------- operators
    def is_condition(self, v: Value) -> bool:
        return isinstance(v, sympy.logic.boolalg.Boolean) and not isinstance(v, sympy.Expr)

    def _operand(self, v: sympy.Expr, loc: Loc) -> sympy.Expr:
        """``v``, after checking that a number that is not plainly rational is finite and real."""
        if v.is_number and not v.is_Rational:
            return self.number(v, loc, "operand")
        return v

    def _is_zero(self, b: sympy.Expr) -> bool:
        return bool(b.is_number and b == 0)

    def _is_unit(self, a: sympy.Expr) -> bool:
        return bool(a.is_number and a.is_Rational and abs(a) in (0, 1))

    def _arith(self, op: str, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "/":
            return a / b
        if op == "%":
            return sympy.Mod(a, b)
        return a ** b

    def _compare(self, op: str, a: sympy.Expr, b: sympy.Expr, loc: Loc) -> Value:
        rel = _CMP[op](a, b)
        if rel is sympy.true or rel is sympy.false:
            return bool(rel)
        return self.truth(rel, loc)

    def _truth_other(self, v: Value, loc: Loc) -> Value:
        if v is sympy.true or v is sympy.false:
            return bool(v)
        if isinstance(v, sympy.Expr):
            if v.is_number:
                return bool(v != 0)
            v = sympy.Ne(v, 0)
        if self.resolve:
            decided = self._decide(v, loc)
            self.assume(v if decided else sympy.Not(v))
            return decided
        return v

    def _decide(self, cond: Any, loc: Loc) -> bool:
        """Truth of a symbolic condition at the config's values; both sides must be finite reals."""
        if isinstance(cond, sympy.core.relational.Relational):
            for side in (cond.lhs, cond.rhs):
                self.number(side, loc, "a side of this comparison")
        try:
            return bool(cond.xreplace(self.values))
        except (TypeError, ValueError, ZeroDivisionError) as exc:
            raise MemformError(f"the condition {cond} cannot be decided for this config: {exc}", loc) from None

    def _cond_text(self, cond: Any) -> str:
        if isinstance(cond, sympy.Eq):  # sympy prints these as Eq(a, b); papers write a = b
            return f"{cond.lhs} = {cond.rhs}"
        if isinstance(cond, sympy.Ne):
            return f"{cond.lhs} != {cond.rhs}"
        return str(cond)

    def _combine(self, is_and: bool, parts: list[Value]) -> Value:
        return sympy.And(*parts) if is_and else sympy.Or(*parts)

    def _negate(self, cond: Value) -> Value:
        return sympy.Not(cond)

    def _piecewise(self, cond: Value, then: sympy.Expr, other: sympy.Expr) -> sympy.Expr:
        return sympy.Piecewise((then, _without_piecewise(cond)), (other, True), evaluate=False)

    def _extreme(self, f: str, nums: list[sympy.Expr], loc: Loc) -> sympy.Expr:
        cls = sympy.Min if f == "min" else sympy.Max
        if not self.resolve:
            return lattice(cls, nums)
        return self._winner(cls, nums, loc, f"an argument of {f}()")

    def _winner(self, cls: type, args: list[sympy.Expr], loc: Loc, what: str) -> sympy.Expr:
        """The argument of ``cls`` (Min or Max) that wins at the config's values, assuming it beats each
        argument it is not provably at least as good as. This was sympy's constructor (which drops the
        arguments it proves losing) followed by a numeric pick; the constructor retries every undecided pair
        after ``factor_terms``, which on the step-time model's overlap clamps (``max(0, X)`` of a 500-operation
        X) decided nothing and was most of a symbolic estimate's time. Here a pair is compared as the
        constructor compares it, and retried after ``factor_terms`` only at formula size (:data:`FACTOR_OPS`);
        every argument is checked against every other, so a condition the constructor's order-dependent pass
        would leave may be proven and dropped, never one added (tests/test_winner.py). Ties go to the first
        argument in sympy's canonical order, as the constructor ordered them."""
        numbers = [a for a in args if a.is_number]
        alive = list(dict.fromkeys(a for a in args if not a.is_number))
        if numbers:
            alive.append(min(numbers) if cls is sympy.Min else max(numbers))

        def beats(x: sympy.Expr, y: sympy.Expr) -> bool:  # provably x <= y (Min) / x >= y (Max)
            lo, hi = (x, y) if cls is sympy.Min else (y, x)
            try:  # both spellings: a class may know its own order (ceiling(a) >= a) only as the left operand
                if (lo <= hi) is sympy.true or (hi >= lo) is sympy.true:
                    return True
            except TypeError:  # not comparable (the number check refuses it if it wins)
                return False
            # the constructor's second try, on differences of formula size (not the time model's sums)
            d = hi - lo
            return d.count_ops() <= FACTOR_OPS and bool(sympy.factor_terms(d).is_extended_nonnegative)

        # drop every argument another provably beats (ties: the later one), against every argument, not only
        # the ones left: what beats a dropped one beats what it beat
        n = len(alive)
        dropped = {j for j in range(n) if any(i != j and beats(alive[i], alive[j]) and (i < j or not beats(alive[j], alive[i]))
                                              for i in range(n))}
        alive = [a for j, a in enumerate(alive) if j not in dropped]
        if len(alive) == 1:
            return alive[0]
        alive = list(sympy.ordered(alive))
        vals = [self.number(a, loc, what) for a in alive]
        chosen = alive[vals.index(min(vals) if cls is sympy.Min else max(vals))]
        for other in alive:
            if other is not chosen:
                self.assume(sympy.Le(chosen, other) if cls is sympy.Min else sympy.Ge(chosen, other))
        return chosen

    def _round(self, f: str, x: sympy.Expr, loc: Loc) -> sympy.Expr:
        res = (sympy.ceiling if f == "ceil" else sympy.floor)(x)
        if self.resolve and isinstance(res, (sympy.ceiling, sympy.floor)):
            if self.number(x, loc, f"the argument of {f}()").is_integer:
                self.assume(f"{x} is an integer")
                return x
        return res

    def _log2(self, x: sympy.Expr) -> sympy.Expr:
        return sympy.log(x, 2)

    def _abs(self, x: sympy.Expr) -> sympy.Expr:
        return sympy.Abs(x)

    def _layers_max(self, distinct: list[sympy.Expr], loc: Loc) -> sympy.Expr:
        if not self.resolve:
            return lattice(sympy.Max, distinct)
        return self._winner(sympy.Max, distinct, loc, "an argument of layers_max()")


def _may_be_singular(e: sympy.Expr) -> bool:
    """Whether ``e`` could be infinite, NaN or complex at some values of its (positive) symbols:
    it divides by, takes a fractional power or log2 of, or reduces modulo something not
    known to be positive. Most formulas cannot, and skip the numeric check."""
    if e.is_number:
        return True
    for a in e.atoms(sympy.Pow, sympy.log, sympy.Mod):
        if not a.is_Pow or not (a.exp.is_integer and a.exp.is_nonnegative):
            if not (a.args[0].is_positive and (not isinstance(a, sympy.Mod) or a.args[1].is_positive)):
                return True
    return False


class _Decline(Exception):
    """:func:`_point` cannot evaluate an expression exactly with Fractions."""


def _point(e: sympy.Basic, values: dict, memo: dict) -> Fraction | None:
    """The exact rational value of ``e`` at ``values`` (symbol -> sympy number), or None where it is
    not a plain rational computation (a non-rational value, a division by zero, a fractional power,
    log, ...): what ``e.xreplace(values)`` gives when that is rational, without building sympy objects.
    ``memo``: values of sub-expressions at these ``values``."""
    try:
        return _pval(e, values, memo)
    except (_Decline, ZeroDivisionError, OverflowError, RecursionError):
        return None


def _pval(e: Any, values: dict, memo: dict) -> Fraction:
    hit = memo.get(e)
    if hit is not None:
        return hit
    if e.is_Rational:
        r = Fraction(int(e.p), int(e.q))
    elif e.is_Symbol:
        v = values.get(e)
        if v is None or not getattr(v, "is_Rational", False):
            raise _Decline
        r = Fraction(int(v.p), int(v.q))
    else:
        f = _POINT_OPS.get(type(e))
        if f is None:
            raise _Decline
        r = f(e, values, memo)
    memo[e] = r
    return r


def _p_add(e: Any, values: dict, memo: dict) -> Fraction:
    return sum((_pval(a, values, memo) for a in e.args), Fraction(0))


def _p_mul(e: Any, values: dict, memo: dict) -> Fraction:
    out = Fraction(1)
    for a in e.args:
        out *= _pval(a, values, memo)
    return out


def _p_pow(e: Any, values: dict, memo: dict) -> Fraction:
    base, exp = e.args
    if not exp.is_Integer or abs(int(exp)) > 4096:
        raise _Decline
    b = _pval(base, values, memo)
    if b == 0 and exp < 0:
        raise _Decline   # zoo
    return b ** int(exp)


def _p_piecewise(e: Any, values: dict, memo: dict) -> Fraction:
    # every branch and condition evaluated (none short-circuited): a value comes back only where
    # substituting into the whole expression meets nothing but finite rationals
    found = [(_ptruth(b.cond, values, memo), _pval(b.expr, values, memo)) for b in e.args]
    for holds, value in found:
        if holds:
            return value
    raise _Decline   # no branch holds: nan


def _p_mod(e: Any, values: dict, memo: dict) -> Fraction:
    a, b = (_pval(x, values, memo) for x in e.args)
    if b == 0:
        raise _Decline
    return a - b * math.floor(a / b)


def _ptruth(c: Any, values: dict, memo: dict) -> bool:
    if c is sympy.true:
        return True
    if c is sympy.false:
        return False
    hit = memo.get(c)
    if hit is not None:
        return hit
    f = _TRUTH_OPS.get(type(c))
    if f is None:
        raise _Decline
    out = f(c, values, memo)
    memo[c] = out
    return out


def _ite(c: bool, a: bool, b: bool) -> bool:
    return a if c else b


_REL = {sympy.StrictLessThan: lambda a, b: a < b, sympy.LessThan: lambda a, b: a <= b,
        sympy.StrictGreaterThan: lambda a, b: a > b, sympy.GreaterThan: lambda a, b: a >= b,
        sympy.Equality: lambda a, b: a == b, sympy.Unequality: lambda a, b: a != b}

_POINT_OPS: dict[type, Callable[..., Fraction]] = {
    sympy.Add: _p_add, sympy.Mul: _p_mul, sympy.Pow: _p_pow, sympy.Piecewise: _p_piecewise, sympy.Mod: _p_mod,
    sympy.Max: lambda e, v, m: max(_pval(a, v, m) for a in e.args),
    sympy.Min: lambda e, v, m: min(_pval(a, v, m) for a in e.args),
    sympy.ceiling: lambda e, v, m: Fraction(math.ceil(_pval(e.args[0], v, m))),
    sympy.floor: lambda e, v, m: Fraction(math.floor(_pval(e.args[0], v, m))),
    sympy.Abs: lambda e, v, m: abs(_pval(e.args[0], v, m)),
}
_TRUTH_OPS: dict[type, Callable[..., bool]] = {
    **{cls: (lambda op: lambda c, v, m: op(_pval(c.lhs, v, m), _pval(c.rhs, v, m)))(op) for cls, op in _REL.items()},
    sympy.And: lambda c, v, m: all([_ptruth(a, v, m) for a in c.args]),
    sympy.Or: lambda c, v, m: any([_ptruth(a, v, m) for a in c.args]),
    sympy.Not: lambda c, v, m: not _ptruth(c.args[0], v, m),
    sympy.ITE: lambda c, v, m: _ite(*[_ptruth(a, v, m) for a in c.args]),
}


def _finite_real(n: sympy.Expr) -> bool:
    """Whether the (non-rational) number ``n`` is finite and real, judged at 30 digits."""
    if n.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo):
        return False
    approx = n.evalf(30)
    return bool(approx.is_Float or approx.is_Rational) and bool(approx.is_finite)


def _bits(e: sympy.Basic, values: dict, memo: dict) -> float:
    """A cheap upper bound of log2 of the magnitude of ``e`` (numerators and denominators) at ``values``."""
    if e in memo:
        return memo[e]
    if e.is_Rational:
        out: float = max(int(e.p).bit_length(), int(e.q).bit_length())
    elif e.is_Symbol:
        val = values.get(e)
        out = _bits(val, values, memo) if val is not None else 64
    elif e.is_Pow:
        base, ex = e.args
        if base.is_Rational and abs(base) in (0, 1):
            out = 1
        else:
            ex_bits = _bits(ex, values, memo)
            if ex_bits > 64:
                out = math.inf
            else:
                try:
                    mag = abs(complex(ex.xreplace(values).evalf(15)))
                except (TypeError, ValueError):
                    mag = 2.0 ** ex_bits
                out = _bits(base, values, memo) * max(mag, 1.0)
    elif e.is_Mul:
        out = sum(_bits(a, values, memo) for a in e.args)
    elif e.args:
        out = max(_bits(a, values, memo) for a in e.args) + 1
    else:
        out = 64  # Float, pi, zoo, ...
    memo[e] = out
    return out


def _without_piecewise(cond: Any) -> Any:
    """A condition over a ``Piecewise`` (``x > (a if c else b)``) as an if-then-else of plain conditions.

    sympy's Piecewise constructor rewrites such a condition itself, through a set-theoretic
    exhaustiveness check whose cost explodes with nesting (minutes for a chain of a few
    framework-profile ifs); substituting each branch gives the same condition directly:
    ``ITE(c, x > a, x > b)``.
    """
    if not (isinstance(cond, sympy.Basic) and cond.has(sympy.Piecewise)):
        return cond
    pw = next(iter(cond.atoms(sympy.Piecewise)))
    if pw.args[-1].cond is not sympy.true:
        return cond  # not exhaustive: left to sympy
    out = _without_piecewise(cond.xreplace({pw: pw.args[-1].expr}))
    for branch in reversed(pw.args[:-1]):
        out = sympy.ITE(_without_piecewise(branch.cond), _without_piecewise(cond.xreplace({pw: branch.expr})), out)
    return out


#: exact values of expressions at given symbol values, shared by every evaluator of this process:
#: a search's structures share most per-layer expressions, and substituting into a large closed
#: form is a large part of interpreting one (key: the expression and its free symbols' values)
_NUMBERS: dict[tuple, sympy.Expr] = {}


#: :meth:`Evaluator._winner` retries an undecided comparison after ``factor_terms`` (as sympy's Min/Max do) only
#: for a difference of at most this many operations: every memory formula's (the one such proof among the
#: bundled configs and profiles, nemotron-4-340b under mindspore, is a 60-operation difference), not the
#: 200-600-operation overlap clamps of the step-time model, where it decided nothing and cost 2x the estimate
FACTOR_OPS = 150


def lattice(cls: type, args: list[sympy.Expr]) -> sympy.Expr:
    """``Min``/``Max`` of ``args`` for a closed form that must hold everywhere (``resolve=False``).

    sympy's own constructor compares every pair of arguments symbolically to drop the ones
    that can never win; that is most of a structure's compile time and buys nothing, since the
    exact compiler evaluates whatever arguments remain. Numbers are folded and duplicates
    dropped; the rest is kept unevaluated.
    """
    numbers = [a for a in args if a.is_number]
    out = list(dict.fromkeys(a for a in args if not a.is_number))
    if numbers:
        out.append(min(numbers) if cls is sympy.Min else max(numbers))
    return out[0] if len(out) == 1 else cls(*out, evaluate=False)
