"""The bundled formula files' syntax trees, parsed once per installation (as Python compiles ``.pyc`` files).

A new config's first ``memform estimate`` reads half a dozen bundled formula files; parsing them with lark
(building the grammar's tables, then the parse and the transform) was most of a cold run. Their trees are
kept in one file inside the package, ``memform/_parsed/formulas.pickle``: written by the wheel's build hook
(``hatch_build.py``), and in a source checkout on first use (each file's entry when it is first parsed, as
Python writes ``__pycache__``; an unwritable package only costs the parse). It is part of the installation,
not of the user's cache directory, so it is read under ``--no-cache`` too.

An entry is trusted only for the same text (SHA-256 of the file), under a store made by the same parser
(:func:`syntax_digest`: memform's version, the grammar and ``memform/lang``'s code); anything else is
parsed as before. A tree is stored with a placeholder for its file's name and loaded under the name the
caller shows (``formulas/dense.mf`` from the repository root, an absolute path elsewhere), so every
location reads as a fresh parse's would.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import tempfile
from functools import lru_cache
from typing import Callable
from pathlib import Path

from ..resources import VERSION, formulas_dir, grammar_file
from . import ast

#: where the store lives, inside the package (in a wheel and in a source checkout alike)
STORE = Path(__file__).resolve().parent.parent / "_parsed" / "formulas.pickle"
#: the file name a tree is parsed under before it is stored (never a real path: it holds NULs)
PLACEHOLDER = "\0memform-bundled-formula-file\0"
_FORMAT = 1


@lru_cache(maxsize=1)
def syntax_digest() -> str:
    """SHA-256 over what decides a syntax tree besides its text: memform's version, the grammar, and the
    source of ``memform/lang`` (names and bytes)."""
    h = hashlib.sha256(f"{VERSION}\0{_FORMAT}".encode())
    for f in [grammar_file()] + sorted(Path(__file__).resolve().parent.glob("*.py")):
        h.update(f"\0{f.name}\0".encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _relative(path: Path) -> str | None:
    """``path``'s name below the bundled formulas directory, or None for any other file."""
    try:
        full = path.resolve()
        root = formulas_dir()
    except (OSError, RuntimeError, FileNotFoundError):
        return None
    if not full.is_relative_to(root):
        return None
    return full.relative_to(root).as_posix()


_STORE: list[dict | None] = []   # [the loaded store's entries] once read (None: none usable)


def _entries() -> dict:
    if not _STORE:
        entries = None
        try:
            data = pickle.loads(STORE.read_bytes())
            if isinstance(data, dict) and data.get("digest") == syntax_digest():
                entries = data["files"]
        except Exception:  # noqa: BLE001 - missing, unreadable or foreign: as if empty
            pass
        _STORE.append(entries)
    return _STORE[0] or {}


class _Loader(pickle.Unpickler):
    def __init__(self, data: bytes, path: str) -> None:
        super().__init__(io.BytesIO(data))
        self._path = path

    def persistent_load(self, pid: object) -> str:
        return self._path


class _Dumper(pickle.Pickler):
    def persistent_id(self, obj: object) -> str | None:
        return "file" if type(obj) is str and obj == PLACEHOLDER else None


def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def lookup(path: Path, shown: str, text: str) -> ast.File | None:
    """The stored tree of bundled file ``path`` with this ``text``, named ``shown``; None when not stored."""
    rel = _relative(path)
    if rel is None:
        return None
    hit = _entries().get(rel)
    if hit is None or hit[0] != _text_digest(text):
        return None
    try:
        tree = _Loader(hit[1], shown).load()
    except Exception:  # noqa: BLE001 - a damaged entry: parse again
        return None
    return tree if isinstance(tree, ast.File) else None


def dump(tree: ast.File) -> bytes:
    """A tree parsed under :data:`PLACEHOLDER`, as stored."""
    buf = io.BytesIO()
    _Dumper(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(tree)
    return buf.getvalue()


def remember(path: Path, shown: str, text: str, parse: Callable[[str, str], ast.File]) -> ast.File | None:
    """Parse bundled file ``path`` and add its tree to the store (first use in a source checkout; a package
    that is not writable keeps no store, and parses as before); the tree, named
    ``shown``. None for a file that is not bundled, a text other than the file's own (one served in its place,
    as bench/mutate.py serves mutants: parsed and cached as a user's file) or one that does not parse (the
    caller's parse raises its error). ``parse``: the parser's ``parse_text`` (passed in: the parser reads
    this store, so this module does not import it)."""
    rel = _relative(path)
    if rel is None or _on_disk(path) != text:
        return None   # not bundled, or a text served in the file's place (bench/mutate.py's mutants): the cache's
    from ..errors import MemformError
    try:
        data = dump(parse(text, PLACEHOLDER))
    except MemformError:
        return None
    if _WRITABLE[0]:
        entries = dict(_entries())
        entries[rel] = (_text_digest(text), data)
        _STORE[0] = entries
        _WRITABLE[0] = write(entries, STORE)
    return _Loader(data, shown).load()


_WRITABLE = [True]   # False once a write of the store failed (not retried in this process)


def _on_disk(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def write(entries: dict, target: Path) -> bool:
    """Write a store atomically (a concurrent reader sees the old file or the new one)."""
    data = pickle.dumps({"digest": syntax_digest(), "files": entries}, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=".pickle")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)   # read by every user of the installation
        os.replace(tmp, target)
        return True
    except OSError:
        return False


def build(target: Path, parse_text: Callable[[str, str], ast.File]) -> int:
    """Parse every bundled formula file with ``parse_text`` (the parser's) into a store at ``target`` (the
    wheel's build hook); the number of files stored."""
    from ..cachedir import enabled, set_enabled
    root = formulas_dir()
    entries = {}
    was = enabled()
    set_enabled(False)   # nothing of the builder's user cache is read or written (a build has none)
    try:
        for f in sorted(root.rglob("*.mf")):
            text = f.read_text(encoding="utf-8")
            entries[f.relative_to(root).as_posix()] = (_text_digest(text), dump(parse_text(text, PLACEHOLDER)))
    finally:
        set_enabled(was)
    write(entries, target)
    return len(entries)
