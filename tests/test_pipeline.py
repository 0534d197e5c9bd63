"""Pipeline schedules, their peak moments, recomputation modes and ZeRO-3 / FSDP working sets.

Reference cases cite where each expected number comes from; property tests (hypothesis)
check the monotonicity every memory model must have. Everything runs on the numeric path (plain ints and
fractions, tests/estimate_helpers.py; equal to the sympy evaluator's numbers by tests/test_numeric.py) so
the file stays fast.
"""

from __future__ import annotations

import copy
import json
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memform.api import estimate_model, load_model, rebind
from memform.errors import MemformError
from cli_helpers import memform_command
from estimate_helpers import numbers

#: a Llama-like dense model; dropout off so the embedding stores no activations, which keeps the
#: first stage's activations exactly "its transformer layers" (Megatron's formulas count only those)
BASE = {
    "name": "pipe",
    "model": {"hidden_size": 1024, "num_heads": 16, "num_kv_heads": 4, "num_layers": 48,
              "ffn_hidden_size": 4096, "vocab_size": 32000, "seq_length": 2048, "activation": "swiglu",
              "norm": "rmsnorm", "bias": False, "dropout": False, "flash_attention": True,
              "position_embedding": "rope"},
    "parallel": {"dp": 1, "tp": 1, "pp": 4},
    "training": {"micro_batch_size": 1, "num_micro_batches": 16, "recompute": "none"},
}


def config(**overrides) -> dict:
    """BASE with dotted-key overrides (``parallel__vpp=2`` style keys use '__' for '.')."""
    cfg = copy.deepcopy(BASE)
    for key, value in overrides.items():
        node = cfg
        *path, last = key.split("__")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return cfg


def est(**overrides):
    return numbers(config(**overrides))


def inflight(e, stage: int) -> dict[int, int]:
    """In-flight micro-batches per chunk of ``stage``, as the engine used them."""
    return {l.chunk: int(l.inflight_value) for l in e.stages[stage].layers}


def decoder_act(e, mode: str = "none") -> Fraction:
    for s in e.stages:
        for l in s.layers:
            if l.block == "decoder" and l.mode == mode:
                return Fraction(str(l.per_layer_values["activations"]))
    raise AssertionError(f"no decoder[{mode}] layer")


# ------------------------------------------------------------------ interleaved / VPP 1F1B

@pytest.mark.parametrize("p,v", [(4, 2), (4, 3), (2, 4), (8, 2)])
def test_vpp_first_stage_penalty_matches_megatron(p, v):
    """Megatron-LM megatron/training/theoretical_memory_usage.py (compute_activation_memory):
    with an interleaved schedule the first stage's activations are those of L·(p/p) layers times
    1 + (p - 1)/(p·v) (Narayanan et al. 2021 §2.2.2: (p - 1)/v extra warm-up micro-batches)."""
    one = est(parallel__pp=p, parallel__vpp=1)
    inter = est(parallel__pp=p, parallel__vpp=v)
    expected = Fraction(one.stages[0].moments["warmup"]) * (1 + Fraction(p - 1, p * v))
    assert inter.stages[0].moments["warmup"] == expected
    # the non-interleaved first stage holds p micro-batches of all its L/p layers (Korthikanti §4.2.3)
    assert one.stages[0].moments["warmup"] == p * (48 // p) * decoder_act(one)


def test_vpp_per_chunk_counts_follow_the_interleaved_schedule():
    """Megatron-LM pipeline_parallel/schedules.py: stage i runs 2(p-i-1) + (v-1)p warm-up chunk
    forwards in groups of p micro-batches per chunk; one more forward precedes the first backward."""
    e = est(parallel__pp=4, parallel__vpp=2)
    assert inflight(e, 0) == {0: 7, 1: 4}   # 2p - 1 on chunk 0, p on the others
    assert inflight(e, 1) == {0: 5, 1: 4}
    assert inflight(e, 2) == {0: 4, 1: 3}
    assert inflight(e, 3) == {0: 4, 1: 1}   # the last stage: (v - 1)p + 1 passes
    assert e.stages[0].peak_moment == "backward"


def _megatron_held(p: int, v: int, m: int, g: int, i: int) -> dict[int, int]:
    """Per-chunk passes stage i holds at its first backward, read off Megatron-Core's own schedule:
    pipeline_parallel/schedules.py get_schedule_table (groups of g micro-batches, every chunk in turn, the
    last group taking what is left) and get_pp_rank_microbatches (2(p - i - 1) + (v - 1)g warm-up forwards,
    capped at m·v), plus the one forward before the first backward."""
    table = []
    for start in range(0, m, g):
        stop = m if start + g >= m else start + g
        table += [(mb, c) for c in range(v) for mb in range(start, stop)]
    n = min(m * v, 2 * (p - i - 1) + (v - 1) * g + 1)
    return {c: sum(1 for _, cc in table[:n] if cc == c) for c in range(v)}


@pytest.mark.parametrize("p,v,m,g", [(4, 2, 16, 4), (4, 2, 16, 8), (4, 2, 10, 5), (4, 3, 12, 6), (2, 2, 6, 3),
                                     (4, 2, 9, 5), (4, 2, 8, 8), (2, 4, 8, 4)])
def test_vpp_microbatch_group_follows_megatron_schedule_table(p, v, m, g):
    """--microbatch-group-size-per-virtual-pipeline-stage g (model_parallel_config.py; Llama 3 §3.3.2 tunes
    it): each stage holds, per chunk, what Megatron-Core's schedule table runs before the first backward."""
    e = est(parallel__pp=p, parallel__vpp=v, parallel__vpp_microbatch_group=g, training__num_micro_batches=m)
    for i in range(p):
        assert inflight(e, i) == _megatron_held(p, v, m, g, i), (i, inflight(e, i))
    if g == p:   # the flag at Megatron's default is the default
        assert e.peak_bytes == est(parallel__pp=p, parallel__vpp=v, training__num_micro_batches=m).peak_bytes


def _megatron_core_schedule_functions():
    """megatron-core's own get_schedule_table and get_pp_rank_microbatches (pipeline_parallel/schedules.py,
    0.19.2), compiled from the installed file without importing megatron.core (whose import takes seconds):
    the two functions are plain Python; the pipeline rank and size come in through their p2p_communicator."""
    import ast
    import importlib.util
    import typing
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        pytest.skip("megatron-core not installed")
    path = Path(importlib.util.find_spec("megatron.core").submodule_search_locations[0]) / "pipeline_parallel" / "schedules.py"
    tree = ast.parse(path.read_text())
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef)
            and n.name in ("get_schedule_table", "get_pp_rank_microbatches")]
    assert len(keep) == 2
    ns = {"Optional": typing.Optional, "P2PCommunicator": object, "parallel_state": None}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), ns)
    return ns["get_schedule_table"], ns["get_pp_rank_microbatches"]


