"""``memform derive``: closed forms in chosen symbols, factored like a paper, traced to the formulas."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import sympy
from cli_helpers import run_memform as _memform
from hypothesis import given, settings
from hypothesis import strategies as st

import memform
from memform.analysis.derive import derive, explain_text, parse_keep
from memform.api import load_model
from memform.engine.interpreter import CATEGORIES

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"



def _values(model):
    return dict(model.bound.values)


def _ceil(e) -> int:
    return int(sympy.ceiling(e))


@pytest.mark.parametrize("config", ["llama3-70b.yaml", "gpt3-175b.yaml", "llama2-7b.yaml"])
@pytest.mark.parametrize("keep", ["h,s,b", "t,d,p", None])
def test_derived_forms_reproduce_the_estimate(config, keep):
    """Substituting the config back into every derived form gives the estimate's bytes."""
    model = load_model(CONFIGS / config)
    est = memform.estimate_model(model, keep=frozenset())
    d = derive(model, parse_keep(model, keep))
    vals = _values(model)
    for form, ref in zip(d.stages, est.stages):
        for c in CATEGORIES:
            assert _ceil(form.categories[c].xreplace(vals)) == ref.values[c], (c, form.categories[c])
        assert 0 <= ref.peak_bytes - form.total.xreplace(vals) < len(CATEGORIES)
        assert form.peak_bytes == ref.peak_bytes
        if form.bytes_per_param is not None:
            bpp = sympy.Add(*form.bytes_per_param.values())
            assert sympy.simplify(bpp * form.param_count - form.static) == 0
        if keep is not None:
            kept = set(parse_keep(model, keep))
            assert {s.name for s in form.total.free_symbols} <= kept


@settings(max_examples=10, deadline=None)
@given(keep=st.sets(st.sampled_from(["h", "s", "b", "t", "d", "p", "L", "a", "f", "v", "m"]), max_size=4))
def test_any_keep_set_gives_an_exact_form(keep):
    model = load_model(CONFIGS / "llama3-70b.yaml")
    est = memform.estimate_model(model, keep=frozenset())
    d = derive(model, frozenset(keep))
    vals = _values(model)
    for form, ref in zip(d.stages, est.stages):
        assert {s.name for s in form.total.free_symbols} <= keep
        assert sum(_ceil(form.categories[c].xreplace(vals)) for c in CATEGORIES) == ref.peak_bytes


#: bytes per parameter of the static memory, (params, grads, optimizer), with every symbol kept
BYTES_PER_PARAM = [
    # Megatron-LM distributed-optimizer guide: bf16 params 2 + fp32 main grads 4 + fp32 master
    # and Adam moments 12, the 12 sharded over the data-parallel group (here d·cp)
    ("llama3-70b.yaml", {}, ("2", "4", "12/(cp*d)")),
    # the same without a distributed optimizer: 18 bytes per parameter (Megatron-LM guide)
    ("gpt3-175b.yaml", {}, ("2", "4", "12")),
    # ZeRO-3 (Rajbhandari et al. 2020 §5): all three sharded over N_d
    ("gpt3-175b.yaml", {"parallel.zero": 3}, ("2/(cp*d)", "4/(cp*d)", "12/(cp*d)")),
]


@pytest.mark.parametrize("config,overrides,expected", BYTES_PER_PARAM)
def test_static_memory_is_bytes_per_parameter_times_phi(config, overrides, expected):
    model = load_model(CONFIGS / config, overrides)
    d = derive(model)
    for form in d.stages:
        assert form.bytes_per_param is not None
        got = tuple(form.bytes_per_param[c] for c in ("params", "grads", "optimizer"))
        want = tuple(sympy.sympify(e, locals={s.name: s for s in model.bound.symbols.values()}) for e in expected)
        assert all(sympy.simplify(g - w) == 0 for g, w in zip(got, want)), got


def test_llama2_7b_parameter_count():
    """Φ on a single stage without TP is the model size: 6,738,415,616 for Llama-2 7B (Touvron et
    al. 2023; the count of the published checkpoint)."""
    model = load_model(CONFIGS / "llama2-7b.yaml", {"parallel.tp": 1, "parallel.pp": 1, "parallel.dp": 1,
                                                      "parallel.sequence_parallel": False})
    d = derive(model, frozenset({"h"}))
    (form,) = d.stages
    assert form.param_count.xreplace(_values(model)) == 6_738_415_616


def test_explain_points_at_real_formula_lines():
    model = load_model(CONFIGS / "llama3-70b.yaml")
    keep = frozenset({"b", "s"})
    d = derive(model, keep)
    text = explain_text(model, d, 0, keep)
    refs = re.findall(r"^\s*(?:\S+\s+)*?(?:<- )?([\w.]+)(?:\[\w+\])?(?:\([^)]*\))?  \[([^\]]+):(\d+):\d+\]", text, re.M)
    assert len(refs) > 20
    for label, file, line in refs:
        source = Path(ROOT / file if not Path(file).is_absolute() else file).read_text().splitlines()[int(line) - 1]
        name = label.split(".")[-1]
        assert name in source, (label, file, line, source)
    assert "attention.core" in text and "1f1b.inflight" in text
    assert f"stage 0 total: {d.stages[0].peak_bytes} bytes" in text


def test_cli_derive_text_latex_json_and_errors():
    cfg = str(CONFIGS / "llama3-70b.yaml")
    r = _memform("derive", cfg, "--keep", "h,s,b", "--stage", "0")
    assert r.returncode == 0, r.stderr
    assert "M_static = (2 + 4 + 3) * Phi = 9 * Phi" in r.stdout  # 12/(d·cp) = 12/4 at d = 4 (config)
    assert "M_act" in r.stdout and "M_comm" in r.stdout
    r = _memform("derive", cfg, "--stage", "1", "--latex")
    assert r.returncode == 0 and r.stdout.startswith("\\begin{aligned}") and "\\Phi_{1}" in r.stdout
    r = _memform("derive", cfg, "--keep", "b,s", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    model = load_model(cfg)
    est = memform.estimate_model(model, keep=frozenset())
    for stage, ref in zip(data["stages"], est.stages):
        total = sympy.sympify(stage["total"]["srepr"])          # srepr round-trips
        assert 0 <= ref.peak_bytes - total.xreplace(_values(model)) < len(CATEGORIES)
    r = _memform("derive", cfg, "--explain", "--stage", "3", "--keep", "t")
    assert r.returncode == 0 and "output.act" in r.stdout and "dense.mf:" in r.stdout
    r = _memform("derive", cfg, "--keep", "hidden")
    assert r.returncode == 2 and "--keep: 'hidden' is not a symbol" in r.stderr and "Traceback" not in r.stderr
    r = _memform("derive", cfg, "--stage", "9")
    assert r.returncode == 2 and "stage 9 does not exist" in r.stderr
