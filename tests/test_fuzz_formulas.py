"""Fuzzing the formula language: no source text makes memform fail with anything but MemformError.

Three kinds of input (hypothesis): arbitrary text, the bundled ``formulas/*.mf`` with random
character and token edits, and random syntax trees. Every failure must be a
:class:`~memform.errors.MemformError` that names file:line:col; a mutated program that still
loads must then estimate a bundled config or fail the same clean way. The pretty-printer
(:mod:`memform.lang.printer`) must be an inverse of the parser: printing and re-parsing gives the
same tree (locations aside) and the same numbers for every bundled config.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from estimate_helpers import bundled

import memform
from memform import cachedir
from memform.errors import Loc, MemformError
from memform.resources import display_path
from memform.lang import ast
from memform.lang.loader import load_program
from memform.lang.parser import parse_file, parse_text
from memform.lang.printer import print_expr, print_file
from memform.resources import formulas_dir

ROOT = Path(__file__).resolve().parent.parent
FORMULAS = sorted(formulas_dir().glob("*.mf"))
SOURCES = {p.name: p.read_text(encoding="utf-8") for p in FORMULAS}
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def _one_config_per_formula_set() -> list[Path]:
    """The bundled configs, one for each distinct list of formula files (fast, same coverage)."""
    seen: dict[str, Path] = {}
    for c in CONFIGS:
        seen.setdefault(repr(yaml.safe_load(c.read_text()).get("formulas", ["dense.mf"])), c)
    return sorted(seen.values())

#: a quick dense config (the mutated files are evaluated against it)
SMALL = {"model": {"hidden_size": 256, "num_heads": 8, "num_layers": 4, "ffn_hidden_size": 1024,
                   "vocab_size": 1024, "seq_length": 512},
         "parallel": {"dp": 2, "tp": 2, "pp": 2}, "training": {"micro_batch_size": 1, "num_micro_batches": 4}}
#: the same as a small MoE (moe.mf includes dense.mf, common.mf, schedules.mf, seqpipe.mf)
SMALL_MOE = {**SMALL, "model": {**SMALL["model"], "num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 512},
             "parallel": {**SMALL["parallel"], "ep": 2, "sequence_parallel": True}}
_TOKEN = re.compile(r'"[^"\n]*"|[A-Za-z_][A-Za-z0-9_]*|[0-9]+(?:\.[0-9]+)?|\S')
TOKENS = sorted({t for s in SOURCES.values() for t in _TOKEN.findall(s)})
FUZZ = settings(max_examples=int(os.environ.get("MEMFORM_FUZZ_EXAMPLES", 100)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def strip_locs(node):
    """A tree's content without source positions (what round-trips must preserve)."""
    if isinstance(node, Loc):
        return None
    if dataclasses.is_dataclass(node):
        return (type(node).__name__,) + tuple(strip_locs(getattr(node, f.name)) for f in dataclasses.fields(node)
                                              if f.name not in ("loc", "path"))
    if isinstance(node, tuple):
        return tuple(strip_locs(x) for x in node)
    return node


def assert_located(exc: MemformError, files: set[str] | None = None) -> None:
    """A formula error must point at file:line:col (in one of ``files`` when given)."""
    assert exc.loc is not None, f"no location: {exc}"
    assert exc.loc.line >= 1 and exc.loc.col >= 1, exc.loc
    # printed as memform names files (formulas/dense.mf for a bundled one, wherever it is installed)
    assert str(exc).startswith(f"{display_path(exc.loc.file)}:{exc.loc.line}:{exc.loc.col}: ")
    if files is not None:
        assert Path(exc.loc.file).name in files, exc.loc


# ------------------------------------------------------------------ mutations of bundled files

@st.composite
def mutated_sources(draw) -> tuple[str, str]:
    """(file name, text): a bundled formula file with 1-4 character or token edits."""
    name = draw(st.sampled_from(sorted(SOURCES)))
    text = SOURCES[name]
    for _ in range(draw(st.integers(1, 4))):
        spans = [m.span() for m in _TOKEN.finditer(text)]
        if not spans:
            break
        a, b = spans[draw(st.integers(0, len(spans) - 1))]
        op = draw(st.sampled_from(["delete_token", "insert_token", "swap_tokens", "delete_char", "insert_char",
                                   "duplicate_line"]))
        if op == "delete_token":
            text = text[:a] + text[b:]
        elif op == "insert_token":
            text = text[:a] + draw(st.sampled_from(TOKENS)) + " " + text[a:]
        elif op == "swap_tokens":
            c, d = spans[draw(st.integers(0, len(spans) - 1))]
            if c >= b:
                text = text[:a] + text[c:d] + text[b:c] + text[a:b] + text[d:]
        elif op == "delete_char":
            text = text[:a] + text[a + 1:]
        elif op == "insert_char":
            text = text[:a] + draw(st.sampled_from(list('(){}[]=+-*/^%#".,:\n0x'))) + text[a:]
        else:
            lines = text.splitlines(keepends=True)
            i = draw(st.integers(0, len(lines) - 1))
            text = "".join(lines[:i + 1] + lines[i:])
    return name, text


