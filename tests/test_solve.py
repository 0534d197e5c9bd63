"""``memform solve`` and ``memform sensitivity``.

Every answer is checked against the interpreter evaluating the config with the answer (and
its neighbours) substituted, independently of the closed form used to find it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sympy
from cli_helpers import run_memform as _memform

import memform
from memform.analysis.solve import sensitivity, solve
from memform.api import load_model

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"



def _fits(config: Path, key: str, value: int) -> bool | None:
    """Interpreter's verdict on the allocated peak for one value (what solve bounds; the caching allocator's
    reserve is a replay, added to solve's answer as a note); None where the value is not a valid config."""
    try:
        est = memform.estimate(config, {key: value, "parallel.devices": None})
    except memform.MemformError:
        return None
    return est.peak_bytes <= est.capacity_bytes


#: (config, key, extra overrides): the answer must fit, the next valid value must not
CASES = [
    ("llama3-70b.yaml", "training.micro_batch_size", {}),          # b couples to m via global_batch_size
    ("llama3-70b.yaml", "model.seq_length", {}),
    ("llama3-70b.yaml", "parallel.tp", {}),                         # smallest degree
    ("gpt3-175b.yaml", "training.micro_batch_size", {"training.global_batch_size": None}),
    ("llama3-8b.yaml", "model.seq_length", {"parallel.sequence_parallel": False, "model.flash_attention": False}),
    ("llama3-70b.yaml", "parallel.pp", {}),                         # structural: re-partitioned per value
]


@pytest.mark.parametrize("config,key,extra", CASES, ids=[f"{c}:{k}" for c, k, _ in CASES])
def test_solve_answer_is_the_boundary(config, key, extra, tmp_path):
    path = CONFIGS / config
    model = load_model(path, extra)
    sol = solve(model, key)
    assert sol.value is not None
    # check with the interpreter, on a config file that carries the extra overrides
    cfg = tmp_path / config
    import yaml
    data = yaml.safe_load(path.read_text())
    for k, v in extra.items():
        node = data
        *head, last = k.split(".")
        for part in head:
            node = node.setdefault(part, {})
        node[last] = v
    cfg.write_text(yaml.safe_dump(data))
    assert _fits(cfg, key, sol.value) is True
    assert max(sol.stage_peaks) <= sol.capacity_bytes
    assert sol.other_value is not None
    assert _fits(cfg, key, sol.other_value) is False
    assert max(sol.other_peaks) > sol.capacity_bytes
    assert sol.other_peaks[sol.binding_stage] == max(sol.other_peaks)
    lo, hi = sorted((sol.value, sol.other_value))
    for between in range(lo + 1, min(hi, lo + 50)):   # nothing valid is skipped in between
        assert _fits(cfg, key, between) is None
    if sol.closed_form is not None:
        # the binding stage's closed form reproduces its peak at the answer (up to the per-category
        # rounding to whole bytes), and its continuous root lies between the answer and its neighbour
        (x,) = sol.closed_form.free_symbols or {sympy.Symbol(sol.symbol)}
        at = sol.closed_form.xreplace({x: sol.value})
        assert 0 <= sol.stage_peaks[sol.binding_stage] - at < len(memform.api.CATEGORIES)
        if sol.continuous:
            assert lo <= float(sol.continuous[0]) <= hi


def test_solve_seq_length_closed_form_matches_root():
    """peak(s) = capacity at the reported root, exactly (the closed form is linear with flash attention)."""
    model = load_model(CONFIGS / "llama3-70b.yaml")
    sol = solve(model, "model.seq_length")
    s = next(iter(sol.closed_form.free_symbols))
    assert sol.closed_form.xreplace({s: sol.continuous[0]}) == sol.capacity_bytes
    assert sol.value == int(sol.continuous[0]) or sol.value < sol.continuous[0]


def test_solve_unbounded_and_nothing_fits():
    model = load_model(CONFIGS / "llama3-70b.yaml")
    sol = solve(model, "training.num_micro_batches", limit=4096)
    assert sol.unbounded and sol.value == 4096  # 1F1B keeps at most p micro-batches (schedules.mf)
    tiny = load_model(CONFIGS / "llama3-70b.yaml", {"device.capacity_gib": 1})
    sol = solve(tiny, "training.micro_batch_size")
    assert sol.value is None and max(sol.other_peaks) > sol.capacity_bytes


def test_sensitivity_matches_one_step_of_the_interpreter():
    path = CONFIGS / "llama3-70b.yaml"
    ov = {"training.global_batch_size": None, "training.num_micro_batches": 8}
    model = load_model(path, ov)
    key, sym, rows, _ = sensitivity(model, "b")
    assert key == "training.micro_batch_size"
    a = memform.estimate(path, dict(ov, **{key: 1}))
    b = memform.estimate(path, dict(ov, **{key: 2}))
    for r, s1, s2 in zip(rows, a.stages, b.stages):
        assert r.step == s2.peak_bytes - s1.peak_bytes
        assert r.value == r.step  # activations and comm are linear in b (Korthikanti §4)
        assert r.value > 0


