"""Megatron's --tp-comm-overlap in the step time (time.mf tp_hidden, frameworks/megatron/megatron-core.mf).

Transformer Engine's userbuffers run a sequence-parallel all-gather / reduce-scatter as a ring exchange
of t steps beside the t pieces of its GEMM (Megatron-Bridge training/comm_overlap.py; Wang et al. 2023
§3): t - 1 of the t transfers hide, one stays exposed, and a hidden share longer than the layer's
compute shows its excess. Expected numbers: that rule by hand on the estimate's own parts.
"""

from __future__ import annotations

import importlib.util

import pytest

import memform
from memform.errors import MemformError

from cli_helpers import ROOT

_spec = importlib.util.spec_from_file_location("memform_bench_throughput_tpo", ROOT / "bench" / "throughput.py")
throughput = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(throughput)
RUNS = {r["id"]: r for r in throughput.runs()}
ROW_70B = "megatron-bridge-25.11-h100-llama3-70b"   # TP 4, SP, the recipe overlaps
ROW_405B = "megatron-bridge-25.11-h100-llama3.1-405b"   # TP 8


def _tp(cfg, overrides=None):
    return memform.estimate(cfg, overrides or {}).time_dict()["parts"]["tp"]


@pytest.mark.parametrize("row, t", [(ROW_70B, 4), (ROW_405B, 8)])
def test_one_ring_step_of_t_stays_exposed(row, t):
    cfg = throughput.config_of(RUNS[row])
    assert cfg["megatron"]["tp_comm_overlap"] is True
    exposed = _tp(cfg, {"megatron.tp_comm_overlap": False})
    assert exposed > 0
    assert _tp(cfg) == pytest.approx(exposed / t, rel=1e-9)


def test_a_transfer_longer_than_the_compute_shows_its_excess():
    # NVLink slowed 10^4 times: the hidden share (t - 1)/t of the TP time outlasts each layer's compute,
    # whose excess adds to the exposed 1/t
    cfg = throughput.config_of(RUNS[ROW_70B])
    slow = {"device.intra_node_bandwidth": 4.5e7}
    exposed = _tp(cfg, {**slow, "megatron.tp_comm_overlap": False})
    overlapped = _tp(cfg, slow)
    assert exposed / 4 < overlapped < exposed
    compute = memform.estimate(cfg, slow).time_dict()["parts"]["compute"]
    assert overlapped == pytest.approx(exposed - compute, rel=0.02)   # all layers alike: (t - 1)/t·X - C + X/t


def test_without_tensor_parallelism_nothing_changes():
    cfg = throughput.config_of(RUNS["megatron-bridge-25.11-b200-llama3-8b"])
    assert _tp(cfg, {"megatron.tp_comm_overlap": True, "parallel.sequence_parallel": True}) == 0 == _tp(cfg)


def test_the_overlap_needs_sequence_parallelism():
    cfg = throughput.config_of(RUNS[ROW_70B])
    with pytest.raises(MemformError, match="sequence_parallel"):
        memform.estimate(cfg, {"parallel.sequence_parallel": False})
