"""Plain-data syntax tree of the formula language.

The parser turns text into these nodes; nothing here knows about sympy or configs. Each node
keeps the :class:`~memform.errors.Loc` it came from so traces and errors can point at it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterator

from ..errors import Loc

# ---------------------------------------------------------------- expressions


@dataclass(frozen=True)
class Num:
    text: str
    loc: Loc


@dataclass(frozen=True)
class Str:
    value: str
    loc: Loc


@dataclass(frozen=True)
class Bool:
    value: bool
    loc: Loc


@dataclass(frozen=True)
class Ref:
    """``name``, ``block.quantity`` or ``block.quantity[variant]``."""

    name: str
    attr: str | None
    variant: str | None
    loc: Loc


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple["Expr", ...]
    loc: Loc
    #: the entries' names, one per argument (None: unnamed), where any is named: ``tensors(q: x, k: y)``
    names: tuple[str | None, ...] | None = None


@dataclass(frozen=True)
class BinOp:
    op: str  # + - * / % ^
    left: "Expr"
    right: "Expr"
    loc: Loc


@dataclass(frozen=True)
class Neg:
    operand: "Expr"
    loc: Loc


@dataclass(frozen=True)
class Cmp:
    op: str  # == != < <= > >=
    left: "Expr"
    right: "Expr"
    loc: Loc


@dataclass(frozen=True)
class Logic:
    op: str  # and / or
    operands: tuple["Expr", ...]
    loc: Loc


@dataclass(frozen=True)
class Not:
    operand: "Expr"
    loc: Loc


@dataclass(frozen=True)
class If:
    cond: "Expr"
    then: "Expr"
    other: "Expr"
    loc: Loc


@dataclass(frozen=True)
class Where:
    """``(expr where s = s / n, ...)``: ``expr`` with config-bound names given other values."""

    expr: "Expr"
    bindings: tuple[tuple[str, "Expr"], ...]
    loc: Loc


Expr = Num | Str | Bool | Ref | Call | BinOp | Neg | Cmp | Logic | Not | If | Where


def walk(node: Expr) -> Iterator[Expr]:
    """Every sub-expression of ``node`` (pre-order)."""
    yield node
    if isinstance(node, (BinOp, Cmp)):
        yield from walk(node.left)
        yield from walk(node.right)
    elif isinstance(node, (Neg, Not)):
        yield from walk(node.operand)
    elif isinstance(node, Logic):
        for o in node.operands:
            yield from walk(o)
    elif isinstance(node, If):
        yield from walk(node.cond)
        yield from walk(node.then)
        yield from walk(node.other)
    elif isinstance(node, Call):
        for a in node.args:
            yield from walk(a)
    elif isinstance(node, Where):
        yield from walk(node.expr)
        for _, e in node.bindings:
            yield from walk(e)


def substitute(node: Expr, name: str, value: Expr) -> Expr:
    """``node`` with every bare reference to ``name`` replaced by ``value``."""
    def sub(n: Expr) -> Expr:
        return substitute(n, name, value)

    if isinstance(node, Ref):
        return value if node.name == name and node.attr is None else node
    if isinstance(node, (BinOp, Cmp)):
        return replace(node, left=sub(node.left), right=sub(node.right))
    if isinstance(node, (Neg, Not)):
        return replace(node, operand=sub(node.operand))
    if isinstance(node, Logic):
        return replace(node, operands=tuple(sub(o) for o in node.operands))
    if isinstance(node, If):
        return replace(node, cond=sub(node.cond), then=sub(node.then), other=sub(node.other))
    if isinstance(node, Call):
        return replace(node, args=tuple(sub(x) for x in node.args))
    if isinstance(node, Where):
        return replace(node, expr=sub(node.expr), bindings=tuple((k, sub(e)) for k, e in node.bindings))
    return node

# ---------------------------------------------------------------- declarations


@dataclass(frozen=True)
class TypeSpec:
    """Type of a config-bound name: int (optionally ranged), real, bool, dtype, enum or set.

    ``set`` (``set {"a", "b"}``): any subset of the names, given as a list (or one name, or names
    separated by commas or spaces); in formulas a sorted tuple of the names, read with ``has(x, "a")``.

    ``or_bool`` (``bool | int[lo..hi]``): an int option that also takes true or false, which keep
    their values 1 and 0 in formulas (so give the integers a range above 1 to tell them apart).
    """

    kind: str
    lo: int | None = None
    hi: int | None = None
    choices: tuple[str, ...] = ()
    or_bool: bool = False
    or_list: bool = False  # ``int | list``: an integer or a list of integers (a tuple in formulas)

    def describe(self) -> str:
        if self.kind == "enum":
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.kind == "set":
            return "a list of names from " + ", ".join(repr(c) for c in self.choices)
        if self.kind == "names":
            one_char = all(len(c) == 1 for c in self.choices)
            return ("a list of names, one per entry, each one of " + ", ".join(repr(c) for c in self.choices)
                    + (" (or a string of those characters)" if one_char else ""))
        if self.or_bool:
            return "true, false or " + (f"an integer in {self.lo}..{self.hi}" if self.lo is not None else "an integer")
        if self.or_list:
            one = f"an integer in {self.lo}..{self.hi}" if self.lo is not None else "an integer"
            return f"{one}, or a list of integers"
        if self.kind == "int" and self.lo is not None:
            return f"an integer in {self.lo}..{self.hi}"
        return {"int": "an integer", "real": "a number", "bool": "true or false",
                "dtype": "a dtype name (fp32, bf16, fp16, fp8, ...)"}[self.kind]


@dataclass(frozen=True)
class Include:
    path: str
    loc: Loc
    #: ``include "X" if "W"``: X is included only when the program already loaded W (a framework
    #: profile refining a model file it cannot name otherwise); None: always
    when: str | None = None
    #: ``include "X" after profile``: X is loaded after every file the program was asked for (a config's formula
    #: files, its framework profile and the profile's companions), not where the include stands
    after_profile: bool = False
    #: ``include "X" when k1 or k2``: X is included only for a config that sets one of these keys (to any
    #: value); () always
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Binding:
    """``symbol`` (kept symbolic in closed forms) or ``option`` (substituted) bound to a config key."""

    keyword: str  # "symbol" or "option"
    name: str
    type: TypeSpec
    path: str
    default: Expr | None
    doc: str
    unit: str | None
    loc: Loc


@dataclass(frozen=True)
class Let:
    name: str
    expr: Expr
    loc: Loc


@dataclass(frozen=True)
class Def:
    name: str
    params: tuple[str, ...]
    expr: Expr
    loc: Loc


@dataclass(frozen=True)
class Require:
    expr: Expr
    message: str
    loc: Loc


@dataclass(frozen=True)
class Quantity:
    name: str
    variants: tuple[str, ...] | None  # None: the same formula for every variant
    expr: Expr
    loc: Loc
    moment: bool = False  # declared with ``moment`` in a schedule: a candidate peak moment


@dataclass(frozen=True)
class Block:
    """``block``, ``comm`` or ``schedule``: a named group of quantities."""

    kind: str
    name: str
    base: str | None
    quantities: tuple[Quantity, ...]
    loc: Loc


@dataclass(frozen=True)
class StackEntry:
    place: str | None  # "first", "last" or None (body, split over pipeline chunks)
    block: str
    count: Expr | None
    loc: Loc
    #: ``block * n if cond else other``: per layer, ``block`` where ``cond`` holds (with the name
    #: ``layer_index`` bound to the layer's 0-based body index), else ``other``; None: always ``block``
    cond: Expr | None = None
    other: str | None = None
    #: a chained choice ``block * n if c1 else b1 if c2 else other``: the ``(c2, b1)`` pairs tried in
    #: order after ``cond`` fails, before ``other``
    branches: tuple[tuple[Expr, str], ...] = ()
    #: ``... where f = e, g = e2``: config-bound names replaced in each layer's block by ``e`` evaluated
    #: at that layer (``layer_index`` bound)
    bindings: tuple[tuple[str, Expr], ...] = ()

    def blocks(self) -> tuple[str, ...]:
        """Every block this entry may place: its own, each branch's and the final ``else``."""
        names = (self.block,) + tuple(b for _, b in self.branches) + ((self.other,) if self.other else ())
        return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class Stack:
    entries: tuple[StackEntry, ...]
    loc: Loc


Decl = Include | Binding | Let | Def | Require | Block | Stack


@dataclass(frozen=True)
class File:
    path: str
    decls: tuple[Decl, ...] = field(default_factory=tuple)
