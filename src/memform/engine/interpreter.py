"""The interpreter: walk ``layers[stage][chunk]`` and sum the formula blocks per stage.

Per stage ``i`` (Korthikanti et al. 2022 §4.2.3; MemEst ``_backbone.py``)::

    static(i)  = Σ_layers count · (param_bytes + grad_bytes + optimizer_bytes)
    act(i)     = Σ_chunks inflight(i, c) · Σ_layers-in-chunk count · act[mode]
    comm(i)    = max over the stage's layers of comm      (transient buffers, one layer at a time)
    runtime(i) = Σ runtime blocks' bytes, given model_bytes = static(i) + act(i) + comm(i)
    peak(i)    = static(i) + act(i) + comm(i) + runtime(i)
    time(i)    = Σ cost blocks' seconds, given the schedule's bubble at stage i


When the schedule declares ``moment`` quantities (``moment warmup = layers_sum(inflight * act)``,
``moment backward = ...``), act(i) is instead the largest of them at stage i, and the stage
records which moment that was (``peak_moment``) and every moment's bytes (``moments``).

Everything physical (what a layer stores, how many micro-batches a schedule keeps in flight)
comes from the formula files; this module only decides *where* each formula applies.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..errors import MemformError
from ..lang.program import (COST_OPTIONAL, COST_QUANTITIES, HOST_ACT_QUANTITY, HOST_QUANTITY, SCHEDULE_TIME_OPTIONAL,
                            SCHEDULE_TIME_QUANTITIES, Program)
from .walker import LayerSlot, Walker, to_bytes  # noqa: F401 (to_bytes re-exported)
from .partition import Partition
from .results import CATEGORIES, MODEL, PS_PER_SECOND, STATIC, StageNumbers  # noqa: F401 (CATEGORIES, MODEL re-exported)

#: Largest per-layer byte count (or in-flight count) accepted: far beyond any device, and small
#: enough that stage sums stay below the float range reports and charts convert to.
MAX_BYTES = 2 ** 256

#: an evaluator's value: a sympy expression (closed forms) or a plain int / Fraction (numeric backend)
Expr = Any

QUANTITY_OF = {"param_count": "params", "params": "param_bytes", "grads": "grad_bytes",
             "optimizer": "optimizer_bytes", "activations": "act", "comm": "comm"}


@dataclass
class LayerReport:
    """One group of identical layers on a stage: what each contributes and why."""

    stage: int
    chunk: int
    block: str
    mode: str
    count: Expr
    count_value: int
    first_layer: int
    inflight: Expr
    inflight_value: Expr
    per_layer: dict[str, Expr]          # param_count, params, grads, optimizer, activations, comm
    per_layer_values: dict[str, Expr]
    sources: dict[str, str]             # quantity -> file:line of the formula used
    host: Expr = 0                      # per-layer host-memory bytes (offloaded states)
    bindings: tuple = ()                # the stack entry's per-layer ``where`` values (name, value)


@dataclass
class StageResult(StageNumbers):
    """A stage's numbers (:class:`StageNumbers`) with the closed forms and layer groups behind them."""

    exprs: dict[str, Expr] = field(default_factory=dict)
    exact: dict[str, Expr] = field(default_factory=dict)
    layers: list[LayerReport] = field(default_factory=list)
    host_expr: Expr = 0
    #: closed forms behind ``param_count``, ``moments`` and ``runtime`` (compiled by the numeric fast path)
    param_count_expr: Expr = 0
    moment_exprs: dict[str, Expr] = field(default_factory=dict)
    runtime_exprs: dict[str, Expr] = field(default_factory=dict)
    #: closed forms of each cost block's seconds, of the stage's ideal seconds and of the tokens
    time_exprs: dict[str, Expr] = field(default_factory=dict)
    ideal_expr: Expr = 0
    tokens_expr: Expr = 0

    @property
    def step_expr(self) -> Expr:
        import sympy  # closed forms only: a stage of the symbolic interpreter
        return sympy.Add(*self.time_exprs.values())

    @property
    def total_expr(self) -> Expr:
        import sympy
        return sympy.Add(*(self.exprs[c] for c in CATEGORIES))


