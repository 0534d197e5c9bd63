"""lark's parse tree → :mod:`memform.lang.ast`: the one Transformer, stamping every node with its file:line:col.

Kept apart from :mod:`memform.lang.parser` so that reading formula files whose syntax trees are
already in the cache directory (every ``memform estimate`` of a bundled config but the first)
never imports lark: :func:`memform.lang.parser.parse_text` imports this module on an actual parse.
"""

from __future__ import annotations

from lark import Token, Transformer, v_args

from ..errors import Loc, MemformError
from . import ast


#: the ``after profile`` of an include, as the transformer passes it up
_AFTER = "\0after profile\0"


@v_args(meta=True)
class ToAst(Transformer):
    """Builds :mod:`memform.lang.ast` nodes, stamping each with its file:line:col."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def _loc(self, meta) -> Loc:
        return Loc(self.path, getattr(meta, "line", 0), getattr(meta, "column", 0))

    def _tok_loc(self, tok: Token) -> Loc:
        return Loc(self.path, tok.line or 0, tok.column or 0)

    # -- declarations
    def start(self, meta, items):
        return ast.File(self.path, tuple(items))

    def include(self, meta, c):
        files = [_unquote(x) for x in c if isinstance(x, Token)]
        keys = next((x for x in c if isinstance(x, tuple)), ())
        return ast.Include(files[0], self._loc(meta), files[1] if len(files) > 1 else None,
                           after_profile=_AFTER in c, keys=keys)

    def after_profile(self, meta, c):
        return _AFTER

    def include_when(self, meta, c):
        return tuple(c)

    def _binding(self, keyword, meta, c):
        name, typ, path, *rest = c
        default = None
        unit = None
        doc = ""
        for r in rest:
            if isinstance(r, tuple) and r[0] == "default":
                default = r[1]
            elif isinstance(r, tuple) and r[0] == "unit":
                unit = r[1]
            else:
                doc = _unquote(r)
        return ast.Binding(keyword, str(name), typ, path, default, doc, unit, self._tok_loc(name))

    def symbol_decl(self, meta, c):
        return self._binding("symbol", meta, c)

    def option_decl(self, meta, c):
        return self._binding("option", meta, c)

    def default(self, meta, c):
        return ("default", c[0])

    def unit(self, meta, c):
        return ("unit", str(c[0]))

    def config_path(self, meta, c):
        return ".".join(str(x) for x in c)

    def t_int(self, meta, c):
        if len(c) == 2:
            lo, hi = c[1]
            return ast.TypeSpec("int", lo, hi)
        return ast.TypeSpec("int")

    def t_bool_int(self, meta, c):
        lo, hi = c[2] if len(c) == 3 else (None, None)
        return ast.TypeSpec("int", lo, hi, or_bool=True)

    def t_int_list(self, meta, c):
        lo, hi = c[1] if len(c) == 3 else (None, None)
        return ast.TypeSpec("int", lo, hi, or_list=True)

    def t_real(self, meta, c):
        return ast.TypeSpec("real")

    def t_bool(self, meta, c):
        return ast.TypeSpec("bool")

    def t_dtype(self, meta, c):
        return ast.TypeSpec("dtype")

    def t_enum(self, meta, c):
        return ast.TypeSpec("enum", choices=tuple(_unquote(x) for x in c))

    def t_set(self, meta, c):
        return ast.TypeSpec("set", choices=tuple(_unquote(x) for x in c[1:]))

    def t_names(self, meta, c):
        return ast.TypeSpec("names", choices=tuple(_unquote(x) for x in c[1:]))

    def range(self, meta, c):
        return (int(c[0]), int(c[1]))

    def let_decl(self, meta, c):
        return ast.Let(str(c[0]), c[1], self._tok_loc(c[0]))

    def def_decl(self, meta, c):
        return ast.Def(str(c[0]), tuple(str(x) for x in c[1:-1]), c[-1], self._tok_loc(c[0]))

    def require_decl(self, meta, c):
        return ast.Require(c[0], _unquote(c[1]), self._loc(meta))

    def _block(self, kind, meta, c):
        name = c[0]
        rest = list(c[1:])
        base = str(rest.pop(0)) if rest and isinstance(rest[0], Token) else None
        return ast.Block(kind, str(name), base, tuple(rest), self._tok_loc(name))

    def block_decl(self, meta, c):
        return self._block("block", meta, c)

    def comm_decl(self, meta, c):
        return self._block("comm", meta, c[1:])

    def name(self, meta, c):
        return c[0]

    def schedule_decl(self, meta, c):
        return self._block("schedule", meta, c)

    def runtime_decl(self, meta, c):
        return self._block("runtime", meta, c)

    def cost_decl(self, meta, c):
        return self._block("cost", meta, c)

    def quantity(self, meta, c):
        variants = c[1] if len(c) == 3 else None
        return ast.Quantity(str(c[0]), variants, c[-1], self._tok_loc(c[0]))

    def moment(self, meta, c):
        return ast.Quantity(str(c[0]), None, c[1], self._tok_loc(c[0]), moment=True)

    def variants(self, meta, c):
        return tuple(str(x) for x in c)

    def stack_decl(self, meta, c):
        return ast.Stack(tuple(c), self._loc(meta))

    def stack_entry(self, meta, c):
        place = None
        if c and isinstance(c[0], Token) and c[0].type == "PLACE":
            place = str(c.pop(0))
        cond = other = None
        branches: tuple = ()
        bindings: tuple = ()
        if c and isinstance(c[-1], tuple) and c[-1][0] == "bindings":
            bindings = c.pop()[1]
        if c and isinstance(c[-1], tuple) and c[-1][0] == "choice":
            _, conds, blocks, other = c.pop()
            cond, branches = conds[0], tuple(zip(conds[1:], blocks))
        name = c[0]
        count = c[1] if len(c) > 1 else None
        return ast.StackEntry(place, str(name), count, self._tok_loc(name), cond, other, branches, bindings)

    def count(self, meta, c):
        return c[0]

    def choice(self, meta, c):
        """``if c1 else b1 [if c2 else b2 ...]`` as (conditions, the blocks between them, the last else)."""
        if len(c) > 2:
            _, conds, blocks, other = c[2]
            return ("choice", [c[0]] + conds, [str(c[1])] + blocks, other)
        return ("choice", [c[0]], [], str(c[1]))

    def bindings(self, meta, c):
        return ("bindings", tuple((str(c[k]), c[k + 1]) for k in range(0, len(c), 2)))

    # -- expressions
    def if_expr(self, meta, c):
        return ast.If(c[0], c[1], c[2], self._loc(meta))

    def or_expr(self, meta, c):
        return ast.Logic("or", tuple(c), self._loc(meta))

    def and_expr(self, meta, c):
        return ast.Logic("and", tuple(c), self._loc(meta))

    def not_op(self, meta, c):
        return ast.Not(c[0], self._loc(meta))

    def comparison(self, meta, c):
        return ast.Cmp(str(c[1]), c[0], c[2], self._loc(meta))

    def _chain(self, meta, c):
        node = c[0]
        for op, rhs in zip(c[1::2], c[2::2]):
            node = ast.BinOp(str(op), node, rhs, self._tok_loc(op))
        return node

    sum = _chain
    product = _chain

    def neg(self, meta, c):
        return ast.Neg(c[0], self._loc(meta))

    def power(self, meta, c):
        return ast.BinOp("^", c[0], c[1], self._loc(meta))

    def number(self, meta, c):
        return ast.Num(str(c[0]), self._tok_loc(c[0]))

    def string(self, meta, c):
        return ast.Str(_unquote(c[0]), self._tok_loc(c[0]))

    def where_expr(self, meta, c):
        return ast.Where(c[0], ((str(c[1]), c[2]),), self._loc(meta))

    def true(self, meta, c):
        return ast.Bool(True, self._loc(meta))

    def false(self, meta, c):
        return ast.Bool(False, self._loc(meta))

    def call(self, meta, c):
        args = [a for a in c[1:] if a is not None]   # lark gives None for an empty argument list
        names = tuple(a.name if isinstance(a, _Named) else None for a in args)
        return ast.Call(str(c[0]), tuple(a.expr if isinstance(a, _Named) else a for a in args), self._tok_loc(c[0]),
                        names if any(n is not None for n in names) else None)

    def named_arg(self, meta, c):
        return _Named(str(c[0]), c[1])

    def ref(self, meta, c):
        name = str(c[0])
        attr = None
        variant = None
        for x in c[1:]:
            if isinstance(x, tuple):
                if len(x) != 1:
                    raise MemformError(f"a reference names one variant, not {len(x)}", self._tok_loc(c[0]))
                variant = x[0]
            else:
                attr = str(x)
        return ast.Ref(name, attr, variant, self._tok_loc(c[0]))


class _Named:
    """A named argument (``name: expr``) on its way into :class:`ast.Call`'s ``names``."""

    def __init__(self, name: str, expr):
        self.name, self.expr = name, expr


def _unquote(tok) -> str:
    return str(tok)[1:-1]
