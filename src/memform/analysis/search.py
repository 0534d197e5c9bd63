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

When the formula files carry a time model (``cost`` blocks, formulas/time.mf, and a device with
peak FLOP/s), every row also has its estimated step time, MFU and tokens/s; plans are then ranked
by step time (memory breaks ties), tensor parallelism is kept inside a node, rows that differ
only in settings that change neither memory nor time are merged, the plans within
:data:`TIE_TOLERANCE` of the fastest step come first, simplest first, and plans both slower and
bigger than another are dropped outside that tolerance only (:meth:`SearchResult.plans`).
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
from ..engine.results import PS_PER_SECOND
from ..errors import MemformError
from ..fastpath.compiled import NUMERIC_KEYS, compile_structures
from ..fastpath.vecwalk import Fallback, VecStructure, numeric_twin, seen, walk_all

#: columns of a result row, in output order
FIELDS = ("dp", "tp", "pp", "vpp", "cp", "ep", "zero", "recompute", "schedule", "micro_batch_size",
          "num_micro_batches", "devices_used", "devices_wasted", "peak_bytes", "peak_gib", "peak_stage",
          "headroom_bytes", "step_seconds", "mfu", "tokens_per_second", "stage_layers", "equivalent")
#: the time model's columns (NaN without one)
TIME_FIELDS = ("step_seconds", "mfu", "tokens_per_second")
#: what merged rows share: the same devices, the same peak (bytes, stage) and the same step time
MERGE_KEY = ("devices_used", "peak_bytes", "peak_stage", "step_seconds")
#: the settings in which merged rows may differ (named in the kept row's ``equivalent``)
MERGEABLE = ("dp", "tp", "pp", "vpp", "cp", "ep", "zero", "recompute", "schedule", "micro_batch_size",
             "num_micro_batches", "stage_layers")
#: with a time model, the default listing drops plans whose step takes more than this many times the
#: best plan's: a 0.1 %-MFU plan is never the answer, however little memory it takes (--all keeps it)
FAR_FROM_BEST = 2.0
#: plans whose estimated step is within this fraction of the fastest one's are ranked by simplicity
#: first: the time model's error differs by up to 3.9 points between one model's runs under different
#: layouts (``python bench/throughput.py``: Korthikanti et al. 2022's 530B rows at +14.0, +16.1 and
#: +17.9 %), so a smaller difference does not say which plan is faster, and the simpler plan is the
#: one a practitioner would run
TIE_TOLERANCE = 0.05
#: context parallelism on sequences shorter than this is the less usual choice: published runs use it
#: mostly for long context (Llama 3 §3.3.2: CP 16 for the 131K-token stage, none at 8K; DeepSeek-V3
#: §3.2 trains 4K sequences without it), though not only (NVIDIA's Llama 3.1 405B recipes run CP 2 at
#: 8K): one point more, not a refusal
LONG_CONTEXT = 32768
#: default ranking without a time model: fewest wasted devices, then the lowest peak
DEFAULT_SORT = ("devices_wasted", "peak_bytes")
#: default ranking with one: the shortest step, then the lowest peak
TIME_SORT = ("step_seconds", "peak_bytes")
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
    #: devices per node: tp (and with ep_in_node, expert-tp × ep) groups are kept inside one; None: no limit
    node: int | None = None
    ep_in_node: bool = False
    expert_tp: int | None = None       # the config's parallel.expert_tp (None: follows tp)


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
    timed: bool = False   # rows carry step_seconds / mfu / tokens_per_second
    seq_length: int | None = None  # the model's sequence length (context parallelism on short ones is exotic)

    def __len__(self) -> int:
        return len(self.columns["peak_bytes"])

    @property
    def default_sort(self) -> tuple[str, ...]:
        return TIME_SORT if self.timed else DEFAULT_SORT

    def plans(self, keys: Iterable[str] | None = None, top: int | None = None, *,
              keep_all: bool = False) -> list[dict[str, Any]]:
        """Ranked rows as a planner wants them: equivalent rows merged (the first in rank order
        stands for the others, its ``equivalent`` naming them) and, with a time model and unless
        ``keep_all``, plans dominated in (step time, peak memory) or slower than
        :data:`FAR_FROM_BEST` × the fastest dropped; then the ``top`` best. With a time model and the
        default ranking, the plans within :data:`TIE_TOLERANCE` of the fastest step come first, the
        simplest first (:func:`complexity`), and dominance drops plans only outside that band: the
        time model cannot tell its plans apart, so no layout in it is dropped for being slower than
        another (by 0.5 %, say). A band plan that a no less simple one beats in both step time and
        peak memory is listed after the band's other plans and before the rest, its ``why`` naming the
        plan that beats it and by how much; only a variant of a layout listed anyway (another ZeRO
        stage, recompute mode or micro-batch size that a no less simple variant of it beats in both) is
        dropped. The first plan's ``why`` says what put it first."""
        rows = self.ranked(self.default_sort if keys is None else keys)
        if self.timed and keys is None:  # of equal plans the simplest stands for the others
            rows.sort(key=lambda r: (r["step_seconds"], r["peak_bytes"], complexity(r, self.seq_length)[0]))
        rows = merge_equivalent(rows)
        band: list[dict[str, Any]] = []
        if self.timed and keys is None:
            band, rows = simplest_first(rows, self.seq_length)
        if self.timed and not keep_all:
            band, beaten = _band_front(_layout_front(band), self.seq_length)
            front = set(map(id, pareto_front(band + beaten + rows)))
            fastest = min((r["step_seconds"] for r in band + rows if r["step_seconds"] is not None), default=None)
            rows = [r for r in rows if id(r) in front
                    and (fastest is None or r["step_seconds"] is None or r["step_seconds"] <= FAR_FROM_BEST * fastest)]
            rows = beaten + rows   # inside the tolerance, then the plans clearly slower
        rows = band + rows
        return rows[:top] if top else rows

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
        rows = [{f: cols[f][i] for f in FIELDS} for i in range(len(idx))]
        if not self.timed:
            for r in rows:
                for f in TIME_FIELDS:
                    r[f] = None
        return rows


