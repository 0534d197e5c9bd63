"""The on-disk store of compiled structures, shared by ``memform estimate`` and ``memform search``.

Entries live in the cache directory (:mod:`memform.cachedir`: its size limit, atomic writes,
``--no-cache``) as ``PURPOSE/KEY[:2]/KEY.json``. The key is a SHA-256 of the structure
(:func:`structure_key`: memform's code, the formula files' contents, the config without its
input values). An entry records every formula file it was compiled from with its digest, and a
checksum of itself: one that does not parse, fails its checksum, names another key or format,
or whose files changed, is ignored (and rewritten by the caller), never trusted. Nothing here imports sympy.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..cachedir import CACHE_ENV, cache_dir, code_digest, digest, enabled, write_atomic  # noqa: F401 (re-exported)
from ..engine.config import formula_files
from ..resources import resolve_formula_path

#: bump when the entry layout or the meaning of its fields changes
FORMAT = 2


def structure_key(data: Mapping[str, Any], files: list[str], inputs: Sequence[str], purpose: str) -> str | None:
    """The SHA-256 naming ``data``'s structure for ``purpose`` (``estimate``, ``search``): the
    formula files' contents, memform's code and ``data`` with the ``inputs`` keys' values left
    out (a key the config lacks stays absent). None when the data cannot be written down."""
    stripped = copy.deepcopy(dict(data))
    for key in inputs:
        node = stripped
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node:
            node[leaf] = "<input>"
    digests = [digest(f) for f in files]
    if None in digests:
        return None
    try:
        text = json.dumps({"format": FORMAT, "purpose": purpose, "inputs": list(inputs), "code": code_digest(),
                           "files": list(zip(files, digests)), "data": stripped}, sort_keys=True, allow_nan=True)
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def _checksum(payload: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def entry_path(purpose: str, key: str) -> Path:
    return cache_dir() / purpose / key[:2] / f"{key}.json"


def read_entry(path: Path, key: str, load: Callable[[dict[str, Any]], Any]) -> tuple[Any, list[list[str]], str | None] | None:
    """A stored entry as ``(load(body), files, reason)`` (``load`` is not called for an
    uncompilable structure, whose body is None), or None when it is missing, corrupt, stale,
    of another format, or ``load`` fails on it (or the cache is switched off)."""
    if not enabled():
        return None
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        payload = {k: stored[k] for k in ("format", "key", "files", "body", "reason")}
        if stored.get("checksum") != _checksum(payload) or payload["format"] != FORMAT or payload["key"] != key:
            return None
        if any(digest(f) != d for f, d in payload["files"]):
            return None
        body = payload["body"]
        return (None if body is None else load(body)), payload["files"], payload["reason"]
    except (OSError, ValueError, KeyError, TypeError, SyntaxError, AttributeError, IndexError):
        return None


def write_entry(path: Path, key: str, files: list[list[str]], body: dict[str, Any] | None, reason: str | None) -> None:
    """Store an entry (``body`` None: uncompilable, for ``reason``); a failure only costs speed."""
    payload = {"format": FORMAT, "key": key, "files": files, "body": body, "reason": reason}
    write_atomic(path, json.dumps({**payload, "checksum": _checksum(payload)}).encode())


def formula_paths(data: Mapping[str, Any], source: Path | None) -> list[str]:
    """The resolved formula files a normalized config loads (its list, then its profile): what a
    structure key hashes, found without parsing them."""
    base = source.parent if source else Path.cwd()
    return [str(resolve_formula_path(f, base).resolve()) for f in formula_files(data)]


def file_digests(paths: Sequence[str]) -> list[list[str]]:
    """``[path, sha256]`` for each file a compiled entry came from (checked again on every hit)."""
    return [[p, digest(p) or ""] for p in paths]
