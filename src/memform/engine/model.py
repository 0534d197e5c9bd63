"""The Python API: load a config, bind it to its formula files, and estimate every stage.

    >>> import memform
    >>> est = memform.estimate("configs/llama2-7b.yaml", overrides={"parallel.tp": 2})
    >>> est.peak_bytes, est.stages[0].values["activations"]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

from ..errors import MemformError
from ..lang import ast
from ..lang.loader import load_program, resolve_formula_path
from ..lang.program import Program
from .binding import Bound, bind, get_path
from .config import (Structure, apply_overrides, check_keys, formula_files, known_keys, normalize, read_yaml,
                     structure)
from .interpreter import Interpreter, StageResult, to_bytes
from .partition import MAX_LAYERS, Partition, StackItem, build_partition
from .results import EstimateNumbers, group_label, with_devices
from .walker import Ctx, Walker

ConfigSource = str | Path | Mapping[str, Any]


@dataclass
class Model:
    """A config bound to its formula program: everything needed to evaluate it."""

    data: dict[str, Any]
    source: Path | None
    program: Program
    bound: Bound
    structure: Structure

    def evaluator(self, *, resolve: bool = True, keep: frozenset[str] | None = None) -> Walker:
        """An evaluator of this model: sympy's, or the numeric one for a model loaded with ``numeric=True``."""
        return self.bound.evaluator(self.program, resolve=resolve, keep=keep)

    def symbol_name_for_key(self, path: str) -> str | None:
        """The name of the ``symbol`` bound to config key ``path``; None if none is."""
        for name, b in self.program.bindings.items():
            if b.keyword == "symbol" and b.path == path:
                return name
        return None

    def symbol_for_key(self, path: str) -> Any:
        """The sympy Symbol bound to config key ``path``; None if none is."""
        name = self.symbol_name_for_key(path)
        return None if name is None else self.bound.symbols[name]

    def value_for_key(self, path: str) -> Any:
        """The bound value (config or default) of the symbol or option read from ``path``; None if unbound."""
        for name, b in self.program.bindings.items():
            if b.path == path:
                return self.bound.value_of(name)
        return None


@dataclass
class Estimate(EstimateNumbers):
    """Per-stage results for one config (see :meth:`to_dict` for the JSON shape)."""

    name: str
    stages: list[StageResult]
    partition: Partition
    assumptions: list[str]
    capacity_bytes: int
    model: Model = field(repr=False)

    @cached_property
    def parameters(self) -> dict[str, int]:
        """The model's own parameter count (``total``, ``expert``, ``dense``): see :func:`parameter_counts`."""
        return parameter_counts(self.model)

    @cached_property
    def setup(self) -> dict[str, Any]:
        """The run's shape as the formulas see it: see :func:`setup_of`."""
        return setup_of(self.model)

    @property
    def schedule(self) -> str:
        return self.model.structure.schedule

    @property
    def framework(self) -> str:
        return self.model.structure.framework

    @property
    def pp(self) -> int:
        return self.model.structure.pp

    @property
    def vpp(self) -> int:
        return self.model.structure.vpp

    @property
    def recompute(self) -> str:
        return self.model.structure.recompute

    def stage_labels(self, stage: int) -> list[list[str]]:
        return [[group_label(g.count_value, g.block, g.mode) for g in c.groups] for c in self.partition.chunks[stage]]

    def terminal_label(self, stage: int) -> str:
        return " ".join(f"{g.count_value}x{g.block}" for c in self.partition.chunks[stage] for g in c.groups)

    def to_dict(self, symbolic: bool = False) -> dict[str, Any]:
        """The ``--json`` shape; ``symbolic`` adds the assumptions and each stage's closed form."""
        out = self.numbers_dict()
        if symbolic:
            from .symbolic import closed_form_text
            out["assumptions"] = list(self.assumptions)
            for row, s in zip(out["stages"], self.stages):
                row["symbolic"] = closed_form_text(s.total_expr)
        return out


