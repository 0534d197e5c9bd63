"""Config values checked against declared types, in plain Python (no sympy).

Shared by config validation (which must stay cheap: the cached fast path of ``memform estimate``
does not import sympy) and :mod:`memform.engine.binding`, which turns the checked values into
exact sympy numbers.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Mapping

from ..errors import MemformError
from ..lang import ast

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


def set_members(value: Any, spec: ast.TypeSpec, bad: Any) -> tuple[str, ...]:
    """The names of a ``set`` value, sorted and unique: a list of names, or one string of names
    separated by commas or spaces (as a command line gives them: ``--recompute-modules core_attn mlp``)."""
    if isinstance(value, str):
        value = value.replace(",", " ").split()
    if not isinstance(value, (list, tuple)) or any(not isinstance(x, str) for x in value):
        raise bad()
    unknown = [x for x in value if x not in spec.choices]
    if unknown:
        raise bad(f"('{unknown[0]}' is not one of them)")
    return tuple(sorted(set(value)))


def name_list(value: Any, spec: ast.TypeSpec, bad: Any) -> tuple[str, ...]:
    """The entries of a ``list {...}`` value, in order: a list of names, or, where every name is one
    character, a string read one character per entry (Megatron's ``--hybrid-override-pattern M-M*-``);
    ``""`` is the empty sequence whatever the names."""
    if value == "":   # the empty sequence (a default: "no per-layer pattern given")
        return ()
    if isinstance(value, str) and all(len(c) == 1 for c in spec.choices):
        value = list(value)
    if not isinstance(value, (list, tuple)) or any(not isinstance(x, str) for x in value):
        raise bad()
    for i, x in enumerate(value):
        if x not in spec.choices:
            raise bad(f"(entry {i}, '{x}', is not one of them)")
    return tuple(value)


def check_value(value: Any, spec: ast.TypeSpec, key: str, *, positive: bool = False) -> Any:
    """Check ``value`` (from YAML) against ``spec``; return bool, str, int, Fraction or a tuple of ints.

    Plain Python numbers (exact: a float becomes the Fraction of its shortest repr), so config
    checks need no computer algebra; :func:`memform.engine.binding.coerce` converts the result."""
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
    if kind == "set":
        return set_members(value, spec, bad)
    if kind == "names":
        return name_list(value, spec, bad)
    if kind == "dtype":
        if isinstance(value, str) and value.lower() in DTYPE_BYTES:
            return DTYPE_BYTES[value.lower()]
        if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1, 2, 4, 8):
            return int(value)
        raise bad("(or a byte count 1, 2, 4, 8)")
    if spec.or_bool and isinstance(value, bool):  # `bool | int`: true / false stay booleans
        return value
    if spec.or_list and isinstance(value, (list, tuple)):  # `int | list`: a tuple of exact integers
        if not value or any(isinstance(x, bool) or not isinstance(x, int) for x in value):
            raise bad("(a non-empty list of integers)")
        return tuple(int(x) for x in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad()
    if kind == "int":
        if isinstance(value, float):
            raise bad()
        number: int | Fraction = int(value)
        if spec.lo is not None and not (spec.lo <= value <= spec.hi):
            raise bad()
    else:
        if value != value or value in (float("inf"), float("-inf")):
            raise bad("(finite)")
        number = Fraction(repr(value)) if isinstance(value, float) else int(value)
    if positive and number <= 0:
        raise MemformError(f"config key '{key}' must be positive, got {value!r}")
    return number