@pytest.mark.parametrize("p,v,m,g", [(4, 2, 16, 4), (4, 2, 16, 8), (4, 3, 12, 6), (4, 2, 9, 5), (2, 4, 8, 4),
                                     (16, 8, 32, 16), (16, 2, 32, 16)])
def test_vpp_held_counts_are_megatron_cores_own_schedule(p, v, m, g):
    """Each stage's per-chunk passes at its first backward, read off megatron-core's own schedule table and
    warm-up count (the forwards of the table's first warm-up entries, and one more when a 1F1B phase
    follows): (16, 8, 32, 16) is Llama 3 405B at 8K with one layer per chunk (test_published_runs)."""
    table_of, warmup_of = _megatron_core_schedule_functions()

    class Rank:   # what get_pp_rank_microbatches reads of its p2p_communicator
        def __init__(self, i):
            self.pp_group = type("G", (), {"size": lambda _: p, "rank": lambda _: i})()
            self.virtual_pipeline_model_parallel_size = v

    table = table_of(m, v, g)
    e = est(parallel__pp=p, parallel__vpp=v, parallel__vpp_microbatch_group=g, training__num_micro_batches=m,
            model__num_layers=p * v)
    for i in range(p):
        _, _, warm, rest = warmup_of(m, v, g, p2p_communicator=Rank(i))
        n = warm + (1 if rest else 0)
        held = {c: sum(1 for _, cc in table[:n] if cc == c) for c in range(v)}
        assert inflight(e, i) == held, (i, inflight(e, i), held)


def test_stage_layers_per_chunk_lets_the_ends_hold_the_embedding_and_output_alone():
    """A stage may list its chunks' layer counts (the split Megatron-Core builds with --account-for-embedding-
    and --account-for-loss-in-pipeline-split, transformer_block.py get_num_layers_to_build): only the first
    chunk of the first stage and the last chunk of the last stage may be empty, and they then hold the
    embedding and the output layer alone."""
    e = est(parallel__pp=4, parallel__vpp=2, parallel__stage_layers=[[0, 12], [6, 6], [6, 6], [12, 0]])
    assert [l.block for l in e.stages[0].layers if l.chunk == 0] == ["embedding"]
    assert [(l.block, int(l.count_value)) for l in e.stages[3].layers] == [("decoder", 12), ("output", 1)]
    assert [l.chunk for l in e.stages[3].layers] == [0, 1]
    assert inflight(e, 0) == {0: 7, 1: 4}   # the schedule's counts do not depend on the layout
    for bad, fragment in [([[6, 6], [0, 12], [6, 6], [6, 6]], "stage 1 chunk 0 no layers"),
                          ([[6, 6, 0], 12, 12, 12], "must be a list of 4 non-negative")]:
        with pytest.raises(MemformError, match=fragment):
            est(parallel__pp=4, parallel__vpp=2, parallel__stage_layers=bad)


def test_vpp_default_group_is_p():
    for p, v, m in [(4, 2, 16), (4, 2, 4), (2, 4, 8), (8, 2, 24)]:
        e = est(parallel__pp=p, parallel__vpp=v, training__num_micro_batches=m)
        assert [inflight(e, i) for i in range(p)] == [_megatron_held(p, v, m, p, i) for i in range(p)]


@pytest.mark.parametrize("g,m,fragment", [
    (3, 16, "between parallel.pp"),      # g < p: schedules.py refuses
    (20, 16, "between parallel.pp"),     # g > m
    (6, 16, "last group"),               # 16 % 6 = 4 ... >= p = 4 is allowed; see below
])
def test_vpp_microbatch_group_is_checked(g, m, fragment):
    cfg = dict(parallel__pp=4, parallel__vpp=2, parallel__vpp_microbatch_group=g, training__num_micro_batches=m)
    if fragment == "last group":   # 16 = 2·6 + 4: a last group of 4 = p is what Megatron accepts
        est(**cfg)
        with pytest.raises(MemformError, match="last group"):   # 14 = 2·6 + 2: a last group of 2 < p
            est(**{**cfg, "training__num_micro_batches": 14})
        return
    with pytest.raises(MemformError, match=fragment):
        est(**cfg)


