"""Solving the closed form for one config key, and the sensitivity of each stage to a symbol.

``solve`` answers "what is the largest micro-batch (sequence length, ...) that still fits?"
and, for a parallel degree, "what is the smallest degree that fits?". The stage peaks are
taken as closed forms in that one symbol (``resolve=False``: valid for every value, with the
schedule's ``min``/``max`` kept) and evaluated exactly for every integer in a range found by
doubling (:mod:`memform.fastpath.compiled`); only values that satisfy the formula files' ``require``
conditions (and divide the global batch, when one is set) are answers. The answer is then
re-checked by the interpreter, and the binding stage's closed form is solved continuously
with ``sympy.solve`` to show where the limit comes from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sympy

from ..engine.binding import get_path
from ..engine.model import Model, estimate_model, rebind
from ..engine.results import CATEGORIES
from ..errors import MemformError, did_you_mean
from ..units import human_bytes
from ..fastpath.compiled import CompiledModel, compile_structures, interpreted_peaks

#: keys whose value changes the stage partition itself: solved by re-evaluating per value
STRUCTURAL_KEYS = ("parallel.pp", "parallel.vpp")
DEFAULT_LIMIT = 1 << 20
#: at most this many admissible values: each closed-form condition is checked at every one of them
ADMISSIBLE_SHOWN = 64


@dataclass
class Solution:
    key: str
    symbol: str
    direction: str                       # "largest" or "smallest"
    capacity_bytes: int
    value: int | None                    # None: nothing in range fits
    limit: int
    unbounded: bool = False              # every value up to the limit fits
    stage_peaks: list[int] = field(default_factory=list)        # at value
    binding_stage: int | None = None
    other_value: int | None = None       # the neighbouring valid value that does not fit
    other_peaks: list[int] = field(default_factory=list)
    closed_form: sympy.Expr | None = None  # binding stage's peak as a function of the symbol
    assumptions: list[str] = field(default_factory=list)
    #: the symbol's values in the searched range that the requirements accept, when few enough
    #: (:data:`ADMISSIBLE_SHOWN`) to check each condition at every one of them; None otherwise
    admissible: list[int] | None = None
    continuous: list[sympy.Expr] = field(default_factory=list)  # real roots of peak = capacity
    derivative: sympy.Expr | None = None   # d peak / d symbol at the answer (bytes per unit)
    notes: list[str] = field(default_factory=list)
    #: what memory alone would allow past the answer where requirements refuse it (the farthest value that
    #: fits in memory with only refused values between) and their messages; None when memory decided
    refused_value: int | None = None
    refused_by: list[str] = field(default_factory=list)
    #: every value between the answer and ``refused_value`` (inclusive), all refused by requirements
    refused_values: list[int] = field(default_factory=list)


def resolve_symbol(model: Model, name: str) -> tuple[str, sympy.Symbol]:
    """A config key (``training.micro_batch_size``) or DSL symbol (``b``) → (key, symbol)."""
    decl = model.program.bindings.get(name)
    if decl is not None and decl.keyword == "symbol":
        return decl.path, model.bound.symbols[name]
    sym = model.symbol_for_key(name)
    if sym is not None:
        return name, sym
    choices = sorted(b.path for b in model.program.bindings.values() if b.keyword == "symbol")
    names = sorted(n for n, b in model.program.bindings.items() if b.keyword == "symbol")
    hint = did_you_mean(name, choices + names)
    raise MemformError(f"'{name}' is not a symbol of the formula files{hint}; symbols are bound to "
                       f"{', '.join(choices)}")


def solve(model: Model, key: str, *, limit: int | None = None, cache: bool = True) -> Solution:
    """The largest value of ``key`` (smallest, for a ``parallel.*`` degree) that fits.

    The closed form is compiled once per structure and kept in the on-disk store
    (:func:`memform.fastpath.compiled.compile_structures`, purpose ``solve``; ``cache=False``: not
    read nor written), so solving the same config again skips the compile."""
    if key in STRUCTURAL_KEYS or key in ("p", "vp"):
        return _solve_structural(model, key if "." in key else {"p": "parallel.pp", "vp": "parallel.vpp"}[key],
                                 limit)
    key, sym = resolve_symbol(model, key)
    decl = model.program.bindings[sym.name]
    if decl.type.kind != "int":
        raise MemformError(f"'{key}' is a real-valued symbol; solve works on integer quantities")
    smallest = key.startswith("parallel.")
    notes: list[str] = []
    gbs = get_path(model.data, "training.global_batch_size", None)
    overrides: dict[str, Any] = {"parallel.devices": None}
    if get_path(model.data, "parallel.devices", None) is not None:
        notes.append("parallel.devices is ignored while solving (the degree changes the device count)")
    derive_m = gbs is not None and key in ("training.micro_batch_size", "parallel.dp")
    if gbs is not None and key == "training.num_micro_batches":
        overrides["training.global_batch_size"] = None
        notes.append("training.global_batch_size is not held fixed (it is micro-batches × micro-batch size × dp)")
    base = rebind(model, overrides, check=False)
    keys = [key] + (["training.num_micro_batches"] if derive_m else [])
    cm = _compiled(model, overrides, keys, cache)
    other = 1
    if derive_m:
        other_key = "parallel.dp" if key == "training.micro_batch_size" else "training.micro_batch_size"
        other = int(get_path(base.data, other_key, 1) or 1)
        notes.append(f"training.num_micro_batches follows global_batch_size / (micro_batch_size × dp) = "
                     f"{gbs} / ({'x' if key == 'training.micro_batch_size' else other} × "
                     f"{other if key == 'training.micro_batch_size' else 'x'}); only divisors are candidates")
    capacity = base.structure.capacity_bytes
    if derive_m and gbs >= 2 ** 62:  # the candidates' micro-batch counts are 64-bit integer columns
        raise MemformError(f"config key 'training.global_batch_size' must be below 2^62 for solve (the micro-batch "
                           f"counts it derives are 64-bit integers), got {gbs}")

    def columns(xs: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        cols = {key: xs}
        valid_extra = np.ones(len(xs), dtype=bool)
        if derive_m:
            prod = xs * other
            valid_extra = (gbs % prod == 0)
            cols["training.num_micro_batches"] = np.maximum(gbs // prod, 1)
        return cols, valid_extra

    def evaluate(xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cols, valid_extra = columns(xs)
        batch = cm(cols)
        return batch.valid & valid_extra, batch.stage_peaks

    limit = limit or (DEFAULT_LIMIT if not smallest else 1 << 16)
    if limit < 1:
        raise MemformError(f"--max must be a positive integer, got {limit}")
    hi = limit
    if not smallest:  # doubling: the first power of two that no longer fits bounds the range
        x = 1
        while x < limit:
            _, peaks = evaluate(np.array([x]))
            if peaks.max() > capacity:
                break
            x *= 2
        hi = min(x, limit)
    xs = np.arange(1, hi + 1, dtype=np.int64)
    valid, peaks = evaluate(xs)
    fits = valid & (peaks.max(axis=1) <= capacity)
    sol = Solution(key, sym.name, "smallest" if smallest else "largest", capacity, None, limit, notes=notes)
    ok = np.nonzero(fits)[0]
    valid_idx = np.nonzero(valid)[0]
    if not len(valid_idx):
        raise MemformError(f"no value of {key} in 1..{hi} satisfies the formula files' requirements")
    if not len(ok):
        probe = valid_idx[-1] if smallest else valid_idx[0]
        sol.other_value = int(xs[probe])
        sol.other_peaks = [int(v) for v in peaks[probe]]
        sol.binding_stage = int(np.argmax(peaks[probe]))
        return sol
    pick = ok[0] if smallest else ok[-1]
    sol.value = int(xs[pick])
    sol.stage_peaks = [int(v) for v in peaks[pick]]
    if smallest:
        before = valid_idx[valid_idx < pick]
        neighbour = before[-1] if len(before) else None
    else:
        after = valid_idx[valid_idx > pick]
        neighbour = after[0] if len(after) else None
        sol.unbounded = neighbour is None and hi == limit and bool(fits[valid_idx[-1]])
    _refused_past(sol, xs, pick, valid, peaks, capacity, smallest, lambda x: cm(columns(np.array([x]))[0]),
                  gbs if derive_m else None, other, key)
    if neighbour is not None:
        sol.other_value = int(xs[neighbour])
        sol.other_peaks = [int(v) for v in peaks[neighbour]]
        sol.binding_stage = int(np.argmax(peaks[neighbour]))
    else:
        sol.binding_stage = int(np.argmax(peaks[pick]))
    admissible = xs[valid]
    if len(admissible) <= ADMISSIBLE_SHOWN:
        sol.admissible = [int(v) for v in admissible]
    _verify(base, key, sol, derive_m)
    _closed_form(base, sym, sol, derive_m, gbs, other, key)
    return sol


def _compiled(model: Model, overrides: dict[str, Any], keys: list[str], cache: bool) -> CompiledModel:
    """``rebind(model, overrides)`` compiled for ``keys``, from the store when it holds it."""
    cm = compile_structures(model, [overrides], keys, cache=cache, purpose="solve")[0]
    if isinstance(cm, MemformError):  # refused: compiled here again for the error with its location
        return CompiledModel.build(rebind(model, overrides, check=False), keys)
    return cm


def _refused_past(sol: Solution, xs: np.ndarray, pick: int, valid: np.ndarray, peaks: np.ndarray, capacity: int,
                  smallest: bool, batch_at: Any, gbs: Any, other: int, key: str) -> None:
    """Record what memory alone would allow past the answer where requirements refuse it: the farthest
    value past the answer that fits in memory with only refused values between (for a degree, the
    smallest that fits; "t = 5", not the nearest "t = 7"), every such value, and the requirements that
    refuse them (the formula files' ``require`` messages; a global batch they do not divide)."""
    fits_memory = peaks.max(axis=1) <= capacity
    past = np.arange(pick - 1, -1, -1) if smallest else np.arange(pick + 1, len(xs))
    refused: list[int] = []
    reasons: list[str] = []
    for i in past:
        if valid[i] or not fits_memory[i]:
            break  # a valid value (it does not fit) or one memory refuses: memory's limit is behind
        x = int(xs[i])
        why = list(batch_at(x).reasons)
        if gbs is not None and gbs % (x * other):
            why.append(f"training.global_batch_size ({gbs}) must be a multiple of micro_batch_size × dp")
        if not why:
            break
        refused.append(x)
        reasons += [r for r in why if r not in reasons]
    if refused:
        sol.refused_value, sol.refused_by, sol.refused_values = refused[-1], reasons, sorted(refused)


def _verify(base: Model, key: str, sol: Solution, derive_m: bool) -> None:
    """The interpreter must agree with the compiled answer (a disagreement is a memform bug). The answer
    is the boundary of the *allocated* peak (closed forms); the caching allocator's reserve is a replay,
    not a closed form, so the interpreter's reserved verdict at the answer is added as a note."""
    est = estimate_model(rebind(base, {key: sol.value}), keep=frozenset())
    peaks = [sum(s.values[c] for c in CATEGORIES) for s in est.stages]
    if peaks != sol.stage_peaks:  # pragma: no cover - guarded by tests/test_solve.py
        raise RuntimeError(f"compiled and interpreted peaks disagree at {key} = {sol.value}: "
                           f"{sol.stage_peaks} vs {peaks}")
    if not est.fits:
        sol.notes.append(f"the answer bounds the allocated peak: at {key} = {sol.value} the caching allocator "
                         f"would reserve {human_bytes(est.reserved_bytes)}, which does not fit (memform estimate "
                         f"shows it; a lower value leaves room for the allocator's reserve)")


def _closed_form(base: Model, sym: sympy.Symbol, sol: Solution, derive_m: bool, gbs: Any, other: int,
                 key: str) -> None:
    at = rebind(base, {key: sol.value}, check=False)
    keep = {sym.name}
    m_sym = at.symbol_for_key("training.num_micro_batches")
    if derive_m and m_sym is not None:
        keep.add(m_sym.name)
    est = estimate_model(at, keep=frozenset(keep))
    stage = sol.binding_stage if sol.binding_stage is not None else est.peak_stage
    expr = est.stages[stage].total_expr
    if derive_m and m_sym is not None:
        expr = expr.xreplace({m_sym: sympy.Integer(gbs) / (sym * other)})
    sol.closed_form = sympy.factor_terms(sympy.expand(expr))
    sol.assumptions = list(est.assumptions)
    sol.derivative = sympy.diff(expr, sym).xreplace({sym: sympy.Integer(sol.value)})
    x = sympy.Symbol(sym.name, positive=True)  # solve over the reals: the bound is rarely an integer
    try:
        roots = sympy.solve(sympy.Eq(expr.xreplace({sym: x}), sol.capacity_bytes), x)
    except (NotImplementedError, ValueError, TypeError):  # pragma: no cover - sympy gives up
        roots = []
    sol.continuous = sorted((r for r in roots if r.is_real and r > 0), key=float)


def _solve_structural(model: Model, key: str, limit: int | None) -> Solution:
    """pp / vpp change the partition, so each value is interpreted on its own (few values)."""
    capacity = model.structure.capacity_bytes
    limit = limit or 256
    sol = Solution(key, {"parallel.pp": "p", "parallel.vpp": "vp"}[key], "smallest", capacity, None, limit)
    sol.notes.append(f"{key} changes the stage partition: every value is evaluated by the interpreter")
    last_bad: tuple[int, list[int]] | None = None
    for x in range(1, limit + 1):
        try:
            ref = interpreted_peaks(model, {key: x, "parallel.devices": None, "parallel.stage_layers": None})
        except MemformError:
            continue
        peaks = [sum(r) for r in ref]
        if max(peaks) <= capacity:
            sol.value, sol.stage_peaks = x, peaks
            sol.binding_stage = int(np.argmax(last_bad[1])) if last_bad else int(np.argmax(peaks))
            if last_bad:
                sol.other_value, sol.other_peaks = last_bad
            return sol
        last_bad = (x, peaks)
    if last_bad:
        sol.other_value, sol.other_peaks = last_bad
        sol.binding_stage = int(np.argmax(last_bad[1]))
    return sol


# ------------------------------------------------------------------------- sensitivity


@dataclass
class StageSensitivity:
    stage: int
    derivative: sympy.Expr        # ∂peak/∂x in every symbol (the paper's form)
    value: sympy.Expr             # at the config (bytes per unit of x)
    step: int | None              # whole-byte peak(x + 1) - peak(x), for integer symbols


def sensitivity(model: Model, name: str, *, cache: bool = True
                ) -> tuple[str, sympy.Symbol, list[StageSensitivity], list[str]]:
    """∂(stage peak)/∂x for every stage at the config, with the exact one-step difference."""
    key, sym = resolve_symbol(model, name)
    est = estimate_model(model)  # every symbol kept, conditions decided at the config
    values = model.bound.values
    steps: list[int | None] = [None] * len(est.stages)
    # pp/vpp change the partition itself: a one-step difference on this partition would mislead
    if model.program.bindings[sym.name].type.kind == "int" and key not in STRUCTURAL_KEYS:
        cm = _compiled(model, {"parallel.devices": None}, [key], cache)
        x = int(values[sym])
        peaks = cm({key: np.array([x, x + 1])}).stage_peaks
        steps = [int(peaks[1, i] - peaks[0, i]) for i in range(len(est.stages))]
    out = []
    for s, step in zip(est.stages, steps):
        d = sympy.diff(s.total_expr, sym)
        out.append(StageSensitivity(s.stage, sympy.factor_terms(sympy.expand(d)), d.xreplace(values), step))
    return key, sym, out, list(est.assumptions)
