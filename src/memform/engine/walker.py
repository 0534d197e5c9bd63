"""The formula AST walk shared by both evaluators: names, scopes, memo, cycles and errors.

What a formula *means* (which quantity a name refers to, how ``where``, ``def``, ``layers_*``
and list functions bind, which errors a bad formula raises) is decided here, once. How numbers
are represented is left to a small set of arithmetic hooks that a backend fills in:

* :class:`memform.engine.evaluator.Evaluator` -- sympy expressions, with symbols kept where asked,
  conditions decided as assumptions or kept as ``Piecewise`` (closed forms, derive, solve, search);
* :class:`memform.engine.numeric.NumericEvaluator` -- plain Python ``int`` / ``Fraction``, every
  symbol replaced by its value (the cold ``memform estimate``, which must not import sympy).

Both make the same decisions at the same points, so they give the same numbers; nothing in this
module imports sympy.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable

from ..errors import Loc, MemformError, did_you_mean
from ..lang import ast
from ..lang.program import AFTER, AGGREGATES, END, LIST_FUNCS, SLOTS, STAGE, TENSORS, Program

Value = Any  # a backend's number | bool | str | tuple (list option) | a backend's condition

#: Largest magnitude (in bits, about 19,700 decimal digits) a formula value may reach. No byte
#: count comes near it; a formula that does (``2 ^ (10 ^ 12)``) is a mistake and would otherwise
#: make sympy compute for hours instead of failing.
MAX_BITS = 65536
#: Deepest nesting of expressions and references the evaluator follows before giving up with a
#: clear error (well below Python's recursion limit, which would otherwise end in a traceback).
MAX_DEPTH = 150
_NUM_RE = re.compile(r"(?P<mant>[0-9]+(?:\.[0-9]+)?)(?:[eE](?P<exp>[+-]?[0-9]+))?")


#: the key under which a reduction's argument sees the visited group's forward position (not a formula name)
_ORDER = "#order"   # (forward position, the reduction's own overrides)


class Tensors(tuple):
    """The value of ``tensors(...)``: its entries (a tuple of numbers) and the positions of its named
    entries, ``names`` (name -> 0-based position; a list entry's own names as ``name.inner``, or as they
    are where the list entry has no name; -1: a name two entries share, which no one may read)."""

    names: dict[str, int]

    def __new__(cls, entries: Any = (), names: dict[str, int] | None = None) -> "Tensors":
        t = super().__new__(cls, entries)
        t.names = names or {}
        return t


def _name_entry(names: dict[str, int], name: str, at: int) -> None:
    """Give ``name`` the position ``at`` in ``names`` (-1 where another position has it already)."""
    names[name] = at if names.get(name, at) == at else -1


def merged_names(a: Any, b: Any) -> dict[str, int]:
    """The names of two lists of one length that a condition chooses between entry by entry."""
    names = dict(getattr(a, "names", {}))
    for k, i in getattr(b, "names", {}).items():
        _name_entry(names, k, i)
    return names


@dataclass(frozen=True)
class LayerSlot:
    """One layer group of a stage, as the ``layers_*`` reductions of a schedule see it."""

    chunk: int
    block: str
    mode: str
    count: Any          # layers in the group (a backend number; symbolic when the split is even)
    order: int          # position in forward order (the largest is the stage's last layer)
    bindings: tuple = ()  # the stack entry's per-layer ``where`` values (name, value), sorted by name


@dataclass(frozen=True)
class Ctx:
    block: str | None = None
    mode: str | None = None
    params: tuple[tuple[str, Value], ...] = ()
    extra: tuple[tuple[str, Value], ...] = ()  # schedule names: stage, chunk
    outer: str | None = None  # inside a layers_* argument: the schedule whose quantities stay visible
    overrides: tuple[tuple[str, Value], ...] = ()  # ``where`` replacements of config-bound names

    def local(self, name: str) -> Value | None:
        for k, v in self.params:
            if k == name:
                return v
        return None


@dataclass
class Walker:
    """Evaluates quantities of ``program`` under one set of bound values (memoized).

    Subclasses supply the arithmetic: the hooks below marked "backend" (numbers, operators,
    conditions, reductions). Everything else -- scoping, memo, cycle and depth checks, the
    errors a formula author sees -- lives here, once.
    """

    program: Program
    symbols: dict[str, Any]                   # symbol name -> its key in ``values`` (a sympy Symbol, or the name)
    values: dict[Any, Any]                    # numeric value of every symbol
    options: dict[str, Value]                 # option name -> bool / str / number
    resolve: bool = True
    keep: frozenset[str] | None = None        # None: keep every symbol
    assumptions: list[str] = field(default_factory=list)
    #: the layers of each stage, set by the interpreter before a schedule's moments are evaluated
    stage_layers: dict[int, tuple[LayerSlot, ...]] = field(default_factory=dict)
    _memo: dict[tuple, Value] = field(default_factory=dict)
    _active: list[tuple[tuple, Loc]] = field(default_factory=list)
    _calls: list[str] = field(default_factory=list)   # user functions being evaluated (recursion check)
    #: _bits() of sub-expressions at this evaluator's values: nested quantities share them, and a
    #: memo per call made the size checks quadratic in the nesting depth
    _bits_memo: dict = field(default_factory=dict)
    _depth: int = 0

    # ---------------------------------------------------------------- backend: numbers
    def integer(self, n: int) -> Any:
        """The backend's exact integer ``n``."""
        raise NotImplementedError

    @property
    def zero(self) -> Any:
        return self.integer(0)

    def literal(self, text: str) -> Any:
        """A number literal of the formula text (``0.9``, ``1e3``), exactly."""
        raise NotImplementedError

    def number(self, value: Value, loc: Loc | None = None, what: str = "expression") -> Any:
        """The exact numeric value of ``value`` at the config."""
        raise NotImplementedError

    def is_number(self, v: Any) -> bool:
        """Whether ``v`` is a number (no symbols left)."""
        raise NotImplementedError

    def is_integer(self, n: Any) -> bool:
        """Whether the number ``n`` is an integer."""
        raise NotImplementedError

    @staticmethod
    def ceil_int(n: Any) -> int:
        """The number ``n`` rounded up to a Python int (:func:`to_bytes`)."""
        return to_bytes(n)

    def total(self, terms: Any) -> Any:
        """The sum of ``terms`` (an iterable of backend values)."""
        raise NotImplementedError

    def at_least(self, lo: int, v: Any) -> Any:
        """``max(lo, v)``, kept unevaluated where ``v`` is symbolic."""
        raise NotImplementedError

    def bits(self, v: Any) -> float:
        """A cheap upper bound of log2 of the magnitude of ``v`` (numerators and denominators)."""
        raise NotImplementedError

    def is_finite_real(self, n: Any) -> bool:
        """Whether the number ``n`` is finite and real (plain rationals always are)."""
        return True

    def approx(self, n: Any) -> str:
        """``n`` to 3 significant digits, for an error message."""
        return _approx(n)

    # ---------------------------------------------------------------- backend: operators and conditions
    def is_condition(self, v: Value) -> bool:
        """Whether ``v`` is a (symbolic) condition rather than a number."""
        return False

    def _operand(self, v: Any, loc: Loc) -> Any:
        """``v`` as an operand of arithmetic, after checking it is finite and real where it must be."""
        return v

    def _is_zero(self, b: Any) -> bool:
        """Whether ``b`` is the number zero (a divisor that must be refused)."""
        raise NotImplementedError

    def _is_unit(self, a: Any) -> bool:
        """Whether ``a`` is plainly 0, 1 or -1 (a power base whose size never grows)."""
        raise NotImplementedError

    def _arith(self, op: str, a: Any, b: Any) -> Any:
        """``a op b`` for op in + - * / % ^ (``/`` and ``%`` by a non-zero, ``^`` checked)."""
        raise NotImplementedError

    def _compare(self, op: str, a: Any, b: Any, loc: Loc) -> Value:
        """``a op b`` for numbers or expressions: a bool, or (resolve=False) a condition."""
        raise NotImplementedError

    def _truth_other(self, v: Value, loc: Loc) -> Value:
        """:meth:`truth` of anything but a bool or a string."""
        raise NotImplementedError

    def _combine(self, is_and: bool, parts: list[Value]) -> Value:
        """``and``/``or`` of conditions left undecided (resolve=False)."""
        raise NotImplementedError

    def _negate(self, cond: Value) -> Value:
        raise NotImplementedError

    def _piecewise(self, cond: Value, then: Any, other: Any) -> Any:
        """``if cond then a else b`` for an undecided condition."""
        raise NotImplementedError

    def _extreme(self, f: str, nums: list[Any], loc: Loc) -> Any:
        """``min``/``max`` of ``nums`` (``f``): decided at the config's values where ``resolve``."""
        raise NotImplementedError

    def _round(self, f: str, x: Any, loc: Loc) -> Any:
        """``ceil``/``floor`` (``f``) of ``x``."""
        raise NotImplementedError

    def _log2(self, x: Any) -> Any:
        """log2 of the positive ``x``."""
        raise NotImplementedError

    def _abs(self, x: Any) -> Any:
        raise NotImplementedError

    def _layers_max(self, distinct: list[Any], loc: Loc) -> Any:
        """The largest of several distinct per-layer values (``layers_max``)."""
        raise NotImplementedError

    def _check_value(self, value: Any, label: str, loc: Loc | None) -> None:
        """Checks on a quantity's or a let's value where it is defined (size, finiteness)."""
        raise NotImplementedError

    def _cond_text(self, cond: Any) -> str:
        return str(cond)

    # ---------------------------------------------------------------- public
    def quantity(self, block: str, qname: str, mode: str | None = None, loc: Loc | None = None,
                 extra: tuple[tuple[str, Value], ...] = (),
                 overrides: tuple[tuple[str, Value], ...] = ()) -> Value:
        key = ("q", block, qname, mode, extra, overrides)
        if key in self._memo:
            return self._memo[key]
        q = self.program.pick(block, qname, mode)
        if q is None:
            if self.program.find_quantity(block, qname) is not None:
                raise MemformError(f"'{block}.{qname}' has variants; name one, e.g. {block}.{qname}[none]", loc)
            raise MemformError(f"block '{block}' has no quantity '{qname}'", loc)
        label = f"{block}.{qname}" + (f"[{mode}]" if mode and self.program.has_variants(block, qname) else "")
        value = self._guarded(key, label, q.loc if loc is None else loc,
                              lambda: self.eval(q.expr, Ctx(block=block, mode=mode, extra=extra, overrides=overrides)), q.loc)
        return value

    def let(self, name: str, loc: Loc | None = None, overrides: tuple[tuple[str, Value], ...] = (),
            stage: Value | None = None) -> Value:
        """The let's value (``stage``: the stage it is read at, for a let that reads ``stage``)."""
        key = ("let", name, overrides) if stage is None else ("let", name, overrides, stage)
        if key in self._memo:
            return self._memo[key]
        decl = self.program.lets[name]
        if stage is None and name in self.program.stage_readers()[0]:
            # read by memform itself once per model (the allocator's grads_kept; the opt_flat_* lets, where they
            # read stage, per stage)
            raise MemformError(f"'{name}' reads the pipeline stage ('{STAGE}'), but it is read once for the whole "
                               f"model here, where no stage is bound", loc or decl.loc)
        ctx = Ctx(overrides=overrides) if stage is None else Ctx(extra=((STAGE, stage),), overrides=overrides)
        return self._guarded(key, name, loc or decl.loc, lambda: self.eval(decl.expr, ctx), decl.loc)

    def _stage_for(self, name: str, is_def: bool, ctx: Ctx, loc: Loc) -> Value | None:
        """The stage a let or def that reads ``stage`` is evaluated at (None for one that does not)."""
        lets, defs = self.program.stage_readers()
        if name not in (defs if is_def else lets):
            return None
        for k, v in ctx.extra:
            if k == STAGE:
                return v
        raise MemformError(f"'{name}' reads the pipeline stage ('{STAGE}'), which is bound only in schedule, "
                           f"runtime and cost blocks", loc)

    def binding(self, name: str) -> Value:
        decl = self.program.bindings[name]
        if decl.keyword == "option":
            return self.options[name]
        sym = self.symbols[name]
        if self.keep is None or name in self.keep:
            return sym
        return self.values[sym]

    def keeps(self, name: str) -> bool:
        """Whether the symbol ``name`` stays symbolic in this evaluator's expressions."""
        return self.keep is None or name in self.keep

    def as_expr(self, v: Value, loc: Loc | None) -> Any:
        """``v`` as a number-valued expression (true/false count as 1/0); strings and conditions are errors."""
        if isinstance(v, bool):
            return self.integer(int(v))
        if isinstance(v, str):
            raise MemformError(f"the string '{v}' cannot be used as a number", loc)
        if isinstance(v, tuple):
            raise MemformError("a list cannot be used as a number here; take one entry with at(list, i) "
                               "(or test is_list(x) first)", loc)
        if self.is_condition(v):
            raise MemformError("a condition cannot be used as a number here", loc)
        return v

    def truth(self, v: Value, loc: Loc) -> Value:
        """A Python bool, or (resolve=False) a backend condition."""
        if isinstance(v, bool):
            return v
        if isinstance(v, str):
            raise MemformError(f"the string '{v}' is not a condition; compare it, e.g. x == \"{v}\"", loc)
        return self._truth_other(v, loc)

    def assume(self, cond: Any) -> None:
        """Record a decision taken at the config's values (shown as "valid where: ...")."""
        text = self._cond_text(cond)
        if text not in self.assumptions:
            self.assumptions.append(text)

    # ---------------------------------------------------------------- internals
    def _guarded(self, key: tuple, label: str, loc: Loc, compute: Callable[[], Value],
                 defined: Loc | None = None) -> Value:
        for active, _ in self._active:
            if active == key:
                names = [self._label(k) for k, _ in self._active[self._index(key):]] + [label]
                raise MemformError("cyclic definition: " + " -> ".join(names), loc)
        self._active.append((key, loc))
        try:
            value = compute()
        finally:
            self._active.pop()
        # report a too large or non-finite value at the formula that makes it, not where it is used
        self._check_value(value, label, defined or loc)
        self._memo[key] = value
        return value

    def _check_size(self, value: Any, what: str, loc: Loc | None) -> None:
        bits = self.bits(value)
        if bits > MAX_BITS:
            raise MemformError(f"{what} is too large to be a memory size (about 2^{_show_bits(bits)}); "
                               f"check the formula", loc)

    def _index(self, key: tuple) -> int:
        return [k for k, _ in self._active].index(key)

    @staticmethod
    def _label(key: tuple) -> str:
        if key[0] == "let":
            return key[1]
        return f"{key[1]}.{key[2]}" + (f"[{key[3]}]" if key[3] else "")

    def eval(self, node: ast.Expr, ctx: Ctx) -> Value:
        method = getattr(self, "_e_" + type(node).__name__)
        if self._depth >= MAX_DEPTH:
            raise MemformError(f"formulas nest more than {MAX_DEPTH} levels deep here (expressions inside "
                               f"expressions, or definitions referring to definitions); simplify them", node.loc)
        self._depth += 1
        try:
            return method(node, ctx)
        except RecursionError:  # only a safety net: MAX_DEPTH should stop us first
            if self._depth > 1:
                raise
            raise MemformError("formulas nest too deeply to evaluate", node.loc) from None
        finally:
            self._depth -= 1

    def _e_Num(self, node: ast.Num, ctx: Ctx) -> Value:
        m = _NUM_RE.fullmatch(node.text)
        if m and m.group("exp") and abs(int(m.group("exp"))) > 4000:
            raise MemformError(f"the number {node.text} is too large or too small for a formula", node.loc)
        return self.literal(node.text)

    def _e_Str(self, node: ast.Str, ctx: Ctx) -> Value:
        return node.value

    def _e_Bool(self, node: ast.Bool, ctx: Ctx) -> Value:
        return node.value

    def _e_Ref(self, node: ast.Ref, ctx: Ctx) -> Value:
        prog = self.program
        ov = ctx.overrides
        if node.attr is not None:
            # inside a cost block another cost block's quantity is the same stage's
            extra = (ctx.extra if ctx.block is not None and ctx.outer is None
                     and prog.blocks[ctx.block].kind == "cost" and prog.blocks[node.name].kind == "cost" else ())
            return self.quantity(node.name, node.attr, node.variant or ctx.mode, node.loc, extra, overrides=ov)
        local = ctx.local(node.name)
        if local is not None:
            return local
        if ctx.block is not None and prog.find_quantity(ctx.block, node.name) is not None:
            # a layer's own quantities do not depend on the stage/chunk a reduction visits
            extra = () if ctx.outer is not None else ctx.extra
            return self.quantity(ctx.block, node.name, node.variant or ctx.mode, node.loc, extra, ov)
        if ctx.outer is not None:
            if node.name == "mode":
                return ctx.mode
            if prog.find_quantity(ctx.outer, node.name) is not None:
                return self.quantity(ctx.outer, node.name, node.variant, node.loc, ctx.extra, ov)
        for k, v in ctx.extra:
            if k == node.name:
                return v
        if node.name in prog.lets:
            return self.let(node.name, node.loc, ov, self._stage_for(node.name, False, ctx, node.loc))
        if node.name in prog.bindings:
            for k, v in ov:  # a `where` replacement
                if k == node.name:
                    return v
            return self.binding(node.name)
        raise MemformError(f"unknown symbol '{node.name}'", node.loc)

    def _e_BinOp(self, node: ast.BinOp, ctx: Ctx) -> Value:
        a = self._operand(self.as_expr(self.eval(node.left, ctx), node.loc), node.loc)
        b = self._operand(self.as_expr(self.eval(node.right, ctx), node.loc), node.loc)
        op = node.op
        if op in ("/", "%") and self._is_zero(b):
            raise MemformError("division by zero", node.loc)
        if op == "^":
            self._check_power(a, b, node.loc)
        return self._arith(op, a, b)

    def _check_power(self, a: Any, b: Any, loc: Loc) -> None:
        """Refuse ``a ^ b`` before the backend spends hours computing a number nobody needs."""
        if self._is_unit(a):
            return
        b_bits = self.bits(b)
        if b_bits <= 64:
            try:
                exponent = abs(float(self.number(b, loc, "exponent")))
            except MemformError:
                return  # a non-finite exponent is reported where the value is used
            total = self.bits(a) * max(exponent, 1.0)
        else:
            total = math.inf
        if total <= MAX_BITS and not (self.is_number(b) and self.is_integer(b)):
            base = self.number(a, loc, "the base of this power")
            if base < 0 and not self.is_integer(self.number(b, loc, "the exponent")):
                raise MemformError(f"a negative number ({base}) raised to a fractional power is not real", loc)
        if total > MAX_BITS:
            raise MemformError(f"this power is too large to be a memory size (about 2^{_show_bits(total)}); "
                               f"check the formula", loc)

    def _e_Neg(self, node: ast.Neg, ctx: Ctx) -> Value:
        return -self.as_expr(self.eval(node.operand, ctx), node.loc)

    def _e_Cmp(self, node: ast.Cmp, ctx: Ctx) -> Value:
        a = self.eval(node.left, ctx)
        b = self.eval(node.right, ctx)
        if isinstance(a, str) or isinstance(b, str):
            if not (isinstance(a, str) and isinstance(b, str)):
                raise MemformError("a string can only be compared with a string", node.loc)
            if node.op not in ("==", "!="):
                raise MemformError("strings can only be compared with == or !=", node.loc)
            return PY_CMP[node.op](a, b)
        a, b = (self.as_expr(x, node.loc) for x in (a, b))
        for x in (a, b):  # sympy decides zoo == 3 as False: a silently wrong branch
            if self.is_number(x):
                self.number(x, node.loc, "a side of this comparison")
        return self._compare(node.op, a, b, node.loc)

    def _e_Logic(self, node: ast.Logic, ctx: Ctx) -> Value:
        is_and = node.op == "and"
        parts = []
        for operand in node.operands:
            v = self.truth(self.eval(operand, ctx), operand.loc)
            if isinstance(v, bool):
                if v != is_and:  # short-circuit: false in 'and', true in 'or'
                    return v
                continue
            parts.append(v)
        if not parts:
            return is_and
        return self._combine(is_and, parts)

    def _e_Not(self, node: ast.Not, ctx: Ctx) -> Value:
        v = self.truth(self.eval(node.operand, ctx), node.loc)
        return (not v) if isinstance(v, bool) else self._negate(v)

    def _e_If(self, node: ast.If, ctx: Ctx) -> Value:
        cond = self.truth(self.eval(node.cond, ctx), node.cond.loc)
        if isinstance(cond, bool):
            return self.eval(node.then if cond else node.other, ctx)
        then, other = self.eval(node.then, ctx), self.eval(node.other, ctx)
        if isinstance(then, tuple) and isinstance(other, tuple) and len(then) == len(other):
            # two lists of numbers (tensors(...)) of one length: entry by entry
            return Tensors((self._choose(cond, a, b, node) for a, b in zip(then, other)), merged_names(then, other))
        return self._choose(cond, then, other, node)

    def _choose(self, cond: Value, then: Value, other: Value, node: ast.If) -> Value:
        then = self.as_expr(then, node.then.loc)
        other = self.as_expr(other, node.other.loc)
        if then == other:
            return then
        return self._piecewise(cond, then, other)

    def _e_Call(self, node: ast.Call, ctx: Ctx) -> Value:
        prog = self.program
        if node.func in AGGREGATES:
            return self._aggregate(node, ctx)
        if node.func == AFTER:
            return self._after(node, ctx)
        args = [self.eval(a, ctx) for a in node.args]
        if node.func in prog.defs:
            d = prog.defs[node.func]
            if node.func in self._calls:
                chain = " -> ".join(self._calls[self._calls.index(node.func):] + [node.func])
                raise MemformError(f"recursive function: {chain} (a def may not call itself)", node.loc)
            if len(args) != len(d.params):
                raise MemformError(f"{node.func}() takes {len(d.params)} argument(s), got {len(args)}", node.loc)
            stage = self._stage_for(node.func, True, ctx, node.loc)
            self._calls.append(node.func)
            try:
                return self.eval(d.expr, Ctx(params=tuple(zip(d.params, args)), overrides=ctx.overrides,
                                             extra=() if stage is None else ((STAGE, stage),)))
            finally:
                self._calls.pop()
        if node.func in LIST_FUNCS:
            return self._list_func(node, args)
        if node.func == TENSORS:
            return self._tensors(node, args)
        if node.func == SLOTS:
            return self._slots(node, args)
        nums = [self._operand(self.as_expr(a, node.loc), node.loc) for a in args]
        f = node.func
        if f in ("min", "max"):
            return self._extreme(f, nums, node.loc)
        x = nums[0]
        if f in ("ceil", "floor"):
            return self._round(f, x, node.loc)
        if f == "log2":
            if not self.number(x, node.loc, "the argument of log2()") > 0:
                raise MemformError(f"log2() of {self.number(x, node.loc)} for this config: "
                                   f"the argument must be positive", node.loc)
            return self._log2(x)
        return self._abs(x)

    def _tensors(self, node: ast.Call, args: list[Value]) -> Tensors:
        """``tensors(...)``: a list value of numbers; a list argument's entries are taken in its place, with
        their names (``name.inner`` under a named argument)."""
        entries: list[Any] = []
        names: dict[str, int] = {}
        for label, a in zip(node.names or (None,) * len(args), args):
            at = len(entries)
            if label is not None:
                _name_entry(names, label, at)
            if isinstance(a, tuple):
                for k, i in getattr(a, "names", {}).items():
                    _name_entry(names, f"{label}.{k}" if label is not None else k, at + i if i >= 0 else -1)
                entries.extend(a)
            else:
                entries.append(a)
        return Tensors((self._operand(self.as_expr(x, node.loc), node.loc) for x in entries), names)

    def _position(self, x: tuple, name: str, loc: Loc, end: bool) -> int:
        """The position of the entry of ``x`` named ``name`` (``end``: "end" is the one after the last)."""
        if end and name == END:
            return len(x)
        names = getattr(x, "names", {})
        at = names.get(name)
        if at is None:
            known = [k for k, i in names.items() if i >= 0]
            raise MemformError(f"no entry of this list is named '{name}'" + (did_you_mean(name, known) if known else
                               " (it names none: tensors(name: x, ...) names an entry)"), loc)
        if at < 0:
            raise MemformError(f"'{name}' names more than one entry of this list (the same name inside two of its "
                               f"unnamed list entries); name those entries, e.g. tensors(first: x, second: y)", loc)
        return at

    def _slots(self, node: ast.Call, args: list[Value]) -> Tensors:
        """``slots(list, "name", ...)``: the positions of the named entries, as a list of numbers."""
        x = args[0]
        if not isinstance(x, tuple):
            raise MemformError(f"{SLOTS}() needs a tensors(...) list as its first argument", node.args[0].loc)
        out = []
        for a, arg in zip(args[1:], node.args[1:]):
            if not isinstance(a, str):
                raise MemformError(f"{SLOTS}() takes the names of the list's entries, in quotes, after the list",
                                   arg.loc)
            out.append(self.integer(self._position(x, a, arg.loc, end=True)))
        return Tensors(out)

    def _list_func(self, node: ast.Call, args: list[Value]) -> Value:
        """``is_list(x)``, ``len(x)``, ``at(x, i)`` on the list values of ``int | list`` options."""
        x = args[0]
        if node.func == "is_list":
            return isinstance(x, tuple)
        if node.func == "has":
            if not isinstance(x, tuple) or not isinstance(args[1], str):
                raise MemformError("has(x, \"name\") needs a set or list option and a name in quotes", node.loc)
            return args[1] in x
        if not isinstance(x, tuple):
            raise MemformError(f"{node.func}() needs a list (an 'int | list' option given a list), got {x}; "
                               f"test is_list(x) first", node.loc)
        if node.func == "len":
            return self.integer(len(x))
        if isinstance(args[1], str):   # at(list, "name"): a tensors(...) list's named entry
            return x[self._position(x, args[1], node.args[1].loc, end=False)]
        index = self.number(args[1], node.loc, "the index given to at()")
        if not self.is_integer(index) or not 0 <= index < len(x):
            raise MemformError(f"at(): index {index} is outside the list of {len(x)} entries (0-based)", node.loc)
        return x[int(index)]

    def _aggregate(self, node: ast.Call, ctx: Ctx) -> Value:
        """``layers_sum/max/last(x)``: ``x`` evaluated for each layer group of the current stage."""
        stage = dict(ctx.extra).get("stage")
        if ctx.outer is not None or ctx.block is None or stage is None or int(stage) not in self.stage_layers:
            raise MemformError(f"{node.func}() needs a pipeline stage: use it in a schedule quantity the "
                               f"interpreter evaluates per stage (a 'moment', a runtime block's bytes or a cost block's seconds)", node.loc)
        slots = self.stage_layers[int(stage)]
        if node.func == "layers_last":
            slots = tuple(sorted(slots, key=lambda sl: sl.order)[-1:])
        vals = []
        for sl in slots:
            sub = Ctx(block=sl.block, mode=sl.mode,
                      extra=(("stage", stage), ("chunk", self.integer(sl.chunk)), (_ORDER, (sl.order, ctx.overrides))),
                      outer=ctx.block, overrides=merge_overrides(sl.bindings, ctx.overrides))
            vals.append((sl, self.as_expr(self.eval(node.args[0], sub), node.loc)))
        if not vals:
            return self.zero
        if node.func == "layers_sum":
            return self.total(sl.count * v for sl, v in vals)
        if node.func == "layers_last":
            return vals[0][1]
        distinct = list(dict.fromkeys(v for _, v in vals))
        if len(distinct) == 1:
            return distinct[0]
        return self._layers_max(distinct, node.loc)

    def _after(self, node: ast.Call, ctx: Ctx) -> Value:
        """``layers_after(x)`` inside a ``layers_*`` argument: ``x`` summed over the stage's layer groups
        after the one being visited, in forward order (count × x each); the stage's last group counts
        itself once (its second-to-last layer has one layer of it after it)."""
        extra = dict(ctx.extra)
        visited, stage = extra.get(_ORDER), extra.get("stage")
        if ctx.outer is None or visited is None:
            raise MemformError(f"{AFTER}() needs the layer a layers_* reduction visits", node.loc)
        order, outer_overrides = visited   # the reduction's own `where` replacements, not the visited layer's
        slots = self.stage_layers[int(stage)]
        last = max(sl.order for sl in slots)
        vals = []
        for sl in slots:
            if sl.order > order or sl.order == order == last:
                sub = Ctx(block=sl.block, mode=sl.mode, extra=(("stage", stage), ("chunk", self.integer(sl.chunk))),
                          outer=ctx.outer, overrides=merge_overrides(sl.bindings, outer_overrides))
                v = self.as_expr(self.eval(node.args[0], sub), node.loc)
                vals.append(sl.count * v if sl.order > order else v)
        return self.total(vals) if vals else self.zero

    def _e_Where(self, node: ast.Where, ctx: Ctx) -> Value:
        new = tuple((name, self.eval(e, ctx)) for name, e in node.bindings)
        overrides = merge_overrides(ctx.overrides, new)
        return self.eval(node.expr, Ctx(ctx.block, ctx.mode, ctx.params, ctx.extra, ctx.outer, overrides))


