"""The allocation sequence of a training step, for :func:`~memform.allocator.caching.replay`.

What the caching allocator reserves depends on the order of allocations, not only on their peak sum,
and on the history before the step: its segments are kept from one step to the next. The sequence is
therefore two steps long. The first one places the tensors that live across steps (the optimizer
states are created by the first ``optimizer.step()``, after the backward freed the activations, and
take their place in the cached blocks); the second one runs in the segments the first one left, which
is where a step's reserve beyond its allocated peak comes from (what ``torch.cuda.max_memory_reserved``
shows from the second step on).

Two sources:

- :func:`from_samples`: a step the validation harness traced (every storage an ATen op made, sampled
  after each op; :class:`~memform.validation.samples.StorageSamples`); storages freed between two ops are
  freed before the next op's outputs are allocated, as they are in eager PyTorch;
- :func:`from_estimate`: without a trace, memform's own figures of a stage, one block per layer and
  category: the parameters, gradients and optimizer states of each layer; each layer's saved activations
  per in-flight micro-batch, allocated in forward order and freed in reverse; what each layer's
  backward allocates on top of its saved activations (``bwd_transient``, the term of the schedule's
  backward moment), allocated at its backward and freed when it ends; the
  layer's communication buffer on a stream of its own (FSDP's and ZeRO's all-gather / reduce-scatter run
  on side streams, whose cached blocks the compute stream never reuses). Tensors inside a layer are told apart by the
  layer's granularity quantities (``formulas/common.mf``): a number of equal weight pieces and one
  activation size, or the real sizes as lists (``tensors(...)``: the weight tensors' element counts, the
  saved tensors' bytes, what a fully recomputed layer rebuilds). A forward's short-lived temporaries are
  replayed where the formulas list them (``fwd_tensor``, placed among the saved tensors by ``fwd_slot`` /
  ``fwd_until``: :func:`forward_plan`; a fully recomputed layer's in its backward's rebuild); elsewhere
  they are not: a lower bound on the trace's reserve where they fragment. What the framework allocates
  after the backward and frees before the optimizer step (``after_bwd``: a gradient reduction's flat copy
  of the whole stage, DeepSpeed's BF16_Optimizer) is one tensor of the layers' summed shares, allocated
  once the step's activations are freed.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from typing import Callable, Hashable, Iterable, Sequence

from .caching import Event

COMPUTE, COMM = 0, "comm"
#: a layer's figures, as :class:`LayerBlocks` takes them (after them: the in-flight count)
GROUP_FIGURES = ("params", "grads", "optimizer", "activations", "comm")


def from_samples(samples: Sequence[Iterable[tuple[int, int]]], stream_of: Callable[[int], Hashable] = lambda s: COMPUTE,
                 tag: str = "") -> list[Event]:
    """The events between consecutive live sets ``samples[i]`` = ((serial, bytes), ...): storages that
    disappear (or change size: FSDP resizes its unsharded storages in place) are freed first, then those
    that appear are allocated. Keys are ``(tag, serial)``; what is live after the last sample stays live."""
    events: list[Event] = []
    prev: dict[int, int] = {}
    for live in samples:
        now = dict(live)
        for s, n in prev.items():
            if n and now.get(s) != n:
                events.append(("free", (tag, s)))
        for s, n in now.items():
            if n and prev.get(s) != n:
                events.append(("alloc", (tag, s), n, stream_of(s)))
        prev = now
    return events


def live_keys(events: Iterable[Event]) -> list[Hashable]:
    """Keys allocated and not freed by the end of ``events``, in allocation order."""
    live: dict[Hashable, None] = {}
    for ev in events:
        if ev[0] == "alloc":
            live[ev[1]] = None
        else:
            live.pop(ev[1], None)
    return list(live)


def two_steps(static: Sequence[int], step: Callable[[str], list[Event]], states: Sequence[int],
              keep: Callable[[Hashable], bool] = lambda k: False) -> list[Event]:
    """``static`` tensors (parameters, buffers, inputs: bytes each, in creation order), then a step, then
    the optimizer states it creates, then everything of the step that ``keep`` does not keep is freed
    (``zero_grad(set_to_none=True)`` frees the gradients), then the second step and its frees.
    ``step(tag)`` gives one step's events with keys made unique by ``tag``."""
    out: list[Event] = [("alloc", ("static", i), n, COMPUTE) for i, n in enumerate(static)]
    for k, tag in enumerate(("step1", "step2")):
        events = step(tag)
        out += events
        if k == 0:
            out += [("alloc", ("state", i), n, COMPUTE) for i, n in enumerate(states)]
        out += [("free", key) for key in live_keys(events) if not keep(key)]
    return out


