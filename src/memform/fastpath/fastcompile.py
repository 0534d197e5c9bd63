"""Compiling one config *structure* into a fast-path entry (the cache-miss side; uses sympy).

The interpreter runs once with ``resolve=False`` keeping the config's numeric degrees and
micro-batching (:data:`memform.fastpath.compiled.NUMERIC_KEYS`, where the config sets them)
as symbols, so each closed form holds for every value of them. Everything an estimate prints
is compiled by :func:`memform.fastpath.scalar.compile_scalar` into one Python function of
those inputs: per stage every category, the parameter count, host bytes, each schedule moment
and which one is largest, each runtime block; the setup line's values and the model's
parameter counts. The same function also returns every condition under which the interpreter
would have answered the same numbers without an error: the formula files' ``require``
conditions, and each per-layer quantity, in-flight count, moment and runtime block being a
non-negative size of at most :data:`memform.engine.interpreter.MAX_BYTES`. Where one fails,
the caller falls back to the interpreter, which gives its own error or result.

Structures whose partition, options or exactness depend on the inputs are refused
(:class:`Uncompilable`) and always go through the interpreter.
"""

from __future__ import annotations

from typing import Any, Sequence

import sympy

from ..allocator.estimate import SHARDED_LETS, granularity_exprs, settings_dict, staged_sharding
from ..allocator.sequence import GROUP_FIGURES
from ..engine.evaluator import Ctx
from ..engine.interpreter import CATEGORIES, MAX_BYTES, PS_PER_SECOND
from ..engine.model import SETUP_KEYS, Model, estimate_model, parameter_exprs, setup_of
from ..engine.values import get_path
from ..errors import MemformError
from .compiled import _derived_symbols, _follow, _substitute
from .exact import NotExact
from .scalar import compile_scalar


class Uncompilable(Exception):
    """This structure cannot be evaluated by the fast path for every input (the reason is the message)."""


def compile_entry(model: Model, candidates: Sequence[str]) -> dict[str, Any]:
    """The JSON-ready entry for ``model``'s structure, with the ``candidates`` keys as inputs.

    Raises :class:`Uncompilable`, or :class:`memform.errors.MemformError` where the config
    itself is refused (the caller then runs the interpreter, which reports it).
    """
    inputs, symbols, limits = [], [], []
    for key in candidates:
        name = next((n for n, b in model.program.bindings.items() if b.keyword == "symbol" and b.path == key), None)
        if name is None:
            continue
        spec = model.program.bindings[name].type
        if spec.kind not in ("int", "real") or spec.or_bool or spec.or_list:
            continue
        inputs.append(key)
        symbols.append(model.bound.symbols[name])
        limits.append([spec.lo, spec.hi] if spec.kind == "int" and spec.lo is not None else None)
    kept = frozenset(s.name for s in symbols)
    derived = _derived_symbols(model, kept)
    keep = kept | frozenset(derived)
    keep_syms = {model.bound.symbols[n] for n in keep}
    follow = _follow(model, derived)
    _refuse_input_dependent(model, keep, keep_syms)

    est = estimate_model(model, resolve=False, keep=keep)
    for chunks in est.partition.chunks:
        for chunk in chunks:
            for g in chunk.groups:
                if sympy.sympify(g.count).free_symbols & keep_syms:
                    raise Uncompilable(f"the layer count of '{g.block}' depends on {', '.join(inputs)}")

    outs: list[Any] = []
    conds: list[Any] = []

    def out(expr: Any) -> int:
        outs.append(_substitute(expr, follow))
        return len(outs) - 1

    def size_guard(expr: Any) -> None:
        e = _substitute(sympy.sympify(expr), follow)
        if e.free_symbols:
            conds.append(sympy.And(e >= 0, e <= MAX_BYTES))

    stages = []
    ev_keep = model.evaluator(resolve=False, keep=keep)
    for s in est.stages:
        first = len(outs)
        for c in CATEGORIES:
            out(s.exprs[c])
        out(s.param_count_expr)
        out(s.host_expr)
        moments = list(s.moment_exprs)
        values = [_substitute(s.moment_exprs[m], follow) for m in moments]
        for v in values:
            out(v)
            size_guard(v)
        if len(moments) > 1:  # the first largest moment sets the peak (the interpreter's max)
            for i, vi in enumerate(values):
                out(sympy.And(*[vi > vj for vj in values[:i]], *[vi >= vj for vj in values[i + 1:]]))
        for name, e in s.runtime_exprs.items():
            out(e)
            size_guard(e)
        for name, e in s.time_exprs.items():  # seconds, as whole picoseconds (rounded up, as the interpreter)
            out(e * PS_PER_SECOND)
            size_guard(e)
        if s.time_exprs:
            out(s.ideal_expr * PS_PER_SECOND)
            size_guard(s.ideal_expr)
            out(s.tokens_expr)
            size_guard(s.tokens_expr)
        for layer in s.layers:
            size_guard(layer.inflight)
            for e in list(layer.per_layer.values()) + [layer.host]:
                size_guard(e)
        groups = []   # per layer group: its per-layer figures, in-flight count, backward transient (allocator)
        for layer in s.layers:
            at = len(outs)
            for c in GROUP_FIGURES:
                out(sympy.ceiling(layer.per_layer[c]))
            out(sympy.ceiling(layer.inflight))
            shape = []   # per granularity figure: 0 a number, k a list of k entries (tensors(...))
            for e in granularity_exprs(model, ev_keep, layer.block, layer.mode, layer.bindings):
                for x in (e if isinstance(e, tuple) else (e,)):
                    out(sympy.ceiling(x))
                    size_guard(x)
                shape.append(len(e) if isinstance(e, tuple) else 0)
            groups.append([int(layer.count_value), at] + ([shape] if any(shape) else []))
        stages.append({"first": first, "moments": moments, "runtime": list(s.runtime_exprs), "groups": groups,
                       "time": list(s.time_exprs),
                       "labels": est.stage_labels(s.stage),
                       "terminal": est.terminal_label(s.stage)})

    setup = {}
    constants = setup_of(model)
    paths = {b.path: name for name, b in model.program.bindings.items()}
    for label, path in SETUP_KEYS.items():
        if path not in paths:
            continue
        name = paths[path]
        if name in kept:
            setup[label] = ["input", inputs.index(path)]
        elif name in derived:
            value = derived[name]
            conds.append(sympy.Eq(value, sympy.floor(value)))
            setup[label] = ["out", out(value)]
        else:
            setup[label] = ["const", constants[label]]
    for name, value in derived.items():  # what binding checks of a default: a positive (integer) number
        conds.append(value > 0)
        if model.program.bindings[name].type.kind == "int":
            conds.append(sympy.Eq(value, sympy.floor(value)))

    total, expert = (_substitute(e, follow) for e in parameter_exprs(model, keep))
    parameters = {k: (["out", out(e)] if e.free_symbols else ["const", int(sympy.ceiling(e))])
                  for k, e in (("total", total), ("expert", expert))}

    allocator = _allocator_settings(model, ev_keep, out)
    ev = model.evaluator(resolve=False, keep=keep)
    for r in model.program.requires:
        c = ev.truth(ev.eval(r.expr, Ctx()), r.loc)
        if c is False:
            raise Uncompilable(f"'{r.message}' fails for every value of {', '.join(inputs)}")
        if c is not True:
            conds.append(_substitute(c, follow))
    conds = [c for c in conds if c is not sympy.true and c is not True]
    if any(c is sympy.false or c is False for c in conds):
        raise Uncompilable("a size is out of range for every input value")
    cond_first = len(outs)
    outs.extend(conds)
    try:
        source = compile_scalar(outs, symbols)
    except NotExact as exc:
        raise Uncompilable(f"not exact in integers: {exc}") from None
    st = model.structure
    # candidates the formula files do not bind as symbols are not inputs: an entry holds only for
    # the values this config gives them (they are left out of the structure key like the inputs)
    fixed = {key: get_path(model.data, key, None) for key in candidates if key not in inputs}
    return {
        "inputs": inputs, "limits": limits, "fixed": fixed, "source": source, "conditions": cond_first,
        "name": est.name, "schedule": st.schedule, "framework": st.framework, "pp": st.pp, "vpp": st.vpp,
        "recompute": st.recompute, "capacity_bytes": est.capacity_bytes, "devices": get_path(model.data,
                                                                                              "parallel.devices", None),
        "stages": stages, "setup": setup, "parameters": parameters, "allocator": allocator,
    }


