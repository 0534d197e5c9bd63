"""A config's stage peaks compiled once per *structural* choice, evaluated for many candidates.

Structural settings (pipeline size, virtual chunks, schedule, recompute mode, ZeRO stage)
change the stage partition or the substituted options, so each combination is compiled on
its own: the interpreter runs once with ``resolve=False`` (``Piecewise``/``Min``/``Max`` kept,
so the closed form is valid for *every* value) keeping only the numeric config keys being
varied (tensor/data/context/expert degrees, micro-batch size and count) as symbols. The
per-stage, per-category expressions and the formula files' ``require`` conditions are then
compiled by :mod:`memform.fastpath.exact` into one function over integer arrays.

The result equals what :func:`memform.estimate_model` gives for each candidate, byte for byte
(every category rounded up to whole bytes, as :func:`memform.engine.to_bytes` does). Step times
are the exception: float64 (relative error ~1e-15; see :mod:`memform.fastpath.exact`).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import pickle
import queue as _queue
import time
import traceback
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import sympy

from ..engine.config import NUMERIC_KEYS, apply_overrides  # noqa: F401 (NUMERIC_KEYS re-exported)
from ..engine.evaluator import Ctx, Evaluator
from ..engine.interpreter import CATEGORIES, PS_PER_SECOND, Interpreter
from ..engine.model import Model, estimate_model, partition_of, rebind
from ..engine.walker import LayerSlot
from .sharedmemo import SharedMemo
from ..errors import MemformError
from .cachestore import entry_path, file_digests, formula_paths, read_entry, structure_key, write_entry
from .exact import ExactFunction, NotExact, compile_exact, load_exact



def time_flags(before: int, times: Sequence[Any]) -> list[bool]:
    """compile_exact's ``approximate`` flags for ``before`` exact outputs followed by the time forms
    (CompiledModel.times): each stage's step and the ideal picoseconds in float64, as the search ranks
    them (Batch.times), the tokens per step exact; nothing approximate without a time model."""
    return [False] * before + [True] * (len(times) - 1) + [False] * bool(times)


@dataclass
class Batch:
    """Exact results for ``n`` candidates of one structural combination.

    Per-category arrays are kept as computed; the (n, stages, categories) table is only
    assembled when asked for (a search needs just the stage sums).
    """

    valid: np.ndarray          # bool (n,): every require holds and every value is a finite, non-negative size
    reasons: list[str]         # messages of the requires that failed for some candidate
    outputs: list[np.ndarray]  # stage-major: stage 0 params, grads, ..., stage 1 params, ...
    stages: int
    #: with a time model: each stage's step time in picoseconds (float64, rounded up once per
    #: stage; the estimate rounds each cost block exactly: a few picoseconds apart), the stages'
    #: summed ideal picoseconds (MFU, float64) and the tokens per step (exact); None without one
    times: list[np.ndarray] | None = None
    ideal: np.ndarray | None = None
    tokens: np.ndarray | None = None

    @cached_property
    def step_ps(self) -> np.ndarray | None:
        """The slowest stage's step time per candidate, picoseconds (None without a time model)."""
        if self.times is None:
            return None
        table = np.stack(self.times)
        return (_narrow(table) if table.dtype == object else table).max(axis=0)

    @cached_property
    def values(self) -> np.ndarray:
        """Whole bytes, shape (n, stages, len(CATEGORIES))."""
        n = len(self.valid)
        table = np.stack(self.outputs, axis=1)
        if table.dtype == object:
            table = _narrow(table)
        return table.reshape(n, self.stages, len(CATEGORIES))

    @cached_property
    def _by_stage(self) -> np.ndarray:
        k = len(CATEGORIES)
        sums = [sum(self.outputs[s * k + 1:(s + 1) * k], self.outputs[s * k]) for s in range(self.stages)]
        table = np.stack(sums)  # (stages, n), contiguous per stage
        return _narrow(table) if table.dtype == object else table

    @property
    def stage_peaks(self) -> np.ndarray:
        """Peak bytes per candidate and stage, shape (n, stages)."""
        return self._by_stage.T

    @cached_property
    def peak(self) -> np.ndarray:
        return self._by_stage.max(axis=0)

    @cached_property
    def peak_stage(self) -> np.ndarray:
        """The first stage with the largest peak (as :attr:`memform.Estimate.peak_stage`)."""
        return self._by_stage.argmax(axis=0)


