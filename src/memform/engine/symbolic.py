"""Presenting closed forms: the light simplification shared by every output format."""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Any

import sympy


@lru_cache(maxsize=4096)
def tidy(expr: sympy.Expr) -> sympy.Expr:
    """Expand, then pull common factors out: cheap, canonical, readable.

    Cached (sympy expressions are immutable and hashable) because every output format asks for
    the same stage totals and tidying is the slowest step of an estimate.
    """
    return sympy.factor_terms(sympy.expand(expr))


def closed_form_text(expr: sympy.Expr) -> str:
    return sympy.sstr(tidy(expr), order="grlex")


def closed_form_latex(expr: sympy.Expr) -> str:
    return sympy.latex(tidy(expr))


_PROSE = re.compile(r"[A-Za-z]{2,} [A-Za-z]{2,}")


def ordered_assumptions(assumptions: list[str]) -> list[str]:
    """The decisions a closed form rests on, prose ones (``moment backward is the largest at
    stage 0``) first, then the (in)equalities, each group in the order they were taken."""
    prose = [a for a in assumptions if _PROSE.search(a)]
    return prose + [a for a in assumptions if not _PROSE.search(a)]


#: assumption lines a terminal shows before "... and N more" (``--assumptions`` shows them all)
SHOWN_ASSUMPTIONS = 8
#: longest condition (characters) handed to sympy to simplify and compare
SIMPLIFY_MAX = 200
_AT_STAGE = re.compile(r"^(?P<what>.+) at stage (?P<stage>\d+)$")
_DIVIDES = re.compile(r"^(?P<n>\d+)/(?P<x>[A-Za-z_]\w*) is an integer$")
_MULTIPLE = re.compile(r"^(?P<e>.+)/(?P<n>\d+) is an integer$")


