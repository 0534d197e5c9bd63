"""Static checks of a :class:`~memform.program.Program`: the formula author's lint.

Run before any config is bound, so ``memform check FILE.mf`` finds unknown names, wrong
arities, missing recompute variants and cyclic definitions without a model at hand.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Iterator

from ..errors import MemformError, did_you_mean
from . import ast
from .printer import print_expr
from .program import (
    AFTER,
    AGGREGATES,
    BUILTIN_FUNCS,
    LAYER_NAMES,
    LAYER_QUANTITIES,
    RECOMPUTE_MODES,
    COST_NAMES,
    COST_QUANTITIES,
    END,
    RUNTIME_NAMES,
    RUNTIME_QUANTITIES,
    SCHEDULE_TIME_QUANTITIES,
    SCHEDULE_NAMES,
    SCHEDULE_QUANTITIES,
    SLOTS,
    STACK_NAMES,
    STAGE,
    SUPER,
    TENSORS,
    Program,
)

walk = ast.walk  # the engine imports it from here

#: where ``stage`` is bound: a let or def that reads it may be used there (and in other lets and defs)
_STAGED = ("schedule", "runtime", "cost", "let", "def")
_WHERE_TEXT = {"block": "a layer block", "comm": "a comm block", "default": "a binding's default",
               "require": "a require", "stack": "the stack"}


def walk_scoped(node: ast.Expr, in_layers: bool = False) -> Iterator[tuple[ast.Expr, bool]]:
    """Like :func:`walk`, also saying whether the node lies inside a ``layers_*`` argument."""
    yield node, in_layers
    if isinstance(node, ast.Call):
        inner = in_layers or node.func in AGGREGATES
        for a in node.args:
            yield from walk_scoped(a, inner)
        return
    if isinstance(node, ast.Where):
        children = [node.expr] + [e for _, e in node.bindings]
    elif isinstance(node, (ast.BinOp, ast.Cmp)):
        children = [node.left, node.right]
    elif isinstance(node, (ast.Neg, ast.Not)):
        children = [node.operand]
    elif isinstance(node, ast.Logic):
        children = list(node.operands)
    elif isinstance(node, ast.If):
        children = [node.cond, node.then, node.other]
    else:
        children = []
    for c in children:
        yield from walk_scoped(c, in_layers)


def literal_value(node: ast.Expr):
    """The value of an expression built only from number literals (``0``, ``2 - 2``, ``-(0 * 3)``),
    as an exact Fraction (no sympy: a cold estimate lints without it); None when it names anything else."""
    if isinstance(node, ast.Num):
        mantissa, _, exponent = node.text.lower().partition("e")
        try:
            if exponent and abs(int(exponent)) > 4000:  # the evaluator refuses it; only its zeroness matters here
                return Fraction(0) if Fraction(mantissa) == 0 else None
            return Fraction(node.text)
        except (TypeError, ValueError, ZeroDivisionError):
            return None
    if isinstance(node, ast.Neg):
        v = literal_value(node.operand)
        return None if v is None else -v
    if isinstance(node, ast.BinOp) and node.op in ("+", "-", "*"):
        a, b = literal_value(node.left), literal_value(node.right)
        if a is None or b is None:
            return None
        return a + b if node.op == "+" else a - b if node.op == "-" else a * b
    return None


# A dependency node: ("global", name) or ("q", block, quantity, mode)
Node = tuple


class _Checker:
    def __init__(self, prog: Program):
        self.prog = prog
        # for :meth:`deps` (called once per dependency node; the program does not change meanwhile)
        self._scans: dict[int, tuple[ast.Expr, list[ast.Expr]]] = {}
        self._names: dict[str, set[str]] = {}
        self._globals: set[str] | None = None

    def _scan(self, expr: ast.Expr) -> list[ast.Expr]:
        """The references and calls of defs in ``expr``, in :func:`walk` order (each formula, and each def
        that many formulas call, is walked once per check)."""
        hit = self._scans.get(id(expr))
        if hit is None or hit[0] is not expr:
            defs = self.prog.defs
            hit = self._scans[id(expr)] = (expr, [s for s in walk(expr) if isinstance(s, ast.Ref)
                                                  or (isinstance(s, ast.Call) and s.func in defs)])
        return hit[1]

    def run(self) -> None:
        prog = self.prog
        for name in prog.blocks:
            prog.chain(name)  # unknown / cyclic extends
        for b in prog.bindings.values():
            if b.keyword == "symbol" and b.type.kind not in ("int", "real"):
                raise MemformError(f"symbol '{b.name}' must be int or real; use 'option' for {b.type.kind}", b.loc)
            if b.default is not None:
                self.refs(b.default, block=None, params=(), where="default")
        for let in prog.lets.values():
            self.refs(let.expr, block=None, params=(), where="let")
        for d in prog.defs.values():
            self.refs(d.expr, block=None, params=d.params, where="def")
        for r in prog.requires:
            self.refs(r.expr, block=None, params=(), where="require")
        for bname, b in prog.blocks.items():
            for qd in b.quantities.values():
                for q in qd.all():
                    self.refs(q.expr, block=bname, params=(), where=b.kind)
        self.stack()
        self.reduced_quantities()
        for name, b in prog.schedules().items():
            self.require_quantities(name, SCHEDULE_QUANTITIES)
        for name in prog.comms():
            self.require_quantities(name, ("bytes",))
        for name in prog.runtimes():
            self.require_quantities(name, RUNTIME_QUANTITIES)
        for name in prog.costs():
            self.require_quantities(name, COST_QUANTITIES)
        if prog.costs():  # cost blocks read the schedule's bubble and overlap
            for name in prog.schedules():
                self.require_quantities(name, SCHEDULE_TIME_QUANTITIES)
        self.recursive_defs()
        self.cycles()

    # ---------------------------------------------------------------- names
    def refs(self, expr: ast.Expr, *, block: str | None, params: tuple[str, ...], where: str) -> None:
        prog = self.prog
        for node, in_layers in walk_scoped(expr):
            if isinstance(node, ast.Ref):
                if in_layers and node.attr is None and node.name not in params and (
                        node.name in LAYER_NAMES or node.name in self.layer_quantity_names()):
                    continue
                self.ref(node, block, params, where)
            elif isinstance(node, ast.Where):
                for name, _ in node.bindings:
                    if name not in prog.bindings:
                        raise MemformError(f"'where' can only give a config-bound symbol or option another value; "
                                           f"'{name}' is not one{did_you_mean(name, prog.bindings)}", node.loc)
            elif isinstance(node, ast.BinOp) and node.op in ("/", "%") and literal_value(node.right) == 0:
                what = "division" if node.op == "/" else "remainder"
                shown = ("a literal zero" if isinstance(node.right, ast.Num)
                         else f"zero ('{print_expr(node.right)}' is 0)")
                raise MemformError(f"{what} by {shown}", node.right.loc)
            elif isinstance(node, ast.Call) and node.func == AFTER:
                if not in_layers or where not in ("schedule", "runtime", "cost"):
                    raise MemformError(f"{AFTER}() sums over the layers after the one a layers_* reduction visits: "
                                       f"use it inside the argument of layers_sum/max/last (in a schedule, runtime "
                                       f"or cost block)", node.loc)
                if any(isinstance(n, ast.Call) and n.func in AGGREGATES + (AFTER,) for a in node.args for n in walk(a)):
                    raise MemformError(f"{AFTER}() cannot hold another layers_* reduction", node.loc)
                if len(node.args) != 1:
                    raise MemformError(f"{AFTER}() takes 1 argument, got {len(node.args)}", node.loc)
            elif isinstance(node, ast.Call) and node.func in AGGREGATES:
                if where not in ("schedule", "runtime", "cost"):
                    raise MemformError(f"{node.func}() reduces over the layers of a pipeline stage and can only be "
                                       f"used in schedule blocks (and in runtime and cost blocks)", node.loc)
                if in_layers:
                    raise MemformError(f"{node.func}() cannot be nested inside another layers_* reduction", node.loc)
                if len(node.args) != 1:
                    raise MemformError(f"{node.func}() takes 1 argument, got {len(node.args)}", node.loc)
            elif isinstance(node, ast.Call):
                self._check_names(node)
                if where not in _STAGED and node.func in prog.stage_readers()[1]:
                    self._unstaged(f"{node.func}()", where, node.loc)
                arity = BUILTIN_FUNCS.get(node.func, -1)
                if node.func in prog.defs:
                    arity = len(prog.defs[node.func].params)
                if arity == -1:
                    names = list(BUILTIN_FUNCS) + list(prog.defs)
                    raise MemformError(f"unknown function '{node.func}'{did_you_mean(node.func, names)}", node.loc)
                if arity is None and len(node.args) < 2:
                    raise MemformError(f"{node.func}() takes at least 2 arguments", node.loc)
                if arity is not None and len(node.args) != arity:
                    raise MemformError(f"{node.func}() takes {arity} argument{'s' * (arity != 1)}, "
                                       f"got {len(node.args)}", node.loc)
                if node.func == "has":
                    self._check_has(node)
                if node.func == SLOTS:
                    for a in node.args[1:]:
                        if not isinstance(a, ast.Str):
                            raise MemformError(f"{SLOTS}() takes the names of the list's entries, in quotes, after "
                                               f"the list: {SLOTS}(act_tensor, \"attn.q\", \"{END}\")", a.loc)
                    # (which names a list holds is known once a config picks the files: a later file may
                    # redefine the list, so an unknown name is reported where the list is read)

    def _unstaged(self, what: str, where: str, loc) -> None:
        raise MemformError(f"{what} reads the pipeline stage ('{STAGE}'), which is bound only in schedule, runtime "
                           f"and cost blocks (and in the lets and defs they use), not in {_WHERE_TEXT.get(where, where)}",
                           loc)

    def _check_names(self, node: ast.Call) -> None:
        """``tensors(q: x, ...)``: only tensors() names its entries, each name once and never ``end``."""
        if node.names is None:
            return
        if node.func != TENSORS:
            raise MemformError(f"only {TENSORS}(...) names its entries ('q: x'); {node.func}() takes plain "
                               f"arguments", node.loc)
        seen: set[str] = set()
        for name, a in zip(node.names, node.args):
            if name == END:
                raise MemformError(f"'{END}' cannot name an entry: {SLOTS}() reads it as the position after the "
                                   f"list's last entry", a.loc)
            if name in seen:
                raise MemformError(f"'{name}' names two entries of this {TENSORS}(...)", a.loc)
            if name is not None:
                seen.add(name)

    def _check_has(self, node: ast.Call) -> None:
        """``has(x, "name")``: x a ``set`` or ``list`` option, the name one of its choices (a typo would read
        false): whether the set holds the name, or the list holds it at least once."""
        x, name = node.args
        decl = self.prog.bindings.get(x.name) if isinstance(x, ast.Ref) and x.attr is None else None
        if decl is None or decl.type.kind not in ("set", "names"):
            raise MemformError("has() takes a set or list option as its first argument (option x : set {...} or "
                               "list {...})", x.loc)
        if not isinstance(name, ast.Str):
            raise MemformError("has() takes a name in quotes as its second argument", name.loc)
        if name.value not in decl.type.choices:
            raise MemformError(f"'{name.value}' is not a member of {decl.type.kind.replace('names', 'list')} option '{x.name}' "
                               f"({decl.type.describe()}){did_you_mean(name.value, decl.type.choices)}", name.loc)

    def layer_quantity_names(self) -> set[str]:
        """Every quantity a layer block defines: the names a ``layers_*`` argument may use."""
        if not hasattr(self, "_layer_names"):
            self._layer_names = {q for n, b in self.prog.blocks.items() if b.kind == "block"
                                 for q in self.prog.quantity_names(n)}
        return self._layer_names

    def ref(self, node: ast.Ref, block: str | None, params: tuple[str, ...], where: str) -> None:
        prog = self.prog
        if node.attr is not None:
            if node.name not in prog.blocks:
                raise MemformError(f"unknown block '{node.name}'{did_you_mean(node.name, prog.blocks)}", node.loc)
            names = prog.quantity_names(node.name)
            if node.attr not in names:
                raise MemformError(f"block '{node.name}' has no quantity '{node.attr}'"
                                   f"{did_you_mean(node.attr, names)}", node.loc)
            return
        if node.name in params:
            return
        if node.name == STAGE and where in ("let", "def"):
            return   # the stage of the schedule, runtime or cost block that uses the let or def
        visible = set(params) | prog.global_names()
        if block is not None:
            own = prog.quantity_names(block)
            if node.name in own:
                return
            visible |= own
            if prog.blocks[block].kind == "schedule":
                if node.name in SCHEDULE_NAMES:
                    return
                visible |= set(SCHEDULE_NAMES)
            if prog.blocks[block].kind == "runtime":
                if node.name in RUNTIME_NAMES:
                    return
                visible |= set(RUNTIME_NAMES)
            if prog.blocks[block].kind == "cost":
                if node.name in COST_NAMES:
                    return
                visible |= set(COST_NAMES)
        if node.name in prog.global_names():
            if node.variant is not None:
                raise MemformError(f"'{node.name}' is not a block quantity and has no variants", node.loc)
            if where not in _STAGED and node.name in prog.stage_readers()[0]:
                self._unstaged(f"'{node.name}'", where, node.loc)
            return
        if node.name in prog.blocks:
            qs = ", ".join(sorted(prog.quantity_names(node.name)))
            raise MemformError(f"'{node.name}' is a {prog.blocks[node.name].kind}; name one of its quantities "
                               f"({node.name}.{qs.split(', ')[0]} ...): {qs}", node.loc)
        if node.name == SUPER:
            raise MemformError("'super' (the definition a quantity replaces) can only be used in a block "
                               "quantity that redefines one", node.loc)
        if node.name in SCHEDULE_NAMES:
            raise MemformError(f"'{node.name}' is only defined inside schedule (and runtime and cost) blocks", node.loc)
        if node.name in RUNTIME_NAMES:
            raise MemformError(f"'{node.name}' is only defined inside runtime blocks", node.loc)
        if node.name in COST_NAMES:
            raise MemformError(f"'{node.name}' is only defined inside cost blocks", node.loc)
        raise MemformError(f"unknown symbol '{node.name}'{did_you_mean(node.name, visible)}", node.loc)

    # ---------------------------------------------------------------- structure
    def require_quantities(self, block: str, needed: tuple[str, ...]) -> None:
        prog = self.prog
        have = prog.quantity_names(block)
        missing = [q for q in needed if q not in have]
        b = prog.blocks[block]
        if missing:
            raise MemformError(f"{b.kind} '{block}' must define {', '.join(missing)} "
                               f"(directly or through 'extends')", b.loc)
        for q in needed:
            for mode in RECOMPUTE_MODES:
                if prog.pick(block, q, mode) is None:
                    raise MemformError(f"{b.kind} '{block}': quantity '{q}' has no formula for recompute mode "
                                       f"'{mode}' (add {q}[{mode}] = ... or a default {q} = ...)", b.loc)

    def stack(self) -> None:
        prog = self.prog
        if prog.stack is None:
            return
        seen_body = False
        for e in prog.stack.entries:
            if e.block not in prog.blocks or prog.blocks[e.block].kind != "block":
                layer_blocks = [n for n, b in prog.blocks.items() if b.kind == "block"]
                raise MemformError(f"stack names unknown block '{e.block}'{did_you_mean(e.block, layer_blocks)}",
                                   e.loc)
            if e.count is not None:
                self.refs(e.count, block=None, params=(), where="stack")
            # `layer_index` is bound per layer while a choice or a binding is evaluated
            for cond in ([e.cond] if e.cond is not None else []) + [c for c, _ in e.branches]:
                self.refs(cond, block=None, params=STACK_NAMES, where="stack")
            for name, value in e.bindings:
                decl = prog.bindings.get(name)
                if decl is None:
                    raise MemformError(f"stack entry '{e.block}': 'where {name} = ...' must name a symbol or an "
                                       f"option (a config-bound name){did_you_mean(name, list(prog.bindings))}",
                                       value.loc)
                self.refs(value, block=None, params=STACK_NAMES, where="stack")
            if len({n for n, _ in e.bindings}) < len(e.bindings):
                raise MemformError(f"stack entry '{e.block}' binds a name twice in its 'where'", e.loc)
            for other in e.blocks()[1:]:
                if other not in prog.blocks or prog.blocks[other].kind != "block":
                    layer_blocks = [n for n, b in prog.blocks.items() if b.kind == "block"]
                    raise MemformError(f"stack names unknown block '{other}'"
                                       f"{did_you_mean(other, layer_blocks)}", e.loc)
                self.require_quantities(other, LAYER_QUANTITIES)
            if e.place is None:
                seen_body = True
            self.require_quantities(e.block, LAYER_QUANTITIES)
        if not seen_body:
            raise MemformError("stack has no body entries to split over pipeline stages", prog.stack.loc)

    def reduced_quantities(self) -> None:
        """Every layer quantity a ``layers_*`` reduction reads (in a schedule, runtime or cost block) is
        defined, for every recompute mode, by every block of the stack: the reduction visits them all."""
        prog = self.prog
        if prog.stack is None:
            return
        stack_blocks = list(dict.fromkeys(b for e in prog.stack.entries for b in e.blocks()))
        bound = set(prog.global_names()) | set(LAYER_NAMES) | set(SCHEDULE_NAMES) | set(RUNTIME_NAMES) | set(COST_NAMES)
        needed: dict[str, None] = {}
        for bname, b in prog.blocks.items():
            if b.kind not in ("schedule", "runtime", "cost"):
                continue
            own = prog.quantity_names(bname)
            for qd in b.quantities.values():
                for q in qd.all():
                    for node, in_layers in walk_scoped(q.expr):
                        if (in_layers and isinstance(node, ast.Ref) and node.attr is None
                                and node.name not in bound and node.name not in own):
                            needed.setdefault(node.name)
        if needed:
            for block in stack_blocks:
                if block in prog.blocks:
                    self.require_quantities(block, tuple(needed))

    # ---------------------------------------------------------------- cycles
    def deps(self, node: Node) -> list[tuple[Node, ast.Ref]]:
        """What ``node``'s formula refers to, as dependency nodes (late binding for 'self')."""
        prog = self.prog
        out: list[tuple[Node, ast.Ref]] = []
        if node[0] == "global":
            decl = prog.lets.get(node[1]) or prog.bindings.get(node[1])
            expr = decl.expr if isinstance(decl, ast.Let) else getattr(decl, "default", None)
            exprs = [(expr, None, None, ())] if expr is not None else []
        else:
            _, block, qname, mode = node
            q = prog.pick(block, qname, mode)
            exprs = [(q.expr, block, mode, ())] if q is not None else []
        todo = list(exprs)
        seen_defs: set[str] = set()
        if self._globals is None:
            self._globals = prog.global_names()
        global_names = self._globals
        while todo:
            expr, block, mode, params = todo.pop()
            names = None
            if block is not None:
                names = self._names.get(block)
                if names is None:
                    names = self._names[block] = prog.quantity_names(block)
            for sub in self._scan(expr):
                if not isinstance(sub, ast.Ref):   # a call of a def
                    if sub.func not in seen_defs:
                        seen_defs.add(sub.func)
                        d = prog.defs[sub.func]
                        todo.append((d.expr, None, None, d.params))
                    continue
                if sub.attr is not None:
                    out.append((("q", sub.name, sub.attr, sub.variant or mode), sub))
                elif sub.name in params:
                    continue
                elif names is not None and sub.name in names:
                    out.append((("q", block, sub.name, sub.variant or mode), sub))
                elif sub.name in global_names:
                    out.append((("global", sub.name), sub))
        return out

    def recursive_defs(self) -> None:
        """A ``def`` that calls itself, directly or through other defs, would never finish."""
        prog = self.prog
        calls = {name: [c for c in walk(d.expr) if isinstance(c, ast.Call) and c.func in prog.defs]
                 for name, d in prog.defs.items()}
        state: dict[str, int] = {}  # 1 = on the path, 2 = done
        for start in prog.defs:  # depth-first, with an explicit stack (no recursion limit)
            if start in state:
                continue
            path, iters = [start], [iter(calls[start])]
            state[start] = 1
            while iters:
                call = next(iters[-1], None)
                if call is None:
                    state[path.pop()] = 2
                    iters.pop()
                elif state.get(call.func) == 1:
                    chain = path[path.index(call.func):] + [call.func]
                    raise MemformError(f"recursive function: {' -> '.join(chain)} (a def may not call itself, "
                                       f"directly or through other defs)", call.loc)
                elif call.func not in state:
                    state[call.func] = 1
                    path.append(call.func)
                    iters.append(iter(calls[call.func]))

    def cycles(self) -> None:
        prog = self.prog
        # declaration order, not set order: the same cycle is reported the same way on every run
        starts: list[Node] = [("global", n) for n in list(prog.bindings) + list(prog.lets)]
        for bname, b in prog.blocks.items():
            for qname in b.quantities:
                for mode in RECOMPUTE_MODES:
                    starts.append(("q", bname, qname, mode))
        state: dict[Node, int] = {}  # 1 = on stack, 2 = done

        def label(n: Node) -> str:
            if n[0] == "global":
                return n[1]
            return f"{n[1]}.{n[2]}" + (f"[{n[3]}]" if n[3] and prog.has_variants(n[1], n[2]) else "")

        for start in starts:
            if state.get(start) == 2:
                continue
            path: list[Node] = [start]
            iters = [iter(self.deps(start))]
            state[start] = 1
            while iters:
                try:
                    nxt, ref = next(iters[-1])
                except StopIteration:
                    state[path.pop()] = 2
                    iters.pop()
                    continue
                st = state.get(nxt)
                if st == 1:
                    cyc = path[path.index(nxt):] + [nxt]
                    raise MemformError("cyclic definition: " + " -> ".join(label(n) for n in cyc), ref.loc)
                if st is None:
                    state[nxt] = 1
                    path.append(nxt)
                    iters.append(iter(self.deps(nxt)))


def check_program(prog: Program) -> None:
    """Raise :class:`MemformError` for the first problem found in ``prog``."""
    _Checker(prog).run()
