"""Reading formula files into one checked :class:`~memform.lang.program.Program`.

Files are read in order; ``include`` pulls a file in at the point it appears (once per
program, cycles are errors). ``include "X" after profile`` pulls X in after every file the
program was asked for instead (a config's formula files, its framework profile and the profile's
companions: :func:`memform.engine.config.formula_files`), in the order such includes were met; ``include
"X" when k1 or k2`` only for a config that sets one of the keys (the program records each answer:
:meth:`Program.same_conditions`). After loading, :mod:`memform.lang.checker` lints the whole program
before any config is seen.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from ..errors import Loc, MemformError, did_you_mean
from ..resources import FORMULAS_ENV, resolve_formula_path  # noqa: F401 (re-exported)
from . import ast
from .checker import check_program
from .parser import parse_file
from .program import Program, key_is_set

#: ``load_program(..., config=EVERY_KEY)``: every ``when`` include is taken, as if the config set every key (the
#: lint of ``memform check`` and the importers' question "which keys can these files bind")
EVERY_KEY: Mapping[str, Any] = MappingProxyType({})


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


@dataclass(frozen=True)
class _Loaded:
    """A program loaded earlier in this process, with what its loading read: each loaded file's text and
    where each ``include`` led (a file written next to a referrer since would change it)."""

    program: Program
    texts: tuple[str, ...]
    includes: tuple[tuple[str, str, str], ...]  # (include's path, referrer's folder, the file it named)

    def still_valid(self, config: Mapping[str, Any] | None) -> bool:
        from . import parser  # its reader, looked up now (bench/mutate.py serves mutants through it)
        if config is not EVERY_KEY and not self.program.same_conditions(config or {}):
            return False
        try:
            if any(parser.read_text(Path(p), "formula file") != t for p, t in zip(self.program.paths, self.texts)):
                return False
        except MemformError:
            return False
        return all(str(resolve_formula_path(name, Path(folder))) == target for name, folder, target in self.includes)


#: programs loaded in this process, by the files asked for and what else decides the result (the working
#: directory names files in messages; the formulas folder override): a config's every estimate, and every
#: candidate of a planner or a property test, loads the same program -- built anew it was a third of a
#: bundled config's numeric estimate. A program is not changed after loading (its own caches aside), so
#: one object serves every model that names it.
_LOADED: dict[tuple[Any, ...], list[_Loaded]] = {}


def load_program(paths: list[str | Path], *, check: bool = True,
                 config: Mapping[str, Any] | None = None) -> Program:
    """Read formula files (and what they include) into one checked :class:`Program`.

    ``config`` answers the ``include ... when KEY`` conditions: a config's (nested) data, where a key is
    set when it holds a value other than None (None, the default: a config that sets no key);
    :data:`EVERY_KEY` takes every such include. A program loaded before from the same files with the same
    texts, for a config answering every condition alike, is returned again (:class:`_Loaded`).
    """
    key = (os.getcwd(), os.environ.get(FORMULAS_ENV), tuple(str(Path(p).resolve()) for p in paths), check,
           config is EVERY_KEY)
    seen = _LOADED.get(key, [])
    for entry in seen:
        if entry.still_valid(config):
            return entry.program
    includes: list[tuple[str, str, str]] = []
    prog = _load(paths, check, config, includes)
    from . import parser
    texts = tuple(parser.read_text(Path(p), "formula file") for p in prog.paths)
    if len(_LOADED) >= 64:
        _LOADED.clear()
    _LOADED[key] = seen[-7:] + [_Loaded(prog, texts, tuple(includes))]  # a few condition answers per key
    return prog


def _load(paths: list[str | Path], check: bool, config: Mapping[str, Any] | None,
          includes: list[tuple[str, str, str]]) -> Program:
    """:func:`load_program`'s work, recording in ``includes`` where each ``include`` led."""
    prog = Program()
    loaded: set[Path] = set()
    #: ``after profile`` includes met while loading: (the include, the file it stands in), in that order
    deferred: list[tuple[ast.Include, Path]] = []
    #: files loaded where an include or the caller named them (in place), with that include's location
    in_place: dict[Path, Loc | None] = {}

    def taken(decl: ast.Include) -> bool:
        if not decl.keys:
            return True
        answer = config is EVERY_KEY or (config is not None and any(key_is_set(config, k) for k in decl.keys))
        prog.conditions.append((decl, answer))
        return answer

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
                if not taken(decl):
                    continue
                if decl.after_profile:
                    deferred.append((decl, path))
                    continue
                if decl.when is not None and not _was_loaded(decl, path, loaded | set(stack)):
                    continue
                target = resolve_formula_path(decl.path, path.parent)
                includes.append((decl.path, str(path.parent), str(target)))
                in_place.setdefault(target.resolve(), decl.loc)
                visit(target, stack + [key], decl.loc)
            else:
                prog.add(decl)
        loaded.add(key)
        prog.files.append(str(display_path(path)))
        prog.paths.append(str(key))

    for p in paths:
        in_place.setdefault(Path(p).resolve(), None)
        visit(Path(p), [], None)
    early = dict(in_place)  # what was loaded before the profile's last word: a deferred file must not be
    while deferred:  # a deferred file's own `after profile` includes join the end of the queue
        decl, referrer = deferred.pop(0)
        if decl.when is not None and not _was_loaded(decl, referrer, loaded):
            continue
        target = resolve_formula_path(decl.path, referrer.parent)
        includes.append((decl.path, str(referrer.parent), str(target)))
        if target.resolve() in loaded:
            _loaded_too_early(decl, target, early)
            continue
        visit(target, [], decl.loc)
    _check_conditions(prog)
    if check:
        _check_once(prog)
    return prog


def _loaded_too_early(decl: ast.Include, target: Path, in_place: dict[Path, Loc | None]) -> None:
    """A file an ``after profile`` include names, already loaded: fine when an earlier ``after profile``
    include loaded it, an error when it was loaded in place (before the profile whose definitions it must
    follow: its `super` would name theirs and the profile's would replace its own)."""
    key = target.resolve()
    if key not in in_place:
        return
    where = in_place[key]
    how = f"the include at {where} loaded it" if where is not None else "it is one of the files the program was given"
    raise MemformError(f'include "{decl.path}" after profile: {display_path(target)} must load after the framework '
                       f"profile, but {how} before the profile; leave it out there (a config's `formulas:` need "
                       f"not name it)", decl.loc)


def _check_conditions(prog: Program) -> None:
    """Each key of a ``when`` include that was taken is bound by the program (a misspelt key would never
    be set, and its file never loaded)."""
    bound = {b.path for b in prog.bindings.values()}
    for decl, answer in prog.conditions:
        if not answer:
            continue
        for k in decl.keys:
            if k not in bound:
                raise MemformError(f'include "{decl.path}" when {k}: no loaded formula file binds config key '
                                   f"'{k}' (a symbol or option = {k}), so no config could set it"
                                   f"{did_you_mean(k, sorted(bound))}", decl.loc)


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
