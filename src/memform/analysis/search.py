"""Strategy search: every valid parallel layout for N devices that fits, ranked.

The space is the product of *structural* choices (pipeline size, virtual chunks, schedule,
recompute mode, ZeRO stage) and *numeric* ones (tensor, data, context, expert degrees,
micro-batch size). Each structural combination is compiled once
(:class:`memform.compiled.CompiledModel`); its numeric candidates are generated as numpy
columns and evaluated in one exact, vectorized call. Only degrees the config's formula files
bind are searched (context/expert parallelism appear when a formula file declares
``parallel.cp`` / ``parallel.ep``).

Validity is the interpreter's: the formula files' ``require`` conditions, an even layer split
over ``pp × vpp`` (else that structure is skipped), ``dp·tp·pp·cp ≤ N`` (or ``= N`` with
``exact_devices``) and, when ``training.global_batch_size`` is set, ``micro_batch × dp``
dividing it (the micro-batch count is derived from it).
"""

from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from ..engine.binding import get_path
from ..engine.model import Model
from ..errors import MemformError
from .compiled import NUMERIC_KEYS, compile_structures

#: columns of a result row, in output order
FIELDS = ("dp", "tp", "pp", "vpp", "cp", "ep", "zero", "recompute", "schedule", "micro_batch_size",
          "num_micro_batches", "devices_used", "devices_wasted", "peak_bytes", "peak_gib", "peak_stage",
          "headroom_bytes", "stage_layers")
#: default ranking: fewest wasted devices, then the lowest peak
DEFAULT_SORT = ("devices_wasted", "peak_bytes")
_DEGREE_KEYS = {"dp": "parallel.dp", "tp": "parallel.tp", "cp": "parallel.cp", "ep": "parallel.ep",
                "micro_batch_size": "training.micro_batch_size"}


@dataclass
class SearchSpace:
    """What to enumerate. ``None`` for a degree means: not bound by the formulas, fixed at 1."""

    devices: int
    tp: list[int] | None
    pp: list[int]
    vpp: list[int]
    cp: list[int] | None
    ep: list[int] | None
    zero: list[int] | None
    recompute: list[str]
    schedules: list[str]
    micro_batch: list[int]
    exact_devices: bool = False
    dp_bound: bool = True


@dataclass
class SearchStats:
    structures: int = 0
    structures_skipped: dict[str, int] = field(default_factory=dict)
    candidates: int = 0          # numeric candidates generated (after device/batch arithmetic)
    evaluated: int = 0           # candidates whose memory was computed
    valid: int = 0
    fitting: int = 0
    compile_seconds: float = 0.0
    evaluate_seconds: float = 0.0
    total_seconds: float = 0.0


