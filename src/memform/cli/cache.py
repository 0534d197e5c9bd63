"""``memform cache info|clear``: what the cache directory holds, and emptying it.

The cache keeps compiled structures (``estimate``, ``search``), parsed formula files (``syntax``),
markers of formula programs that passed the checker (``checked``) and the grammar's parser tables
(``lark``); every entry is checked before use and rebuilt when stale, so
clearing it only costs the time to rebuild (see :mod:`memform.cachedir`).
"""

from __future__ import annotations

import argparse

from .. import cachedir
from ..units import human_bytes


def cmd_cache(args: argparse.Namespace) -> int:
    root = cachedir.cache_dir()
    if args.action == "clear":
        files, size = cachedir.clear()
        print(f"removed {files} file(s), {human_bytes(size)}, from {root}")
        return 0
    usage = cachedir.usage()
    total = sum(b for _, b in usage.values())
    print(f"cache directory: {root} (${cachedir.CACHE_ENV} sets it)")
    print(f"size limit: {human_bytes(cachedir.limit_bytes())} (${cachedir.LIMIT_ENV}, in MiB); "
          f"in use: {human_bytes(total)}")
    for name in sorted(set(usage) | set(cachedir.PURPOSES)):
        files, size = usage.get(name, (0, 0))
        what = cachedir.PURPOSES.get(name, cachedir.PURPOSES.get(name.split("-")[0], "other files"))
        print(f"  {name:<11} {files:>6} file(s) {human_bytes(size):>12}  {what}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="show or clear the cache of compiled structures and parsed formula files")
    p.add_argument("action", choices=["info", "clear"], help="info: what it holds; clear: delete every entry")
    p.set_defaults(func=cmd_cache)
