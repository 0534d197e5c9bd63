"""Which bundled formula files an imported config should name in ``formulas:``.

The choice is read from the formula files themselves, not from a table kept here: a file
"covers" a config key when its program (with its includes) binds that key. An imported dense
model gets ``dense.mf``; a config with MoE, MLA, MTP, CP or EP keys gets the smallest set of
bundled files that binds every key it uses. So a new architecture file is picked up by the
importers as soon as it declares the agreed keys (see the README's "Importing configs").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from pathlib import Path
from typing import Iterable

import yaml

from ..engine.config import STRUCTURAL
from ..errors import MemformError
from ..lang.loader import EVERY_KEY, load_program
from ..resources import data_dir, formulas_dir

BASE = "dense.mf"
#: used only while no bundled file binds a key: the names agreed for the new feature files
CONVENTIONAL = (
    ("model.num_experts", "moe.mf"), ("model.moe_", "moe.mf"), ("model.num_shared_experts", "moe.mf"),
    ("model.capacity_factor", "moe.mf"), ("model.first_k_dense", "moe.mf"), ("parallel.ep", "moe.mf"),
    ("parallel.expert_tp", "moe.mf"), ("model.moe_layer_freq", "moe.mf"), ("model.shared_expert_", "moe.mf"),
    ("model.attention", "mla.mf"), ("model.q_lora_rank", "mla.mf"),
    ("model.kv_lora_rank", "mla.mf"), ("model.qk_", "mla.mf"), ("model.v_head_dim", "mla.mf"),
)
_STRUCTURAL_KEYS = frozenset(k.path for k in STRUCTURAL)


@dataclass(frozen=True)
class Coverage:
    """The config keys one formula program binds, and whether it has a layer stack."""

    keys: frozenset[str]
    has_stack: bool


def _coverage(names: tuple[str, ...]) -> Coverage | None:
    """None when the files do not load (e.g. a colleague's file in the middle of an edit)."""
    # what a config that names these files can load: them, and what they include `when` a key is set
    # (every such include taken, e.g. dense.mf's offload-decoder.mf)
    try:
        prog = load_program([formulas_dir() / n for n in names], config=EVERY_KEY)
    except MemformError:
        return None
    return Coverage(frozenset(b.path for b in prog.bindings.values()), prog.stack is not None)


@lru_cache(maxsize=64)
def _cached(names: tuple[str, ...], stamp: tuple[float, ...]) -> Coverage | None:
    return _coverage(names)


def coverage(names: Iterable[str]) -> Coverage | None:
    names = tuple(names)
    stamp = tuple(_mtime(formulas_dir() / n) for n in names)
    return _cached(names, stamp)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return -1.0


def _config_orders() -> list[list[str]]:
    """The ``formulas:`` lists of the bundled configs (the team's order for combined files)."""
    try:
        folder = data_dir("configs")
    except FileNotFoundError:
        return []
    orders = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        listed = data.get("formulas") if isinstance(data, dict) else None
        if isinstance(listed, list) and all(isinstance(x, str) for x in listed):
            orders.append(listed)
    return orders


def bundled() -> list[str]:
    return sorted(p.name for p in formulas_dir().glob("*.mf"))


def choose(keys: Iterable[str]) -> tuple[list[str], list[str]]:
    """(formula files, keys none of them binds) for a config that sets ``keys``.

    Prefers ``dense.mf`` alone, then the single bundled file with a stack binding every key
    (the fewest bindings wins: the most specific file), then ``dense.mf`` or another stack
    file followed by one or two add-on files. Without any, falls back to the agreed file names.
    """
    wanted = {k for k in keys if k not in _STRUCTURAL_KEYS}
    base = coverage([BASE])
    if base is not None and wanted <= base.keys:
        return [BASE], []
    files = bundled()
    singles = []
    for name in files:
        cov = coverage([name])
        if cov is not None and cov.has_stack and wanted <= cov.keys:
            singles.append((len(cov.keys), name))
    if singles:
        return [min(singles)[1]], []
    stacks = [n for n in files if (c := coverage([n])) is not None and c.has_stack]
    stacks.sort(key=lambda n: (n != BASE, n))
    orders = _config_orders()
    for size in (1, 2):
        found = []
        for first in stacks:
            lacking = wanted - coverage([first]).keys
            # only files that bind something the first one lacks can help
            extras = [n for n in files if n != first and (c := coverage([n])) is not None and c.keys & lacking]
            for combo in combinations(extras, size):
                names = (first, *combo)
                cov = coverage(names)
                if cov is not None and cov.has_stack and wanted <= cov.keys:
                    found.append((len(cov.keys), stacks.index(first), names))
        if found:
            best = min(found)
            same = [names for n, _, names in found if n == best[0] and frozenset(names) == frozenset(best[2])]
            for order in orders:  # the order the bundled configs use for these files, if any does
                if tuple(order) in same:
                    return list(order), []
            return list(best[2]), []
    known = base.keys if base is not None else frozenset()
    missing = sorted(wanted - known)
    chosen = [BASE]
    for key in missing:
        for prefix, name in CONVENTIONAL:
            if key.startswith(prefix) and name not in chosen:
                chosen.append(name)
    return chosen, missing