def load_model(config: ConfigSource, overrides: Mapping[str, Any] | list[str] | None = None, *,
               numeric: bool = False) -> Model:
    """Read a config (path or mapping), apply overrides, load its formulas and bind values
    (``numeric``: as plain numbers, for :class:`~.numeric.NumericEvaluator`; sympy is not imported)."""
    if isinstance(config, Mapping):
        raw, source = dict(config), None
    else:
        source = Path(config)
        raw = read_yaml(source)
    data = normalize(apply_overrides(raw, overrides), source)
    program = _program(data, source)
    check_keys(data, known_keys(program.bindings))
    st = structure(data, list(program.schedules()))
    bound = bind(program, data, numeric=numeric)
    _check_devices(data, bound, program)
    _check_requires(program, bound)
    return Model(data, source, program, bound, st)


def rebind(model: Model, overrides: Mapping[str, Any], *, check: bool = True) -> Model:
    """``model`` with dotted-key ``overrides`` applied, reusing its parsed program (no re-parse).

    What a planner or solver calls once per candidate. When ``training.global_batch_size``
    is set the micro-batch count is derived again (unless overridden), as :func:`load_model`
    would. ``check=False`` skips the device-count and ``require`` checks (for callers that
    check them themselves, vectorized).
    """
    data = apply_overrides(model.data, overrides)
    training = data.get("training")
    if (isinstance(training, dict) and training.get("global_batch_size") is not None
            and "training.num_micro_batches" not in overrides):
        training.pop("num_micro_batches", None)
    data = normalize(data, model.source)
    program = model.program
    # another framework profile or formula list, or another answer to an `include ... when KEY`
    if formula_files(data) != formula_files(model.data) or not program.same_conditions(data):
        program = _program(data, model.source)
    check_keys(data, known_keys(program.bindings))
    st = structure(data, list(program.schedules()))
    bound = bind(program, data, numeric=model.bound.numeric)
    if check:
        _check_devices(data, bound, program)
        _check_requires(program, bound)
    return Model(data, model.source, program, bound, st)


def _program(data: Mapping[str, Any], source: Path | None) -> Program:
    """The formula program a normalized config names (its files, then its framework profile)."""
    base_dir = source.parent if source else Path.cwd()
    files = formula_files(data)
    program = load_program([resolve_formula_path(f, base_dir) for f in files], config=data)
    if program.stack is None:
        raise MemformError(f"the formula files {', '.join(files)} declare no 'stack' of layers")
    return program


def _check_devices(data: Mapping[str, Any], bound: Bound, program: Program) -> None:
    devices = get_path(data, "parallel.devices", None)
    if devices is None:
        return
    degrees = {}
    for key in ("parallel.dp", "parallel.tp", "parallel.pp", "parallel.cp"):
        for name, b in program.bindings.items():
            if b.path == key:
                degrees[key] = int(bound.value_of(name))
                break
    product = 1
    for v in degrees.values():
        product *= v
    if product != devices:
        expr = " × ".join(f"{k} ({v})" for k, v in degrees.items())
        raise MemformError(f"parallel.devices is {devices} but {expr} = {product}")


def _check_requires(program: Program, bound: Bound) -> None:
    ev = bound.evaluator(program, keep=frozenset())
    for r in program.requires:
        ok = ev.truth(ev.eval(r.expr, Ctx()), r.loc)
        if not ok:
            names = sorted({n.name for n in _refs(r.expr) if n.name in program.bindings})
            detail = ", ".join(f"{program.bindings[n].path} = {_show(bound.value_of(n))}" for n in names)
            # a requirement on lets alone names no config value: no empty "(; " in front of its location
            raise MemformError(f"{r.message} ({detail + '; ' if detail else ''}requirement at {r.loc})")


def _show(v: Any) -> str:
    if type(v) is int or getattr(v, "is_Integer", False):
        return str(int(v))
    return str(v).lower() if isinstance(v, bool) else str(v)


