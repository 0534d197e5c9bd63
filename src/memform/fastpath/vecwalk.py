"""A structure's candidates evaluated by the numeric walk over integer arrays: no sympy, no compile.

A cold ``memform search`` used to compile every structural combination (sympy closed forms with
``resolve=False``, then :mod:`memform.fastpath.exact`): ~0.1 CPU-s per structure, 84 structures
for llama3-70b on 1024 devices. The numeric evaluator (:mod:`memform.engine.numeric`) walks the
same formulas with plain numbers in ~15 ms per structure; this module walks them once per
structure with every searched config key (``tp``, ``dp``, ``cp``, ``ep``, micro-batch size and
count) bound to a column of candidate values (:class:`Vec`: exact integers or exact fractions as
int64 numerator/denominator arrays, Python ints where a product could leave int64), so one walk
gives every candidate's numbers.

Its decisions are those of the compiled path (:class:`memform.fastpath.compiled.CompiledModel`,
which walks with ``resolve=False``): a condition on searched values is decided per row (both
branches computed, one chosen per row), ``min``/``max`` per row, every category rounded up to whole
bytes per stage, the formula files' ``require`` conditions checked per row, negative sizes refused
per row. Where the walk meets something it cannot decide exactly per row -- a zero denominator in
some rows, ``log2`` or a power of a searched value, a list index or a layer count that depends on
one, a formula error -- it raises :class:`Fallback` and the caller compiles that structure as
before, so the rows never differ from the compiled ones. Step times are the one approximation, as
on the compiled path (float64 there, exact here, both rounded up to whole picoseconds: they agree
to well below the microsecond a search row shows).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Mapping, Sequence

import numpy as np

from ..engine.binding import get_path
from ..engine.interpreter import CATEGORIES, MODEL, PS_PER_SECOND, QUANTITY_OF, STATIC
from ..engine.model import Model, partition_of
from ..engine.numeric import NumericEvaluator
from ..engine.walker import Ctx, LayerSlot
from ..errors import MemformError
from .sharedmemo import SharedMemo
from ..lang.program import COST_OPTIONAL, COST_QUANTITIES, SCHEDULE_TIME_OPTIONAL, SCHEDULE_TIME_QUANTITIES

#: int64 products and sums whose bound stays below this are exact (2**63 - 1 is the limit)
_SAFE = float(2 ** 62)


class Fallback(Exception):
    """This structure's walk cannot be decided row by row: compile it instead."""


def _maxabs(a: np.ndarray) -> float:
    return float(np.abs(a).max()) if a.size else 0.0


