"""Exact, vectorized evaluation of sympy closed forms over integer numpy arrays.

A strategy search evaluates one closed form for hundreds of thousands of integer symbol
values. Floating point is not good enough for that: a stage needs ~1e11 bytes, float64 has
an ulp of ~1e-5 there, and memform rounds every category *up* to whole bytes, so an exact
integer computed as 137438953472.00001 would come out one byte too large. This module
therefore never uses floats for values. Each expression is compiled once to Python source
that works on ``int64`` arrays:

* a rational function of the inputs is put over a common denominator (``sympy.together``),
  numerator and denominator become integer polynomials, and the value is kept as an exact
  pair ``(numerator, denominator)`` of arrays;
* ``Piecewise``/``Min``/``Max`` become ``np.select``/``np.where`` on exact sign tests,
  ``ceiling``/``floor``/``Mod``/``Abs`` become integer floor division;
* every polynomial is guarded: before it is evaluated, a float upper bound of every partial
  product and sum (``Σ |c|·Π max|x|^k``) is computed from the batch maxima; if it could
  exceed 2**62, each row's own bound is computed (:func:`_wide`) and only if one of those
  could exceed it too is the polynomial evaluated on Python-int object arrays (slow, still
  exact). So results are exact whatever the magnitudes, and fast when they fit in int64.
  (The Python-int form is carried as a string and compiled only when needed, which keeps the
  generated source, and Python's compile of it, small.)

One exception, asked for by name: outputs marked ``approximate`` (:func:`compile_exact`) are
computed in float64 with exact branch conditions. The step-time model's seconds divide by device
constants (FLOP/s × efficiency, bandwidths), whose common denominators, times 10**12 picoseconds,
leave int64 in every row; exactly, they ran on Python ints and took most of a search's evaluation,
for a last picosecond that means nothing in a step-time estimate.

Anything that is not exact in rational arithmetic (``log`` of a searched symbol, fractional
powers) raises :class:`NotExact` rather than giving a rounded answer.

The same builder has a second backend, :func:`compile_js`: the decisions above (common
denominators, sign tests, branch selection, rows that are bad) are made once, in the base class,
and :class:`_JSBuilder` writes them as scalar JavaScript over ``BigInt`` (arbitrary precision, so
without the overflow guard) for the what-if page (:mod:`memform.report.whatif`).
"""

from __future__ import annotations

import base64
import importlib.util
import marshal
import math
import types
import zlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import sympy
import sympy.polys.fields
from sympy.logic.boolalg import ITE, Boolean, BooleanFalse, BooleanTrue

#: polynomials whose bound stays below this are evaluated in int64 (2**63 - 1 is the limit;
#: the margin absorbs the float rounding of the bound itself)
INT64_SAFE = float(2 ** 62)

_ATOMS = (sympy.Piecewise, sympy.Min, sympy.Max, sympy.ceiling, sympy.floor, sympy.Mod, sympy.Abs)
_REL = {sympy.StrictLessThan: "<", sympy.LessThan: "<=", sympy.StrictGreaterThan: ">",
        sympy.GreaterThan: ">=", sympy.Equality: "==", sympy.Unequality: "!="}


class NotExact(Exception):
    """The expression uses an operation that integer arithmetic cannot evaluate exactly."""


@dataclass(frozen=True)
class _Rat:
    """An exact value in generated code: ``num / den`` (``den`` None means 1; den > 0)."""

    num: str
    den: str | None


_OBJECT_CODE: dict[str, Any] = {}


def _on_objects(expr: str, env: Mapping[str, Any]) -> Any:
    """``expr`` (a polynomial of generated code) evaluated with every array it names as Python
    ints: the path a polynomial takes when its bound leaves the int64 range. The generated code
    carries it as a string (compiled here, rarely), so Python compiles each polynomial once."""
    code = _code(expr)
    return eval(code, {}, {name: _as_object(env[name]) for name in code.co_names})  # noqa: S307 - our own code


def _wide(expr: str, magnitude: str, env: Mapping[str, Any], bound: float) -> tuple[Any, float]:
    """A polynomial whose batch-wide bound (every input at its batch maximum) leaves int64:
    ``magnitude``, the same terms with absolute coefficients over the inputs' absolute values,
    gives each row's own bound in float64 (relative error ~1e-15; INT64_SAFE leaves a factor 2).
    If every row's stays below INT64_SAFE, the int64 evaluation is exact (numpy's int64 products
    wrap modulo 2**64, and a result that fits is its own residue), and that bound, far tighter
    than the batch-wide one, goes on to the expressions that use the value; otherwise the rows
    run on Python ints (:func:`_on_objects`). Returns (value, bound of its magnitude)."""
    names = _code(expr).co_names
    if all(isinstance(env[v], np.ndarray) and env[v].dtype == np.int64 for v in names):
        rows = eval(_code(magnitude), {}, {v: np.abs(env[v]).astype(np.float64) for v in names})  # noqa: S307 - our own code
        top = float(np.max(rows)) if isinstance(rows, np.ndarray) and rows.size else float(rows)
        if top < INT64_SAFE:
            return eval(_code(expr), {}, {v: env[v] for v in names}), max(1.0, top)  # noqa: S307 - our own code
    return _on_objects(expr, env), bound


def _code(expr: str) -> types.CodeType:
    """``expr`` (generated code) compiled once per process."""
    code = _OBJECT_CODE.get(expr)
    if code is None:
        code = _OBJECT_CODE[expr] = compile(expr, "<memform.fastpath.exact>", "eval")
    return code


def _as_object(x: Any) -> Any:
    return x.astype(object) if isinstance(x, np.ndarray) and x.dtype != object else x


def _maxabs(x: Any) -> float:
    if isinstance(x, np.ndarray):
        if x.size == 0:
            return 1.0
        m = np.abs(x).max()
    else:
        m = abs(x)
    return max(1.0, float(m))


def _full(n: int, value: Any) -> np.ndarray:
    return np.full(n, value)