@dataclass
class CompiledModel:
    """One structural combination of a config, ready for vectorized numeric candidates."""

    model: Model
    keys: tuple[str, ...]              # config keys supplied per candidate, in column order
    symbols: tuple[sympy.Symbol, ...]
    stages: int
    exprs: list[dict[str, sympy.Expr]]  # per stage, per category (valid for all values)
    requires: list[tuple[str, Any]]     # (message, sympy condition) left open by the structure
    function: ExactFunction
    compile_seconds: float
    timed: bool = False                 # outputs carry the step-time model (see Batch.times)
    extra: Any = None                   # what compile_structures' ``extra`` added (JSON-ready)
    #: with a time model: each stage's step picoseconds, the stages' summed ideal picoseconds and
    #: the tokens per step, as closed forms (the outputs after the categories; empty when read back)
    times: list[sympy.Expr] = field(default_factory=list)
    #: the walk that built it (:meth:`build`'s ``prior`` for the next structure); None when read back
    evaluator: Any = field(default=None, repr=False, compare=False)
    #: the stage partition it was built on (:func:`memform.engine.model.partition_of`); None when read back
    partition: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def build(cls, model: Model, keys: Sequence[str], prior: Any = None, numpy: bool = True) -> "CompiledModel":
        """Compile ``model``'s structure over ``keys``. ``prior``: the :attr:`evaluator` of another
        structure of the same program built just before, whose closed forms this walk takes where
        what they read is equal (:mod:`memform.fastpath.sharedmemo`); this walk's is kept as
        :attr:`evaluator` on the result. ``numpy=False``: the closed forms alone, no numpy function
        (``function`` None: for a caller that compiles them otherwise, the what-if page's JavaScript)."""
        start = time.perf_counter()
        symbols = []
        for k in keys:
            sym = model.symbol_for_key(k)
            if sym is None:
                raise MemformError(f"config key '{k}' is not bound to a symbol by the formula files "
                                   f"({', '.join(model.data['formulas'])})")
            symbols.append(sym)
        derived = _derived_symbols(model, frozenset(s.name for s in symbols))
        keep = frozenset(s.name for s in symbols) | frozenset(derived)
        ev = _SharingEvaluator(model.program, model.bound.symbols, model.bound.values, model.bound.options,
                               resolve=False, keep=keep)
        part = partition_of(model, ev)
        for i in range(model.structure.pp):  # every stage's layers, before anything reads them
            ev.stage_layers[i] = tuple(LayerSlot(c.index, g.block, g.mode, g.count, g.first_layer, g.bindings)
                                       for c in part.chunks[i] for g in c.groups)
        ev.share(prior)
        interp = Interpreter(model.program, ev, model.structure.schedule)
        est = _Stages([interp.stage(i, part, model.structure.capacity_bytes) for i in range(model.structure.pp)])
        follow = _follow(model, derived)
        requires = []
        for r in model.program.requires:
            cond = ev.truth(ev.eval(r.expr, Ctx()), r.loc)
            if cond is False:
                raise MemformError(f"{r.message} (requirement at {r.loc}, for every candidate of this structure)")
            if cond is not True:
                requires.append((r.message, _substitute(cond, follow)))
        exprs = [{c: _substitute(e, follow) for c, e in s.exprs.items()} for s in est.stages]
        timed = any(s.time_exprs for s in est.stages)
        times = ([_substitute(s.step_expr * PS_PER_SECOND, follow) for s in est.stages]
                 + [_substitute(sympy.Add(*(s.ideal_expr for s in est.stages)) * PS_PER_SECOND, follow),
                    _substitute(est.stages[0].tokens_expr, follow)]) if timed else []
        flat = [e[c] for e in exprs for c in CATEGORIES] + times + [c for _, c in requires]
        try:
            fn = compile_exact(flat, symbols, time_flags(len(exprs) * len(CATEGORIES), times)) if numpy else None
        except NotExact as exc:
            raise not_exact(keys, exc) from None
        out = cls(model, tuple(keys), tuple(symbols), len(exprs), exprs, requires, fn,
                  time.perf_counter() - start, timed, times=times)
        out.evaluator = ev
        out.partition = part
        return out

    @classmethod
    def from_body(cls, body: Mapping[str, Any], seconds: float = 0.0) -> "CompiledModel":
        """A compiled structure from its stored form (no closed forms: ``model``/``exprs`` None)."""
        fn = load_exact(body["inputs"], body["source"], body.get("code")) if body["source"] is not None else None
        return cls(None, tuple(body["keys"]), (), body["stages"], None, [(m, None) for m in body["requires"]],
                   fn, seconds, bool(body.get("timed", False)), body.get("extra"))

    def body(self) -> dict[str, Any]:
        """What :meth:`from_body` needs, JSON-ready (for the cache and for worker processes)."""
        fn = self.function
        return {"keys": list(self.keys), "inputs": list(fn.inputs) if fn else [s.name for s in self.symbols],
                "source": fn.source if fn else None, "stages": self.stages,
                "requires": [m for m, _ in self.requires], "timed": self.timed, "code": fn.code_text() if fn else None}

    def __call__(self, columns: Mapping[str, Any]) -> Batch:
        cols = [np.asarray(columns[k]) for k in self.keys]
        n = len(cols[0]) if cols else 1
        outs, bad = self.function(cols)
        ncat = len(CATEGORIES)
        nvals = self.stages * ncat
        values = [o if isinstance(o, np.ndarray) and o.shape == (n,) else np.broadcast_to(o, (n,))
                  for o in outs[:nvals]]
        valid = ~bad
        for v in values:
            if v.size and v.min() < 0:  # the interpreter refuses negative sizes
                valid &= v >= 0
        ntime = self.stages + 2 if self.timed else 0
        timing = [o if isinstance(o, np.ndarray) and o.shape == (n,) else np.broadcast_to(o, (n,))
                  for o in outs[nvals:nvals + ntime]]
        for v in timing:
            if v.size and v.min() < 0:
                valid &= v >= 0
        reasons = []
        for (message, _), ok in zip(self.requires, outs[nvals + ntime:]):
            ok = np.broadcast_to(ok, (n,))
            if not ok.all():
                reasons.append(message)
            valid &= ok
        if not self.timed:
            return Batch(valid, reasons, values, self.stages)
        return Batch(valid, reasons, values, self.stages, timing[:self.stages], timing[self.stages],
                     timing[self.stages + 1])