def _config_loading(name: str, tmp: Path) -> dict:
    """A config whose formula files (taken from ``tmp``) load ``name``: a bundled config that lists it
    (bert.mf, mla.mf, vision.mf), else the small MoE, whose moe.mf includes every other bundled file --
    so that every example estimates the mutated file rather than stopping after the load."""
    for c in CONFIGS:
        raw = yaml.safe_load(c.read_text(encoding="utf-8"))
        if name in raw.get("formulas", []):
            return {**raw, "formulas": [str(tmp / f) for f in raw["formulas"]]}
    return {**SMALL_MOE, "formulas": [str(tmp / "moe.mf")]}


_TREE: list[Path] = []


def _tree_with(name: str, text: str) -> Path:
    """A copy of the bundled formulas with ``name`` replaced by ``text``: one directory per process, whose
    other files keep their path and text from example to example (each example parses the mutated file
    only; :func:`_restore` puts the original back)."""
    if not _TREE:
        tmp = Path(tempfile.mkdtemp(prefix="memform-fuzz-"))
        for p in FORMULAS:
            shutil.copy(p, tmp / p.name)
        _TREE.append(tmp)
    _write(_TREE[0] / name, text)
    return _TREE[0]


def _restore(tmp: Path, name: str) -> None:
    _write(tmp / name, SOURCES[name])


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    # a file rewritten within one clock tick at the same size must not keep its old digest (cachedir
    # memoizes digests by modification time and size)
    cachedir._DIGESTS.clear()


@FUZZ
@given(mutated_sources())
def test_mutated_bundled_files_fail_cleanly(case):
    name, text = case
    tmp = _tree_with(name, text)
    try:
        # the mutated file parsed once, where load_program reads it (parse_file keeps the tree per path and
        # text): a syntax error must name the mutated file; load_program would stop at the same error
        # (parsing the same text first), so there is nothing more to check
        try:
            parse_file(display_path(tmp / name))
        except MemformError as exc:
            assert_located(exc, {name})
            return
        try:
            load_program([tmp / name])
        except MemformError as exc:
            assert_located(exc)
            return
        try:  # a mutation that still loads must estimate, or fail as cleanly
            est = memform.estimate(_config_loading(name, tmp))
        except MemformError as exc:
            assert str(exc)
            return
        assert all(isinstance(v, int) and v >= 0 for st_ in est.stages for v in st_.values.values())
    finally:
        _restore(tmp, name)


@FUZZ
@given(st.lists(st.sampled_from(list('abcdhstLp_01239.e+-*/^%()[]{}=<>!:,"#\n\t ') +
                                ["let ", "def ", "block ", "symbol ", "option ", "if ", " then ", " else ",
                                 "include ", "stack ", "require ", "int", " and ", "not ", "first ", "where "]),
                max_size=60).map("".join))
def test_random_text_fails_cleanly(text):
    try:
        tree = parse_text(text, "random.mf")
    except MemformError as exc:
        assert_located(exc, {"random.mf"})
        return
    # what parses must print and parse back to the same tree
    assert strip_locs(parse_text(print_file(tree), "again.mf")) == strip_locs(tree)


@pytest.mark.parametrize("text, fragment", [
    ("def f(x) = f(x) + 1\nlet y = f(1)\n", "recursive function: f -> f"),
    ("def f(x) = g(x)\ndef g(x) = h(x)\ndef h(x) = f(x)\n", "recursive function: f -> g -> h -> f"),
    ("let a = b\nlet b = c\nlet c = a\n", "cyclic definition"),
    ("block x extends y { params = 1 }\nblock y extends x { }\n", "cyclic 'extends'"),
    ("let x = " + "(" * 30 + "-" * 150 + "1" + ")" * 30 + "\n", "nested more than 100 levels"),
    ("let x = 1\nlet x = 2\n", "defined twice"),
])
def test_self_reference_is_detected(tmp_path, text, fragment):
    f = tmp_path / "self.mf"
    f.write_text(text)
    with pytest.raises(MemformError, match=re.escape(fragment)) as info:
        load_program([f])
    assert_located(info.value, {"self.mf"})