def test_cli_solve_and_sensitivity():
    cfg = str(CONFIGS / "llama3-70b.yaml")
    r = _memform("solve", cfg, "--for", "training.micro_batch_size")
    assert r.returncode == 0, r.stderr
    assert "largest training.micro_batch_size (b) that fits" in r.stdout and "binding stage: 0" in r.stdout
    r = _memform("solve", cfg, "--for", "s", "--json")
    data = json.loads(r.stdout)
    assert data["key"] == "model.seq_length" and data["value"] > 8192
    assert _fits(Path(cfg), "model.seq_length", data["value"]) is True
    r = _memform("solve", cfg, "--for", "b", "--set", "device.capacity_gib=1")
    assert r.returncode == 1 and "nothing fits" in r.stdout
    r = _memform("solve", cfg, "--for", "training.micro_batch")
    assert r.returncode == 2 and "did you mean 'training.micro_batch_size'" in r.stderr
    assert "Traceback" not in r.stderr
    r = _memform("sensitivity", cfg, "--wrt", "b", "--wrt", "model.seq_length")
    assert r.returncode == 0, r.stderr
    assert "sensitivity of each stage's peak to training.micro_batch_size" in r.stdout
    assert "model.seq_length" in r.stdout


def test_solve_answers_only_values_every_requirement_accepts():
    """llama3-70b (tp 8 with sequence parallelism): memory alone allows s = 23221, but Megatron splits
    the sequence over the tp ranks (Korthikanti et al. 2022 §4.2.2), so the answer is a multiple of 8
    and the output names the requirement that shaped it."""
    model = load_model(CONFIGS / "llama3-70b.yaml")
    sol = solve(model, "model.seq_length")
    assert sol.value % 8 == 0
    assert sol.refused_value is not None and sol.value < sol.refused_value < sol.other_value
    assert any("sequence_parallel" in r for r in sol.refused_by)
    memform.estimate(CONFIGS / "llama3-70b.yaml", {"model.seq_length": sol.value})  # accepted
    with pytest.raises(memform.MemformError, match="sequence_parallel"):
        memform.estimate(CONFIGS / "llama3-70b.yaml", {"model.seq_length": sol.refused_value})
    # a degree: tp 5..7 would fit in memory (the closed form crosses the capacity at t = 4.05, printed
    # below), but do not divide the 64 heads: memory's limit is t = 5, not the nearest refused t = 7
    tp = solve(model, "parallel.tp")
    assert tp.value == 8 and tp.refused_value == 5 and tp.refused_values == [5, 6, 7]
    assert any("num_heads" in r for r in tp.refused_by)
    # (4.04782 until stop 49's MLP backward -- dense.mf mlp.bwd_grads: fc2's input released, the layer output's
    # gradient counted -- moved the activations)
    assert [float(r) for r in tp.continuous] == pytest.approx([4.04391], rel=1e-5)
    r = _memform("solve", "configs/llama3-70b.yaml", "--for", "parallel.tp")
    assert "memory alone would allow t = 5; t = 5, 6, 7 are refused: parallel.tp must divide" in r.stdout, r.stdout
    r = _memform("solve", "configs/llama3-70b.yaml", "--for", "model.seq_length")
    assert r.returncode == 0 and "shaped by requirements: memory alone would allow s = " in r.stdout, r.stdout + r.stderr
    out = json.loads(_memform("solve", "configs/llama3-70b.yaml", "--for", "model.seq_length", "--json").stdout)
    assert out["refused_value"] == sol.refused_value and out["refused_by"] == sol.refused_by
    assert out["refused_values"] == sol.refused_values and sol.refused_values[-1] == sol.refused_value


def test_ring_context_parallelism_needs_two_cp_chunks_of_the_sequence(gpt3):
    """Ring CP cuts the sequence into 2·cp chunks (Megatron-LM get_batch_on_this_cp_rank), and runs fused
    attention only (megatron-core 0.19.2 transformer/dot_product_attention.py:57 asserts
    context_parallel_size == 1 for the unfused core; Transformer Engine disables its unfused kernel
    under CP); Ulysses' all-to-all takes any kernel."""
    gpt3["model"]["flash_attention"] = True
    gpt3["model"]["seq_length"] = 2 * 4 * 255 + 4  # divisible by cp = 4, not by 2·cp = 8
    gpt3["parallel"]["cp"] = 4
    with pytest.raises(memform.MemformError, match="2 × parallel.cp"):
        memform.estimate(gpt3)
    gpt3["model"]["seq_length"] = 2048
    memform.estimate(gpt3)
    gpt3["model"]["flash_attention"] = False   # configs/gpt3-175b.yaml: Korthikanti's eager core
    with pytest.raises(memform.MemformError, match=r"needs fused attention \(model\.flash_attention: true\)"):
        memform.estimate(gpt3)
    gpt3["parallel"]["cp_algo"] = "ulysses"
    memform.estimate(gpt3)


# ------------------------------------------------------------------------- the on-disk store