def not_exact(keys: Sequence[str], exc: Exception) -> MemformError:
    """The refusal of a structure whose closed form integer arithmetic cannot evaluate exactly."""
    return MemformError(f"the closed form cannot be evaluated exactly in integers for "
                        f"{', '.join(keys)} ({exc}); use 'memform estimate' per value instead")


class _SharingEvaluator(SharedMemo, Evaluator):
    """The sympy walk, taking closed forms from the previous structure's walk where it can."""


@dataclass
class _Stages:
    stages: list[Any]


def compile_structures(model: Model, overrides: Sequence[Mapping[str, Any]], keys: Sequence[str], *,
                       cache: bool = True, workers: int | None = None,
                       progress: Callable[[int, int], None] | None = None, purpose: str = "search",
                       extra: Callable[[Model, "CompiledModel"], Any] | None = None,
                       compile: bool = True, numpy: bool = True) -> list["CompiledModel | MemformError | None"]:
    """:meth:`CompiledModel.build` of ``rebind(model, o, check=False)`` for each ``o`` in
    ``overrides``, or the :class:`MemformError` that structure raises (``compile=False``: only
    what the on-disk cache holds, None for every other structure; ``numpy=False``: no numpy
    function, see :meth:`CompiledModel.build`).

    Structures found in the on-disk cache of :mod:`memform.fastpath.cachestore` (purpose
    ``search``) need neither the rebind nor sympy; refused ones are cached with their message.
    The rest are compiled in ``workers`` processes (default: one per CPU) when there are at
    least :data:`PARALLEL_MIN` of them, else here. ``purpose`` names the store (``solve`` and
    ``whatif`` keep their own); ``extra(structure_model, compiled)``, run where the structure is
    compiled, adds JSON-ready data to what is stored (:attr:`CompiledModel.extra`; a
    :class:`MemformError` from it refuses the structure).
    """
    out: list[Any] = [None] * len(overrides)
    keys_of: list[str | None] = []
    todo = []
    for i, o in enumerate(overrides):
        key = _search_key(model, o, keys, purpose) if cache else None
        keys_of.append(key)
        stored = None if key is None else read_entry(entry_path(purpose, key), key, lambda b: b)
        if stored is not None and (stored[0] is None or list(stored[0]["keys"]) == list(keys)):
            try:
                out[i] = MemformError(stored[2]) if stored[0] is None else CompiledModel.from_body(stored[0])
                continue
            except (KeyError, TypeError, ValueError, SyntaxError):
                pass  # a damaged body: compiled again below
        todo.append(i)
    if not compile:
        return out
    done = len(overrides) - len(todo)
    if progress:
        progress(done, len(overrides))
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    # one pipeline layout per group, compiled one after another, each walk taking from the previous
    # one what it can (sharedmemo; also across groups, one process's groups in a row), in an order
    # where each structure differs from the one before in as few values as can be (recompute none,
    # ZeRO 0..3, then selective, ZeRO 3..0: one change per step); the most pipeline chunks first
    # (they take longest), so that no worker is left with a big one at the end
    groups: dict[tuple, list[int]] = {}
    for i in todo:
        o = overrides[i]
        groups.setdefault((o.get("parallel.pp"), o.get("parallel.vpp"), str(o.get("parallel.stage_layers"))),
                          []).append(i)
    order = sorted((_chain([overrides[i] for i in g], g) for g in groups.values()),
                   key=lambda g: -sum(int(overrides[i].get("parallel.pp") or 1)
                                      * int(overrides[i].get("parallel.vpp") or 1) for i in g))
    chain = [i for group in order for i in group]
    if len(todo) >= PARALLEL_MIN and workers > 1 and "fork" in multiprocessing.get_all_start_methods():
        results = _compile_parallel(model, [overrides[i] for i in chain], tuple(keys), extra, numpy,
                                    min(workers, len(chain)))
        for j, result in results:
            i = chain[j]
            out[i] = _finish(result, keys_of[i], purpose)
            done += 1
            if progress:
                progress(done, len(overrides))
    else:
        prior: list[Any] = [None]
        with _gc_paused():
            for i in chain:
                out[i] = _finish(_compile_one(model, overrides[i], tuple(keys), extra, prior, numpy), keys_of[i],
                                 purpose)
                done += 1
                if progress:
                    progress(done, len(overrides))
    return out


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while structures are walked: a walk makes hundreds of
    thousands of sympy objects, few of them in cycles, and the collector's passes over them were
    10-15 % of a what-if page's compile (deepseek-v3: 4.2 -> 3.7 CPU-s serially, peak memory
    103 -> 109 MB); it runs again afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