def test_include_cycle_through_three_files(tmp_path):
    for a, b in (("a", "b"), ("b", "c"), ("c", "a")):
        (tmp_path / f"{a}.mf").write_text(f'include "{b}.mf"\nlet {a} = 1\n')
    with pytest.raises(MemformError, match=r"include cycle: a\.mf -> b\.mf -> c\.mf -> a\.mf") as info:
        load_program([tmp_path / "a.mf"])
    assert_located(info.value)


@pytest.mark.parametrize("override, fragment", [
    ("block attention { params = decoder.params }", r"cyclic definition: .*decoder\.params"),
    ("let dh = kv / g", "cyclic definition: (kv -> dh -> kv|dh -> kv -> dh)"),
    ("block layer extends decoder { }", "cyclic 'extends': layer extends decoder extends layer"),
])
def test_cycle_across_override_files(tmp_path, override, fragment):
    """The later file closes a loop through the earlier file's definitions: caught, not recursed."""
    (tmp_path / "over.mf").write_text(f'include "dense.mf"\n{override}\n')
    with pytest.raises(MemformError, match=fragment) as info:
        load_program([tmp_path / "over.mf"])
    assert_located(info.value, {"over.mf", "dense.mf", "common.mf"})


def test_recursive_def_is_caught_at_evaluation_without_the_checker(tmp_path):
    """Even unchecked programs (``check=False``) stop a recursing def with a clear error."""
    f = tmp_path / "rec.mf"
    f.write_text('include "dense.mf"\ndef f(x) = f(x) + 1\nblock norm { act = f(h) }\n')
    program = load_program([f], check=False)
    assert program.defs["f"]
    with pytest.raises(MemformError, match="recursive function: f -> f"):
        memform.estimate({**SMALL, "formulas": [str(f)]})


# ------------------------------------------------------------------ printer round trip

@pytest.mark.parametrize("path", FORMULAS, ids=lambda p: p.name)
def test_printer_round_trips_bundled_files(path):
    tree = parse_file(path)
    text = print_file(tree)
    again = parse_text(text, "printed.mf")
    assert strip_locs(again) == strip_locs(tree)
    assert print_file(again) == text  # printing is canonical: a fixed point after one pass


@pytest.fixture(scope="module")
def printed_formulas(tmp_path_factory) -> Path:
    """Every bundled formula file printed, once per process: the configs below read the same printed files,
    so each is parsed once (a directory per test parsed every file again for each config)."""
    out = tmp_path_factory.mktemp("printed")
    for p in FORMULAS:
        (out / p.name).write_text(print_file(parse_file(p)), encoding="utf-8")
    return out


@pytest.mark.parametrize("config", _one_config_per_formula_set(), ids=lambda p: p.stem)
def test_printed_formulas_give_the_same_estimate(config, printed_formulas):
    """Same sympy expressions: identical closed forms and exact bytes from the printed files."""
    tmp_path = printed_formulas
    data = yaml.safe_load(config.read_text())
    names = data.get("formulas", ["dense.mf"])
    names = [names] if isinstance(names, str) else names
    assert all((tmp_path / Path(n).name).is_file() for n in names)
    printed = dict(data, formulas=[str(tmp_path / Path(n).name) for n in names])
    want = bundled(config).to_dict()  # memform.estimate's first answer, shared with the other bundled-config loops
    got = memform.estimate(printed).to_dict()
    assert got == want


_NAMES = st.sampled_from(["x", "y", "h", "a1", "s_2", "Lx", "_t"])
_LOC = Loc("gen.mf", 1, 1)


def _leaves():
    return st.one_of(
        st.integers(0, 10 ** 12).map(lambda n: ast.Num(str(n), _LOC)),
        st.from_regex(r"[0-9]{1,3}\.[0-9]{1,2}([eE][+-]?[0-9]{1,2})?", fullmatch=True).map(lambda t: ast.Num(t, _LOC)),
        st.text(alphabet="abc XYZ_-.", max_size=6).map(lambda t: ast.Str(t, _LOC)),
        st.booleans().map(lambda b: ast.Bool(b, _LOC)),
        st.builds(lambda n, a, v: ast.Ref(n, a, v, _LOC), _NAMES, st.none() | _NAMES,
                  st.none() | st.sampled_from(["none", "selective", "full"])),
    )