@dataclass
class _StageTime:
    """One stage's cost blocks: seconds per block (closed forms and picoseconds), ideal seconds, tokens."""

    exprs: dict[str, Expr] = field(default_factory=dict)
    ps: dict[str, int] = field(default_factory=dict)
    ideal_expr: Expr = 0    # the interpreter starts these at its evaluator's zero
    ideal_value: Expr = 0
    ideal_ps: int = 0
    tokens_expr: Expr = 0
    tokens: int = 0

    def copy(self) -> "_StageTime":
        """A copy whose dicts a stage may own (a shared cost result stays unchanged)."""
        return dataclasses.replace(self, exprs=dict(self.exprs), ps=dict(self.ps))


class Interpreter:
    """Evaluates a program over a partition with one evaluator and its numbers: closed forms and exact
    numbers with the sympy evaluator, the numbers alone (twice) with the numeric one."""

    def __init__(self, program: Program, evaluator: Walker, schedule: str):
        self.program = program
        self.ev = evaluator
        self.schedule = schedule
        self._layer_cache: dict[tuple[str, str, tuple], tuple[dict, dict, dict]] = {}
        self._host_cache: dict[tuple[str, str, tuple, str], tuple[Expr, Expr]] = {}
        #: cost results by stage signature (see :meth:`costs`); None where the cost blocks read
        #: ``stage`` or ``chunk`` themselves, so that no two stages may share them
        self._cost_cache: dict[tuple, _StageTime] | None = None if program.costs_read_position() else {}

    def layer(self, block: str, mode: str,
              bindings: tuple = ()) -> tuple[dict[str, Expr], dict[str, Expr], dict[str, str]]:
        """A layer's per-layer quantities (``bindings``: the stack's per-layer ``where`` values)."""
        key = (block, mode, bindings)
        if key not in self._layer_cache:
            exprs, values, sources = {}, {}, {}
            for cat, qname in QUANTITY_OF.items():
                q = self.program.pick(block, qname, mode)
                e = self.ev.as_expr(self.ev.quantity(block, qname, mode, overrides=bindings), q.loc)
                what = f"{block}.{qname}" + (f"[{mode}]" if self.program.has_variants(block, qname) else "")
                values[cat] = self.check_number(e, what, q.loc)
                exprs[cat] = e
                sources[cat] = str(q.loc)
            self._layer_cache[key] = (exprs, values, sources)
        return self._layer_cache[key]

    def check_number(self, expr: Expr, what: str, loc) -> Expr:
        n = self.ev.number(expr, loc, what)
        if not self.ev.is_finite_real(n):
            raise MemformError(f"{what} evaluates to {n} for this config, which is not a finite real byte count", loc)
        if n < 0:
            raise MemformError(f"{what} evaluates to a negative value ({n}) for this config", loc)
        if n > MAX_BYTES:
            raise MemformError(f"{what} evaluates to more than 2^256 ({self.ev.approx(n)}) for this config; "
                               f"no device holds that many bytes (check the config's sizes)", loc)
        return n

    def inflight(self, stage: int, chunk: int) -> tuple[Expr, Expr]:
        extra = (("stage", self.ev.integer(stage)), ("chunk", self.ev.integer(chunk)))
        q = self.program.pick(self.schedule, "inflight", None)
        e = self.ev.as_expr(self.ev.quantity(self.schedule, "inflight", None, extra=extra), q.loc)
        return e, self.check_number(e, f"schedule {self.schedule}: inflight at stage {stage} chunk {chunk}", q.loc)

    def stage(self, index: int, partition: Partition, capacity_bytes: int) -> StageResult:
        zero = self.ev.zero
        sums: dict[str, Expr] = {c: zero for c in ("param_count",) + STATIC + ("activations",)}
        exact: dict[str, Expr] = dict(sums)
        comm_expr, comm_value = zero, zero
        comm_terms: list[Expr] = []
        host_expr, host_value = zero, zero
        layers: list[LayerReport] = []
        for chunk in partition.chunks[index]:
            if not chunk.groups:
                continue
            mf, mf_value = self.inflight(index, chunk.index)
            for g in chunk.groups:
                exprs, values, sources = self.layer(g.block, g.mode, g.bindings)
                for cat in ("param_count",) + STATIC:
                    sums[cat] += g.count * exprs[cat]
                    exact[cat] += g.count_value * values[cat]
                sums["activations"] += mf * g.count * exprs["activations"]
                exact["activations"] += mf_value * g.count_value * values["activations"]
                h_expr, h_value = self.host(g.block, g.mode, g.bindings)
                # offloaded activations: one copy per micro-batch in flight (act_host, as act)
                ha_expr, ha_value = self.host(g.block, g.mode, g.bindings, HOST_ACT_QUANTITY)
                host_expr += g.count * h_expr + mf * g.count * ha_expr
                host_value += g.count_value * h_value + mf_value * g.count_value * ha_value
                h_expr = h_expr + mf * ha_expr
                if not comm_terms or values["comm"] > comm_value:
                    comm_expr, comm_value = exprs["comm"], values["comm"]
                comm_terms.append(exprs["comm"])
                layers.append(LayerReport(index, chunk.index, g.block, g.mode, g.count, g.count_value,
                                          g.first_layer, mf, mf_value, exprs, values, sources, h_expr,
                                          g.bindings))
        peak_moment, moments, moment_exprs = self.moments(index, partition, sums, exact)
        if not self.ev.resolve and len(set(comm_terms)) > 1:
            comm_expr = _max_everywhere(list(dict.fromkeys(comm_terms)))
        sums["comm"] = comm_expr
        exact["comm"] = comm_value
        sums["runtime"], exact["runtime"], runtime, runtime_exprs = self.runtime(index, sums, exact)
        values_int = {c: to_bytes(exact[c]) for c in CATEGORIES}
        time = self.costs(index)
        return StageResult(index, values_int, to_bytes(exact["param_count"]), capacity_bytes, peak_moment,
                           moments, to_bytes(host_value), runtime, time.ps, time.ideal_ps, time.tokens,
                           exprs={c: sums[c] for c in CATEGORIES},
                           exact={c: exact[c] for c in CATEGORIES}, layers=layers, host_expr=host_expr,
                           param_count_expr=sums["param_count"], moment_exprs=moment_exprs,
                           runtime_exprs=runtime_exprs, time_exprs=time.exprs, ideal_expr=time.ideal_expr,
                           tokens_expr=time.tokens_expr)

    def host(self, block: str, mode: str, bindings: tuple = (),
             quantity: str = HOST_QUANTITY) -> tuple[Expr, Expr]:
        """A layer's optional host-memory bytes (0 when its blocks define no ``host_bytes``), or with
        ``quantity`` ``act_host`` its offloaded activations per micro-batch in flight."""
        key = (block, mode, bindings, quantity)
        if key not in self._host_cache:
            q = self.program.pick(block, quantity, mode)
            if q is None:
                self._host_cache[key] = (self.ev.zero, self.ev.zero)
            else:
                e = self.ev.as_expr(self.ev.quantity(block, quantity, mode, overrides=bindings), q.loc)
                self._host_cache[key] = (e, self.check_number(e, f"{block}.{quantity}", q.loc))
        return self._host_cache[key]

    def runtime(self, index: int, sums: dict[str, Expr],
                exact: dict[str, Expr]) -> tuple[Expr, Expr, dict[str, int], dict[str, Expr]]:
        """Sum the runtime blocks at stage ``index``, with ``model_bytes`` bound to the stage's model bytes.

        The closed form uses the symbolic model bytes, the number the exact ones, so both stay
        consistent with the other categories.
        """
        total_expr, total_value = self.ev.zero, self.ev.zero
        parts: dict[str, int] = {}
        exprs: dict[str, Expr] = {}
        model_expr = self.ev.total(sums[c] for c in MODEL)
        model_value = self.ev.total(exact[c] for c in MODEL)
        for name in self.program.runtimes():
            q = self.program.pick(name, "bytes", None)
            e = self.ev.as_expr(self.ev.quantity(name, "bytes", None, extra=(
                ("stage", self.ev.integer(index)), ("model_bytes", model_expr))), q.loc)
            v = self.ev.as_expr(self.ev.quantity(name, "bytes", None, extra=(
                ("stage", self.ev.integer(index)), ("model_bytes", model_value))), q.loc)
            v = self.check_number(v, f"runtime {name}: bytes at stage {index}", q.loc)
            total_expr += e
            total_value += v
            parts[name] = to_bytes(v)
            exprs[name] = e
        return total_expr, total_value, parts, exprs

    def costs(self, index: int) -> "_StageTime":
        """Evaluate the cost blocks at stage ``index`` (after :meth:`moments` bound its layers).

        ``bubble`` and ``overlap`` are the schedule's quantities of those names at this stage.
        Seconds become whole picoseconds, rounded up, like bytes.
        """
        zero = self.ev.zero
        out = _StageTime(ideal_expr=zero, ideal_value=zero, tokens_expr=zero)
        costs = self.program.costs()
        if not costs:
            return out
        stage = ("stage", self.ev.integer(index))
        extra = (stage,)
        # the required ones (the checker made sure the schedule has them), then the optional ones, whose
        # value stands in where the schedule leaves them out
        for qname, absent in [(q, None) for q in SCHEDULE_TIME_QUANTITIES] + list(SCHEDULE_TIME_OPTIONAL):
            if absent is not None and self.program.find_quantity(self.schedule, qname) is None:
                extra += ((qname, self.ev.integer(absent)),)
                continue
            q = self.program.pick(self.schedule, qname, None)
            e = self.ev.as_expr(self.ev.quantity(self.schedule, qname, None, extra=(stage,)), q.loc)
            self.check_number(e, f"schedule {self.schedule}: {qname} at stage {index}", q.loc)
            extra += ((qname, e),)
        # Stages with the same layer groups (in the same order) and the same bubble and overlap get
        # the same cost closed forms: the cost blocks see a stage only through those (checked once
        # per program, Program.costs_read_position). A pipeline's middle stages are usually alike, so
        # this evaluates the cost blocks for a few stages instead of every one.
        key = None
        if self._cost_cache is not None:
            slots = self.ev.stage_layers.get(index, ())
            ranks = tuple(sorted(range(len(slots)), key=lambda k: slots[k].order))
            key = (tuple((sl.chunk, sl.block, sl.mode, sl.count, sl.bindings) for sl in slots), ranks, extra[1:])
            hit = self._cost_cache.get(key)
            if hit is not None:
                return hit.copy()
        for name in costs:
            for qname in COST_QUANTITIES + COST_OPTIONAL:
                q = self.program.pick(name, qname, None)
                if q is None:
                    continue
                e = self.ev.as_expr(self.ev.quantity(name, qname, None, extra=extra), q.loc)
                v = self.check_number(e, f"cost {name}: {qname} at stage {index}", q.loc)
                if qname == "seconds":
                    out.exprs[name] = e
                    out.ps[name] = to_bytes(v * PS_PER_SECOND)
                elif qname == "ideal_seconds":
                    out.ideal_expr += e
                    out.ideal_value += v
                else:
                    out.tokens_expr, out.tokens = e, to_bytes(v)
        out.ideal_ps = to_bytes(out.ideal_value * PS_PER_SECOND)
        if key is not None:
            self._cost_cache[key] = out
            return out.copy()
        return out

    def moments(self, index: int, partition: Partition, sums: dict[str, Expr],
                exact: dict[str, Expr]) -> tuple[str, dict[str, int], dict[str, Expr]]:
        """Evaluate the schedule's moments at stage ``index``; the largest becomes the activations.

        Without declared moments the in-flight sum already in ``sums`` is the only one ("warmup").
        """
        # the stage's layer groups, for layers_sum/max/last in moments and in runtime blocks
        self.ev.stage_layers[index] = tuple(
            LayerSlot(c.index, g.block, g.mode, g.count, g.first_layer, g.bindings)
            for c in partition.chunks[index] for g in c.groups)
        names = self.program.moments(self.schedule)
        if not names:
            return "warmup", {"warmup": to_bytes(exact["activations"])}, {"warmup": sums["activations"]}
        extra = (("stage", self.ev.integer(index)),)
        found: list[tuple[str, Expr, Expr]] = []
        for name in names:
            q = self.program.pick(self.schedule, name, None)
            e = self.ev.as_expr(self.ev.quantity(self.schedule, name, None, extra=extra), q.loc)
            found.append((name, e, self.check_number(e, f"schedule {self.schedule}: moment {name} at stage {index}",
                                                     q.loc)))
        best = max(range(len(found)), key=lambda k: (found[k][2], -k))
        name, expr, value = found[best]
        distinct = list(dict.fromkeys(e for _, e, _ in found))
        if self.ev.resolve and len(distinct) > 1:  # the closed form holds where this moment wins
            self.ev.assume(f"moment {name} is the largest at stage {index}")
        sums["activations"] = expr if self.ev.resolve or len(distinct) == 1 else _max_everywhere(distinct)
        exact["activations"] = value
        return name, {n: to_bytes(v) for n, _, v in found}, {n: e for n, e, _ in found}


def _max_everywhere(terms: list[Expr]) -> Expr:
    """The symbolic maximum of ``terms`` (``resolve=False``: only the sympy evaluator keeps one)."""
    import sympy

    from .evaluator import lattice
    return lattice(sympy.Max, terms)

