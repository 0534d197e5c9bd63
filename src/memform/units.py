"""Byte counts for people: binary units shared by the terminal, the reports and the analyses."""

from __future__ import annotations

from typing import Any

GIB = 2 ** 30
_UNITS = (("TiB", 2 ** 40), ("GiB", GIB), ("MiB", 2 ** 20), ("KiB", 2 ** 10))


def human_bytes(n: Any) -> str:
    """Bytes in binary units, e.g. ``56.95 GiB`` (no unit below 1 KiB)."""
    n = float(n)
    for unit, size in _UNITS:
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def signed_bytes(n: Any) -> str:
    """A difference in bytes with an explicit sign: ``+1.50 GiB``, ``-32.00 MiB``, ``0 B``."""
    n = float(n)
    if n == 0:
        return "0 B"
    return ("+" if n > 0 else "-") + human_bytes(abs(n))
