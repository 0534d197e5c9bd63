"""`memform search` with the step-time model: ranked by step time, tp inside a node, equivalent rows
merged, dominated plans dropped, the Pareto view, JSON fields and the HTML chart (issue 14)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings, strategies as st

import memform
from memform.analysis.search import (FAR_FROM_BEST, TIE_TOLERANCE, complexity, default_space, layout,
                                     merge_equivalent, pareto_front, search)
from memform.errors import MemformError
from memform.engine.model import load_model

from cli_helpers import ROOT, run_memform
from cli_inprocess import memform_in_process

CFG = ROOT / "configs" / "llama3-8b.yaml"
SMALL = ("--zero", "1", "--mbs", "1,2")


@pytest.fixture(scope="module")
def result():
    model = load_model(CFG)
    return search(model, default_space(model, 16, zero=[1], micro_batch=[1, 2]))


def _dominated(r, rows):
    return any(o["step_seconds"] <= r["step_seconds"] and o["peak_bytes"] <= r["peak_bytes"]
               and (o["step_seconds"] < r["step_seconds"] or o["peak_bytes"] < r["peak_bytes"]) for o in rows)


def _key(r):
    return tuple(r[f] for f in ("dp", "tp", "pp", "vpp", "cp", "zero", "recompute", "micro_batch_size"))


def _band(plans):
    fastest = min(r["step_seconds"] for r in plans)
    return [r for r in plans if r["step_seconds"] <= fastest * (1 + TIE_TOLERANCE)]


def test_plans_are_ranked_by_step_time_and_none_is_dominated(result):
    assert result.timed
    plans = result.plans()
    # the plans the time model cannot tell apart come first; those of them a no less simple plan beats in
    # both after the others, each saying so (issue 33, stop 48)
    band = _band(plans)
    assert plans[:len(band)] == band
    tail = [r for r in band if r.get("why", "").startswith("within")]
    assert band[len(band) - len(tail):] == tail
    head = band[:len(band) - len(tail)] + plans[len(band):]
    band = band[:len(band) - len(tail)]
    steps = [r["step_seconds"] for r in head[len(band):]]
    assert steps == sorted(steps) and len(plans) >= 3
    everything = result.plans(keep_all=True)
    assert len(everything) > len(plans)
    # outside the band no plan is beaten in both; inside it none by a plan no less simple listed before it
    assert not any(_dominated(r, everything) for r in head[len(band):])
    cx = {id(r): complexity(r, result.seq_length)[0] for r in band}
    assert not any(_dominated(r, [o for o in band if cx[id(o)] <= cx[id(r)]]) for r in band)
    # no layout within the tolerance is left out: dominance drops plans only outside it
    fastest = min(r["step_seconds"] for r in plans)
    assert all(r["step_seconds"] <= fastest * (1 + TIE_TOLERANCE) for r in tail)
    assert {layout(r) for r in _band(everything)} <= {layout(r) for r in plans}
    # every plan left out is beaten in both by one kept, or takes over FAR_FROM_BEST x the fastest step
    shown = {_key(r) for r in plans}
    left_out = [r for r in everything if _key(r) not in shown]
    assert left_out
    assert all(_dominated(r, everything) or r["step_seconds"] > FAR_FROM_BEST * fastest
               for r in left_out if r["step_seconds"] > fastest * (1 + TIE_TOLERANCE))
    assert all(r["step_seconds"] <= FAR_FROM_BEST * fastest for r in plans)


def test_a_layout_a_hair_slower_within_the_tolerance_is_listed_not_dropped():
    # issue 33 (stop 48): a plan within the time model's tolerance that another, no less simple, beats in
    # both step time and memory was dropped as dominated before the simplicity rule ranked the band (the
    # B200 405B and NeMo 1M published layouts, 0.5-2.7 % slower). Llama 3 8B on 32 GPUs, TP 2, ZeRO-3:
    # TP 2 x CP 2 x DP 8 is 1.6 % slower than TP 2 x DP 16 and no smaller, so it is listed, saying why
    model = load_model(CFG)
    result = search(model, default_space(model, 32, zero=[3], recompute=["none"], tp=[2], pp=[1],
                                         micro_batch=[2, 4, 8]))
    plans = result.plans()
    top = plans[0]
    assert (top["dp"], top["tp"], top["cp"]) == (16, 2, 1) and top["why"].startswith("the fastest step")
    cp2 = [r for r in plans if (r["dp"], r["tp"], r["cp"]) == (8, 2, 2) and r.get("why", "").startswith("within")]
    assert len(cp2) == 1 and cp2[0] in plans[1:3]  # after the band's others, before the plans clearly slower
    assert cp2[0]["step_seconds"] <= top["step_seconds"] * (1 + TIE_TOLERANCE)
    assert cp2[0]["peak_bytes"] >= top["peak_bytes"] and cp2[0]["step_seconds"] > top["step_seconds"]
    assert "tp2 dp16" in cp2[0]["why"] and "1.6 % faster" in cp2[0]["why"] and "simpler" in cp2[0]["why"]


def _plan(dp, tp=1, pp=1, cp=1, zero=1, step=1.0, gib=10):
    return {"dp": dp, "tp": tp, "pp": pp, "vpp": 1, "cp": cp, "ep": 1, "zero": zero, "recompute": "none",
            "schedule": "1f1b", "micro_batch_size": 1, "num_micro_batches": 1, "devices_used": 8,
            "devices_wasted": 0, "peak_bytes": gib * 2 ** 30, "peak_gib": gib, "peak_stage": 0,
            "headroom_bytes": 0, "step_seconds": step, "mfu": 0.5, "tokens_per_second": 1.0,
            "stage_layers": "", "equivalent": ""}


def test_the_simpler_plan_within_the_tolerance_survives_and_wins():
    # plans as search() returns them (columns), ranked by plans(): the simplest plan within 5 % of the
    # fastest comes first although a TP 2 plan beats it in both; of two PP 2 plans the one beaten in both by
    # the other, 0.5 % slower, is listed after the band's others with the reason; outside the band dominance
    # drops as before
    import numpy as np
    from memform.analysis.search import FIELDS, SearchResult, SearchStats
    rows = [_plan(8, step=1.03, gib=60),                       # plain DP: 3 % slower than the fastest, the biggest
            _plan(4, tp=2, step=1.00, gib=40),                 # the fastest
            _plan(4, pp=2, step=1.01, gib=30),                 # PP 2 x DP 4
            _plan(2, pp=4, step=1.015, gib=35),                # PP 4 x DP 2: beaten in both by PP 2, within 5 %
            _plan(4, pp=2, zero=2, step=1.30, gib=20),         # outside the band, on the front
            _plan(2, tp=2, pp=2, step=1.40, gib=25)]           # outside the band, beaten by the one above
    cols = {f: np.array([r[f] for r in rows], dtype=object if f in ("zero", "recompute", "schedule", "stage_layers",
                                                                     "equivalent") else None) for f in FIELDS}
    plans = SearchResult(cols, SearchStats(), 80 * 2 ** 30, timed=True, seq_length=8192).plans()
    got = [(r["dp"], r["tp"], r["pp"], r["zero"]) for r in plans]
    assert got == [(8, 1, 1, 1), (4, 2, 1, 1), (4, 1, 2, 1), (2, 1, 4, 1), (4, 1, 2, 2)]
    assert plans[0]["why"].startswith("the simplest of the 4 plans within 5% of the fastest step (1 s)")
    assert "no tp" in plans[0]["why"] and "uses nothing" in plans[0]["why"]
    assert plans[3]["why"] == ("within 5% of the fastest step, so listed, after pp2 dp4 (ZeRO-1, recompute "
                               "none, micro-batch 1), as simple, 0.5 % faster and 5.00 GiB smaller")
    assert all("why" not in r for r in plans[1:3] + plans[4:])


# issue 33: within the time model's own uncertainty the simpler plan wins, and the table says why
@pytest.mark.parametrize("row, seq, points, traits", [
    (dict(dp=8, tp=1, pp=1, vpp=1, cp=1, ep=1, zero=1), 8192, 0, []),
    (dict(dp=8, tp=1, pp=1, vpp=1, cp=1, ep=1, zero=3), 8192, 1, ["ZeRO-3"]),
    (dict(dp=1, tp=1, pp=1, vpp=1, cp=8, ep=1, zero=1), 8192, 2,
     ["cp", "context parallelism on 8,192-token sequences"]),
    (dict(dp=1, tp=1, pp=1, vpp=1, cp=8, ep=1, zero=1), 131072, 1, ["cp"]),  # Llama 3's 128K stage: CP 16
    (dict(dp=2, tp=8, pp=16, vpp=2, cp=1, ep=1, zero=1), 8192, 3, ["tp", "pp", "interleaving"]),
    # expert parallelism shards experts over the data-parallel ranks: DeepSeek-V3's PP 16 × EP 64 is one point
    (dict(dp=2, tp=1, pp=16, vpp=1, cp=1, ep=64, zero=1), 4096, 1, ["pp"]),
])
def test_complexity_counts_parallel_dimensions_and_short_sequence_cp(row, seq, points, traits):
    assert complexity(row, seq) == (points, traits)


def test_the_simplest_plan_within_the_tolerance_comes_first_and_says_why():
    # Llama 3 8B on 8 GPUs: plain data parallelism with ZeRO-2 is the plan a practitioner runs, and first; ZeRO-3
    # is within 5 % (0.3 % slower in the model) and listed next. (Before ZeRO-2's reduce-scatter per
    # micro-batch, time.mf zero2_rs_mb, with Megatron-FSDP's forced overlap, ZeRO-3 was the fastest by 0.3 %
    # and plain ZeRO-2 came first as the simplest within the tolerance: test_the_simpler_plan_within_the_
    # tolerance_survives_and_wins holds that rule)
    model = load_model(CFG)
    result = search(model, default_space(model, 8))
    plans = result.plans()
    top = plans[0]
    assert (top["dp"], top["tp"], top["pp"], top["cp"]) == (8, 1, 1, 1) and top["zero"] == 2
    assert (plans[1]["dp"], plans[1]["zero"]) == (8, 3)
    assert plans[1]["step_seconds"] <= (1 + TIE_TOLERANCE) * top["step_seconds"]
    assert f"within {TIE_TOLERANCE:.0%}" in top["why"] and "uses nothing" in top["why"]
    # the command's JSON and table, in this process (the search just run is cached: tests/cli_inprocess.py)
    r = memform_in_process("search", CFG, "--devices", "8", "--format", "json", "--no-progress", "--top", "3")
    rows = json.loads(r.stdout)["rows"]
    assert "why" in rows[0] and all("why" not in x for x in rows[1:])
    r = memform_in_process("search", CFG, "--devices", "8", "--no-progress", "--top", "3")
    assert "first row: the fastest step" in r.stdout


def test_plans_far_slower_than_the_best_are_dropped_unless_all():
    # issue 33: the default table ended in 0.1 %-MFU rows; the front's slow, small plans stay under --all
    # (ZeRO-3 with full recompute on 16 devices: the front reaches 2.5x the fastest step)
    model = load_model(CFG)
    result = search(model, default_space(model, 16, zero=[0, 3], micro_batch=[1, 2, 4],
                                         recompute=["none", "full"]))
    front = pareto_front(result.plans(keep_all=True))
    fastest = min(r["step_seconds"] for r in front)
    far = [r for r in front if r["step_seconds"] > FAR_FROM_BEST * fastest]
    assert far, "the sample search should have slow, small plans on its front"
    shown = {(r["dp"], r["tp"], r["pp"], r["micro_batch_size"], r["recompute"]) for r in result.plans()}
    assert not any((r["dp"], r["tp"], r["pp"], r["micro_batch_size"], r["recompute"]) in shown for r in far)


def test_a_timed_search_needs_a_global_batch():
    # issue 33: without one, rows of different micro-batch x dp are steps of different sizes
    model = load_model(CFG, {"training.global_batch_size": None})
    with pytest.raises(MemformError, match=r"training\.global_batch_size is not set"):
        search(model, default_space(model, 16, zero=[1], micro_batch=[1]))
    r = run_memform("search", CFG, "--devices", "16", *SMALL, "--set", "training.global_batch_size=null",
                    "--no-progress")
    assert r.returncode == 2 and "--set training.global_batch_size=N" in r.stderr
    assert "Traceback" not in r.stderr


def test_tensor_parallelism_stays_inside_a_node():
    # configs/devices/h100-sxm.yaml: 8 devices per node; tp 16 only with --tp-across-nodes
    model = load_model(CFG)
    assert max(default_space(model, 32).tp) == 8
    assert 16 in default_space(model, 32, tp_across_nodes=True).tp


def test_rows_with_equal_memory_and_time_are_merged(result):
    # Llama-3-8B uses flash attention: selective recompute keeps what no recompute keeps, at the same cost
    plans = result.plans(keep_all=True)
    merged = [r for r in plans if "recompute=selective" in r["equivalent"]]
    assert merged and all(r["recompute"] == "none" for r in merged)
    keys = [(r["devices_used"], r["peak_bytes"], r["peak_stage"], r["step_seconds"]) for r in plans]
    assert len(keys) == len(set(keys))


def test_step_seconds_are_the_estimates(result):
    for r in result.plans(top=3):
        est = memform.estimate(CFG, {"parallel.dp": r["dp"], "parallel.tp": r["tp"], "parallel.pp": r["pp"],
                                     "parallel.cp": r["cp"], "parallel.zero": r["zero"],
                                     "training.recompute": r["recompute"],
                                     "training.micro_batch_size": r["micro_batch_size"]})
        assert r["step_seconds"] == pytest.approx(est.step_seconds, abs=2e-6)
        assert r["mfu"] == pytest.approx(est.mfu, abs=1e-4)
        assert r["peak_bytes"] == est.peak_bytes


def test_cli_json_rows_carry_time_fields():
    r = run_memform("search", CFG, "--devices", "16", *SMALL, "--format", "json", "--no-progress")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["timed"] and d["ranking"] == ["step_seconds", "peak_bytes"]
    for row in d["rows"]:
        assert row["step_seconds"] > 0 and 0 < row["mfu"] < 1 and row["tokens_per_second"] > 0
        assert row["tp"] <= 8


def test_cli_pareto_view_and_all():
    r = run_memform("search", CFG, "--devices", "16", *SMALL, "--pareto", "--top", "0", "--format", "json",
                    "--no-progress")
    rows = json.loads(r.stdout)["rows"]
    peaks = [x["peak_bytes"] for x in rows]
    steps = [x["step_seconds"] for x in rows]
    assert peaks == sorted(peaks) and steps == sorted(steps, reverse=True)
    r_all = run_memform("search", CFG, "--devices", "16", *SMALL, "--all", "--top", "0", "--format", "json",
                        "--no-progress")
    assert len(json.loads(r_all.stdout)["rows"]) > len(rows)


def test_cli_table_and_html_chart(tmp_path):
    r = run_memform("search", CFG, "--devices", "16", *SMALL, "--no-progress")
    assert r.returncode == 0 and "ranked by estimated step time" in r.stdout and "MFU %" in r.stdout
    out = tmp_path / "s.html"
    r = run_memform("search", CFG, "--devices", "16", *SMALL, "--format", "html", "--output", out, "--no-progress")
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    assert "<svg" in page and 'class="front"' in page and "step time (s)" in page
    assert len(re.findall(r'<circle class="plan front"', page)) >= 3


def test_without_a_time_model_the_memory_ranking_stays(tmp_path):
    r = run_memform("search", ROOT / "configs" / "llama2-7b.yaml", "--devices", "8", "--zero", "1", "--mbs", "1",
                    "--format", "json", "--no-progress")
    d = json.loads(r.stdout)
    assert not d["timed"] and d["ranking"] == ["devices_wasted", "peak_bytes"]
    assert "step_seconds" not in d["rows"][0]
    r = run_memform("search", ROOT / "configs" / "llama2-7b.yaml", "--devices", "8", "--pareto", "--no-progress")
    assert r.returncode == 2 and "needs a time model" in r.stderr


def test_progress_bar_is_drawn_by_tqdm():
    r = run_memform("search", CFG, "--devices", "8", "--zero", "1", "--mbs", "1", "--progress", "--top", "1")
    assert r.returncode == 0 and "structures" in r.stderr and "|" in r.stderr


_row = st.fixed_dictionaries({"step_seconds": st.integers(1, 6).map(float), "peak_bytes": st.integers(1, 6),
                              "devices_used": st.just(8), "peak_stage": st.just(0),
                              "dp": st.integers(1, 3), "tp": st.just(1), "pp": st.just(1), "vpp": st.just(1),
                              "cp": st.just(1), "ep": st.just(1), "zero": st.just(1),
                              "recompute": st.sampled_from(["none", "selective", "full"]), "schedule": st.just("1f1b"),
                              "micro_batch_size": st.just(1), "num_micro_batches": st.just(1),
                              "stage_layers": st.just(""), "equivalent": st.just("")})


@settings(max_examples=200, deadline=None)
@given(st.lists(_row, min_size=1, max_size=12))
def test_front_and_merge_properties(rows):
    rows = [dict(r, devices_wasted=0, peak_gib=0, headroom_bytes=0, mfu=None, tokens_per_second=None) for r in rows]
    merged = merge_equivalent(rows)
    assert len({(r["step_seconds"], r["peak_bytes"]) for r in merged}) == len(merged)
    assert {(r["step_seconds"], r["peak_bytes"]) for r in merged} == {(r["step_seconds"], r["peak_bytes"]) for r in rows}
    front = pareto_front(merged)
    assert front and not any(_dominated(r, merged) for r in front)
    assert all(_dominated(r, front) for r in merged if r not in front)


def test_context_parallelism_is_searched_only_with_fused_attention():
    # issue 33: CP 2-4 on GPT-3's 2K tokens with an eager attention core came first in the search by
    # 22-36 %; Megatron-Core runs ring / all-gather CP only in TE's flash or fused attention (dense.mf's
    # require), so the eager config lists no CP plan and refuses one naming the key; Ulysses takes any core
    gpt3 = ROOT / "configs" / "gpt3-175b.yaml"
    model = load_model(gpt3)
    space = dict(pp=[8], tp=[8], cp=[1, 2, 4], zero=[1], recompute=["selective"], micro_batch=[1])
    plans = search(model, default_space(model, 256, **space)).plans(keep_all=True)
    assert plans and {r["cp"] for r in plans} == {1}
    flash = load_model(gpt3, {"model.flash_attention": True})
    assert {2, 4} <= {r["cp"] for r in search(flash, default_space(flash, 256, **space)).plans(keep_all=True)}
    r = run_memform("estimate", gpt3, "--set", "parallel.cp=2")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "needs fused attention (model.flash_attention: true)" in r.stderr and "parallel.cp_algo" in r.stderr
