"""memform.lang.bundled: the bundled formula files' syntax trees, parsed once per installation.

Each stored tree must equal a fresh parse of the same text under the name the caller shows (every location
of every node included), be refused for any other text or parser, and spare a cold run lark altogether."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from memform.lang import bundled, parser
from memform.lang.parser import parse_text
from memform.resources import formulas_dir

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A store built as the wheel's hook builds it (once for the module)."""
    target = tmp_path_factory.mktemp("store") / "formulas.pickle"
    assert bundled.build(target, parse_text) == len(list(formulas_dir().rglob("*.mf")))
    return target


@pytest.fixture
def store(built, monkeypatch):
    """That store in place of the package's own."""
    monkeypatch.setattr(bundled, "STORE", built)
    monkeypatch.setattr(bundled, "_STORE", [])
    return built


def test_every_stored_tree_is_a_fresh_parse_under_the_shown_name(store):
    files = sorted(formulas_dir().rglob("*.mf"))
    assert len(files) >= 20
    for f in files:
        text = f.read_text(encoding="utf-8")
        # the name a run from the repository root shows; an absolute one in the next test
        for shown in (f"formulas/{f.relative_to(formulas_dir()).as_posix()}",):
            got = bundled.lookup(f, shown, text)
            assert got is not None and got == parser.parse_text(text, shown), f
            assert got.path == shown and all(d.loc.file == shown for d in got.decls if hasattr(d, "loc"))


def test_a_changed_text_a_foreign_file_or_another_parser_is_parsed_again(store, monkeypatch, tmp_path):
    dense = formulas_dir() / "dense.mf"
    text = dense.read_text(encoding="utf-8")
    assert bundled.lookup(dense, "formulas/dense.mf", text) is not None
    assert bundled.lookup(dense, "formulas/dense.mf", text + "\n# edited\n") is None
    mine = tmp_path / "dense.mf"
    mine.write_text(text)
    assert bundled.lookup(mine, str(mine), text) is None          # a user's file: never from the store
    monkeypatch.setattr(bundled, "_STORE", [])
    monkeypatch.setattr(bundled, "syntax_digest", lambda: "another parser")
    assert bundled.lookup(dense, "formulas/dense.mf", text) is None


def test_first_use_in_a_checkout_adds_the_file_to_the_store(tmp_path, monkeypatch):
    target = tmp_path / "formulas.pickle"
    monkeypatch.setattr(bundled, "STORE", target)
    monkeypatch.setattr(bundled, "_STORE", [])
    monkeypatch.setattr(parser, "_PARSED", {})
    moe = formulas_dir() / "moe.mf"
    tree = parser.parse_file(moe)
    assert target.is_file() and tree == parser.parse_text(moe.read_text(encoding="utf-8"), str(moe))
    monkeypatch.setattr(bundled, "_STORE", [])                   # as a new process reads it
    assert bundled.lookup(moe, str(moe), moe.read_text(encoding="utf-8")) == tree


def test_a_cold_estimate_from_the_store_imports_no_lark(store):
    """What an installed wheel's first run does (``--no-cache``: no user cache at all)."""
    code = ("import sys; from memform.lang import bundled; from pathlib import Path; bundled.STORE = Path(sys.argv[1]);"
            "from memform.cli.main import main; main(['estimate', 'configs/nemotron-h-8b.yaml', '--no-cache']);"
            "assert 'lark' not in sys.modules, 'parsed with lark'")
    r = subprocess.run([sys.executable, "-c", code, str(store)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "peak" in r.stdout


def test_a_text_served_in_place_of_the_file_is_parsed_but_not_stored(tmp_path, monkeypatch):
    """bench/mutate.py serves mutants through memform's reader: parsed as a user's file, never stored."""
    target = tmp_path / "formulas.pickle"
    monkeypatch.setattr(bundled, "STORE", target)
    monkeypatch.setattr(bundled, "_STORE", [])
    dense = formulas_dir() / "dense.mf"
    mutant = dense.read_text(encoding="utf-8").replace("2 * kv", "3 * kv", 1)
    assert bundled.remember(dense, "formulas/dense.mf", mutant, parse_text) is None and not target.exists()
    monkeypatch.setattr(parser, "_PARSED", {})
    monkeypatch.setattr(parser, "read_text", lambda path, what: mutant)
    assert parser.parse_file(dense) == parser.parse_text(mutant, str(dense)) and not target.exists()
