"""Text → :mod:`memform.lang.ast`: the lark grammar plus one Transformer, nothing more."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import lark
from lark import Lark, Token, Transformer, v_args

from ..errors import Loc, MemformError, read_text
from ..resources import grammar_file
from . import ast

_TOKEN_NAMES = {
    "NAME": "a name", "NUMBER": "a number", "STRING": "a string", "SCHED_NAME": "a schedule name",
    "LBRACE": "'{'", "RBRACE": "'}'", "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'",
    "EQUAL": "'='", "COLON": "':'", "COMMA": "','", "DOT": "'.'", "STAR": "'*'", "CMP_OP": "a comparison",
    "ADD_OP": "'+' or '-'", "MUL_OP": "'*', '/' or '%'", "MINUS": "'-'", "CIRCUMFLEX": "'^'",
    "VBAR": "'|'", "LIST_T": "'list'", "SET_T": "'set'", "$END": "end of file", "SIGNED_INT": "an integer", "PLACE": "'first' or 'last'",
}


@lru_cache(maxsize=1)
def _lark() -> Lark:
    # lark keeps the LALR tables it builds from the grammar (a third of a cold parse) in a file of the
    # cache directory, checked against the grammar's hash on every load
    from ..cachedir import cache_dir, enabled
    folder = cache_dir() / "lark"
    cache: str | bool = False
    try:
        if enabled():
            folder.mkdir(parents=True, exist_ok=True)
            cache = str(folder / "memform-grammar.lark")
    except OSError:
        pass
    return Lark(grammar_file().read_text(encoding="utf-8"), parser="lalr",
                propagate_positions=True, maybe_placeholders=False, cache=cache)


def _describe(token_type: str) -> str:
    if token_type in _TOKEN_NAMES:
        return _TOKEN_NAMES[token_type]
    if token_type.startswith("__ANON") or not token_type.isupper():
        return token_type
    return "'" + token_type.lower().rstrip("_t") + "'" if token_type.endswith("_T") else f"'{token_type.lower()}'"


@v_args(meta=True)
class _ToAst(Transformer):
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
        return ast.Include(_unquote(c[0]), self._loc(meta), _unquote(c[1]) if len(c) > 1 else None)

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
        if c and isinstance(c[-1], tuple) and c[-1][0] == "choice":
            _, cond, other = c.pop()
        name = c[0]
        count = c[1] if len(c) > 1 else None
        return ast.StackEntry(place, str(name), count, self._tok_loc(name), cond, other)

    def count(self, meta, c):
        return c[0]

    def choice(self, meta, c):
        return ("choice", c[0], str(c[1]))

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
        return ast.Call(str(c[0]), tuple(c[1:]), self._tok_loc(c[0]))

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


def _unquote(tok) -> str:
    return str(tok)[1:-1]


def parse_text(text: str, path: str = "<string>") -> ast.File:
    """Parse one formula file's text; raise :class:`MemformError` with a caret on bad syntax."""
    try:
        tree = _lark().parse(text)
    except lark.exceptions.UnexpectedInput as exc:
        raise _syntax_error(exc, text, path) from None
    try:
        tree = _ToAst(path).transform(tree)
    except lark.exceptions.VisitError as exc:
        if isinstance(exc.orig_exc, MemformError):
            raise exc.orig_exc from None
        if isinstance(exc.orig_exc, RecursionError):
            raise MemformError(f"expressions nest too deeply (more than {MAX_NESTING} levels)",
                               Loc(path, 1, 1)) from None
        raise
    except RecursionError:
        raise MemformError(f"expressions nest too deeply (more than {MAX_NESTING} levels)",
                           Loc(path, 1, 1)) from None
    _check_nesting(tree)
    return tree


#: Deepest expression nesting accepted: real formulas nest a handful of levels; a limit keeps
#: every recursive pass (checker, evaluator, printer) far from Python's recursion limit.
MAX_NESTING = 100


