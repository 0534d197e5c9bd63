"""The numeric evaluator (plain ints and fractions, no sympy) gives the sympy evaluator's numbers.

``memform estimate`` on a cache miss evaluates the formulas with
:class:`memform.engine.numeric.NumericEvaluator`; the reference is the sympy evaluator with every
symbol replaced by its value (``keep=frozenset()``), whose own numbers ``tests/test_fastpath.py``
ties to the symbolic interpreter's (closed forms evaluated) on every bundled config. Compared here:
every bundled config under every framework profile, hypothesis-drawn degrees, hypothesis-drawn
formulas, number for number (every category, moment, runtime block, cost block, layer group,
parameter count, setup figure and the allocator's reserve), and where sympy refuses a config, the
numeric evaluator refuses it with the same message. The cold command line must not import sympy,
and skips the checker only for a program that passed it before.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from cli_helpers import sets_keys_of_another_profile
from test_fuzz_formulas import SMALL, _VALUE_LEAVES, _value_nodes

from memform.engine.config import frameworks
from memform.engine.model import estimate
from memform.engine.numeric import Inexact
from memform.errors import MemformError
from memform.lang.printer import print_expr
from memform.report.table import render_table

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def numbers(est: Any) -> dict[str, Any]:
    """Every number an estimate carries, stage by stage and layer group by layer group."""
    out = {"dict": est.to_dict(), "setup": est.setup, "parameters": est.parameters,
           "partition": est.partition.describe(), "table": render_table(est)}
    for s in est.stages:
        out[f"stage {s.stage}"] = (
            s.values, s.param_count, s.peak_moment, s.moments, s.host_bytes, s.runtime, s.time_ps, s.ideal_ps,
            s.tokens, s.reserve, s.reserve_oom, s.reserve_releases, {c: s.exact[c] for c in s.exact},
            [(g.chunk, g.block, g.mode, g.count, g.count_value, g.first_layer, g.inflight, g.inflight_value,
              g.per_layer_values, g.host) for g in s.layers])
    return out


def outcome(config: Any, overrides: Any, numeric: bool, seen: list | None = None) -> tuple[str, Any]:
    """("ok", numbers) or ("error", message); ("inexact", None) where the numeric evaluator hands over.
    ``seen`` collects the estimate (or the error) for the caller's further checks."""
    try:
        est = estimate(config, overrides, numeric=True) if numeric else estimate(config, overrides, keep=frozenset())
        if seen is not None:
            seen.append(est)
        return "ok", numbers(est)
    except Inexact:
        return "inexact", None
    except MemformError as exc:
        if seen is not None:
            seen.append(exc)
        return "error", str(exc)


def assert_same(config: Any, overrides: Any = None, seen: list | None = None) -> str:
    """The numeric evaluator's numbers (or error) equal sympy's; returns the outcome's kind. ``seen``: the
    numeric evaluator's estimate or error (sympy's where the numeric one hands over)."""
    got = outcome(config, overrides, numeric=True, seen=seen)
    if got[0] == "inexact":
        if seen is not None:
            outcome(config, overrides, numeric=False, seen=seen)
        return "inexact"
    want = outcome(config, overrides, numeric=False)
    assert got == want
    return got[0]


# --------------------------------------------------------------------------- published runs, as published

@pytest.mark.parametrize("config", sorted((ROOT / "configs" / "published").glob("*.yaml")), ids=lambda p: p.stem)
def test_published_runs_numeric_equals_symbolic(config):
    """configs/published/ stays out of the every-profile loop below (issue 32's suite budget); each run is
    still tied to the symbolic path under the profile its report names."""
    assert assert_same(config) == "ok"


# --------------------------------------------------------------------------- every config, every profile

@pytest.mark.parametrize("framework", [None] + frameworks())
@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_every_bundled_config_under_every_profile(config, framework):
    overrides = None if framework is None else {"training.framework": framework}
    seen: list = []
    kind = assert_same(config, overrides, seen)
    if framework is None:
        assert kind == "ok"      # the bundled configs estimate, with plain numbers
    elif not sets_keys_of_another_profile(config, framework):
        # every profile takes the config (what tests/test_bundled_configs.py's every_profile row asserted on its
        # own estimate of the same pair, issue 35's merged loops), except under another profile than the one
        # whose own keys it sets (configs/published/deepseek-v3-report.yaml's megatron: section); a profile may refuse a
        # strategy its framework cannot run, in its own words (DeepSpeed: ZeRO-3 with pipeline parallelism,
        # llama3-405b-8k before it moved to configs/published/)
        (est,) = seen
        if isinstance(est, MemformError):
            assert f"formulas/frameworks/{framework}" in str(est), f"{config.name} under {framework}: {est}"
        else:
            assert est.framework == framework
            assert all(s.peak_bytes > 0 for s in est.stages), (config.name, framework)


