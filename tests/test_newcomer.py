"""Issue 16: the small fixes a new user asked for (header facts, printed paths, -o suffixes,
keys layout, byte scales, YAML exponent numbers, division by a literal zero, assumptions)."""

from __future__ import annotations

import json

import pytest

from cli_helpers import ROOT, run_memform

from memform.engine.config import parse_yaml
from memform.units import human_bytes

# Published totals: the safetensors parameter counts of the Hugging Face checkpoints
# meta-llama/Meta-Llama-3-8B (8,030,261,248), meta-llama/Llama-2-7b-hf (6,738,415,616),
# meta-llama/Meta-Llama-3-70B (70,553,706,496), mistralai/Mixtral-8x7B-v0.1 (46,702,792,704).
PARAMS = [("llama3-8b", 8_030_261_248, 0), ("llama2-7b", 6_738_415_616, 0),
          ("llama3-70b", 70_553_706_496, 0), ("mixtral-8x7b", 46_702_792_704, None)]


@pytest.mark.parametrize("name,total,expert", PARAMS)
def test_json_states_total_parameters(name, total, expert):
    r = run_memform("estimate", f"configs/{name}.yaml", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["parameters"]
    assert p["total"] == total
    assert p["dense"] + p["expert"] == total
    if expert is not None:
        assert p["expert"] == expert
    else:
        assert 0 < p["expert"] < total  # MoE: routed experts are most of Mixtral


def test_header_names_every_degree():
    r = run_memform("estimate", "configs/mixtral-8x7b.yaml")
    assert r.returncode == 0, r.stderr
    line = " ".join(r.stdout.splitlines()[1:3])  # the setup, wrapped within 100 columns
    for fact in ("tp=1", "dp=8", "pp=2", "cp=1", "ep=8", "vpp=1", "micro-batch 1", "16 micro-batches",
                 "seq 4096", "16 devices", "46,702,792,704", "expert", "dense"):
        assert fact in line, fact
    setup = json.loads(run_memform("estimate", "configs/mixtral-8x7b.yaml", "--json").stdout)["setup"]
    assert setup["devices"] == 16 and setup["ep"] == 8 and setup["num_micro_batches"] == 16


def test_explain_shows_bundled_paths_short():
    r = run_memform("estimate", str(ROOT / "configs/llama3-8b.yaml"), "--explain", "0", cwd=ROOT / "tests")
    assert r.returncode == 0, r.stderr
    assert "formulas/dense.mf:" in r.stdout
    assert str(ROOT) not in r.stdout and "site-packages" not in r.stdout


@pytest.mark.parametrize("suffix", [".docx", ".json", ""])
def test_report_refuses_unknown_suffix(tmp_path, suffix):
    out = tmp_path / f"x{suffix}"
    r = run_memform("report", "configs/llama2-7b.yaml", "-o", out)
    assert r.returncode == 2
    assert ".md" in r.stderr and ".html" in r.stderr and ".tex" in r.stderr
    assert not out.exists()


def test_keys_columns_align():
    r = run_memform("keys", "configs/deepseek-v3.yaml")
    assert r.returncode == 0, r.stderr
    cols = {line.index(" default ") for line in r.stdout.splitlines() if " default " in line}
    assert len(cols) == 1


def test_long_layer_labels_are_not_cut():
    r = run_memform("estimate", "configs/deepseek-v3.yaml")
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout


@pytest.mark.parametrize("n,text", [(2 ** 50, "1.00 PiB"), (3 * 2 ** 60, "3.00 EiB"), (10 ** 30, "1.00e+30 B"),
                                    (2 ** 40, "1.00 TiB")])
def test_human_bytes_scales(n, text):
    assert human_bytes(n) == text


@pytest.mark.parametrize("text,value", [("1e30", 10 ** 30), ("4E3", 4000), ("1.5e3", 1500.0), ("2e-3", 0.002),
                                        ("'1e3'", "1e3"), ("1.0", 1.0)])
def test_yaml_exponent_numbers(text, value):
    assert parse_yaml(f"x: {text}")["x"] == value


def test_seq_length_in_exponent_form_is_accepted():
    r = run_memform("estimate", "configs/llama3-8b.yaml", "--set", "model.seq_length=1e29")
    assert r.returncode == 0, r.stderr
    assert "e+" in r.stdout and "TiB" not in r.stdout.split("activations")[-1].split("\n")[1]


@pytest.mark.parametrize("expr,col", [("h / 0", 13), ("h % 0", 13), ("h / (2 - 2*1)", 16)])
def test_check_refuses_division_by_literal_zero(tmp_path, expr, col):
    f = tmp_path / "z.mf"
    f.write_text(f'symbol h : int = model.hidden_size "x"\nlet q = {expr}\n', encoding="utf-8")
    r = run_memform("check", ROOT / "formulas/common.mf", f)
    assert r.returncode == 2
    assert f"z.mf:2:{col}:" in r.stderr and "zero" in r.stderr


def test_valid_where_one_per_line_prose_first():
    r = run_memform("estimate", "configs/llama3-70b.yaml", "--symbolic")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    rest = lines[lines.index("valid where:") + 1:]
    assert rest[0].startswith("  moment ")
    assert all(", " not in l or "(" in l for l in rest)
    prose = [i for i, l in enumerate(rest) if "is the largest" in l or "is an integer" in l]
    assert prose == list(range(len(prose)))
