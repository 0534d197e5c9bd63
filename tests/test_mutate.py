"""bench/mutate.py: its mutants are valid one-token (or one-term) edits, classified correctly, and a known
bad one is killed by the in-process oracle."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from memform.errors import MemformError
from memform.lang.parser import parse_text

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def mutate():
    import memform.fastpath.fastcache as fastcache
    import memform.lang.parser as parser

    spec = importlib.util.spec_from_file_location("memform_bench_mutate", ROOT / "bench" / "mutate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    read_text, fast_estimate = parser.read_text, fastcache.fast_estimate
    yield module
    module.serve(None)
    # classify() routes memform's formula reader through the served mutants and turns the fast path
    # off for the whole process (bench/mutate.py install_reader, disable_fast_path): undo both, so the
    # tests that run after these in the same process see memform as it is
    parser.read_text = read_text
    if fastcache.fast_estimate is not fast_estimate:
        module._replace_everywhere(fastcache.fast_estimate, fast_estimate)
    sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def dense(mutate):
    return mutate.generate(ROOT / "formulas" / "dense.mf")


def _find(mutants, kind, desc, line_text):
    lines = (ROOT / "formulas" / "dense.mf").read_text(encoding="utf-8").splitlines()
    hits = [m for m in mutants if m.kind == kind and m.desc == desc and line_text in lines[m.line - 1]]
    assert hits, (kind, desc, line_text)
    return hits[0]


def test_every_operator_kind_is_generated_and_parses(dense):
    assert {m.kind for m in dense} == {"number", "op", "minmax", "drop", "symbol"}
    source = (ROOT / "formulas" / "dense.mf").read_text(encoding="utf-8")
    assert all(m.text != source and m.file == "formulas/dense.mf" for m in dense)
    # generate() re-parses every dropped-term mutant itself; token swaps keep the grammar -- check a
    # spread of them (every 12th) here: the declaration each one edits, parsed alone (a file parses
    # iff each of its declarations does: each starts with a keyword no expression continues with, and
    # the rest of the text is unchanged), and every 8th of those also as the whole file
    from memform.lang.parser import _lark
    items = _lark().parse(source).children
    for k, m in enumerate(dense[::12]):
        at = next(i for i, (a, b) in enumerate(zip(source, m.text)) if a != b)
        item = max((it for it in items if it.meta.start_pos <= at), key=lambda it: it.meta.start_pos)
        assert at < item.meta.end_pos, m.label()
        piece = m.text[item.meta.start_pos:item.meta.end_pos + len(m.text) - len(source)]
        try:
            parse_text(piece, m.file)
            if k % 8 == 0:
                parse_text(m.text, m.file)
        except MemformError as exc:  # pragma: no cover - the assertion message is the point
            pytest.fail(f"{m.label()} does not parse: {exc}")
    # a token mutant changes one token: the rest of the file is untouched, line numbers too
    m = _find(dense, "symbol", "a -> g", "let qw = a * dh")
    changed = [(a, b) for a, b in zip(source.splitlines(), m.text.splitlines()) if a != b]
    assert len(changed) == 1 and changed[0][1].startswith("let qw = g * dh")


def test_dropping_a_term_keeps_parentheses_balanced(mutate, tmp_path):
    path = tmp_path / "probe.mf"
    path.write_text("let x = (a + b) * 2 - (c)\nlet y = (d) + e\n", encoding="utf-8")
    drops = sorted(" | ".join(m.text.splitlines()) for m in mutate.generate(path) if m.kind == "drop")
    # each term of each sum, with its own parentheses; a leading "- x" keeps its sign
    assert drops == [
        'let x = ( b) * 2 - (c) | let y = (d) + e',
        'let x = (a ) * 2 - (c) | let y = (d) + e',
        'let x = (a + b) * 2  | let y = (d) + e',
        'let x = (a + b) * 2 - (c) | let y =  e',
        'let x = (a + b) * 2 - (c) | let y = (d) ',
        'let x = - (c) | let y = (d) + e',
    ]


def test_classification_invalid_live_and_equivalent(mutate, dense):
    """Classified over a pinned set of draws (the drawn space's numeric path; seconds, not the full space)."""
    plain = mutate.Draw(8, "configs/llama3-8b.yaml", {"training.framework": "torch", "parallel.zero": 0})
    moe = mutate.Draw(9, "configs/mixtral-8x7b.yaml", {"training.framework": "torch"})
    soft = mutate.Draw(7, "configs/llama3-8b.yaml", {"training.framework": "megatron", "model.attn_softcap": True,
                                                     "model.flash_attention": False})
    mutate.set_draws([plain, moe])
    try:
        # `default a` -> `default g` in g's own declaration: the checker reports a cycle
        invalid = _find(dense, "symbol", "a -> g", "symbol g : int = model.num_kv_heads")
        got = mutate.classify(invalid)
        assert got[0] == "invalid", got
        # the decoder's full-recompute input at width f: megatron-core.mf shadows it, frameworks/torch.mf
        # does not, so Mixtral (full recompute) under torch sees it -- and the draw is named
        live = _find(dense, "symbol", "h -> f", "act[full] = bytes_norm_in")
        assert mutate.classify(live) == ("live", moe.label())
        # Gemma's attention soft-capping: no bundled config sets model.attn_softcap, and the override
        # variants did not either -- the hole issue 35 names ("equivalent" = "no bundled set-up tells it
        # apart"); a drawn config that sets it (eager attention) tells it apart
        softcap = _find(dense, "op", "+ -> -", "(bytes_core + attn_softcap * bytes_a)")
        assert mutate.classify(softcap)[0] == "equivalent"
        mutate.set_draws([plain, moe, soft])
        assert mutate.classify(softcap) == ("live", soft.label())
    finally:
        mutate.set_space("draws")


def test_draws_are_seeded_valid_and_span_profiles_and_architectures(mutate):
    """The drawn space (issue 35): a seed gives the same draws; every draw loads and estimates; the
    draws go through every architecture base in turn, and a forced value is kept by the repair."""
    # 8 draws: the published-run bases (bloom-176b, deepseek-v2/v3-report, ...) are tight and their draws often
    # fail the repair, so 5 in turn gave 2 valid
    a = mutate.draw_configs(11, 8, targeted=False)
    b = mutate.draw_configs(11, 8, targeted=False)
    assert [(d.index, d.base, d.overrides) for d in a] == [(d.index, d.base, d.overrides) for d in b]
    assert len(a) >= 3, [d.label() for d in a]
    raws = dict(mutate._bases())
    bases = [name for name, _ in mutate._bases()]
    assert {"toy-hybrid", "toy-vision-moe", "configs/gpt3-175b.yaml"} <= set(bases)
    for d in a:
        assert d.base == bases[d.index]        # the bases in turn
        assert not isinstance(mutate._draw_numbers(raws[d.base], d.overrides), str), d.label()
        # an option of the loaded files beside the structural keys and degrees
        assert set(d.overrides) - set(mutate.STRUCTURAL_DRAWS) - set(mutate.SYMBOL_DRAWS) - {
            "training.framework", "parallel.pp_schedule"}, d.label()
    assert mutate.draw_configs(12, 1, targeted=False) != a[:1]
    # a value forced on a draw survives the repair (here: one the toy hybrid refuses with the draw's tp 3 removed)
    import random
    over = {"training.framework": "megatron", "model.mamba1_dt_norms": True, "parallel.tp": 3}
    assert mutate._repair(raws["toy-hybrid"], over, random.Random(0), keep=("model.mamba1_dt_norms",))
    assert over["model.mamba1_dt_norms"] is True and "parallel.tp" not in over



def test_every_option_value_the_formula_files_declare_is_in_the_drawn_space(mutate):
    """(stop 49, issue 35) The equivalence space reaches every value of every finite-valued option of every
    formula file (the step-time model's aside): ``python bench/mutate.py --coverage`` draws the default space and
    records what it reaches in bench/results/mutate-coverage.json (it exits 1 and lists any unreached value). This
    holds today's declarations to that recording, so an option value added since, or one the space stopped
    reaching, fails here until the space reaches it (a TARGET_PINS entry, a pair or refusal draw) and the recording
    is made again. The values are read from the files themselves, not from the draws: a file no draw loads (fsdp1.mf
    before this stop) cannot hide its options."""
    import json
    rec = json.loads(mutate.COVERAGE_FILE.read_text(encoding="utf-8"))
    assert rec["unreached"] == [] and rec["reached"] == rec["values"], rec["unreached"]
    declared = mutate.declared_values()
    missing = sorted(f"{k}={v}" for k, vs in declared.items() for v in vs if v not in rec["reached_by_key"].get(k, ()))
    assert not missing, ("option values the recorded space does not reach (run python bench/mutate.py --coverage): "
                         + " ".join(missing))
    # fsdp1.mf is loaded by the fsdp1 and hf-fsdp1 profiles (hf-fsdp1 includes it), so its targeted draws pin those
    assert mutate._profiles_loading("formulas/frameworks/fsdp1.mf") == ["fsdp1", "hf-fsdp1"]
    assert mutate._profiles_loading("formulas/dense.mf") == []
    assert {"fsdp1", "hf-fsdp1", "hf-fsdp2"} <= set(mutate.DRAW_PROFILES)

def test_a_known_bad_mutant_is_killed_and_the_original_survives(mutate, dense):
    """Megatron's GPT-3 175B weight bytes (tests/test_reference_dense.py) must catch a QKV projection with
    three K/V-wide blocks instead of two (dense.mf attention.params: ``2 * kv`` -> ``3 * kv``)."""
    bad = _find(dense, "number", "2 -> 3", "params = (h * (qw + 2 * kv)")
    # a no-op "mutant" (the file's own text) must survive the same tests, having run all of them
    same = mutate.Mutant(bad.file, bad.line, bad.col, "none", "unchanged",
                         (ROOT / bad.file).read_text(encoding="utf-8"))
    tests = ["tests/test_reference_dense.py::test_megatron_weights_and_optimizer_gpt3_175b"]
    baseline = mutate.select_tests(tests, 1, 5.0)
    assert any(not r["excluded"] for r in baseline)
    results = {r["label"]: r for r in mutate.run_oracle([bad, same], tests, baseline, 1)}
    assert results[bad.label()]["killed"], results
    assert not results[same.label()]["killed"], results
    assert results[same.label()]["tests"] == sum(not r["excluded"] for r in baseline)


def test_the_step_time_model_is_left_out_unless_asked_for(mutate, tmp_path):
    """The step-time model (issue 14) has its own tests: its files are not mutated by default, and a
    mutant that changes only the ``time`` numbers of ``--json`` is counted apart (classify's "time")."""
    default = mutate.formula_files()
    assert default and not any(mutate._matches(p, mutate.TIME_FILES) for p in default)
    assert [p.name for p in mutate.formula_files(["dense.mf"])] == ["dense.mf"]
    # --exclude leaves out what it names; nothing excluded keeps every file of the default
    assert "dense.mf" not in {p.name for p in mutate.formula_files(None, ["dense.mf", *mutate.TIME_FILES])}
    assert set(default) <= set(mutate.formula_files(None, ()))
    nums = {".stages[0].activations": 2.0, ".stages[0].time.step_seconds": 1.5,
            ".stages[0].time.parts.compute": 1.0, ".time.mfu": 0.4, ".peak_bytes": 7.0}
    assert mutate._memory(nums) == {".stages[0].activations": 2.0, ".peak_bytes": 7.0}


def test_the_baseline_stops_a_test_that_starts_a_subprocess(mutate, tmp_path):
    """With --no-subprocess (the tool before issue 35) a test that starts a subprocess is left out; the
    baseline stops it at its first Popen instead of waiting for it."""
    probe = tmp_path / "test_probe_spawn.py"
    probe.write_text("import subprocess, sys\n\n\ndef test_spawns():\n"
                     "    subprocess.run([sys.executable, '-c', 'import time; time.sleep(120)'], check=True)\n",
                     encoding="utf-8")
    [row] = mutate.select_tests([str(probe)], 1, 5.0, no_subprocess=True)
    assert row["excluded"] == "runs a subprocess (would read the files on disk)"
    assert row["seconds"] < 60


def test_the_formula_directory_variable_reaches_a_subprocess(tmp_path):
    """memform.resources.FORMULAS_ENV: a child memform reads its formula files from the named copy (what
    bench/mutate.py points the subprocesses of the tests at); unset, the bundled files."""
    import json
    import os
    import shutil
    import subprocess

    from memform.resources import FORMULAS_ENV

    tree = tmp_path / "formulas"
    shutil.copytree(ROOT / "formulas", tree)
    dense = tree / "dense.mf"
    text = dense.read_text(encoding="utf-8")
    assert text.count("params = (h * (qw + 2 * kv)") == 1
    dense.write_text(text.replace("params = (h * (qw + 2 * kv)", "params = (h * (qw + 3 * kv)"), encoding="utf-8")

    def params(env_extra):
        env = {k: v for k, v in os.environ.items() if k != FORMULAS_ENV}
        env.update(env_extra, PYTHONPATH=str(ROOT / "src"), MEMFORM_CACHE_DIR=str(tmp_path / "cache"))
        out = subprocess.run([sys.executable, "-m", "memform", "estimate", str(ROOT / "configs" / "llama3-8b.yaml"),
                              "--json"], capture_output=True, text=True, env=env, check=True).stdout
        return json.loads(out)["stages"][0]["param_count"]

    # Llama-3-8B (configs/llama3-8b.yaml: h 4096, 8 KV heads of 128 = 1024-wide K/V, 32 layers, tp 4):
    # one more K/V-wide block per layer is 4096 · 1024 · 32 / 4 more parameters per rank
    assert params({FORMULAS_ENV: str(tree)}) - params({}) == 4096 * 1024 * 32 // 4


@pytest.mark.slow     # a worker process, its baseline and two mutants, each starting memform's CLI
def test_a_test_that_starts_a_subprocess_kills_through_the_formula_copy(mutate, dense, tmp_path):
    """Issue 35: subprocess tests are run too -- their child reads the worker's copy of formulas/, where
    the mutant's text is in place. A probe that only checks the CLI's number kills the K/V mutant."""
    import json
    import subprocess

    out = subprocess.run([sys.executable, "-m", "memform", "estimate", str(ROOT / "configs" / "llama3-8b.yaml"),
                          "--json"], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")}).stdout
    want = json.loads(out)["stages"][0]["param_count"]
    probe = tmp_path / "test_probe_cli.py"
    probe.write_text(
        "import json, os, subprocess, sys\n\n\ndef test_cli_params():\n"
        f"    out = subprocess.run([sys.executable, '-m', 'memform', 'estimate', {str(ROOT / 'configs' / 'llama3-8b.yaml')!r},"
        " '--json'], capture_output=True, text=True, check=True).stdout\n"
        f"    assert json.loads(out)['stages'][0]['param_count'] == {want}\n", encoding="utf-8")
    bad = _find(dense, "number", "2 -> 3", "params = (h * (qw + 2 * kv)")
    same = mutate.Mutant(bad.file, bad.line, bad.col, "none", "unchanged",
                         (ROOT / bad.file).read_text(encoding="utf-8"))
    baseline = mutate.select_tests([str(probe)], 1, 60.0)
    assert [(r["excluded"], r["spawns"]) for r in baseline] == [("", True)]
    results = {r["label"]: r for r in mutate.run_oracle([bad, same], [str(probe)], baseline, 1)}
    assert results[bad.label()]["killed"], results
    assert not results[same.label()]["killed"], results
