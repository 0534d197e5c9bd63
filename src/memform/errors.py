"""The one error type memform raises for user mistakes.

Every problem a user can cause (a formula file that does not parse, an unknown symbol, a
config key with the wrong type) becomes a :class:`MemformError`. The CLI prints it as one
paragraph and exits with status 2; anything else escaping is a bug in memform itself.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

EXIT_USER_ERROR = 2


@dataclass(frozen=True)
class Loc:
    """A position in a formula file (1-based line and column)."""

    file: str
    line: int
    col: int = 0

    def __str__(self) -> str:
        from .resources import display_path  # the one place printed locations are named
        shown = display_path(self.file)
        return f"{shown}:{self.line}:{self.col}" if self.col else f"{shown}:{self.line}"


class MemformError(Exception):
    """A user mistake, with enough context to fix it without reading memform's code."""

    def __init__(self, message: str, loc: Loc | None = None, *, source_line: str | None = None):
        self.message = message
        self.loc = loc
        self.source_line = source_line
        super().__init__(self.render())

    def render(self) -> str:
        head = f"{self.loc}: {self.message}" if self.loc else self.message
        if self.loc is not None and self.source_line is None:
            self.source_line = _read_line(self.loc)
        if self.source_line is not None and self.loc is not None and self.loc.col:
            caret = " " * (self.loc.col - 1) + "^"
            return f"{head}\n    {self.source_line}\n    {caret}"
        return head


def _read_line(loc: Loc) -> str | None:
    try:
        lines = Path(loc.file).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    if 1 <= loc.line <= len(lines):
        return lines[loc.line - 1].expandtabs(1)
    return None


def read_text(path: str | Path, what: str = "file") -> str:
    """A user-named file's text, or a :class:`MemformError` saying which ``what`` is missing/unreadable."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MemformError(f"{what} not found: {p}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MemformError(f"cannot read {what} {p}: {exc}") from None


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """A ' (did you mean X?)' suffix, or '' when nothing is close."""
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