def _check_nesting(tree: ast.File) -> None:
    """Reject an expression nested more than :data:`MAX_NESTING` levels (iteratively: no recursion)."""
    todo: list[tuple[object, int]] = [(d, 0) for d in tree.decls]
    while todo:
        node, depth = todo.pop()
        if depth > MAX_NESTING:
            loc = getattr(node, "loc", None)
            raise MemformError(f"expression nested more than {MAX_NESTING} levels deep; split it with 'let'", loc)
        if isinstance(node, tuple):
            todo.extend((x, depth) for x in node)
        elif hasattr(node, "__dataclass_fields__"):
            for name in node.__dataclass_fields__:
                child = getattr(node, name)
                if isinstance(child, tuple) or hasattr(child, "__dataclass_fields__"):
                    todo.append((child, depth + 1 if name != "loc" else depth))


def parse_file(path: str | Path) -> ast.File:
    p = Path(path)
    text = read_text(p, "formula file")
    # Syntax trees are immutable, so a file whose text is unchanged is parsed once per process:
    # a planner (or a property test) estimating many strategies of one model reparses nothing.
    # Across processes the tree is kept in the cache directory (see _stored_tree).
    key = (str(p), text)
    tree = _PARSED.get(key)
    if tree is None:
        if len(_PARSED) >= 256:
            _PARSED.clear()
        tree = _PARSED[key] = _stored_tree(str(p), text)
    return tree


_PARSED: dict[tuple[str, str], ast.File] = {}


def _stored_tree(path: str, text: str) -> ast.File:
    """The syntax tree of ``text``, read back from the cache directory where an earlier process
    parsed the same text under the same name with the same code (a bundled file is parsed once per
    install, not on every run), else parsed and stored. The entry's name is a SHA-256 of memform's
    code, the name and the text; it is a pickle of our own frozen dataclasses, written atomically
    into the user's own cache directory (the trust of the compiled entries stored beside it), and
    one that does not load as a syntax tree is parsed again."""
    import hashlib
    import pickle

    from ..cachedir import cache_dir, code_digest, enabled, write_atomic
    if not enabled():
        return parse_text(text, path)
    name = hashlib.sha256("\0".join((code_digest(), path, text)).encode()).hexdigest()
    entry = cache_dir() / "syntax" / name[:2] / f"{name}.pickle"
    try:
        tree = pickle.loads(entry.read_bytes())
        if isinstance(tree, ast.File) and tree.path == path:
            return tree
    except Exception:  # noqa: BLE001 - missing, unreadable or foreign: parse again
        pass
    tree = parse_text(text, path)
    try:
        data = pickle.dumps(tree, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, RecursionError):
        return tree
    write_atomic(entry, data)
    return tree


def _syntax_error(exc: lark.exceptions.UnexpectedInput, text: str, path: str) -> MemformError:
    line = getattr(exc, "line", 0) or 0
    col = getattr(exc, "column", 0) or 0
    lines = text.splitlines()
    if line <= 0:  # unexpected end of input
        line = max(len(lines), 1)
        col = len(lines[-1]) + 1 if lines else 1
    src = lines[line - 1].expandtabs(1) if 0 < line <= len(lines) else ""
    if isinstance(exc, lark.exceptions.UnexpectedCharacters):
        msg = f"syntax error: unexpected character {text[exc.pos_in_stream]!r}" if exc.pos_in_stream < len(text) \
            else "syntax error: unexpected end of file"
    elif isinstance(exc, lark.exceptions.UnexpectedToken):
        tok = exc.token
        got = "end of file" if tok.type == "$END" else repr(str(tok))
        expected = sorted({_describe(t) for t in exc.expected})
        hint = ", ".join(expected[:8]) + (", ..." if len(expected) > 8 else "")
        msg = f"syntax error: unexpected {got}; expected {hint}"
    else:
        msg = "syntax error: unexpected end of file"
    return MemformError(msg, Loc(path, line, max(col, 1)), source_line=src)
