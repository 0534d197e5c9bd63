"""The cache directory: where memform keeps what it can rebuild (compiled structures, parsed formula
files, the grammar's parser tables), and the rules every user of it follows.

One directory per user (``platformdirs``' user cache directory, per memform version), or
``$MEMFORM_CACHE_DIR``. Every file is written atomically (a temporary file renamed into place, so a
concurrent reader sees the old file or the new one) and checked before it is trusted by whoever reads
it; after each write the directory is held within its size limit (``$MEMFORM_CACHE_MAX_MIB``, 256 MiB
by default) by deleting the least recently written files, which only costs their rebuild.
``--no-cache`` (:func:`set_enabled`) switches all of it off for a process. Used by the parser
(:mod:`memform.lang.parser`) and the compiled fast paths (:mod:`memform.fastpath.cachestore`), so it
sits below both and imports nothing of memform but :mod:`memform.resources`.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from functools import lru_cache
from pathlib import Path

from .resources import VERSION, grammar_file

#: environment variable naming the cache directory (overrides the platform default)
CACHE_ENV = "MEMFORM_CACHE_DIR"
#: environment variable with the cache's size limit in MiB (default :data:`DEFAULT_LIMIT_MIB`)
LIMIT_ENV = "MEMFORM_CACHE_MAX_MIB"
#: a compiled structure is 20-400 KiB, a parsed formula file 5-60 KiB: room for thousands of each
DEFAULT_LIMIT_MIB = 256
#: what each folder of the cache directory holds (``memform cache info``)
PURPOSES = {"estimate": "compiled estimate structures", "search": "compiled search structures",
            "solve": "compiled solve and sensitivity structures",
            "whatif": "compiled what-if page structures (one folder per page code version)",
            "search-seen": "searches of structures not compiled yet (compiled after a few)",
            "syntax": "parsed formula files", "checked": "formula programs that passed the checker",
            "lark": "the grammar's parser tables"}

_DIGESTS: dict[str, tuple[int, int, str]] = {}  # path -> (mtime_ns, size, sha256)
_ENABLED = [True]  # False: this process neither reads nor writes the cache directory (--no-cache)


def set_enabled(flag: bool) -> None:
    """Switch every use of the cache directory on or off for this process (``--no-cache``: compiled
    structures, parsed formula files and the grammar's tables alike)."""
    _ENABLED[0] = bool(flag)


def enabled() -> bool:
    return _ENABLED[0]


def cache_dir() -> Path:
    """Where entries are stored: ``$MEMFORM_CACHE_DIR``, else the user cache directory."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    import platformdirs
    return Path(platformdirs.user_cache_dir("memform", appauthor=False)) / VERSION


def digest(path: str) -> str | None:
    """SHA-256 of a file's bytes (memoized by modification time and size); None if unreadable."""
    try:
        st = os.stat(path)
        hit = _DIGESTS.get(path)
        if hit is not None and hit[0] == st.st_mtime_ns and hit[1] == st.st_size:
            return hit[2]
        value = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None
    _DIGESTS[path] = (st.st_mtime_ns, st.st_size, value)
    return value


@lru_cache(maxsize=1)
def code_digest() -> str:
    """SHA-256 over memform's version, the grammar and the source of every package that turns
    a config into numbers (``lang``, ``engine``, ``fastpath``, ``analysis``): an entry compiled by other code
    is never reused, even within one version."""
    h = hashlib.sha256(VERSION.encode())
    package = Path(__file__).resolve().parent
    files = [grammar_file()] + sorted(f for sub in ("lang", "engine", "fastpath", "analysis") for f in (package / sub).glob("*.py"))
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    """Write a cache file (a temporary file renamed into place: a concurrent reader sees the old
    file or the new one), then keep the directory within its limit. Nothing while the cache is
    switched off; an unwritable cache only costs speed."""
    if not enabled():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        prune(limit_bytes())
    except OSError:
        pass


def limit_bytes() -> int:
    """The cache's size limit: ``$MEMFORM_CACHE_MAX_MIB`` (a number of MiB), else 256 MiB."""
    try:
        mib = float(os.environ.get(LIMIT_ENV, DEFAULT_LIMIT_MIB))
    except ValueError:
        mib = DEFAULT_LIMIT_MIB
    return max(0, int(mib * 2 ** 20))


def _files(root: Path) -> list[os.DirEntry]:
    out, todo = [], [root]
    while todo:
        try:
            with os.scandir(todo.pop()) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        todo.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        out.append(e)
        except OSError:
            continue
    return out


def prune(limit: int) -> int:
    """Delete the least recently written files until the cache holds at most ``limit`` bytes
    (an entry removed is only compiled or parsed again when next needed); bytes removed."""
    entries = []
    for e in _files(cache_dir()):
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        entries.append((st.st_mtime_ns, st.st_size, e.path))
    total = sum(size for _, size, _ in entries)
    removed = 0
    for _, size, path in sorted(entries):
        if total - removed <= limit:
            break
        try:
            os.unlink(path)
            removed += size
        except OSError:
            pass
    return removed


def usage() -> dict[str, tuple[int, int]]:
    """Files and bytes per top folder of the cache directory (``memform cache info``)."""
    root = cache_dir()
    out: dict[str, tuple[int, int]] = {}
    for e in _files(root):
        try:
            size = e.stat(follow_symlinks=False).st_size
        except OSError:
            continue
        top = Path(e.path).relative_to(root).parts[0]
        n, b = out.get(top, (0, 0))
        out[top] = (n + 1, b + size)
    return out


def clear() -> tuple[int, int]:
    """Delete every file of the cache directory; (files, bytes) removed."""
    n = b = 0
    for e in _files(cache_dir()):
        try:
            size = e.stat(follow_symlinks=False).st_size
            os.unlink(e.path)
            n, b = n + 1, b + size
        except OSError:
            pass
    return n, b
