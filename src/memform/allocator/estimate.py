"""An estimate's reserved figure: its stages' per-layer figures replayed through the allocator model.

The allocator's settings are the config's ``allocator.*`` keys (``formulas/common.mf``); whether the
framework keeps its gradients in buffers across steps is the formulas' ``grads_kept``. The reserve
(replayed reserved peak less the replayed requested peak) is added to memform's allocated figure, so the
reserved figure is never below it; when it exceeds the device, the same sequence is replayed against the
device's capacity: the allocator releases its cached segments and retries before it raises out of memory,
so a job may still fit (more slowly: every release synchronises the device).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

from .caching import AllocatorConfig, OutOfMemory, replay
from .sequence import GROUP_FIGURES, LayerBlocks, ShardedStates, from_estimate

# the engine's Model, StageResult and StageNumbers are taken by duck typing (the engine imports this
# package, not the other way round)
Model = StageResult = StageNumbers = Any

MIB = 2 ** 20


@dataclass(frozen=True)
class Kept:
    """What the framework keeps across steps, as its formulas say: gradients in persistent buffers
    (``grads_kept``) and optimizer states of a DP-sharded flat buffer (``opt_flat_*``: :class:`ShardedStates`;
    None: each parameter's states sharded evenly, or not at all)."""

    grads: bool = False
    sharded: ShardedStates | None = None
    #: per pipeline stage, where an ``opt_flat_*`` let reads ``stage`` (Megatron buckets stage 0 only); empty:
    #: ``sharded`` for every stage
    staged: tuple[ShardedStates | None, ...] = ()

    def at(self, stage: int) -> "Kept":
        """What stage ``stage`` keeps."""
        return Kept(self.grads, self.staged[stage]) if self.staged else self


#: the formulas' lets that describe a DP-sharded flat buffer (frameworks/megatron.mf), ShardedStates' fields
SHARDED_LETS = (("opt_flat_shards", "shards"), ("opt_flat_masters", "masters"), ("opt_flat_moments", "moments"),
                ("opt_flat_bucket", "bucket"))


@dataclass(frozen=True)
class StageReserve:
    """One stage under the allocator model: the reserve beyond the allocated bytes, whether the sequence
    ran out of memory on the device, and how many cache releases it needed to fit."""

    reserve: int
    oom: bool
    releases: int
    segments: int


def settings(model: "Model") -> tuple[AllocatorConfig | None, Kept]:
    """The allocator config of ``model`` (None: ``allocator.model: none``) and what the formulas keep
    across steps (:class:`Kept`: ``grads_kept``, ``opt_flat_*``)."""
    # a program whose formula files do not declare the allocator's keys (a user's own base) is replayed
    # with PyTorch's defaults
    if model.value_for_key("allocator.model") == "none":
        return None, Kept()
    split = float(model.value_for_key("allocator.max_split_size_mb") or 0)
    config = AllocatorConfig(expandable_segments=bool(model.value_for_key("allocator.expandable_segments")),
                             max_split_size=int(split * MIB) if split > 0 else None)
    lets = model.program.lets
    ev = model.evaluator() if "grads_kept" in lets or SHARDED_LETS[0][0] in lets else None
    grads = ev is not None and "grads_kept" in lets and bool(ev.let("grads_kept"))
    if ev is None or not all(name in lets for name, _ in SHARDED_LETS):
        return config, Kept(grads)

    def sharded(stage: int | None) -> ShardedStates | None:
        at = None if stage is None else ev.integer(stage)
        values = {field: int(ev.ceil_int(ev.number(ev.let(name, stage=at)))) for name, field in SHARDED_LETS}
        return ShardedStates(**values) if values["shards"] > 1 else None

    if staged_sharding(model):
        return config, Kept(grads, None, tuple(sharded(i) for i in range(model.structure.pp)))
    return config, Kept(grads, sharded(None))


def staged_sharding(model: "Model") -> bool:
    """Whether an ``opt_flat_*`` let reads ``stage`` (its value is then the stage's: Megatron's buckets)."""
    readers = model.program.stage_readers()[0]
    return any(name in readers for name, _ in SHARDED_LETS)


def settings_dict(model: "Model") -> dict[str, Any] | None:
    """:func:`settings` as plain data (stored with a compiled fast-path entry)."""
    config, kept = settings(model)
    if config is None:
        return None

    def fields(st: ShardedStates | None) -> list[int] | None:
        return None if st is None else [getattr(st, f) for _, f in SHARDED_LETS]

    out = {"expandable": config.expandable_segments, "split": config.max_split_size, "grads_kept": kept.grads,
           "sharded": fields(kept.sharded)}
    if kept.staged:
        out["staged"] = [fields(st) for st in kept.staged]
    return out


def from_settings_dict(d: dict[str, Any], outs: Sequence[int] = ()) -> tuple[AllocatorConfig, Kept]:
    """:func:`settings_dict`'s data back as objects. A compiled structure's ``sharded`` entry is
    ``["out", [indices]]``: the ``opt_flat_*`` values are that evaluation's ``outs`` (they follow dp); ``staged``,
    where present, one such entry per pipeline stage."""
    def states(sharded: Any) -> ShardedStates | None:
        if sharded is not None and sharded[0] == "out":
            sharded = [int(outs[i]) for i in sharded[1]]
        return None if sharded is None or sharded[0] <= 1 else ShardedStates(*sharded)

    return (AllocatorConfig(expandable_segments=d["expandable"], max_split_size=d["split"]),
            Kept(d["grads_kept"], states(d.get("sharded")), tuple(states(x) for x in d.get("staged", ()))))


#: the layer quantities (formulas/common.mf ``layer``) the replay reads besides the categories, with the
#: value taken where a program's formula files do not define them
GRANULARITY = (("bwd_transient", 0), ("weight_tensors", 1), ("act_tensor", 0), ("fwd_extra", 0), ("bwd_tensor", 0),
               ("fwd_tensor", 0), ("fwd_slot", 0), ("fwd_until", 0), ("after_bwd", 0))
#: those that may be lists (``tensors(...)``)
LISTS = ("weight_tensors", "act_tensor", "bwd_tensor", "fwd_tensor", "fwd_slot", "fwd_until")


def granularity_exprs(model: "Model", ev: Any, block: str, mode: str, bindings: tuple = ()) -> list[Any]:
    """The layer's ``bwd_transient``, ``weight_tensors``, ``act_tensor``, ``fwd_extra``, ``bwd_tensor``,
    ``fwd_tensor``, ``fwd_slot``, ``fwd_until`` and ``after_bwd`` (see ``formulas/common.mf``),
    each at least 0 (``weight_tensors`` at least 1); the last two may be lists (``tensors(...)``: the
    sizes of the layer's tensors), given as tuples of expressions, each entry at least 0."""
    out: list[Any] = []
    for name, default in GRANULARITY:
        q = model.program.pick(block, name, mode)
        v = ev.integer(default) if q is None else ev.quantity(block, name, mode, overrides=bindings)
        if isinstance(v, tuple) and name in LISTS:
            out.append(tuple(ev.at_least(0, ev.as_expr(x, q.loc)) for x in v))
        else:
            out.append(ev.at_least(1 if name == "weight_tensors" else 0, ev.as_expr(v, None if q is None else q.loc)))
    return out


def granularity_numbers(ev: Any, exprs: list[Any]) -> list[Any]:
    """:func:`granularity_exprs`' values as whole bytes (rounded up; tuples entry by entry)."""
    return [tuple(ev.ceil_int(ev.number(x)) for x in e) if isinstance(e, tuple) else ev.ceil_int(ev.number(e))
            for e in exprs]


def layer_blocks(stage: "StageResult", model: "Model", ev: Any,
                 memo: dict[tuple[str, str, tuple], list[int]] | None = None) -> list[LayerBlocks]:
    """The stage's layers in forward order, one :class:`LayerBlocks` per layer (interpreted estimate).
    ``memo``: the granularity figures per (block, mode), shared by the stages of one estimate."""
    layers: list[LayerBlocks] = []
    memo = {} if memo is None else memo
    for g in stage.layers:
        v: dict[str, Any] = g.per_layer_values
        key = (g.block, g.mode, g.bindings)
        extra = memo.get(key)
        if extra is None:
            extra = memo[key] = granularity_numbers(ev, granularity_exprs(model, ev, g.block, g.mode, g.bindings))
        # every figure rounded up to whole bytes, as the interpreter's stage figures
        lb = LayerBlocks(*(ev.ceil_int(v[c]) for c in GROUP_FIGURES), ev.ceil_int(g.inflight_value), *extra)
        layers += [lb] * g.count_value
    return layers


@lru_cache(maxsize=2)
def _events(layers: tuple[LayerBlocks, ...], kept: Kept) -> list:
    """A stage's sequence, kept for its replay against the device's capacity right after the unbounded one."""
    return from_estimate(layers, grads_persist=kept.grads, sharded=kept.sharded)


@lru_cache(maxsize=64)
def _unbounded(layers: tuple[LayerBlocks, ...], config: AllocatorConfig, grads_kept: Kept) -> Any:
    """The replay of a stage's sequence without a capacity: the stages of a pipeline's middle hold the
    same layers, so one replay serves them all."""
    return replay(_events(layers, grads_kept), config)


def stage_reserve(stage: "StageNumbers", layers: list[LayerBlocks], config: AllocatorConfig,
                  grads_kept: Kept) -> StageReserve:
    """Replay the stage's synthesized two-step sequence; see the module docstring."""
    layers = tuple(layers)
    free = _unbounded(layers, config, grads_kept)
    reserve = max(0, free.peak_reserved - free.peak_requested)
    oom, releases = False, 0
    model_bytes = stage.model_bytes
    if model_bytes + reserve + stage.runtime_bytes > stage.capacity_bytes:
        room = stage.capacity_bytes - stage.runtime_bytes - max(0, model_bytes - free.peak_requested)
        try:
            bounded = replay(_events(layers, grads_kept),
                             AllocatorConfig(config.expandable_segments, config.max_split_size, capacity=max(0, room)))
            releases = bounded.releases
        except OutOfMemory:
            oom = True
    return StageReserve(reserve, oom, releases, free.segments)


def set_reserve(stage: "StageNumbers", layers: list[LayerBlocks], config: AllocatorConfig, grads_kept: Kept) -> None:
    r = stage_reserve(stage, layers, config, grads_kept)
    stage.set_reserve(r.reserve, r.oom, r.releases)


def defer_reserve(stage: "StageNumbers", layers: list[LayerBlocks], config: AllocatorConfig, grads_kept: Kept) -> None:
    """:func:`set_reserve` on the stage's first use of its reserve (the fast path's numbers stay cheap)."""
    stage._reserve_pending = lambda st: set_reserve(st, layers, config, grads_kept)


def apply(stages: list["StageResult"], model: "Model") -> None:
    """Give each stage its ``reserve`` (and whether it fits under the allocator model), computed on
    first use."""
    config, kept = settings(model)
    if config is None:
        return
    # deferred to the stage's first use of its reserve (``fits`` reads it): an estimate whose peaks alone
    # are read (a loop over configs, a planner) never replays
    shared: dict[str, Any] = {}

    def replay_stage(st: "StageNumbers", s: "StageResult") -> None:
        if "ev" not in shared:
            shared["ev"], shared["memo"] = model.evaluator(), {}
        set_reserve(st, layer_blocks(s, model, shared["ev"], shared["memo"]), config, kept.at(s.stage))

    for s in stages:
        s._reserve_pending = lambda st, s=s: replay_stage(st, s)