def _refs(expr: ast.Expr):
    from ..lang.checker import walk
    return [n for n in walk(expr) if isinstance(n, ast.Ref) and n.attr is None]


def stack_items(model: Model, ev: Walker) -> list[StackItem]:
    items = []
    numeric: Walker | None = None
    body_seen = 0  # body layers laid out before this entry: the `layer_index` of its first layer
    for e in model.program.stack.entries:
        if e.count is None:
            count = ev.integer(1)
        else:
            count = ev.as_expr(ev.eval(e.count, Ctx()), e.loc)
        value = ev.number(count, e.loc, f"count of '{e.block}' in the stack")
        if not ev.is_integer(value) or value < 0:
            raise MemformError(f"count of '{e.block}' in the stack must be a non-negative integer, got {value}",
                               e.loc)
        n = int(value)
        if (e.cond is None and not e.bindings) or n == 0:
            items.append(StackItem(e.place, e.block, count, n))
        else:
            if numeric is None:  # choices and bindings are decided per layer at the config's values
                numeric = model.evaluator(keep=frozenset())
            items.extend(_choose_layers(numeric, e, count, n, body_seen if e.place is None else 0))
        if e.place is None:
            body_seen += n
    return items


def _choose_layers(ev: Walker, e: ast.StackEntry, count: Any, n: int, first: int) -> list[StackItem]:
    """``e.block * n if c1 else b1 if c2 else other where x = v``: one block per layer (the first whose
    condition holds) with its own bound values, consecutive equal ones merged into a run. An entry whose
    layers all pick one block with the same values keeps its count as written (symbolic closed forms)."""
    if n > MAX_LAYERS:
        raise MemformError(f"the stack entry '{e.block}' has {n} layers; memform lays out at most {MAX_LAYERS} "
                           f"(check model.num_layers and the stack counts)", e.loc)
    conds = ([(e.cond, e.block)] if e.cond is not None else []) + [(c, b) for c, b in e.branches]
    final = e.other if e.cond is not None else e.block
    picks: list[tuple[str, tuple]] = []
    checked: set[tuple] = set()
    for j in range(n):
        ctx = Ctx(params=(("layer_index", ev.integer(first + j)),))
        block = final
        for cond, b in conds:
            ok = ev.truth(ev.eval(cond, ctx), cond.loc)
            if not isinstance(ok, bool):
                raise MemformError(f"the choice of layer {first + j} in the stack does not reduce to true or false",
                                   e.loc)
            if ok:
                block = b
                break
        bound = _bind_layer(ev, e, ctx, first + j)
        if bound and bound not in checked:
            _check_layer_requires(ev, e, bound, first + j)
            checked.add(bound)
        picks.append((block, bound))
    runs: list[list] = []
    for pick in picks:
        if runs and runs[-1][0] == pick:
            runs[-1][1] += 1
        else:
            runs.append([pick, 1])
    if len(runs) == 1:
        (block, bound), _ = runs[0]
        return [StackItem(e.place, block, count, n, bound)]
    return [StackItem(e.place, block, ev.integer(k), k, bound) for (block, bound), k in runs]


def _check_layer_requires(ev: Walker, e: ast.StackEntry, bound: tuple, layer: int) -> None:
    """Every ``require`` holds at a layer's own ``where`` values too: a per-layer K/V head count that
    parallel.tp does not divide is refused as the config-wide one is (each distinct set checked once)."""
    for r in ev.program.requires:
        ok = ev.truth(ev.eval(r.expr, Ctx(overrides=bound)), r.loc)
        if not ok:
            shown = ", ".join(f"{n} = {_show(v)} in place of {ev.program.bindings[n].path}" for n, v in bound)
            raise MemformError(f"{r.message} (at layer {layer} of the stack entry '{e.block}': {shown}; "
                               f"requirement at {r.loc})")