def _nodes(kids):
    nodes = [
        st.builds(lambda o, a, b: ast.BinOp(o, a, b, _LOC), st.sampled_from(list("+-*/%^")), kids, kids),
        st.builds(lambda a: ast.Neg(a, _LOC), kids),
        st.builds(lambda o, a, b: ast.Cmp(o, a, b, _LOC), st.sampled_from(["==", "!=", "<", "<=", ">", ">="]),
                  kids, kids),
        st.builds(lambda o, xs: ast.Logic(o, tuple(xs), _LOC), st.sampled_from(["and", "or"]),
                  st.lists(kids, min_size=2, max_size=3)),
        st.builds(lambda a: ast.Not(a, _LOC), kids),
        st.builds(lambda c, a, b: ast.If(c, a, b, _LOC), kids, kids, kids),
        st.builds(lambda f, xs: ast.Call(f, tuple(xs), _LOC), _NAMES, st.lists(kids, max_size=3)),
    ]
    if hasattr(ast, "Where"):  # expr where name = expr (one name per 'where'; chains nest)
        nodes.append(st.builds(lambda e, n, v: ast.Where(e, ((n, v),), _LOC), kids, _NAMES, kids))
    return st.one_of(*nodes)


@settings(max_examples=int(os.environ.get("MEMFORM_FUZZ_EXAMPLES", 100)), deadline=None)
@given(st.recursive(_leaves(), _nodes, max_leaves=25))
def test_printer_round_trips_random_expressions(expr):
    text = print_expr(expr)
    tree = parse_text(f"let z = {text}\n", "gen.mf")
    assert strip_locs(tree.decls[0].expr) == strip_locs(expr), text


def test_printer_parenthesizes_only_where_needed():
    src = "let z = (a - (b - c)) * -(d ^ e ^ f) / (g + h) % 2 + (if p then 1 else 2) + (not (x == y) or z and w)"
    text = print_expr(parse_text(src).decls[0].expr)
    assert text == "(a - (b - c)) * -d ^ e ^ f / (g + h) % 2 + (if p then 1 else 2) + (not x == y or z and w)"


# ------------------------------------------------------------------ random formulas, evaluated

_CONFIG_NAMES = st.sampled_from(["h", "t", "s", "b", "p", "d", "a", "m", "cp", "sp", "flash", "act_fn", "dh", "kv"])
_VALUE_LEAVES = st.one_of(
    st.sampled_from(["0", "1", "2", "3", "0.5", "1e3", "1e-3", "4096"]).map(lambda t: ast.Num(t, _LOC)),
    st.sampled_from(["gelu", "x"]).map(lambda v: ast.Str(v, _LOC)),
    st.booleans().map(lambda b: ast.Bool(b, _LOC)),
    _CONFIG_NAMES.map(lambda n: ast.Ref(n, None, None, _LOC)),
)


def _value_nodes(kids):
    return st.one_of(
        st.builds(lambda o, a, b: ast.BinOp(o, a, b, _LOC), st.sampled_from(list("+-*/%^")), kids, kids),
        st.builds(lambda a: ast.Neg(a, _LOC), kids),
        st.builds(lambda o, a, b: ast.Cmp(o, a, b, _LOC), st.sampled_from(["==", "!=", "<", ">="]), kids, kids),
        st.builds(lambda o, xs: ast.Logic(o, tuple(xs), _LOC), st.sampled_from(["and", "or"]),
                  st.lists(kids, min_size=2, max_size=3)),
        st.builds(lambda c, a, b: ast.If(c, a, b, _LOC), kids, kids, kids),
        st.builds(lambda f, xs: ast.Call(f, tuple(xs), _LOC), st.sampled_from(["min", "max"]),
                  st.lists(kids, min_size=2, max_size=3)),
        st.builds(lambda f, x: ast.Call(f, (x,), _LOC), st.sampled_from(["ceil", "floor", "log2", "abs"]), kids),
    )


@settings(max_examples=int(os.environ.get("MEMFORM_FUZZ_EXAMPLES", 100)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.recursive(_VALUE_LEAVES, _value_nodes, max_leaves=12),
       st.sampled_from(["block norm {{ act = {} }}", "let dh = {}", "schedule 1f1b {{ inflight = {} }}",
                        "block decoder extends layer {{ act[none, selective, full] = {} }}"]),
       st.sampled_from([(True, None), (True, frozenset()), (False, None)]))
def test_random_formulas_evaluate_or_fail_cleanly(expr, template, mode):
    """Division by zero, log2 of 0, complex powers, strings in arithmetic, ...: an error naming the
    formula, or whole non-negative bytes -- never an exception from sympy or Python."""
    resolve, keep = mode
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "random.mf"
        f.write_text('include "dense.mf"\n' + template.format(print_expr(expr)) + "\n")
        try:
            est = memform.estimate({**SMALL, "formulas": [str(f)]}, resolve=resolve, keep=keep)
        except MemformError as exc:
            assert str(exc)
            return
    for stage in est.stages:
        assert all(isinstance(v, int) and v >= 0 for v in stage.values.values())