class Vec:
    """One number per candidate row: exact, ``num / den`` (int64 arrays; ``den`` None: integers;
    den > 0, reduced), or -- where an exact product would leave int64 -- float64 (``f``), as the
    compiled path computes step times. A float value is refused where whole bytes, a token count
    or a ``require`` need it (:class:`Fallback`). Hashed and compared by identity (walker memo
    keys hold values); arithmetic with another :class:`Vec` or a Python int / Fraction gives a
    :class:`Vec`."""

    __slots__ = ("num", "den", "f", "_hi", "_hd")

    def __init__(self, num: np.ndarray | None, den: np.ndarray | None = None, f: np.ndarray | None = None,
                 reduced: bool = False):
        if den is not None and not reduced:
            g = np.gcd(num, den)
            if (g != 1).any():
                num, den = num // g, den // g
            if not (den != 1).any():
                den = None
        self.num, self.den, self.f = num, den, f
        self._hi = self._hd = None

    def hi(self) -> float:
        """The largest magnitude of a numerator (computed once: values never change)."""
        if self._hi is None:
            self._hi = _maxabs(self.num)
        return self._hi

    def hd(self) -> float:
        if self._hd is None:
            self._hd = 1.0 if self.den is None else _maxabs(self.den)
        return self._hd

    @staticmethod
    def of(x: Any, n: int) -> "Vec":
        if isinstance(x, Vec):
            return x
        if type(x) is Fraction:
            p, q = x.numerator, x.denominator
            if abs(p) < _SAFE and q < _SAFE:
                return Vec(np.full(n, p, dtype=np.int64), np.full(n, q, dtype=np.int64), reduced=True)
            return Vec(None, None, np.full(n, float(x)))
        x = int(x)
        if abs(x) < _SAFE:
            return Vec(np.full(n, x, dtype=np.int64))
        return Vec(None, None, np.full(n, float(x)))

    def floats(self) -> np.ndarray:
        if self.f is not None:
            return self.f
        return self.num / self.den if self.den is not None else self.num.astype(np.float64)

    def _pair(self, other: Any) -> tuple["Vec", "Vec"]:
        return self, Vec.of(other, len(self.num if self.f is None else self.f))

    def __add__(self, other: Any) -> "Vec":
        if self.f is None and type(other) is int and abs(other) < _SAFE:
            if self.den is None:
                if self.hi() + abs(other) < _SAFE:
                    return Vec(self.num + other)
            elif self.hi() + abs(other) * self.hd() < _SAFE:   # (num + k·den) / den stays reduced
                return Vec(self.num + other * self.den, self.den, reduced=True)
        a, b = self._pair(other)
        if a.f is None and b.f is None:
            if a.den is None and b.den is None:
                if a.hi() + b.hi() < _SAFE:
                    return Vec(a.num + b.num)
            elif a.hi() * b.hd() + b.hi() * a.hd() < _SAFE and a.hd() * b.hd() < _SAFE:
                ad, bd = a.dens(), b.dens()
                return Vec(a.num * bd + b.num * ad, ad * bd)
        return Vec(None, None, a.floats() + b.floats())

    __radd__ = __add__

    def __neg__(self) -> "Vec":
        if self.f is not None:
            return Vec(None, None, -self.f)
        v = Vec(-self.num, self.den, reduced=True)
        v._hi, v._hd = self._hi, self._hd
        return v

    def __sub__(self, other: Any) -> "Vec":
        if type(other) is int:
            return self + (-other)
        return self + (-self._pair(other)[1])

    def __rsub__(self, other: Any) -> "Vec":
        return (-self) + other

    def __mul__(self, other: Any) -> "Vec":
        if self.f is None and type(other) is int and abs(other) < _SAFE and self.hi() * abs(other) < _SAFE:
            if self.den is None:
                return Vec(self.num * other)
            return Vec(self.num * other, self.den)
        a, b = self._pair(other)
        if a.f is None and b.f is None and a.hi() * b.hi() < _SAFE and a.hd() * b.hd() < _SAFE:
            if a.den is None and b.den is None:
                return Vec(a.num * b.num)
            return Vec(a.num * b.num, a.dens() * b.dens())
        return Vec(None, None, a.floats() * b.floats())

    __rmul__ = __mul__

    def dens(self) -> np.ndarray:
        return self.den if self.den is not None else np.ones(len(self.num), dtype=np.int64)

    def reciprocal(self) -> "Vec":
        if self.f is not None:
            if (self.f == 0).any():
                raise Fallback("a division by zero in some candidate rows")
            return Vec(None, None, 1.0 / self.f)
        if (self.num == 0).any():
            raise Fallback("a division by zero in some candidate rows")
        sign = np.where(self.num < 0, -1, 1)
        v = Vec(self.dens() * sign, self.num * sign, reduced=True)
        v._hi, v._hd = self._hd, self._hi
        return v

    def sign(self) -> np.ndarray:
        return np.sign(self.num if self.f is None else self.f)

    def floor(self) -> "Vec":
        if self.f is not None:
            return Vec(None, None, np.floor(self.f))
        return self if self.den is None else Vec(self.num // self.den)

    def ceil(self) -> "Vec":
        return -((-self).floor())


class Cond:
    """A condition decided per row (a bool array); ``approx``: decided on float64 values (a step
    time's), which a ``require`` or a byte count may not rest on. Compared by identity."""

    __slots__ = ("m", "approx")

    def __init__(self, m: np.ndarray, approx: bool = False):
        self.m, self.approx = m, approx


def _where(c: Cond, a: Vec, b: Vec) -> Vec:
    if c.approx or a.f is not None or b.f is not None:
        return Vec(None, None, np.where(c.m, a.floats(), b.floats()))
    if a.den is None and b.den is None:
        return Vec(np.where(c.m, a.num, b.num))
    return Vec(np.where(c.m, a.num, b.num), np.where(c.m, a.dens(), b.dens()))


def _cmp(op: str, a: Vec, b: Vec) -> Cond:
    diff = a - b
    d = diff.sign()
    m = {"==": d == 0, "!=": d != 0, "<": d < 0, "<=": d <= 0, ">": d > 0, ">=": d >= 0}[op]
    return Cond(m, diff.f is not None)


_LITERALS: dict[str, Any] = {}   # a formula's number literals (exact, immutable), parsed once


class VecEvaluator(SharedMemo, NumericEvaluator):
    """The numeric walk with :class:`Vec` values for the searched symbols (``values[name]``); the walk
    of the next structure of a search takes from this one what it can (:class:`SharedMemo`)."""

    n: int = 1

    def _comparable(self, v: Any) -> Any:
        return _content(v)

    def _compatible(self, prior: Any) -> bool:
        return prior.n == self.n

    def _v(self, x: Any) -> Vec:
        return Vec.of(x, self.n)

    # ---------------------------------------------------------------- numbers
    def literal(self, text: str) -> Any:
        hit = _LITERALS.get(text)
        if hit is None:
            hit = _LITERALS[text] = super().literal(text)
        return hit

    def is_number(self, v: Any) -> bool:
        return isinstance(v, Vec) or super().is_number(v)

    def is_integer(self, n: Any) -> bool:
        if isinstance(n, Vec):
            return n.den is None
        return super().is_integer(n)

    def total(self, terms: Any) -> Any:
        out: Any = 0
        for t in terms:
            out = out + t
        return out if isinstance(out, Vec) else super().total([out])

    def at_least(self, lo: int, v: Any) -> Any:
        return self._extreme("max", [lo, v], None)

    def bits(self, v: Any) -> float:
        if isinstance(v, Vec):
            if v.f is not None:
                top = _maxabs(v.f)
                return math.log2(max(1.0, top)) + 1 if math.isfinite(top) else math.inf
            return 64.0
        return super().bits(v)

    def is_condition(self, v: Any) -> bool:
        return isinstance(v, Cond)

    def _check_value(self, value: Any, label: str, loc: Any) -> None:
        if isinstance(value, Vec):
            self._check_size(value, label, loc)
        elif not isinstance(value, Cond):
            super()._check_value(value, label, loc)

    # ---------------------------------------------------------------- operators
    def _is_zero(self, b: Any) -> bool:
        if isinstance(b, Vec):
            if (b.sign() == 0).any():
                raise Fallback("a division by zero in some candidate rows")
            return False
        return super()._is_zero(b)

    def _is_unit(self, a: Any) -> bool:
        return False if isinstance(a, Vec) else super()._is_unit(a)

    def _arith(self, op: str, a: Any, b: Any) -> Any:
        if not isinstance(a, Vec) and not isinstance(b, Vec):
            return super()._arith(op, a, b)
        if op == "+":
            return a + b if isinstance(a, Vec) else b + a
        if op == "-":
            return a - b if isinstance(a, Vec) else (-b) + a
        if op == "*":
            return a * b if isinstance(a, Vec) else b * a
        if op == "/":
            return self._v(a) * self._v(b).reciprocal()
        if op == "%":   # a - b * floor(a / b), as Fraction's %
            a, b = self._v(a), self._v(b)
            return a - b * (a * b.reciprocal()).floor()
        if isinstance(b, Vec) or not self.is_integer(b):
            raise Fallback("a power with a searched exponent")
        k = int(b)
        out: Any = 1
        base = self._v(a) if k >= 0 else self._v(a).reciprocal()
        for _ in range(abs(k)):
            out = base * out
        return out if isinstance(out, Vec) else self._v(out)

    def _compare(self, op: str, a: Any, b: Any, loc: Any) -> Any:
        if not isinstance(a, Vec) and not isinstance(b, Vec):
            return super()._compare(op, a, b, loc)
        return _cmp(op, self._v(a), self._v(b))

    def _truth_other(self, v: Any, loc: Any) -> Any:
        if isinstance(v, Cond):
            return v
        if isinstance(v, Vec):
            return Cond(v.sign() != 0, v.f is not None)
        return super()._truth_other(v, loc)

    def _combine(self, is_and: bool, parts: list[Any]) -> Any:
        m = parts[0].m
        for p in parts[1:]:
            m = (m & p.m) if is_and else (m | p.m)
        return Cond(m, any(p.approx for p in parts))

    def _negate(self, cond: Any) -> Any:
        return Cond(~cond.m, cond.approx)

    def _piecewise(self, cond: Any, then: Any, other: Any) -> Any:
        if isinstance(then, Cond) or isinstance(other, Cond):
            raise Fallback("a condition chosen by a condition")
        return _where(cond, self._v(then), self._v(other))

    def _e_If(self, node: Any, ctx: Ctx) -> Any:
        cond = self.truth(self.eval(node.cond, ctx), node.cond.loc)
        if isinstance(cond, Cond) and (cond.m.all() or not cond.m.any()):
            # every row takes one branch: the other is not computed (as a scalar walk would not)
            return self.eval(node.then if cond.m.all() else node.other, ctx)
        return super()._e_If(node, ctx)

    def _extreme(self, f: str, nums: list[Any], loc: Any) -> Any:
        if not any(isinstance(x, Vec) for x in nums):
            return super()._extreme(f, nums, loc)
        best = self._v(nums[0])
        for x in nums[1:]:
            x = self._v(x)
            best = _where(_cmp("<" if f == "min" else ">", x, best), x, best)
        return best

    def _round(self, f: str, x: Any, loc: Any) -> Any:
        if not isinstance(x, Vec):
            return super()._round(f, x, loc)
        return x.ceil() if f == "ceil" else x.floor()

    def _log2(self, x: Any) -> Any:
        if isinstance(x, Vec):
            raise Fallback("log2 of a searched value")
        return super()._log2(x)

    def _abs(self, x: Any) -> Any:
        if isinstance(x, Vec):
            return Vec(np.abs(x.num), x.den) if x.f is None else Vec(None, None, np.abs(x.f))
        return super()._abs(x)

    def _layers_max(self, distinct: list[Any], loc: Any) -> Any:
        return self._extreme("max", distinct, loc)

    def number(self, value: Any, loc: Any = None, what: str = "expression") -> Any:
        v = self.as_expr(value, loc)
        if isinstance(v, Vec):
            if what in ("the index given to at()", "exponent", "the argument of log2()"):
                raise Fallback(f"{what} depends on a searched value")
            return v
        return super().number(value, loc, what)


def vec_evaluator(model: Model, columns: Mapping[str, np.ndarray], keys: Sequence[str]) -> VecEvaluator:
    """A :class:`VecEvaluator` of ``model`` (loaded ``numeric=True``) with each of ``keys`` bound to its
    column, and every symbol whose default follows a searched one (``parallel.expert_tp`` following
    ``t``, as :func:`memform.fastpath.compiled._derived_symbols` finds them) computed per row."""
    n = len(next(iter(columns.values()))) if columns else 1
    values = dict(model.bound.values)
    searched = set()
    for key in keys:
        name = model.symbol_name_for_key(key)
        if name is None:
            raise Fallback(f"'{key}' is not bound to a symbol")
        values[model.bound.symbols[name]] = Vec(np.asarray(columns[key], dtype=np.int64))
        searched.add(name)
    changed = True
    derived: set[str] = set()
    while changed:
        changed = False
        ev = _make(model, values, n)
        for name, decl in model.program.bindings.items():
            if (decl.keyword != "symbol" or decl.default is None or name in searched or name in derived
                    or get_path(model.data, decl.path, None) is not None):
                continue
            v = ev.eval(decl.default, Ctx())
            if isinstance(v, Vec):
                values[model.bound.symbols[name]] = v
                derived.add(name)
                changed = True
    return _make(model, values, n)


def _make(model: Model, values: dict[Any, Any], n: int) -> VecEvaluator:
    ev = VecEvaluator(model.program, model.bound.symbols, values, model.bound.options, resolve=True,
                      keep=frozenset())
    ev.n = n
    ev.share(None)
    return ev


class VecStructure:
    """One structural combination evaluated by the walk over candidate columns: what
    :class:`memform.fastpath.compiled.CompiledModel` gives a search (``stages``, ``timed``, a call
    returning a :class:`~memform.fastpath.compiled.Batch`), without compiling."""

    def __init__(self, model: Model, keys: Sequence[str], overrides: Mapping[str, Any] | None = None):
        """``model`` itself, or (``overrides``) ``rebind(model, overrides, check=False)``, rebound
        when first called (where the walk runs: a worker process)."""
        self.base, self.overrides = model, overrides
        self.model: Model | None = model if overrides is None else None
        self.keys = tuple(keys)
        self.stages = int((overrides or {}).get("parallel.pp") or model.structure.pp)
        self.evaluator: VecEvaluator | None = None

    def __call__(self, columns: Mapping[str, Any], prior: VecEvaluator | None = None):
        """The candidates' :class:`~memform.fastpath.compiled.Batch` (``prior``: the walk of another
        structure of the same search, whose values this one may take; this walk is kept as
        :attr:`evaluator`)."""
        from ..engine.model import rebind
        from .compiled import Batch
        try:
            if self.model is None:
                self.model = rebind(self.base, self.overrides, check=False)
            self.stages = self.model.structure.pp
            with np.errstate(over="raise"):
                batch, self.evaluator = _evaluate(self.model, {k: np.asarray(columns[k]) for k in self.keys},
                                                  self.keys, Batch, prior)
                return batch
        except (Fallback, MemformError, ArithmeticError, TypeError, ValueError, KeyError, IndexError,
                AttributeError, FloatingPointError) as exc:
            raise Fallback(str(exc)) from None


def _col(v: Any, n: int) -> np.ndarray:
    """Whole units, rounded up, exactly, as one int64 per row (a float64 value cannot give them)."""
    x = Vec.of(v, n).ceil()
    if x.f is not None:
        raise Fallback("a byte count beyond exact int64 arithmetic")
    return x.num


def _evaluate(model: Model, columns: Mapping[str, np.ndarray], keys: Sequence[str], Batch: Any,
              prior: VecEvaluator | None = None) -> tuple[Any, VecEvaluator]:
    n = len(next(iter(columns.values())))
    ev = vec_evaluator(model, columns, keys)
    prog = model.program
    schedule = model.structure.schedule
    part = partition_of(model, ev)
    for index in range(model.structure.pp):  # every stage's layers, before anything reads them
        ev.stage_layers[index] = tuple(LayerSlot(c.index, g.block, g.mode, g.count, g.first_layer, g.bindings)
                                       for c in part.chunks[index] for g in c.groups)
    ev.share(prior)
    requires = []
    for r in prog.requires:
        cond = ev.truth(ev.eval(r.expr, Ctx()), r.loc)
        if cond is False:  # as the compiled structure: refused for every candidate (compiled says why)
            raise Fallback("a requirement fails for every candidate")
        if cond is not True:
            if cond.approx:
                raise Fallback("a requirement decided on float64 values")
            requires.append((r.message, cond.m))
    layer_cache: dict[tuple, dict[str, Any]] = {}

    def layer(block: str, mode: str, bindings: tuple) -> dict[str, Any]:
        key = (block, mode, bindings)
        if key not in layer_cache:
            out = {}
            for cat, qname in QUANTITY_OF.items():
                q = prog.pick(block, qname, mode)
                out[cat] = ev.as_expr(ev.quantity(block, qname, mode, overrides=bindings), q.loc)
            layer_cache[key] = out
        return layer_cache[key]

    outputs: list[np.ndarray] = []
    step: list[Any] = []
    ideal: Any = 0
    tokens: Any = 0
    timed = False
    cost_cache: dict[tuple, tuple[dict, Any, Any]] = {}
    share_costs = not prog.costs_read_position()
    for index in range(model.structure.pp):
        sums: dict[str, Any] = {c: 0 for c in STATIC + ("activations",)}
        comm_terms: list[Any] = []
        for chunk in part.chunks[index]:
            if not chunk.groups:
                continue
            extra = (("stage", index), ("chunk", chunk.index))
            q = prog.pick(schedule, "inflight", None)
            mf = ev.as_expr(ev.quantity(schedule, "inflight", None, extra=extra), q.loc)
            for g in chunk.groups:
                if isinstance(g.count, Vec) or not isinstance(g.count, int):
                    raise Fallback("a layer count that is not a plain number")
                exprs = layer(g.block, g.mode, g.bindings)
                for cat in STATIC:
                    sums[cat] = sums[cat] + g.count * exprs[cat]
                sums["activations"] = sums["activations"] + mf * g.count * exprs["activations"]
                if not any(t is exprs["comm"] for t in comm_terms):
                    comm_terms.append(exprs["comm"])
        names = prog.moments(schedule)
        if names:
            found = []
            for name in names:
                q = prog.pick(schedule, name, None)
                found.append(ev.as_expr(ev.quantity(schedule, name, None, extra=(("stage", index),)), q.loc))
            distinct = list(dict.fromkeys(found))
            sums["activations"] = distinct[0] if len(distinct) == 1 else ev._extreme("max", distinct, None)
        sums["comm"] = (0 if not comm_terms else comm_terms[0] if len(comm_terms) == 1
                        else ev._extreme("max", comm_terms, None))
        model_bytes = ev.total(sums[c] for c in MODEL)
        runtime: Any = 0
        for name in prog.runtimes():
            q = prog.pick(name, "bytes", None)
            runtime = runtime + ev.as_expr(ev.quantity(name, "bytes", None, extra=(
                ("stage", index), ("model_bytes", model_bytes))), q.loc)
        sums["runtime"] = runtime
        for c in CATEGORIES:
            outputs.append(_col(sums[c], n))
        secs, ideal_s, tok = _costs(ev, prog, schedule, index, cost_cache if share_costs else None)
        if secs:
            timed = True
        step.append(ev.total(secs) if secs else 0)
        ideal = ideal + ideal_s
        if index == 0:
            tokens = tok
    valid = np.ones(n, dtype=bool)
    for v in outputs:
        valid &= v >= 0
    reasons = []
    for message, ok in requires:
        if not ok.all():
            reasons.append(message)
        valid &= ok
    if not timed:
        return Batch(valid, reasons, outputs, model.structure.pp), ev
    times = [_float_ps(s, n) for s in step] + [_float_ps(ideal, n)]
    tok = _col(tokens, n)
    for v in times:
        valid &= v >= 0
    valid &= tok >= 0
    return Batch(valid, reasons, outputs, model.structure.pp, times[:-1], times[-1], tok), ev


def _content(v: Any) -> Any:
    """A value as a cache key: a :class:`Vec` by its numbers (equal bubbles of two stages share)."""
    if isinstance(v, Vec):
        return tuple(None if a is None else a.tobytes() for a in (v.num, v.den, v.f))
    return v


def _float_ps(seconds: Any, n: int) -> np.ndarray:
    """Seconds as whole picoseconds, rounded up, in float64 (what the compiled path's times are)."""
    ps = Vec.of(seconds, n) * PS_PER_SECOND
    c = ps.ceil()
    return c.f if c.f is not None else c.num.astype(np.float64)


def _costs(ev: VecEvaluator, prog: Any, schedule: str, index: int,
           cache: dict | None) -> tuple[list[Any], Any, Any]:
    """The cost blocks at stage ``index`` (as :meth:`memform.engine.interpreter.Interpreter.costs`):
    each block's seconds, the summed ideal seconds and the tokens per step."""
    costs = prog.costs()
    if not costs:
        return [], 0, 0
    stage = ("stage", index)
    extra: tuple = (stage,)
    for qname, absent in [(q, None) for q in SCHEDULE_TIME_QUANTITIES] + list(SCHEDULE_TIME_OPTIONAL):
        if absent is not None and prog.find_quantity(schedule, qname) is None:
            extra += ((qname, absent),)
            continue
        q = prog.pick(schedule, qname, None)
        extra += ((qname, ev.as_expr(ev.quantity(schedule, qname, None, extra=(stage,)), q.loc)),)
    key = None
    if cache is not None:
        slots = ev.stage_layers.get(index, ())
        ranks = tuple(sorted(range(len(slots)), key=lambda k: slots[k].order))
        key = (tuple((sl.chunk, sl.block, sl.mode, sl.count, sl.bindings) for sl in slots), ranks,
               tuple((k, _content(v)) for k, v in extra[1:]))
        if key in cache:
            return cache[key]
    secs, ideal, tokens = [], 0, 0
    for name in costs:
        for qname in COST_QUANTITIES + COST_OPTIONAL:
            q = prog.pick(name, qname, None)
            if q is None:
                continue
            e = ev.as_expr(ev.quantity(name, qname, None, extra=extra), q.loc)
            if qname == "seconds":
                secs.append(e)
            elif qname == "ideal_seconds":
                ideal = ideal + e
            else:
                tokens = e
    out = (secs, ideal, tokens)
    if key is not None:
        cache[key] = out
    return out


def numeric_twin(model: Model) -> Model:
    """``model`` bound with plain numbers (``load_model(..., numeric=True)``), for :class:`VecStructure`."""
    if model.bound.numeric:
        return model
    from ..engine.binding import bind
    return Model(model.data, model.source, model.program, bind(model.program, model.data, numeric=True),
                 model.structure)


#: the cache folder counting, per structure, the searches that walked it without a compiled entry
SEEN = "search-seen"


def seen(model: Model, overrides: Mapping[str, Any], keys: Sequence[str]) -> int:
    """How many earlier searches walked this structure (counted in the cache directory, as a
    compiled entry is stored: :mod:`memform.cachedir`); this one is counted too. 0 when the
    cache is off or the structure has no key."""
    from ..cachedir import enabled, write_atomic
    from .cachestore import entry_path
    from .compiled import _search_key
    if not enabled():
        return 0
    key = _search_key(model, overrides, keys, "search")
    if key is None:
        return 0
    path = entry_path(SEEN, key).with_suffix(".count")
    try:
        count = int(path.read_text(encoding="ascii"))
    except (OSError, ValueError):
        count = 0
    write_atomic(path, str(count + 1).encode("ascii"))
    return count


#: fewer walks than this run in this process (a pool's start-up costs ~0.1 s; a walk ~0.03 s)
PARALLEL_MIN = 8
_WORK: dict[str, Any] = {}


def walk_all(jobs: Sequence[tuple[VecStructure, Mapping[str, Any]]], workers: int | None = None) -> list[Any]:
    """Each ``(structure, columns)`` walked: its :class:`~memform.fastpath.compiled.Batch`, or the
    :class:`Fallback` it raised. Structures with the same columns (one pipeline size) are walked one
    after another, each taking what it can from the previous walk (:class:`VecEvaluator`); the
    groups run in ``workers`` forked processes (default: one per CPU) when there are at least
    :data:`PARALLEL_MIN` jobs, the largest pipelines first."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor
    groups: dict[int, list[int]] = {}
    for i, (_, cols) in enumerate(jobs):
        groups.setdefault(id(cols), []).append(i)
    order = sorted(groups.values(), key=lambda g: -sum(jobs[i][0].stages for i in g))
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    _WORK["jobs"] = jobs
    try:
        if len(jobs) < PARALLEL_MIN or workers < 2 or len(order) < 2 or \
                "fork" not in multiprocessing.get_all_start_methods():
            done = [_walk_group(g) for g in order]
        else:
            with ProcessPoolExecutor(min(workers, len(order)), mp_context=multiprocessing.get_context("fork")) as pool:
                done = list(pool.map(_walk_group, order, chunksize=1))
    finally:
        _WORK.clear()
    out: list[Any] = [None] * len(jobs)
    for group, results in zip(order, done):
        for i, result in zip(group, results):
            out[i] = result
    return out


def _walk_group(group: list[int]) -> list[Any]:
    out, prior = [], None
    for i in group:
        vs, cols = _WORK["jobs"][i]
        try:
            out.append(vs(cols, prior))
            prior = vs.evaluator
        except Fallback as exc:
            out.append(exc)
        vs.evaluator = None
    return out
