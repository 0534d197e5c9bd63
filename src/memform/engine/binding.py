"""Config values → the numbers, flags and sympy symbols a formula program is evaluated with.

Each ``symbol``/``option`` declaration names a config key, a type and maybe a default (an
expression over other bindings). This module checks every value against its declared type
and turns it into an exact sympy number, so a wrong type or a zero degree is caught here,
with the key and the declaration that wanted it named.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping

import sympy

from ..errors import MemformError
from ..lang import ast
from ..lang.program import Program
from .evaluator import Ctx, Evaluator
from .values import _MISSING, DTYPE_BYTES, check_value, get_path, set_members  # noqa: F401 (get_path re-exported)

def coerce(value: Any, spec: ast.TypeSpec, key: str, *, positive: bool = False) -> Any:
    """Check ``value`` (from YAML) against ``spec``; return bool, str or an exact sympy number."""
    return _exact(check_value(value, spec, key, positive=positive))


def _exact(v: Any) -> Any:
    if isinstance(v, (bool, str)):
        return v
    if isinstance(v, tuple):
        return tuple(x if isinstance(x, str) else sympy.Integer(x) for x in v)
    if isinstance(v, Fraction):
        return sympy.Rational(v.numerator, v.denominator)
    return sympy.Integer(v)


@dataclass
class Bound:
    """A program's bindings resolved against one config."""

    symbols: dict[str, sympy.Symbol]
    values: dict[sympy.Symbol, sympy.Expr]
    options: dict[str, Any]

    def evaluator(self, program: Program, *, resolve: bool = True, keep: frozenset[str] | None = None) -> Evaluator:
        return Evaluator(program, self.symbols, self.values, self.options, resolve=resolve, keep=keep)

    def value_of(self, name: str) -> Any:
        if name in self.options:
            return self.options[name]
        return self.values[self.symbols[name]]


def bind(program: Program, config: Mapping[str, Any]) -> Bound:
    """Resolve every ``symbol``/``option`` of ``program`` from ``config`` (defaults applied)."""
    symbols: dict[str, sympy.Symbol] = {}
    values: dict[sympy.Symbol, sympy.Expr] = {}
    options: dict[str, Any] = {}
    for name, decl in program.bindings.items():
        if decl.keyword == "symbol":
            assumptions = {"integer": True} if decl.type.kind == "int" else {"real": True}
            symbols[name] = sympy.Symbol(name, positive=True, **assumptions)

    # Defaults may refer to other bindings, so resolve lazily through a numeric evaluator.
    resolving: list[str] = []
    numeric = Evaluator(program, symbols, values, options, resolve=True, keep=frozenset())
    original_binding = numeric.binding

    def resolve(name: str) -> Any:
        decl = program.bindings[name]
        done = options if decl.keyword == "option" else None
        if done is not None and name in done:
            return done[name]
        if done is None and symbols[name] in values:
            return values[symbols[name]]
        if name in resolving:
            chain = " -> ".join(resolving[resolving.index(name):] + [name])
            raise MemformError(f"cyclic defaults: {chain}", decl.loc)
        resolving.append(name)
        try:
            raw = get_path(config, decl.path)
            if raw is _MISSING or raw is None:
                if decl.default is None:
                    raise MemformError(f"missing config key '{decl.path}' ({decl.doc}; "
                                       f"bound to {decl.keyword} '{name}' at {decl.loc})")
                v = numeric.eval(decl.default, Ctx())
                v = _check_default(v, decl)
            else:
                v = coerce(raw, decl.type, decl.path, positive=decl.keyword == "symbol")
        finally:
            resolving.pop()
        if decl.keyword == "option":
            options[name] = v
        else:
            values[symbols[name]] = v
        return v

    def binding(name: str) -> Any:
        v = resolve(name)
        decl = program.bindings[name]
        return v if decl.keyword == "option" else original_binding(name)

    numeric.binding = binding  # type: ignore[method-assign]
    for name in program.bindings:
        resolve(name)
    return Bound(symbols, values, options)


def _check_default(v: Any, decl: ast.Binding) -> Any:
    kind = decl.type.kind
    where = f"default of {decl.keyword} '{decl.name}' ({decl.loc})"
    if decl.type.or_bool and isinstance(v, bool):
        return v
    if kind in ("bool",):
        if not isinstance(v, bool):
            raise MemformError(f"{where} must be true or false")
        return v
    if kind == "enum":
        if v not in decl.type.choices:
            raise MemformError(f"{where} must be {decl.type.describe()}")
        return v
    if kind == "set":
        return set_members(v, decl.type, lambda extra="": MemformError(f"{where} must be {decl.type.describe()} {extra}".rstrip()))
    if kind == "dtype":
        if isinstance(v, str) and v.lower() in DTYPE_BYTES:
            return sympy.Integer(DTYPE_BYTES[v.lower()])
    if isinstance(v, (bool, str)):
        raise MemformError(f"{where} must be {decl.type.describe()}")
    if not getattr(v, "is_number", False):
        raise MemformError(f"{where} does not reduce to a number")
    if kind == "int" and not v.is_integer:
        raise MemformError(f"{where} evaluates to {v}, not an integer")
    if decl.keyword == "symbol" and not v > 0:
        raise MemformError(f"{where} evaluates to {v}, which is not positive")
    return v