def _ranges(numbers: list[int]) -> str:
    """``0-3, 5, 7-9``: sorted integers as runs."""
    out, nums = [], sorted(set(numbers))
    start = prev = nums[0]
    for n in nums[1:] + [None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(out)


def _relation(text: str) -> "sympy.Basic | None":
    """An (in)equality assumption as a sympy relational (``vp = 1`` included), None if it is not one."""
    try:
        if re.search(r"(?<![<>=!])=(?!=)", text):
            left, right = text.split("=", 1)
            return sympy.Eq(sympy.sympify(left), sympy.sympify(right))
        rel = sympy.sympify(text)
    except (sympy.SympifyError, SyntaxError, TypeError, ValueError):
        return None
    return rel if isinstance(rel, (sympy.core.relational.Relational, sympy.logic.boolalg.BooleanAtom)) else None


def _bound(rel: "sympy.Basic") -> tuple[str, str, sympy.Expr] | None:
    """``rel`` as ``(E, op, c)``, meaning ``E op c`` (op one of >=, >, <=, <) with E free of a constant
    term and of a positive numeric factor, its sign fixed: conditions on the same E are comparable
    (``p - 3 <= m`` and ``p <= m`` are both bounds on ``p - m``). None for anything else."""
    if not isinstance(rel, (sympy.Ge, sympy.Gt, sympy.Le, sympy.Lt)) or not rel.free_symbols:
        return None
    diff = sympy.expand(rel.lhs - rel.rhs)
    c0, rest = diff.as_coeff_Add()
    if rest == 0:
        return None
    k, e = rest.primitive()
    if not k.is_positive:
        return None
    op = rel.rel_op
    if e.could_extract_minus_sign():
        e, c0, op = -e, -c0, {">=": "<=", ">": "<", "<=": ">=", "<": ">"}[op]
    return sympy.sstr(e), op, -c0 / k


def simplify_assumptions(assumptions: list[str]) -> list[str]:
    """The same conditions, said once: prose repeated per stage becomes one line with the stages as
    ranges; ``N/x is an integer`` for several N becomes ``x divides gcd`` and ``E/N is an integer`` for
    several N ``E/lcm is an integer``; short (in)equalities are simplified (``8*t > 8`` -> ``t > 1``),
    tautologies dropped, and of the bounds on one expression only the tightest of each side kept
    (``16 <= m`` implies ``4 <= m``, ``p <= m`` implies ``p - 3 <= m``). Conditions it cannot read stay
    as they are. Prose first, in the order first met (see :func:`ordered_assumptions`)."""
    stages: dict[str, list[int]] = {}
    divides: dict[str, list[int]] = {}
    multiples: dict[str, list[int]] = {}  # E/N is an integer for several N: E is a multiple of their lcm
    out: list[tuple[str, Any]] = []  # (kind, what) in the order first met
    bounds: dict[tuple[str, str], tuple[sympy.Expr, str]] = {}  # (E, side) -> (tightest bound, its text)
    seen: set[str] = set()
    for a in ordered_assumptions(assumptions):
        m, d = _AT_STAGE.match(a), _DIVIDES.match(a)
        if m and _PROSE.search(m["what"]):
            if m["what"] not in stages:
                out.append(("stage", m["what"]))
            stages.setdefault(m["what"], []).append(int(m["stage"]))
            continue
        if d:
            if d["x"] not in divides:
                out.append(("divides", d["x"]))
            divides.setdefault(d["x"], []).append(int(d["n"]))
            continue
        mult = _MULTIPLE.match(a)
        if mult and not _DIVIDES.match(a):
            e = mult["e"][1:-1] if mult["e"].startswith("(") and mult["e"].endswith(")") else mult["e"]
            if e not in multiples:
                out.append(("multiple", e))
            multiples.setdefault(e, []).append(int(mult["n"]))
            continue
        # the decisions of a step-time model's max/min run to kilobytes of ceiling terms: sympy would
        # spend seconds on them and find nothing to drop; they are shown as recorded
        rel = None if _PROSE.search(a) or len(a) > SIMPLIFY_MAX else _relation(a)
        if rel is not None:
            # (sympy's own Relational.simplify tests random numbers: seconds for a few dozen conditions)
            if rel is sympy.true:
                continue  # a tautology at these values
            if isinstance(rel, sympy.Eq):
                a = f"{sympy.sstr(rel.lhs)} = {sympy.sstr(rel.rhs)}"
            b = _bound(rel)
            if b is not None:
                e, op, c = b
                said = f"{e} {op} {sympy.sstr(c)}"
                a = said if len(said) < len(a) else a  # rewritten only where that says it shorter
                side = ">" if op in (">=", ">") else "<"
                key = (e, side)
                if key not in bounds:
                    out.append(("bound", key))
                old = bounds.get(key)
                tighter = old is None or (c > old[0] if side == ">" else c < old[0]) or (c == old[0] and len(op) == 1)
                if tighter:
                    bounds[key] = (c, a)
                continue
        if a not in seen:
            seen.add(a)
            out.append(("text", a))
    lines = []
    for kind, item in out:
        if kind == "stage":
            st = stages[item]
            lines.append(f"{item} at stage {st[0]}" if len(st) == 1 else f"{item} at stages {_ranges(st)}")
        elif kind == "divides":
            ns = sorted(set(divides[item]))
            g = math.gcd(*ns)
            lines.append(f"{g}/{item} is an integer" if len(ns) == 1 else
                         f"{item} divides {g} (so {', '.join(f'{n}/{item}' for n in ns)} are integers)")
        elif kind == "multiple":
            n = math.lcm(*multiples[item])
            e = f"({item})" if re.search(r"[+\-/]", item) else item
            lines.append(f"{e}/{n} is an integer")
        elif kind == "bound":
            lines.append(bounds[item][1])
        else:
            lines.append(item)
    return lines


#: a condition longer than this (characters) is not shown in a document's summary line
READABLE_MAX = 120


def summary_assumptions(lines: list[str], shown: int = SHOWN_ASSUMPTIONS) -> tuple[list[str], list[str]]:
    """Conditions as :func:`simplify_assumptions` gives them, split for a document: ``(summary, rest)``. The
    summary holds the first ``shown`` of those short enough to read in a sentence (:data:`READABLE_MAX`);
    ``rest`` the others in their order, kilobyte comparisons of padded sizes and step-time branches among
    them, which a report puts behind a fold or names by count (``memform estimate --symbolic
    --assumptions`` lists all)."""
    summary = [a for a in lines if len(a) <= READABLE_MAX][:shown]
    return summary, [a for a in lines if a not in summary]


_DIVIDES_LINE = re.compile(r"^(?P<x>[A-Za-z_]\w*) divides (?P<g>\d+)( \(so .*\))?$")


def _test_at(line: str, symbol: str) -> "Any":
    """A simplified condition (:func:`simplify_assumptions`'s wording) as a test of one integer value of
    ``symbol``; None when the line is prose, names another symbol, or cannot be read."""
    d = _DIVIDES_LINE.match(line) or _DIVIDES.match(line)
    if d:
        g = int(d["g"] if "g" in d.groupdict() else d["n"])
        return (lambda v: g % v == 0) if d["x"] == symbol else None
    mult = _MULTIPLE.match(line)
    if mult:
        try:
            e = sympy.sympify(mult["e"]) / int(mult["n"])
        except (sympy.SympifyError, SyntaxError, TypeError, ValueError):
            return None
        rel, integer = e, True
    elif _PROSE.search(line):
        return None
    else:
        rel, integer = _relation(line), False
        if rel is None:
            return None
    names = {s.name for s in rel.free_symbols}
    if names != {symbol}:
        return None
    x = next(iter(rel.free_symbols))

    def test(v: int) -> bool | None:
        try:
            r = rel.xreplace({x: sympy.Integer(v)})
            return bool(r.is_integer) if integer else bool(r)
        except (TypeError, ValueError):  # undecidable: keep the condition
            return None
    return test


def split_on_domain(lines: list[str], symbol: str, values: list[int]) -> tuple[list[str], list[str], list[int]]:
    """Simplified conditions on one integer ``symbol`` checked at each of its admissible ``values`` (those
    the formula files' requirements accept): ``(open, implied, valid_at)``. A condition every admissible
    value satisfies says nothing there (``t <= 8`` when t is 1, 2, 4 or 8; the padded vocabulary's
    ceiling comparisons), so it is ``implied``; the rest stay ``open``, and ``valid_at`` are the values at
    which every readable condition holds: where the closed form is the peak."""
    open_, implied, valid = [], [], set(values)
    for line in lines:
        test = _test_at(line, symbol)
        results = [test(v) for v in values] if test is not None else [None]
        if all(r is True for r in results):
            implied.append(line)
            continue
        open_.append(line)
        if None not in results:
            valid -= {v for v, r in zip(values, results) if not r}
    return open_, implied, sorted(valid)


def assumption_lines(assumptions: list[str], head: str = "valid where:", indent: str = "  ",
                     shown: int | None = SHOWN_ASSUMPTIONS,
                     domain: tuple[str, list[int]] | None = None) -> list[str]:
    """``valid where:`` followed by one condition per line, simplified (:func:`simplify_assumptions`);
    at most ``shown`` of them, then a line naming how many more ``--assumptions`` shows (None: all).
    ``domain`` (a symbol and its admissible integer values): conditions that every one of those values
    satisfies are left out of the default view and counted in the head (:func:`split_on_domain`)."""
    lines = simplify_assumptions(assumptions)
    tail: list[str] = []
    if domain is not None:
        x, values = domain
        lines, implied, valid = split_on_domain(lines, x, values)
        said = ", ".join(map(str, values))
        if shown is None:  # every condition: the implied ones after the rest, said so
            lines += [f"{a}   (holds at every admissible {x})" for a in implied]
        elif implied:
            tail.append(f"... and {len(implied)} more that every admissible {x} ({said}) satisfies "
                        f"(--assumptions shows them)")
        if valid != values:
            tail.append(f"so the closed form is the peak at {x} = {', '.join(map(str, valid)) or 'none'} "
                        f"of the admissible {said}")
    if shown is not None and len(lines) > shown + 1:
        rest = len(lines) - shown
        lines = lines[:shown] + [f"... and {rest} more (--assumptions shows every condition)"]
    return [head] + [indent + a for a in lines + tail]
