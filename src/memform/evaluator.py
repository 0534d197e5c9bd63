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

from dataclasses import dataclass, field
from typing import Any, Callable

import sympy

from . import ast
from .errors import Loc, MemformError
from .program import Program

Value = Any  # sympy.Expr | bool | str | sympy.Rel


@dataclass(frozen=True)
class Ctx:
    block: str | None = None
    mode: str | None = None
    params: tuple[tuple[str, Value], ...] = ()
    extra: tuple[tuple[str, Value], ...] = ()  # schedule names: stage, chunk

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
    _memo: dict[tuple, Value] = field(default_factory=dict)
    _active: list[tuple[tuple, Loc]] = field(default_factory=list)

    # ---------------------------------------------------------------- public
    def quantity(self, block: str, qname: str, mode: str | None = None, loc: Loc | None = None,
                 extra: tuple[tuple[str, Value], ...] = ()) -> Value:
        key = ("q", block, qname, mode, extra)
        if key in self._memo:
            return self._memo[key]
        q = self.program.pick(block, qname, mode)
        if q is None:
            if self.program.find_quantity(block, qname) is not None:
                raise MemformError(f"'{block}.{qname}' has variants; name one, e.g. {block}.{qname}[none]", loc)
            raise MemformError(f"block '{block}' has no quantity '{qname}'", loc)
        label = f"{block}.{qname}" + (f"[{mode}]" if mode and self.program.has_variants(block, qname) else "")
        value = self._guarded(key, label, q.loc if loc is None else loc,
                              lambda: self.eval(q.expr, Ctx(block=block, mode=mode, extra=extra)))
        return value

    def let(self, name: str, loc: Loc | None = None) -> Value:
        key = ("let", name)
        if key in self._memo:
            return self._memo[key]
        decl = self.program.lets[name]
        return self._guarded(key, name, loc or decl.loc, lambda: self.eval(decl.expr, Ctx()))

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
        v = self._as_expr(value, loc)
        n = v.xreplace(self.values) if v.free_symbols else v
        if not n.is_number:
            raise MemformError(f"{what} does not reduce to a number: {n}", loc)
        if not n.is_Rational:  # e.g. log(8)/log(2): let sympy find the exact value when there is one
            n = sympy.nsimplify(sympy.simplify(n), rational=False)
        return n

    # ---------------------------------------------------------------- internals
    def _guarded(self, key: tuple, label: str, loc: Loc, compute: Callable[[], Value]) -> Value:
        for active, _ in self._active:
            if active == key:
                names = [self._label(k) for k, _ in self._active[self._index(key):]] + [label]
                raise MemformError("cyclic definition: " + " -> ".join(names), loc)
        self._active.append((key, loc))
        try:
            value = compute()
        finally:
            self._active.pop()
        self._memo[key] = value
        return value

    def _index(self, key: tuple) -> int:
        return [k for k, _ in self._active].index(key)

    @staticmethod
    def _label(key: tuple) -> str:
        if key[0] == "let":
            return key[1]
        return f"{key[1]}.{key[2]}" + (f"[{key[3]}]" if key[3] else "")

    def _as_expr(self, v: Value, loc: Loc | None) -> sympy.Expr:
        if isinstance(v, bool):
            return sympy.Integer(int(v))
        if isinstance(v, str):
            raise MemformError(f"the string '{v}' cannot be used as a number", loc)
        if isinstance(v, sympy.logic.boolalg.Boolean) and not isinstance(v, sympy.Expr):
            raise MemformError("a condition cannot be used as a number here", loc)
        return v

    def _truth(self, v: Value, loc: Loc) -> Value:
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
            decided = bool(v.xreplace(self.values))
            self._assume(v if decided else sympy.Not(v))
            return decided
        return v

    def _assume(self, cond: Any) -> None:
        text = str(cond)
        if text not in self.assumptions:
            self.assumptions.append(text)

    def eval(self, node: ast.Expr, ctx: Ctx) -> Value:
        method = getattr(self, "_e_" + type(node).__name__)
        return method(node, ctx)

    def _e_Num(self, node: ast.Num, ctx: Ctx) -> Value:
        return sympy.Rational(node.text)

    def _e_Str(self, node: ast.Str, ctx: Ctx) -> Value:
        return node.value

    def _e_Bool(self, node: ast.Bool, ctx: Ctx) -> Value:
        return node.value

    def _e_Ref(self, node: ast.Ref, ctx: Ctx) -> Value:
        prog = self.program
        if node.attr is not None:
            return self.quantity(node.name, node.attr, node.variant or ctx.mode, node.loc)
        local = ctx.local(node.name)
        if local is not None:
            return local
        if ctx.block is not None and prog.find_quantity(ctx.block, node.name) is not None:
            return self.quantity(ctx.block, node.name, node.variant or ctx.mode, node.loc, ctx.extra)
        for k, v in ctx.extra:
            if k == node.name:
                return v
        if node.name in prog.lets:
            return self.let(node.name, node.loc)
        if node.name in prog.bindings:
            return self.binding(node.name)
        raise MemformError(f"unknown symbol '{node.name}'", node.loc)

    def _e_BinOp(self, node: ast.BinOp, ctx: Ctx) -> Value:
        a = self._as_expr(self.eval(node.left, ctx), node.loc)
        b = self._as_expr(self.eval(node.right, ctx), node.loc)
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
        return a ** b

    def _e_Neg(self, node: ast.Neg, ctx: Ctx) -> Value:
        return -self._as_expr(self.eval(node.operand, ctx), node.loc)

    def _e_Cmp(self, node: ast.Cmp, ctx: Ctx) -> Value:
        a = self.eval(node.left, ctx)
        b = self.eval(node.right, ctx)
        if isinstance(a, str) or isinstance(b, str):
            if not (isinstance(a, str) and isinstance(b, str)):
                raise MemformError("a string can only be compared with a string", node.loc)
            if node.op not in ("==", "!="):
                raise MemformError("strings can only be compared with == or !=", node.loc)
            return _PY_CMP[node.op](a, b)
        rel = _CMP[node.op](self._as_expr(a, node.loc), self._as_expr(b, node.loc))
        if rel is sympy.true or rel is sympy.false:
            return bool(rel)
        return self._truth(rel, node.loc)

    def _e_Logic(self, node: ast.Logic, ctx: Ctx) -> Value:
        is_and = node.op == "and"
        parts = []
        for operand in node.operands:
            v = self._truth(self.eval(operand, ctx), operand.loc)
            if isinstance(v, bool):
                if v != is_and:  # short-circuit: false in 'and', true in 'or'
                    return v
                continue
            parts.append(v)
        if not parts:
            return is_and
        return sympy.And(*parts) if is_and else sympy.Or(*parts)

    def _e_Not(self, node: ast.Not, ctx: Ctx) -> Value:
        v = self._truth(self.eval(node.operand, ctx), node.loc)
        return (not v) if isinstance(v, bool) else sympy.Not(v)

    def _e_If(self, node: ast.If, ctx: Ctx) -> Value:
        cond = self._truth(self.eval(node.cond, ctx), node.cond.loc)
        if isinstance(cond, bool):
            return self.eval(node.then if cond else node.other, ctx)
        then = self._as_expr(self.eval(node.then, ctx), node.then.loc)
        other = self._as_expr(self.eval(node.other, ctx), node.other.loc)
        return sympy.Piecewise((then, cond), (other, True))

    def _e_Call(self, node: ast.Call, ctx: Ctx) -> Value:
        prog = self.program
        args = [self.eval(a, ctx) for a in node.args]
        if node.func in prog.defs:
            d = prog.defs[node.func]
            return self.eval(d.expr, Ctx(params=tuple(zip(d.params, args))))
        nums = [self._as_expr(a, node.loc) for a in args]
        f = node.func
        if f in ("min", "max"):
            res = (sympy.Min if f == "min" else sympy.Max)(*nums)
            if self.resolve and isinstance(res, (sympy.Min, sympy.Max)):
                vals = [self.number(a, node.loc) for a in res.args]
                pick = vals.index(min(vals) if f == "min" else max(vals))
                chosen = res.args[pick]
                for i, other in enumerate(res.args):
                    if i != pick:
                        self._assume(sympy.Le(chosen, other) if f == "min" else sympy.Ge(chosen, other))
                return chosen
            return res
        x = nums[0]
        if f in ("ceil", "floor"):
            res = (sympy.ceiling if f == "ceil" else sympy.floor)(x)
            if self.resolve and isinstance(res, (sympy.ceiling, sympy.floor)):
                if self.number(x, node.loc).is_integer:
                    self._assume(f"{x} is an integer")
                    return x
            return res
        if f == "log2":
            return sympy.log(x, 2)
        return sympy.Abs(x)
