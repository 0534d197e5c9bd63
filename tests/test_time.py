"""The step-time model (formulas/time.mf, `cost` blocks): the language, exact FLOP and traffic
references from the papers, device presets, and the estimate's time outputs.

Reference numbers are the papers' own equations evaluated by hand here, not the formula files'
expressions: Narayanan et al. 2021 eq. (3) for the FLOPs of a step with full recomputation,
Korthikanti et al. 2022 eq. (7) for the model FLOPs behind MFU, Shoeybi et al. 2019 (Fig. 4: four
all-reduces per layer in forward and backward) with the ring all-reduce's 2(n-1)/n volume
(Patarasuk & Yuan 2009), and the 1F1B bubble (p - 1)/(m·vp) of Narayanan et al. 2021 §2.2.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest

from memform.errors import MemformError

from cli_helpers import ROOT, run_memform
from estimate_helpers import numbers  # numbers only: the numeric path (tests/test_numeric.py ties it to sympy's)

#: a device whose figures make seconds easy to read back: 10^12 FLOP/s at efficiency 1 (so compute
#: picoseconds = FLOPs), 10^12 bytes/s links (picoseconds = bytes), no memory-bound time
UNIT_DEVICE = {"peak_flops_bf16": 10 ** 12, "efficiency": 1, "intra_node_bandwidth": 10 ** 12,
               "inter_node_bandwidth": 10 ** 12, "devices_per_node": 8, "capacity_gib": 80}


def gpt(h=2048, a=16, L=4, s=1024, v=51200, b=2, m=4, flash=None, **parallel):
    """A GPT-3-style model (GeLU, f = 4h, MHA, no flash) on the unit device; with context parallelism
    the attention is flash (ring and all-gather CP run fused attention only: dense.mf's require)."""
    flash = parallel.get("cp", 1) > 1 if flash is None else flash
    return {"name": "gpt", "formulas": ["dense.mf"],
            "model": {"hidden_size": h, "num_heads": a, "num_layers": L, "vocab_size": v, "seq_length": s,
                      "activation": "gelu", "norm": "layernorm", "bias": True, "dropout": True,
                      "flash_attention": flash},
            "parallel": {"dp": 1, "tp": 1, "pp": 1, **parallel},
            "training": {"micro_batch_size": b, "num_micro_batches": m, "recompute": "full"},
            "device": dict(UNIT_DEVICE)}


# ---------------------------------------------------------------------------------- FLOPs


@pytest.mark.parametrize("h,a,L,s,v,b,m", [(2048, 16, 4, 1024, 51200, 2, 4), (4096, 32, 2, 2048, 50257, 1, 3),
                                           (1536, 12, 6, 512, 32000, 4, 1)])
def test_full_recompute_step_flops_are_narayanan_eq3(h, a, L, s, v, b, m):
    # Narayanan et al. 2021 eq. (3): F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) per iteration, B sequences,
    # with activation recomputation (4 passes of the layers, 3 of the logits); on one device at 10^12 FLOP/s
    # and efficiency 1 the compute part in picoseconds is F itself
    est = numbers(gpt(h, a, L, s, v, b, m))
    B = b * m
    F = Fraction(96 * B * s * L * h * h) * (1 + Fraction(s, 6 * h) + Fraction(v, 16 * L * h))
    assert est.stages[0].time_ps["compute"] == F


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_ideal_seconds_are_korthikanti_eq7_model_flops(recompute):
    # Korthikanti et al. 2022 eq. (7): model FLOPs 72·B·L·s·h²·(1 + s/(6h) + v/(12·h·L)), whatever is
    # recomputed; summed over the pipeline stages (two here)
    h, a, L, s, v, b, m = 2048, 16, 4, 1024, 51200, 2, 4
    cfg = gpt(h, a, L, s, v, b, m, pp=2)
    cfg["training"]["recompute"] = recompute
    est = numbers(cfg)
    B = b * m
    model_flops = Fraction(72 * B * L * s * h * h) * (1 + Fraction(s, 6 * h) + Fraction(v, 12 * h * L))
    assert sum(st.ideal_ps for st in est.stages) == model_flops
    # MFU = model FLOPs / (devices · step · peak): two stages of one device each
    assert est.mfu == pytest.approx(float(model_flops) / 1e12 / (2 * est.step_seconds), rel=1e-12)


def test_selective_recompute_adds_the_attention_core_forward():
    # Korthikanti et al. 2022 §5-6: selective recompute runs QKᵀ and scores·V again, 4·b·s²·h per layer
    h, a, L, s, v, b, m = 2048, 16, 4, 1024, 51200, 2, 4
    times = {}
    for mode in ("none", "selective"):
        cfg = gpt(h, a, L, s, v, b, m)
        cfg["training"]["recompute"] = mode
        times[mode] = numbers(cfg).stages[0].time_ps["compute"]
    assert times["selective"] - times["none"] == m * L * 4 * b * s * s * h


def test_gqa_and_swiglu_flops_follow_the_projection_shapes():
    # 2 FLOPs per weight and token (Kaplan et al. 2020 §2.1) for Llama-2-7B-like shapes with GQA:
    # q/o h×h, k/v h×(g·h/a), gate/up/down h×f; the core 4·s²·h per sequence (Narayanan §5.1)
    h, a, g, f, s, b = 4096, 32, 8, 11008, 2048, 1
    cfg = {"name": "llama", "formulas": ["dense.mf"],
           "model": {"hidden_size": h, "num_heads": a, "num_kv_heads": g, "ffn_hidden_size": f, "num_layers": 1,
                     "vocab_size": 32000, "seq_length": s, "activation": "swiglu", "norm": "rmsnorm", "bias": False,
                     "dropout": False},
           "training": {"micro_batch_size": b, "recompute": "none"}, "device": dict(UNIT_DEVICE)}
    est = numbers(cfg)
    kv = g * h // a
    layer_fwd = 2 * s * b * (2 * h * h + 2 * h * kv + 3 * h * f) + 4 * b * s * s * h
    head_fwd = 2 * s * b * h * 32000
    assert est.stages[0].time_ps["compute"] == 3 * (layer_fwd + head_fwd)


# ---------------------------------------------------------------------------------- communication


def test_tensor_parallel_traffic_is_four_all_reduces_per_layer():
    # Shoeybi et al. 2019 Fig. 4: "4 total communication operations in the forward and backward pass of a
    # single model parallel transformer layer", each an all-reduce of s·b·h activations (2 bytes), moving
    # 2(t-1)/t of them per rank (ring all-reduce, Patarasuk & Yuan 2009); full recompute repeats the
    # forward's two; the vocabulary-parallel embedding and head add one all-reduce each
    h, a, L, s, b, m, t = 2048, 16, 4, 1024, 2, 4, 8
    for mode, per_layer in (("none", 4), ("full", 6)):
        cfg = gpt(h, a, L, s, 51200, b, m, tp=t)
        cfg["training"]["recompute"] = mode
        est = numbers(cfg)
        allreduce = Fraction(2 * (t - 1), t) * 2 * s * b * h
        assert est.stages[0].time_ps["tp"] == m * (L * per_layer + 2) * allreduce


def test_sequence_parallel_traffic_adds_the_weight_gradient_regathers():
    # Korthikanti et al. 2022 §4.2.2: with sequence parallelism each of Shoeybi's all-reduces becomes an
    # all-gather + a reduce-scatter, (t-1)/t of s·b·h each: forward 2 all-gathers and 2 reduce-scatters per
    # layer, backward their 4 conjugates, and the two column-parallel GEMMs (QKV, fc1) all-gather their
    # input once more for the weight gradient (Megatron-LM tensor_parallel/layers.py,
    # LinearWithGradAccumulationAndAsyncCommunication.backward with sequence_parallel): 10 per layer; full
    # recompute repeats the forward's 4. The embedding reduce-scatters its output (and all-gathers the
    # gradient), the column-parallel head all-gathers its input, reduce-scatters its gradient and
    # re-gathers for its weight gradient: 2 + 3
    h, a, L, s, b, m, t = 2048, 16, 4, 1024, 2, 4, 8
    for mode, per_layer in (("none", 10), ("selective", 10), ("full", 14)):
        cfg = gpt(h, a, L, s, 51200, b, m, tp=t, sequence_parallel=True)
        cfg["training"]["recompute"] = mode
        est = numbers(cfg)
        one = Fraction(t - 1, t) * 2 * s * b * h
        assert est.stages[0].time_ps["tp"] == m * (L * per_layer + 2 + 3) * one, mode


def test_groups_beyond_a_node_use_the_inter_node_bandwidth():
    # tp = 8 on 8-device nodes stays on the intra-node links; 16 ranks cross nodes
    cfg = gpt(tp=8)
    cfg["device"]["inter_node_bandwidth"] = 10 ** 11
    inside = numbers(cfg).stages[0].time_ps["tp"]
    cfg["parallel"]["tp"] = 16
    across = numbers(cfg).stages[0].time_ps["tp"]
    # the same bytes per rank up to (t-1)/t, at a tenth of the bandwidth
    assert across == pytest.approx(inside * 10 * Fraction(15, 16) / Fraction(7, 8), rel=1e-9)


def test_one_f_one_b_bubble_is_p_minus_one_over_m_vp():
    # Narayanan et al. 2021 §2.2.1-2.2.2: bubble time fraction (p - 1)/(m·vp) of the ideal step
    for pp, vpp, m in ((4, 1, 8), (4, 2, 8), (2, 1, 3)):
        cfg = gpt(L=8, m=m, pp=pp, vpp=vpp)
        est = numbers(cfg)
        for st in est.stages:
            busy = sum(v for k, v in st.time_ps.items() if k not in ("bubble", "dp", "optimizer"))
            assert st.time_ps["bubble"] == pytest.approx(busy * Fraction(pp - 1, m * vpp), abs=8)


def test_zero_bubble_schedules_have_no_bubble_and_gpipe_has_p_minus_one():
    # DualPipeV (deepseek-ai/DualPipe README): (PP/2 - 1)(F&B + B - 3W) on PP/2 = p ranks, B the full
    # backward (2F), W = F, F&B = F + B: (p - 1)·2F per rank, in slots of its two chunks' 2(F + B) = 6F:
    # (p - 1)/3 = 1 slot at p = 4 (issue 33; it was 0 with B read as the input gradient alone)
    for schedule, slots in (("zero-bubble-v", 0), ("dualpipev", 1), ("gpipe", 3)):
        cfg = gpt(L=8, m=8, pp=4, pp_schedule=schedule, vpp=1 if schedule == "gpipe" else 2)
        st = numbers(cfg).stages[0]
        busy = sum(v for k, v in st.time_ps.items() if k not in ("bubble", "dp", "optimizer"))
        assert st.time_ps["bubble"] == pytest.approx(busy * Fraction(slots, 8), abs=8)


def test_data_parallel_gradients_are_all_reduced_once_per_step():
    # DDP: one all-reduce of the fp32 main gradients per step, 2(d-1)/d of 4·Φ bytes per rank (ZeRO §7.1:
    # 2Ψ); the distributed optimizer: reduce-scatter of the gradients + all-gather of the bf16 parameters
    cfg = gpt(dp=4)
    est = numbers(cfg)
    phi = est.stages[0].param_count
    assert est.stages[0].time_ps["dp"] == pytest.approx(Fraction(2 * 3, 4) * 4 * phi, abs=16)
    cfg["parallel"]["distributed_optimizer"] = True
    est = numbers(cfg)
    assert est.stages[0].time_ps["dp"] == pytest.approx(Fraction(3, 4) * (4 + 2) * phi, abs=16)


def test_a_dense_model_has_no_expert_parallel_time():
    # no routed experts: no dispatch / combine all-to-all (Lepikhin et al. 2021 §3), not even a byte
    for overrides in ({}, {"dp": 2, "tp": 2}):
        est = numbers(gpt(**overrides))
        assert all(st.time_ps["ep"] == 0 for st in est.stages)


def test_pipeline_transfers_are_one_activation_each_way_per_micro_batch():
    # Megatron-LM p2p_communication: every micro-batch each stage boundary carries the activations
    # forward and their gradient back, s·b·h in bf16 (no scatter-gather at t = 1); one stage: nothing
    h, s, b, m = 2048, 1024, 2, 4
    assert numbers(gpt(h=h, s=s, b=b, m=m)).stages[0].time_ps["pp"] == 0
    est = numbers(gpt(h=h, s=s, b=b, m=m, pp=2))
    # pipeline neighbours are 2·t·cp·d = 2 ranks apart: one node, at 10^12 bytes/s (picoseconds = bytes)
    assert [st.time_ps["pp"] for st in est.stages] == [m * 2 * 2 * s * b * h] * 2
    # with t·cp·d = 8 ranks per stage the neighbours are 8 apart: a 16-rank span crosses 8-device nodes,
    # and each tensor-parallel rank sends its 1/t share (Megatron-LM's scatter-gather)
    cfg = gpt(h=h, s=s, b=b, m=m, pp=2, tp=2, dp=4)
    cfg["device"]["inter_node_bandwidth"] = 10 ** 10
    est = numbers(cfg)
    assert [st.time_ps["pp"] for st in est.stages] == [m * 2 * 2 * s * b * h // 2 * 100] * 2
    # the same price under the torch profile (fp32 activations, as hf-trainer.mf's: 4 bytes each): its own
    # `let pp_x` (the bytes of one transfer) once replaced time.mf's (the seconds of one), and the step priced
    # bytes as seconds (3.4e8 s for Llama-2-7B at pp 2)
    cfg = gpt(h=h, s=s, b=b, m=m, pp=2)
    cfg["training"]["framework"] = "torch"
    assert [st.time_ps["pp"] for st in numbers(cfg).stages] == [m * 2 * 4 * s * b * h] * 2


def test_a_ring_slower_than_the_attention_shows_its_excess():
    # Ring attention (Liu et al. 2023 §3) overlaps the K,V block transfers with the blockwise attention;
    # only what the attention cannot hide shows. Each rank receives the other cp - 1 chunks' K and V
    # (s/cp tokens, 2h wide, bf16) once in forward; backward brings K,V again and returns dK,dV (3
    # passes), full recompute runs the forward's pass again (4). Hidden under the core's FLOPs:
    # 4·b·(s/cp)·s·h per forward (QKᵀ and scores·V), 5/2 of that in flash backward (FlashAttention-2
    # §3.1.2: ring CP runs fused attention only), again when recomputed.
    h, L, s, b, m, cp = 2048, 4, 1024, 2, 4, 2
    cfg = gpt(h=h, L=L, s=s, b=b, m=m, cp=cp)
    cfg["device"]["intra_node_bandwidth"] = 10 ** 8  # 10^4 ps per byte: the ring is the slower
    est = numbers(cfg)
    ring_bytes = 4 * (cp - 1) * 2 * (s // cp) * b * 2 * h
    core = 4 * b * (s // cp) * s * h
    # ... as the causal flash kernels run it: the blocks on and below the diagonal, nb(nb + 1)/2 of nb² for
    # nb = s/128 blocks (FlashAttention-2 §3.1.1; dense.mf core_run), 9/16 at s = 1024
    hidden_ps = (core + core * 5 // 2 + core) * 9 // 16  # at 10^12 FLOP/s: picoseconds = FLOPs
    # + the last dK,dV block's trip home after the ring's last step (one s/cp chunk, nothing hides it)
    tail = 2 * (s // cp) * b * 2 * h
    assert est.stages[0].time_ps["cp"] == m * L * (ring_bytes * 10 ** 4 - hidden_ps + tail * 10 ** 4)
    cfg["device"]["intra_node_bandwidth"] = 10 ** 12  # fast links: the attention hides the ring, not the tail
    assert numbers(cfg).stages[0].time_ps["cp"] == m * L * tail


def _dp_allreduce_ps(est, d, bandwidth):
    """DDP's ring all-reduce of the fp32 main gradients, 2(d-1)/d of 4·Φ bytes per rank (ZeRO §7.1)."""
    return Fraction(2 * (d - 1), d) * 4 * est.stages[0].param_count * Fraction(10 ** 12, bandwidth)


def test_overlapped_gradient_reduction_shows_only_what_the_backward_cannot_hide():
    # Megatron-LM --overlap-grad-reduce (PyTorch DDP buckets) runs the gradient all-reduce under the
    # last micro-batch's backward, which is 2/3 of its compute here (Narayanan §5.1: backward = 2 ×
    # forward; no recompute)
    d, m = 4, 4
    cfg = gpt(dp=d, m=m, overlap_grad_reduce=True)
    cfg["training"]["recompute"] = "none"
    cfg["device"]["intra_node_bandwidth"] = 10 ** 8  # the all-reduce takes longer than one backward
    est = numbers(cfg)
    st = est.stages[0]
    backward_ps = Fraction(2, 3) * st.time_ps["compute"] / m
    assert 0 < st.time_ps["dp"] == pytest.approx(_dp_allreduce_ps(est, d, 10 ** 8) - backward_ps, abs=16)
    cfg["device"]["intra_node_bandwidth"] = 10 ** 12  # now it hides entirely
    assert numbers(cfg).stages[0].time_ps["dp"] == 0
    cfg["parallel"]["overlap_grad_reduce"] = False  # and without overlap all of it shows
    est = numbers(cfg)
    assert est.stages[0].time_ps["dp"] == pytest.approx(_dp_allreduce_ps(est, d, 10 ** 12), abs=16)


def test_the_data_parallel_group_spans_tp_times_cp_times_dp_ranks():
    # Megatron-LM's rank order tp-cp-ep-dp-pp: a dp group's members are t·cp apart, so it spans
    # t·cp·d consecutive ranks; gradients are reduced over the dp × cp ranks (parallel_state's
    # data-parallel group with context parallelism). t = 2, cp = 4, d = 2: 16 ranks on 8-device nodes
    t, cp, d = 2, 4, 2
    cfg = gpt(tp=t, cp=cp, dp=d)
    cfg["device"]["inter_node_bandwidth"] = 10 ** 10
    est = numbers(cfg)
    assert est.stages[0].time_ps["dp"] == pytest.approx(_dp_allreduce_ps(est, d * cp, 10 ** 10), abs=16)
    cfg["parallel"]["cp"] = 2  # 8 ranks: one node
    est = numbers(cfg)
    assert est.stages[0].time_ps["dp"] == pytest.approx(_dp_allreduce_ps(est, d * 2, 10 ** 12), abs=16)


def test_the_bubble_idles_every_busy_part_of_a_micro_batch():
    # the bubble (Narayanan §2.2.1) is (p - 1)/(m·vp) micro-batch slots, each as long as this stage's
    # busy micro-batch: compute, memory-bound kernels, tp, cp, ep and pp transfers alike
    pp, m = 2, 4
    cfg = gpt(L=4, m=m, pp=pp, tp=2, cp=2)
    cfg["device"]["memory_bandwidth"] = 10 ** 12
    cfg["device"]["intra_node_bandwidth"] = 10 ** 8   # a slow ring: cp time shows
    est = numbers(cfg)
    for st in est.stages:
        parts = {k: v for k, v in st.time_ps.items() if k not in ("bubble", "dp", "optimizer")}
        assert all(parts[k] > 0 for k in ("compute", "memory", "tp", "cp", "pp")), parts
        assert st.time_ps["bubble"] == pytest.approx(sum(parts.values()) * Fraction(pp - 1, m), abs=8)


def test_selective_recompute_reruns_the_core_kernels_over_what_it_drops():
    # Korthikanti et al. 2022 §5: selective recompute drops the attention core's 5·a·s²·b bytes per layer
    # (scores and softmax output in bf16, the 1-byte dropout mask) and recomputes them in backward, so
    # the memory-bound kernels write and read them once more: 2 passes, at the memory bandwidth
    a, L, s, b, m = 16, 4, 1024, 2, 4
    cfg = gpt(a=a, L=L, s=s, b=b, m=m)
    cfg["device"]["memory_bandwidth"] = 10 ** 12   # picoseconds = bytes
    cfg["training"]["recompute"] = "none"
    none = numbers(cfg).stages[0].time_ps["memory"]
    cfg["training"]["recompute"] = "selective"
    selective = numbers(cfg).stages[0].time_ps["memory"]
    assert selective - none == pytest.approx(m * L * 2 * 5 * a * s * s * b, abs=8)


@pytest.mark.regression
def test_full_recompute_adds_two_passes_of_memory_bound_traffic():
    # regression (restates time.mf's pass count, no measurement): the memory-bound kernels read and
    # write what a layer keeps for backward 5 times without recompute and 7 times with a full one
    cfg = gpt()
    cfg["device"]["memory_bandwidth"] = 10 ** 12
    full = numbers(cfg)
    cfg["training"]["recompute"] = "none"
    none = numbers(cfg)
    assert full.stages[0].time_ps["memory"] == pytest.approx(Fraction(7, 5) * none.stages[0].time_ps["memory"],
                                                             abs=8)


def _mixtral(schedule="1f1b", **extra):
    """Mixtral 8x7B (top-2 of 8 experts, h = 4096, 32 layers, s = 4096) on two stages, ep = 2, unit device."""
    over = {"parallel.dp": 2, "parallel.tp": 1, "parallel.pp": 2, "parallel.ep": 2, "model.capacity_factor": None,
            "training.global_batch_size": None, "training.num_micro_batches": 4, "training.micro_batch_size": 1,
            "training.recompute": "none", "device": dict(UNIT_DEVICE), "parallel.pp_schedule": schedule, **extra}
    return numbers(ROOT / "configs" / "mixtral-8x7b.yaml", over)


def test_expert_all_to_alls_are_exposed_in_1f1b_and_the_bubble_idles_them_too():
    # GShard (Lepikhin et al. 2021 §3): each token's hidden vector goes to its k experts (dispatch) and
    # comes back (combine), (ep - 1)/ep of it to other ranks; backward runs both again. bf16, k = 2:
    # per layer and micro-batch 2 passes × 2 all-to-alls × k·s·b·h·2 bytes × (ep - 1)/ep
    est = _mixtral()
    k, s, b, h, m, ep, layers = 2, 4096, 1, 4096, 4, 2, 16
    per_layer = 2 * 2 * k * s * b * h * 2 * Fraction(ep - 1, ep)
    for st in est.stages:
        assert st.time_ps["ep"] == m * layers * per_layer  # at 10^12 bytes/s: picoseconds = bytes
        # (+ the Megatron-Core dispatcher's host wait per MoE layer and micro-batch: time.mf cost host)
        busy = st.time_ps["compute"] + st.time_ps["ep"] + st.time_ps["pp"] + st.time_ps["host"]
        assert st.time_ps["bubble"] == pytest.approx(busy * Fraction(1, m), abs=8)  # (p - 1)/m, p = 2


def test_an_expert_all_to_all_wider_than_a_node_splits_its_bytes_over_both_links():
    # one device per node: the ep = 2 group spans two nodes, so every routed copy that leaves its rank
    # crosses nodes ((ep - ep_local)/ep = 1/2 of them) at the inter-node 10^10 bytes/s (100 ps a byte)
    k, s, b, h, m, ep, layers = 2, 4096, 1, 4096, 4, 2, 16
    slow = dict(UNIT_DEVICE, devices_per_node=1, inter_node_bandwidth=10 ** 10)
    est = _mixtral(device=slow)
    per_layer = 2 * 2 * k * s * b * h * 2 * Fraction(ep - 1, ep)
    assert est.stages[0].time_ps["ep"] == m * layers * per_layer * 100
    # node-limited routing (DeepSeek-V3 §2.1.2/§3.2.2): a token goes once to each of its M = 1 nodes,
    # the other one w.p. (nodes - 1)/nodes, instead of once per expert there: 1/k of the IB bytes
    limited = _mixtral(device=slow, **{"model.moe_router_group_topk": 1})
    assert limited.stages[0].time_ps["ep"] == m * layers * per_layer * 100 / k
    # FP8 dispatch (DeepSeek-V3 §3.3.2): 1 byte + an fp32 scale per 128 elements, the combine in bf16
    fp8 = _mixtral(device=slow, **{"model.moe_router_group_topk": 1, "parallel.moe_fp8_dispatch": True})
    assert fp8.stages[0].time_ps["ep"] == m * layers * per_layer * 100 / k * (1 + Fraction(4, 128) + 2) / 4


def test_dualpipev_hides_expert_and_pipeline_transfers_under_compute():
    # DeepSeek-V3 §3.2.1 (DualPipe): a forward and a backward chunk run together, so the all-to-alls
    # and pipeline transfers of one run under the other's compute (here compute is far longer)
    est = _mixtral("dualpipev", **{"parallel.vpp": 2})
    assert all(st.time_ps["ep"] == 0 and st.time_ps["pp"] == 0 for st in est.stages)
    assert all(st.time_ps["pp"] > 0 for st in _mixtral().stages)


def test_tokens_per_second_count_every_data_parallel_replica():
    # a step trains d·m·b sequences of s tokens (the global batch), in step_seconds
    d, m, b, s = 4, 3, 2, 1024
    est = numbers(gpt(s=s, b=b, m=m, dp=d))
    assert est.tokens_per_second * est.step_seconds == pytest.approx(d * m * b * s, rel=1e-9)


def test_a_context_parallel_ring_across_nodes_uses_the_inter_node_links():
    # the cp group's ranks are t apart (Megatron-LM's tp-cp-ep-dp-pp order): it spans t·cp ranks;
    # t = 2, cp = 8 span 16 ranks of 8-device nodes, so the ring runs at the inter-node bandwidth
    h, L, s, b, m, t, cp = 2048, 4, 1024, 2, 4, 2, 8
    cfg = gpt(h=h, L=L, s=s, b=b, m=m, tp=t, cp=cp)
    cfg["device"]["inter_node_bandwidth"] = 10 ** 8
    est = numbers(cfg)
    ring_bytes = 4 * (cp - 1) * 2 * (s // cp) * b * 2 * h // t   # K,V of the t-split heads (as above)
    core = 4 * b * (s // cp) * s * h // t
    tail = 2 * (s // cp) * b * 2 * h // t
    assert est.stages[0].time_ps["cp"] == m * L * (ring_bytes * 10 ** 4 - core * 9 // 2 * 9 // 16 + tail * 10 ** 4)   # causal: 9/16


def test_ring_context_parallelism_merges_each_steps_partial_results_at_memory_speed():
    # Transformer Engine's ring (context_parallel.py, AttnFuncWithCPAndKVP2P) merges every step after
    # the first into running sums: forward writes the step's output and corrects the running output
    # (4 passes over the local s/cp tokens' output), backward accumulates dQ and dK,dV (3 passes each);
    # full recompute runs the forward's merges again. At 10^12 bytes/s, picoseconds = bytes.
    h, L, s, b, m, cp = 2048, 4, 1024, 2, 4, 4
    cfg = gpt(h=h, L=L, s=s, b=b, m=m, cp=cp)
    cfg["device"]["memory_bandwidth"] = 10 ** 12
    est = numbers(cfg)
    merge = (cp - 1) * 2 * (s // cp) * b   # bf16, per element of width
    merges = merge * (8 * h + 3 * (h + 2 * h))   # full recompute: 2 x 4 passes of the output, 3 of dQ and dK,dV
    tail = 2 * (s // cp) * b * 2 * h
    assert est.stages[0].time_ps["cp"] == m * L * (merges + tail)
    cfg["parallel"]["cp_algo"] = "ulysses"   # all-to-alls of whole heads: nothing to merge
    assert numbers(cfg).stages[0].time_ps["cp"] > 0


def test_context_parallelism_on_a_short_sequence_costs_time():
    # issue 33: Llama 3 8B at 8K tokens on 8 H100s gave DP8 and CP8 the same step; CP's per-step
    # merges and its last dK,dV transfer now make CP8 slower, and more so than CP2
    steps = {}
    for cp in (1, 2, 8):
        est = numbers(str(ROOT / "configs" / "llama3-8b.yaml"),
                               {"parallel.cp": cp, "parallel.dp": 8 // cp, "parallel.tp": 1, "parallel.pp": 1})
        steps[cp] = est.step_seconds
    assert steps[1] < steps[2] < steps[8]
    assert steps[8] > 1.05 * steps[1], steps


def test_zero_2_and_zero_3_data_parallel_traffic():
    # ZeRO (Rajbhandari et al. 2020) §7.1-7.2, in DeepSpeed's bf16 (it communicates in the model's dtype):
    # ZeRO-2 reduce-scatters the gradients after every micro-batch's backward (its gradients stay sharded:
    # DeepSpeed stage_1_and_2.py reduce_ready_partitions_and_remove_grads, "if self.partition_gradients or
    # self.is_gradient_accumulation_boundary()") and all-gathers the updated parameters once per step
    # ((m + 1)Ψ; 2Ψ in one micro-batch);
    # ZeRO-3 all-gathers the parameters for forward and again for backward and reduce-scatters the
    # gradients, every micro-batch (3Ψ), prefetched under that micro-batch's compute: only the excess shows
    d, m = 4, 4
    cfg = gpt(dp=d, m=m, zero=2)
    cfg["training"]["framework"] = "deepspeed"
    cfg["device"]["intra_node_bandwidth"] = 10 ** 8  # 10^4 ps per byte
    est = numbers(cfg)
    phi = est.stages[0].param_count
    ring = Fraction(d - 1, d) * phi * 2 * 10 ** 4    # one reduce-scatter or all-gather of Φ bf16 values
    assert est.stages[0].time_ps["dp"] == pytest.approx((m + 1) * ring, abs=16)   # overlap_comm off: exposed
    one = gpt(dp=d, m=1, zero=2)
    one["training"]["framework"] = "deepspeed"
    one["device"]["intra_node_bandwidth"] = 10 ** 8
    assert numbers(one).stages[0].time_ps["dp"] == pytest.approx(2 * ring, abs=16)
    # with overlap_comm each reduce-scatter hides under its own micro-batch's backward (2/3 of its compute
    # without recompute, Narayanan §5.1), not under the whole step's; the parameters' all-gather after the
    # optimizer step has no backward left to hide under
    cfg["training"]["recompute"] = "none"
    ovl = {"deepspeed.overlap_comm": True}
    est = numbers(cfg, ovl)
    st = est.stages[0]
    bwd_ps = Fraction(2, 3) * st.time_ps["compute"] / m
    assert 0 < bwd_ps < ring
    assert st.time_ps["dp"] == pytest.approx(m * (ring - bwd_ps) + ring, abs=64)
    cfg["parallel"]["grad_accumulation_shard"] = False   # gradients accumulated unsharded: once per step
    assert numbers(cfg, ovl).stages[0].time_ps["dp"] < 2 * ring
    cfg["parallel"]["zero"] = 3
    del cfg["parallel"]["grad_accumulation_shard"]
    cfg["training"]["recompute"] = "full"
    est = numbers(cfg)
    st = est.stages[0]
    assert st.time_ps["dp"] == pytest.approx(m * 3 * ring - st.time_ps["compute"], abs=64)
    # Megatron-LM (the default profile) reduces its fp32 main gradients (as for DDP above) and does not
    # overlap the step's reduction: with ZeRO-3 there is none left at the step's end, only the per
    # micro-batch gathers (bf16) and reduce-scatters (fp32)
    del cfg["training"]["framework"]
    est = numbers(cfg)
    st = est.stages[0]
    per_mb = Fraction(d - 1, d) * phi * (2 + 2 + 4) * 10 ** 4
    assert st.time_ps["dp"] == pytest.approx(m * per_mb - st.time_ps["compute"], abs=64)


def test_zero_2_reduces_in_every_backward_as_deepspeed_measured():
    # the recording of bench/ds_zero2_reduce_count.py (DeepSpeed 0.19.8, two CPU ranks, 4 micro-batches): ZeRO-2
    # reduces the whole gradient buffer in each of the 4 backwards, ZeRO-1 only in the last one; time.mf prices
    # the same count, m reduce-scatters for ZeRO-2 and one for ZeRO-1 (zero2_rs_mb)
    text = (ROOT / "bench" / "results" / "issue33-stop49" / "ds_zero2_reduce_count.txt").read_text(encoding="utf-8")
    stages = {}
    for block in text.split("ZeRO-")[1:]:
        stage = int(block[0])
        stages[stage] = {line.split("  ")[1].strip(): line for line in block.splitlines()[1:] if line.startswith("  ")}
    reduced = {st: sorted(ph for ph, line in rows.items() if ph.startswith("backward") and "all_reduce 1.000" in line)
               for st, rows in stages.items()}
    m = 4
    assert reduced[1] == [f"backward {m - 1}"]
    assert reduced[2] == [f"backward {i}" for i in range(m)]
    d = 2
    rings = {}
    for zero in (1, 2):
        cfg = gpt(dp=d, m=m, zero=zero)
        cfg["training"]["framework"] = "deepspeed"
        cfg["device"]["intra_node_bandwidth"] = 10 ** 8
        est = numbers(cfg)
        rings[zero] = est.stages[0].time_ps["dp"] / (Fraction(d - 1, d) * est.stages[0].param_count * 2 * 10 ** 4)
    assert rings[1] == pytest.approx(2, abs=1e-9) and rings[2] == pytest.approx(m + 1, abs=1e-9)
    # Megatron-FSDP (the default profile's ZeRO-2) overlaps the reduce-scatter whatever --overlap-grad-reduce
    # says (megatron_fsdp.py MegatronFSDP.__init__): each fp32 reduce-scatter shows only beyond its backward
    cfg = gpt(dp=d, m=m, zero=2)
    cfg["training"]["recompute"] = "none"
    cfg["device"]["intra_node_bandwidth"] = 10 ** 8
    st = numbers(cfg).stages[0]
    phi = st.param_count
    rs, ag = (Fraction(d - 1, d) * phi * w * 10 ** 4 for w in (4, 2))
    bwd = Fraction(2, 3) * st.time_ps["compute"] / m
    assert 0 < bwd < rs
    assert st.time_ps["dp"] == pytest.approx(m * (rs - bwd) + ag, abs=64)


def test_fsdp_without_gradient_sync_reduce_scatters_once_per_step():
    # FSDP2 with gradient sync off over m > 1 micro-batches (parallel.grad_accumulation_shard: false; FSDP
    # no_sync, Zhao et al. 2023 §3.2.4 "accumulate unsharded gradients", which the memory model holds) still
    # gathers its parameters in every micro-batch but reduce-scatters once, under the last backward
    d, m = 4, 4
    got = {}
    for sync in (True, False):
        cfg = gpt(dp=d, m=m, zero=3)
        cfg["training"].update(framework="fsdp2", recompute="none")
        cfg["parallel"]["grad_accumulation_shard"] = sync
        cfg["device"]["intra_node_bandwidth"] = 10 ** 8
        got[sync] = numbers(cfg).stages[0]
    st = got[True]
    ring = Fraction(d - 1, d) * st.param_count * 10 ** 4           # ps per byte per parameter
    gathers, rs = 2 * 2 * ring, 4 * ring                             # bf16 forward + backward gathers, fp32 reduce-scatter
    per_mb = st.time_ps["compute"] / m
    assert st.time_ps["dp"] == pytest.approx(m * (gathers + rs - per_mb), abs=64)
    bwd = Fraction(2, 3) * per_mb
    assert got[False].time_ps["dp"] == pytest.approx(m * (gathers - per_mb) + rs - bwd, abs=64)


def test_a_multi_token_prediction_module_adds_its_block_head_and_embedding_collectives():
    # DeepSeek-V3 §2.2: an MTP module embeds the next token with the shared embedding, projects, runs one
    # transformer block and the shared head. In Shoeybi et al.'s count (one all-reduce of s·b·h each):
    # the block's 4, the vocabulary-parallel embedding's 1 and the head's 1; the copy of the embedding
    # table the last stage holds for it (pp > 1) moves nothing of its own
    h, s, b, m, t = 2048, 1024, 2, 4, 2
    allreduce = Fraction(2 * (t - 1), t) * 2 * s * b * h
    last = []
    for n in (0, 1):
        cfg = gpt(h=h, s=s, b=b, m=m, L=4, tp=t, pp=2)
        cfg["formulas"], cfg["model"]["mtp_layers"], cfg["training"]["recompute"] = ["moe.mf"], n, "none"
        last.append(numbers(cfg).stages[-1].time_ps["tp"])
    assert last[0] == m * (2 * 4 + 1) * allreduce   # two body layers and the head
    assert last[1] - last[0] == m * (4 + 1 + 1) * allreduce


def test_multi_token_prediction_full_recompute_reruns_the_block_and_the_projection():
    # Full recompute reruns each transformer block's forward (Korthikanti §6: one more forward pass); an
    # MTP module's block is one more such block, and its projection M (2h -> h: 2·s·b·2h·h FLOPs per
    # micro-batch, DeepSeek-V3 §2.2) runs again with it; the shared head is not recomputed (Megatron-LM's
    # full recompute covers the transformer layers). The block's rerun is read off the same model without
    # MTP, (full - none) / L
    h, s, b, m, L = 2048, 1024, 2, 4, 4
    compute = {}
    for n in (0, 1):
        for mode in ("none", "full"):
            cfg = gpt(h=h, s=s, b=b, m=m, L=L)
            cfg["formulas"], cfg["model"]["mtp_layers"], cfg["training"]["recompute"] = ["moe.mf"], n, mode
            compute[n, mode] = numbers(cfg).stages[-1].time_ps["compute"]
    rerun = {n: compute[n, "full"] - compute[n, "none"] for n in (0, 1)}
    assert rerun[1] - rerun[0] - Fraction(rerun[0], L) == m * 2 * s * b * 2 * h * h


def test_a_multi_token_prediction_module_adds_its_projection_head_and_block_flops():
    # DeepSeek-V3 §2.2: an MTP module projects [h; emb] with M (2h -> h: 2·s·b·2h·h FLOPs per micro-batch),
    # runs one transformer block and the shared output head (2·s·b·h·v); model FLOPs are 3 × forward
    # (Korthikanti eq. 7). The block's share is read off the model without MTP and one more layer
    h, s, b, m, L, v = 2048, 1024, 2, 4, 4, 51200
    ideal = {}
    for layers, n in ((L, 0), (L + 1, 0), (L, 1)):
        cfg = gpt(h=h, s=s, b=b, m=m, L=layers, v=v)
        cfg["formulas"], cfg["model"]["mtp_layers"], cfg["training"]["recompute"] = ["moe.mf"], n, "none"
        ideal[layers, n] = numbers(cfg).stages[0].ideal_ps
    block = ideal[L + 1, 0] - ideal[L, 0]
    assert ideal[L, 1] - ideal[L, 0] - block == 3 * m * (2 * s * b * 2 * h * h + 2 * s * b * h * v)


def test_a_multi_token_prediction_module_keeps_its_norm_inputs_and_concatenation():
    # DeepSeek-V3 §2.2: the module normalises the hidden state and the next token's embedding (two h-wide
    # norm inputs) and concatenates them (2h): 4h per token at 2 bytes, beside what its embedding lookup and
    # its pass through the shared head keep (the same as the main model's embedding and head layers)
    h, s, b = 2048, 1024, 2
    cfg = gpt(h=h, s=s, b=b, m=1, L=4)
    cfg["formulas"], cfg["model"]["mtp_layers"], cfg["training"]["recompute"] = ["moe.mf"], 1, "none"
    layers = {e.block: e for e in numbers(cfg).stages[0].layers}
    act = {k: int(e.per_layer_values["activations"]) for k, e in layers.items()}
    assert act["mtp"] == 4 * 2 * s * b * h + act["embedding"] + act["output"]


# ---------------------------------------------------------------------------------- presets and outputs


def test_device_preset_and_overrides():
    est = numbers(ROOT / "configs" / "llama3-8b.yaml", {"device": "h200"})
    assert est.capacity_bytes == int(141 * 2 ** 30) or est.capacity_bytes > 80 * 2 ** 30
    slower = numbers(ROOT / "configs" / "llama3-8b.yaml",
                              {"device": {"preset": "h200", "efficiency": 0.4}})
    assert slower.stages[0].time_ps["compute"] == pytest.approx(2 * est.stages[0].time_ps["compute"] * 0.803 / 0.8,
                                                              rel=1e-9)
    with pytest.raises(MemformError, match="no such device preset.*h100-sxm"):
        numbers(ROOT / "configs" / "llama3-8b.yaml", {"device": "h100"})


def test_no_peak_flops_means_no_time_model():
    cfg = gpt()
    cfg["device"] = {"capacity_gib": 80}
    est = numbers(cfg)
    assert not est.has_time and est.step_seconds is None and est.mfu is None
    assert "time" not in est.numbers_dict()
    with pytest.raises(MemformError, match="bandwidth must be positive"):
        numbers(cfg, {"device.peak_flops_bf16": 1e15})
    with pytest.raises(MemformError, match="efficiency must be in"):
        numbers(cfg, {"device": {"preset": "h100-sxm", "efficiency": 1.5}})


def test_fast_path_and_interpreter_agree_on_time():
    import memform
    from memform.engine.model import estimate as interpreted
    for name in ("llama3-70b", "deepseek-v3", "gpt3-175b"):
        path = ROOT / "configs" / f"{name}.yaml"
        fast, full = memform.estimate(path), interpreted(path)
        assert type(fast).__name__ == "FastEstimate"
        assert fast.numbers_dict() == full.numbers_dict()
        assert fast.step_seconds == full.step_seconds and fast.step_seconds > 0


def test_cli_prints_and_emits_the_step_time():
    r = run_memform("estimate", ROOT / "configs" / "llama3-70b.yaml")
    assert r.returncode == 0 and "step ≈" in r.stdout and "MFU" in r.stdout and "tokens/s" in r.stdout
    r = run_memform("estimate", ROOT / "configs" / "llama3-70b.yaml", "--json")
    d = json.loads(r.stdout)
    assert set(d["time"]) >= {"step_seconds", "mfu", "tokens_per_second", "parts", "slowest_stage"}
    assert d["time"]["step_seconds"] == pytest.approx(sum(d["time"]["parts"].values()), rel=1e-9)
    # tokens per step: global batch 64 × 8192 (configs/llama3-70b.yaml)
    assert d["time"]["tokens_per_second"] * d["time"]["step_seconds"] == pytest.approx(64 * 8192)


def test_derive_time_prints_the_closed_form():
    r = run_memform("derive", ROOT / "configs" / "llama3-70b.yaml", "--keep", "b,s", "--time", "--stage", "1")
    assert r.returncode == 0, r.stderr
    assert "T_compute" in r.stdout and "T_bubble" in r.stdout and "b*s" in r.stdout.replace(" ", "")
    r = run_memform("derive", ROOT / "configs" / "llama2-7b.yaml", "--time", "--set", "device.capacity_gib=80")
    assert r.returncode == 2 and "no time model" in r.stderr


# ---------------------------------------------------------------------------------- the language


def _profile(tmp_path, text):
    (tmp_path / "p.mf").write_text(text)
    cfg = gpt()
    return cfg, {"training.framework": str(tmp_path / "p.mf")}


def test_cost_blocks_see_the_stage_and_each_other(tmp_path):
    cfg, ov = _profile(tmp_path, "cost extra { seconds = (stage + 1) * compute.seconds }\n")
    cfg["parallel"]["pp"] = 2
    est = numbers(cfg, ov)
    for st in est.stages:
        assert st.time_ps["extra"] == pytest.approx((st.stage + 1) * st.time_ps["compute"], abs=2)


def test_stages_with_the_same_layers_share_costs_unless_a_cost_reads_the_stage(tmp_path):
    """The interpreter evaluates the cost blocks once per distinct stage (same layer groups, bubble
    and overlap); a cost block that names ``stage`` itself must still get every stage's own value."""
    cfg = gpt(L=4, pp=4)  # stages 1 and 2 hold one body layer each, nothing else
    plain = numbers(cfg)
    assert plain.stages[1].time_ps == plain.stages[2].time_ps
    assert plain.stages[1].time_exprs["compute"] is plain.stages[2].time_exprs["compute"]  # shared
    _, ov = _profile(tmp_path, "cost extra { seconds = (stage + 1) * compute.seconds }\n")
    est = numbers(cfg, ov)
    got = [st.time_ps["extra"] for st in est.stages]
    assert got[2] == pytest.approx(3 * est.stages[2].time_ps["compute"], abs=3)
    assert got[1] == pytest.approx(2 * est.stages[1].time_ps["compute"], abs=3) and got[1] != got[2]


@pytest.mark.parametrize("text", [
    # through a let that reads the stage, and through a let that reads such a let
    "let sf = stage + 1\nlet sf2 = sf\ncost extra { seconds = sf2 * compute.seconds }\n",
    # through a function whose body reads the stage (not a parameter of that name)
    "def sf(x) = x * (stage + 1)\ncost extra { seconds = sf(compute.seconds) }\n",
])
def test_a_cost_reading_the_stage_through_a_let_or_function_gets_each_stages_value(tmp_path, text):
    """Lets may read ``stage`` (megatron-core.mf's opt_flat_bucket): a cost that reads one must not share
    one value among alike stages (the interpreter's per-stage cost cache, _costs_read_position)."""
    cfg = gpt(L=4, pp=4)
    _, ov = _profile(tmp_path, text)
    est = numbers(cfg, ov)
    got = [st.time_ps["extra"] for st in est.stages]
    assert got[2] == pytest.approx(3 * est.stages[2].time_ps["compute"], abs=3)
    assert got[1] == pytest.approx(2 * est.stages[1].time_ps["compute"], abs=3) and got[1] != got[2]


@pytest.mark.parametrize("text,message", [
    ("cost nothing { flops = 1 }\n", "cost 'nothing' must define seconds"),
    ("let x = overlap\n", "'overlap' is only defined inside cost blocks"),
    ("let y = layers_sum(params)\n", "runtime and cost blocks"),
    ("schedule mine { inflight = 1 }\n", "schedule 'mine' must define bubble, overlap"),
])
def test_cost_mistakes_are_clear_errors(tmp_path, text, message):
    (tmp_path / "p.mf").write_text(text)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps(gpt()))
    r = run_memform("estimate", cfg, "--set", f"training.framework={tmp_path / 'p.mf'}")
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_moe_flops_follow_the_active_parameters():
    # Mixtral 8x7B: "12.9B active parameters" per token of 46.7B (Mistral AI, "Mixtral of experts", 2023-12-11;
    # Jiang et al. 2024 §2: 13B), embedding included. Model FLOPs per token are 6 × the active parameters a
    # token multiplies (Kaplan et al. 2020 §2.1; the embedding is a lookup) + the attention core 12·s·h per
    # layer (3 × Narayanan's 4·s²·h per sequence)
    cfg = ROOT / "configs" / "mixtral-8x7b.yaml"
    over = {"parallel.dp": 1, "parallel.tp": 1, "parallel.pp": 1, "parallel.ep": 1, "model.capacity_factor": None,
            "training.global_batch_size": None, "training.num_micro_batches": 1, "device": dict(UNIT_DEVICE)}
    est = numbers(cfg, over)
    h, L, s, v = 4096, 32, 4096, 32000
    tokens = s   # one sequence
    active = (est.stages[0].ideal_ps / tokens - 12 * L * s * h) / 6 + v * h
    assert active == pytest.approx(12.9e9, rel=0.01)


@pytest.mark.parametrize("shared", [0, 2])
def test_moe_model_flops_count_every_gemm_a_token_passes_exactly(shared):
    # Model FLOPs (Korthikanti eq. 7: forward + backward = 3 × forward, no recompute) of an MoE model, counted
    # by hand per token and layer: 2 FLOPs per weight of the QKV (GQA: h·(h + 2·g·d_h)) and output (h·h)
    # projections (Narayanan §5.1), the attention core 4·s·h (Narayanan's 4·b·s²·h per sequence), the router
    # h -> E (2·h·E: the gate's matmul, Shazeer et al. 2017 eq. 3), top-k SwiGLU experts of 3·h·f weights
    # each (Jiang et al. 2024 §2.1) and the always-active shared experts, f wide each (DeepSeek-V3 §2.1.2);
    # per token the head 2·h·v. No biases (model.bias false)
    h, a, g, L, s, v, b, E, k, f = 1024, 16, 4, 3, 512, 32000, 2, 8, 2, 1536
    cfg = {"name": "moe", "formulas": ["moe.mf"],
           "model": {"hidden_size": h, "num_heads": a, "num_kv_heads": g, "num_layers": L, "vocab_size": v,
                     "seq_length": s, "activation": "swiglu", "norm": "rmsnorm", "bias": False,
                     "num_experts": E, "moe_top_k": k, "moe_ffn_hidden_size": f, "num_shared_experts": shared},
           "parallel": {"dp": 1, "tp": 1, "pp": 1},
           "training": {"micro_batch_size": b, "num_micro_batches": 1, "recompute": "none"},
           "device": dict(UNIT_DEVICE)}
    d_h = h // a
    per_token_layer = 2 * (h * (h + 2 * g * d_h) + h * h) + 4 * s * h + 2 * h * E + (k + shared) * 2 * 3 * h * f
    expected = 3 * s * b * (L * per_token_layer + 2 * h * v)
    est = numbers(cfg)
    assert est.stages[0].ideal_ps == expected
    assert est.stages[0].time_ps["compute"] == expected    # no recompute, no memory-bound time on this device


def test_mla_value_width_costs_its_up_projection_output_projection_and_core():
    # DeepSeek-V2 §2.1.2 eqs. (11), (18), (19): widening the value head d_v by Δ widens W^UV (d_c -> n_h·d_v)
    # and W^O (n_h·d_v -> h), 2 FLOPs per weight and token, and the scores·V product, 2·s·d_v per query
    # token and head (Narayanan §5.1's 2·s² per sequence and width; no causal saving); model FLOPs = 3 ×
    # forward (Korthikanti eq. 7). The query/key side and the norms do not change
    h, a, L, s, v, b, d_c = 1024, 8, 2, 1024, 32000, 2, 128

    def ideal(d_v):
        cfg = {"name": "mla", "formulas": ["mla.mf"],
               "model": {"hidden_size": h, "num_heads": a, "num_layers": L, "vocab_size": v, "seq_length": s,
                         "activation": "swiglu", "norm": "rmsnorm", "bias": False, "flash_attention": True,
                         "position_embedding": "rope", "attention": "mla", "kv_lora_rank": d_c,
                         "qk_rope_head_dim": 32, "qk_nope_head_dim": 64, "v_head_dim": d_v},
               "parallel": {"dp": 1, "tp": 1, "pp": 1},
               "training": {"micro_batch_size": b, "num_micro_batches": 1, "recompute": "none"},
               "device": dict(UNIT_DEVICE)}
        return numbers(cfg).stages[0].ideal_ps

    delta = 32
    per_token_layer = 2 * d_c * a * delta + 2 * a * delta * h + 2 * s * a * delta
    assert ideal(64 + delta) - ideal(64) == 3 * s * b * L * per_token_layer


# ------------------------------------------------------------------ tile and wave quantization
# NVIDIA, "Matrix Multiplication Background User's Guide" (DU-09799-001, 2023), §3: cuBLAS splits a GEMM's
# M×N output into tiles (256×128 for the large A100 tiles, one per SM at a time); a GEMM takes whole waves
# of S tiles, so its idle tile slots (the padding of partial tiles and the idle SMs of the last wave) cost
# 2·K FLOPs per output element as if computed. The guide's own A100 example: 108 SMs, 256×128 tiles.


def _idle_flops(M, N, K, S, tm=256, tn=128):
    """The guide's §3 by hand: whole waves of whole tiles, minus the M·N outputs, 2·K FLOPs each."""
    tiles = -(-M // tm) * -(-N // tn)
    waves = -(-tiles // S)
    return 2 * K * (waves * S * tm * tn - M * N)


def _gemm_idle(M, N, K, S):
    """Forward Y = X·W (M×N output) plus its backward's dX (M×K, depth N) and dW (K×N, depth M)."""
    return _idle_flops(M, N, K, S), _idle_flops(M, K, N, S) + _idle_flops(K, N, M, S)


def test_guides_a100_example_98_tiles_fill_one_wave_of_108():
    # §3.2's example: a 1792×1792 output in 256×128 tiles is 7·14 = 98 tiles, one wave on 108 SMs, 10 SMs idle
    assert _idle_flops(1792, 1792, 1, 108) == 2 * 10 * 256 * 128
    # two more columns of tiles: 7·16 = 112 tiles take a second wave, 216 slots for 112 tiles' outputs
    assert _idle_flops(1792, 2048, 1, 108) == 2 * (216 * 256 * 128 - 1792 * 2048)


@pytest.mark.parametrize("recompute,cp", [("none", 1), ("full", 1), ("none", 2)])
def test_gemm_tile_quantization_adds_the_idle_tile_slots_of_every_projection(recompute, cp):
    # GPT-3 style layer, tp 2: QKV h -> 3h/t, output h/t -> h, fc1 h -> 4h/t, fc2 4h/t -> h, head h -> v/t,
    # over the micro-batch's b·s/cp tokens (CP keeps s/cp of the sequence), forward + backward, the
    # layers' forward again when fully recomputed
    h, a, L, s, v, b, m, t, S = 1792, 14, 2, 1000, 50000, 2, 2, 2, 108
    # an eager core, which has no idle SM slots of its own (ring CP needs a flash one: CP by Ulysses here)
    base = gpt(h, a, L, s, v, b, m, flash=False, tp=t, cp=cp, cp_algo="ulysses")
    base["training"]["recompute"] = recompute
    quantized = json.loads(json.dumps(base))
    quantized["device"]["sm_count"] = S
    tok = s * b // cp
    layer = [_gemm_idle(tok, 3 * h // t, h, S), _gemm_idle(tok, h, h // t, S),
             _gemm_idle(tok, 4 * h // t, h, S), _gemm_idle(tok, h, 4 * h // t, S)]
    fwd, bwd = sum(x for x, _ in layer), sum(y for _, y in layer)
    head_fwd, head_bwd = _gemm_idle(tok, v // t, h, S)
    per_mb = L * (fwd + bwd + (fwd if recompute == "full" else 0)) + head_fwd + head_bwd
    extra = numbers(quantized).stages[0].time_ps["compute"] - numbers(base).stages[0].time_ps["compute"]
    assert per_mb > 0 and extra == m * per_mb   # unit device: picoseconds = FLOPs
    # MFU's model FLOPs do not change: the idle slots are time, not work
    assert numbers(quantized).stages[0].ideal_ps == numbers(base).stages[0].ideal_ps


def test_shapes_that_fill_whole_waves_pay_nothing():
    # one SM (every tile count is whole waves) and every dimension a multiple of the 256×128 tile
    base = gpt(h=2048, a=16, L=2, s=1024, v=51200, b=1, m=2)
    quantized = json.loads(json.dumps(base))
    quantized["device"]["sm_count"] = 1
    assert numbers(quantized).stages[0].time_ps == numbers(base).stages[0].time_ps


def _grouped_idle(E, M, N, K, S):
    """time.mf gpad over a grouped GEMM's forward, dX and dW: E experts of M rows, each padded to whole
    256-row tiles (DeepGEMM README, contiguous layout), the group's tiles over shared waves of S."""
    def one(E, M, N, K):
        tiles = E * math.ceil(M / 256) * math.ceil(N / 128)
        return 2 * K * (math.ceil(tiles / S) * S * 256 * 128 - E * M * N)
    return one(E, M, N, K) + one(E, M, K, N) + one(E, K, N, M)


def test_moe_layers_pad_their_attention_and_grouped_experts_not_the_dense_mlp_they_replace():
    # an MoE layer's FFN is the router (skinny: no pad) and the grouped experts (issue 33: their rows padded
    # per expert, time.mf gpad); the dense MLP's fc1/fc2 (ffn_hidden_size 1000, not a tile multiple) are
    # not in the layer at all. Attention and head shapes here are whole tiles on one SM: the experts' alone
    h, a, L, s, v, b = 1024, 8, 2, 1024, 32768, 1
    cfg = {"name": "moe", "formulas": ["moe.mf"],
           "model": {"hidden_size": h, "num_heads": a, "num_layers": L, "vocab_size": v, "seq_length": s,
                     "activation": "swiglu", "norm": "rmsnorm", "bias": False, "ffn_hidden_size": 1000,
                     "num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 1000},
           "parallel": {"dp": 1, "tp": 1, "pp": 1},
           "training": {"micro_batch_size": b, "num_micro_batches": 1, "recompute": "none"},
           "device": {**UNIT_DEVICE, "sm_count": 1}}
    plain = json.loads(json.dumps(cfg))
    del plain["device"]["sm_count"]
    tiled, flat = numbers(cfg).stages[0].time_ps, numbers(plain).stages[0].time_ps
    Me = 2 * s * b // 4   # top-2 of 4 experts, balanced
    experts = _grouped_idle(4, Me, 2 * 1000, h, 1) + _grouped_idle(4, Me, h, 1000, 1)
    assert tiled["compute"] - flat["compute"] == L * experts
    assert {k: v for k, v in tiled.items() if k != "compute"} == {k: v for k, v in flat.items() if k != "compute"}


def test_nvidia_presets_name_their_sm_counts():
    # A100: 108 SMs (NVIDIA A100 architecture whitepaper; the guide's §3.2 example); H100 SXM5: 132 (H100
    # whitepaper); B200: 2 × 74 (Chips and Cheese 2025)
    import yaml
    for name, sms in (("a100-80g", 108), ("a100-40g", 108), ("h100-sxm", 132), ("h100-pcie", 114), ("h200", 132),
                      ("b200", 148)):
        preset = yaml.safe_load((ROOT / "configs" / "devices" / f"{name}.yaml").read_text())
        assert preset["sm_count"] == sms, name


def test_mla_pads_each_of_its_projections():
    # DeepSeek-V2 eqs. (9)-(19): query latent h -> d_c' and up-projection d_c' -> n_h(d_h + d_h^R), key/value
    # latent + rope key h -> d_c + d_h^R and up-projection d_c -> n_h(d_h + d_v), output n_h·d_v -> h; the head
    # h -> v; over one micro-batch's s·b tokens on 108 SMs (the guide's §3 by hand, _gemm_idle)
    h, a, L, s, v, b, S = 1024, 8, 2, 1000, 32000, 1, 108
    q_c, d_c, d_r, d_n, d_v = 192, 160, 32, 64, 64

    def compute(sms):
        cfg = {"name": "mla", "formulas": ["mla.mf"],
               "model": {"hidden_size": h, "num_heads": a, "num_layers": L, "vocab_size": v, "seq_length": s,
                         "activation": "swiglu", "norm": "rmsnorm", "bias": False, "flash_attention": True,
                         "position_embedding": "rope", "attention": "mla", "kv_lora_rank": d_c,
                         "q_lora_rank": q_c, "qk_rope_head_dim": d_r, "qk_nope_head_dim": d_n, "v_head_dim": d_v,
                         "ffn_hidden_size": 2048},
               "parallel": {"dp": 1, "tp": 1, "pp": 1},
               "training": {"micro_batch_size": b, "num_micro_batches": 1, "recompute": "none"},
               "device": {**UNIT_DEVICE, **({"sm_count": sms} if sms else {})}}
        return numbers(cfg).stages[0].time_ps["compute"]

    tok = s * b
    gemms = [(tok, q_c, h), (tok, a * (d_n + d_r), q_c), (tok, d_c + d_r, h), (tok, a * (d_n + d_v), d_c),
             (tok, h, a * d_v), (tok, 2 * 2048, h), (tok, h, 2048)]
    per_layer = sum(sum(_gemm_idle(*g, S)) for g in gemms)
    # + the flash kernels' idle SMs (FlashAttention-2 §3.2: a thread block per head and 128 query rows):
    # 8 heads x ceil(1000/128) = 64 blocks fill 64 of 108 SMs, for QK^T and scores·V forward (2·s²·a·
    # (d_n + d_r + d_v)) and the 5/2 of it backward
    core = 2 * b * s * s * a * (d_n + d_r + d_v)
    idle = Fraction(S, a * 8) - 1
    # a causal flash kernel computes the 8·9/2 of 8² blocks on or below the diagonal (FlashAttention-2
    # §3.1.1): the cores' time, and so their idle slots', is that share
    per_layer += Fraction(9, 16) * idle * (core + Fraction(5, 2) * core)
    assert compute(S) - compute(0) == L * per_layer + sum(_gemm_idle(tok, v, h, S))


@pytest.mark.parametrize("mtp", [0, 1])
def test_shared_experts_and_mtp_pad_their_gemms(mtp):
    # shared experts (DeepSeek-V3 §2.1.2: n_shared × f wide, TP-split like the dense MLP): fc1 h -> 2·f_sh
    # (SwiGLU gate and up) and fc2 f_sh -> h; an MTP module (§2.2): its projection 2h -> h and the shared
    # head's logits GEMM once more; the attention and head as the dense model's; 108 SMs, by hand
    h, a, L, s, v, b, S, f, n_sh = 1024, 8, 2, 1000, 32000, 1, 108, 1000, 2

    def compute(sms):
        cfg = {"name": "moe", "formulas": ["moe.mf"],
               "model": {"hidden_size": h, "num_heads": a, "num_layers": L, "vocab_size": v, "seq_length": s,
                         "activation": "swiglu", "norm": "rmsnorm", "bias": False, "num_experts": 4,
                         "moe_top_k": 2, "moe_ffn_hidden_size": f, "num_shared_experts": n_sh, "mtp_layers": mtp},
               "parallel": {"dp": 1, "tp": 1, "pp": 1},
               "training": {"micro_batch_size": b, "num_micro_batches": 1, "recompute": "none"},
               "device": {**UNIT_DEVICE, **({"sm_count": sms} if sms else {})}}
        return numbers(cfg).stages[0].time_ps["compute"]

    tok = s * b
    attention = sum(_gemm_idle(tok, 3 * h, h, S)) + sum(_gemm_idle(tok, h, h, S))
    shared = sum(_gemm_idle(tok, 2 * n_sh * f, h, S)) + sum(_gemm_idle(tok, h, n_sh * f, S))
    head = sum(_gemm_idle(tok, v, h, S))
    # the routed experts' grouped GEMMs (issue 33, time.mf gpad): top-2 of 4, 500 rows each
    experts = _grouped_idle(4, Fraction(2 * tok, 4), 2 * f, h, S) + _grouped_idle(4, Fraction(2 * tok, 4), h, f, S)
    module = sum(_gemm_idle(tok, h, 2 * h, S)) + head + attention + shared + experts   # the MTP block is an MoE layer too
    assert compute(S) - compute(0) == L * (attention + shared + experts) + head + mtp * module


def test_data_parallel_overlap_windows_include_the_idle_tile_slots():
    # The windows that hide the gradient reduction (the last backward, parallel.overlap_grad_reduce) and
    # ZeRO-3's per-micro-batch gathers (the micro-batch's compute, Zhao et al. 2023 §3.3.2) are compute
    # time: a GEMM's idle tile slots take that time as its computed FLOPs do (the guide's §3).
    h, a, L, s, v, b, m, d, S = 1792, 14, 2, 1000, 50000, 2, 4, 4, 108
    cfg = gpt(h, a, L, s, v, b, m, dp=d, overlap_grad_reduce=True)
    cfg["training"]["recompute"] = "none"
    cfg["device"]["intra_node_bandwidth"] = 10 ** 8   # the all-reduce outlasts one backward
    plain = numbers(cfg)
    cfg["device"]["sm_count"] = S
    est = numbers(cfg)
    tok = s * b
    layer = [_gemm_idle(tok, 3 * h, h, S), _gemm_idle(tok, h, h, S), _gemm_idle(tok, 4 * h, h, S),
             _gemm_idle(tok, h, 4 * h, S)]
    bwd_pad = L * sum(y for _, y in layer) + _gemm_idle(tok, v, h, S)[1]
    backward_ps = Fraction(2, 3) * plain.stages[0].time_ps["compute"] / m + bwd_pad   # unit device: ps = FLOPs
    assert bwd_pad > 0
    assert 0 < est.stages[0].time_ps["dp"] == pytest.approx(_dp_allreduce_ps(est, d, 10 ** 8) - backward_ps, abs=16)
    # ZeRO-3 (DeepSpeed, bf16): 3 rings of Φ per micro-batch less that micro-batch's compute, pads included
    cfg["parallel"]["zero"] = 3
    cfg["training"]["framework"] = "deepspeed"
    est = numbers(cfg)
    st = est.stages[0]
    ring = Fraction(d - 1, d) * st.param_count * 2 * 10 ** 4
    assert st.time_ps["compute"] > numbers({**cfg, "device": {**cfg["device"], "sm_count": 0}}).stages[0].time_ps["compute"]
    assert 0 < st.time_ps["dp"] == pytest.approx(m * 3 * ring - st.time_ps["compute"], abs=64)


def test_zigzag_chunks_leave_flash_attention_blocks_idle():
    # FlashAttention-2 §3.2: one thread block per head and 128 query rows, one block per SM at a time.
    # Ring CP over the 2·cp zig-zag chunks (Megatron-LM get_batch_on_this_cp_rank; Transformer Engine's
    # diagonal step over both local chunks, the cp - 1 others over one chunk's s/(2cp) rows): 8 heads,
    # s/cp = 1024 rows fill 64 SMs exactly (8 x 8 blocks), one chunk only half (8 x 4): 3 of the 4 steps
    # take twice their work. With 64-row blocks every step fills the SMs. Either way a causal kernel computes
    # the nb(nb + 1)/2 of nb² blocks on or below the diagonal (FlashAttention-2 §3.1.1), nb = s / rows.
    h, a, L, s, b, m, cp = 2048, 8, 4, 4096, 1, 2, 4

    def compute(tile):
        cfg = gpt(h=h, a=a, L=L, s=s, b=b, m=m, cp=cp)
        cfg["model"]["flash_attention"] = True
        cfg["device"].update(sm_count=64, attention_tile=tile)
        return numbers(cfg).stages[0].time_ps["compute"]

    core = 4 * b * (s // cp) * s * h   # QKᵀ and scores·V of the local rows against all s keys
    idle = Fraction(3, 4)               # (cp - 1)/cp of the steps at half the SMs: 1 idle slot per busy one
    # full recompute: the forward twice, FlashAttention-2's backward 5/2 of a forward (§3.1.2)
    run = {128: Fraction(1 + Fraction(1, s // 128), 2), 64: Fraction(1 + Fraction(1, s // 64), 2)}
    assert compute(128) - compute(64) == m * L * (run[128] * (1 + idle) - run[64]) * (2 * core + Fraction(5, 2) * core)


def test_fp8_gemms_leave_the_attention_cores_and_the_output_head_at_the_bf16_peak():
    # Transformer Engine's fp8 recipes quantize its Linear GEMMs; DotProductAttention stays BF16 and
    # Megatron-LM's output layer is a plain ColumnParallelLinear (DeepSeek-V3 §3.3 keeps "attention
    # operators" and "the output head" in BF16 too). FP8 peak 2 x BF16 here: the rest takes half the time.
    h, a, L, s, v, b, m = 2048, 16, 4, 1024, 51200, 2, 4
    cfg = gpt(h, a, L, s, v, b, m)
    bf16 = numbers(cfg).stages[0].time_ps["compute"]
    cfg["device"]["peak_flops_fp8"] = 2 * 10 ** 12
    cfg["megatron"] = {"fp8": "hybrid"}
    fp8 = numbers(cfg).stages[0].time_ps["compute"]
    core = 4 * b * s * s * h   # QKᵀ and scores·V; eager backward twice it, full recompute the forward again
    head = 3 * 2 * s * b * h * v
    kept = m * (L * 4 * core + head)
    assert fp8 == (bf16 - kept) / 2 + kept


def test_a_causal_flash_core_takes_the_time_of_its_blocks_on_and_below_the_diagonal():
    # FlashAttention-2 §3.1.1: blocks above the diagonal are skipped. s = 1024 in 128-row blocks: 8 x 9 / 2
    # of the 64 blocks run, so the core's time is 9/16 of its counted FLOPs; MFU counts them all
    h, a, L, s, b, m = 2048, 16, 4, 1024, 2, 4
    cfg = gpt(h, a, L, s, b=b, m=m)
    cfg["model"]["flash_attention"] = True
    flash = numbers(cfg)
    core = 4 * b * s * s * h
    counted = m * L * (2 * core + Fraction(5, 2) * core)   # full recompute: the forward twice, backward 5/2
    cfg["device"]["attention_tile"] = s                     # one block: nothing skipped
    whole = numbers(cfg)
    assert whole.stages[0].time_ps["compute"] - flash.stages[0].time_ps["compute"] == counted * Fraction(7, 16)
    assert whole.mfu * whole.step_seconds == pytest.approx(flash.mfu * flash.step_seconds, rel=1e-12)   # same model FLOPs
