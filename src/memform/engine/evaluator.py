"""Formula AST → sympy, for one bound config.

Two ways to treat a condition that involves symbols (``if p > 1 ...``, ``min(p - stage, m)``):

* ``resolve=True`` (default): decide it at the config's values and keep only the branch that
  applies, recording the decision as an *assumption* (``p >= 2``). The closed form is then
  the one a paper would print for this strategy, valid wherever the assumptions hold.
* ``resolve=False``: keep ``Piecewise``/``Min``/``Max`` so the expression is valid for every
  value (what a planner evaluating many strategies needs).

Symbols not in ``keep`` are replaced by their numbers as they are read, so ``keep=set()``
gives a plain numeric evaluation with exact rationals.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import sympy

from ..errors import Loc, MemformError
from ..lang import ast
from ..lang.program import AGGREGATES, LIST_FUNCS, Program

Value = Any  # sympy.Expr | bool | str | sympy.Rel


@dataclass(frozen=True)
class LayerSlot:
    """One layer group of a stage, as the ``layers_*`` reductions of a schedule see it."""

    chunk: int
    block: str
    mode: str
    count: sympy.Expr   # layers in the group (symbolic when the split is even)
    order: int          # position in forward order (the largest is the stage's last layer)

#: Largest magnitude (in bits, about 19,700 decimal digits) a formula value may reach. No byte
#: count comes near it; a formula that does (``2 ^ (10 ^ 12)``) is a mistake and would otherwise
#: make sympy compute for hours instead of failing.
MAX_BITS = 65536
#: Deepest nesting of expressions and references the evaluator follows before giving up with a
#: clear error (well below Python's recursion limit, which would otherwise end in a traceback).
MAX_DEPTH = 150
_NUM_RE = re.compile(r"(?P<mant>[0-9]+(?:\.[0-9]+)?)(?:[eE](?P<exp>[+-]?[0-9]+))?")


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


_CMP: dict[str, Callable[[Any, Any], Any]] = {
    "==": sympy.Eq, "!=": sympy.Ne, "<": sympy.Lt, "<=": sympy.Le, ">": sympy.Gt, ">=": sympy.Ge,
}
_PY_CMP: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


@dataclass
class Evaluator:
    """Evaluates quantities of ``program`` under one set of bound values (memoized)."""

    program: Program
    symbols: dict[str, sympy.Symbol]          # symbol name -> sympy Symbol
    values: dict[sympy.Symbol, sympy.Expr]    # numeric value of every symbol
    options: dict[str, Value]                 # option name -> bool / str / sympy number
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

    def let(self, name: str, loc: Loc | None = None, overrides: tuple[tuple[str, Value], ...] = ()) -> Value:
        key = ("let", name, overrides)
        if key in self._memo:
            return self._memo[key]
        decl = self.program.lets[name]
        return self._guarded(key, name, loc or decl.loc, lambda: self.eval(decl.expr, Ctx(overrides=overrides)), decl.loc)

    def binding(self, name: str) -> Value:
        decl = self.program.bindings[name]
        if decl.keyword == "option":
            return self.options[name]
        sym = self.symbols[name]
        if self.keep is None or name in self.keep:
            return sym
        return self.values[sym]

    def number(self, value: Value, loc: Loc | None = None, what: str = "expression") -> sympy.Expr:
        """The exact numeric value of ``value`` at the config."""
        v = self.as_expr(value, loc)
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
        if isinstance(value, sympy.Expr):
            # report a too large or non-finite value at the formula that makes it, not where it is used
            self._check_size(value, label, defined or loc)
            if not value.is_Rational and _may_be_singular(value):
                self.number(value, defined or loc, label)
        self._memo[key] = value
        return value

    def _check_size(self, value: sympy.Expr, what: str, loc: Loc | None) -> None:
        bits = _bits(value, self.values, self._bits_memo)
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

    def as_expr(self, v: Value, loc: Loc | None) -> sympy.Expr:
        """``v`` as a number-valued expression (true/false count as 1/0); strings and conditions are errors."""
        if isinstance(v, bool):
            return sympy.Integer(int(v))
        if isinstance(v, str):
            raise MemformError(f"the string '{v}' cannot be used as a number", loc)
        if isinstance(v, tuple):
            raise MemformError("a list cannot be used as a number here; take one entry with at(list, i) "
                               "(or test is_list(x) first)", loc)
        if isinstance(v, sympy.logic.boolalg.Boolean) and not isinstance(v, sympy.Expr):
            raise MemformError("a condition cannot be used as a number here", loc)
        return v

    def truth(self, v: Value, loc: Loc) -> Value:
        """A Python bool, or (resolve=False) a sympy condition."""
        if isinstance(v, bool):
            return v
        if v is sympy.true or v is sympy.false:
            return bool(v)
        if isinstance(v, str):
            raise MemformError(f"the string '{v}' is not a condition; compare it, e.g. x == \"{v}\"", loc)
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

    def assume(self, cond: Any) -> None:
        """Record a decision taken at the config's values (shown as "valid where: ...")."""
        if isinstance(cond, sympy.Eq):  # sympy prints these as Eq(a, b); papers write a = b
            text = f"{cond.lhs} = {cond.rhs}"
        elif isinstance(cond, sympy.Ne):
            text = f"{cond.lhs} != {cond.rhs}"
        else:
            text = str(cond)
        if text not in self.assumptions:
            self.assumptions.append(text)

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
        return sympy.Rational(node.text)

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
            return self.let(node.name, node.loc, ov)
        if node.name in prog.bindings:
            for k, v in ov:  # a `where` replacement
                if k == node.name:
                    return v
            return self.binding(node.name)
        raise MemformError(f"unknown symbol '{node.name}'", node.loc)

    def _e_BinOp(self, node: ast.BinOp, ctx: Ctx) -> Value:
        a = self._finite(self.as_expr(self.eval(node.left, ctx), node.loc), node.loc)
        b = self._finite(self.as_expr(self.eval(node.right, ctx), node.loc), node.loc)
        op = node.op
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op in ("/", "%") and b.is_number and b == 0:
            raise MemformError("division by zero", node.loc)
        if op == "/":
            return a / b
        if op == "%":
            return sympy.Mod(a, b)
        self._check_power(a, b, node.loc)
        return a ** b

    def _finite(self, v: sympy.Expr, loc: Loc) -> sympy.Expr:
        """``v``, after checking that a number that is not plainly rational is finite and real."""
        if v.is_number and not v.is_Rational:
            return self.number(v, loc, "operand")
        return v

    def _check_power(self, a: sympy.Expr, b: sympy.Expr, loc: Loc) -> None:
        """Refuse ``a ^ b`` before sympy spends hours computing a number nobody needs."""
        if a.is_number and a.is_Rational and abs(a) in (0, 1):
            return
        b_bits = _bits(b, self.values, self._bits_memo)
        if b_bits <= 64:
            try:
                exponent = abs(float(self.number(b, loc, "exponent")))
            except MemformError:
                return  # a non-finite exponent is reported where the value is used
            total = _bits(a, self.values, self._bits_memo) * max(exponent, 1.0)
        else:
            total = math.inf
        if total <= MAX_BITS and not (b.is_number and b.is_integer):
            base = self.number(a, loc, "the base of this power")
            if base < 0 and not self.number(b, loc, "the exponent").is_integer:
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
            return _PY_CMP[node.op](a, b)
        a, b = (self.as_expr(x, node.loc) for x in (a, b))
        for x in (a, b):  # sympy decides zoo == 3 as False: a silently wrong branch
            if x.is_number:
                self.number(x, node.loc, "a side of this comparison")
        rel = _CMP[node.op](a, b)
        if rel is sympy.true or rel is sympy.false:
            return bool(rel)
        return self.truth(rel, node.loc)

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
        return sympy.And(*parts) if is_and else sympy.Or(*parts)

    def _e_Not(self, node: ast.Not, ctx: Ctx) -> Value:
        v = self.truth(self.eval(node.operand, ctx), node.loc)
        return (not v) if isinstance(v, bool) else sympy.Not(v)

    def _e_If(self, node: ast.If, ctx: Ctx) -> Value:
        cond = self.truth(self.eval(node.cond, ctx), node.cond.loc)
        if isinstance(cond, bool):
            return self.eval(node.then if cond else node.other, ctx)
        then = self.as_expr(self.eval(node.then, ctx), node.then.loc)
        other = self.as_expr(self.eval(node.other, ctx), node.other.loc)
        if then == other:
            return then
        return sympy.Piecewise((then, _without_piecewise(cond)), (other, True), evaluate=False)

    def _e_Call(self, node: ast.Call, ctx: Ctx) -> Value:
        prog = self.program
        if node.func in AGGREGATES:
            return self._aggregate(node, ctx)
        args = [self.eval(a, ctx) for a in node.args]
        if node.func in prog.defs:
            d = prog.defs[node.func]
            if node.func in self._calls:
                chain = " -> ".join(self._calls[self._calls.index(node.func):] + [node.func])
                raise MemformError(f"recursive function: {chain} (a def may not call itself)", node.loc)
            if len(args) != len(d.params):
                raise MemformError(f"{node.func}() takes {len(d.params)} argument(s), got {len(args)}", node.loc)
            self._calls.append(node.func)
            try:
                return self.eval(d.expr, Ctx(params=tuple(zip(d.params, args)), overrides=ctx.overrides))
            finally:
                self._calls.pop()
        if node.func in LIST_FUNCS:
            return self._list_func(node, args)
        nums = [self._finite(self.as_expr(a, node.loc), node.loc) for a in args]
        f = node.func
        if f in ("min", "max"):
            cls = sympy.Min if f == "min" else sympy.Max
            if not self.resolve:
                return lattice(cls, nums)
            res = cls(*nums)
            if isinstance(res, (sympy.Min, sympy.Max)):
                vals = [self.number(a, node.loc, f"an argument of {f}()") for a in res.args]
                pick = vals.index(min(vals) if f == "min" else max(vals))
                chosen = res.args[pick]
                for i, other in enumerate(res.args):
                    if i != pick:
                        self.assume(sympy.Le(chosen, other) if f == "min" else sympy.Ge(chosen, other))
                return chosen
            return res
        x = nums[0]
        if f in ("ceil", "floor"):
            res = (sympy.ceiling if f == "ceil" else sympy.floor)(x)
            if self.resolve and isinstance(res, (sympy.ceiling, sympy.floor)):
                if self.number(x, node.loc, f"the argument of {f}()").is_integer:
                    self.assume(f"{x} is an integer")
                    return x
            return res
        if f == "log2":
            if not self.number(x, node.loc, "the argument of log2()") > 0:
                raise MemformError(f"log2() of {self.number(x, node.loc)} for this config: "
                                   f"the argument must be positive", node.loc)
            return sympy.log(x, 2)
        return sympy.Abs(x)

    def _list_func(self, node: ast.Call, args: list[Value]) -> Value:
        """``is_list(x)``, ``len(x)``, ``at(x, i)`` on the list values of ``int | list`` options."""
        x = args[0]
        if node.func == "is_list":
            return isinstance(x, tuple)
        if node.func == "has":
            if not isinstance(x, tuple) or not isinstance(args[1], str):
                raise MemformError("has(x, \"name\") needs a set option and a name in quotes", node.loc)
            return args[1] in x
        if not isinstance(x, tuple):
            raise MemformError(f"{node.func}() needs a list (an 'int | list' option given a list), got {x}; "
                               f"test is_list(x) first", node.loc)
        if node.func == "len":
            return sympy.Integer(len(x))
        index = self.number(args[1], node.loc, "the index given to at()")
        if not index.is_integer or not 0 <= index < len(x):
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
            sub = Ctx(block=sl.block, mode=sl.mode, extra=(("stage", stage), ("chunk", sympy.Integer(sl.chunk))),
                      outer=ctx.block, overrides=ctx.overrides)
            vals.append((sl, self.as_expr(self.eval(node.args[0], sub), node.loc)))
        if not vals:
            return sympy.Integer(0)
        if node.func == "layers_sum":
            return sympy.Add(*(sl.count * v for sl, v in vals))
        if node.func == "layers_last":
            return vals[0][1]
        distinct = list(dict.fromkeys(v for _, v in vals))
        if len(distinct) == 1:
            return distinct[0]
        if not self.resolve:
            return lattice(sympy.Max, distinct)
        res = sympy.Max(*distinct)
        if self.resolve and isinstance(res, sympy.Max):
            nums = [self.number(a, node.loc, "an argument of layers_max()") for a in res.args]
            chosen = res.args[nums.index(max(nums))]
            for other in res.args:
                if other is not chosen:
                    self.assume(sympy.Ge(chosen, other))
            return chosen
        return res

    def _e_Where(self, node: ast.Where, ctx: Ctx) -> Value:
        new = tuple((name, self.eval(e, ctx)) for name, e in node.bindings)
        names = {n for n, _ in new}
        kept = tuple((k, v) for k, v in ctx.overrides if k not in names)
        overrides = tuple(sorted(kept + new, key=lambda kv: kv[0]))
        return self.eval(node.expr, Ctx(ctx.block, ctx.mode, ctx.params, ctx.extra, ctx.outer, overrides))


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


def _show_bits(bits: float) -> str:
    return "inf" if math.isinf(bits) else str(int(bits))


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