@dataclass(frozen=True)
class LayerBlocks:
    """One layer's figures on a stage (bytes), as the estimate gives them (per layer, per micro-batch)."""

    params: int
    grads: int
    optimizer: int
    activations: int
    comm: int
    inflight: int
    #: what the layer's backward allocates on top of its saved activations (``bwd_transient``)
    transient: int = 0
    #: how many tensors its weights are (gradients and each optimizer moment follow them one for one), or
    #: a tuple: its weight tensors' relative sizes (element counts), each figure split in those proportions
    weight_tensors: int | tuple[int, ...] = 1
    #: the size of one of its activation tensors (0: the whole figure is one block), or a tuple: the sizes
    #: of its saved tensors in forward order (bytes), repeated until the figure is reached
    act_tensor: int | tuple[int, ...] = 0
    #: what its forward allocates beyond its saved activations that is still live when it ends
    #: (``fwd_extra``: eager cross-entropy's fp32 logits), freed when the next layer's forward starts or,
    #: for the stage's last layer, when the backward starts
    fwd_transient: int = 0
    #: the tensors its backward transient is (``bwd_tensor``): a size, or a tuple as ``act_tensor``'s (the
    #: activations a fully recomputed layer rebuilds); 0: ``act_tensor``'s largest entry
    transient_tensor: int | tuple[int, ...] = 0
    #: its forward's short-lived temporaries (``fwd_tensor``: bytes each, a size or a tuple), allocated and
    #: freed within the layer's forward (an RMSNorm's fp32 square, a rotary embedding's halves, a projection
    #: output a later op copies): 0, none
    fwd_temps: int | tuple[int, ...] = 0
    #: where each temporary lives (``fwd_slot``): a tuple, one entry per temporary, the index of the
    #: ``act_tensor`` entry (zeros counted) it is allocated before and freed after; an index past the list,
    #: or a number here, places it after the layer's saved tensors, freed when its forward ends
    fwd_slots: int | tuple[int, ...] = 0
    #: the index of the ``act_tensor`` entry after which each is freed (``fwd_until``); a number: after its
    #: slot's entry
    fwd_until: int | tuple[int, ...] = 0
    #: its share of one tensor the framework allocates once the step's backward has ended and frees before
    #: the optimizer step (``after_bwd``: BF16_Optimizer's bf16 copy of its flat fp32 gradient buffer for the
    #: all-reduce); the stage's layers' shares are replayed as that one tensor, after the last activation is freed
    after_backward: int = 0


#: at most this many tensors per block: a layer saves a few dozen tensors for its backward, so the cap
#: only binds for figures no layer has (a fuzzed 10^30-wide layer), where it keeps the replay finite
MAX_PIECES = 256


def pieces(total: int, n: int) -> list[int]:
    """``total`` bytes as ``n`` tensors of (nearly) equal size (at most ``MAX_PIECES``)."""
    n = max(1, min(n, total, MAX_PIECES)) if total > 0 else 1
    q, r = divmod(total, n)
    return [q + 1] * r + [q] * (n - r)