# --------------------------------------------------------------------------- activation offloading
# offload-decoder.mf, which dense.mf includes `after profile when training.activation_offload ...`: the program
# the loader builds for such a config, under a profile that redefines the decoder's act (hf-trainer) and one that
# does not, with and without recompute and a pipeline

@pytest.mark.parametrize("overrides", [
    {"training.activation_offload": "layers", "training.activation_offload_layers": 8},
    {"training.activation_offload": "checkpoint", "training.recompute": "full", "parallel.pp": 2},
    {"training.activation_offload": "all", "training.recompute": "selective", "training.framework": "hf-trainer"},
], ids=["layers", "checkpoint-pp2", "all-hf-trainer"])
def test_activation_offload_numeric_equals_symbolic(overrides):
    assert assert_same(ROOT / "configs" / "llama3-8b.yaml", overrides) == "ok"


# --------------------------------------------------------------------------- drawn degrees and formulas

_DEGREES = {"parallel.tp": st.sampled_from([1, 2, 3, 4, 8]), "parallel.dp": st.sampled_from([1, 2, 3, 8, 64]),
            "parallel.pp": st.sampled_from([1, 2, 3, 4, 8]), "parallel.vpp": st.sampled_from([1, 2]),
            "training.micro_batch_size": st.integers(1, 8), "training.num_micro_batches": st.integers(1, 64),
            "parallel.cp": st.sampled_from([1, 2, 4]), "parallel.ep": st.sampled_from([1, 2, 4, 8]),
            "training.recompute": st.sampled_from(["none", "selective", "full"]),
            "parallel.sequence_parallel": st.booleans(), "training.zero": st.integers(0, 3)}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=st.sampled_from(["llama3-70b.yaml", "mixtral-8x7b.yaml", "deepseek-v2-lite.yaml", "qwen2-vl-7b.yaml"]),
       overrides=st.fixed_dictionaries({}, optional=_DEGREES))
def test_drawn_degrees_give_the_same_numbers_or_the_same_error(config, overrides):
    path = ROOT / "configs" / config
    if "parallel.devices" in (yaml.safe_load(path.read_text()).get("parallel") or {}):
        overrides["parallel.devices"] = None  # the drawn degrees need not multiply to the config's count
    assert_same(path, overrides)


