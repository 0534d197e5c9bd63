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


# ---- the hf-trainer profile's Llama decoder (formulas/frameworks/hf-trainer.mf) ----------------------
def _decoder(recompute: str, **over):
    from memform.allocator.estimate import layer_blocks
    from memform.engine.model import estimate_model, load_model

    sets = {"training.framework": "hf-trainer", "training.precision.params": "bf16", "training.recompute": recompute,
            "model.flash_attention": True, "model.position_embedding": "rope", "parallel.tp": 1, "parallel.dp": 1,
            "parallel.sequence_parallel": False, "parallel.zero": 0, **over}
    m = load_model("configs/llama3-8b.yaml", [f"{k}={v}" for k, v in sets.items()])
    est = estimate_model(m)
    return next(lb for lb in layer_blocks(est.stages[0], m, m.evaluator()) if isinstance(lb.fwd_temps, tuple))


def test_hf_llama_decoder_temporaries():
    # Llama-3-8B, s 8192, b 1, bf16 (MiB): LlamaRMSNorm's fp32 pow and x * rsqrt (4 bytes x 8192 x 4096 = 128),
    # q 64 and k / v 16 (bf16 x 8192 x 4096 / 1024), the rotary halves, o_proj / down_proj outputs 64,
    # the residual stream 64 (modeling_llama.py lines in hf-trainer.mf)
    lb = _decoder("none")
    mib = [x / MIB for x in lb.fwd_temps]
    assert mib == [64, 128, 128, 0, 64, 16, 16, 64, 32, 64, 64, 16, 8, 16, 16, 16, 64, 64, 128, 128, 0, 64, 64]
    assert len(lb.act_tensor) == 16 and len(lb.fwd_slots) == len(lb.fwd_until) == len(lb.fwd_temps)
    # each slot an act_tensor entry or its end, each freed no earlier than allocated
    assert all(0 <= a <= u <= 16 for a, u in zip(lb.fwd_slots, lb.fwd_until))
    # one layer's list: the plan places every temporary among the saved tensors
    assert sum(1 for _, j in forward_plan(lb) if j >= 0) == 2 * sum(1 for x in lb.fwd_temps if x)


def test_hf_llama_checkpointed_decoder_replays_them_in_the_backward():
    lb = _decoder("full")
    assert isinstance(lb.transient_tensor, tuple) and not isinstance(lb.act_tensor, tuple)
    # no KV cache under checkpointing, the input is the checkpoint's, the recompute stops before down_proj
    temps = [x / MIB for x in lb.fwd_temps]
    assert temps[0] == temps[6] == temps[15] == temps[21] == temps[22] == 0
    assert sum(1 for _, j in forward_plan(lb, recompute=True) if j >= 0) == 2 * sum(1 for x in temps if x)


# ---- real weight tensors of MoE and Mamba-2 layers under hf-trainer (frameworks/hf-trainer/{moe,mamba}.mf) --
def _blocks(config: str, **over):
    from memform.allocator.estimate import layer_blocks
    from memform.engine.model import estimate_model, load_model

    sets = {"training.framework": "hf-trainer", "training.precision.params": "bf16", "parallel.tp": 1,
            "parallel.dp": 1, "parallel.pp": 1, "parallel.ep": 1, "parallel.sequence_parallel": False,
            "parallel.distributed_optimizer": False, "parallel.zero": 0, **over}
    m = load_model(config, [f"{k}={v}" for k, v in sets.items()], numeric=True)  # numbers only: no closed form
    return layer_blocks(estimate_model(m).stages[0], m, m.evaluator())


def test_mixtral_fused_expert_weights():
    # Mixtral-8x7B (configs/mixtral-8x7b.yaml: h 4096, f 14336, 8 experts, 32 / 8 heads of 128): q, k, v, o,
    # the router 8 x 4096, gate_up_proj [8, 2 x 14336, 4096], down_proj [8, 4096, 14336] (modeling_mixtral.py
    # 65-66, 102), no shared experts, the two norms' 2 x 4096
    lb = next(lb for lb in _blocks("configs/mixtral-8x7b.yaml") if lb.params > 10 ** 9)
    assert lb.weight_tensors == (4096 * 4096, 4096 * 1024, 4096 * 1024, 4096 * 4096, 0, 8 * 4096,
                                 8 * 2 * 14336 * 4096, 8 * 4096 * 14336, 0, 2 * 4096)


def test_nemotron_h_mamba_weights():
    # Nemotron-H-8B's Mamba-2 sublayer (configs/nemotron-h-8b.yaml): its norm, then NemotronHMamba2Mixer's
    # conv1d, in_proj, dt_bias, A_log, gated norm, D, out_proj (modeling_nemotron_h.py 606-635), summing to
    # the layer's parameters
    from memform.engine.model import load_model

    m = load_model("configs/nemotron-h-8b.yaml", ["training.framework=hf-trainer", "parallel.tp=1",
                                                    "parallel.sequence_parallel=false"])
    h, H, P, G, N, K = (m.value_for_key(k) for k in ("model.hidden_size", "model.mamba_num_heads",
                                                     "model.mamba_head_dim", "model.mamba_num_groups",
                                                     "model.mamba_state_dim", "model.mamba_conv_kernel"))
    d_in = H * P
    d_conv = d_in + 2 * G * N
    lb = next(lb for lb in _blocks("configs/nemotron-h-8b.yaml") if isinstance(lb.weight_tensors, tuple)
              and len(lb.weight_tensors) == 9)
    assert lb.weight_tensors == (h, d_conv * K, d_conv, h * (2 * d_in + 2 * G * N + H), H, H, d_in, H, d_in * h)