# Without interleaving (vpp 1) Megatron never reads the group: only forward_backward_pipelining_with_interleaving
# checks it against [pp, m] (megatron-core 0.19.2 pipeline_parallel/schedules.py:1133-1141); the 1F1B schedule
# without interleaving and no pipelining do not take it. A group of 3 < pp = 4 is accepted there and changes
# nothing (issue 35: seed 606's survivor `schedules.mf:29:15 1 -> 0`, `require vp == 0 or ...`, refused it)
def test_vpp_microbatch_group_is_not_read_without_interleaving():
    plain = est(parallel__pp=4)
    grouped = est(parallel__pp=4, parallel__vpp_microbatch_group=3)
    assert [s.exprs for s in grouped.stages] == [s.exprs for s in plain.stages]


def test_torch_interleaved_uses_its_own_rounds():
    """torch ScheduleInterleaved1F1B.__init__: number_of_rounds = max(1, m // p), microbatches_per_round =
    m / rounds, warm-up (v - 1)·g + 2(p - 1 - i) (_get_warmup_ops) and one more forward; p = 4, v = 2."""
    def held(m):
        e = est(parallel__pp=4, parallel__vpp=2, training__num_micro_batches=m,
                training__framework="torch", parallel__pp_schedule="torch-interleaved")
        return [inflight(e, i) for i in range(4)]
    # m = 16: 4 rounds of g = 4, Megatron's default; m = 6: 1 round of g = 6, every stage 2(3 - i) + 6 + 1,
    # capped at 12: chunk 0 takes the first 6 forwards, chunk 1 the rest
    assert held(16) == [_megatron_held(4, 2, 16, 4, i) for i in range(4)]
    assert held(6) == [{0: 6, 1: 6}, {0: 6, 1: 5}, {0: 6, 1: 3}, {0: 6, 1: 1}]
    with pytest.raises(MemformError, match="vpp_microbatch_group is Megatron's"):
        est(parallel__pp=4, parallel__vpp=2, parallel__vpp_microbatch_group=4, training__framework="torch",
            parallel__pp_schedule="torch-interleaved")