def merge_overrides(old: tuple[tuple[str, Value], ...], new: tuple[tuple[str, Value], ...]) -> tuple:
    """``old`` replacements with ``new`` ones on top (a name in both takes its ``new`` value), sorted by
    name: one key per set of replacements for the memo."""
    if not old:
        return tuple(sorted(new, key=lambda kv: kv[0]))
    names = {n for n, _ in new}
    return tuple(sorted(tuple((k, v) for k, v in old if k not in names) + tuple(new), key=lambda kv: kv[0]))


PY_CMP: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


def to_bytes(value: Any) -> int:
    """Exact rational → whole bytes, rounding up (a fraction of a byte still needs a byte); any
    backend's number (an int, a Fraction, a sympy number)."""
    if type(value) is int:
        return value
    if type(value) is Fraction:
        return -(-value.numerator // value.denominator)
    if value.is_Rational:
        return -(-int(value.p) // int(value.q))
    import sympy  # an irrational number: only the symbolic evaluator makes one
    return int(sympy.ceiling(value))


def _approx(n: Any) -> str:
    """A large rational to 3 significant digits, as sympy prints its ``evalf(3)`` (``1.16e+77``)."""
    from decimal import Context, Decimal
    return f"{Context(prec=3).divide(Decimal(n.numerator), Decimal(n.denominator)):.2e}"


def _show_bits(bits: float) -> str:
    return "inf" if math.isinf(bits) else str(int(bits))
