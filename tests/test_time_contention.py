"""The slowdown of compute beside overlapped communication in the step time (issue 33).

Lee et al. 2025 ("Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep
Learning", arXiv 2507.03114): compute that runs beside a collective is 18.9 % slower on average than alone.
time.mf's `cost contention` charges device.overlap_slowdown (0.189) × the seconds each overlapped transfer
runs beside compute: its whole time where it hides, the window where it outlasts it. Expected numbers:
that rule by hand on the estimates' own parts (the hidden seconds are the blocking time minus what shows).
"""

from __future__ import annotations

import importlib.util

import pytest

from cli_helpers import ROOT
from estimate_helpers import numbers
from memform.errors import MemformError

_spec = importlib.util.spec_from_file_location("memform_bench_throughput_contention", ROOT / "bench" / "throughput.py")
throughput = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(throughput)
RUNS = {r["id"]: r for r in throughput.runs()}
ROW_8B = "megatron-bridge-25.11-b200-llama3-8b"   # DP 8, no TP/PP/CP: the only overlaps are the DP ones
SIGMA = 0.189   # Lee et al. 2025's mean slowdown


def _part(est, name):
    return est.stages[0].time_ps[name]


def test_the_gradient_reduction_and_parameter_gather_slow_the_compute_they_hide_under():
    cfg = throughput.config_of(RUNS[ROW_8B])
    assert cfg["parallel"]["overlap_grad_reduce"] is True and cfg["megatron"]["overlap_param_gather"] is True
    est = numbers(cfg)
    blocking = numbers(cfg, {"parallel.overlap_grad_reduce": False, "megatron.overlap_param_gather": False})
    assert _part(blocking, "contention") == 0   # nothing runs beside compute
    hidden = _part(blocking, "dp") - _part(est, "dp")
    assert hidden > 0
    assert _part(est, "contention") == pytest.approx(SIGMA * hidden, rel=1e-6)
    # the compute and the exposed transfers are those of an overlap priced free
    free = numbers(cfg, {"device.overlap_slowdown": 0})
    assert _part(free, "contention") == 0
    for name in ("compute", "dp", "memory"):
        assert _part(free, name) == _part(est, name), name
    assert est.stages[0].step_ps == free.stages[0].step_ps + _part(est, "contention")


def test_the_slowdown_scales_with_the_device_figure():
    cfg = throughput.config_of(RUNS[ROW_8B])
    base = _part(numbers(cfg), "contention")
    assert _part(numbers(cfg, {"device.overlap_slowdown": 0.4}), "contention") == pytest.approx(base * 0.4 / SIGMA, rel=1e-6)


def test_a_transfer_longer_than_its_window_slows_only_the_window():
    # the inter-node links 10^4 times slower (DP 8 fits in one node: use 2 devices per node): the
    # reduce-scatter outlasts the last backward, so the compute beside it is that backward, not the transfer
    cfg = throughput.config_of(RUNS[ROW_8B])
    slow = {"device.inter_node_bandwidth": 5e6, "device.devices_per_node": 2, "megatron.overlap_param_gather": False}
    est = numbers(cfg, slow)
    blocking = numbers(cfg, {**slow, "parallel.overlap_grad_reduce": False})
    window = _part(blocking, "dp") - _part(est, "dp")   # what the backward hid: its own length
    assert 0 < window < _part(est, "dp")
    assert _part(est, "contention") == pytest.approx(SIGMA * window, rel=1e-6)


def test_tensor_parallel_overlap_lengthens_the_bubble():
    # the 405B H100 recipe: TP 8 with --tp-comm-overlap, ring CP 2, PP 8 × VP 8. Its per-micro-batch
    # overlaps stretch every micro-batch, so the bubble's idle slots (as long as one) grow; the DP ones do not
    cfg = throughput.config_of(RUNS["megatron-bridge-25.11-h100-llama3.1-405b"])
    est = numbers(cfg)
    free = numbers(cfg, {"device.overlap_slowdown": 0})
    for a, b in zip(est.stages, free.stages):
        assert a.time_ps["contention"] > 0 and a.time_ps["bubble"] > b.time_ps["bubble"]
        assert a.time_ps["compute"] == b.time_ps["compute"]