def _torch_interleaved_order(p: int, m: int, v: int) -> dict[int, list]:
    """torch's own ScheduleInterleaved1F1B action lists (torch/distributed/pipelining/schedules.py, torch
    2.13): _calculate_single_rank_operations reads only the four attributes set here (__init__ would build
    them from real stages and a process group), so the schedule's pipeline_order is its code's, not a
    restatement."""
    sched = pytest.importorskip("torch.distributed.pipelining.schedules")
    s = sched.ScheduleInterleaved1F1B.__new__(sched.ScheduleInterleaved1F1B)
    s.pp_group_size, s.n_local_stages, s._n_microbatches = p, v, m
    s.number_of_rounds = max(1, m // p)
    s.microbatches_per_round = m // s.number_of_rounds
    return {r: [a for a in s._calculate_single_rank_operations(r) if a is not None] for r in range(p)}


def _torch_interleaved_peak(p: int, m: int, v: int) -> dict[int, tuple[dict[int, int], set[int]]]:
    """Per rank, from torch's action list: the chunk passes held (forwards minus backwards, chunk =
    stage_index // p) just before its first backward, where the held total is largest, and the largest set
    of chunks whose unsharded gradient accumulators are live at a backward with that total (a chunk's
    accumulator lives from its first backward to its m-th, after which FSDP reduce-scatters it)."""
    from torch.distributed.pipelining.schedules import _ComputationType as CT
    out = {}
    for r, actions in _torch_interleaved_order(p, m, v).items():
        held, done = dict.fromkeys(range(v), 0), dict.fromkeys(range(v), 0)
        peaks = []
        for a in actions:
            c = a.stage_index // p
            if a.computation_type == CT.FORWARD:
                held[c] += 1
                continue
            assert a.computation_type == CT.FULL_BACKWARD
            live = {k for k in range(v) if 0 < done[k] < m} | {c}
            peaks.append((sum(held.values()), dict(held), live))
            held[c] -= 1
            done[c] += 1
        top = max(t for t, _, _ in peaks)
        first = next(h for t, h, _ in peaks if t == top)
        out[r] = (first, max((lv for t, _, lv in peaks if t == top), key=len))
    return out


@pytest.mark.parametrize("p,m,v", [(4, 4, 2), (4, 6, 2), (4, 8, 2), (4, 12, 3), (2, 4, 2), (4, 16, 2)])
def test_fsdp2_interleaved_follows_torch_pipeline_order(p, m, v):
    """torchtitan's interleaved schedule is torch's ScheduleInterleaved1F1B: memform's in-flight counts are
    the passes its own pipeline_order holds at each rank's first backward, and with unsharded gradient
    accumulation (FSDP no-sync across the micro-batches, as torch pipelining runs it) the peak moment
    holds the accumulators of the chunks torch has live there -- with one round (m < 2p) only the last
    chunk's, whose backwards all run before any of the next chunk's (frameworks/fsdp2.mf)."""
    torch_peak = _torch_interleaved_peak(p, m, v)
    kw = dict(parallel__pp=p, parallel__vpp=v, training__num_micro_batches=m, training__framework="fsdp2",
              parallel__pp_schedule="interleaved", parallel__dp=2, model__num_layers=8 * p * v)
    nosync = est(**kw, parallel__grad_accumulation_shard=False)
    sync = est(**kw, parallel__grad_accumulation_shard=True)
    for i in range(p):
        assert inflight(nosync, i) == torch_peak[i][0], (i, inflight(nosync, i), torch_peak[i][0])
    for i in range(1, p - 1):   # middle ranks: every chunk 8 decoders, so equal accumulators
        a, b = nosync.stages[i], sync.stages[i]
        per_chunk = (a.values["grads"] - b.values["grads"]) // v
        idle = v - len(torch_peak[i][1])
        assert a.moments["backward"] - b.moments["backward"] == -idle * per_chunk, (i, torch_peak[i][1])


def test_memest_interleaved_variants():
    """MemEst evaluators/utils.py micro factors (memest-formulas.md §2.2), p = 4, m = 16, v = 2:
    big memory: chunk 0 = B + extra (- 1 on stage 0), last chunk = B - i (+1 borrowed);
    less memory: chunk 0 = B, last chunk = B - i."""
    big = est(parallel__pp=4, parallel__vpp=2, parallel__pp_schedule="interleaved-memest")
    assert [inflight(big, i) for i in range(4)] == [{0: 6, 1: 4}, {0: 5, 1: 4}, {0: 4, 1: 3}, {0: 4, 1: 1}]
    less = est(parallel__pp=4, parallel__vpp=2, parallel__pp_schedule="interleaved-less-memory")
    assert [inflight(less, i) for i in range(4)] == [{0: 4, 1: 4}, {0: 4, 1: 3}, {0: 4, 1: 2}, {0: 4, 1: 1}]


# ------------------------------------------------------------------ zero-bubble V / DualPipeV

def test_zero_bubble_v_counts_and_placement(schedule="zero-bubble-v"):
    """MemEst pp_dualpipe_v_micro_factor (memest-formulas.md §2.2): chunk 0 holds 2B - 1 - i,
    chunk 1 holds i (at least 1), B = min(p, m); V placement (Qi et al. 2024, ZB-V): stage 0 holds
    the first and the last piece, so both the embedding and the output head."""
    e = est(parallel__vpp=2, parallel__pp_schedule=schedule)
    assert [inflight(e, i) for i in range(4)] == [{0: 7, 1: 1}, {0: 6, 1: 1}, {0: 5, 1: 2}, {0: 4, 1: 3}]
    blocks0 = [l.block for l in e.stages[0].layers]
    assert blocks0[0] == "embedding" and blocks0[-1] == "output"
    # Qi et al. 2024: the V schedules balance memory -- every stage but the first holds 2p - 1
    # chunk passes, about p micro-batches of a whole stage
    assert {sum(inflight(e, i).values()) for i in range(1, 4)} == {7}


@pytest.mark.regression
def test_dualpipev_holds_pp_plus_one():
    """deepseek-ai/DualPipe dualpipe.py step(): warm-up steps nF0 = 2(H - r - 1), nF0F1 = r + 1,
    nB1W1F1 = H - r - 1 leave rank r holding 2H - 1 - r chunk-0 and r + 1 chunk-1 passes; the main
    step's first F0 (overlapped with a B1) makes PP + 1 (the README's memory table). DualPipeV
    runs the same steps with H = p ranks.

    Regression test, not a reference: the backward transient (2·2·f + 2·h)·s·b is restated from dense.mf
    (mlp.bwd_grads: the SwiGLU's 3·2·s·b·f gradients less fc2's released input, 2·s·b·f, plus the layer
    output's gradient mlp_dy, 2·s·b·h). What checks that term independently is the PyTorch harness's activation peak
    (bench/validate.py, tests/test_validate.py: within memform.validation.compare.THRESHOLDS, not exact).
    """
    e = est(parallel__vpp=2, parallel__pp_schedule="dualpipev")
    assert [inflight(e, i) for i in range(4)] == [{0: 7, 1: 1}, {0: 6, 1: 2}, {0: 5, 1: 3}, {0: 4, 1: 4}]
    assert {sum(inflight(e, i).values()) for i in range(4)} == {2 * 4}
    s = e.stages[2]   # 6 decoder layers per chunk: the F0 of the main step adds one chunk-0 pass
    chunk_act = 6 * decoder_act(e)
    bwd = (2 * 2 * 4096 + 2 * 1024) * 2048 * 1   # the layer in backward: SwiGLU gradients (dense.mf mlp.bwd_grads)
    assert s.moments["backward"] - s.moments["warmup"] == max(chunk_act + bwd, decoder_act(e) + bwd)


@pytest.mark.regression
def test_zero_bubble_v_backward_overlap_rule():
    """MemEst _bwd_overhead.py (memest-formulas.md §2.4) with full recompute on every layer:
    overhead = max(Σ act(chunk 0) + max recomputed chunk-1 layer, last layer + max recomputed chunk-0
    layer), added to the warm-up activations; a recomputed layer rebuilds act[none] - act[full]
    (MemEst adds act[none]; the layer's stored input is already in the warm-up sum). The layer in
    backward also holds its SwiGLU gradients, (2·2·f + 2·h)·s·b bytes (dense.mf mlp.bwd_grads).

    Regression test, not a reference: the backward transient (2·2·f + 2·h)·s·b is restated from dense.mf
    (mlp.bwd_grads: the SwiGLU's 3·2·s·b·f gradients less fc2's released input, 2·s·b·f, plus the layer
    output's gradient mlp_dy, 2·s·b·h). What checks that term independently is the PyTorch harness's activation peak
    (bench/validate.py, tests/test_validate.py: within memform.validation.compare.THRESHOLDS, not exact).
    """
    e = est(parallel__vpp=2, parallel__pp_schedule="zero-bubble-v", training__recompute="full")
    s = e.stages[2]  # 6 decoder layers per chunk, nothing pinned
    full, none = decoder_act(e, "full"), decoder_act(est())
    bwd = (2 * 2 * 4096 + 2 * 1024) * 2048 * 1
    a_term = 6 * full + (none - full) + bwd
    b_term = none + bwd + (none - full)
    assert s.moments["backward"] - s.moments["warmup"] == max(a_term, b_term)
    assert s.moments["warmup"] == (5 + 2) * 6 * full


def test_v_schedule_needs_two_chunks():
    with pytest.raises(MemformError, match="vpp = 2"):
        est(parallel__pp_schedule="zero-bubble-v")


# ------------------------------------------------------------------ GPipe, 1F1B, SeqPipe

def test_gpipe_holds_every_micro_batch():
    """GPipe (Huang et al. 2019 §2.2): all m forwards before any backward, on every stage."""
    e = est(parallel__pp_schedule="gpipe")
    for s in e.stages:
        assert {l.inflight_value for l in s.layers} == {16}
    assert e.stages[1].moments["warmup"] == 16 * 12 * decoder_act(e)


@pytest.mark.regression
def test_1f1b_in_flight_and_backward_moment():
    """1F1B (Narayanan et al. 2021 §2.2.1): stage i holds min(p - i, m) micro-batches; the first
    backward adds one micro-batch of the last layer's activations (MemEst _bwd_overhead.py §2.4)
    and what that layer's backward allocates on top: with flash attention the SwiGLU backward's
    gradients of its f-wide output and 2f-wide input less fc2's released input, and the layer output's
    gradient: (2·2·f + 2·h)·s·b bytes (dense.mf mlp.bwd_grads).

    Regression test, not a reference: the backward transient (2·2·f + 2·h)·s·b is restated from dense.mf
    (mlp.bwd_grads: the SwiGLU's 3·2·s·b·f gradients less fc2's released input, 2·s·b·f, plus the layer
    output's gradient mlp_dy, 2·s·b·h). What checks that term independently is the PyTorch harness's activation peak
    (bench/validate.py, tests/test_validate.py: within memform.validation.compare.THRESHOLDS, not exact).
    """
    e = est()
    act = decoder_act(e)
    bwd = (2 * 2 * 4096 + 2 * 1024) * 2048 * 1
    for i, s in enumerate(e.stages[:3]):
        assert s.moments["warmup"] == (4 - i) * 12 * act
        assert s.moments["backward"] == s.moments["warmup"] + act + bwd
        assert s.peak_moment == "backward" and s.values["activations"] == s.moments["backward"]
    few = est(training__num_micro_batches=2)
    assert [inflight(few, i)[0] for i in range(4)] == [2, 2, 2, 1]


@pytest.mark.regression
def test_backward_moment_recomputes_a_full_layer():
    """Full recompute: the layer in backward rebuilds one micro-batch of its activations
    (Korthikanti et al. 2022 §5; MemEst adds the layer as not-recomputed, mf = 1, §2.4).

    Regression test, not a reference: the backward transient (2·2·f + 2·h)·s·b is restated from dense.mf
    (mlp.bwd_grads: the SwiGLU's 3·2·s·b·f gradients less fc2's released input, 2·s·b·f, plus the layer
    output's gradient mlp_dy, 2·s·b·h). What checks that term independently is the PyTorch harness's activation peak
    (bench/validate.py, tests/test_validate.py: within memform.validation.compare.THRESHOLDS, not exact).
    """
    e = est(training__recompute="full")
    s = e.stages[1]
    assert s.moments["warmup"] == 3 * 12 * decoder_act(e, "full")
    # + the SwiGLU backward's gradients, (2·2·f + 2·h)·s·b bytes (dense.mf mlp.bwd_grads)
    assert s.moments["backward"] - s.moments["warmup"] == decoder_act(est()) + (2 * 2 * 4096 + 2 * 1024) * 2048 * 1


def test_seqpipe_counts_sequence_chunks_at_the_chunk_length():
    """SeqPipe / Seq1F1B (Sun et al. 2024; MemEst pp_seq1f1b_micro_factor §2.2): stage i holds
    p - i + n - 1 sequence chunks, each with the activations of a sequence of length s / n."""
    one = est(parallel__pp_schedule="seqpipe")
    ref = est()
    assert [s.moments for s in one.stages] == [s.moments for s in ref.stages]  # n = 1 is 1F1B
    e = est(parallel__pp_schedule="seqpipe", parallel__seq_chunks=4)
    act = decoder_act(ref)  # flash attention: every stored term is linear in s
    for i in range(3):
        assert inflight(e, i)[0] == 4 - i + 3
        assert e.stages[i].moments["warmup"] == (4 - i + 3) * 12 * act / 4


@pytest.mark.parametrize("vp, n, m", [(2, 4, 16), (3, 2, 16), (2, 4, 2)])
def test_seqpipe_with_virtual_chunks_holds_memests_less_memory_split(vp, n, m):
    """SeqPipe with vp > 1, MemEst pp_seq1f1b_micro_factor, less-memory split (memest-formulas.md §2.2):
    with B = min(p, m), every chunk but the last holds B pieces, the last B - i + n - 1 (at least 1);
    each piece holds a layer's activations at sequence length s / n (flash attention: linear in s)."""
    p = 4
    e = est(parallel__pp_schedule="seqpipe", parallel__seq_chunks=n, parallel__vpp=vp,
            training__num_micro_batches=m)
    b = min(p, m)
    act = decoder_act(est())
    for i in range(p):
        want = {c: (b if c < vp - 1 else max(1, b - i + n - 1)) for c in range(vp)}
        assert inflight(e, i) == want, (i, inflight(e, i), want)
        # 48 layers over 4 stages and vp chunks: 12 / vp decoders per chunk; stage 0 has no other block
        if i == 0:
            assert e.stages[0].moments["warmup"] == sum(want.values()) * (12 // vp) * act / n


# ------------------------------------------------------------------ recomputation

def test_recompute_num_layers_is_full_on_the_first_n_of_each_stage():
    """Megatron-LM --recompute-granularity full --recompute-method block --recompute-num-layers n
    (arguments.py help: "recompute the input activations of only a set number of individual
    Transformer layers per pipeline stage"): the first n layers of every stage are full."""
    e = est(training__recompute_num_layers=5)
    for s in e.stages:
        body = [(l.mode, l.count_value) for l in s.layers if l.block == "decoder"]
        assert body == [("full", 5), ("none", 7)]
    full, none = decoder_act(e, "full"), decoder_act(e, "none")
    assert e.stages[1].moments["warmup"] == 3 * (5 * full + 7 * none)
    per_stage = est(training__recompute_num_layers=[0, 12, 3, 1], training__recompute="selective")
    assert [[(l.mode, l.count_value) for l in s.layers if l.block == "decoder"] for s in per_stage.stages] == [
        [("selective", 12)], [("full", 12)], [("full", 3), ("selective", 9)], [("full", 1), ("selective", 11)]]


def test_recompute_num_layers_counts_per_model_chunk():
    """With VPP each model chunk is its own TransformerBlock in Megatron, so the block method
    recomputes the first n layers of every chunk."""
    e = est(parallel__vpp=2, training__recompute_num_layers=2)
    for s in e.stages:
        for c in (0, 1):
            assert [(l.mode, l.count_value) for l in s.layers if l.chunk == c and l.block == "decoder"] == [
                ("full", 2), ("none", 4)]


def test_recompute_per_stage_and_per_layer():
    e = est(training__recompute=["full", "selective", "none", "full"])
    assert [{l.mode for l in s.layers if l.block == "decoder"} for s in e.stages] == [
        {"full"}, {"selective"}, {"none"}, {"full"}]
    modes = ["full"] * 10 + ["none"] * 30 + ["selective"] * 8
    e = est(training__recompute_layers=modes)
    got = [l.mode for s in e.stages for l in s.layers if l.block == "decoder" for _ in range(l.count_value)]
    assert got == modes


@pytest.mark.parametrize("key,value,message", [
    ("recompute", ["full", "none"], "'training.recompute' lists 2 modes but there are 4 pipeline stages"),
    ("recompute", "fulll", "'training.recompute' must be one of none, selective, full"),
    ("recompute", ["full", "none", "nope", "full"], "'training.recompute' entry 2 is 'nope'"),
    ("recompute_layers", ["full"] * 47, "'training.recompute_layers' lists 47 modes but the stack has 48"),
    ("recompute_layers", ["full"] * 47 + ["ful"], "'training.recompute_layers' entry 47 is 'ful'"),
    ("recompute_num_layers", [1, 2], "'training.recompute_num_layers' must be a non-negative integer"),
    ("recompute_num_layers", -1, "'training.recompute_num_layers' must be a non-negative integer"),
])
def test_recompute_config_errors_name_the_key(key, value, message):
    with pytest.raises(MemformError) as exc:
        est(**{f"training__{key}": value})
    assert message in str(exc.value)


# ------------------------------------------------------------------ ZeRO / FSDP

ZERO_MF = """
include "common.mf"
symbol psi : real = model.params "parameters per layer"
block blob extends layer { params = psi }
stack { blob * 4 }
"""


@pytest.fixture
def zero_model(tmp_path: Path):
    """A model of 4 identical layers of psi parameters, defined in a formula file of the test."""
    mf = tmp_path / "blob.mf"
    mf.write_text(ZERO_MF)

    def make(**parallel):
        return {"name": "blob", "formulas": [str(mf)], "model": {"params": 7.5e9 / 4},
                "parallel": {"dp": 64, **parallel},
                "training": {"num_micro_batches": 4, "precision": {"grads": "fp16"}}}
    return make


@pytest.mark.parametrize("zero,gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_table_1(zero_model, zero, gb):
    """ZeRO (Rajbhandari et al. 2020) Table 1 / Figure 1: Ψ = 7.5B, K = 12, N_d = 64:
    120 GB, 31.4 GB (P_os), 16.6 GB (P_os+g), 1.9 GB (P_os+g+p) of model states per device."""
    e = numbers(zero_model(zero=zero))
    assert round(e.stages[0].static_bytes / 1e9, 1) == gb


def test_fsdp_reshard_vs_no_reshard(zero_model):
    """PyTorch FSDP (Zhao et al. 2023): with resharding (FULL_SHARD) a unit's parameters are
    gathered for its use and freed, at most the current and one prefetched unit live (§3.3.2
    prefetching, §3.4 rate limiter); reshard_after_forward=False (SHARD_GRAD_OP, §3.2.1) keeps
    every gathered unit from forward to backward next to its shard."""
    psi = Fraction(7_500_000_000, 4)
    on = numbers(zero_model(zero=3)).stages[0]
    off = numbers(zero_model(zero=3, reshard_after_forward=False)).stages[0]
    assert on.values["params"] == 4 * psi * 2 / 64
    assert on.values["comm"] == 2 * psi * 2 + psi * 2   # current + prefetched, + a layer's grads
    assert off.values["params"] == 4 * psi * 2 / 64 + 4 * psi * 2
    assert off.values["comm"] == psi * 2
    deeper = numbers(zero_model(zero=3, prefetch_layers=2, overlap_grad_reduce=True)).stages[0]
    assert deeper.values["comm"] == 3 * psi * 2 + 2 * psi * 2


def test_zero_shard_limit_and_unsharded_accumulation(zero_model):
    """MemEst os_max_shard (memest-formulas.md §3.3: optimizer ranks ≤ os_max_shard) and MindSpore
    gradient_accumulation_shard=False (a full accumulation buffer held across micro-batches)."""
    psi = Fraction(7_500_000_000)
    limited = numbers(zero_model(zero=1, zero_shard_max=8)).stages[0]
    assert limited.values["optimizer"] == 12 * psi / 8
    accum = numbers(zero_model(zero=2, grad_accumulation_shard=False)).stages[0]
    assert accum.values["grads"] == 2 * psi
    single = zero_model(zero=2, grad_accumulation_shard=False)
    single["training"]["num_micro_batches"] = 1
    assert numbers(single).stages[0].values["grads"] == 2 * psi / 64


# ------------------------------------------------------------------ moments in the DSL

@pytest.mark.regression
def test_moments_are_declared_in_formula_files(tmp_path: Path):
    """A schedule written in a test file: its own moments decide the peak and its name is reported.

    Regression test, not a reference: the backward transient (2·2·f + 2·h)·s·b is restated from dense.mf
    (mlp.bwd_grads: the SwiGLU's 3·2·s·b·f gradients less fc2's released input, 2·s·b·f, plus the layer
    output's gradient mlp_dy, 2·s·b·h). What checks that term independently is the PyTorch harness's activation peak
    (bench/validate.py, tests/test_validate.py: within memform.validation.compare.THRESHOLDS, not exact).
    """
    mf = tmp_path / "mine.mf"
    mf.write_text('include "dense.mf"\n'
                  'schedule flat extends 1f1b {\n'
                  '  inflight = 1\n'
                  '  moment early = 3 * layers_sum(act)\n'
                  '  moment late = layers_max(act) + layers_sum(if mode == "none" then act else 0)\n'
                  '}\n')
    cfg = config(formulas=[str(mf)], parallel__pp_schedule="flat")
    e = numbers(cfg)
    s = e.stages[1]
    act = decoder_act(e)
    bwd = (2 * 2 * 4096 + 2 * 1024) * 2048 * 1   # the SwiGLU backward's gradients (dense.mf mlp.bwd_grads)
    assert s.moments == {"warmup": 12 * act, "backward": 13 * act + bwd, "early": 36 * act, "late": 13 * act}
    assert s.peak_moment == "early" and s.values["activations"] == 36 * act


def test_layers_reductions_only_in_schedules(tmp_path: Path):
    mf = tmp_path / "bad.mf"
    mf.write_text('include "dense.mf"\nlet x = layers_sum(act)\n')
    with pytest.raises(MemformError, match="only be used in schedule blocks"):
        numbers(config(formulas=[str(mf)]))
    mf.write_text('include "dense.mf"\nlet x = (h where nosuch = 2)\n')
    with pytest.raises(MemformError, match="'nosuch' is not one"):
        numbers(config(formulas=[str(mf)]))


def test_cli_json_reports_the_peak_moment(tmp_path: Path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config(parallel__vpp=2, parallel__pp_schedule="zero-bubble-v")))
    out = subprocess.run([*memform_command(), "estimate", str(path), "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    stages = json.loads(out.stdout)["stages"]
    assert {s["peak_moment"] for s in stages} <= {"warmup", "backward"}
    assert all(s["breakdown"]["activations"] == max(s["moments"].values()) for s in stages)
    bad = subprocess.run([*memform_command(), "estimate", str(path), "--set", "training.recompute=[full]"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "training.recompute" in bad.stderr and "Traceback" not in bad.stderr


# ------------------------------------------------------------------ properties

SCHEDULES = ["1f1b", "gpipe", "interleaved-memest", "interleaved-less-memory", "zero-bubble-v", "dualpipev",
             "seqpipe"]
FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

shapes = st.fixed_dictionaries({
    "heads": st.sampled_from([8, 16, 32]),
    "head_dim": st.sampled_from([64, 128]),
    "layers": st.sampled_from([8, 16, 24]),
    "seq": st.sampled_from([512, 2048, 4096]),
    "m": st.integers(1, 12),
    "flash": st.booleans(),
    "dropout": st.booleans(),
})


def shaped(sh: dict, **overrides) -> dict:
    cfg = config(model__hidden_size=sh["heads"] * sh["head_dim"], model__num_heads=sh["heads"],
                 model__num_kv_heads=sh["heads"] // 4, model__ffn_hidden_size=4 * sh["heads"] * sh["head_dim"],
                 model__num_layers=sh["layers"], model__seq_length=sh["seq"], model__flash_attention=sh["flash"],
                 model__dropout=sh["dropout"], training__num_micro_batches=sh["m"], **overrides)
    return cfg


_BASE_MODEL = load_model(config(), numeric=True)


def fast(cfg: dict):
    """Estimate ``cfg`` reusing the parsed formulas of BASE (same formula files)."""
    flat = {}

    def walk(node, prefix):
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                flat[f"{prefix}{k}"] = v
    walk(cfg, "")
    flat.pop("name", None)
    return estimate_model(rebind(_BASE_MODEL, flat))


@FAST
@given(sh=shapes, pp=st.sampled_from([1, 2, 4]), zero=st.integers(0, 2), dp=st.sampled_from([2, 8]))
def test_static_bytes_never_grow_with_more_pp_or_zero(sh, pp, zero, dp):
    """More pipeline stages or a higher ZeRO stage never raise a device's static bytes (ZeRO §5)."""
    def worst_static(**kw):
        return max(s.static_bytes for s in fast(shaped(sh, parallel__dp=dp, **kw)).stages)
    assert worst_static(parallel__pp=2 * pp, parallel__zero=zero) <= worst_static(parallel__pp=pp, parallel__zero=zero)
    assert worst_static(parallel__pp=pp, parallel__zero=zero + 1) <= worst_static(parallel__pp=pp, parallel__zero=zero)


@FAST
@given(sh=shapes, schedule=st.sampled_from(SCHEDULES), seq_chunks=st.sampled_from([1, 2, 4]))
def test_recompute_full_le_selective_le_none(sh, schedule, seq_chunks):
    """Recomputing more never stores more (Korthikanti et al. 2022 Table 2), at every stage's peak."""
    vpp = 2 if schedule in ("zero-bubble-v", "dualpipev", "interleaved-memest", "interleaved-less-memory") else 1
    acts = {}
    for mode in ("none", "selective", "full"):
        e = fast(shaped(sh, parallel__pp=2, parallel__vpp=vpp, parallel__pp_schedule=schedule,
                        parallel__seq_chunks=seq_chunks, training__recompute=mode))
        acts[mode] = [s.values["activations"] for s in e.stages]
    for i in range(2):
        assert acts["full"][i] <= acts["selective"][i] <= acts["none"][i]


@FAST
@given(sh=shapes, schedule=st.sampled_from(SCHEDULES), mode=st.sampled_from(["none", "selective", "full"]))
def test_peak_over_moments_is_at_least_the_warmup(sh, schedule, mode):
    vpp = 2 if schedule in ("zero-bubble-v", "dualpipev") else 1
    e = fast(shaped(sh, parallel__pp=2, parallel__vpp=vpp, parallel__pp_schedule=schedule, training__recompute=mode))
    for s in e.stages:
        assert s.values["activations"] == max(s.moments.values()) >= s.moments["warmup"]
        assert s.peak_moment in s.moments and s.moments[s.peak_moment] == s.values["activations"]


@pytest.mark.parametrize("n, vp", [(1, 1), (4, 1), (2, 2), (4, 3)])
def test_seqpipe_bubble_is_p_minus_1_idle_pieces(n, vp):
    """Seq1F1B's bubble (Sun et al. 2024 §3.1): the pipeline fills with sequence pieces, p - 1 idle slots
    of 1/n of a micro-batch each, over vp chunks: (p - 1)/(vp·n) micro-batch times per step; time.mf
    prices a micro-batch slot as the stage's per-micro-batch compute, memory and exposed traffic / m."""
    p, m = 4, 16
    cfg = config(parallel__pp_schedule="seqpipe", parallel__seq_chunks=n, parallel__vpp=vp)
    cfg["device"] = {"preset": "h100-sxm"}
    for stage in numbers(cfg).to_dict()["stages"]:
        parts = stage["time"]["parts"]
        # (+ contention: the slowdown beside the overlapped sends; one data-parallel rank, so none of it is DP's)
        assert parts["dp"] == 0
        slot = sum(parts[k] for k in ("compute", "memory", "tp", "cp", "ep", "pp", "host", "contention")) / m
        assert parts["bubble"] == pytest.approx((p - 1) / (vp * n) * slot, rel=1e-9), stage["stage"]
