"""The real console script: tables, JSON, closed forms, overrides and user errors (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run_memform as run

ROOT = Path(__file__).resolve().parent.parent



def test_estimate_table():
    r = run("estimate", "configs/llama2-7b.yaml")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("llama2-7b: 1f1b schedule, pp=2")
    # then the run's shape and the model's size (issue 16; on two lines within 100 columns, issue 32),
    # the unit of the figures and the table
    assert lines[1].startswith("  tp=2 dp=2 pp=2") and lines[2] == "  6.74 B parameters (6,738,415,616)"
    assert lines[3] == "GiB per device"
    assert "acts" in lines[4] and "fits" in lines[4]
    assert len([l for l in lines[4:] if l.strip()[:1].isdigit()]) == 2  # one row per stage
    assert lines[-1].startswith("peak: stage 0")
    wide = run("estimate", "configs/llama2-7b.yaml", "--wide").stdout.splitlines()
    assert "parameters" in wide[1] and "activations" in wide[2] and "27.25 GiB" in wide[3]


@pytest.mark.parametrize("extra", [[], ["--explain", "0"], ["--symbolic"]])
def test_estimate_output_ends_with_a_newline(extra):
    # issue 32: the table ended without one, and the shell's prompt landed on its last line
    r = run("estimate", "configs/llama2-7b.yaml", *extra)
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("\n") and not r.stdout.endswith("\n\n")


def test_estimate_json_shape_and_overrides():
    r = run("estimate", "configs/gpt3-175b.yaml", "--json", "--set", "parallel.tp=4",
            "--set", "training.recompute=full")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["model"] == "gpt3-175b"
    assert len(out["stages"]) == 8
    for s in out["stages"]:
        assert set(s["breakdown"]) == {"params", "grads", "optimizer", "activations", "comm", "runtime"}
        assert s["peak_bytes"] == s["static_bytes"] + s["dynamic_bytes"] + s["runtime_bytes"] \
            == sum(s["breakdown"].values())
        assert "symbolic" not in s  # numbers only: closed forms are asked for with --symbolic
        assert isinstance(s["fits"], bool)
    assert out["peak_bytes"] == max(s["peak_bytes"] for s in out["stages"])
    with_forms = json.loads(run("estimate", "configs/gpt3-175b.yaml", "--json", "--symbolic", "--set",
                                "parallel.tp=4", "--set", "training.recompute=full").stdout)
    assert {k: v for k, v in with_forms.items() if k != "assumptions"} != out  # the closed forms were added
    assert isinstance(with_forms["assumptions"], list)
    for s, plain in zip(with_forms["stages"], out["stages"]):
        assert isinstance(s["symbolic"], str) and s["symbolic"]
        assert {k: v for k, v in s.items() if k != "symbolic"} == plain
    # tp=4 halves nothing but the TP-sharded part: params per stage must grow vs tp=8
    base = json.loads(run("estimate", "configs/gpt3-175b.yaml", "--json").stdout)
    assert out["stages"][1]["breakdown"]["params"] > base["stages"][1]["breakdown"]["params"]


def test_symbolic_output_and_python_api_agree():
    r = run("estimate", "configs/gpt3-175b.yaml", "--symbolic")
    assert r.returncode == 0, r.stderr
    assert "stage 0 =" in r.stdout and "activations" in r.stdout and "valid where:" in r.stdout
    import memform
    est = memform.estimate(ROOT / "configs/gpt3-175b.yaml")
    assert f"stage 0 = {est.stages[0].peak_bytes} bytes" in r.stdout


def test_explain_names_formula_locations():
    r = run("estimate", "configs/llama3-8b.yaml", "--explain", "0")
    assert r.returncode == 0, r.stderr
    assert "formulas/dense.mf:" in r.stdout and "in-flight micro-batches" in r.stdout


def test_check_formula_files():
    r = run("check", "formulas/dense.mf")
    assert r.returncode == 0 and r.stdout.startswith("ok:")


@pytest.mark.parametrize("args, fragment", [
    (["estimate", "configs/gpt3-175b.yaml", "--set", "model.hiden_size=4"], "did you mean 'model.hidden_size'"),
    (["estimate", "configs/gpt3-175b.yaml", "--set", "parallel.tp=0"], "'parallel.tp' must be positive"),
    (["estimate", "configs/gpt3-175b.yaml", "--set", "parallel.tp=eight"], "'parallel.tp' must be an integer"),
    (["estimate", "configs/gpt3-175b.yaml", "--set", "parallel.tp=7"], "parallel.tp must divide model.num_heads"),
    (["estimate", "configs/gpt3-175b.yaml", "--set", "parallel.pp=5"], "do not split evenly"),
    (["estimate", "configs/gpt3-175b.yaml", "--set", "training.recompute=some"], "training.recompute"),
    (["estimate", "configs/gpt3-175b.yaml", "--set", "model.hidden_size=null"], "missing config key 'model.hidden_size'"),
    (["estimate", "configs/nope.yaml"], "config file not found"),
    (["check", "tests/data/missing.mf"], "formula file not found"),
])
def test_user_errors_exit_2(args, fragment):
    r = run(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert fragment in r.stderr
    assert "Traceback" not in r.stderr


def test_syntax_error_in_formula_file(tmp_path):
    bad = tmp_path / "bad.mf"
    bad.write_text("let a = 1\nlet b = a +\n")
    r = run("check", str(bad))
    assert r.returncode == 2
    assert f"{bad}:2:" in r.stderr and "syntax error" in r.stderr and "^" in r.stderr


def test_python_module_entry_point():
    r = subprocess.run([sys.executable, "-m", "memform", "estimate", "configs/llama3-8b.yaml", "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and json.loads(r.stdout)["model"] == "llama3-8b"


def test_keys_lists_every_binding_with_its_declaration():
    from memform.cli.keys import key_docs
    from memform.lang.loader import load_program
    from memform.resources import formulas_dir

    prog = load_program([formulas_dir() / "dense.mf"])
    rows = {r.path: r for r in key_docs(prog)}
    assert {b.path for b in prog.bindings.values()} <= set(rows)
    assert rows["model.num_kv_heads"].default == "a" and "dense.mf" in rows["model.num_kv_heads"].where
    assert rows["model.hidden_size"].default == "required"
    r = run("keys", "configs/mixtral-8x7b.yaml")
    assert r.returncode == 0 and "model.num_experts" in r.stdout