def merge_equivalent(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows on the same devices with the same peak (bytes and stage) and the same step time are one
    answer: the first (in the given order) stays, its ``equivalent`` field naming the settings of the
    others where they differ -- ``recompute=selective`` where flash attention keeps what selective
    recompute would drop, ``dp=8,cp=2,micro_batch_size=4`` where context parallelism splits what a
    larger micro-batch adds. Without a time model only rows equal in every other field merge."""
    kept: dict[tuple, dict[str, Any]] = {}
    out = []
    for r in rows:
        key = tuple(r[f] for f in (MERGE_KEY if r["step_seconds"] is not None else
                                   [f for f in FIELDS if f not in ("zero", "recompute", "schedule", "equivalent")]))
        first = kept.get(key)
        if first is None:
            r = dict(r, equivalent="")
            kept[key] = r
            out.append(r)
            continue
        diff = ",".join(f"{f}={r[f]}" for f in MERGEABLE if r[f] != first[f])
        if diff and diff not in first["equivalent"].split(" | "):
            first["equivalent"] = f"{first['equivalent']} | {diff}" if first["equivalent"] else diff
    return out


def pareto_front(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows no other row beats in both step time and peak bytes (ties kept), in the given order."""
    timed = [r for r in rows if r["step_seconds"] is not None]
    order = sorted(timed, key=lambda r: (r["step_seconds"], r["peak_bytes"]))
    front, best = [], None
    i = 0
    while i < len(order):  # rows of one step time together: each is beaten only by a faster or smaller one
        j = i
        while j < len(order) and order[j]["step_seconds"] == order[i]["step_seconds"]:
            j += 1
        group = order[i:j]
        low = min(r["peak_bytes"] for r in group)
        if best is None or low < best:
            front.extend(r for r in group if r["peak_bytes"] == low)
            best = low
        i = j
    ids = set(map(id, front))
    return [r for r in rows if id(r) in ids]


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
    # groups kept inside a node: tensor parallelism by default (its collectives sit between
    # dependent GEMMs; Narayanan et al. 2021 §3.3: "tensor model parallelism within a node")
    node = None if given.get("tp_across_nodes") else model.value_for_key("device.devices_per_node")
    node = int(node) if node is not None else None

    def pick(name: str, default: list[Any] | None) -> Any:
        v = given.get(name)
        return default if v is None else v

    space = SearchSpace(
        devices=devices,
        tp=pick("tp", [k for k in divs if node is None or k <= node]) if bound["tp"] else None,
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
        node=node,
        ep_in_node=bool(given.get("ep_in_node", False)),
        expert_tp=get_path(model.data, "parallel.expert_tp", None),
    )
    if space.ep_in_node and node is None:
        raise MemformError("--ep-in-node: the formula files bind no device.devices_per_node")
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
    if space.ep_in_node and space.node is not None:  # expert-tp × ep ranks inside one node
        ok = ep_col * (space.expert_tp if space.expert_tp else t) <= space.node
        d, t, c, ep_col, b_col = d[ok], t[ok], c[ok], ep_col[ok], b_col[ok]
    if gbs is not None:
        ok = gbs % (b_col * d) == 0
        d, t, c, ep_col, b_col = d[ok], t[ok], c[ok], ep_col[ok], b_col[ok]
        m = gbs // (b_col * d)
    else:
        m = np.full(len(d), m_default)
    return {"parallel.dp": d, "parallel.tp": t, "parallel.cp": c, "parallel.ep": ep_col,
            "training.micro_batch_size": b_col, "training.num_micro_batches": m}


def search(model: Model, space: SearchSpace, *,
           progress: Callable[[int, int, SearchStats], None] | None = None, cache: bool = True,
           compile: bool | None = None) -> SearchResult:
    """Evaluate the whole space; rows (unsorted) for every candidate that is valid and fits.

    Each structure's compiled function comes from the on-disk cache when it is there
    (``cache=False``: store nothing, read nothing). A structure not there is evaluated by the
    numeric walk over its candidate columns (:mod:`memform.fastpath.vecwalk`: no sympy, no compile;
    the same rows) and compiled only where that walk cannot decide it row by row, or (``compile``
    None) once it has been searched :data:`COMPILE_AFTER` times, when compiling has paid back;
    ``compile=True`` compiles every structure not cached, ``compile=False`` none that the walk
    can evaluate."""
    start = time.perf_counter()
    stats = SearchStats()
    keys = tuple(k for k in NUMERIC_KEYS if model.symbol_for_key(k) is not None)
    gbs = get_path(model.data, "training.global_batch_size", None)
    if gbs is None and (get_path(model.data, "device.peak_flops_bf16", 0) or 0) > 0:
        # rows of different micro-batch × dp would be steps of different sizes: their times do not compare
        raise MemformError(f"{model.structure.name}: search ranks plans by step time, which compares only at "
                           f"one global batch, and training.global_batch_size is not set: add it to the config "
                           f"or pass --set training.global_batch_size=N (sequences per optimizer step)")
    m_default = int(get_path(model.data, "training.num_micro_batches", 1) or 1)
    capacity = model.structure.capacity_bytes
    for key, value in (("training.global_batch_size", gbs), ("training.num_micro_batches", m_default)):
        if isinstance(value, int) and value >= 2 ** 62:  # the candidates' columns are 64-bit integers
            raise MemformError(f"config key '{key}' must be below 2^62 for a search (its candidate columns are "
                               f"64-bit integers), got {value}")
    if capacity >= 2 ** 63:  # the columns hold bytes in 64-bit integers (the peaks, the headroom)
        raise MemformError(f"config key 'device.capacity_gib' must be below 2^33 GiB for a search (its columns "
                           f"hold bytes in 64-bit integers), got {get_path(model.data, 'device.capacity_gib', None)}")
    structures = list(itertools.product(space.pp, space.vpp, space.schedules, space.recompute,
                                        space.zero if space.zero is not None else [None]))
    grids: dict[int, dict[str, np.ndarray]] = {}
    parts: dict[str, list[np.ndarray]] = {f: [] for f in FIELDS}
    body = body_layers(model)
    timed = False
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
    compiled = _structures(model, [j[-1] for j in jobs], keys, cache, compile,
                           (lambda d, n: progress(d, n, stats)) if progress else None)
    stats.compile_seconds = time.perf_counter() - t0  # wall clock, cache reads and worker processes included
    t0 = time.perf_counter()
    walked = iter(walk_all([(cm, grids[j[0]]) for j, cm in zip(jobs, compiled) if isinstance(cm, VecStructure)]))
    stats.evaluate_seconds += time.perf_counter() - t0  # wall clock, worker processes included
    for (pp, vpp, schedule, recompute, zero, split, overrides), cm in zip(jobs, compiled):
        cols = grids[pp]
        batch = None
        if isinstance(cm, VecStructure):
            batch = next(walked)
            if isinstance(batch, Fallback):  # not decidable row by row: compiled, as before
                t0 = time.perf_counter()
                cm = compile_structures(model, [overrides], keys, cache=cache, workers=1)[0]
                stats.compile_seconds += time.perf_counter() - t0
                batch = None
        if isinstance(cm, MemformError):
            _skip(stats, _first_line(cm))
            continue
        stats.structures += 1
        n = len(cols["parallel.dp"])
        stats.candidates += n
        t0 = time.perf_counter()
        if batch is None:
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
        step = mfu = tps = np.full(k, np.nan)
        if batch.step_ps is not None:
            ps = np.asarray(batch.step_ps[fits], dtype=np.float64)
            if (ps > 0).any():
                timed = True
                with np.errstate(divide="ignore", invalid="ignore"):
                    step = np.where(ps > 0, ps / PS_PER_SECOND, np.nan)
                    mfu = np.round(np.asarray(batch.ideal[fits], dtype=np.float64) / cm.stages / ps, 4)
                    tps = np.round(np.asarray(batch.tokens[fits], dtype=np.float64) / step, 1)
                step = np.round(step, 6)
        found = {"dp": d, "tp": t, "pp": np.full(k, pp), "vpp": np.full(k, vpp), "cp": c,
                 "ep": cols["parallel.ep"][fits], "zero": np.full(k, zero, dtype=object),
                 "recompute": np.full(k, recompute, dtype=object), "schedule": np.full(k, schedule, dtype=object),
                 "micro_batch_size": cols["training.micro_batch_size"][fits],
                 "num_micro_batches": cols["training.num_micro_batches"][fits],
                 "devices_used": used, "devices_wasted": space.devices - used, "peak_bytes": p,
                 "peak_gib": np.round(p / 2 ** 30, 3), "peak_stage": batch.peak_stage[fits],
                 "headroom_bytes": capacity - p, "step_seconds": step, "mfu": mfu, "tokens_per_second": tps,
                 "stage_layers": np.full(k, ",".join(map(str, split)) if split else "", dtype=object),
                 "equivalent": np.full(k, "", dtype=object)}
        for f in FIELDS:
            parts[f].append(np.asarray(found[f]))
    if progress:
        progress(len(structures), len(structures), stats)
    columns = {f: (np.concatenate(v) if v else np.array([], dtype=np.int64)) for f, v in parts.items()}
    stats.total_seconds = time.perf_counter() - start
    seq = get_path(model.data, "model.seq_length", None)
    return SearchResult(columns, stats, capacity, timed, seq if isinstance(seq, int) else None)


#: a structure is compiled (and stored) once it has been searched this many times without a compiled
#: entry: compiling costs ~0.10 CPU-s per llama3-70b structure, the numeric walk ~0.04 s and a stored
#: compiled structure ~0.005 s per search, so compiling pays back from the third search on
#: (``python bench/search_speed.py`` prints the three)
COMPILE_AFTER = 2


def _structures(model: Model, overrides: list[dict[str, Any]], keys: tuple[str, ...], cache: bool,
                compile: bool | None, progress: Callable[[int, int], None] | None) -> list[Any]:
    """Per structure: its stored compiled function, a :class:`VecStructure` to walk, or the
    :class:`MemformError` that refuses it."""
    if compile is True:
        return compile_structures(model, overrides, keys, cache=cache, progress=progress)
    out: list[Any] = compile_structures(model, overrides, keys, cache=cache, compile=False)
    missing = [i for i, cm in enumerate(out) if cm is None]
    if compile is None and cache and missing:
        due = [i for i in missing if seen(model, overrides[i], keys) >= COMPILE_AFTER]
        if due:
            for i, cm in zip(due, compile_structures(model, [overrides[i] for i in due], keys, cache=cache)):
                out[i] = cm
            missing = [i for i in missing if out[i] is None]
    if missing:
        base = numeric_twin(model)
        for i in missing:   # rebound where walked (a refused one falls back to the compiler and its message)
            out[i] = VecStructure(base, keys, overrides[i])
    if progress:
        progress(len(out), len(out))
    return out


def complexity(row: dict[str, Any], seq_length: int | None = None) -> tuple[int, list[str]]:
    """How unusual a plan is, and what makes it so: a point for each parallel dimension beyond data
    parallelism (tp, pp, cp, an interleaved pipeline) and for ZeRO-3 (every parameter
    all-gathered per micro-batch: PP is the published choice at scale), one more for context
    parallelism on sequences shorter than :data:`LONG_CONTEXT`. Expert parallelism is no point: it
    shards the experts over ranks that are data-parallel already (Megatron-Core's expert groups are
    carved from the dp × cp ranks; no device dimension of its own), and it is how every published MoE
    run trains (DeepSeek-V3 §3.2: EP 64; Megatron-Bridge's Qwen3-30B-A3B recipes: EP 8)."""
    traits = [name for name, on in (("tp", row["tp"] > 1), ("pp", row["pp"] > 1), ("cp", row["cp"] > 1),
                                    ("interleaving", row["vpp"] > 1), ("ZeRO-3", row.get("zero") == 3)) if on]
    points = len(traits)
    if row["cp"] > 1 and seq_length is not None and seq_length < LONG_CONTEXT:
        points += 1
        traits.append(f"context parallelism on {seq_length:,}-token sequences")
    return points, traits


def simplest_first(rows: list[dict[str, Any]], seq_length: int | None) -> tuple[list[dict[str, Any]],
                                                                              list[dict[str, Any]]]:
    """(the plans within :data:`TIE_TOLERANCE` of the fastest step, simplest first; the rest, in
    their given order). The first plan of the band gets a ``why`` entry: what put it first."""
    steps = [r["step_seconds"] for r in rows if r["step_seconds"] is not None]
    if not steps:
        return [], rows
    fastest = min(steps)
    limit = fastest * (1 + TIE_TOLERANCE)
    band = [r for r in rows if r["step_seconds"] is not None and r["step_seconds"] <= limit]
    rest = [r for r in rows if not (r["step_seconds"] is not None and r["step_seconds"] <= limit)]
    band.sort(key=lambda r: (complexity(r, seq_length)[0], r["step_seconds"], r["peak_bytes"]))
    if band:
        first, quick = band[0], min(band, key=lambda r: (r["step_seconds"], r["peak_bytes"]))
        traits = complexity(first, seq_length)[1]
        others = len({layout(r) for r in band} - {layout(first)})
        if first["step_seconds"] > fastest:
            simpler = [t for t in complexity(quick, seq_length)[1] if t not in traits]
            why = (f"the simplest of the {len(band)} plans within {TIE_TOLERANCE:.0%} of the fastest step "
                   f"({quick['step_seconds']:.4g} s), which the time model cannot tell apart: "
                   + (f"no {', no '.join(simpler)}" if simpler else "fewer parallel dimensions"))
        elif others:
            why = (f"the fastest step, and none of the {others} other layout{'s' if others > 1 else ''} within "
                   f"{TIE_TOLERANCE:.0%} of it is simpler")
        else:
            why = f"the fastest step; no other layout comes within {TIE_TOLERANCE:.0%} of it"
        band[0] = dict(first, why=f"{why}; beyond plain data parallelism it uses "
                                  + (", ".join(traits) if traits else "nothing"))
    return band, rest


def layout(row: dict[str, Any]) -> tuple[Any, ...]:
    """A plan's parallel layout: its degrees (dp, tp, pp, vpp, cp, ep), without the settings
    (ZeRO stage, recompute, micro-batch size) that run on it."""
    return tuple(row[f] for f in ("dp", "tp", "pp", "vpp", "cp", "ep"))


def _layout_front(band: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The band's plans (in its order: simplest first) less those that an earlier plan -- no less
    simple -- of the same parallel layout beats in both step time and peak memory."""
    kept: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    out: list[dict[str, Any]] = []
    for r in band:
        same = kept.setdefault(layout(r), [])
        if not any(o["step_seconds"] <= r["step_seconds"] and o["peak_bytes"] <= r["peak_bytes"] for o in same):
            same.append(r)
            out.append(r)
    return out


def _band_front(band: list[dict[str, Any]], seq_length: int | None) -> tuple[list[dict[str, Any]],
                                                                              list[dict[str, Any]]]:
    """(the band's plans that no earlier plan -- one no less simple -- beats in both step time and
    peak memory, in the band's order; the layouts such a plan beats, not listed by another variant,
    each with a ``why`` naming what beats it). Inside :data:`TIE_TOLERANCE` the step times do not say
    which plan is faster, so the beaten ones are listed (after the others of the band), not dropped."""
    front: list[dict[str, Any]] = []
    beaten: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for r in band:
        by = next((o for o in front if o["step_seconds"] <= r["step_seconds"] and o["peak_bytes"] <= r["peak_bytes"]),
                  None)
        if by is None:
            front.append(r)
        else:
            beaten.append((r, by))
    listed = {layout(r) for r in front}
    out = []
    for r, by in beaten:
        if layout(r) in listed:
            continue
        listed.add(layout(r))
        what = " ".join(f"{k}{by[k]}" for k in ("tp", "pp", "dp", "cp", "vpp") if by[k] != 1 or k == "dp")
        slower = 100 * (r["step_seconds"] / by["step_seconds"] - 1)
        smaller = (r["peak_bytes"] - by["peak_bytes"]) / 2 ** 30
        out.append(dict(r, why=(
            f"within {TIE_TOLERANCE:.0%} of the fastest step, so listed, after {what} (ZeRO-{by['zero']}, "
            f"recompute {by['recompute']}, micro-batch {by['micro_batch_size']}), "
            f"{'as simple' if complexity(by, seq_length)[0] == complexity(r, seq_length)[0] else 'simpler'}, "
            + (f"{slower:.1f} % faster" if slower > 0 else "as fast")
            + (f" and {smaller:.2f} GiB smaller" if smaller > 0 else " and no larger"))))
    return front, out


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
    """The search's progress bar on stderr, drawn by tqdm (when asked, or when stderr is a terminal):
    structures compiled or read from the cache, candidates evaluated, plans that fit."""

    def __init__(self, enabled: bool | None = None):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._bar: Any = None

    def __call__(self, done: int, total: int, stats: SearchStats) -> None:
        if not self.enabled or total == 0:
            return
        if self._bar is None:
            from tqdm import tqdm
            self._bar = tqdm(total=total, unit=" structures", file=sys.stderr, dynamic_ncols=True,
                             mininterval=0.1, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} structures "
                                                         "[{elapsed}<{remaining}{postfix}]")
        self._bar.n = done
        self._bar.set_postfix_str(f"{stats.evaluated} candidates, {stats.fitting} fit", refresh=False)
        self._bar.refresh()
        if done >= total:
            self._bar.close()
            self._bar = None
