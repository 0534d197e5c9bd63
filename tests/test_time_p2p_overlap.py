"""Megatron's overlapped pipeline sends and parameter all-gather in the step time (issue 33).

- --overlap-p2p-communication (megatron.overlap_p2p_comm, on by default in Megatron-LM and Megatron-Bridge
  with interleaving): in the interleaved schedule's steady state the sends and receives run beside the other
  direction's chunk pass; the warm-up forwards' and cool-down backwards' stay blocking (Megatron-Core
  schedules.py; schedules.mf p2p_async, time.mf cost pp). Stage i waits for 2(p - i - 1) + (vp - 1)·p of its
  m·vp passes per direction (get_pp_rank_microbatches), so where every transfer is shorter than a chunk pass
  its pipeline time is that share of the blocking one's.
- --overlap-param-gather (megatron.overlap_param_gather): the distributed optimizer's all-gather, bytes_p of
  the bytes_g + bytes_p per parameter it moves with the reduce-scatter, runs under the next forward.
Expected numbers: those rules by hand on the estimates' own parts.
"""

from __future__ import annotations

import importlib.util

import pytest

from cli_helpers import ROOT
from estimate_helpers import numbers

_spec = importlib.util.spec_from_file_location("memform_bench_throughput_p2p", ROOT / "bench" / "throughput.py")
throughput = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(throughput)
RUNS = {r["id"]: r for r in throughput.runs()}
ROW_70B = "megatron-bridge-25.11-h100-llama3-70b"   # PP 8, VP 5, GBS 128 over DP 2: m = 64


def _parts(est, name):
    return [st.time_ps[name] for st in est.stages]


def test_only_the_warm_up_and_cool_down_transfers_wait():
    cfg = throughput.config_of(RUNS[ROW_70B])
    p, vp, m = 8, 5, 64
    overlapped = _parts(numbers(cfg), "pp")
    blocking = _parts(numbers(cfg, {"megatron.overlap_p2p_comm": False}), "pp")
    for i, (a, b) in enumerate(zip(overlapped, blocking)):
        assert b > 0
        assert a == pytest.approx(b * (2 * (p - i - 1) + (vp - 1) * p) / (m * vp), rel=1e-6), i


def test_a_transfer_longer_than_its_chunk_pass_shows_the_excess():
    # the pipeline's inter-node links 10^4 times slower: every steady-state transfer outlasts the chunk pass
    # beside it, so the overlapped schedule saves one pass's compute per transfer, no more
    cfg = throughput.config_of(RUNS[ROW_70B])
    slow = {"device.inter_node_bandwidth": 5e6}
    est = numbers(cfg, slow)
    overlapped = _parts(est, "pp")
    blocking = _parts(numbers(cfg, {**slow, "megatron.overlap_p2p_comm": False}), "pp")
    p, vp, m = 8, 5, 64
    for i, (a, b) in enumerate(zip(overlapped, blocking)):
        asynchronous = m * vp - (2 * (p - i - 1) + (vp - 1) * p)
        window = est.stages[i].time_ps["compute"] / (2 * m * vp)
        assert a == pytest.approx(b - 2 * asynchronous * window, rel=1e-6), i


def test_without_interleaving_every_transfer_waits():
    cfg = throughput.config_of(RUNS[ROW_70B])
    one = {"parallel.vpp": 1}
    assert _parts(numbers(cfg, one), "pp") == _parts(numbers(cfg, {**one, "megatron.overlap_p2p_comm": False}), "pp")


def test_the_2022_megatron_runs_keep_blocking_sends():
    cfg = throughput.config_of(RUNS["korthikanti2022-table5-175b-selective"])
    assert cfg["megatron"]["overlap_p2p_comm"] is False
    assert _parts(numbers(cfg), "pp") == _parts(numbers(cfg, {"megatron.overlap_p2p_comm": False}), "pp")
    assert sum(_parts(numbers(cfg, {"megatron.overlap_p2p_comm": True}), "pp")) < sum(_parts(numbers(cfg), "pp"))


def test_the_parameter_all_gather_hides_under_the_forward():
    # the 405B recipe (DP 8 x CP 2, distributed optimizer) without the gradient overlap, so that the
    # reduce-scatter is all exposed: with the all-gather under the forward only the reduce-scatter's
    # bytes_g / (bytes_g + bytes_p) = 4 / 6 of the blocking DP time stays, plus whatever of the all-gather
    # outlasts one micro-batch's forward
    cfg = throughput.config_of(RUNS["megatron-bridge-25.11-h100-llama3.1-405b"])
    assert cfg["megatron"]["overlap_param_gather"] is True
    base = {"parallel.overlap_grad_reduce": False}
    est = numbers(cfg, base)
    hidden = _parts(est, "dp")
    exposed = _parts(numbers(cfg, {**base, "megatron.overlap_param_gather": False}), "dp")
    for i, (a, b) in enumerate(zip(hidden, exposed)):
        assert b * 2 / 3 * (1 - 1e-6) <= a < b, i
    # with the links 10^3 times faster the all-gather fits under the forward: exactly 2/3 stays
    fast = {**base, "device.inter_node_bandwidth": 5e13, "device.intra_node_bandwidth": 4.5e14}
    hidden = _parts(numbers(cfg, fast), "dp")
    exposed = _parts(numbers(cfg, {**fast, "megatron.overlap_param_gather": False}), "dp")
    assert all(a == pytest.approx(b * 2 / 3, rel=1e-6) for a, b in zip(hidden, exposed))