@settings(max_examples=int(os.environ.get("MEMFORM_FUZZ_EXAMPLES", 60)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.recursive(_VALUE_LEAVES, _value_nodes, max_leaves=12),
       st.sampled_from(["block norm {{ act = {} }}", "let dh = {}", "schedule 1f1b {{ inflight = {} }}",
                        "block decoder extends layer {{ act[none, selective, full] = {} }}",
                        "block mlp {{ params = {} }}"]))
def test_drawn_formulas_give_the_same_numbers_or_the_same_error(expr, template):
    """Division by zero, huge powers, strings in arithmetic, min/max/ceil/floor/log2/abs, if/and/or:
    the same number or the same error (log2 of a non-power of two is handed to sympy)."""
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "random.mf"
        f.write_text('include "dense.mf"\n' + template.format(print_expr(expr)) + "\n")
        assert_same({**SMALL, "formulas": [str(f)]})


DECODER = "block decoder extends layer { act[none, selective, full] ="


@pytest.mark.parametrize("formula, kind", [
    ("let dh = h / (t - 2)", "error"),                    # division by zero at t = 2
    ("let dh = 2 ^ (2 ^ 20)", "error"),                   # beyond MAX_BITS
    (f"{DECODER} -h }}", "error"),                        # a negative byte count
    (f"{DECODER} 2 ^ 300 }}", "error"),                   # more than 2^256 bytes
    (f"{DECODER} log2(h) + ceil(h / 3) + floor(h / 3) + abs(-h) + h % 7 + 2 ^ -2 + min(h, 3) + max(h / 3, 5) }}",
     "ok"),
    (f"{DECODER} log2(h / 3) }}", "inexact"),             # irrational: sympy answers
    (f"{DECODER} h ^ 0.5 }}", "inexact"),
    ('require h > 10 ^ 6 "too small"', "error"),
])
def test_errors_and_hand_overs(tmp_path, formula, kind):
    f = tmp_path / "extra.mf"
    f.write_text('include "dense.mf"\n' + formula + "\n")
    assert assert_same({**SMALL, "formulas": [str(f)]}) == kind


def test_an_irrational_formula_is_estimated_by_sympy(tmp_path):
    from memform.fastpath.fastcache import numeric_estimate
    f = tmp_path / "extra.mf"
    f.write_text(f'include "dense.mf"\n{DECODER} log2(h / 3) * 1000 }}\n')
    config = {**SMALL, "formulas": [str(f)]}
    assert numeric_estimate(config).to_dict() == estimate(config).to_dict()


# a stage-reading let in a schedule, and forward temporaries placed by name among named saved tensors: the
# same numbers (reserve included) from both evaluators, and the names decide the replay
STAGED_AND_NAMED = """include "dense.mf"
let not_last = p > 1 and stage < p - 1
def held_extra(x) = if not_last then x else 0
schedule 1f1b { inflight = min(p - stage, m) + held_extra(1) }
block decoder {
  act_tensor[none, selective] = tensors(n1: norm.act, attn: attn_tensors, n2: norm.act, mlp: mlp_tensors)
  fwd_tensor[none, selective] = tensors(64 * s * b * h, 2 * s * b * h)
  fwd_slot[none, selective] = slots(act_tensor, "attn.q", "%s")
  fwd_until[none, selective] = slots(act_tensor, "attn.v", "end")
}
"""


@pytest.mark.parametrize("second, slot", [("n2", 6), ("mlp.fc2_in", 11)])
def test_stage_lets_and_named_slots_give_the_same_numbers(tmp_path, second, slot):
    from memform.engine.model import load_model
    f = tmp_path / "extra.mf"
    f.write_text(STAGED_AND_NAMED % second)
    # fsdp2: a profile that keeps the decoder's act_tensor and fwd_* (megatron and hf-trainer set their own)
    config = {**SMALL, "formulas": [str(f)], "training": {**SMALL["training"], "framework": "fsdp2"}}
    assert assert_same(config) == "ok"
    est = estimate(config, numeric=True)
    # stage 0 holds one more micro-batch than min(p - stage, m): 3 of the 4; the last stage min(1, 4)
    assert est.stages[0].layers[0].inflight_value == 3 and est.stages[1].layers[-1].inflight_value == 1
    # positions: n1 0, attn 1..5 (qkv_in, q, k, v, proj_in), n2 6, mlp 7..11, "end" 12
    for ev in (load_model(config, numeric=True).evaluator(), load_model(config).evaluator(keep=frozenset())):
        assert [int(x) for x in ev.quantity("decoder", "fwd_slot", "none")] == [2, slot]
        assert [int(x) for x in ev.quantity("decoder", "fwd_until", "none")] == [4, 12]


# --------------------------------------------------------------------------- the cold command line

def test_the_cold_cli_does_not_import_sympy(tmp_path):
    env = {**os.environ, "MEMFORM_CACHE_DIR": str(tmp_path / "empty")}
    script = ("import sys; from memform.cli import main; code = main(sys.argv[1:]); "
              "sys.stderr.write('SYMPY' if 'sympy' in sys.modules else 'NOSYMPY'); sys.exit(code)")
    for args in (["estimate", "configs/deepseek-v3.yaml"], ["estimate", "configs/qwen2-vl-7b.yaml", "--json"],
                 ["estimate", "configs/llama2-7b.yaml", "--no-cache", "--set", "parallel.tp=4"]):
        run = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=env, capture_output=True, text=True)
        assert run.returncode == 0 and run.stderr.endswith("NOSYMPY"), (args, run.stderr)


def test_a_program_that_passed_the_checker_is_not_checked_again(tmp_path, monkeypatch):
    """The cold path skips the checker for a program it passed before; an edited file, or one that
    fails, is checked on every load."""
    import memform.lang.loader as loader
    monkeypatch.setenv("MEMFORM_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    check = loader.check_program
    monkeypatch.setattr(loader, "check_program", lambda prog: (calls.append(1), check(prog)))
    f = tmp_path / "extra.mf"
    f.write_text('include "dense.mf"\nlet extra = 1\n')
    loader.load_program([f])
    loader.load_program([f])
    assert len(calls) == 1
    f.write_text('include "dense.mf"\nlet extra = 2\n')
    loader.load_program([f])
    assert len(calls) == 2
    f.write_text('include "dense.mf"\nlet extra = nowhere\n')
    for _ in range(2):
        with pytest.raises(MemformError, match="nowhere"):
            loader.load_program([f])
    assert len(calls) == 4