def shares(total: int, weights: tuple[int, ...]) -> list[int]:
    """``total`` bytes as tensors in the proportions of ``weights`` (a layer's weight tensors' element
    counts; the rounding remainder goes to the first ones), at most ``MAX_PIECES`` of them."""
    weights = tuple(w for w in weights if w > 0)[:MAX_PIECES]
    whole = sum(weights)
    if total <= 0 or not whole:
        return pieces(total, len(weights) or 1)
    out = [total * w // whole for w in weights]
    rest = total - sum(out)
    for j in range(rest):          # rest < len(out)
        out[j] += 1
    return out


def act_pieces(total: int, unit: int | tuple[int, ...]) -> list[int]:
    """``total`` activation bytes as tensors of about ``unit`` bytes (one block when ``unit`` is 0); a tuple
    ``unit``: the layer's saved tensors in order (bytes), repeated as many whole times as ``total`` holds
    them, then its first entries until ``total`` is reached (the last one cut): a list that is one layer's
    tensors is replayed as exactly those, one that starts with a checkpoint's input (full recompute) as
    that input alone."""
    if isinstance(unit, tuple):
        sizes = tuple(u for u in unit if u > 0)
        whole = sum(sizes)
        if whole <= 0:
            return act_pieces(total, 0)
        reps = min(total // whole, max(1, MAX_PIECES // len(sizes)))
        out, rest = list(sizes * reps), total - reps * whole
        if reps * len(sizes) >= MAX_PIECES and rest > 0:   # a figure no layer has: the rest as one tensor
            return out + [rest]
        for u in sizes:
            if rest <= 0:
                break
            out.append(min(u, rest))
            rest -= out[-1]
        return out + ([rest] if rest > 0 else [])
    return pieces(total, -(-total // unit) if unit > 0 else 1)


def transient_unit(lb: "LayerBlocks") -> int | tuple[int, ...]:
    """The tensors a layer's backward transient is replayed as: its ``transient_tensor``, else the largest
    entry of its ``act_tensor`` (a backward's transients are the gradients of its widest activations)."""
    if lb.transient_tensor:
        return lb.transient_tensor
    unit = lb.act_tensor
    return max(unit) if isinstance(unit, tuple) else unit


def _allocs(ev: list, key: int, sizes: Sequence[int]) -> int:
    """Append the allocation of ``sizes`` under consecutive keys from ``key``; returns the next free key."""
    m = len(sizes)
    ev += zip(repeat("alloc", m), range(key, key + m), sizes, repeat(COMPUTE, m))
    return key + m


def _place(ev: list, plan: list | None, key: int, saved: Sequence[int], layer: "LayerBlocks") -> int:
    """Append one layer's forward (or its recompute): its ``saved`` tensors under consecutive keys from
    ``key`` (their frees come later, in order), with its temporaries among them as ``plan`` orders them
    (None: no temporaries): ``(size, -1)`` allocates the next saved tensor, ``(size, j)`` temporary ``j``
    (size 0: frees it), the temporaries taking the keys after the saved ones. Returns the next free key."""
    if plan is None:
        return _allocs(ev, key, saved)
    at, tmp = key, key + len(saved)
    for x, j in plan:
        if j < 0:
            ev.append(("alloc", at, x, COMPUTE))
            at += 1
        else:
            ev.append(("alloc", tmp + j, x, COMPUTE) if x else ("free", tmp + j))
    return tmp + len(temp_sizes_all(layer))


def temp_sizes_all(lb: "LayerBlocks") -> tuple[int, ...]:
    """The layer's ``fwd_temps`` as a tuple (at most ``MAX_PIECES``), zeros kept: indexed by ``fwd_slots``."""
    t = lb.fwd_temps
    return (t if isinstance(t, tuple) else (t,))[:MAX_PIECES]


def temp_sizes(lb: "LayerBlocks") -> list[int]:
    """The layer's forward temporaries (bytes each, the empty ones left out)."""
    t = lb.fwd_temps
    return [x for x in (t if isinstance(t, tuple) else (t,)) if x > 0][:MAX_PIECES]


def forward_plan(lb: "LayerBlocks", recompute: bool = False) -> list[tuple[int, int]]:
    """The layer's forward as allocations and frees: its saved tensors (:func:`act_pieces`) with its
    forward temporaries placed by ``fwd_slots`` / ``fwd_until``. Each step is ``(size, j)``: ``j`` -1
    allocates a saved tensor of ``size`` bytes, ``j`` >= 0 allocates temporary ``j`` (``size`` > 0) or frees
    it (``size`` 0). Temporary ``j`` is allocated before the saved tensor ``act_tensor[fwd_slots[j]]`` and
    freed after ``act_tensor[fwd_until[j]]`` (``fwd_until`` a number: after its own slot; an index past the
    list: when the layer's forward ends). A slot that is a 0 entry of the list stands for the next non-zero
    entry. Where ``act_tensor`` is not one layer's list (a figure that holds it other than once: the
    remainder of it, a merged block) or the slots are not a list, every temporary comes after the layer's
    saved tensors, allocated in order and freed at its end.

    ``recompute``: the same for the backward's rebuild of a fully recomputed layer, whose list is
    ``transient_tensor`` (``bwd_tensor``) and figure its ``transient``; no temporaries (an empty plan of
    them) unless that list is one layer's list."""
    total, unit = (lb.transient, lb.transient_tensor) if recompute else (lb.activations, lb.act_tensor)
    acts = act_pieces(total, unit)
    t = lb.fwd_temps
    temps = (t if isinstance(t, tuple) else (t,))[:MAX_PIECES]
    slots, until = lb.fwd_slots, lb.fwd_until
    whole = sum(unit) if isinstance(unit, tuple) else 0
    aligned = (isinstance(slots, tuple) and len(slots) >= len(temps) and whole > 0
               and whole <= total < 2 * whole)
    if recompute and not aligned:
        return [(x, -1) for x in acts]
    if not isinstance(until, tuple) or len(until) < len(temps):
        until = slots
    live = [j for j, x in enumerate(temps) if x > 0]
    if not aligned:
        return ([(x, -1) for x in acts] + [(temps[j], j) for j in live] + [(0, j) for j in live])
    n = len(unit)
    # each entry's slot and end, moved onto the non-zero entries (an index past the list: n)
    nonzero = [k for k in range(n) if unit[k] > 0]

    def at_or_after(k: int) -> int:
        return next((q for q in nonzero if q >= k), n)

    def at_or_before(k: int) -> int:
        return max((q for q in nonzero if q <= k), default=-1) if k < n else n

    start = {j: at_or_after(max(0, slots[j])) for j in live}
    end = {j: max(start[j], at_or_before(until[j])) if until[j] < n else n for j in live}
    plan: list[tuple[int, int]] = []
    for k in nonzero:
        plan += [(temps[j], j) for j in live if start[j] == k]
        plan.append((unit[k], -1))
        plan += [(0, j) for j in live if end[j] == k]
    plan += [(x, -1) for x in acts[len(nonzero):]]          # the remainder beyond one list
    plan += [(temps[j], j) for j in live if start[j] == n]
    plan += [(0, j) for j in live if end[j] == n]
    return plan


def weight_count(lb: "LayerBlocks") -> int:
    w = lb.weight_tensors
    return len(w) if isinstance(w, tuple) else w


def weight_pieces(lb: "LayerBlocks", total: int) -> list[int]:
    """One of the layer's weight figures (params, grads, a moment) as its weight tensors, in creation order."""
    if isinstance(lb.weight_tensors, tuple):
        return shares(total, lb.weight_tensors)
    return pieces(total, lb.weight_tensors)


#: above about this many events a stage's sequence is coarsened (:func:`coarsen`); the bundled configs'
#: stages (at most 16,200 events a step, gpt3-175b's) stay well below it and are replayed layer by layer
MAX_EVENTS = 100_000


def events_of(lb: LayerBlocks, held: int) -> int:
    """About how many events :func:`from_estimate` makes for ``lb`` in one step."""
    acts = len(act_pieces(lb.activations, lb.act_tensor)) + len(act_pieces(lb.transient, transient_unit(lb)))
    return 2 * (held * (acts + len(temp_sizes(lb)) + 2 + (lb.fwd_transient > 0)) + 4 * min(weight_count(lb), MAX_PIECES))


def coarsen(layers: Sequence[LayerBlocks], budget: int = MAX_EVENTS) -> list[LayerBlocks]:
    """``layers`` with runs of ``k`` equal consecutive layers merged into one block (their figures
    summed, as many tensors as one layer has, each ``k`` times larger; the transient kept), ``k`` the
    smallest that brings the sequence under about ``budget`` events; then, if it is still above, the
    micro-batches in flight likewise in groups. Only figures no real stage has (tens of thousands of
    layers, or thousands of micro-batches in flight) are coarsened; the replay of a merged block sees fewer,
    larger tensors, an approximation the replay of a real stage does not make."""
    held = max((lb.inflight for lb in layers), default=0)
    total = sum(events_of(lb, held) for lb in layers)
    if total <= budget:
        return list(layers)
    k = -(-total // budget)
    out: list[LayerBlocks] = []
    i = 0
    while i < len(layers):
        lb, j = layers[i], i + 1
        while j < len(layers) and j - i < k and layers[j] == lb:
            j += 1
        n = j - i
        out.append(lb if n == 1 else LayerBlocks(
            lb.params * n, lb.grads * n, lb.optimizer * n, lb.activations * n, lb.comm * n, lb.inflight,
            lb.transient, lb.weight_tensors, _scaled(lb.act_tensor, n), lb.fwd_transient * n,
            lb.transient_tensor, _scaled(lb.fwd_temps, n), lb.fwd_slots, lb.fwd_until, lb.after_backward * n))
        i = j
    # micro-batches: thousands in flight (GPipe at a huge batch) are replayed as groups of m, each one
    # tensor set m times larger
    held = max((lb.inflight for lb in out), default=0)
    total = sum(events_of(lb, held) for lb in out)
    if total > budget and held > 1:
        m = min(held, -(-total // budget))
        out = [LayerBlocks(lb.params, lb.grads, lb.optimizer, lb.activations * m, lb.comm, -(-lb.inflight // m),
                           lb.transient, lb.weight_tensors, _scaled(lb.act_tensor, m), lb.fwd_transient * m,
                           lb.transient_tensor, _scaled(lb.fwd_temps, m), lb.fwd_slots, lb.fwd_until,
                           lb.after_backward)
               for lb in out]
    return out


def _scaled(unit: int | tuple[int, ...], k: int) -> int | tuple[int, ...]:
    return tuple(u * k for u in unit) if isinstance(unit, tuple) else unit * k


@dataclass(frozen=True)
class ShardedStates:
    """Optimizer states of parameters laid out in one flat buffer that the data-parallel ranks split in
    contiguous shards, as Megatron-Core's distributed optimizer does (formulas' ``opt_flat_*`` lets,
    ``frameworks/megatron.mf``): a rank holds the states of the parameters (or parameter parts) in its
    shard of each bucket, each state a whole tensor of that part, rather than 1/``shards`` of every
    parameter. ``masters`` state tensors per parameter are created first, for all parameters (the fp32
    main copies: the optimizer's construction), then ``moments`` per parameter, parameter by parameter
    (torch.optim.AdamW's ``_init_group``); ``bucket``: the bytes of one state tensor over a bucket (0: one
    bucket for the stage)."""

    shards: int
    masters: int = 1
    moments: int = 2
    bucket: int = 0


def sharded_states(layers: Sequence[LayerBlocks], st: ShardedStates) -> list[int]:
    """The state tensors of rank 0 of ``st.shards`` (bytes, in creation order) for ``layers``' optimizer
    figures: the stage's weight tensors in reverse (the buffer's order: backprop's), cut into buckets of at
    least ``st.bucket`` bytes of one state (closed after the tensor that reaches it), rank 0 holding the
    first 1/shards of each bucket. Each layer's figure is its share of the whole states, so the tensors sum
    to the stage's optimizer bytes (to rounding)."""
    per = max(1, st.masters + st.moments)
    whole = [x for lb in layers for x in weight_pieces(lb, lb.optimizer * st.shards // per)]
    buckets: list[list[int]] = [[]]
    filled = 0
    for x in reversed(whole):
        buckets[-1].append(x)
        filled += x
        if st.bucket and filled >= st.bucket:
            buckets.append([])
            filled = 0
    mine: list[int] = []
    for bk in buckets:
        end, pos = -(-sum(bk) // st.shards), 0
        for x in bk:
            if pos >= end:
                break
            mine.append(min(x, end - pos))
            pos += x
    mine = [x for x in mine if x > 0]
    return [x for _ in range(st.masters) for x in mine] + [x for x in mine for _ in range(st.moments)]


def from_estimate(layers: Sequence[LayerBlocks], grads_persist: bool = False,
                  sharded: ShardedStates | None = None) -> list[Event]:
    """The two-step sequence of one stage from its per-layer figures (see the module docstring).

    A layer's weights, gradients and each optimizer moment are ``weight_tensors`` tensors; its saved
    activations and backward transient are tensors of ``act_tensor`` bytes. Each layer's transient is
    allocated at its backward and freed when it ends; ``grads_persist``: gradients live in buffers kept
    across steps (Megatron's and DeepSpeed's contiguous gradient buffers) rather than freed by ``zero_grad``.
    A stage far beyond any real one is :func:`coarsen`-ed first, so the replay stays bounded.

    A step's tensors are keyed by consecutive integers (a group of a layer's tensors by its first key):
    the sequence is built once per stage and replayed, tens of thousands of events."""
    layers = coarsen(layers)

    w = weight_pieces
    static = [x for lb in layers for x in w(lb, lb.params)]
    if grads_persist:
        static += [x for lb in layers for x in w(lb, lb.grads)]

    def moments(lb: LayerBlocks) -> list[int]:
        first, second = (w(lb, lb.optimizer // 2 + (lb.optimizer % 2) * (1 - k)) for k in range(2))
        if isinstance(lb.weight_tensors, tuple):
            # torch.optim.AdamW's _init_group: both moments of one parameter, then the next parameter's
            return [x for pair in zip(first, second) for x in pair]
        return first + second

    states = (sharded_states(layers, sharded) if sharded is not None and sharded.shards > 1
              else [x for lb in layers for x in moments(lb)])
    held = max((lb.inflight for lb in layers), default=0)
    n = len(layers)
    # each layer's tensors, the empty ones left out (they are neither allocated nor freed)
    acts = [[x for x in act_pieces(lb.activations, lb.act_tensor) if x] for lb in layers]
    # a layer with forward temporaries: its forward as allocation steps (saved tensor, temporaries)
    plans = [forward_plan(lb) if temp_sizes(lb) and not isinstance(lb.transient_tensor, tuple) else None
             for lb in layers]
    # a fully recomputed layer (its backward rebuilds a list, bwd_tensor) replays its temporaries there
    replans = [forward_plan(lb, True) if temp_sizes(lb) and isinstance(lb.transient_tensor, tuple) else None
               for lb in layers]
    transients = [[x for x in act_pieces(lb.transient, transient_unit(lb)) if x] for lb in layers]
    # autograd accumulates a layer's gradients in reverse of its forward (the last GEMM's first)
    grads = [[x for x in (w(lb, lb.grads)[::-1] if isinstance(lb.weight_tensors, tuple) else w(lb, lb.grads)) if x]
             for lb in layers]
    fwds = [[lb.fwd_transient] if lb.fwd_transient else [] for lb in layers]
    comms = [lb.comm for lb in layers]
    inflight = [lb.inflight for lb in layers]
    # the post-backward tensor (after_bwd): one flat tensor over the stage's layers
    after = sum(lb.after_backward for lb in layers)
    counter = [0]

    def step(tag: str) -> list[Event]:
        ev: list[Event] = []
        key = counter[0]
        act_key: dict[tuple[int, int], int] = {}   # (micro-batch, layer) -> its first activation's key
        for mb in range(held):
            fwd_prev: tuple[int, int] | None = None   # the previous layer's forward transient: (key, count)
            for i in range(n):
                comm = comms[i]
                if comm:
                    ev.append(("alloc", key, comm, COMM))
                    comm_key, key = key, key + 1
                live = mb < inflight[i]
                if live:
                    act_key[mb, i] = key
                    key = _place(ev, plans[i], key, acts[i], layers[i])
                if comm:
                    ev.append(("free", comm_key))
                # a layer's forward temporaries (fwd_extra) live until the next layer's forward has run
                if fwd_prev is not None:
                    ev += zip(repeat("free", fwd_prev[1]), range(fwd_prev[0], fwd_prev[0] + fwd_prev[1]))
                    fwd_prev = None
                if live and fwds[i]:
                    fwd_prev = (key, len(fwds[i]))
                    key = _allocs(ev, key, fwds[i])
            if fwd_prev is not None:
                ev += zip(repeat("free", fwd_prev[1]), range(fwd_prev[0], fwd_prev[0] + fwd_prev[1]))
        # the first backward (where 1F1B's step peaks): the last micro-batch in, the layers in reverse; the
        # other micro-batches' backwards repeat its allocations in the blocks it freed, so they are
        # replayed as the frees of their activations
        mb = held - 1
        for i in reversed(range(n)):
            live = mb < inflight[i]
            if live:
                comm = comms[i]
                if comm:
                    ev.append(("alloc", key, comm, COMM))
                    comm_key, key = key, key + 1
                transient_key = key
                key = _place(ev, replans[i], key, transients[i], layers[i])
            if not grads_persist:
                key = _allocs(ev, key, grads[i])
            if live:
                m = len(transients[i])
                ev += zip(repeat("free", m), range(transient_key, transient_key + m))
                first = act_key.get((mb, i))
                if first is not None:
                    m = len(acts[i])
                    ev += zip(repeat("free", m), range(first, first + m))
                if comm:
                    ev.append(("free", comm_key))
        for k in reversed(range(held - 1)):
            for i in reversed(range(n)):
                if k < inflight[i]:
                    first, m = act_key[k, i], len(acts[i])
                    ev += zip(repeat("free", m), range(first, first + m))
        # after the backward, before the optimizer step: the gradient reduction's flat copy (after_bwd)
        if after:
            ev += [("alloc", key, after, COMPUTE), ("free", key)]
            key += 1
        counter[0] = key
        return ev

    return two_steps(static, step, [x for x in states if x])
