"""The fast allocator replay (memform.allocator.caching: the unbounded replay written out in one loop, integer
free-list keys; memform.allocator.sequence.from_estimate with integer tensor keys) replays every sequence to
the same figures as the one-method-per-step model it replaced, kept verbatim in tests/allocator_reference.py
(commit fee874b). Drawn sequences cover every rule (both pools, several streams, splits, merges, max_split_size,
expandable segments, a capacity with releases and out-of-memory); the bundled configs' own stage sequences are
compared too (tests/test_numeric.py pins the estimates' numbers that read the replay)."""

from __future__ import annotations

from pathlib import Path

import allocator_reference as ref
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import memform
from memform.allocator import caching, estimate as alloc_estimate, sequence

MIB = 2 ** 20
ROOT = Path(__file__).resolve().parents[1]


def figures(mod, events, expandable, split, capacity):
    cfg = mod.AllocatorConfig(expandable_segments=expandable, max_split_size=split, capacity=capacity)
    try:
        r = mod.replay(events, cfg)
    except mod.OutOfMemory as exc:
        return ("out of memory", str(exc))
    return (r.peak_requested, r.peak_allocated, r.peak_reserved, r.segments, r.releases)


# sizes around every threshold of the model: 512 B blocks, the 1 MiB small/large line, 10 MiB, 2 MiB rounding,
# a remainder of exactly 1 MiB (19 MiB in a 20 MiB segment: not split)
_SIZES = st.one_of(st.integers(1, 4096), st.integers(MIB - 2048, MIB + 2048), st.integers(1, 64 * MIB),
                   st.sampled_from([512, MIB, 2 * MIB, 10 * MIB - 512, 10 * MIB, 19 * MIB, 19 * MIB + 512,
                                   20 * MIB, 33325056]))


@st.composite
def sequences(draw):
    """Events as the replay takes them: allocations on streams 0, 1, "comm", frees of live (and unknown) keys."""
    events, live = [], []
    for k in range(draw(st.integers(0, 120))):
        if live and draw(st.integers(0, 2)) == 0:
            events.append(("free", live.pop(draw(st.integers(0, len(live) - 1)))))
        elif draw(st.integers(0, 30)) == 0:
            events.append(("free", ("never", k)))
        else:
            key = draw(st.sampled_from([k, ("t", k)]))
            events.append(("alloc", key, draw(st.one_of(_SIZES, st.just(0))), draw(st.sampled_from([0, 1, "comm"]))))
            live.append(key)
    return events


@settings(max_examples=150, deadline=None)
@example([("alloc", 0, 19 * MIB, 0), ("alloc", 1, 5 * MIB, 0), ("free", 0), ("alloc", 2, 12 * MIB, 0)],
         False, None, None)
@given(sequences(), st.booleans(), st.sampled_from([None, 2 * MIB, 16 * MIB, 40 * MIB]),
       st.one_of(st.none(), st.integers(0, 400 * MIB)))
def test_drawn_sequences_replay_as_the_reference_model(events, expandable, split, capacity):
    want = figures(ref, events, expandable, split, capacity)
    assert figures(caching, events, expandable, split, capacity) == want


@st.composite
def layer_lists(draw):
    lb = st.builds(sequence.LayerBlocks, st.integers(0, 300 * MIB), st.integers(0, 300 * MIB),
                   st.integers(0, 600 * MIB), st.integers(0, 900 * MIB), st.integers(0, 64 * MIB), st.integers(0, 4),
                   st.integers(0, 64 * MIB), st.integers(1, 6), st.one_of(st.just(0), st.integers(1, 80 * MIB)))
    kinds = draw(st.lists(lb, min_size=0, max_size=3))
    if not kinds:
        return []
    return [kinds[draw(st.integers(0, len(kinds) - 1))] for _ in range(draw(st.integers(1, 6)))]


def canonical(events):
    """Events with keys renamed in allocation order, frees of keys not live dropped (the replay skips them)."""
    names, live, out = {}, set(), []
    for ev in events:
        if ev[0] == "alloc":
            if ev[2] <= 0:
                continue
            names[ev[1]] = len(names)
            live.add(ev[1])
            out.append(("alloc", names[ev[1]], ev[2], ev[3]))
        elif ev[1] in live:
            live.discard(ev[1])
            out.append(("free", names[ev[1]]))
    return out


@settings(max_examples=150, deadline=None)
@given(layer_lists(), st.booleans(), st.booleans(), st.sampled_from([None, 16 * MIB]))
def test_estimate_sequences_are_the_reference_sequences(layers, grads_persist, expandable, split):
    mine, theirs = sequence.from_estimate(layers, grads_persist), ref.from_estimate(layers, grads_persist)
    assert canonical(mine) == canonical(theirs)
    assert figures(caching, mine, expandable, split, None) == figures(ref, theirs, expandable, split, None)


def test_bundled_stage_sequences_replay_as_the_reference_model(monkeypatch):
    """Every stage replay of two bundled configs with the most events (Llama 3 405B at 8k, at V = 2: 16 stages,
    some replayed against the device's capacity; Nemotron-H: hybrid layers), through both models."""
    seen = []
    real = alloc_estimate.replay

    def record(events, config):
        seen.append((events, config))
        return real(events, config)

    monkeypatch.setattr(alloc_estimate, "replay", record)
    alloc_estimate._unbounded.cache_clear()
    # the 405B at V = 2 (98 GiB: stages replayed against the device's capacity too)
    for name, overrides in (("published/llama3-405b-8k.yaml", {"parallel.vpp": 2, "parallel.stage_layers": [7] + [8] * 14 + [7]}),
                            ("nemotron-h-8b.yaml", None)):
        est = memform.estimate(ROOT / "configs" / name, overrides)
        assert all(s.reserved_bytes >= s.peak_bytes for s in est.stages)
    assert len(seen) >= 17 and any(c.capacity is not None for _, c in seen)
    for events, c in seen:
        args = (c.expandable_segments, c.max_split_size, c.capacity)
        assert figures(caching, events, *args) == figures(ref, events, *args)


def test_addresses_beyond_the_packed_keys_fall_back_to_the_general_model():
    # 10^20-byte tensors put segment addresses past 2**64, where size << 64 | ptr would lose the order
    events = [("alloc", k, 10 ** 20 + k * 512, 0) for k in range(3)] + [("free", 1), ("alloc", 9, 10 ** 20, 0)]
    assert figures(caching, events, False, None, None) == figures(ref, events, False, None, None)
    with pytest.raises(caching._AddressSpace):
        caching._replay_unbounded(events, 2 ** 63)
