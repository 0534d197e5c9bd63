"""Byte counts for people: binary units shared by the terminal, the reports and the analyses."""

from __future__ import annotations

from typing import Any

GIB = 2 ** 30
_UNITS = (("EiB", 2 ** 60), ("PiB", 2 ** 50), ("TiB", 2 ** 40), ("GiB", GIB), ("MiB", 2 ** 20),
          ("KiB", 2 ** 10))
#: from 1024 EiB on there is no binary unit left: bytes in scientific notation
_SCIENTIFIC = 2 ** 70


def human_bytes(n: Any) -> str:
    """Bytes in binary units, e.g. ``56.95 GiB`` (no unit below 1 KiB; ``2.01e+23 B`` from 1024 EiB)."""
    n = float(n)
    if abs(n) >= _SCIENTIFIC:
        return f"{n:.2e} B"
    for unit, size in _UNITS:
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def common_unit(values: Any) -> tuple[str, int]:
    """The one binary unit a table's figures are printed in: the largest that the largest figure
    reaches (GiB for any real job), so that every cell is a short number; ``bytes`` below 1 KiB."""
    top = max((abs(v) for v in values), default=0)
    for unit, size in _UNITS:
        if top >= size:
            return unit, size
    return "bytes", 1


def signed_bytes(n: Any) -> str:
    """A difference in bytes with an explicit sign: ``+1.50 GiB``, ``-32.00 MiB``, ``0 B``."""
    n = float(n)
    if n == 0:
        return "0 B"
    return ("+" if n > 0 else "-") + human_bytes(abs(n))


def signed_seconds(x: Any) -> str:
    """A difference in seconds with an explicit sign, 3 significant digits: ``-3.44 s``, ``+0.12 s``."""
    return f"{float(x):+.3g} s"


_COUNTS = (("T", 10 ** 12), ("B", 10 ** 9), ("M", 10 ** 6), ("K", 10 ** 3))


def human_count(n: Any) -> str:
    """A count in decimal units, e.g. ``8.03 B`` for 8,030,261,248 parameters (``1.23e+21`` from 10^18)."""
    n = float(n)
    if abs(n) >= 10 ** 18:
        return f"{n:.2e}"
    for unit, size in _COUNTS:
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)}"
