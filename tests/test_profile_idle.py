"""bench/profile_idle.py: the idle share of a GPU stream in a PyTorch-profiler trace (schedules.mf dualpipev
``idle``, measured on DeepSeek's train.json). Expected numbers: a hand-made trace's intervals."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from cli_helpers import ROOT

_spec = importlib.util.spec_from_file_location("memform_bench_profile_idle", ROOT / "bench" / "profile_idle.py")
profile_idle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(profile_idle)


def _kernel(ts, dur, tid=7, cat="kernel"):
    return {"ph": "X", "cat": cat, "pid": 0, "tid": tid, "ts": ts, "dur": dur, "name": "k"}


TRACE = {"traceEvents": [
    _kernel(0, 10), _kernel(5, 3),          # overlapping kernels of one stream: busy 0-10
    _kernel(12, 8),                         # a 2 us launch gap: busy 12-20
    _kernel(50, 10, cat="gpu_memset"),      # a 30 us wait: busy 50-60
    {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 0, "dur": 100},   # host events do not count
    _kernel(0, 40, tid=27),                 # another stream
]}


def test_busy_is_the_union_of_a_streams_kernels_and_gaps_split_at_10_us():
    rows = {r["tid"]: r for r in profile_idle.streams(TRACE)}
    r = rows[7]
    assert r["kernels"] == 4
    assert (r["span_ms"], r["busy_ms"], r["idle_ms"]) == pytest.approx((0.060, 0.028, 0.032))
    assert r["idle_share"] == pytest.approx(32 / 60)
    assert (r["launch_gaps"], r["waits"]) == (1, 1)
    assert (r["launch_gap_ms"], r["wait_ms"]) == pytest.approx((0.002, 0.030))
    assert rows[27]["idle_share"] == 0
    assert [x["tid"] for x in profile_idle.streams(TRACE)][0] == 7   # the busiest (most kernels) first


def test_the_script_prints_each_stream_and_refuses_a_file_that_is_no_trace(tmp_path):
    good = tmp_path / "trace.json"
    good.write_text(json.dumps(TRACE))
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "profile_idle.py"), str(good)], capture_output=True, text=True)
    assert out.returncode == 0 and "53.3%" in out.stdout, out.stdout + out.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "profile_idle.py"), str(bad)], capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "bad.json" in out.stderr, out.stderr
