"""Reading formula files into one checked :class:`~memform.lang.program.Program`.

Files are read in order; ``include`` pulls a file in at the point it appears (once per
program, cycles are errors). After loading, :mod:`memform.lang.checker` lints the whole
program before any config is seen.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import Loc, MemformError
from ..resources import resolve_formula_path  # noqa: F401 (re-exported)
from . import ast
from .checker import check_program
from .parser import parse_file
from .program import Program


def display_path(path: Path) -> Path:
    """``path`` relative to the working directory when it lies below it (shorter messages)."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path


def _was_loaded(decl: ast.Include, referrer: Path, loaded: set[Path]) -> bool:
    """``include "X" if "W"``: whether the program loaded W -- a bare file name matches a loaded file of
    that name (as the engine matches a profile's companions, frameworks/NAME/F.mf, by name), a path
    that file itself."""
    if "/" not in decl.when:
        return any(p.name == decl.when for p in loaded)
    cond = resolve_formula_path(decl.when, referrer.parent)
    if not cond.is_file():
        raise MemformError(f'include "{decl.path}" if "{decl.when}": no such formula file: {cond}', decl.loc)
    return cond.resolve() in loaded


def load_program(paths: list[str | Path], *, check: bool = True) -> Program:
    """Read formula files (and what they include) into one checked :class:`Program`."""
    prog = Program()
    loaded: set[Path] = set()

    def visit(path: Path, stack: list[Path], loc: Loc | None) -> None:
        key = path.resolve()
        if key in stack:
            chain = " -> ".join(str(p.name) for p in stack + [key])
            raise MemformError(f"include cycle: {chain}", loc)
        if key in loaded:
            return
        if not path.is_file():
            raise MemformError(f"formula file not found: {path}", loc)
        tree = parse_file(display_path(path))
        for decl in tree.decls:
            if isinstance(decl, ast.Include):
                if decl.when is not None and not _was_loaded(decl, path, loaded | set(stack)):
                    continue
                visit(resolve_formula_path(decl.path, path.parent), stack + [key], decl.loc)
            else:
                prog.add(decl)
        loaded.add(key)
        prog.files.append(str(display_path(path)))
        prog.paths.append(str(key))

    for p in paths:
        visit(Path(p), [], None)
    if check:
        _check_once(prog)
    return prog


def _check_once(prog: Program) -> None:
    """:func:`check_program`, skipped for a program that passed it before: the same files with the same
    texts, loaded in the same order by the same code (a sixth of a new config's ``memform estimate``). A
    pass is recorded as an empty marker file in the cache directory, named by a SHA-256 of memform's
    code and every loaded file's path and text; a failing program is never recorded, so its error is
    raised on every load."""
    import hashlib

    from ..cachedir import cache_dir, code_digest, enabled, write_atomic
    if not enabled():
        check_program(prog)
        return
    from . import parser  # its reader, looked up now: the texts parsed (bench/mutate.py serves mutants through it)
    h = hashlib.sha256(code_digest().encode())
    for p in prog.paths:
        h.update(f"\0{p}\0{parser.read_text(Path(p), 'formula file')}".encode())
    name = h.hexdigest()
    marker = cache_dir() / "checked" / name[:2] / name
    if marker.is_file():
        return
    check_program(prog)
    write_atomic(marker, b"")
