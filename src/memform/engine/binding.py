"""Config values → the numbers, flags and symbols a formula program is evaluated with.

Each ``symbol``/``option`` declaration names a config key, a type and maybe a default (an
expression over other bindings). This module checks every value against its declared type
and turns it into an exact number of the chosen backend (sympy numbers and symbols, or with
``numeric=True`` plain ``int``/``Fraction`` keyed by name, without importing sympy), so a wrong
type or a zero degree is caught here, with the key and the declaration that wanted it named.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping

from ..errors import MemformError
from ..lang import ast
from ..lang.program import Program
from .walker import Ctx, Walker
from .values import _MISSING, DTYPE_BYTES, check_value, get_path, name_list, set_members  # noqa: F401 (get_path re-exported)

#: the magnitude of a real config value (0 aside): the reports, the compiled search and solve and the
#: allocator replay turn values into floats, where 1e400 overflows and 1e-320's exact denominator does
REAL_LIMIT = 2 ** 200


def coerce(value: Any, spec: ast.TypeSpec, key: str, *, positive: bool = False, numeric: bool = False) -> Any:
    """Check ``value`` (from YAML) against ``spec``; return bool, str or an exact number
    (sympy's, or with ``numeric`` an int or a Fraction that is not an integer)."""
    v = check_value(value, spec, key, positive=positive)
    if (spec.kind == "real" and isinstance(v, (int, Fraction)) and not isinstance(v, bool) and v != 0
            and not Fraction(1, REAL_LIMIT) <= abs(v) <= REAL_LIMIT):
        from .config import _approx
        raise MemformError(f"config key '{key}' must be 0 or between 2^-200 and 2^200 in size, got {_approx(v)}")
    return _exact(v, numeric)


def _exact(v: Any, numeric: bool = False) -> Any:
    if isinstance(v, (bool, str)):
        return v
    if numeric:
        from .numeric import exact
        return tuple(x if isinstance(x, str) else int(x) for x in v) if isinstance(v, tuple) else exact(v)
    import sympy
    if isinstance(v, tuple):
        return tuple(x if isinstance(x, str) else sympy.Integer(x) for x in v)
    if isinstance(v, Fraction):
        return sympy.Rational(v.numerator, v.denominator)
    return sympy.Integer(v)


def evaluator_class(numeric: bool) -> type[Walker]:
    """The evaluator of a backend: :class:`~.numeric.NumericEvaluator` (plain numbers, no sympy)
    or the sympy :class:`~.evaluator.Evaluator`. Imported on demand: the numeric path never loads sympy."""
    if numeric:
        from .numeric import NumericEvaluator
        return NumericEvaluator
    from .evaluator import Evaluator
    return Evaluator


@dataclass
class Bound:
    """A program's bindings resolved against one config."""

    symbols: dict[str, Any]        # name -> sympy Symbol (numeric: the name itself)
    values: dict[Any, Any]         # symbol -> its exact value
    options: dict[str, Any]
    #: the backend: plain numbers (:mod:`memform.engine.numeric`) rather than sympy
    numeric: bool = False

    def evaluator(self, program: Program, *, resolve: bool = True, keep: frozenset[str] | None = None) -> Walker:
        """An evaluator of ``program`` under these values (a numeric one keeps no symbol, whatever ``keep``)."""
        return evaluator_class(self.numeric)(program, self.symbols, self.values, self.options, resolve=resolve,
                                             keep=keep)

    def value_of(self, name: str) -> Any:
        if name in self.options:
            return self.options[name]
        return self.values[self.symbols[name]]


def bind(program: Program, config: Mapping[str, Any], *, numeric: bool = False) -> Bound:
    """Resolve every ``symbol``/``option`` of ``program`` from ``config`` (defaults applied), as sympy
    numbers and symbols, or (``numeric``) as plain Python numbers without importing sympy."""
    symbols: dict[str, Any] = {}
    values: dict[Any, Any] = {}
    options: dict[str, Any] = {}
    for name, decl in program.bindings.items():
        if decl.keyword == "symbol":
            symbols[name] = name if numeric else _symbol(name, decl)

    # Defaults may refer to other bindings, so resolve lazily through an evaluator that keeps no symbol.
    resolving: list[str] = []
    ev = evaluator_class(numeric)(program, symbols, values, options, resolve=True, keep=frozenset())

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
                v = ev.eval(decl.default, Ctx())
                v = _check_default(v, decl, ev)
            else:
                v = coerce(raw, decl.type, decl.path, positive=decl.keyword == "symbol", numeric=numeric)
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

    original_binding = ev.binding
    ev.binding = binding  # type: ignore[method-assign]
    for name in program.bindings:
        resolve(name)
    return Bound(symbols, values, options, numeric)


def _symbol(name: str, decl: ast.Binding) -> Any:
    import sympy
    assumptions = {"integer": True} if decl.type.kind == "int" else {"real": True}
    return sympy.Symbol(name, positive=True, **assumptions)


def _check_default(v: Any, decl: ast.Binding, ev: Walker) -> Any:
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
    if kind == "names":
        return name_list(v, decl.type, lambda extra="": MemformError(f"{where} must be {decl.type.describe()} {extra}".rstrip()))
    if kind == "dtype":
        if isinstance(v, str) and v.lower() in DTYPE_BYTES:
            return ev.integer(DTYPE_BYTES[v.lower()])
    if isinstance(v, (bool, str)):
        raise MemformError(f"{where} must be {decl.type.describe()}")
    if isinstance(v, tuple) or ev.is_condition(v) or not ev.is_number(v):
        raise MemformError(f"{where} does not reduce to a number")
    if kind == "int" and not ev.is_integer(v):
        raise MemformError(f"{where} evaluates to {v}, not an integer")
    if decl.keyword == "symbol" and not v > 0:
        raise MemformError(f"{where} evaluates to {v}, which is not positive")
    return v