def _allocator_settings(model: Model, ev_keep: Any, out: Any) -> dict[str, Any] | None:
    """:func:`memform.allocator.estimate.settings_dict` for a structure: the DP-sharded flat buffer's
    ``opt_flat_*`` lets follow the inputs (Megatron's shards are the dp degree, its bucket max(4e7,
    1e6 dp) parameters), so they are outputs of the compiled function (``["out", [indices]]``), not the
    compiling config's values; ``grads_kept`` must be the same for every input."""
    allocator = settings_dict(model)
    if allocator is None:
        return None
    lets = model.program.lets
    if "grads_kept" in lets:
        g = ev_keep.let("grads_kept")
        if isinstance(g, sympy.Basic) and not isinstance(g, sympy.logic.boolalg.BooleanAtom) and g.free_symbols:
            raise Uncompilable("whether gradients stay in persistent buffers (grads_kept) depends on an input")
    if all(name in lets for name, _ in SHARDED_LETS):
        def outs(stage: int | None) -> list[Any]:
            at = None if stage is None else ev_keep.integer(stage)
            return ["out", [out(sympy.ceiling(sympy.sympify(ev_keep.let(name, stage=at)))) for name, _ in SHARDED_LETS]]
        if staged_sharding(model):   # one entry per pipeline stage (Megatron buckets stage 0 only)
            allocator["sharded"] = None
            allocator["staged"] = [outs(i) for i in range(model.structure.pp)]
        else:
            allocator["sharded"] = outs(None)
    return allocator


def _refuse_input_dependent(model: Model, keep: frozenset[str], keep_syms: set[sympy.Symbol]) -> None:
    """Options whose default follows an input, or stack choices that depend on one, would be
    frozen at the config's own values: such structures stay with the interpreter."""
    ev = model.evaluator(resolve=False, keep=keep)
    for name, decl in model.program.bindings.items():
        if decl.keyword != "option" or decl.default is None or get_path(model.data, decl.path, None) is not None:
            continue
        v = ev.eval(decl.default, Ctx())
        if isinstance(v, sympy.Basic) and v.free_symbols & keep_syms:
            raise Uncompilable(f"the default of option '{name}' depends on an input")
    for e in model.program.stack.entries:
        for expr in (e.count, e.cond, *(c for c, _ in e.branches), *(x for _, x in e.bindings)):
            if expr is None:
                continue
            try:
                v = ev.eval(expr, Ctx(params=(("layer_index", sympy.Symbol("layer_index", integer=True)),)))
            except MemformError:
                raise Uncompilable(f"the stack entry '{e.block}' cannot be checked for inputs") from None
            if isinstance(v, sympy.Basic) and (v.free_symbols & keep_syms):
                raise Uncompilable(f"the stack entry '{e.block}' depends on an input")