def _counting_build(monkeypatch) -> list[int]:
    """Count CompiledModel.build calls in this process (solve compiles one structure here)."""
    from memform.fastpath.compiled import CompiledModel
    real = CompiledModel.build.__func__
    calls: list[int] = []
    monkeypatch.setattr(CompiledModel, "build", classmethod(lambda cls, *a, **k: calls.append(1) or real(cls, *a, **k)))
    return calls


def test_a_second_solve_reads_the_compiled_structure_from_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMFORM_CACHE_DIR", str(tmp_path / "cache"))
    calls = _counting_build(monkeypatch)
    path = CONFIGS / "llama3-70b.yaml"
    first = solve(load_model(path), "training.micro_batch_size")
    assert len(calls) == 1
    entries = sorted((tmp_path / "cache" / "solve").rglob("*.json"))
    assert len(entries) == 1
    again = solve(load_model(path), "training.micro_batch_size")
    assert len(calls) == 1  # read back: no sympy closed forms compiled again
    assert (again.value, again.stage_peaks, again.other_value, again.other_peaks, again.binding_stage) == \
        (first.value, first.stage_peaks, first.other_value, first.other_peaks, first.binding_stage)
    assert (again.refused_value, again.refused_by) == (first.refused_value, first.refused_by)
    # any other config value is part of the structure: its own entry
    solve(load_model(path, {"model.seq_length": 4096}), "training.micro_batch_size")
    assert len(calls) == 2
    # sensitivity's one-step difference compiles its own structure once, then reads it back
    sensitivity(load_model(path), "b")
    sensitivity(load_model(path), "b")
    assert len(calls) == 3
    # cache=False compiles afresh and writes nothing
    uncached = solve(load_model(path), "training.micro_batch_size", cache=False)
    assert len(calls) == 4 and uncached.value == first.value
    assert len(sorted((tmp_path / "cache" / "solve").rglob("*.json"))) == 3
    # a corrupt entry is ignored and rebuilt, never trusted
    entries[0].write_text(entries[0].read_text().replace('"stages": ', '"stages": 1'))
    rebuilt = solve(load_model(path), "training.micro_batch_size")
    assert len(calls) == 5 and rebuilt.value == first.value


def test_a_refused_structure_keeps_its_error_with_the_store(tmp_path, monkeypatch):
    """A structure memform refuses is stored as refused; solving it again gives the same error
    (the interpreter's own, with its location where it has one)."""
    monkeypatch.setenv("MEMFORM_CACHE_DIR", str(tmp_path / "cache"))
    model = load_model(CONFIGS / "llama3-70b.yaml", {"parallel.pp": 3})  # 80 layers over 3 stages
    messages = []
    for _ in range(2):
        with pytest.raises(memform.MemformError) as info:
            solve(model, "training.micro_batch_size")
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "do not split evenly" in messages[0]
    (entry,) = sorted((tmp_path / "cache" / "solve").rglob("*.json"))
    stored = json.loads(entry.read_text())
    assert stored["body"] is None and "do not split evenly" in stored["reason"]


def test_closed_form_conditions_are_checked_at_every_admissible_value():
    # llama3-70b, smallest tp that fits: requirements admit t = 1, 2, 4, 8 (heads, kv heads, vocabulary,
    # sequence and ffn width divisible). Conditions every one of them satisfies (t <= 8, t divides 16, the
    # padded vocabulary's ceiling comparisons) say nothing and leave the default view; "t > 2" stays, and
    # the closed form is the binding stage's peak exactly at the values where every condition holds
    model = load_model(CONFIGS / "llama3-70b.yaml")
    sol = solve(model, "parallel.tp")
    assert sol.value == 8 and sol.admissible == [1, 2, 4, 8]
    from memform.engine.symbolic import assumption_lines, simplify_assumptions, split_on_domain
    open_, implied, valid = split_on_domain(simplify_assumptions(sol.assumptions), "t", sol.admissible)
    assert "t > 2" in open_ and "t <= 8" in implied and len(implied) >= 5
    assert valid == [4, 8]
    for v in valid:  # where the conditions hold, the closed form is the interpreter's peak
        est = memform.estimate(CONFIGS / "llama3-70b.yaml", overrides={"parallel.tp": v, "parallel.devices": None})
        closed = sol.closed_form.xreplace({s: v for s in sol.closed_form.free_symbols if s.name == "t"})
        assert int(closed) == est.stages[sol.binding_stage].peak_bytes, v
    where = assumption_lines(sol.assumptions, domain=("t", sol.admissible))[1:]
    assert len(where) <= 5 and all(len(line) <= 100 for line in where), where
    assert "  so the closed form is the peak at t = 4, 8 of the admissible 1, 2, 4, 8" in where
    full = assumption_lines(sol.assumptions, shown=None, domain=("t", sol.admissible))
    assert sum(line.endswith("(holds at every admissible t)") for line in full) == len(implied)
    # the console script prints the same lines
    out = _memform("solve", str(CONFIGS / "llama3-70b.yaml"), "--for", "parallel.tp").stdout
    assert "\n".join("  " + line for line in where) in out