def _bind_layer(ev: Walker, e: ast.StackEntry, ctx: Ctx, layer: int) -> tuple:
    """The ``where`` values of one layer, sorted by name (the order ``x where n = v`` keeps them in):
    numbers, names or truth values, never an expression of a symbol (the layer's closed forms hold
    the number)."""
    out = []
    for name, expr in e.bindings:
        v = ev.eval(expr, ctx)
        if not isinstance(v, (bool, str, tuple)):
            v = ev.number(ev.as_expr(v, expr.loc), expr.loc, f"'where {name} = ...' of layer {layer}")
        out.append((name, v))
    return tuple(sorted(out, key=lambda kv: kv[0]))


def partition_of(model: Model, ev: Walker) -> Partition:
    st = model.structure
    sched = st.schedule
    placement = "interleaved"
    if model.program.find_quantity(sched, "placement") is not None:
        placement = ev.eval(model.program.pick(sched, "placement", None).expr, Ctx(block=sched))
        if not isinstance(placement, str):
            raise MemformError(f"schedule '{sched}': placement must be a string", model.program.blocks[sched].loc)
    pieces = None   # the numeric backend's counts are plain numbers: no symbolic piece count
    p_name = model.symbol_name_for_key("parallel.pp")
    if p_name is not None and ev.keeps(p_name):
        v_sym = model.symbol_for_key("parallel.vpp")
        pieces = model.bound.symbols[p_name] * (v_sym if v_sym is not None and st.vpp > 1 else 1)
    elif p_name is not None and not model.bound.numeric:
        pieces = ev.integer(st.pp * st.vpp)

    items = stack_items(model, ev)
    if st.recompute_layers is not None:
        body = sum(i.count_value for i in items if i.place is None)
        if len(st.recompute_layers) != body:
            raise MemformError(f"config key 'training.recompute_layers' lists {len(st.recompute_layers)} modes but "
                               f"the stack has {body} body layers; give one mode per body layer")

    def mode_of(stage: int, chunk: int, index: int | None, block: str, *, index_in_chunk: int | None = None,
                body_index: int | None = None) -> str:
        return st.layer_mode(stage, index_in_chunk, body_index)

    return build_partition(items, pp=st.pp, vpp=st.vpp, placement=placement,
                           stage_layers=st.stage_layers, mode_of=mode_of, pieces_symbol=pieces, integer=ev.integer)


def estimate(config: ConfigSource, overrides: Mapping[str, Any] | list[str] | None = None, *,
             resolve: bool = True, keep: frozenset[str] | None = None, numeric: bool = False) -> Estimate:
    """Estimate per-stage peak memory of ``config`` (path or mapping), with dotted ``overrides``.

    ``numeric=True``: the numbers alone, from the numeric evaluator (no sympy; every stage's
    ``exprs`` are then numbers too, and there are no assumptions); it raises
    :class:`~.numeric.Inexact` where a formula's value is irrational."""
    model = load_model(config, overrides, numeric=numeric)
    return estimate_model(model, resolve=resolve, keep=keep)


def estimate_numbers(config: ConfigSource, overrides: Mapping[str, Any] | list[str] | None = None) -> Estimate:
    """The estimate's numbers without closed forms: the numeric evaluator's (no sympy), or, where a formula's
    value is irrational (:class:`~.numeric.Inexact`), the sympy evaluator's with every symbol replaced by its
    value. tests/test_numeric.py holds them equal to the symbolic estimate's on every bundled config and profile;
    what reads numbers only (compare, plot, the fast path's first answer) reads them here, 3-12x cheaper."""
    from .numeric import Inexact
    try:
        return estimate(config, overrides, numeric=True)
    except Inexact:
        return estimate(config, overrides, keep=frozenset())


def estimate_model(model: Model, *, resolve: bool = True, keep: frozenset[str] | None = None) -> Estimate:
    ev = model.evaluator(resolve=resolve, keep=keep)
    part = partition_of(model, ev)
    interp = Interpreter(model.program, ev, model.structure.schedule)
    stages = [interp.stage(i, part, model.structure.capacity_bytes) for i in range(model.structure.pp)]
    if resolve:
        from ..allocator.estimate import apply as apply_allocator
        apply_allocator(stages, model)
    return Estimate(model.structure.name, stages, part, list(ev.assumptions), model.structure.capacity_bytes, model)