def test_a_slowdown_outside_zero_to_one_is_refused():
    cfg = throughput.config_of(RUNS[ROW_8B])
    with pytest.raises(MemformError, match="device.overlap_slowdown"):
        numbers(cfg, {"device.overlap_slowdown": 1.5})


# ---- the routed experts' grouped GEMMs at memory speed (moe.mf experts.io_pass, SonicMoE's roofline) ----

QWEN3_H100 = "megatron-bridge-25.11-h100-qwen3-30b-a3b"   # 128 experts of 768, top-8, h 2048; PP 2 × VP 24


def _io_seconds(cfg, extra):
    # memory = mem_bytes / (hbm · memory_efficiency) + io: two efficiencies separate the two terms
    one = numbers(cfg, {**extra, "device.memory_efficiency": 1})
    half = numbers(cfg, {**extra, "device.memory_efficiency": 0.5})
    return (2 * _part(one, "memory") - _part(half, "memory")) / 1e12, one


def test_sparse_narrow_experts_wait_on_memory_as_the_roofline_says():
    # BF16, no tile quantization (no pad FLOPs), EP 1, micro-batch 1: 4096 · 8 / 128 = 256 tokens per expert
    cfg = throughput.config_of(RUNS[QWEN3_H100])
    extra = {"megatron.fp8": "none", "device.sm_count": 0, "parallel.ep": 1, "training.micro_batch_size": 1}
    io, est = _io_seconds(cfg, extra)
    h, f, n_exp, k, s = 2048, 768, 128, 8, 4096
    peak, eff, hbm = 989.0e12, 0.803, 3.35e12   # configs/devices/h100-sxm.yaml
    tokens = k * s                      # routed tokens on the rank per micro-batch
    t_e = tokens / n_exp                # each local expert's
    fwd_bytes = n_exp * (t_e * (h * 2 + 2 * f * 2 + f * 2 + h * 2) + 3 * h * f * 2)
    fwd_seconds = 2 * tokens * 3 * f * h / (peak * eff)
    per_pass = fwd_bytes / hbm - fwd_seconds
    assert per_pass > 0                 # below the ridge point
    m, layers = 512 // (8 * 1), 24      # micro-batches; stage 0's MoE layers
    assert io == pytest.approx(m * layers * 3 * per_pass, rel=1e-6)
    assert est.stages[0].time_ps["memory"] > 0


def test_the_published_layouts_experts_are_compute_bound():
    # 4096 tokens per expert per micro-batch (MBS 2 × EP 8): nothing waits on memory
    cfg = throughput.config_of(RUNS[QWEN3_H100])
    io, _ = _io_seconds(cfg, {})
    assert io == pytest.approx(0, abs=1e-9)


# ---- Megatron's interleaved schedule syncs each chunk's gradients after that chunk's last backward ----

def test_each_chunks_gradient_reduction_starts_after_its_own_last_backward():
    # the B200 405B recipe (PP 8, VP 8, TP 4 × CP 2, DP 2): without --overlap-param-gather every DP byte moves
    # after the backward; the stage's one-micro-batch backward w is what one chunk per stage (VP 1) hides
    cfg = throughput.config_of(RUNS["megatron-bridge-25.11-b200-llama3.1-405b"])
    base = {"megatron.overlap_param_gather": False}
    blocking = _part(numbers(cfg, {**base, "parallel.overlap_grad_reduce": False}), "dp") / 1e12
    one = _part(numbers(cfg, {**base, "parallel.vpp": 1}), "dp") / 1e12
    assert 0 < one < blocking
    w = blocking - one                  # VP 1: max(0, x - w)
    k, group = 8, 8                     # chunks; micro-batches per chunk group (Megatron's default: PP)
    want = max(0, (blocking - w) / k, blocking - ((k - 1) * group + 1) * w / k)
    assert _part(numbers(cfg, base), "dp") / 1e12 == pytest.approx(want, rel=1e-6)
    assert want < 0.7 * one             # the cool-down's other chunks hide a share of it
