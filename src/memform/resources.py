"""Where the bundled grammar, formula files and configs live.

In a wheel they are copied into the package (``memform/_data/...``, see pyproject.toml); in
a source checkout they sit at the repository root. Both layouts are searched so that
``pip install .``, ``pip install -e .`` and running from the tree all find the same files.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def data_dir(name: str) -> Path:
    """The directory holding bundled ``grammar``, ``formulas`` or ``configs``."""
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
