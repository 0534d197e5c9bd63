"""Config values → the numbers, flags and sympy symbols a formula program is evaluated with.

Each ``symbol``/``option`` declaration names a config key, a type and maybe a default (an
expression over other bindings). This module checks every value against its declared type
and turns it into an exact sympy number, so a wrong type or a zero degree is caught here,
with the key and the declaration that wanted it named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import sympy

from ..errors import MemformError
from ..lang import ast
from ..lang.program import Program
from .evaluator import Ctx, Evaluator

#: bytes per element of the dtype names accepted in configs
DTYPE_BYTES: dict[str, int] = {
    "fp64": 8, "float64": 8, "fp32": 4, "float32": 4, "tf32": 4, "bf16": 2, "bfloat16": 2,
    "fp16": 2, "float16": 2, "half": 2, "fp8": 1, "float8": 1, "int8": 1, "none": 0,
}

_MISSING = object()


def get_path(tree: Mapping[str, Any], path: str, default: Any = _MISSING) -> Any:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a mapping"}.get(type(v), type(v).__name__)


def coerce(value: Any, spec: ast.TypeSpec, key: str, *, positive: bool = False) -> Any:
    """Check ``value`` (from YAML) against ``spec``; return bool, str or an exact sympy number."""
    def bad(extra: str = "") -> MemformError:
        return MemformError(f"config key '{key}' must be {spec.describe()}{' ' + extra if extra else ''}, "
                            f"got {_type_name(value)} {value!r}")

    kind = spec.kind
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad()
        return value
    if kind == "enum":
        if not isinstance(value, str) or value not in spec.choices:
            raise bad()
        return value
    if kind == "dtype":
        if isinstance(value, str) and value.lower() in DTYPE_BYTES:
            return sympy.Integer(DTYPE_BYTES[value.lower()])
        if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1, 2, 4, 8):
            return sympy.Integer(value)
        raise bad("(or a byte count 1, 2, 4, 8)")
    if spec.or_bool and isinstance(value, bool):  # `bool | int`: true / false stay booleans
        return value
    if spec.or_list and isinstance(value, (list, tuple)):  # `int | list`: a tuple of exact integers
        if not value or any(isinstance(x, bool) or not isinstance(x, int) for x in value):
            raise bad("(a non-empty list of integers)")
        return tuple(sympy.Integer(x) for x in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad()
    if kind == "int":
        if isinstance(value, float):
            raise bad()
        number = sympy.Integer(value)
        if spec.lo is not None and not (spec.lo <= value <= spec.hi):
            raise bad()
    else:
        if value != value or value in (float("inf"), float("-inf")):
            raise bad("(finite)")
        number = sympy.Rational(repr(value)) if isinstance(value, float) else sympy.Integer(value)
    if positive and number <= 0:
        raise MemformError(f"config key '{key}' must be positive, got {value!r}")
    return number


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
