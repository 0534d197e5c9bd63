"""Argument and output conventions shared by every sub-command (so command modules need not import each other)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import MemformError


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML config (model, parallel, training, device)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key by dotted path, e.g. --set parallel.tp=8 (repeatable)")


def emit(text: str, output: str | None, *, show_size: bool = False) -> None:
    """``text`` to stdout (``output`` None or ``-``) or to the file ``output``, saying so on stderr."""
    if output is None or output == "-":
        sys.stdout.write(text)
        return
    path = Path(output)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise MemformError(f"cannot write {path}: {exc.strerror or exc}") from None
    size = f" ({len(text.encode('utf-8')) / 2 ** 20:.2f} MiB)" if show_size else ""
    print(f"wrote {path}{size}", file=sys.stderr)
