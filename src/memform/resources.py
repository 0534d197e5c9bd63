"""Where the bundled grammar, formula files and configs live.

In a wheel they are copied into the package (``memform/_data/...``, see pyproject.toml); in
a source checkout they sit at the repository root. Both layouts are searched so that
``pip install .``, ``pip install -e .`` and running from the tree all find the same files.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

#: memform's version (``memform.__version__``; here so that any module can read it without a cycle)
VERSION = "0.1.0"

_PACKAGE = Path(__file__).resolve().parent


#: environment variable naming a directory that replaces the bundled ``formulas`` (a whole copy of the
#: tree: ``include`` and the framework profiles are looked up in it); read once per process. bench/mutate.py
#: sets it for the subprocesses of the tests it runs, pointing at a copy holding the mutated file
FORMULAS_ENV = "MEMFORM_FORMULAS_DIR"


@lru_cache(maxsize=None)
def data_dir(name: str) -> Path:
    """The directory holding bundled ``grammar``, ``formulas`` or ``configs`` (``formulas``: the directory
    :data:`FORMULAS_ENV` names, when set)."""
    override = os.environ.get(FORMULAS_ENV) if name == "formulas" else None
    if override:
        return Path(override).resolve()
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"memform installation is missing its '{name}' directory")


def grammar_file() -> Path:
    return data_dir("grammar") / "memform.lark"


def formulas_dir() -> Path:
    return data_dir("formulas")


def templates_dir() -> Path:
    return _PACKAGE / "report" / "templates"


BUNDLED_PREFIX = "formulas"


def display_path(file: str | Path) -> str:
    """How a formula file is named in every printed location (``file:line:col``): a bundled file as
    ``formulas/dense.mf`` wherever it is installed, a user's file relative to the working
    directory when it lies under it, else as given. :func:`resolve_display_path` inverts it."""
    return _display_path(str(file), str(Path.cwd()))


@lru_cache(maxsize=1024)
def _display_path(file: str, cwd: str) -> str:
    path = Path(file)
    try:
        full = path.resolve()
    except (OSError, RuntimeError):
        return file
    try:
        bundled = formulas_dir()
    except FileNotFoundError:
        bundled = None
    if bundled is not None and full.is_relative_to(bundled):
        return f"{BUNDLED_PREFIX}/{full.relative_to(bundled).as_posix()}"
    if path.is_absolute() and full.is_relative_to(Path(cwd)):
        return full.relative_to(Path(cwd)).as_posix()
    return file


def resolve_display_path(shown: str | Path) -> Path:
    """The file a :func:`display_path` name stands for (bundled ``formulas/...`` when no such file
    exists relative to the working directory)."""
    path = Path(shown)
    if path.is_absolute() or path.exists():
        return path
    parts = path.parts
    if parts and parts[0] == BUNDLED_PREFIX:
        candidate = formulas_dir().joinpath(*parts[1:])
        if candidate.exists():
            return candidate
    return path


def resolve_formula_path(name: str, relative_to: Path | None) -> Path:
    """A formula file named in an include or a config: next to the referrer, else bundled."""
    p = Path(name)
    if p.is_absolute():
        return p
    candidates = []
    if relative_to is not None:
        candidates.append(relative_to / p)
    candidates.append(formulas_dir() / p)
    for c in candidates:
        if c.is_file():
            return c
    return candidates[0]
