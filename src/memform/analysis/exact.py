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
  exceed 2**62 the polynomial is evaluated on Python-int object arrays instead (slow, still
  exact). So results are exact whatever the magnitudes, and fast when they fit in int64.

Anything that is not exact in rational arithmetic (``log`` of a searched symbol, fractional
powers) raises :class:`NotExact` rather than giving a rounded answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

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

    def __call__(self, columns: Sequence[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
        arrays = [np.asarray(c, dtype=np.int64) if not (isinstance(c, np.ndarray) and c.dtype == object)
                  else c for c in columns]
        n = len(arrays[0]) if arrays else 1
        return self._fn(n, *arrays)


class _Builder:
    def __init__(self, inputs: Sequence[sympy.Symbol]):
        self.lines: list[str] = []
        self.memo: dict[sympy.Basic, _Rat] = {}
        self.bool_memo: dict[sympy.Basic, str] = {}
        self.sign_memo: dict[sympy.Basic, str] = {}
        self.count = 0
        self.var_of: dict[sympy.Symbol, str] = {}
        self.placeholder: dict[str, sympy.Symbol] = {}
        self.positive: set[str] = set()
        for i, s in enumerate(inputs):
            name = f"x{i}"
            self.var_of[s] = name
            self.placeholder[name] = sympy.Symbol(name, integer=True, positive=True)
            self.positive.add(name)
            self.lines.append(f"M_{name} = _maxabs({name})")

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
                s = self.fresh("s")
                self.emit(f"{s} = np.sign({dv})")
                self.emit(f"bad |= ({s} == 0)")
                self.emit(f"{s} = np.where({s} == 0, 1, {s})")
                n2, d2 = self.fresh(), self.fresh()  # fresh names: nv/dv may be shared atoms
                self.emit(f"{n2} = {nv} * {s}")
                self.emit(f"M_{n2} = M_{nv}")
                self.emit(f"{d2} = np.where({dv} == 0, 1, {dv} * {s})")
                self.emit(f"M_{d2} = M_{dv}")
                nv, dv = n2, d2
            r = _Rat(nv, dv)
        self.memo[expr] = r
        return r

    def _prepare(self, expr: sympy.Expr) -> tuple[list[sympy.Symbol], "Terms", "Terms"]:
        """Atoms compiled and replaced by placeholders; then integer numerator/denominator terms."""
        mapping: dict[sympy.Basic, sympy.Expr] = {}
        for sym, name in self.var_of.items():
            mapping[sym] = self.placeholder[name]
        for atom in _outer_atoms(expr):
            r = self.atom(atom)
            n = self._placeholder(r.num) if not _is_literal(r.num) else sympy.Integer(int(r.num))
            d = sympy.Integer(1) if r.den is None else (
                self._placeholder(r.den) if not _is_literal(r.den) else sympy.Integer(int(r.den)))
            mapping[atom] = n / d
        free = expr.free_symbols - set(self.var_of)
        if free:
            raise NotExact(f"symbols {sorted(map(str, free))} have no input values")
        return _fraction(expr.xreplace(mapping))

    def sign(self, expr: sympy.Expr) -> str:
        """Code for an integer array with the sign of ``expr`` (no denominator when it is surely positive)."""
        if expr in self.sign_memo:
            return self.sign_memo[expr]
        if expr.is_Rational:
            return repr(int(sympy.sign(expr)))
        if expr in self.memo:
            code = _arr(self.memo[expr].num)
        else:
            gens, n_terms, d_terms = self._prepare(expr)
            used = {gens[i].name for _, e in d_terms for i, k in enumerate(e) if k}
            constant = len(d_terms) == 1 and not any(d_terms[0][1])
            if constant or (all(k > 0 for k, _ in d_terms) and used <= self.positive):
                if all(k < 0 for k, _ in d_terms):
                    n_terms = [(-k, e) for k, e in n_terms]
                code = _arr(self.poly(n_terms, gens))
            else:
                code = _arr(self.rational(expr).num)
        self.sign_memo[expr] = code
        return code

    def poly(self, terms: list[tuple[int, tuple[int, ...]]], gens: list[sympy.Symbol]) -> str:
        """Emit an overflow-guarded integer polynomial; returns the variable holding it."""
        out = self.fresh()
        if not terms:
            self.emit(f"{out} = _full(n, 0)")
            self.emit(f"M_{out} = 1.0")
            return out
        names = [g.name for g in gens]
        bound_parts, int_parts, obj_parts = [], [], []
        for c, exps in terms:
            factors = [(names[i], k) for i, k in enumerate(exps) if k]
            bound_parts.append("*".join([repr(float(abs(c)))] + [f"M_{v}**{k}" if k > 1 else f"M_{v}"
                                                               for v, k in factors]))
            int_f = [f"{v}**{k}" if k > 1 else v for v, k in factors]
            obj_f = [f"_as_object({v})**{k}" if k > 1 else f"_as_object({v})" for v, k in factors]
            int_parts.append("*".join(([repr(c)] if c != 1 or not int_f else []) + int_f) or repr(c))
            obj_parts.append("*".join([repr(c)] + obj_f))
        if len(terms) == 1 and terms[0][0] == 1 and sum(terms[0][1]) == 1:
            return names[terms[0][1].index(1)]  # the polynomial is one variable: no code
        int_expr = " + ".join(int_parts)
        if all(not any(e) for _, e in terms):
            total = sum(c for c, _ in terms)
            self.emit(f"{out} = _full(n, {total})" if abs(total) < INT64_SAFE else
                      f"{out} = _as_object(_full(n, 0)) + {total}")
            self.emit(f"M_{out} = {max(1.0, float(abs(total)))!r}")
            return out
        # the bound also bounds the result, so no pass over the data is needed for M_out
        self.emit(f"M_{out} = {' + '.join(bound_parts)}")
        self.emit(f"if M_{out} < INT64_SAFE:")
        self.emit(f"    {out} = {int_expr}")
        self.emit("else:")
        self.emit(f"    {out} = {' + '.join(obj_parts)}")
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
                v = self.fresh()
                op = f"-((-{r.num}) // {r.den})" if isinstance(a, sympy.ceiling) else f"{r.num} // {r.den}"
                self.emit(f"{v} = {op}")
                self.emit(f"M_{v} = M_{r.num} + 1.0")
                out = _Rat(v, None)
        elif isinstance(a, sympy.Mod):
            x, y = a.args
            out = self.rational(x - y * sympy.floor(x / y))
        elif isinstance(a, sympy.Abs):
            r = self.rational(a.args[0])
            v = self.fresh()
            self.emit(f"{v} = np.abs({r.num})")
            self.emit(f"M_{v} = " + (f"M_{r.num}" if not _is_literal(r.num) else repr(_maxabs(int(r.num)))))
            out = _Rat(v, r.den)
        elif isinstance(a, (sympy.Min, sympy.Max)):
            args = list(a.args)
            op = "<" if isinstance(a, sympy.Min) else ">"
            conds = []
            for i, x in enumerate(args[:-1]):  # the last argument is chosen when no other is
                parts = []
                for j, y in enumerate(args):
                    if i == j:
                        continue
                    diff = self.sign(x - y)
                    parts.append(f"({diff} {op} 0)" if j < i else f"({diff} {op}= 0)")
                c = self.fresh("c")
                self.emit(f"{c} = " + " & ".join(parts))
                conds.append(c)
            out = self._select(conds + ["True"], [self.rational(x) for x in args], exhaustive=True)
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
        if exhaustive and len(conds) == 2 and conds[1] == "True":  # the common if/else: np.where
            c, (a, b) = conds[0], values
            num = self.fresh()
            self.emit(f"{num} = np.where({c}, {a.num}, {b.num})")
            self.emit(f"M_{num} = max({_bound(a.num)}, {_bound(b.num)}, 1.0)")
            den = None
            if a.den is not None or b.den is not None:
                den = self.fresh()
                self.emit(f"{den} = np.where({c}, {a.den or '1'}, {b.den or '1'})")
                self.emit(f"M_{den} = max({_bound(a.den or '1')}, {_bound(b.den or '1')}, 1.0)")
                self.positive.add(den)
            return _Rat(num, den)
        conds = ["_full(n, True)" if c == "True" else c for c in conds]
        if not exhaustive:
            self.emit(f"bad |= ~({' | '.join(conds)})")
        num = self.fresh()
        self.emit(f"{num} = np.select([{', '.join(conds)}], [{', '.join(_arr(v.num) for v in values)}], 0)")
        self.emit(f"M_{num} = max({', '.join(_bound(v.num) for v in values)}, 1.0)")
        den = None
        if any(v.den is not None for v in values):
            den = self.fresh()
            self.emit(f"{den} = np.select([{', '.join(conds)}], "
                      f"[{', '.join(_arr(v.den or '1') for v in values)}], 1)")
            self.emit(f"M_{den} = max({', '.join(_bound(v.den or '1') for v in values)}, 1.0)")
            self.positive.add(den)
        return _Rat(num, den)

    # ------------------------------------------------------------ conditions
    def boolean(self, cond: Any) -> str:
        if cond is True or isinstance(cond, BooleanTrue):
            return "_full(n, True)"
        if cond is False or isinstance(cond, BooleanFalse):
            return "_full(n, False)"
        if cond in self.bool_memo:
            return self.bool_memo[cond]
        if isinstance(cond, sympy.Rel) and type(cond) in _REL:
            code = f"({self.sign(cond.lhs - cond.rhs)} {_REL[type(cond)]} 0)"
        elif isinstance(cond, sympy.And):
            code = "(" + " & ".join(self.boolean(c) for c in cond.args) + ")"
        elif isinstance(cond, sympy.Or):
            code = "(" + " | ".join(self.boolean(c) for c in cond.args) + ")"
        elif isinstance(cond, sympy.Not):
            code = f"(~{self.boolean(cond.args[0])})"
        elif isinstance(cond, ITE):  # sympy folds nested Piecewise conditions into if-then-else
            c, a, b = (self.boolean(x) for x in cond.args)
            code = f"(({c} & {a}) | (~{c} & {b}))"
        else:
            raise NotExact(f"cannot evaluate the condition {cond} exactly")
        v = self.fresh("c")
        self.emit(f"{v} = {code}")
        self.bool_memo[cond] = v
        return v


def _arr(code: str) -> str:
    return f"_full(n, {code})" if _is_literal(code) else code


def _bound(code: str) -> str:
    return repr(_maxabs(int(code))) if _is_literal(code) else f"M_{code}"


def _is_literal(code: str) -> bool:
    return code.lstrip("-").isdigit()


Terms = list[tuple[int, tuple[int, ...]]]
_FRACTIONS: dict[sympy.Basic, tuple[list[sympy.Symbol], Terms, Terms]] = {}
_FIELDS: dict[tuple[sympy.Symbol, ...], Any] = {}


def clear_caches() -> None:
    """Forget memoized polynomial conversions (benchmarks measure compile time cold)."""
    _FRACTIONS.clear()
    _FIELDS.clear()


def _fraction(body: sympy.Expr) -> tuple[list[sympy.Symbol], Terms, Terms]:
    """``body`` (a rational function) as integer numerator and denominator polynomials.

    Memoized across compilations: structures of one search share most expressions.
    """
    hit = _FRACTIONS.get(body)
    if hit is not None:
        return hit
    gens = sorted(body.free_symbols, key=lambda s: s.name)
    if not gens:
        r = sympy.Rational(body)
        result = (gens, [(int(r.p), ())], [(int(r.q), ())])
    else:
        key = tuple(gens)
        field = _FIELDS.get(key)
        if field is None:
            field = _FIELDS[key] = sympy.polys.fields.field(gens, sympy.QQ)[0]
        frac = field.from_expr(body)
        terms_n, terms_d = frac.numer.terms(), frac.denom.terms()
        scale = 1
        for _, c in terms_n + terms_d:
            scale = scale * int(c.denominator) // math.gcd(scale, int(c.denominator))
        result = (gens, [(int(c * scale), tuple(m)) for m, c in terms_n],
                  [(int(c * scale), tuple(m)) for m, c in terms_d])
    if len(_FRACTIONS) > 50_000:
        _FRACTIONS.clear()
    _FRACTIONS[body] = result
    return result


def _outer_atoms(expr: sympy.Basic) -> list[sympy.Expr]:
    """The outermost non-polynomial nodes of ``expr`` (each compiled on its own)."""
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
        if isinstance(e, sympy.Symbol) or e.is_Rational:
            return
        raise NotExact(f"'{e}' cannot be evaluated exactly with integer arithmetic")

    visit(expr)
    return found


def compile_exact(exprs: Sequence[Any], inputs: Sequence[sympy.Symbol]) -> ExactFunction:
    """Compile ``exprs`` (numbers → ceil to integers; conditions → bools) over ``inputs``.

    Shared sub-expressions (the same ``Min(4, m)`` in every stage) are computed once.
    """
    b = _Builder(inputs)
    outs = []
    for e in exprs:
        if isinstance(e, bool) or (isinstance(e, Boolean) and not isinstance(e, sympy.Expr)):
            outs.append(b.boolean(e))
            continue
        r = b.rational(sympy.sympify(e))
        if r.den is None:
            outs.append(_arr(r.num))
        else:
            v = b.fresh("o")
            b.emit(f"{v} = -((-{_arr(r.num)}) // {r.den})")
            outs.append(v)
    args = ", ".join(["n"] + [b.var_of[s] for s in inputs])
    body = ["bad = np.zeros(n, dtype=bool)"] + b.lines + [f"return [{', '.join(outs)}], bad"]
    source = f"def _exact({args}):\n" + "\n".join("    " + line for line in body) + "\n"
    namespace: dict[str, Any] = {"np": np, "_as_object": _as_object, "_maxabs": _maxabs, "_full": _full,
                                 "INT64_SAFE": INT64_SAFE}
    exec(compile(source, "<memform.analysis.exact>", "exec"), namespace)  # noqa: S102 - our own generated code
    return ExactFunction(tuple(s.name for s in inputs), source, namespace["_exact"])
