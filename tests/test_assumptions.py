"""The conditions a closed form holds under, said once (engine/symbolic.py simplify_assumptions).

Each case is a list of conditions as the evaluator records them and the lines a reader should get:
every dropped condition is implied by a kept one (the reason is in the case's comment)."""

from __future__ import annotations

import pytest
from cli_helpers import run_memform

from memform.engine.symbolic import SHOWN_ASSUMPTIONS, assumption_lines, simplify_assumptions

CASES = [
    # one prose decision per stage: one line, the stages as ranges
    (["moment backward is the largest at stage 0", "moment backward is the largest at stage 1",
      "moment backward is the largest at stage 3"], ["moment backward is the largest at stages 0-1, 3"]),
    (["moment warmup is the largest at stage 2"], ["moment warmup is the largest at stage 2"]),
    # m >= 16 implies m >= 15 and m >= 4 (the tightest lower bound of m)
    (["16 <= m", "15 <= m", "4 <= m"], ["16 <= m"]),
    # 8*t > 8 is t > 1; said once, in the shorter words
    (["8*t > 8", "t > 1", "t <= 8"], ["t > 1", "t <= 8"]),
    # p <= m implies p - 1 <= m and p - 3 <= m (bounds on p - m); a strict bound beats an equal weak one
    (["p - 1 <= m", "p <= m", "p - 3 <= m"], ["p <= m"]),
    (["cp*d*t >= 8", "cp*d*t > 8", "2*cp*d*t > 8"], ["cp*d*t > 8"]),
    # 80/t, 448/t, 64/t integers: t divides their gcd, 16
    (["80/t is an integer", "448/t is an integer", "64/t is an integer"],
     ["t divides 16 (so 64/t, 80/t, 448/t are integers)"]),
    # h/256 an integer implies h/128 one (h a multiple of lcm(128, 256))
    (["h/128 is an integer", "h/256 is an integer"], ["h/256 is an integer"]),
    # a tautology at these values disappears; an equality reads as one; the unreadable stays as it was
    (["1 < 2", "vp = 1", "cp*d > 1", "2*b*h*s/(cp*t) >= b*s"], ["vp = 1", "cp*d > 1", "2*b*h*s/(cp*t) >= b*s"]),
    # prose first, then the rest in the order first met
    (["t > 1", "moment backward is the largest at stage 0"], ["moment backward is the largest at stage 0", "t > 1"]),
]


@pytest.mark.parametrize("given, want", CASES)
def test_conditions_are_said_once(given, want):
    assert simplify_assumptions(given) == want


def test_the_terminal_shows_the_first_few_and_says_how_many_more():
    many = [f"x{i} > {i}" for i in range(20)]
    lines = assumption_lines(many)
    assert lines[0] == "valid where:" and len(lines) == 1 + SHOWN_ASSUMPTIONS + 1
    assert lines[-1] == f"  ... and {20 - SHOWN_ASSUMPTIONS} more (--assumptions shows every condition)"
    assert len(assumption_lines(many, shown=None)) == 21
    assert len(assumption_lines(many[:SHOWN_ASSUMPTIONS + 1])) == SHOWN_ASSUMPTIONS + 2  # no "1 more" line


def test_cli_assumptions_flag_shows_every_condition():
    short = run_memform("estimate", "configs/llama3-70b.yaml", "--symbolic").stdout
    full = run_memform("estimate", "configs/llama3-70b.yaml", "--symbolic", "--assumptions").stdout
    assert "more (--assumptions shows every condition)" in short and "more (--assumptions" not in full
    tail = full.split("valid where:\n")[1].splitlines()
    assert len(tail) > SHOWN_ASSUMPTIONS and "moment backward is the largest at stages 0-3" in tail[0]
