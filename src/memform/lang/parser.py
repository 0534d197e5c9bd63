"""Text → :mod:`memform.lang.ast`: the lark grammar plus one Transformer (:mod:`.transform`), nothing more.

lark is imported on an actual parse only: a file whose syntax tree is in the cache directory is read
back without it (a new config's cold estimate is a parse-free evaluation).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from typing import TYPE_CHECKING

from ..errors import Loc, MemformError, read_text
from ..resources import grammar_file
from . import ast, bundled

if TYPE_CHECKING:
    import lark
    from lark import Lark

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
    cache: str | bool = False
    try:
        if enabled():
            folder = cache_dir() / "lark"
            folder.mkdir(parents=True, exist_ok=True)
            cache = str(folder / "memform-grammar.lark")
    except OSError:
        pass
    from lark import Lark
    return Lark(grammar_file().read_text(encoding="utf-8"), parser="lalr",
                propagate_positions=True, maybe_placeholders=False, cache=cache)


def _describe(token_type: str) -> str:
    if token_type in _TOKEN_NAMES:
        return _TOKEN_NAMES[token_type]
    if token_type.startswith("__ANON") or not token_type.isupper():
        return token_type
    return "'" + token_type.lower().rstrip("_t") + "'" if token_type.endswith("_T") else f"'{token_type.lower()}'"


def parse_text(text: str, path: str = "<string>") -> ast.File:
    """Parse one formula file's text; raise :class:`MemformError` with a caret on bad syntax."""
    import lark

    from .transform import ToAst
    try:
        tree = _lark().parse(text)
    except lark.exceptions.UnexpectedInput as exc:
        raise _syntax_error(exc, text, path) from None
    try:
        tree = ToAst(path).transform(tree)
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
        # a bundled file's tree comes from the installation's store (parsed once per install, see
        # memform.lang.bundled), any other file's from the cache directory
        tree = bundled.lookup(p, str(p), text) or bundled.remember(p, str(p), text, parse_text) or _stored_tree(str(p), text)
        _PARSED[key] = tree
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
    import lark
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