@dataclass
class SearchResult:
    """The valid, fitting strategies as columns (one numpy array per field of :data:`FIELDS`)."""

    columns: dict[str, np.ndarray]
    stats: SearchStats
    capacity_bytes: int

    def __len__(self) -> int:
        return len(self.columns["peak_bytes"])

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Every fitting strategy as a dict, in search order."""
        return self._dicts(np.arange(len(self)))

    def ranked(self, keys: Iterable[str] = DEFAULT_SORT, top: int | None = None) -> list[dict[str, Any]]:
        """The ``top`` best rows by ``keys`` (as :func:`rank`), sorting columns instead of dicts."""
        keys = list(keys)
        _check_sort(keys)
        order = np.arange(len(self))
        if len(self) and keys:
            sort_cols = []
            for key in reversed(keys):  # np.lexsort: the last key is the primary one
                col = self.columns[key.lstrip("-")]
                if col.dtype == object:
                    try:
                        col = col.astype(np.int64)
                    except (TypeError, ValueError):  # strings (recompute, schedule) or None
                        col = np.unique(col.astype(str), return_inverse=True)[1]
                sort_cols.append(-col if key.startswith("-") else col)
            order = np.lexsort(sort_cols)
        if top:
            order = order[:top]
        return self._dicts(order)

    def _dicts(self, idx: np.ndarray) -> list[dict[str, Any]]:
        cols = {f: self.columns[f][idx].tolist() for f in FIELDS}
        return [{f: cols[f][i] for f in FIELDS} for i in range(len(idx))]


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def default_space(model: Model, devices: int, **given: Any) -> SearchSpace:
    """The space for ``devices``: every divisor for each bound degree unless ``given``."""
    if devices < 1:
        raise MemformError(f"--devices must be a positive integer, got {devices}")
    bound = {k: model.symbol_for_key(key) is not None for k, key in _DEGREE_KEYS.items()}
    zero_bound = any(b.path == "parallel.zero" for b in model.program.bindings.values())
    divs = divisors(devices)
    st = model.structure

    def pick(name: str, default: list[Any] | None) -> Any:
        v = given.get(name)
        return default if v is None else v

    space = SearchSpace(
        devices=devices,
        tp=pick("tp", divs) if bound["tp"] else None,
        pp=pick("pp", divs),
        vpp=pick("vpp", sorted({1, st.vpp})),
        cp=pick("cp", divs) if bound["cp"] else None,
        ep=pick("ep", divs) if bound["ep"] else None,
        zero=pick("zero", [0, 1, 2, 3]) if zero_bound else None,
        recompute=pick("recompute", ["none", "selective", "full"]),
        schedules=pick("schedules", [st.schedule]),
        micro_batch=pick("micro_batch", [1, 2, 4, 8]) if bound["micro_batch_size"] else [1],
        exact_devices=bool(given.get("exact_devices", False)),
        dp_bound=bound["dp"],
    )
    for name in ("tp", "cp", "ep"):
        if given.get(name) is not None and getattr(space, name) is None:
            raise MemformError(f"--{name}: the formula files ({', '.join(model.data['formulas'])}) do not bind "
                               f"'{_DEGREE_KEYS[name]}', so it cannot be searched")
    for name in ("tp", "pp", "vpp", "cp", "ep", "micro_batch"):
        values = getattr(space, name)
        if values is not None and (not values or any(int(v) < 1 for v in values)):
            raise MemformError(f"--{name.replace('_', '-')}: values must be positive integers, got {values}")
    return space


def _numeric_grid(space: SearchSpace, pp: int, gbs: int | None, m_default: int) -> dict[str, np.ndarray]:
    """All numeric candidates for one pipeline size, as columns (device/batch arithmetic applied)."""
    n = space.devices
    tps = space.tp or [1]
    cps = space.cp or [1]
    parts = []
    for t, c in itertools.product(tps, cps):
        room = n // (t * pp * c)
        if room < 1:
            continue
        if not space.dp_bound:
            ds = np.array([1]) if not space.exact_devices or t * pp * c == n else np.array([], dtype=np.int64)
        elif space.exact_devices:
            ds = np.array([room]) if room * t * pp * c == n else np.array([], dtype=np.int64)
        else:
            ds = np.arange(1, room + 1)
        if len(ds):
            parts.append(np.stack([ds, np.full(len(ds), t), np.full(len(ds), c)], axis=1))
    if not parts:
        return {}
    base = np.concatenate(parts)
    eps = np.asarray(space.ep or [1])
    mbs = np.asarray(space.micro_batch)
    rows = len(base)
    grid = base[np.repeat(np.arange(rows), len(eps) * len(mbs))]
    ep_col = np.tile(np.repeat(eps, len(mbs)), rows)
    b_col = np.tile(mbs, rows * len(eps))
    d, t, c = grid[:, 0], grid[:, 1], grid[:, 2]
    if gbs is not None:
        ok = gbs % (b_col * d) == 0
        d, t, c, ep_col, b_col = d[ok], t[ok], c[ok], ep_col[ok], b_col[ok]
        m = gbs // (b_col * d)
    else:
        m = np.full(len(d), m_default)
    return {"parallel.dp": d, "parallel.tp": t, "parallel.cp": c, "parallel.ep": ep_col,
            "training.micro_batch_size": b_col, "training.num_micro_batches": m}


def search(model: Model, space: SearchSpace, *,
           progress: Callable[[int, int, SearchStats], None] | None = None, cache: bool = True) -> SearchResult:
    """Evaluate the whole space; rows (unsorted) for every candidate that is valid and fits.

    Each structure's compiled function comes from the on-disk cache when it is there
    (``cache=False``: compile every one, store nothing)."""
    start = time.perf_counter()
    stats = SearchStats()
    keys = tuple(k for k in NUMERIC_KEYS if model.symbol_for_key(k) is not None)
    gbs = get_path(model.data, "training.global_batch_size", None)
    m_default = int(get_path(model.data, "training.num_micro_batches", 1) or 1)
    capacity = model.structure.capacity_bytes
    structures = list(itertools.product(space.pp, space.vpp, space.schedules, space.recompute,
                                        space.zero if space.zero is not None else [None]))
    grids: dict[int, dict[str, np.ndarray]] = {}
    parts: dict[str, list[np.ndarray]] = {f: [] for f in FIELDS}
    body = body_layers(model)
    jobs = []
    for pp, vpp, schedule, recompute, zero in structures:
        split = stage_split(model, body, pp, vpp)
        if split is None:
            _skip(stats, f"more pipeline stages than the {body} body layers")
            continue
        overrides: dict[str, Any] = {"parallel.pp": pp, "parallel.vpp": vpp, "parallel.pp_schedule": schedule,
                                     "training.recompute": recompute, "parallel.devices": None,
                                     "parallel.stage_layers": split or None}
        if zero is not None:
            overrides["parallel.zero"] = zero
        if pp not in grids:
            grids[pp] = _numeric_grid(space, pp, gbs, m_default)
        cols = grids[pp]
        if not cols or not len(cols["parallel.dp"]):
            _skip(stats, "no numeric candidate fits the device count")
            continue
        jobs.append((pp, vpp, schedule, recompute, zero, split, overrides))
    t0 = time.perf_counter()
    compiled = compile_structures(model, [j[-1] for j in jobs], keys, cache=cache,
                                  progress=(lambda d, n: progress(d, n, stats)) if progress else None)
    stats.compile_seconds = time.perf_counter() - t0  # wall clock, cache reads and worker processes included
    for (pp, vpp, schedule, recompute, zero, split, _), cm in zip(jobs, compiled):
        if isinstance(cm, MemformError):
            _skip(stats, _first_line(cm))
            continue
        cols = grids[pp]
        stats.structures += 1
        n = len(cols["parallel.dp"])
        stats.candidates += n
        t0 = time.perf_counter()
        batch = cm(cols)
        peak = batch.peak
        fits = batch.valid & (peak <= capacity)
        stats.evaluate_seconds += time.perf_counter() - t0
        stats.evaluated += n
        stats.valid += int(batch.valid.sum())
        k = int(fits.sum())
        stats.fitting += k
        if not k:
            continue
        d, t, c = cols["parallel.dp"][fits], cols["parallel.tp"][fits], cols["parallel.cp"][fits]
        used = d * t * pp * c
        p = np.asarray(peak[fits], dtype=np.int64)
        found = {"dp": d, "tp": t, "pp": np.full(k, pp), "vpp": np.full(k, vpp), "cp": c,
                 "ep": cols["parallel.ep"][fits], "zero": np.full(k, zero, dtype=object),
                 "recompute": np.full(k, recompute, dtype=object), "schedule": np.full(k, schedule, dtype=object),
                 "micro_batch_size": cols["training.micro_batch_size"][fits],
                 "num_micro_batches": cols["training.num_micro_batches"][fits],
                 "devices_used": used, "devices_wasted": space.devices - used, "peak_bytes": p,
                 "peak_gib": np.round(p / 2 ** 30, 3), "peak_stage": batch.peak_stage[fits],
                 "headroom_bytes": capacity - p,
                 "stage_layers": np.full(k, ",".join(map(str, split)) if split else "", dtype=object)}
        for f in FIELDS:
            parts[f].append(np.asarray(found[f]))
    if progress:
        progress(len(structures), len(structures), stats)
    columns = {f: (np.concatenate(v) if v else np.array([], dtype=np.int64)) for f, v in parts.items()}
    stats.total_seconds = time.perf_counter() - start
    return SearchResult(columns, stats, capacity)


def body_layers(model: Model) -> int:
    """Layers of the stack that are split over the pipeline (all but ``first``/``last`` ones)."""
    from ..engine.model import stack_items
    return sum(i.count_value for i in stack_items(model, model.evaluator(keep=frozenset())) if i.place is None)


def stage_split(model: Model, body: int, pp: int, vpp: int) -> list[int] | None:
    """Body layers per stage: ``[]`` for Megatron's even split, a balanced list when it is uneven.

    The config's own ``parallel.stage_layers`` is kept for its own ``pp``. An uneven split puts
    the extra layers on the last stages, which hold the fewest in-flight micro-batches under
    1F1B (Narayanan et al. 2021 §2.2.1). None: more stages than layers.
    """
    if body % (pp * vpp) == 0:
        return []
    own = get_path(model.data, "parallel.stage_layers", None)
    if own is not None and len(own) == pp:
        return list(own)
    if pp > body:
        return None
    base, extra = divmod(body, pp)
    return [base + (1 if i >= pp - extra else 0) for i in range(pp)]


def _skip(stats: SearchStats, reason: str) -> None:
    stats.structures_skipped[reason] = stats.structures_skipped.get(reason, 0) + 1


def _first_line(exc: MemformError) -> str:
    return exc.message.splitlines()[0]


def rank(rows: Iterable[dict[str, Any]], keys: Iterable[str] = DEFAULT_SORT) -> list[dict[str, Any]]:
    """Sort by ``keys`` (field names; a leading ``-`` sorts that field descending)."""
    out = list(rows)
    keys = list(keys)
    _check_sort(keys)
    for key in reversed(keys):
        desc = key.startswith("-")
        name = key.lstrip("-")
        out.sort(key=lambda r: (r[name] is None, r[name] if r[name] is not None else 0), reverse=desc)
    return out


def _check_sort(keys: list[str]) -> None:
    for key in keys:
        if key.lstrip("-") not in FIELDS:
            raise MemformError(f"--sort: unknown field '{key.lstrip('-')}' (fields: {', '.join(FIELDS)})")


class StderrBar:
    """A one-line progress bar on stderr (only drawn when asked or when stderr is a terminal)."""

    def __init__(self, enabled: bool | None = None, width: int = 30):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.width = width

    def __call__(self, done: int, total: int, stats: SearchStats) -> None:
        if not self.enabled or total == 0:
            return
        filled = int(self.width * done / total)
        bar = "#" * filled + "." * (self.width - filled)
        sys.stderr.write(f"\r[{bar}] {done}/{total} structures, {stats.evaluated} candidates, "
                         f"{stats.fitting} fit")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()