#: fewer structures than this are compiled in this process (starting the workers costs ~0.1 s)
PARALLEL_MIN = 8


def _compile_parallel(model: Model, chain: Sequence[Mapping[str, Any]], keys: tuple[str, ...], extra: Any,
                      numpy: bool, workers: int) -> Iterator[tuple[int, tuple[Any, ...]]]:
    """:func:`_compile_one` of every structure of ``chain`` in ``workers`` forked processes (they
    inherit the loaded model), yielding ``(position in chain, result)`` as each is done.

    The chain is cut into one run per worker, each walked forward by its worker (every walk shares
    with the one before: :mod:`memform.fastpath.sharedmemo`); a worker whose run is done takes
    structures from the end of the longest run left, walking it backward: the chain's neighbours
    stay neighbours, and no worker idles while another has a queue (structures differ in cost by
    10x, which no estimate made in advance foresees for every config)."""
    ctx = multiprocessing.get_context("fork")
    n = len(chain)
    lock = ctx.Lock()
    lo = ctx.RawArray("i", [k * n // workers for k in range(workers)])
    hi = ctx.RawArray("i", [(k + 1) * n // workers for k in range(workers)])
    queue = ctx.Queue()
    procs = [ctx.Process(target=_steal_worker, args=(k, model, chain, keys, extra, numpy, lock, lo, hi, queue),
                         daemon=True) for k in range(workers)]
    try:
        for p in procs:
            p.start()
        running = workers
        while running:
            try:
                item = queue.get(timeout=1.0)
            except _queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"a compile worker process ended with exit code {dead[0].exitcode}") from None
                continue
            if item is None:
                running -= 1
            elif item[0] == "raised":
                raise item[1]
            else:
                yield item
        for p in procs:
            p.join()
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join()
        queue.close()


def _steal_worker(k: int, model: Model, chain: Sequence[Mapping[str, Any]], keys: tuple[str, ...], extra: Any,
                  numpy: bool, lock: Any, lo: Any, hi: Any, queue: Any) -> None:
    """Worker ``k`` of :func:`_compile_parallel`: its own run forward, then the others' from their ends."""
    prior: list[Any] = [None]
    gc.disable()  # as _gc_paused: this process ends when the chain is done
    try:
        while True:
            with lock:
                if lo[k] < hi[k]:
                    j = lo[k]
                    lo[k] += 1
                else:
                    r = max(range(len(lo)), key=lambda i: hi[i] - lo[i])
                    if hi[r] <= lo[r]:
                        break
                    hi[r] -= 1
                    j = hi[r]
            queue.put((j, _compile_one(model, chain[j], keys, extra, prior, numpy)))
    except BaseException as exc:  # noqa: BLE001 - raised again in the parent
        try:
            pickle.dumps(exc)
        except Exception:  # noqa: BLE001
            exc = RuntimeError(traceback.format_exc())
        queue.put(("raised", exc))
    queue.put(None)


def _chain(structures: Sequence[Mapping[str, Any]], indices: Sequence[int]) -> list[int]:
    """``indices`` (of ``structures``, in the same order) reordered so that each structure differs
    from the one before in as few override values as can be found greedily (from the first): the
    walks share more (:mod:`memform.fastpath.sharedmemo` takes from one structure back)."""
    left = list(range(len(structures)))
    path = [left.pop(0)] if left else []
    while left:
        last = structures[path[-1]]
        k = min(range(len(left)), key=lambda j: (sum(structures[left[j]].get(key) != v for key, v in last.items()), j))
        path.append(left.pop(k))
    return [indices[j] for j in path]


def _compile_one(model: Model, overrides: Mapping[str, Any], keys: tuple[str, ...],
                 extra: Any = None, prior: list[Any] | None = None, numpy: bool = True) -> tuple[Any, ...]:
    """(body or None, error message or None, formula files with digests, seconds): picklable.
    ``prior``: a one-entry list holding the previous structure's walk (replaced by this one's)."""
    start = time.perf_counter()
    try:
        smodel = rebind(model, overrides, check=False)
        files = file_digests(smodel.program.paths)
        cm = CompiledModel.build(smodel, keys, prior[0] if prior else None, numpy)
        if prior is not None:
            prior[0] = cm.evaluator
        body = cm.body()
        if extra is not None:
            try:
                body["extra"] = extra(smodel, cm)
            except NotExact as exc:   # without the numpy function this is where the closed form is compiled
                raise not_exact(keys, exc) from None
    except MemformError as exc:
        return None, exc.message, locals().get("files", []), time.perf_counter() - start
    return body, None, files, time.perf_counter() - start


def _finish(result: tuple[Any, ...], key: str | None, purpose: str = "search") -> "CompiledModel | MemformError":
    body, message, files, seconds = result
    if key is not None and files:
        write_entry(entry_path(purpose, key), key, files, body, message)
    return MemformError(message) if body is None else CompiledModel.from_body(body, seconds)


def _search_key(model: Model, overrides: Mapping[str, Any], keys: Sequence[str], purpose: str = "search") -> str | None:
    data = apply_overrides(model.data, overrides)
    try:
        files = formula_paths(data, model.source)
    except MemformError:
        return None
    return structure_key(data, files, keys, purpose)


def _derived_symbols(model: Model, searched: frozenset[str]) -> dict[str, sympy.Expr]:
    """Symbols left to their defaults whose default depends on a searched symbol.

    ``symbol etp = parallel.expert_tp default t`` follows ``t`` when the config does not set
    ``parallel.expert_tp``; binding it to the base config's number would make every candidate
    with another ``t`` wrong. Returns each such symbol's default as an expression in the
    searched symbols (chains of defaults followed).
    """
    from ..engine.binding import get_path
    derived: dict[str, sympy.Expr] = {}
    changed = True
    while changed:
        changed = False
        keep = searched | frozenset(derived)
        ev = model.evaluator(resolve=False, keep=keep)
        for name, decl in model.program.bindings.items():
            if (decl.keyword != "symbol" or decl.default is None or name in keep
                    or get_path(model.data, decl.path, None) is not None):
                continue
            value = ev.as_expr(ev.eval(decl.default, Ctx()), decl.loc)
            if {s.name for s in value.free_symbols} & keep:
                derived[name] = value
                changed = True
    return derived


def _follow(model: Model, derived: dict[str, sympy.Expr]) -> dict[sympy.Symbol, sympy.Expr]:
    """Each derived symbol (:func:`_derived_symbols`) -> its default in the searched symbols only:
    chains (a default naming another derived symbol) substituted into each other once, here, so that
    :func:`_substitute` is one ``xreplace`` per expression."""
    follow = {model.bound.symbols[name]: e for name, e in derived.items()}
    for _ in range(len(follow) + 1):
        keys = set(follow)
        if not any(isinstance(v, sympy.Basic) and v.free_symbols & keys for v in follow.values()):
            break
        follow = {k: v.xreplace(follow) if isinstance(v, sympy.Basic) else v for k, v in follow.items()}
    return follow


def _substitute(expr: Any, follow: dict[sympy.Symbol, sympy.Expr]) -> Any:
    """``expr`` with every derived symbol replaced by its default (``follow`` from :func:`_follow`)."""
    if not follow or not isinstance(expr, sympy.Basic):
        return expr
    return expr.xreplace(follow)


def _narrow(values: np.ndarray) -> np.ndarray:
    """Object (Python int) results back to int64 when they fit, else kept exact as objects."""
    if values.size and (values.max() >= 2 ** 62 or values.min() < -(2 ** 62)):
        return values
    return values.astype(np.int64)


def interpreted_peaks(model: Model, overrides: Mapping[str, Any]) -> list[list[int]]:
    """The reference: whole bytes per stage and category from the interpreter, one candidate.

    Raises :class:`MemformError` where the interpreter refuses the candidate.
    """
    est = estimate_model(rebind(model, overrides), keep=frozenset())
    return [[s.values[c] for c in CATEGORIES] for s in est.stages]
