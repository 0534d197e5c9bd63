"""A cold search (no compiled structure: the numeric walk over candidate columns,
memform.fastpath.vecwalk) gives the rows a compiled search gives, exactly.

The expected rows are not literals: they are the compiled path's (memform.fastpath.compiled, itself
checked byte for byte against the interpreter in tests/test_search.py), computed in the same test."""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from memform.analysis import search as search_mod
from memform.analysis.search import default_space, search
from memform.fastpath.vecwalk import Fallback, Vec, VecStructure, numeric_twin
from memform.api import load_model
from memform.fastpath.compiled import CompiledModel

ROOT = Path(__file__).resolve().parents[1]

# (config, devices, space restrictions): dense with a time model, MoE (ep, expert tp following tp),
# a hybrid Mamba stack, a vision model, uneven pipeline splits (80 layers over 32 stages)
CASES = [
    ("llama3-70b.yaml", 64, {"recompute": ["full"], "zero": [0, 3], "pp": [2, 32]}),
    ("llama2-7b.yaml", 16, {"recompute": ["selective"], "zero": [1, 2]}),
    ("mixtral-8x7b.yaml", 32, {"recompute": ["full"], "zero": [1], "pp": [1, 4]}),
    ("deepseek-v2-lite.yaml", 16, {"recompute": ["none"], "zero": [0], "pp": [1, 3]}),
    ("nemotron-h-8b.yaml", 16, {"recompute": ["none"], "zero": [0], "pp": [1, 2]}),
    ("qwen2-vl-7b.yaml", 8, {"recompute": ["none"], "zero": [1], "pp": [1, 2]}),
]


def _space(model, devices, given):
    space = default_space(model, devices)
    for k, v in given.items():
        if getattr(space, k) is not None:
            setattr(space, k, v)
    return space


@pytest.mark.parametrize("config,devices,given", CASES, ids=[c[0] for c in CASES])
def test_cold_rows_equal_compiled_rows(config, devices, given):
    model = load_model(ROOT / "configs" / config, {"training.global_batch_size": 32})
    space = _space(model, devices, given)
    cold = search(model, space, cache=False, compile=False)
    warm = search(model, space, cache=False, compile=True)
    assert cold.stats.structures == warm.stats.structures and cold.stats.structures > 0
    assert cold.stats.structures_skipped == warm.stats.structures_skipped
    assert (cold.stats.valid, cold.stats.fitting) == (warm.stats.valid, warm.stats.fitting)
    assert cold.rows == warm.rows
    assert cold.plans(top=20) == warm.plans(top=20)


def test_cold_path_walks_instead_of_compiling(monkeypatch):
    """compile=False compiles no structure the walk can evaluate (a compile would fail here)."""
    model = load_model(ROOT / "configs" / "llama2-7b.yaml")
    space = _space(model, 8, {"recompute": ["none"], "zero": [0]})

    def refuse(*a, **k):
        raise AssertionError("compiled")
    monkeypatch.setattr(CompiledModel, "build", classmethod(refuse))
    result = search(model, space, cache=False, compile=False)
    assert result.stats.structures == len(space.pp) and result.stats.fitting > 0


def test_compiled_after_repeated_searches(tmp_path, monkeypatch):
    """COMPILE_AFTER walks of one structure, then it is compiled and stored (the cache's "search" folder)."""
    monkeypatch.setenv("MEMFORM_CACHE_DIR", str(tmp_path))
    model = load_model(ROOT / "configs" / "llama2-7b.yaml")
    space = _space(model, 4, {"recompute": ["none"], "zero": [0], "pp": [1]})
    rows = []
    for k in range(search_mod.COMPILE_AFTER + 1):
        rows.append(search(model, space).rows)
        stored = list((tmp_path / "search").rglob("*.json")) if (tmp_path / "search").exists() else []
        assert len(stored) == (1 if k >= search_mod.COMPILE_AFTER else 0), k
    assert all(r == rows[0] for r in rows)


def test_fallback_when_not_decidable_per_row():
    """A zero denominator in some rows is not guessed: the walk hands the structure to the compiler."""
    model = numeric_twin(load_model(ROOT / "configs" / "llama2-7b.yaml"))
    vs = VecStructure(model, ("parallel.tp",))
    ev_cols = {"parallel.tp": np.array([1, 2])}
    assert vs(ev_cols).values.shape == (2, model.structure.pp, 6)
    with pytest.raises(Fallback):
        Vec(np.array([1, 2], dtype=np.int64)).__sub__(1).reciprocal()


@pytest.mark.parametrize("seed", range(4))
def test_vec_arithmetic_is_exact(seed):
    """Vec's + - * / floor ceil and comparisons equal Fraction's, row by row (drawn operands,
    including products that leave int64 and go on in float64, which is then flagged)."""
    rng = random.Random(seed)
    n = 16
    a = [Fraction(rng.randint(-10 ** 6, 10 ** 6), rng.randint(1, 10 ** 4)) for _ in range(n)]
    b = [Fraction(rng.randint(1, 10 ** 6), rng.randint(1, 10 ** 4)) for _ in range(n)]

    def vec(xs):
        return Vec(np.array([x.numerator for x in xs], dtype=np.int64), np.array([x.denominator for x in xs],
                                                                                 dtype=np.int64))

    def rows(v):
        assert v.f is None
        den = v.den if v.den is not None else np.ones(n, dtype=np.int64)
        return [Fraction(int(p), int(q)) for p, q in zip(v.num, den)]

    va, vb = vec(a), vec(b)
    assert rows(va + vb) == [x + y for x, y in zip(a, b)]
    assert rows(va - vb) == [x - y for x, y in zip(a, b)]
    assert rows(va * vb) == [x * y for x, y in zip(a, b)]
    assert rows(va * vb.reciprocal()) == [x / y for x, y in zip(a, b)]
    assert rows(va.floor()) == [Fraction(x.numerator // x.denominator) for x in a]
    assert rows(va.ceil()) == [Fraction(-(-x.numerator // x.denominator)) for x in a]
    assert rows(va * Fraction(3, 7) + 5) == [x * Fraction(3, 7) + 5 for x in a]
    from memform.fastpath.vecwalk import _cmp
    assert _cmp("<", va, vb).m.tolist() == [x < y for x, y in zip(a, b)]
    huge = va * (2 ** 61)
    big = huge * vb
    assert big.f is not None  # left int64: float64, which whole bytes refuse
    assert np.allclose(big.f, [float(x * 2 ** 61 * y) for x, y in zip(a, b)], rtol=1e-12)
