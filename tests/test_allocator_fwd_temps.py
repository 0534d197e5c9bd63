"""The allocator replay's forward temporaries (common.mf ``fwd_tensor`` / ``fwd_slot`` / ``fwd_until``):
where :func:`memform.allocator.sequence.forward_plan` places them among a layer's saved tensors, and what
they change in a replayed step. Expected plans and peaks are worked by hand from the rules the docstrings
state (a temporary is allocated before the ``act_tensor`` entry its slot names and freed after the one its
``until`` names; a 0 entry stands for the next non-zero one; past the list: after the saved tensors)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memform.allocator import replay
from memform.allocator.sequence import LayerBlocks, forward_plan, from_estimate

MIB = 2 ** 20

LAYER = LayerBlocks(params=0, grads=0, optimizer=0, activations=30, comm=0, inflight=1,
                    act_tensor=(10, 0, 20), fwd_temps=(5, 7, 9), fwd_slots=(0, 1, 3), fwd_until=(2, 1, 3))


@pytest.mark.parametrize("change, plan", [
    # slot 1 is a 0 entry: temporary 1 comes before entry 2; until 1 (a 0 entry) is moved to its slot's
    # entry; slot 3 is past the list: after the saved tensors, freed at the layer's end
    ({}, [(5, 0), (10, -1), (7, 1), (20, -1), (0, 0), (0, 1), (9, 2), (0, 2)]),
    # a figure above the list's sum (less than twice it): the rest is a saved tensor after the list
    ({"activations": 35}, [(5, 0), (10, -1), (7, 1), (20, -1), (0, 0), (0, 1), (5, -1), (9, 2), (0, 2)]),
    # until a number: each freed after its own slot's entry
    ({"fwd_until": 0}, [(5, 0), (10, -1), (0, 0), (7, 1), (20, -1), (0, 1), (9, 2), (0, 2)]),
    # not one layer's list (the figure holds it twice; slots not a list): the temporaries after the saved tensors
    ({"activations": 60}, [(10, -1), (20, -1), (10, -1), (20, -1), (5, 0), (7, 1), (9, 2), (0, 0), (0, 1), (0, 2)]),
    ({"fwd_slots": 0}, [(10, -1), (20, -1), (5, 0), (7, 1), (9, 2), (0, 0), (0, 1), (0, 2)]),
    # a 0 temporary is none
    ({"fwd_temps": (5, 0, 9)}, [(5, 0), (10, -1), (20, -1), (0, 0), (9, 2), (0, 2)]),
])
def test_forward_plan(change, plan):
    assert forward_plan(replace(LAYER, **change)) == plan


def test_recompute_plan_reads_the_backward_list():
    # full recompute: the forward saves one tensor (act_tensor a number); the backward rebuilds bwd_tensor's
    # list with the temporaries placed in it
    lb = replace(LAYER, activations=4, act_tensor=4, transient=30, transient_tensor=(10, 0, 20))
    assert forward_plan(lb, recompute=True) == forward_plan(LAYER)
    # a rebuild that is not one list: no temporaries
    assert forward_plan(replace(lb, transient=90), recompute=True) == [(10, -1), (20, -1)] * 3


@pytest.mark.parametrize("slot, until, peak", [
    (0, 0, 60),    # 50 before the 10, freed after it; then the 20: 50 + 10
    (1, 1, 80),    # 50 before the 20, freed after it: 10 + 50 + 20
    (0, 1, 80),    # 50 from before the 10 until after the 20
    (2, 2, 80),    # past the list: after both saved tensors, 30 + 50
])
def test_temporaries_in_the_replayed_step(slot, until, peak):
    # one layer, nothing else: its forward's requested peak is where the temporary lives (MiB, worked by hand)
    lb = LayerBlocks(params=0, grads=0, optimizer=0, activations=30 * MIB, comm=0, inflight=1,
                     act_tensor=(10 * MIB, 20 * MIB), fwd_temps=(50 * MIB,), fwd_slots=(slot,), fwd_until=(until,))
    r = replay(from_estimate([lb]))
    assert r.peak_requested == peak * MIB
    # without it, the saved tensors alone
    assert replay(from_estimate([replace(lb, fwd_temps=0)])).peak_requested == 30 * MIB


def test_recomputed_temporaries_in_the_backward():
    # a fully recomputed layer: its backward rebuilds (10, 20) MiB with a 50 MiB temporary among them
    lb = LayerBlocks(params=0, grads=0, optimizer=0, activations=4 * MIB, comm=0, inflight=1, transient=30 * MIB,
                     act_tensor=4 * MIB, transient_tensor=(10 * MIB, 20 * MIB), fwd_temps=(50 * MIB,),
                     fwd_slots=(1,), fwd_until=(1,))
    assert replay(from_estimate([lb])).peak_requested == (4 + 10 + 50 + 20) * MIB
    assert replay(from_estimate([replace(lb, fwd_temps=0)])).peak_requested == (4 + 30) * MIB