#: the sharding degrees set to 1 to count a model's own parameters (every stage, unsharded)
UNSHARDED = {"parallel.tp": 1, "parallel.ep": 1, "parallel.expert_tp": 1, "parallel.cp": 1}
#: a MoE layer's routed-expert parameters (``formulas/moe.mf``); the rest of its parameters are dense
EXPERT_QUANTITY = "expert_params"


def parameter_counts(model: Model) -> dict[str, int]:
    """The model's own parameter count, before TP/PP/EP/CP sharding: every stack entry's
    per-layer ``params`` quantity evaluated with those degrees set to 1, times its layer count
    (the pipeline split only moves layers, so it needs no undoing). ``expert`` counts the
    blocks' ``expert_params`` (routed experts; 0 for a dense model) and ``dense`` the rest."""
    total, expert = parameter_exprs(model, frozenset())
    total_i, expert_i = to_bytes(total), to_bytes(expert)
    return {"total": total_i, "expert": expert_i, "dense": total_i - expert_i}


def parameter_exprs(model: Model, keep: frozenset[str]) -> tuple[Any, Any]:
    """Total and expert parameter counts as expressions in the ``keep`` symbols (exact numbers
    when ``keep`` is empty); the degrees of :data:`UNSHARDED` are set to 1 first."""
    overrides = {k: v for k, v in UNSHARDED.items() if any(b.path == k for b in model.program.bindings.values())}
    flat = rebind(model, overrides, check=False) if overrides else model
    fixed = {name for name, b in model.program.bindings.items() if b.path in overrides}
    ev = flat.evaluator(resolve=False, keep=frozenset(keep - fixed))
    total = expert = ev.zero
    for item in stack_items(flat, ev):
        if item.count_value == 0:
            continue
        total += item.count_value * _layer_quantity(flat, ev, item.block, "params", item.bindings)
        if flat.program.find_quantity(item.block, EXPERT_QUANTITY) is not None:
            expert += item.count_value * _layer_quantity(flat, ev, item.block, EXPERT_QUANTITY, item.bindings)
    return total, expert


def _layer_quantity(model: Model, ev: Walker, block: str, name: str, bindings: tuple = ()) -> Any:
    q = model.program.pick(block, name, "none")
    value = ev.as_expr(ev.quantity(block, name, "none", overrides=bindings), q.loc)
    return value if ev.keep else ev.number(value, q.loc, f"{block}.{name}")


#: the run's shape shown in every header: label -> config key (those the formulas bind)
SETUP_KEYS = {"tp": "parallel.tp", "dp": "parallel.dp", "pp": "parallel.pp", "vpp": "parallel.vpp",
              "cp": "parallel.cp", "ep": "parallel.ep", "micro_batch_size": "training.micro_batch_size",
              "num_micro_batches": "training.num_micro_batches", "seq_length": "model.seq_length"}


def setup_of(model: Model) -> dict[str, Any]:
    """Parallel degrees, micro-batching and sequence length as bound (a key the formulas do not
    bind is left out, e.g. ``ep`` for a dense model), plus ``devices`` = dp × tp × pp × cp
    (the product ``parallel.devices`` is checked against; expert parallelism works inside dp)."""
    paths = {b.path: name for name, b in model.program.bindings.items()}
    out: dict[str, Any] = {}
    for label, path in SETUP_KEYS.items():
        if path in paths:
            out[label] = _plain_number(model.bound.value_of(paths[path]))
    return with_devices(out)


def _plain_number(v: Any) -> Any:
    if type(v) is int:
        return v
    if type(v) is Fraction:
        return float(v)
    if getattr(v, "is_number", False) is True:  # a sympy number
        return int(v) if v.is_integer else float(v)
    return v
