"""min()/max() at the config's values (engine/evaluator.py Evaluator._winner) decide as sympy's Min/Max
constructors followed by a numeric pick did: the same winning argument and the same "valid where" conditions,
with one sign query per pair instead of the constructor's pairwise factor_terms (most of a symbolic estimate's
time on the step-time model's overlap clamps). Drawn expressions in positive symbols, as the formulas have."""

from __future__ import annotations

import itertools

import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from memform.engine.evaluator import Evaluator
from memform.lang.program import Program

X, Y, Z = (sympy.Symbol(n, positive=True, integer=True) for n in "xyz")
VALUES = {X: sympy.Integer(3), Y: sympy.Integer(5), Z: sympy.Integer(2)}

atoms = st.one_of(st.sampled_from([X, Y, Z]), st.integers(-4, 12).map(sympy.Integer))


def _expr(depth: int) -> st.SearchStrategy:
    if depth == 0:
        return atoms
    sub = _expr(depth - 1)
    return st.one_of(atoms, st.builds(lambda a, b: a + b, sub, sub), st.builds(lambda a, b: a - b, sub, sub),
                     st.builds(lambda a, b: a * b, sub, sub), st.builds(lambda a: sympy.ceiling(a / 2), sub))


def _evaluator() -> Evaluator:
    return Evaluator(Program(), {str(s): s for s in VALUES}, dict(VALUES), {}, resolve=True)


def _as_the_constructor_did(cls: type, args: list[sympy.Expr]) -> tuple[sympy.Expr, list[str]]:
    """The evaluator's rule before _winner: sympy's constructor, then the extreme of what it left."""
    ev = _evaluator()
    res = cls(*args)
    if not isinstance(res, (sympy.Min, sympy.Max)):
        return res, []
    vals = [res_arg.xreplace(VALUES) for res_arg in res.args]
    chosen = res.args[vals.index(min(vals) if cls is sympy.Min else max(vals))]
    for other in res.args:
        if other is not chosen:
            ev.assume(sympy.Le(chosen, other) if cls is sympy.Min else sympy.Ge(chosen, other))
    return chosen, ev.assumptions


GRID = [dict(zip((X, Y, Z), map(sympy.Integer, v))) for v in itertools.product(range(1, 7), repeat=3)]


def _always(condition: str) -> bool:
    """Whether a recorded condition holds at every point of a grid of positive integers (an implied one)."""
    expr = sympy.sympify(condition, locals={"x": X, "y": Y, "z": Z})
    return all(bool(expr.xreplace(point)) for point in GRID)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([sympy.Min, sympy.Max]), st.lists(_expr(2), min_size=1, max_size=4))
def test_winner_decides_as_the_constructor(cls, args):
    """The same value; where the same argument wins, no condition the constructor would not have recorded, and
    none of the constructor's left out that can fail (only ones it could not prove but that always hold)."""
    ev = _evaluator()
    got = ev._winner(cls, args, None, "an argument")
    want, conditions = _as_the_constructor_did(cls, args)
    assert got.xreplace(VALUES) == want.xreplace(VALUES)
    if got == want:
        assert set(ev.assumptions) <= set(conditions)
        assert all(_always(c) for c in set(conditions) - set(ev.assumptions))


def test_a_provable_clamp_adds_no_condition_and_an_open_one_says_which_side_won():
    ev = _evaluator()
    assert ev._winner(sympy.Max, [sympy.Integer(0), X * Y + 1], None, "x") == X * Y + 1
    assert ev.assumptions == []
    assert ev._winner(sympy.Max, [sympy.Integer(0), X - Y], None, "x") == 0   # 3 - 5 < 0 at these values
    assert ev.assumptions == ["0 >= x - y"]