@dataclass
class ExactFunction:
    """A compiled batch of expressions; call with one integer array per input symbol.

    Returns ``(values, bad)``: ``values[k]`` is an array of exact integers (``ceil`` of each
    numeric expression, or a bool array for a condition) and ``bad`` marks rows where some
    denominator was zero or no ``Piecewise`` branch applied (the interpreter would refuse).
    """

    inputs: tuple[str, ...]
    source: str
    _fn: Any
    code: Any = None  # the compiled code object of ``source`` (see :meth:`code_text`)

    def code_text(self) -> str | None:
        """The compiled ``source`` as text for a store (marshal, compressed, base64), tagged with
        this Python's bytecode version: :func:`load_exact` then skips compiling the source, and
        another Python compiles it again."""
        if self.code is None:
            return None
        return _CODE_TAG + base64.b64encode(zlib.compress(marshal.dumps(self.code), 1)).decode("ascii")

    def __call__(self, columns: Sequence[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
        arrays = [np.asarray(c, dtype=np.int64) if not (isinstance(c, np.ndarray) and c.dtype == object)
                  else c for c in columns]
        n = len(arrays[0]) if arrays else 1
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # approximate outputs: inf/nan are bad rows
            return self._fn(n, *arrays)


class _Builder:
    def __init__(self, inputs: Sequence[sympy.Symbol]):
        self.lines: list[str] = []
        self.memo: dict[sympy.Basic, _Rat] = {}
        self.bool_memo: dict[sympy.Basic, str] = {}
        self.sign_memo: dict[sympy.Basic, str] = {}
        self.diff_memo: dict[tuple[str, str], str] = {}
        self.poly_memo: dict[tuple[Any, ...], str] = {}
        self.float_memo: dict[sympy.Basic, str] = {}
        self.count = 0
        self.var_of: dict[sympy.Symbol, str] = {}
        self.placeholder: dict[str, sympy.Symbol] = {}
        self.positive: set[str] = set()
        for i, s in enumerate(inputs):
            name = f"x{i}"
            self.var_of[s] = name
            self.placeholder[name] = sympy.Symbol(name, integer=True, positive=True)
            self.positive.add(name)
            self._emit_input(name)

    def fresh(self, prefix: str = "v") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def emit(self, line: str) -> None:
        self.lines.append(line)

    def _placeholder(self, name: str) -> sympy.Symbol:
        sym = self.placeholder.get(name)
        if sym is None:
            sym = self.placeholder[name] = sympy.Symbol(name, integer=True)
        return sym

    # ------------------------------------------------------------ rationals
    def rational(self, expr: sympy.Expr) -> _Rat:
        if expr in self.memo:
            return self.memo[expr]
        if expr.is_Rational:
            p, q = int(expr.p), int(expr.q)
            r = _Rat(repr(p), None if q == 1 else repr(q))
            self.memo[expr] = r
            return r
        gens, n_terms, d_terms = self._prepare(expr)
        if len(d_terms) == 1 and not any(d_terms[0][1]):
            c = d_terms[0][0]
            if c < 0:
                n_terms = [(-k, e) for k, e in n_terms]
                c = -c
            nv = self.poly(n_terms, gens)
            r = _Rat(nv, None if c == 1 else repr(c))
        else:
            nv = self.poly(n_terms, gens)
            dv = self.poly(d_terms, gens)
            used = {gens[i].name for _, e in d_terms for i, k in enumerate(e) if k}
            surely_positive = all(k > 0 for k, _ in d_terms) and used <= self.positive
            if not surely_positive:
                nv, dv = self._emit_positive_den(nv, dv)
            r = _Rat(nv, dv)
        self.memo[expr] = r
        return r

    def _prepare(self, expr: sympy.Expr) -> tuple[list[sympy.Symbol], "Terms", "Terms"]:
        """Atoms compiled and replaced by placeholders; then integer numerator/denominator terms.

        The inputs stay the config's own symbols while the fraction is formed (an expression
        without atoms is converted as it is, and its conversion is shared by every structure);
        the returned generators are the placeholders named as the generated code names them.
        """
        atoms, symbols = _scan(expr)
        free = symbols - self.var_of.keys()
        if free:
            raise NotExact(f"symbols {sorted(map(str, free))} have no input values")
        leaves: dict[sympy.Basic, tuple[sympy.Expr, sympy.Expr]] = {}
        gens = {self.placeholder[self.var_of[sym]]: sym for sym in symbols}
        for atom in atoms:
            r = self.atom(atom)
            n = self._placeholder(r.num) if not _is_literal(r.num) else sympy.Integer(int(r.num))
            d = sympy.Integer(1) if r.den is None else (
                self._placeholder(r.den) if not _is_literal(r.den) else sympy.Integer(int(r.den)))
            leaves[atom] = (n, d)
            for p in (n, d):
                if p.is_Symbol:
                    gens[p] = p
        order = sorted(gens, key=lambda g: g.name)
        terms_n, terms_d = _fraction(expr, tuple(gens[g] for g in order), leaves)
        return order, terms_n, terms_d

    def sign(self, expr: sympy.Expr) -> str:
        """Code for an integer array with the sign of ``expr`` (no denominator when it is surely positive)."""
        if expr in self.sign_memo:
            return self.sign_memo[expr]
        if expr.is_Rational:
            return repr(int(sympy.sign(expr)))
        if expr in self.memo:
            code = self._arr(self.memo[expr].num)
        else:
            gens, n_terms, d_terms = self._prepare(expr)
            used = {gens[i].name for _, e in d_terms for i, k in enumerate(e) if k}
            constant = len(d_terms) == 1 and not any(d_terms[0][1])
            if constant or (all(k > 0 for k, _ in d_terms) and used <= self.positive):
                if all(k < 0 for k, _ in d_terms):
                    n_terms = [(-k, e) for k, e in n_terms]
                code = self._arr(self.poly(n_terms, gens))
            else:
                code = self._arr(self.rational(expr).num)
        self.sign_memo[expr] = code
        return code

    def sign_difference(self, a: _Rat, b: _Rat) -> str:
        """Code for an integer array with the sign of ``a - b``, two computed values over the same
        (positive) denominator: the sign of ``a.num - b.num``, a polynomial in generated variables."""
        key = (a.num, b.num)
        code = self.diff_memo.get(key)
        if code is not None:
            return code
        terms: dict[str, int] = {}
        for coef, num in ((1, a.num), (-1, b.num)):
            name = "" if _is_literal(num) else num
            terms[name] = terms.get(name, 0) + (coef * int(num) if not name else coef)
        terms = {v: c for v, c in terms.items() if c}
        if all(not v for v in terms):
            total = sum(terms.values())
            code = repr((total > 0) - (total < 0))
        else:
            names = sorted(v for v in terms if v)
            poly_terms = [(c, tuple(int(v == w) for w in names)) for v, c in sorted(terms.items())]
            code = self._arr(self.poly(poly_terms, [self._placeholder(v) for v in names]))
        self.diff_memo[key] = code
        return code

    def poly(self, terms: list[tuple[int, tuple[int, ...]]], gens: list[sympy.Symbol]) -> str:
        """The variable holding an integer polynomial (emitted once: the same polynomial of the
        same variables, e.g. the ``cp*t`` denominator of many values, is shared)."""
        key = tuple(sorted((c, tuple((gens[i].name, k) for i, k in enumerate(e) if k)) for c, e in terms))
        out = self.poly_memo.get(key)
        if out is None:
            out = self.poly_memo[key] = self._emit_poly(terms, gens)
        return out

    def _emit_poly(self, terms: list[tuple[int, tuple[int, ...]]], gens: list[sympy.Symbol]) -> str:
        """Emit an overflow-guarded integer polynomial; returns the variable holding it."""
        out = self.fresh()
        if not terms:
            self.emit(f"{out} = _full(n, 0)")
            self.emit(f"M_{out} = 1.0")
            return out
        names = [g.name for g in gens]
        bound_parts, int_parts = [], []
        for c, exps in terms:
            factors = [(names[i], k) for i, k in enumerate(exps) if k]
            bound_parts.append("*".join([repr(float(abs(c)))] + [f"M_{v}**{k}" if k > 1 else f"M_{v}"
                                                               for v, k in factors]))
            int_f = [f"{v}**{k}" if k > 1 else v for v, k in factors]
            int_parts.append("*".join(([repr(c)] if c != 1 or not int_f else []) + int_f) or repr(c))
        if len(terms) == 1 and terms[0][0] == 1 and sum(terms[0][1]) == 1:
            return names[terms[0][1].index(1)]  # the polynomial is one variable: no code
        int_expr = " + ".join(int_parts)
        if all(not any(e) for _, e in terms):
            total = sum(c for c, _ in terms)
            self.emit(f"{out} = _full(n, {total})" if abs(total) < INT64_SAFE else
                      f"{out} = _as_object(_full(n, 0)) + {total}")
            self.emit(f"M_{out} = {max(1.0, float(abs(total)))!r}")
            return out
        # the bound also bounds the result, so no pass over the data is needed for M_out; past the
        # int64 range, _wide checks the rows' own magnitudes first (_on_objects only if they need it)
        self.emit(f"M_{out} = {' + '.join(bound_parts)}")
        abs_expr = " + ".join(p.replace("M_", "") for p in bound_parts)
        self.emit(f"if M_{out} < INT64_SAFE:")
        self.emit(f"    {out} = {int_expr}")
        self.emit("else:")
        self.emit(f"    {out}, M_{out} = _wide({int_expr!r}, {abs_expr!r}, locals(), M_{out})")
        return out

    # ------------------------------------------------------------ atoms
    def atom(self, a: sympy.Expr) -> _Rat:
        if a in self.memo:
            return self.memo[a]
        if isinstance(a, (sympy.ceiling, sympy.floor)):
            r = self.rational(a.args[0])
            if r.den is None:
                out = r
            else:
                out = _Rat(self._emit_round(r, ceiling=isinstance(a, sympy.ceiling)), None)
        elif isinstance(a, sympy.Mod):
            x, y = a.args
            out = self.rational(x - y * sympy.floor(x / y))
        elif isinstance(a, sympy.Abs):
            r = self.rational(a.args[0])
            out = _Rat(self._emit_abs(r.num), r.den)
        elif isinstance(a, (sympy.Min, sympy.Max)):
            # every argument is computed anyway (it may be the answer); two over the same denominator
            # are compared by their computed numerators, with no sympy difference to build and convert
            args = list(a.args)
            values = [self.rational(x) for x in args]
            op = "<" if isinstance(a, sympy.Min) else ">"
            conds = []
            for i, x in enumerate(values[:-1]):  # the last argument is chosen when no other is
                parts = []
                for j, y in enumerate(values):
                    if i == j:
                        continue
                    diff = self.sign_difference(x, y) if x.den == y.den else self.sign(args[i] - args[j])
                    parts.append(self._compare(diff, op if j < i else op + "="))
                conds.append(self._emit_condition(self._all(parts)))
            out = self._select(conds + ["True"], values, exhaustive=True)
        elif isinstance(a, sympy.Piecewise):
            conds, values = [], []
            exhaustive = False
            for value, cond in a.args:
                if cond is sympy.true or isinstance(cond, BooleanTrue):
                    exhaustive = True
                    conds.append("True")
                    values.append(self.rational(value))
                    break
                conds.append(self.boolean(cond))
                values.append(self.rational(value))
            out = self._select(conds, values, exhaustive=exhaustive)
        else:  # pragma: no cover - _outer_atoms only yields the types above
            raise NotExact(f"cannot evaluate {a} exactly")
        self.memo[a] = out
        return out

    def _select(self, conds: list[str], values: list[_Rat], *, exhaustive: bool) -> _Rat:
        """The value of the first branch whose condition holds (``"True"``: always); rows where
        none holds are bad unless ``exhaustive``."""
        if exhaustive and len(conds) == 2 and conds[1] == "True":  # the common if/else
            num, den = self._emit_if_else(conds[0], values[0], values[1])
        else:
            num, den = self._emit_select(conds, values, exhaustive=exhaustive)
        if den is not None:
            self.positive.add(den)
        return _Rat(num, den)

    # ------------------------------------------------------------ code emission (numpy backend)
    # The methods above decide *what* to compute; the ones below write it in one target language.
    # :class:`_JSBuilder` overrides them to write the same computation as scalar JavaScript BigInt code.
    def _emit_input(self, name: str) -> None:
        self.emit(f"M_{name} = _maxabs({name})")

    def _arr(self, code: str) -> str:
        return _arr(code)

    def _emit_positive_den(self, nv: str, dv: str) -> tuple[str, str]:
        """``nv / dv`` with the denominator's sign moved to the numerator; a zero denominator is bad."""
        s = self.fresh("s")
        self.emit(f"{s} = np.sign({dv})")
        self.emit(f"bad |= ({s} == 0)")
        self.emit(f"{s} = np.where({s} == 0, 1, {s})")
        n2, d2 = self.fresh(), self.fresh()  # fresh names: nv/dv may be shared atoms
        self.emit(f"{n2} = {nv} * {s}")
        self.emit(f"M_{n2} = M_{nv}")
        self.emit(f"{d2} = np.where({dv} == 0, 1, {dv} * {s})")
        self.emit(f"M_{d2} = M_{dv}")
        return n2, d2

    def _emit_round(self, r: _Rat, *, ceiling: bool) -> str:
        v = self.fresh()
        op = f"-((-{r.num}) // {r.den})" if ceiling else f"{r.num} // {r.den}"
        self.emit(f"{v} = {op}")
        self.emit(f"M_{v} = M_{r.num} + 1.0")
        return v

    def _emit_abs(self, num: str) -> str:
        v = self.fresh()
        self.emit(f"{v} = np.abs({num})")
        self.emit(f"M_{v} = " + (f"M_{num}" if not _is_literal(num) else repr(_maxabs(int(num)))))
        return v

    def _compare(self, sign_code: str, op: str) -> str:
        return f"({sign_code} {op} 0)"

    def _all(self, parts: list[str]) -> str:
        return " & ".join(parts)

    def _any(self, parts: list[str]) -> str:
        return " | ".join(parts)

    def _negate(self, code: str) -> str:
        return f"(~{code})"

    def _constant(self, value: bool) -> str:
        return f"_full(n, {value})"

    def _if_then_else(self, c: str, a: str, b: str) -> str:
        return f"(({c} & {a}) | (~{c} & {b}))"

    def _emit_condition(self, code: str) -> str:
        c = self.fresh("c")
        self.emit(f"{c} = {code}")
        return c

    def _emit_ceil_output(self, r: _Rat) -> str:
        v = self.fresh("o")
        self.emit(f"{v} = -((-{_arr(r.num)}) // {r.den})")
        return v

    def _emit_if_else(self, c: str, a: _Rat, b: _Rat) -> tuple[str, str | None]:
        num = self.fresh()
        self.emit(f"{num} = np.where({c}, {_wide_literal(a.num)}, {_wide_literal(b.num)})")
        self.emit(f"M_{num} = max({_bound(a.num)}, {_bound(b.num)}, 1.0)")
        den = None
        if a.den is not None or b.den is not None:
            den = self.fresh()
            self.emit(f"{den} = np.where({c}, {_wide_literal(a.den or '1')}, {_wide_literal(b.den or '1')})")
            self.emit(f"M_{den} = max({_bound(a.den or '1')}, {_bound(b.den or '1')}, 1.0)")
        return num, den

    def _emit_select(self, conds: list[str], values: list[_Rat], *, exhaustive: bool) -> tuple[str, str | None]:
        conds = ["_full(n, True)" if c == "True" else c for c in conds]
        if not exhaustive:
            self.emit(f"bad |= ~({' | '.join(conds)})")
        num = self.fresh()
        self.emit(f"{num} = np.select([{', '.join(conds)}], [{', '.join(_wide_literal(_arr(v.num)) for v in values)}], 0)")
        self.emit(f"M_{num} = max({', '.join(_bound(v.num) for v in values)}, 1.0)")
        den = None
        if any(v.den is not None for v in values):
            den = self.fresh()
            self.emit(f"{den} = np.select([{', '.join(conds)}], "
                      f"[{', '.join(_wide_literal(_arr(v.den or '1')) for v in values)}], 1)")
            self.emit(f"M_{den} = max({', '.join(_bound(v.den or '1') for v in values)}, 1.0)")
        return num, den

    # ------------------------------------------------------------ approximate (float64) outputs
    def approx(self, e: sympy.Basic) -> str:
        """float64 code for ``e``: the numbers it combines are rounded to doubles, its branch
        conditions stay exact (:meth:`boolean`). For outputs whose whole-unit rounding carries no
        meaning (step times: :func:`compile_exact`'s ``approximate``), where the exact form's common
        denominators of device constants (FLOP/s × efficiency, bandwidths, picoseconds) overflow
        int64 and would run on Python ints. Shared sub-expressions are computed once (memo by node),
        which is why this is not sympy's NumPyPrinter: that prints every occurrence again, and
        ``sympy.cse`` to avoid it costs more than the whole exact compile. The decisions are made
        here; the ``_f_*`` methods write them for a backend (numpy arrays here, JavaScript numbers
        in :class:`_JSBuilder`)."""
        memo = self.float_memo
        if e in memo:
            return memo[e]
        if e.is_Number:
            if not e.is_finite:
                raise NotExact(f"'{e}' is not a finite number")
            return repr(float(e)) if e >= 0 else f"({float(e)!r})"
        if e.is_Symbol:
            name = self.var_of.get(e)
            if name is None:
                raise NotExact(f"'{e}' is not an input")
            memo[e] = self._f_input(name)
            return memo[e]
        if isinstance(e, sympy.Add):
            code = " + ".join(self.approx(a) for a in e.args)
        elif isinstance(e, sympy.Mul):
            num, den = [], []
            for f in e.args:
                if isinstance(f, sympy.Pow) and f.exp.is_Integer and f.exp < 0:
                    den.append(self.approx(f.base) if f.exp == -1 else f"{self.approx(f.base)} ** {int(-f.exp)}")
                elif f.is_Rational and not f.is_Integer and f.p in (1, -1):
                    num.append(repr(float(f.p)))
                    den.append(repr(float(f.q)))
                else:
                    num.append(self.approx(f))
            code = " * ".join(num or ["1.0"]) + ("" if not den else " / (" + " * ".join(den) + ")")
        elif isinstance(e, sympy.Pow):
            if not e.exp.is_Integer:
                raise NotExact(f"'{e}' is not a power with an integer exponent")
            code = (f"{self.approx(e.base)} ** {int(e.exp)}" if e.exp > 0
                    else f"1.0 / {self.approx(e.base)} ** {int(-e.exp)}")
        elif isinstance(e, (sympy.Min, sympy.Max)):
            code = self._f_extreme("min" if isinstance(e, sympy.Min) else "max", [self.approx(a) for a in e.args])
        elif isinstance(e, sympy.Piecewise):
            conds, values = [], []
            for value, cond in e.args:
                values.append(self.approx(value))
                if cond is sympy.true or isinstance(cond, BooleanTrue):
                    conds.append(None)
                    break
                conds.append(self.boolean(cond))
            if conds[-1] is not None:   # rows where no branch holds are bad, as on the exact path
                self._f_bad_unless(conds)
                conds.append(None)
                values.append("0.0")
            code = values[-1]
            for c, v in zip(reversed(conds[:-1]), reversed(values[:-1])):
                code = self._f_where(c, v, code)
        elif isinstance(e, (sympy.ceiling, sympy.floor, sympy.Abs)):
            code = self._f_call({sympy.ceiling: "ceil", sympy.floor: "floor", sympy.Abs: "abs"}[type(e)],
                                self.approx(e.args[0]))
        elif isinstance(e, sympy.Mod):
            code = self._f_mod(self.approx(e.args[0]), self.approx(e.args[1]))
        else:
            raise NotExact(f"cannot evaluate {e} in floating point")
        memo[e] = self._f_let(code)
        return memo[e]

    def _f_input(self, name: str) -> str:
        self.emit(f"F_{name} = {name}.astype(np.float64)")
        return f"F_{name}"

    def _f_let(self, code: str) -> str:
        v = self.fresh("f")
        self.emit(f"{v} = {code}")
        return v

    def _f_extreme(self, which: str, args: list[str]) -> str:
        code = args[0]
        for a in args[1:]:
            code = f"np.{which}imum({code}, {a})"
        return code

    def _f_where(self, cond: str, a: str, b: str) -> str:
        return f"np.where({cond}, {a}, {b})"

    def _f_bad_unless(self, conds: list[str]) -> None:
        self.emit(f"bad |= ~({' | '.join(conds)})")

    def _f_call(self, fn: str, arg: str) -> str:
        return f"np.{fn}({arg})"

    def _f_mod(self, a: str, b: str) -> str:
        return f"np.mod({a}, {b})"

    def _f_output(self, code: str) -> str:
        """A float output rounded up; rows where it is not finite are bad."""
        v = self.fresh("o")
        self.emit(f"{v} = np.ceil({code})")
        self.emit(f"bad |= ~np.isfinite({v})")
        return v

    # ------------------------------------------------------------ conditions
    def boolean(self, cond: Any) -> str:
        if cond is True or isinstance(cond, BooleanTrue):
            return self._constant(True)
        if cond is False or isinstance(cond, BooleanFalse):
            return self._constant(False)
        if cond in self.bool_memo:
            return self.bool_memo[cond]
        if isinstance(cond, sympy.Rel) and type(cond) in _REL:
            code = self._compare(self.sign(cond.lhs - cond.rhs), _REL[type(cond)])
        elif isinstance(cond, sympy.And):
            code = "(" + self._all([self.boolean(c) for c in cond.args]) + ")"
        elif isinstance(cond, sympy.Or):
            code = "(" + self._any([self.boolean(c) for c in cond.args]) + ")"
        elif isinstance(cond, sympy.Not):
            code = self._negate(self.boolean(cond.args[0]))
        elif isinstance(cond, ITE):  # sympy folds nested Piecewise conditions into if-then-else
            c, a, b = (self.boolean(x) for x in cond.args)
            code = self._if_then_else(c, a, b)
        else:
            raise NotExact(f"cannot evaluate the condition {cond} exactly")
        v = self._emit_condition(code)
        self.bool_memo[cond] = v
        return v


def _arr(code: str) -> str:
    return f"_full(n, {code})" if _is_literal(code) else code


def _wide_literal(code: str) -> str:
    """A literal beyond int64 as a Python-int (object) array: numpy cannot hold it in an int64 one."""
    inner = code[len("_full(n, "):-1] if code.startswith("_full(n, ") else code
    if _is_literal(inner) and abs(int(inner)) >= INT64_SAFE:
        return f"(_as_object(_full(n, 0)) + {inner})"
    return code


def _bound(code: str) -> str:
    return repr(_maxabs(int(code))) if _is_literal(code) else f"M_{code}"


def _is_literal(code: str) -> bool:
    return code.lstrip("-").isdigit()


Terms = list[tuple[int, tuple[int, ...]]]
_FRACTIONS: dict[tuple[sympy.Basic, tuple[sympy.Symbol, ...]], tuple[Terms, Terms]] = {}
_FIELDS: dict[tuple[sympy.Symbol, ...], Any] = {}


def clear_caches() -> None:
    """Forget memoized polynomial conversions (benchmarks measure compile time cold)."""
    _FRACTIONS.clear()
    _FIELDS.clear()
    _SCANS.clear()


def _fraction(expr: sympy.Expr, gens: tuple[sympy.Symbol, ...],
              leaves: Mapping[sympy.Basic, tuple[sympy.Expr, sympy.Expr]] | None = None) -> tuple[Terms, Terms]:
    """``expr``, each of its atoms in ``leaves`` standing for the quotient ``n / d`` of its
    (symbol or integer) pair, as integer numerator and denominator polynomials of ``gens``
    (which hold every symbol left), their exponents in the order of ``gens``.

    Memoized across compilations: structures of one search share most expressions.
    """
    leaves = leaves or {}
    key = (expr, gens, tuple(leaves.items()))
    hit = _FRACTIONS.get(key)
    if hit is not None:
        return hit
    result = _monomial_fraction(expr, gens, leaves)
    if result is None:
        body = expr.xreplace({a: n / d for a, (n, d) in leaves.items()}) if leaves else expr
        if not gens:
            r = sympy.Rational(body)
            result = ([(int(r.p), ())], [(int(r.q), ())])
        else:
            field = _FIELDS.get(gens)
            if field is None:
                field = _FIELDS[gens] = sympy.polys.fields.field(gens, sympy.QQ)[0]
            frac = field.from_expr(body)
            terms_n, terms_d = frac.numer.terms(), frac.denom.terms()
            scale = 1
            for _, c in terms_n + terms_d:
                scale = scale * int(c.denominator) // math.gcd(scale, int(c.denominator))
            result = ([(int(c * scale), tuple(m)) for m, c in terms_n],
                      [(int(c * scale), tuple(m)) for m, c in terms_d])
    if len(_FRACTIONS) > 50_000:
        _FRACTIONS.clear()
    _FRACTIONS[key] = result
    return result


class _NotMonomial(Exception):
    """A denominator with more than one term: left to sympy's rational function field."""


_Poly = dict  # exponents tuple -> integer coefficient (no zero coefficients)


def _monomial_fraction(body: sympy.Expr, gens: tuple[sympy.Symbol, ...],
                       leaves: Mapping[sympy.Basic, tuple[sympy.Expr, sympy.Expr]]) -> tuple[Terms, Terms] | None:
    """:func:`_fraction` in plain Python for the common case: every denominator met on the way is
    one term (``c * x**i * y**j``), so the reduced fraction, integer polynomial over positive
    integer monomial, is found by monomial and integer gcds alone, without sympy's polynomial
    rings. None (sympy decides) for anything else: a sum in a denominator, a non-integer power, a
    number sympy would not reduce to a rational."""
    index = {g: i for i, g in enumerate(gens)}
    zero = (0,) * len(gens)

    def monomial_of(sym: sympy.Symbol) -> tuple[int, ...]:
        e = [0] * len(gens)
        e[index[sym]] = 1
        return tuple(e)

    def times(a: _Poly, b: _Poly) -> _Poly:
        out: _Poly = {}
        for ma, ca in a.items():
            for mb, cb in b.items():
                m = tuple(x + y for x, y in zip(ma, mb))
                c = out.get(m, 0) + ca * cb
                if c:
                    out[m] = c
                else:
                    out.pop(m, None)
        return out

    def reduced(num: _Poly, mono: tuple[int, ...], c: int) -> tuple[_Poly, tuple[int, ...], int]:
        if not num:
            return {}, zero, 1
        low = tuple(min(e) for e in zip(mono, *num))
        if any(low):
            num = {tuple(x - y for x, y in zip(m, low)): k for m, k in num.items()}
            mono = tuple(x - y for x, y in zip(mono, low))
        g = math.gcd(c, *num.values())
        if g != 1:
            num = {m: k // g for m, k in num.items()}
            c //= g
        return num, mono, c

    def conv(e: sympy.Basic) -> tuple[_Poly, tuple[int, ...], int]:
        """``e`` as ``(numerator, denominator monomial, positive denominator coefficient)``."""
        leaf = leaves.get(e) if leaves else None
        if leaf is not None:
            n, d = leaf
            num = ({monomial_of(n): 1} if n.is_Symbol else ({zero: int(n)} if n else {}))
            if d.is_Symbol:
                return num, monomial_of(d), 1
            if int(d) <= 0:
                raise _NotMonomial
            return reduced(num, zero, int(d))
        if e.is_Symbol:
            return {monomial_of(e): 1}, zero, 1
        if e.is_Rational:
            p, q = int(e.p), int(e.q)
            return ({zero: p} if p else {}), zero, q
        if e.is_Add:
            num, mono, c = conv(e.args[0])
            for a in e.args[1:]:
                n2, m2, c2 = conv(a)
                if (m2, c2) == (mono, c):
                    total = dict(num)
                    for m, k in n2.items():
                        k = total.get(m, 0) + k
                        if k:
                            total[m] = k
                        else:
                            total.pop(m, None)
                    num = total
                else:
                    lm = tuple(max(x, y) for x, y in zip(mono, m2))
                    lc = c * c2 // math.gcd(c, c2)
                    num = times(num, {tuple(x - y for x, y in zip(lm, mono)): lc // c})
                    for m, k in times(n2, {tuple(x - y for x, y in zip(lm, m2)): lc // c2}).items():
                        k = num.get(m, 0) + k
                        if k:
                            num[m] = k
                        else:
                            num.pop(m, None)
                    mono, c = lm, lc
                num, mono, c = reduced(num, mono, c)
            return num, mono, c
        if e.is_Mul:
            num, mono, c = conv(e.args[0])
            for a in e.args[1:]:
                n2, m2, c2 = conv(a)
                num, mono, c = reduced(times(num, n2), tuple(x + y for x, y in zip(mono, m2)), c * c2)
            return num, mono, c
        if e.is_Pow and e.exp.is_Integer:
            k = int(e.exp)
            num, mono, c = conv(e.base)
            if k < 0:  # 1 / (c' * m') needs a one-term numerator, whose sign moves up
                if len(num) != 1:
                    raise _NotMonomial
                (m1, c1), = num.items()
                num, mono, c = {mono: c if c1 > 0 else -c}, m1, abs(c1)
                k = -k
            out_n, out_m, out_c = {zero: 1}, zero, 1
            for _ in range(k):
                out_n = times(out_n, num)
                out_m = tuple(x + y for x, y in zip(out_m, mono))
                out_c *= c
            return reduced(out_n, out_m, out_c)
        raise _NotMonomial

    try:
        num, mono, c = conv(body)
    except (_NotMonomial, KeyError):
        return None
    return [(k, m) for m, k in num.items()], [(c, mono)]


_SCANS: dict[sympy.Basic, tuple[list[sympy.Expr], frozenset[sympy.Symbol]]] = {}


def _scan(expr: sympy.Basic) -> tuple[list[sympy.Expr], frozenset[sympy.Symbol]]:
    """:func:`_outer_atoms` of ``expr`` and the symbols outside them (memoized, as :func:`_fraction`)."""
    hit = _SCANS.get(expr)
    if hit is None:
        symbols: set[sympy.Symbol] = set()
        hit = (_outer_atoms(expr, symbols), frozenset(symbols))
        if len(_SCANS) > 50_000:
            _SCANS.clear()
        _SCANS[expr] = hit
    return hit


def _outer_atoms(expr: sympy.Basic, symbols: set[sympy.Symbol] | None = None) -> list[sympy.Expr]:
    """The outermost non-polynomial nodes of ``expr`` (each compiled on its own); the symbols
    found outside them are added to ``symbols``."""
    found: list[sympy.Expr] = []
    seen: set[sympy.Basic] = set()

    def visit(e: sympy.Basic) -> None:
        if isinstance(e, _ATOMS):
            if e not in seen:
                seen.add(e)
                found.append(e)
            return
        if isinstance(e, sympy.Pow):
            if not e.exp.is_Integer:
                raise NotExact(f"'{e}' has a non-integer power")
            visit(e.base)
            return
        if isinstance(e, (sympy.Add, sympy.Mul)):
            for a in e.args:
                visit(a)
            return
        if isinstance(e, sympy.Symbol):
            if symbols is not None:
                symbols.add(e)
            return
        if e.is_Rational:
            return
        raise NotExact(f"'{e}' cannot be evaluated exactly with integer arithmetic")

    visit(expr)
    return found


def _outputs(b: "_Builder", exprs: Sequence[Any], approximate: Sequence[bool] = ()) -> list[str]:
    """Code for each of ``exprs``: a condition's truth, or a number rounded up to an integer
    (exactly, or in float64 where ``approximate`` says so)."""
    outs = []
    for k, e in enumerate(exprs):
        if isinstance(e, bool) or (isinstance(e, Boolean) and not isinstance(e, sympy.Expr)):
            outs.append(b.boolean(e))
            continue
        if k < len(approximate) and approximate[k]:
            outs.append(b._f_output(b.approx(sympy.sympify(e))))
            continue
        r = b.rational(sympy.sympify(e))
        outs.append(b._arr(r.num) if r.den is None else b._emit_ceil_output(r))
    return outs


def compile_exact(exprs: Sequence[Any], inputs: Sequence[sympy.Symbol],
                  approximate: Sequence[bool] = ()) -> ExactFunction:
    """Compile ``exprs`` (numbers → ceil to integers; conditions → bools) over ``inputs``.

    Shared sub-expressions (the same ``Min(4, m)`` in every stage) are computed once.
    ``approximate[k]`` true: output ``k`` is computed in float64 (relative error ~1e-15, branch
    conditions still exact; rows where it is not finite are bad), for quantities such as step
    times whose last unit carries no meaning. Every other output stays exact.
    """
    b = _Builder(inputs)
    outs = _outputs(b, exprs, approximate)
    args = ", ".join(["n"] + [b.var_of[s] for s in inputs] + [])
    body = ["bad = np.zeros(n, dtype=bool)"] + b.lines + [f"return [{', '.join(outs)}], bad"]
    source = f"def _exact({args}):\n" + "\n".join("    " + line for line in body) + "\n"
    return load_exact(tuple(s.name for s in inputs), source)


#: the prefix of :meth:`ExactFunction.code_text`: bytecode is only reused by the Python that wrote it
_CODE_TAG = f"py{importlib.util.MAGIC_NUMBER.hex()}:"


def _load_code(text: str | None) -> types.CodeType | None:
    if not text or not text.startswith(_CODE_TAG):
        return None
    try:
        code = marshal.loads(zlib.decompress(base64.b64decode(text[len(_CODE_TAG):], validate=True)))
    except (ValueError, TypeError, EOFError, zlib.error):
        return None
    return code if isinstance(code, types.CodeType) else None


def load_exact(inputs: Sequence[str], source: str, code: str | None = None) -> ExactFunction:
    """The function of :func:`compile_exact`'s ``source`` (also as read back from the cache);
    ``code``, its :meth:`ExactFunction.code_text`, saves compiling it again."""
    compiled = _load_code(code)
    if compiled is None:
        compiled = compile(source, "<memform.fastpath.exact>", "exec")
    namespace: dict[str, Any] = {"np": np, "_as_object": _as_object, "_maxabs": _maxabs, "_full": _full,
                                 "_on_objects": _on_objects, "_wide": _wide, "INT64_SAFE": INT64_SAFE}
    exec(compiled, namespace)  # noqa: S102 - our own generated code
    return ExactFunction(tuple(inputs), source, namespace["_exact"], compiled)


# ---------------------------------------------------------------- JavaScript backend
#: helpers the generated JavaScript calls (define them once, before the compiled functions):
#: floor division of BigInts by a positive BigInt, the sign of a BigInt, and the floored modulo
#: of two numbers (numpy's ``np.mod``: the sign of the divisor) for the float outputs
JS_HELPERS = """\
function _fdiv(a, b) { const q = a / b; return (a % b !== 0n && a < 0n) ? q - 1n : q; }
function _sgn(x) { return x > 0n ? 1n : (x < 0n ? -1n : 0n); }
function _fmod(a, b) { const r = a % b; return (r !== 0 && (r < 0) !== (b < 0)) ? r + b : r; }
"""

_JS_REL = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "===", "!=": "!=="}


def _js(code: str) -> str:
    """A code string as JavaScript: integer literals become BigInt literals."""
    if _is_literal(code):
        return f"({code}n)" if code.startswith("-") else f"{code}n"
    return code


class _JSBuilder(_Builder):
    """The same exact computation as :class:`_Builder`, written as scalar JavaScript.

    Values are ``BigInt`` (arbitrary precision, so no overflow guard is needed), conditions
    JavaScript booleans; the decisions (common denominators, sign tests, branch selection,
    which rows are bad) are the base class's, so both backends compute the same numbers.
    """

    def _emit_input(self, name: str) -> None:
        pass

    def _arr(self, code: str) -> str:
        return _js(code)

    def _let(self, prefix: str, code: str) -> str:
        v = self.fresh(prefix)
        self.emit(f"const {v} = {code};")
        return v

    def _emit_poly(self, terms: list[tuple[int, tuple[int, ...]]], gens: list[sympy.Symbol]) -> str:
        names = [g.name for g in gens]
        if len(terms) == 1 and terms[0][0] == 1 and sum(terms[0][1]) == 1:
            return names[terms[0][1].index(1)]
        parts = []
        for c, exps in terms:
            factors = [f"{names[i]} ** {k}n" if k > 1 else names[i] for i, k in enumerate(exps) if k]
            mag = abs(c)
            body = "*".join(([f"{mag}n"] if mag != 1 or not factors else []) + factors)
            parts.append(("-" if c < 0 else "+", body))
        if not parts:
            return self._let("v", "0n")
        code = ("-" if parts[0][0] == "-" else "") + parts[0][1]
        for sign, body in parts[1:]:
            code += f" {sign} {body}"
        return self._let("v", code)

    def _emit_positive_den(self, nv: str, dv: str) -> tuple[str, str]:
        s = self._let("s", f"_sgn({_js(dv)})")
        self.emit(f"if ({s} === 0n) bad = true;")
        n2 = self._let("v", f"{_js(nv)} * ({s} === 0n ? 1n : {s})")
        d2 = self._let("v", f"{s} === 0n ? 1n : {_js(dv)} * {s}")
        return n2, d2

    def _emit_round(self, r: _Rat, *, ceiling: bool) -> str:
        num, den = _js(r.num), _js(r.den)
        return self._let("v", f"-_fdiv(-{num}, {den})" if ceiling else f"_fdiv({num}, {den})")

    def _emit_abs(self, num: str) -> str:
        x = _js(num)
        return self._let("v", f"{x} < 0n ? -{x} : {x}")

    def _compare(self, sign_code: str, op: str) -> str:
        return f"({_js(sign_code)} {_JS_REL[op]} 0n)"

    def _all(self, parts: list[str]) -> str:
        return " && ".join(parts)

    def _any(self, parts: list[str]) -> str:
        return " || ".join(parts)

    def _negate(self, code: str) -> str:
        return f"(!{code})"

    def _constant(self, value: bool) -> str:
        return "true" if value else "false"

    def _if_then_else(self, c: str, a: str, b: str) -> str:
        return f"({c} ? {a} : {b})"

    def _emit_condition(self, code: str) -> str:
        return self._let("c", code)

    def _emit_if_else(self, c: str, a: _Rat, b: _Rat) -> tuple[str, str | None]:
        num = self._let("v", f"{c} ? {_js(a.num)} : {_js(b.num)}")
        den = None
        if a.den is not None or b.den is not None:
            den = self._let("v", f"{c} ? {_js(a.den or '1')} : {_js(b.den or '1')}")
        return num, den

    def _emit_select(self, conds: list[str], values: list[_Rat], *, exhaustive: bool) -> tuple[str, str | None]:
        conds = ["true" if c == "True" else c for c in conds]
        if not exhaustive:
            self.emit(f"if (!({' || '.join(conds)})) bad = true;")

        def chain(parts: list[str], default: str) -> str:
            return "".join(f"{c} ? {x} : " for c, x in zip(conds, parts)) + default

        num = self._let("v", chain([_js(v.num) for v in values], "0n"))
        den = None
        if any(v.den is not None for v in values):
            den = self._let("v", chain([_js(v.den or "1") for v in values], "1n"))
        return num, den

    def _emit_ceil_output(self, r: _Rat) -> str:
        return self._let("o", f"-_fdiv(-{_js(r.num)}, {_js(r.den)})")

    # float outputs: JavaScript numbers (IEEE doubles, as numpy's float64), same decisions
    def _f_input(self, name: str) -> str:
        return self._let("F", f"Number({name})")

    def _f_let(self, code: str) -> str:
        return self._let("f", code)

    def _f_extreme(self, which: str, args: list[str]) -> str:
        return f"Math.{which}({', '.join(args)})"

    def _f_where(self, cond: str, a: str, b: str) -> str:
        return f"({cond} ? {a} : {b})"

    def _f_bad_unless(self, conds: list[str]) -> None:
        self.emit(f"if (!({' || '.join(conds)})) bad = true;")

    def _f_call(self, fn: str, arg: str) -> str:
        return f"Math.{fn}({arg})"

    def _f_mod(self, a: str, b: str) -> str:
        return f"_fmod({a}, {b})"

    def _f_output(self, code: str) -> str:
        v = self._let("o", f"Math.ceil({code})")
        self.emit(f"if (!Number.isFinite({v})) bad = true;")
        return v


def compile_js(exprs: Sequence[Any], inputs: Sequence[sympy.Symbol], approximate: Sequence[bool] = ()) -> str:
    """JavaScript source of a function computing what :func:`compile_exact` computes, for one
    candidate: ``function (x0, x1, ...)`` over ``BigInt`` inputs (one per symbol of ``inputs``,
    positive integers) returning ``[outputs, bad]``, each output a ``BigInt`` (a number rounded
    up), a boolean (a condition) or, where ``approximate`` says so, a JavaScript number (the
    float64 path, rounded up). It calls :data:`JS_HELPERS`, which must be defined."""
    b = _JSBuilder(inputs)
    outs = _outputs(b, exprs, approximate)
    args = ", ".join(b.var_of[s] for s in inputs)
    body = ["let bad = false;"] + b.lines + [f"return [[{', '.join(outs)}], bad];"]
    return f"function ({args}) {{\n" + "\n".join("  " + line for line in body) + "\n}"
