"""Command line: one module per command group, each registering its sub-commands.

``main`` (:mod:`memform.cli.main`) builds the parser and turns every
:class:`~memform.errors.MemformError` into one paragraph and exit status 2. Command groups:
``reports`` (report, plot, compare), ``analysis`` (derive, solve, sensitivity, search),
``imports`` (import), ``keys`` (keys); ``common`` holds the argument conventions they share.

May import every other memform package; nothing imports this one (but ``__main__``).
"""

from .main import main

__all__ = ["main"]
