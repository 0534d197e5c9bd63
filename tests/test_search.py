"""Compiled (exact, vectorized) evaluation and the strategy search.

The reference for every number here is the interpreter itself, reached independently of the
compiled path: ``memform.estimate(config_file, overrides)`` reloads the config and walks the
stage partition for one candidate (the engine's own reference cases cite the papers).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import sympy
from cli_helpers import run_memform as _memform
from hypothesis import given, settings
from hypothesis import strategies as st

import memform
from memform.fastpath.compiled import NUMERIC_KEYS, CompiledModel
from memform.fastpath.exact import INT64_SAFE, NotExact, compile_exact
from memform.analysis.search import default_space, divisors, rank, search
from memform.api import load_model
from memform.engine.interpreter import CATEGORIES

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"



# --------------------------------------------------------------------------- exact.py

x, y, z = sympy.symbols("x y z", integer=True, positive=True)

_leaf = st.one_of(st.sampled_from([x, y, z]),
                  st.fractions(min_value=-50, max_value=50, max_denominator=12).map(sympy.Rational))


def _combine(children):
    pair = st.tuples(children, children)
    return st.one_of(
        pair.map(lambda ab: ab[0] + ab[1]),
        pair.map(lambda ab: ab[0] * ab[1]),
        pair.map(lambda ab: ab[0] / (ab[1] ** 2 + 1)),       # never divides by zero
        pair.map(lambda ab: sympy.Min(ab[0], ab[1])),
        pair.map(lambda ab: sympy.Max(ab[0], ab[1])),
        pair.map(lambda ab: sympy.Piecewise((ab[0], ab[0] > ab[1]), (ab[1], True))),
        children.map(sympy.ceiling),
        children.map(sympy.floor),
        children.map(sympy.Abs),
        pair.map(lambda ab: sympy.Mod(ab[0], sympy.Abs(ab[1]) + 1)),
    )


_exprs = st.recursive(_leaf, _combine, max_leaves=8)


@settings(max_examples=60, deadline=None)
@given(expr=_exprs, values=st.lists(st.tuples(st.integers(1, 10 ** 4), st.integers(1, 10 ** 4),
                                                 st.integers(1, 10 ** 4)), min_size=1, max_size=8))
def test_exact_matches_sympy_rationals(expr, values):
    """ceil of any rational/min/max/piecewise/floor/mod expression, exactly as sympy computes it."""
    fn = compile_exact([expr], [x, y, z])
    cols = [np.array([v[i] for v in values]) for i in range(3)]
    (out,), bad = fn(cols)
    for k, (a, b, c) in enumerate(values):
        want = sympy.ceiling(expr.xreplace({x: a, y: b, z: c}))
        assert not bad[k]
        assert int(out[k]) == int(want), (expr, (a, b, c))


def test_exact_falls_back_to_python_ints_beyond_int64():
    """~1e30 intermediate values: evaluated on object arrays, still exact."""
    expr = (x * 10 ** 12) ** 3 / (y * 7) + sympy.Rational(1, 3)
    fn = compile_exact([expr], [x, y])
    xs, ys = np.array([1, 999_983, 10 ** 6]), np.array([1, 3, 10 ** 5])
    (out,), _ = fn([xs, ys])
    for k in range(3):
        assert int(out[k]) == int(sympy.ceiling(expr.xreplace({x: int(xs[k]), y: int(ys[k])})))
    assert (10 ** 36) > INT64_SAFE  # the test exercises the guarded path


def test_rows_that_fit_int64_stay_int64_when_the_batch_bound_does_not():
    """x·y·10⁹ over rows (10⁹, 1) and (1, 10⁹): the batch-wide bound, 10²⁷, leaves int64, each row's
    value (10¹⁸) fits: the rows' own bounds let the int64 result stand (no Python ints); a row that
    really leaves int64 still comes out exact."""
    expr = x * y * 10 ** 9
    fn = compile_exact([expr], [x, y])
    (out,), _ = fn([np.array([10 ** 9, 1]), np.array([1, 10 ** 9])])
    assert out.dtype == np.int64 and out.tolist() == [10 ** 18, 10 ** 18]
    (out,), _ = fn([np.array([10 ** 9, 10 ** 9]), np.array([1, 10 ** 9])])
    assert [int(v) for v in out] == [10 ** 18, 10 ** 27]


def test_approximate_outputs_are_float64_with_exact_conditions():
    """Step-time-like outputs: constants with huge common denominators, computed in float64 (relative
    error ~1e-15) while the branch conditions stay exact; rows dividing by zero or with no branch are bad."""
    flops = x * 10 ** 15 * sympy.Rational(3, 7)
    rate = sympy.Rational(989_000_000_000_000) * sympy.Rational(869, 1000)
    expr = 10 ** 12 * (flops / rate + sympy.Max(0, y * sympy.Rational(10 ** 9, 450_000_000_001) - x / rate)
                       + sympy.Piecewise((1 / (x - 3), x > y), (sympy.Rational(1, 3), True)))
    partial = sympy.Piecewise((x, x > 2))
    xs, ys = np.array([1, 5, 3, 7]), np.array([2, 1, 2, 7])
    (exact_out, partial_exact), bad_exact = compile_exact([expr, partial], [x, y])([xs, ys])
    (approx_out, partial_approx), bad = compile_exact([expr, partial], [x, y], [True, True])([xs, ys])
    assert approx_out.dtype == np.float64
    assert bad.tolist() == bad_exact.tolist() == [True, False, True, False]   # x = 3 > y: 1 / 0; x = 1: no branch
    for k in (1, 3):
        assert float(approx_out[k]) == pytest.approx(int(exact_out[k]), rel=1e-14)
        assert float(partial_approx[k]) == int(partial_exact[k])


def test_exact_conditions_and_zero_denominators():
    fn = compile_exact([sympy.Eq(sympy.Mod(64, x), 0), 5 / (x - y)], [x, y])
    (divides, val), bad = fn([np.array([8, 3, 4]), np.array([1, 2, 4])])
    assert divides.tolist() == [True, False, True]
    assert bad.tolist() == [False, False, True]          # 5 / (4 - 4)
    assert val[:2].tolist() == [1, 5]                       # ceil(5/7), 5/1


def test_exact_refuses_what_integers_cannot_do():
    with pytest.raises(NotExact):
        compile_exact([sympy.log(x)], [x])
    with pytest.raises(NotExact):
        compile_exact([sympy.sqrt(x)], [x])


# --------------------------------------------------------------------------- compiled vs interpreted

_NUMERIC = {"parallel.dp": [1, 2, 3, 4, 8, 16], "parallel.tp": [1, 2, 3, 4, 8, 16], "parallel.cp": [1, 2],
            "parallel.ep": [1, 2, 4, 8], "training.micro_batch_size": [1, 2, 3],
            "training.num_micro_batches": [1, 2, 3, 7, 16]}
#: (config, structural choices sampled at random, numeric values that differ from _NUMERIC)
AGREEMENT = [
    ("llama3-70b.yaml", {"parallel.pp": [1, 2, 4, 8], "training.recompute": ["none", "selective", "full"],
                         "parallel.zero": [0, 1, 2, 3]}, {}),
    # eager attention: ring CP 2 is refused (dense.mf: fused attention only), both sides must agree on it
    ("gpt3-175b.yaml", {"parallel.pp": [4, 8], "training.recompute": ["none", "full"],
                        "parallel.zero": [0, 3], "parallel.pp_schedule": ["1f1b", "gpipe"]},
     {"parallel.cp": [1, 1, 1, 2]}),
    # MoE with tp > 1 needs sequence parallelism (moe.mf); expert_tp follows tp by default
    ("mixtral-8x7b.yaml", {"parallel.pp": [1, 2], "training.recompute": ["none", "full"], "parallel.zero": [0, 1]},
     {"parallel.tp": [1, 1, 2], "parallel.dp": [4, 8, 16], "parallel.sequence_parallel": [True]}),
]


@pytest.mark.parametrize("config,structural,numeric", AGREEMENT, ids=[a[0] for a in AGREEMENT])
def test_compiled_agrees_exactly_with_interpreter(config, structural, numeric):
    """Random candidates: same validity, same whole bytes per stage and category."""
    path = CONFIGS / config
    if not path.exists():
        pytest.skip(f"{config} not present")
    rng = np.random.default_rng(1234)
    base = load_model(path, {"training.global_batch_size": None, "parallel.devices": None})
    keys = tuple(k for k in NUMERIC_KEYS if base.symbol_for_key(k) is not None)
    ranges = dict(_NUMERIC, **numeric)
    checked = refused = 0
    for _ in range(3):
        choice = {k: v[rng.integers(len(v))] for k, v in structural.items()}
        choice.update({k: v[0] for k, v in ranges.items() if k not in NUMERIC_KEYS})
        try:
            cm = CompiledModel.build(memform.api.rebind(base, choice, check=False), keys)
        except memform.MemformError:
            continue
        n = 10
        cols = {k: rng.choice(ranges[k], n) for k in keys}
        batch = cm(cols)
        for i in range(n):
            overrides = dict(choice, **{k: int(cols[k][i]) for k in keys})
            try:
                # the interpreter, one candidate at a time (config re-bound, partition re-walked)
                est = memform.estimate_model(memform.api.rebind(base, overrides), keep=frozenset())
            except memform.MemformError:
                refused += 1
                assert not batch.valid[i], overrides
                continue
            checked += 1
            assert batch.valid[i], overrides
            want = [[s.values[c] for c in CATEGORIES] for s in est.stages]
            assert batch.values[i].tolist() == want, overrides
            assert int(batch.peak[i]) == est.peak_bytes
            assert int(batch.peak_stage[i]) == est.peak_stage
            if batch.step_ps is not None:   # float64 step times: the estimate rounds each cost block up
                want_ps = max(s.step_ps for s in est.stages)
                assert float(batch.step_ps[i]) == pytest.approx(want_ps, rel=1e-12, abs=len(est.stages[0].time_ps))
                assert float(batch.ideal[i]) == pytest.approx(sum(s.ideal_ps for s in est.stages), rel=1e-12,
                                                              abs=len(est.stages))
                assert int(batch.tokens[i]) == est.stages[0].tokens
    assert checked >= 10  # the sample must actually compare numbers
    assert refused >= 1 or config != "llama3-70b.yaml"  # and exercise the requires (t = 3, 16)


# --------------------------------------------------------------------------- search


def _brute_force(path: Path, devices: int, space: dict, extra: dict) -> set[tuple]:
    """Every strategy of a small space, each estimated on its own by the interpreter (its numeric
    evaluator: the same walk of the formulas as sympy's, tests/test_numeric.py, without sympy's cost)."""
    fits = set()
    base = load_model(path, numeric=True)
    gbs = base.data["training"].get("global_batch_size")
    for pp in space["pp"]:
        for tp in space["tp"]:
            for dp in range(1, devices // (tp * pp) + 1):
                for zero in space["zero"]:
                    for rc in space["recompute"]:
                        for mbs in space["mbs"]:
                            if gbs and gbs % (mbs * dp):
                                continue
                            ov = {"parallel.pp": pp, "parallel.tp": tp, "parallel.dp": dp, "parallel.zero": zero,
                                  "training.recompute": rc, "training.micro_batch_size": mbs,
                                  "parallel.devices": None, **extra}
                            try:
                                est = memform.estimate_model(memform.api.rebind(base, ov))
                            except memform.MemformError:
                                continue
                            # search filters on the allocated peak (its vectorized path does not replay the
                            # caching allocator: README "Reserved memory")
                            if est.peak_bytes <= est.capacity_bytes:
                                fits.add((dp, tp, pp, zero, rc, mbs, est.peak_bytes))
    return fits


def test_search_finds_exactly_the_fitting_strategies():
    """A small space searched exhaustively by the interpreter gives the same set, peak for peak."""
    path = CONFIGS / "llama3-8b.yaml"
    space = {"pp": [1, 2], "tp": [1, 2, 4], "zero": [0, 3], "recompute": ["none", "full"], "mbs": [1, 4]}
    model = load_model(path, {"device.capacity_gib": 40})
    res = search(model, default_space(model, 8, tp=space["tp"], pp=space["pp"], zero=space["zero"],
                                      recompute=space["recompute"], micro_batch=space["mbs"], cp=[1]))
    got = {(r["dp"], r["tp"], r["pp"], r["zero"], r["recompute"], r["micro_batch_size"], r["peak_bytes"])
           for r in res.rows}
    want = _brute_force(path, 8, space, {"device.capacity_gib": 40})
    assert got == want
    assert 0 < len(got) < res.stats.evaluated  # something fits and something does not


def test_search_rows_respect_devices_requires_and_ranking():
    model = load_model(CONFIGS / "llama3-70b.yaml")
    small = {"pp": [1, 2, 4], "zero": [0, 3], "recompute": ["selective", "full"]}
    res = search(model, default_space(model, 64, **small))
    heads = model.data["model"]["num_kv_heads"]
    for r in res.rows:
        assert r["devices_used"] == r["dp"] * r["tp"] * r["pp"] * r["cp"] <= 64
        assert heads % r["tp"] == 0                      # require g % t == 0 (dense.mf)
        assert r["peak_bytes"] <= res.capacity_bytes
        assert 64 % r["micro_batch_size"] == 0 or r["micro_batch_size"] * r["dp"] * r["num_micro_batches"] == 64
    ranked = rank(res.rows)
    keys = [(r["devices_wasted"], r["peak_bytes"]) for r in ranked]
    assert keys == sorted(keys)
    for sort in (["devices_wasted", "peak_bytes"], ["-micro_batch_size", "recompute", "-zero", "peak_gib"]):
        assert res.ranked(sort, 50) == rank(res.rows, sort)[:50]   # column sort == dict sort
    exact = search(model, default_space(model, 64, exact_devices=True, **small))
    assert exact.rows and all(r["devices_wasted"] == 0 for r in exact.rows)


def test_divisors():
    assert divisors(12) == [1, 2, 3, 4, 6, 12]


# --------------------------------------------------------------------------- CLI


def test_cli_search_csv_json_and_errors(tmp_path):
    cfg = str(CONFIGS / "llama3-8b.yaml")
    # the memory ranking (the device's peak FLOP/s at 0: no time model; tests/test_search_time.py has the other)
    small = ["--pp", "1,2", "--zero", "0,3", "--recompute", "none,full", "--set", "device.peak_flops_bf16=0"]
    r = _memform("search", cfg, "--devices", "8", "--format", "csv", "--top", "0", "--no-progress", *small)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert rows and {"dp", "tp", "pp", "peak_bytes", "devices_wasted"} <= set(rows[0])
    peaks = [(int(x["devices_wasted"]), int(x["peak_bytes"])) for x in rows]
    assert peaks == sorted(peaks)
    first = rows[0]
    est = memform.estimate(cfg, {"parallel.dp": int(first["dp"]), "parallel.tp": int(first["tp"]),
                                 "parallel.pp": int(first["pp"]), "parallel.zero": int(first["zero"]),
                                 "training.recompute": first["recompute"],
                                 "training.micro_batch_size": int(first["micro_batch_size"]),
                                 "parallel.devices": None, "device.peak_flops_bf16": 0})
    assert est.peak_bytes == int(first["peak_bytes"])

    out = tmp_path / "s.json"
    r = _memform("search", cfg, "--devices", "8", "--format", "json", "-o", str(out),
                 "--sort=-micro_batch_size,peak_bytes", "--top", "5", "--progress", *small)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert len(data["rows"]) == 5 and data["stats"]["fitting"] >= 5
    mbs = [row["micro_batch_size"] for row in data["rows"]]
    assert mbs == sorted(mbs, reverse=True)
    assert "structures" in r.stderr  # the progress bar

    r = _memform("search", cfg, "--devices", "8", "--sort", "speed")
    assert r.returncode == 2 and "unknown field 'speed'" in r.stderr and "Traceback" not in r.stderr
    r = _memform("search", cfg, "--devices", "8", "--set", "device.capacity_gib=0.5", *small)
    assert r.returncode == 1 and "nothing fits" in r.stdout
    # a formula that fails for every candidate is an error (exit 2) with its reason, not "nothing fits"
    r = _memform("search", cfg, "--devices", "8", "--set", "model.num_heads=1", "--set", "model.num_kv_heads=1",
                 "--set", "parallel.tp=1", "--tp", "2", *small)
    assert r.returncode == 2 and "no valid strategy" in r.stderr and "Traceback" not in r.stderr


def test_cli_search_table():
    r = _memform("search", str(CONFIGS / "llama3-70b.yaml"), "--devices", "64", "--top", "3", "--pp", "4,8",
                 "--zero", "1", "--recompute", "selective", "--set", "device.peak_flops_bf16=0")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # within 100 columns (issue 32): the headline wraps, the plans stay one per line
    assert max(len(line) for line in lines) <= 100 and "strategies fit" in lines[0]
    at = next(i for i, line in enumerate(lines) if line.split()[:3] == ["dp", "tp", "pp"])
    assert len([line for line in lines[at + 1:] if line.split()[0].isdigit()]) == 3
    # --wide: nothing wrapped or cut, the headline on one line
    lines = _memform("search", str(CONFIGS / "llama3-70b.yaml"), "--devices", "64", "--top", "3", "--pp", "4,8",
                     "--zero", "1", "--recompute", "selective", "--set", "device.peak_flops_bf16=0",
                     "--wide").stdout.splitlines()
    assert "strategies fit" in lines[0] and lines[1].split()[:3] == ["dp", "tp", "pp"]
    assert len(lines) == 2 + 3 + 1
    # with the time model: the ranking line, why the first row won (issue 33), then the header and the plans
    r = _memform("search", str(CONFIGS / "llama3-70b.yaml"), "--devices", "64", "--top", "3", "--pp", "4,8",
                 "--zero", "1", "--recompute", "selective", "--wide")
    lines = r.stdout.splitlines()
    assert "ranked by estimated step time" in lines[1] and lines[2].startswith("first row: ")
    assert lines[3].split()[:3] == ["dp", "tp", "pp"] and "step s" in lines[3] and len(lines) >= 4 + 3


def test_uneven_pipeline_splits():
    """80 layers on 3 stages: a balanced split, extra layers last; the config's own split is kept
    for its own pp (DeepSeek-V3's 61 layers on 16 stages, MemEst's deepseek3 case)."""
    model = load_model(CONFIGS / "llama3-70b.yaml")
    res = search(model, default_space(model, 24, pp=[3], zero=[1], recompute=["full"], cp=[1], micro_batch=[1]))
    assert res.rows and {r["stage_layers"] for r in res.rows} == {"26,27,27"}
    r = res.rows[0]
    est = memform.estimate(CONFIGS / "llama3-70b.yaml", {
        "parallel.pp": 3, "parallel.stage_layers": [26, 27, 27], "parallel.dp": r["dp"], "parallel.tp": r["tp"],
        "parallel.zero": 1, "training.recompute": "full", "parallel.cp": 1, "parallel.devices": None})
    assert est.peak_bytes == r["peak_bytes"] and est.peak_stage == r["peak_stage"]

    path = CONFIGS / "deepseek-v3.yaml"
    if not path.exists():
        pytest.skip("deepseek-v3.yaml not present")
    model = load_model(path)
    own = model.data["parallel"]
    res = search(model, default_space(model, 1024, pp=[own["pp"]], tp=[own["tp"]], cp=[1], ep=[own["ep"]], zero=[0],
                                      recompute=[model.structure.recompute], micro_batch=[1]))
    mine = [r for r in res.rows if r["dp"] == own["dp"]]
    assert len(mine) == 1
    assert mine[0]["stage_layers"] == ",".join(map(str, own["stage_layers"]))
    assert mine[0]["peak_bytes"] == memform.estimate(path).peak_bytes


def test_exact_handles_if_then_else_conditions():
    """sympy folds a Piecewise nested in a condition into ITE (found by hypothesis)."""
    expr = sympy.Piecewise((x, sympy.ITE(x > y, False, x > y)), (sympy.Piecewise((x, x > y), (y, True)), True))
    fn = compile_exact([expr], [x, y, z])
    cols = [np.array([1, 3, 1]), np.array([1, 1, 3]), np.array([1, 1, 1])]
    (out,), bad = fn(cols)
    for k in range(3):
        assert not bad[k]
        assert int(out[k]) == int(expr.xreplace({x: int(cols[0][k]), y: int(cols[1][k])}))
