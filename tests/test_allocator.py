"""memform.allocator: the model of PyTorch's CUDA caching allocator and the sequences it replays.

Expected numbers follow c10/cuda/CUDACachingAllocator.cpp (PyTorch 2.x): kMinBlockSize 512, kSmallSize
1 MiB, kSmallBuffer 2 MiB, kLargeBuffer 20 MiB, kMinLargeAlloc 10 MiB, kRoundLarge 2 MiB; round_size,
get_allocation_size, get_free_block, should_split, free_block / try_merge_blocks, release_cached_blocks,
and the expandable segments' page sizes (kSmallBuffer / kLargeBuffer).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memform.allocator import AllocatorConfig, CachingAllocator, OutOfMemory, replay
from memform.allocator.caching import allocation_size, round_size
from memform.allocator.sequence import (MAX_EVENTS, MAX_PIECES, LayerBlocks, act_pieces, coarsen, events_of,
                                       from_estimate, from_samples, pieces, shares, two_steps)

KIB, MIB = 1024, 2 ** 20


@pytest.mark.parametrize("size, rounded", [(1, 512), (512, 512), (513, 1024), (MIB + 1, MIB + 512)])
def test_round_size_is_a_multiple_of_512(size, rounded):
    assert round_size(size) == rounded


@pytest.mark.parametrize("size, segment", [
    (512, 2 * MIB),                # small pool: 2 MiB segments
    (MIB, 2 * MIB),                # kSmallSize itself is small
    (MIB + 512, 20 * MIB),         # 1-10 MiB: a 20 MiB segment others may share
    (10 * MIB - 512, 20 * MIB),
    (10 * MIB, 10 * MIB),          # from kMinLargeAlloc on: the request rounded up to 2 MiB
    (11 * MIB, 12 * MIB),
])
def test_segment_sizes(size, segment):
    assert allocation_size(size) == segment


def test_small_requests_share_a_2_mib_segment():
    a = CachingAllocator()
    for k in range(4):
        a.malloc(k, 512 * KIB)
    assert a.reserved == 2 * MIB and a.allocated == 2 * MIB
    a.malloc(4, 1)
    assert a.reserved == 4 * MIB


def test_large_blocks_split_only_when_more_than_1_mib_is_left():
    a = CachingAllocator()
    a.malloc("x", 5 * MIB)             # 20 MiB segment, 15 MiB left over: split
    assert (a.reserved, a.allocated) == (20 * MIB, 5 * MIB)
    a.malloc("y", 14 * MIB)            # takes the 15 MiB remainder; 1 MiB left: not split
    assert a.reserved == 20 * MIB
    assert a.allocated == 5 * MIB + 15 * MIB   # memory_allocated counts the whole block
    assert a.requested == 19 * MIB


def test_best_fit_and_merging_of_freed_neighbours():
    a = CachingAllocator()
    a.malloc("big", 40 * MIB)
    a.malloc("small", 12 * MIB)
    a.free("big")
    a.free("small")
    a.malloc("c", 12 * MIB)            # best fit: the 12 MiB block, not the 40 MiB one
    a.malloc("d", 40 * MIB)
    assert a.reserved == 52 * MIB
    a.free("c")
    a.free("d")
    a.malloc("e", 6 * MIB)             # 6 MiB from the 12 MiB block (split: 6 MiB left)
    a.malloc("f", 30 * MIB)            # 30 of the 40 MiB block (10 MiB left)
    a.free("f")                        # merges back with its 10 MiB remainder
    a.malloc("g", 40 * MIB)
    assert a.reserved == 52 * MIB


def test_streams_do_not_share_cached_blocks():
    a = CachingAllocator()
    a.malloc("x", 100 * MIB, stream=0)
    a.free("x")
    a.malloc("y", 100 * MIB, stream="all-gather")
    assert a.reserved == 200 * MIB
    a.malloc("z", 100 * MIB, stream=0)
    assert a.reserved == 200 * MIB


def test_max_split_size_keeps_oversize_blocks_for_large_requests():
    cfg = AllocatorConfig(max_split_size=64 * MIB)
    a = CachingAllocator(cfg)
    a.malloc("x", 100 * MIB)
    a.free("x")
    a.malloc("y", 30 * MIB)            # an oversize cached block serves no smaller request
    assert a.reserved == 130 * MIB
    b = CachingAllocator()
    b.malloc("x", 100 * MIB)
    b.free("x")
    b.malloc("y", 30 * MIB)            # default: it is split
    assert b.reserved == 100 * MIB


def test_expandable_segments_grow_the_free_tail_in_pages():
    a = CachingAllocator(AllocatorConfig(expandable_segments=True))
    a.malloc("x", 30 * MIB)            # large pool pages are 20 MiB
    assert a.reserved == 40 * MIB
    a.malloc("y", 5 * MIB)             # from the 10 MiB tail
    a.malloc("z", 20 * MIB)            # 5 MiB tail + one more page
    assert a.reserved == 60 * MIB
    plain = CachingAllocator()
    for k, n in (("x", 30), ("y", 5), ("z", 20)):
        plain.malloc(k, n * MIB)
    assert plain.reserved == 30 * MIB + 20 * MIB + 20 * MIB


def test_a_full_device_releases_its_cache_before_running_out():
    cfg = AllocatorConfig(capacity=100 * MIB)
    a = CachingAllocator(cfg)
    a.malloc("x", 60 * MIB)
    a.free("x")                        # cached, 60 MiB reserved
    a.malloc("y", 80 * MIB)            # 60 + 80 > 100: release the cached segment, then reserve
    assert a.reserved == 80 * MIB and a.releases == 1
    with pytest.raises(OutOfMemory):
        a.malloc("z", 30 * MIB)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 64 * MIB), st.sampled_from([0, 1])), max_size=60),
       st.booleans())
def test_reserved_never_below_allocated_never_below_requested(ops, expandable):
    a = CachingAllocator(AllocatorConfig(expandable_segments=expandable))
    live: list[int] = []
    for k, (do_free, size, stream) in enumerate(ops):
        if do_free and live:
            a.free(live.pop(size % len(live)))
        else:
            a.malloc(k, size, stream)
            live.append(k)
        assert a.reserved >= a.allocated >= a.requested >= 0
        assert a.peak_reserved >= a.reserved
    for k in live:
        a.free(k)
    assert a.allocated == a.requested == 0
    if not expandable:
        a.empty_cache()
        assert a.reserved == 0


def test_events_from_samples_free_before_the_next_allocations():
    samples = [((1, 100),), ((1, 100), (2, 50)), ((2, 50), (3, 70)), ((2, 0), (3, 70))]
    events = from_samples(samples, tag="t")
    assert events == [("alloc", ("t", 1), 100, 0), ("alloc", ("t", 2), 50, 0), ("free", ("t", 1)),
                      ("alloc", ("t", 3), 70, 0), ("free", ("t", 2))]


def test_two_steps_place_the_optimizer_states_after_the_first_step():
    events = two_steps([10], lambda tag: [("alloc", (tag, "a"), 20, 0)], [30])
    kinds = [(e[0], e[1]) for e in events]
    assert kinds == [("alloc", ("static", 0)), ("alloc", ("step1", "a")), ("alloc", ("state", 0)),
                     ("free", ("step1", "a")), ("alloc", ("step2", "a")), ("free", ("step2", "a"))]


def test_pieces_keep_the_total():
    assert sum(pieces(1001, 7)) == 1001 and len(pieces(1001, 7)) == 7
    assert act_pieces(1000, 0) == [1000]
    assert len(act_pieces(1000, 300)) == 4 and sum(act_pieces(1000, 300)) == 1000


def test_estimate_sequence_allocates_what_the_layers_hold():
    layer = LayerBlocks(params=100 * MIB, grads=100 * MIB, optimizer=200 * MIB, activations=300 * MIB, comm=0,
                        inflight=2, transient=50 * MIB, weight_tensors=4, act_tensor=25 * MIB)
    r = replay(from_estimate([layer] * 3))
    # at the first backward of step 2: params, states, both micro-batches' activations, the transient and
    # the last layer's gradients
    assert r.peak_requested == 3 * 100 * MIB + 3 * 200 * MIB + 2 * 3 * 300 * MIB + 50 * MIB + 100 * MIB
    assert r.peak_reserved >= r.peak_requested
    kept = replay(from_estimate([layer] * 3, grads_persist=True))
    assert kept.peak_requested == r.peak_requested + 2 * 100 * MIB


def test_pieces_are_capped_for_figures_no_layer_has():
    # a fuzzed 10^30-byte layer in 10^26 tensors would not fit in a list (CI failure of the last stop)
    p = pieces(10 ** 30, 10 ** 26)
    assert len(p) == MAX_PIECES and sum(p) == 10 ** 30


def test_coarsen_keeps_real_stages_and_bounds_huge_ones():
    layer = LayerBlocks(params=100 * MIB, grads=100 * MIB, optimizer=200 * MIB, activations=300 * MIB, comm=MIB,
                        inflight=2, transient=50 * MIB, weight_tensors=9, act_tensor=10 * MIB)
    assert coarsen([layer] * 126) == [layer] * 126          # Llama 3 405B on one stage: layer by layer
    for layers in ([layer] * 100_000, [LayerBlocks(**{**layer.__dict__, "inflight": 50_000})] * 4):
        merged = coarsen(layers)
        held = max(lb.inflight for lb in merged)
        assert sum(events_of(lb, held) for lb in merged) <= 2 * MAX_EVENTS
        for figure in ("params", "grads", "optimizer"):     # the stage's totals are kept
            assert sum(getattr(lb, figure) for lb in merged) == sum(getattr(lb, figure) for lb in layers)
        assert (sum(lb.activations * lb.inflight for lb in merged)
                >= sum(lb.activations * lb.inflight for lb in layers))


# ---- real tensor sizes (tensors(...) in weight_tensors / act_tensor, formulas/common.mf layer) --------
@pytest.mark.parametrize("total, unit, expected", [
    (40, (30, 10), [30, 10]),                 # one layer's tensors: replayed as exactly those
    (100, (30, 10), [30, 10, 30, 10, 20]),    # twice the list, then its first entries (30 cut to 20)
    (115, (30, 10), [30, 10, 30, 10, 30, 5]),
    (20, (30, 10), [20]),                     # below the list's sum: its first entry alone (a checkpoint's input)
    (20, (0, 10), [10, 10]),                  # a 0 entry is no tensor
])
def test_act_pieces_of_a_list_of_sizes(total, unit, expected):
    assert act_pieces(total, unit) == expected


def test_weight_shares_follow_element_counts_and_keep_the_total():
    assert shares(10, (1, 0, 4)) == [2, 8]
    assert shares(1001, (1, 1, 5)) == [143, 143, 715]       # exact: 1001 = 7 · 143
    assert shares(1000, (1, 1, 5)) == [143, 143, 714]       # 142, 142, 714 and the 2 left over to the first ones


def step1(events):
    """The first step's events of a from_estimate sequence: after the static tensors, before the optimizer
    states (the step's own keys are consecutive integers; static and state keys are tagged tuples)."""
    start = next(i for i, e in enumerate(events) if not isinstance(e[1], tuple))
    stop = next(i for i, e in enumerate(events) if isinstance(e[1], tuple) and e[1][0] == "state")
    return events[start:stop]


def test_real_sizes_order_gradients_in_reverse_and_moments_per_parameter():
    layer = LayerBlocks(params=80, grads=80, optimizer=160, activations=0, comm=0, inflight=1,
                        weight_tensors=(16, 64))
    events = from_estimate([layer])
    sizes = lambda what: [e[2] for e in events if e[0] == "alloc" and isinstance(e[1], tuple) and e[1][0] == what]  # noqa: E731
    assert sizes("static") == [16, 64]              # creation order
    assert sizes("state") == [16, 16, 64, 64]       # torch.optim.AdamW _init_group: exp_avg, exp_avg_sq per param
    grads = [e[2] for e in step1(events) if e[0] == "alloc"]   # no activations: the step allocates its grads only
    assert grads == [64, 16]                        # autograd: the last GEMM's gradient first


def test_moments_that_fit_freed_activations_change_the_reserve():
    """The mechanism behind the Llama-3.1-70B fake trace (bench/validate.py --frameworks): the optimizer
    moments of small weights are placed in the activations' freed segments after the first step, the large
    ones are not, and the second step's activations take what the first step's gradients left. By hand
    (MiB): weights 16 + 64, activations 40 + 40. Step 1 reserves 80 (params) + 80 (activations) + 80
    (gradients 64, 16); the moments 16, 16 go into one freed 40 segment, 64, 64 need 128 more; step 2's
    activations take the free 40 and split the freed 64 gradient segment, its gradient 64 finds no block
    of 64 and reserves one more: 432 reserved at a 400 peak (80 + 160 + 80 + 80). Two equal pieces of 40
    each fit every freed block one for one: 400, no reserve."""
    real = LayerBlocks(params=80 * MIB, grads=80 * MIB, optimizer=160 * MIB, activations=80 * MIB, comm=0,
                       inflight=1, weight_tensors=(16, 64), act_tensor=(40 * MIB, 40 * MIB))
    r = replay(from_estimate([real]))
    assert (r.peak_reserved, r.peak_requested) == (432 * MIB, 400 * MIB)
    equal = LayerBlocks(params=80 * MIB, grads=80 * MIB, optimizer=160 * MIB, activations=80 * MIB, comm=0,
                        inflight=1, weight_tensors=2, act_tensor=40 * MIB)
    r = replay(from_estimate([equal]))
    assert (r.peak_reserved, r.peak_requested) == (400 * MIB, 400 * MIB)


def test_the_last_layers_forward_transient_lives_until_the_backward():
    # eager cross-entropy's fp32 logits (fwd_extra): allocated after the layer's activations, freed before
    # its backward's transient, whose first tensor then takes its block
    last = LayerBlocks(params=MIB, grads=MIB, optimizer=2 * MIB, activations=40 * MIB, comm=0, inflight=1,
                       transient=40 * MIB, act_tensor=40 * MIB, fwd_transient=40 * MIB)
    r = replay(from_estimate([last]))
    # step 2's peak: params, states, activations and the transient (40 + 40): the logits' segment reused
    assert r.peak_requested == MIB + 2 * MIB + 40 * MIB + 40 * MIB + MIB
    # step 1: the activations and the logits, the logits freed, then the backward's transient and gradient
    ev = step1(from_estimate([last]))
    assert [(e[0], e[2] if e[0] == "alloc" else None) for e in ev[:5]] == [
        ("alloc", 40 * MIB), ("alloc", 40 * MIB), ("free", None), ("alloc", 40 * MIB), ("alloc", MIB)]
    assert ev[2][1] == ev[1][1]                     # the freed one is the logits, before the transient


@pytest.mark.parametrize("act_tensor, transient_tensor, expected", [
    (8 * MIB, 0, [8 * MIB] * 5),                              # the activations' size
    ((8 * MIB, 20 * MIB), 0, [20 * MIB, 20 * MIB]),           # a list's largest entry (equal pieces of 40)
    (8 * MIB, (30 * MIB, 10 * MIB), [30 * MIB, 10 * MIB]),    # bwd_tensor: what a recomputed layer rebuilds
])
def test_backward_transient_tensors(act_tensor, transient_tensor, expected):
    layer = LayerBlocks(params=MIB, grads=MIB, optimizer=2 * MIB, activations=8 * MIB, comm=0, inflight=1,
                        transient=40 * MIB, act_tensor=act_tensor, transient_tensor=transient_tensor)
    # step 1: the activations (8 MiB), then the backward's transient tensors, then the 1 MiB gradient
    allocs = [e[2] for e in step1(from_estimate([layer])) if e[0] == "alloc"]
    assert allocs[0] == 8 * MIB and allocs[-1] == MIB
    assert allocs[1:-1] == expected


def test_max_split_size_never_releases_an_expandable_segment():
    """release_available_cached_blocks (c10/cuda/CUDACachingAllocator.cpp) skips expandable_segment_ blocks:
    with max_split_size set, a wholly free expandable segment is not dropped when an allocation misses (it
    was, and the segment's stale tail then broke the next growth: found by tests/test_allocator_equivalence.py's
    drawn sequences). 50 MiB freed, 1 MiB taken from its tail, 70 MiB asked for under a 60 MiB capacity:
    release_cached_blocks unmaps the free tail (40 MiB) and the growth still does not fit: out of memory."""
    cfg = AllocatorConfig(expandable_segments=True, max_split_size=20 * MIB, capacity=60 * MIB)
    events = [("alloc", 0, 50 * MIB, 0), ("free", 0), ("alloc", 1, MIB, 0), ("alloc", 2, 70 * MIB, 0)]
    with pytest.raises(OutOfMemory):
        replay(events, cfg)


def test_the_post_backward_tensor_is_one_block_after_the_activations():
    """after_bwd (formulas/common.mf; BF16_Optimizer's bf16 copy of its flat gradient buffer at ReduceGrads,
    deepspeed.mf): the layers' shares are one tensor, allocated in each step once its activations are freed
    and freed before the optimizer's states. By hand (MiB): two layers, weights and kept gradients 8 each (20 MiB
    segments: 40 reserved), activations 40 + 40 per layer (one segment each: 160); without the copy the states
    (4 × 8) split freed activation blocks and step 2 needs one 40 more: 240. A copy of 2 × 15 fits a freed
    activation block: 240 still; one of 2 × 30 fits none and takes a 60 segment (40 + 160 + 60 = 260), in which
    step 2's activations and copy then find room. The requested peak is the backward's either way."""
    def layer(share: int) -> LayerBlocks:
        return LayerBlocks(params=8 * MIB, grads=8 * MIB, optimizer=16 * MIB, activations=80 * MIB, comm=0,
                           inflight=1, act_tensor=40 * MIB, after_backward=share)

    events = from_estimate([layer(30 * MIB)] * 2, grads_persist=True)
    copies = [i for i, e in enumerate(events) if e[0] == "alloc" and e[2] == 60 * MIB]
    assert len(copies) == 2                                    # one per step, the two shares as one tensor
    for start, i in zip([0] + copies, copies):                 # after the step's last activation is freed
        acts = {e[1] for e in events[start:i] if e[0] == "alloc" and e[2] == 40 * MIB}
        assert len(acts) == 4 and acts <= {e[1] for e in events[start:i] if e[0] == "free"}
        assert events[i + 1] == ("free", events[i][1])
    for share, reserved in ((0, 240), (15, 240), (30, 260)):
        r = replay(from_estimate([layer(share * MIB)] * 2, grads_persist=True))
        assert (r.peak_reserved, r.peak_requested) == (reserved * MIB, 224 * MIB), share
    merged = coarsen([layer(30 * MIB)] * 10_000)               # a coarsened stage keeps the tensor's size
    assert len(merged) < 10_000 and sum(lb.after_backward for lb in merged) == 10_000 * 30 * MIB
