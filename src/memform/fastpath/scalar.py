"""The exact integer compiler's third backend: plain Python for one candidate.

``memform estimate`` evaluates one config at a time. numpy arrays of length one would spend
their time in call overhead, and Python's own integers are exact at any size, so this backend
writes the computation of :class:`memform.fastpath.exact._Builder` (the same common
denominators, sign tests and branch choices) as straight-line Python over ints and bools,
with no overflow guards. The generated source is plain text: it is stored in the on-disk
cache and run later by :func:`memform.fastpath.fastcache.load_scalar` without sympy.
"""

from __future__ import annotations

from typing import Any, Sequence

import sympy

from .exact import _Builder, _outputs, _Rat

#: the name of the generated function (see :func:`compile_scalar`)
FUNCTION = "_scalar"


class _PyBuilder(_Builder):
    """Scalar Python: ``bad`` is a bool, conditions are bools, values are ints."""

    def _emit_input(self, name: str) -> None:
        pass

    def _arr(self, code: str) -> str:
        return code

    def _let(self, prefix: str, code: str) -> str:
        v = self.fresh(prefix)
        self.emit(f"{v} = {code}")
        return v

    def poly(self, terms: list[tuple[int, tuple[int, ...]]], gens: list[sympy.Symbol]) -> str:
        names = [g.name for g in gens]
        if len(terms) == 1 and terms[0][0] == 1 and sum(terms[0][1]) == 1:
            return names[terms[0][1].index(1)]
        if not terms:
            return self._let("v", "0")
        parts = []
        for c, exps in terms:
            factors = [f"{names[i]}**{k}" if k > 1 else names[i] for i, k in enumerate(exps) if k]
            parts.append("*".join(([f"({c})" if c < 0 else str(c)] if c != 1 or not factors else []) + factors))
        return self._let("v", " + ".join(parts))

    def _emit_positive_den(self, nv: str, dv: str) -> tuple[str, str]:
        s = self._let("s", f"_sgn({dv})")
        self.emit(f"bad = bad or {s} == 0")
        n2 = self._let("v", f"{nv} * ({s} or 1)")
        d2 = self._let("v", f"({dv} * {s} if {s} else 1)")
        return n2, d2

    def _emit_round(self, r: _Rat, *, ceiling: bool) -> str:
        return self._let("v", f"-((-{r.num}) // {r.den})" if ceiling else f"({r.num}) // {r.den}")

    def _emit_abs(self, num: str) -> str:
        return self._let("v", f"abs({num})")

    def _compare(self, sign_code: str, op: str) -> str:
        return f"({sign_code} {op} 0)"

    def _all(self, parts: list[str]) -> str:
        return " and ".join(parts)

    def _any(self, parts: list[str]) -> str:
        return " or ".join(parts)

    def _negate(self, code: str) -> str:
        return f"(not {code})"

    def _constant(self, value: bool) -> str:
        return repr(bool(value))

    def _if_then_else(self, c: str, a: str, b: str) -> str:
        return f"({a} if {c} else {b})"

    def _emit_condition(self, code: str) -> str:
        return self._let("c", code)

    def _emit_if_else(self, c: str, a: _Rat, b: _Rat) -> tuple[str, str | None]:
        num = self._let("v", f"({a.num} if {c} else {b.num})")
        den = None
        if a.den is not None or b.den is not None:
            den = self._let("v", f"({a.den or '1'} if {c} else {b.den or '1'})")
        return num, den

    def _emit_select(self, conds: list[str], values: list[_Rat], *, exhaustive: bool) -> tuple[str, str | None]:
        if not exhaustive:
            self.emit(f"bad = bad or not ({' or '.join(conds)})")

        def chain(parts: list[str], default: str) -> str:
            out = default
            for c, x in reversed(list(zip(conds, parts))):
                out = x if c == "True" else f"({x} if {c} else {out})"
            return out

        num = self._let("v", chain([v.num for v in values], "0"))
        den = None
        if any(v.den is not None for v in values):
            den = self._let("v", chain([v.den or "1" for v in values], "1"))
        return num, den

    def _emit_ceil_output(self, r: _Rat) -> str:
        return self._let("o", f"-((-{r.num}) // {r.den})")


def compile_scalar(exprs: Sequence[Any], inputs: Sequence[sympy.Symbol]) -> str:
    """Python source of ``def _scalar(x0, x1, ...)`` returning ``(outputs, bad)`` for one candidate:
    each output an int (a number rounded up, as :func:`memform.engine.interpreter.to_bytes`) or a
    bool (a condition); ``bad`` is true where a denominator is zero or no branch applies."""
    b = _PyBuilder(inputs)
    outs = _outputs(b, exprs)
    args = ", ".join(b.var_of[s] for s in inputs)
    body = ["bad = False"] + b.lines + [f"return [{', '.join(outs)}], bad"]
    return f"def {FUNCTION}({args}):\n" + "\n".join("    " + line for line in body) + "\n"
