"""The interactive what-if page (``memform whatif``): its numbers are ``memform estimate``'s.

The expected numbers always come from the engine itself (in-process from the numeric path,
tests/estimate_helpers.py, whose numbers are ``memform.estimate``'s byte for byte -- tests/test_fastpath.py
-- without compiling a structure the second time a test asks for it; or ``memform estimate --json`` through
the console script) for the same config and ``--set`` values; the page must reproduce them byte for byte. Three layers are checked:

* the JavaScript backend of the exact compiler (:func:`memform.fastpath.exact.compile_js`)
  against the numpy one on synthetic expressions (every kind of node it compiles), run with
  Node.js where it is installed;
* the page's own evaluation script (``<script id="whatif-core">``, extracted from the written
  file) under Node.js, against ``memform.estimate`` for several bundled configs and overrides,
  including values the estimate refuses (failed ``require``, device count, global batch);
* the real page in headless Chromium through Playwright (``-m browser``): change an input, move
  a slider, pick a structural variant, read the cells' ``data-bytes``, and compare with
  ``memform estimate --json``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import sympy
from cli_helpers import ROOT, run_memform
from estimate_helpers import bundled, numbers

import memform
from memform.fastpath.compiled import CompiledModel
from memform.fastpath.exact import JS_HELPERS, compile_exact, compile_js
from memform.engine.interpreter import CATEGORIES
from memform.engine.model import rebind
from memform.errors import MemformError
from memform.report.whatif import build_whatif, render_whatif, whatif_html

NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="Node.js is not installed: the page's script is evaluated "
                                                     "in the browser tests instead (-m browser)")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def config(name: str) -> Path:
    return ROOT / "configs" / name


def run_node(script: str) -> object:
    res = subprocess.run([NODE], input=script, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def core_script(html: str) -> str:
    m = re.search(r'<script id="whatif-core">(.*?)</script>', html, re.S)
    assert m, "the page has no whatif-core script"
    return m.group(1)


def evaluate_in_node(html: str, changes: list[dict]) -> list[dict]:
    """Run the page's own ``evaluate`` and ``command`` for each change of its base state."""
    driver = core_script(html) + """
const out = [];
for (const ch of %s) {
  const s = baseState();
  Object.assign(s.inputs, ch.inputs || {});
  Object.assign(s.axes, ch.axes || {});
  for (const k of ["gbs", "devices", "capacity_gib"]) if (k in ch) s[k] = ch[k];
  const r = evaluate(s);
  out.push({errors: r.errors, valid: r.valid, values: r.stages.map(x => x.values.map(String)),
            fits: r.stages.map(x => x.fits), time: r.time, command: command(s)});
}
console.log(JSON.stringify(out));
""" % json.dumps(changes)
    return run_node(driver)


def sets_of(command: str) -> list[str]:
    """The ``--set`` values of a ``memform estimate CONFIG --set ...`` line."""
    words = shlex.split(command)
    assert words[:2] == ["memform", "estimate"]
    rest = words[3:]
    assert all(w == "--set" for w in rest[0::2]), command
    return rest[1::2]


def breakdown(est: memform.Estimate) -> list[list[str]]:
    return [[str(s.values[c]) for c in CATEGORIES] for s in est.stages]


# ---------------------------------------------------------------- the JavaScript backend

X, Y = sympy.symbols("x y", integer=True, positive=True)
SYNTHETIC = [
    X * Y / 7 + sympy.Rational(1, 3),
    sympy.Piecewise((X / (Y - 3), X > Y), (X * Y / 7, True)),       # a denominator of either sign (or 0)
    sympy.Min(X / 3, Y / 2, 5) + sympy.Max(X - 2 * Y, 0) / 5,
    sympy.ceiling(X * Y / 5) + sympy.floor(X / 7) * 3,
    sympy.Mod(X, Y) + sympy.Abs(X - Y) / 2,
    sympy.Piecewise((X, X > 5), (Y, Y > 5)),                         # no case applies for small x, y: bad
    X ** 5 * Y ** 4 / 3 + 2 ** 70,                                   # beyond int64 and doubles
    (X - Y) * (X + 2) / (Y + 1),                                     # negative values, positive denominator
    sympy.And(X > 2, sympy.Or(Y < 4, sympy.Eq(X, Y))),
    sympy.Not(X > Y),
    sympy.ITE(X > 1, Y > 2, Y < 5),
]


@needs_node
def test_js_backend_computes_what_the_numpy_backend_computes():
    xs = [1, 2, 3, 4, 5, 6, 7, 9, 12, 10 ** 6, 3 * 10 ** 9]
    grid = [(x, y) for x in xs for y in xs]
    fn = compile_exact(SYNTHETIC, (X, Y))
    outs, bad = fn([np.array([g[0] for g in grid], dtype=object), np.array([g[1] for g in grid], dtype=object)])
    js = compile_js(SYNTHETIC, (X, Y))
    got = run_node(JS_HELPERS + f"const f = {js};\nconst rows = {json.dumps(grid)};\n"
                   "console.log(JSON.stringify(rows.map(([x, y]) => { const [o, b] = f(BigInt(x), BigInt(y));"
                   " return [o.map(String), b]; })));")
    for i, (x, y) in enumerate(grid):
        want = [str(bool(o[i])).lower() if isinstance(e, sympy.logic.boolalg.Boolean) and not isinstance(e, sympy.Expr)
                else str(int(o[i])) for e, o in zip(SYNTHETIC, outs)]
        assert got[i][1] == bool(bad[i]), (x, y)
        if not bad[i]:
            assert got[i][0] == want, (x, y)


@needs_node
def test_js_float_outputs_are_the_numpy_float_outputs():
    """The ``approximate`` (float64) path, as the page computes step times: the same doubles in the same
    order of operations, the same rows bad (no piecewise case, not finite)."""
    numeric = [e for e in SYNTHETIC if isinstance(e, sympy.Expr)] + [sympy.Mod(X - Y, 7) / 2]  # floored modulo
    flags = [True] * len(numeric)
    xs = [1, 2, 3, 4, 5, 6, 7, 9, 12, 10 ** 6, 3 * 10 ** 9]
    grid = [(x, y) for x in xs for y in xs]
    outs, bad = compile_exact(numeric, (X, Y), flags)([np.array([g[0] for g in grid]), np.array([g[1] for g in grid])])
    js = compile_js(numeric, (X, Y), flags)
    got = run_node(JS_HELPERS + f"const f = {js};\nconst rows = {json.dumps(grid)};\n"
                   "console.log(JSON.stringify(rows.map(([x, y]) => f(BigInt(x), BigInt(y)))));")
    assert sum(bool(b) for b in bad) > 0   # the grid has bad rows (the piecewise without a case)
    for i, (x, y) in enumerate(grid):
        assert got[i][1] == bool(bad[i]), (x, y)
        if not bad[i]:
            assert got[i][0] == pytest.approx([float(np.broadcast_to(o, (len(grid),))[i]) for o in outs], rel=1e-15), (x, y)


def test_numpy_backend_still_exact_on_the_synthetic_expressions():
    """The refactored builder's Python output: the same exact values as sympy itself."""
    fn = compile_exact(SYNTHETIC[:5] + SYNTHETIC[6:8], (X, Y))
    xs = np.array([4, 7, 12, 10 ** 6], dtype=object)
    ys = np.array([5, 3, 12, 7], dtype=object)
    outs, bad = fn([xs, ys])
    for k, e in enumerate(SYNTHETIC[:5] + SYNTHETIC[6:8]):
        for i in range(len(xs)):
            if bad[i]:
                continue
            exact = sympy.ceiling(e.subs({X: int(xs[i]), Y: int(ys[i])}))
            assert int(outs[k][i]) == int(exact), (e, xs[i], ys[i])
    assert list(bad) == [False, True, False, False]  # y = 3 zeroes the denominator of the Piecewise branch


# ---------------------------------------------------------------- page data (Python side)

@pytest.fixture(scope="module")
def llama70b() -> str:
    return whatif_html(config("llama3-70b.yaml"))


@pytest.fixture(scope="module")
def deepseek() -> str:
    return whatif_html(config("deepseek-v3.yaml"))


def test_page_data_offers_the_numeric_symbols_and_the_structural_variants():
    model = memform.load_model(config("llama3-70b.yaml"))
    w = build_whatif(model)
    keys = [i["key"] for i in w.data["inputs"]]
    assert keys == ["parallel.dp", "parallel.tp", "parallel.cp", "training.micro_batch_size",
                    "training.num_micro_batches", "model.seq_length"]  # llama3-70b binds no expert degree
    values = {i["key"]: i["value"] for i in w.data["inputs"]}
    assert values["parallel.tp"] == "8" and values["parallel.dp"] == "4" and values["model.seq_length"] == "8192"
    axes = {a["key"]: a for a in w.data["axes"]}
    assert axes["parallel.pp"]["values"] == [1, 2, 4, 8] and axes["parallel.pp"]["base"] == 4
    assert axes["training.recompute"]["values"] == ["none", "selective", "full"]
    assert axes["training.recompute"]["base"] == "selective"
    assert axes["parallel.zero"]["values"] == [0, 1, 2, 3]
    assert len(w.data["variants"]) == len(w.functions) == 4 * 3 * 4
    for v, fn in zip(w.data["variants"], w.functions):
        assert v["error"] is None and fn is not None
        pp = v["choice"][0]
        assert v["stages"] == pp == len(v["labels"])
        assert "parallel.tp must divide model.num_heads" in v["requires"]
    fixed = dict(w.data["fixed"])
    assert fixed["model.hidden_size"] == "8192" and "parallel.tp" not in fixed
    assert w.data["global_batch_size"] == "64"
    assert w.data["timed"] and all(v["timed"] for v in w.data["variants"])  # an h100-sxm: a time model
    # a device without peak FLOP/s (llama2-7b gives only a capacity): no step time on the page
    plain = build_whatif(memform.load_model(config("llama2-7b.yaml")))
    assert not plain.data["timed"] and not any(v["timed"] for v in plain.data["variants"])


def test_page_is_self_contained_and_small(deepseek):
    for html in (deepseek,):
        assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", html)
        assert "@import" not in html and "url(" not in html
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", html)  # only the SVG namespace name
    # the page carries every structural variant's closed forms as JavaScript: DeepSeek-V3's was 1.99 MiB and is
    # 2.0002 MiB since issue 33's FP8 / grouped-GEMM / kernel-efficiency time terms; the budget is 2.5 MiB
    assert len(deepseek.encode()) < 2.5 * 2 ** 20


def test_vary_and_structural_options_are_checked():
    model = memform.load_model(config("llama2-7b.yaml"))
    w = build_whatif(model, vary=["model.hidden_size"], pp=[2], recompute=["full"], zero=[1])
    assert [i["key"] for i in w.data["inputs"]][-1] == "model.hidden_size"
    # the config's own value is always offered
    assert {a["key"]: a["values"] for a in w.data["axes"]}["training.recompute"] == ["full", "selective"]
    with pytest.raises(MemformError, match="model.activation"):
        build_whatif(model, vary=["model.activation"])
    with pytest.raises(MemformError, match="do not bind"):
        build_whatif(model, vary=["model.no_such_key"])
    with pytest.raises(MemformError, match="unknown schedule"):
        build_whatif(model, schedules=["nope"])
    with pytest.raises(MemformError, match="recompute mode"):
        build_whatif(model, recompute=["sometimes"])
    with pytest.raises(MemformError, match="structural variants"):
        build_whatif(model, max_variants=3)
    with pytest.raises(MemformError, match="laid out over the stages"):  # the partition is fixed per variant
        build_whatif(model, vary=["model.num_layers"])
    with pytest.raises(MemformError, match="sets this key itself"):
        build_whatif(model, vary=["training.recompute"])


# ---------------------------------------------------------------- the page's script under Node.js

CASES = [
    ("llama3-70b.yaml", {}, [
        {},
        {"inputs": {"parallel.tp": "4"}},
        {"inputs": {"training.micro_batch_size": "2"}},          # m follows the global batch: 64 / (2 × 4)
        {"inputs": {"model.seq_length": "12344", "parallel.dp": "2"}},  # SP: tp 8 must divide s
        {"inputs": {"model.seq_length": "35184372088840"}},     # 2^45 + 8: bytes far beyond 2^53
        {"axes": {"parallel.pp": 8, "training.recompute": "full", "parallel.zero": 3}},
        {"axes": {"parallel.pp": 2, "training.recompute": "none"}, "inputs": {"parallel.cp": "2"}},
        {"gbs": "", "inputs": {"training.num_micro_batches": "3"}},
    ]),
    ("llama2-7b.yaml", {}, [
        {},
        {"inputs": {"parallel.tp": "1", "parallel.dp": "8", "training.micro_batch_size": "4"}},
        {"axes": {"parallel.pp": 1, "parallel.zero": 2}},
    ]),
    ("mixtral-8x7b.yaml", {"vary": ["model.num_experts", "model.hidden_size"], "pp": [2], "zero": [0]}, [
        {},
        {"inputs": {"parallel.ep": "4", "parallel.dp": "16"}},
        {"inputs": {"model.num_experts": "16", "model.hidden_size": "2048"}},
    ]),
    ("gpt3-175b.yaml", {}, [
        {"inputs": {"training.micro_batch_size": "3"}, "gbs": ""},
    ]),
]


@needs_node
@pytest.mark.parametrize("name,options,changes", CASES, ids=[c[0] for c in CASES])
def test_page_script_gives_the_estimates_numbers(name, options, changes):
    html = whatif_html(config(name), **options)
    results = evaluate_in_node(html, changes)
    for change, r in zip(changes, results):
        assert r["valid"], (change, r["errors"])
        sets = sets_of(r["command"])
        for key, value in change.get("inputs", {}).items():
            assert f"{key}={value}" in sets
        for key, value in change.get("axes", {}).items():
            assert f"{key}={value}" in sets
        est = numbers(config(name), sets)
        assert r["values"] == breakdown(est), change
        assert r["fits"] == [s.fits for s in est.stages]
        assert_same_time(r["time"], est, change)


def assert_same_time(time: dict | None, est: memform.Estimate, change: object) -> None:
    """The page's step time, MFU and tokens/s are the estimate's: float64 step picoseconds rounded up
    once per stage (the estimate rounds each cost block exactly: picoseconds apart in seconds)."""
    if not est.has_time:
        assert time is None, change
        return
    assert time is not None, change
    assert time["stageSeconds"] == pytest.approx([s.step_ps / 1e12 for s in est.stages], rel=1e-9, abs=1e-11)
    assert time["stepSeconds"] == pytest.approx(est.step_seconds, rel=1e-9)
    assert time["stageSeconds"][time["slowest"]] == pytest.approx(est.stages[est.time_stage].step_ps / 1e12, rel=1e-9)
    assert time["mfu"] == pytest.approx(est.mfu, rel=1e-9)
    assert time["tokensPerSecond"] == pytest.approx(est.tokens_per_second, rel=1e-9)


@needs_node
def test_page_formats_seconds_as_the_cli_does(llama70b):
    """``fmt3g`` is Python's ``format(x, ".3g")``, which the estimate's step line uses."""
    values = [4.657796619847, 0.0107374, 12.36, 100.0, 999.6, 1234.5, 4.1, 0.001, 3.2e-5, 86.96, 1e-4, 2.0]
    got = run_node(core_script(llama70b) + f"console.log(JSON.stringify({json.dumps(values)}.map(fmt3g)));")
    assert got == [format(v, ".3g") for v in values]


@needs_node
def test_page_script_matches_the_compiled_search_on_many_values():
    """The page's BigInt code and :class:`CompiledModel`'s numpy code on one random grid, including
    values where a require fails (both must reject exactly the same rows)."""
    model = memform.load_model(config("llama3-70b.yaml"))
    html = render_whatif(build_whatif(model))
    rng = np.random.default_rng(16)
    keys = ["parallel.dp", "parallel.tp", "parallel.cp", "training.micro_batch_size", "training.num_micro_batches",
            "model.seq_length"]
    cols = {k: rng.choice(choices, 60) for k, choices in zip(keys, [
        [1, 2, 3, 8], [1, 2, 3, 4, 8, 16], [1, 2, 3], [1, 2, 5], [1, 3, 4, 16, 64], [1000, 4096, 8191, 8192, 2 ** 20]])}
    changes = [{"gbs": "", "inputs": {k: str(int(cols[k][i])) for k in keys}} for i in range(60)]
    got = evaluate_in_node(html, changes)
    cm = CompiledModel.build(rebind(model, {"parallel.devices": None}, check=False), keys)
    batch = cm(cols)
    assert 5 < int(batch.valid.sum()) < 60  # the grid has both kinds of rows
    for i, r in enumerate(got):
        assert r["valid"] == bool(batch.valid[i]), changes[i]
        if r["valid"]:
            assert r["values"] == [[str(int(v)) for v in stage] for stage in batch.values[i]]
            # the same float64 step picoseconds as the search's (the same operations, in order)
            assert r["time"]["stepSeconds"] == pytest.approx(float(batch.step_ps[i]) / 1e12, rel=1e-14)


@needs_node
def test_page_script_flags_what_the_estimate_refuses(llama70b):
    changes = [{"inputs": {"parallel.tp": "3"}},
               {"devices": "128", "inputs": {"parallel.tp": "4"}},
               {"gbs": "66"},
               {"inputs": {"parallel.dp": "0"}},
               {"capacity_gib": "-1"}]
    r = evaluate_in_node(llama70b, changes)
    assert not any(x["valid"] for x in r)
    assert "parallel.tp must divide model.num_heads" in r[0]["errors"]
    devices = "parallel.devices is 128 but parallel.dp (4) × parallel.tp (4) × parallel.pp (4) × parallel.cp (1) = 64"
    assert r[1]["errors"] == [devices]
    assert any("must be a multiple of training.micro_batch_size × parallel.dp (1 × 4)" in e for e in r[2]["errors"])
    assert any("parallel.dp must be a positive integer" in e for e in r[3]["errors"])
    assert any("device.capacity_gib" in e for e in r[4]["errors"])
    # the estimate refuses the same values (exit 2, one clear message)
    for change, needle in ((changes[0], "parallel.tp must divide model.num_heads"),
                           (changes[1], devices), (changes[2], "must be a multiple of")):
        sets = sets_of(evaluate_in_node(llama70b, [change])[0]["command"])
        res = run_memform("estimate", config("llama3-70b.yaml"), *[a for s in sets for a in ("--set", s)])
        assert res.returncode == 2 and needle in res.stderr


@needs_node
def test_devices_check_follows_the_pipeline_size():
    html = whatif_html(config("llama3-405b.yaml"))
    base, more_tp, balanced = evaluate_in_node(html, [{}, {"inputs": {"parallel.tp": "16"}},
                                                      {"inputs": {"parallel.tp": "4", "parallel.dp": "16"}}])
    assert base["valid"]
    assert not more_tp["valid"] and any(e.startswith("parallel.devices is 16384 but") for e in more_tp["errors"])
    assert balanced["valid"]
    est = numbers(config("llama3-405b.yaml"), sets_of(balanced["command"]))
    assert balanced["values"] == breakdown(est)


@needs_node
def test_deepseek_page_variants(deepseek):
    changes = [{}, {"inputs": {"parallel.tp": "8", "parallel.ep": "16"}},
               {"axes": {"parallel.pp": 8, "training.recompute": "selective", "parallel.zero": 1}},
               {"inputs": {"parallel.ep": "3"}}]
    r = evaluate_in_node(deepseek, changes)
    for change, x in zip(changes[:3], r[:3]):
        assert x["valid"], x["errors"]
        assert x["values"] == breakdown(numbers(config("deepseek-v3.yaml"), sets_of(x["command"])))
    assert "parallel.stage_layers=[7,7,7,8,8,8,8,8]" in sets_of(r[2]["command"])
    assert "parallel.ep must divide model.num_experts" in r[3]["errors"]


# ---------------------------------------------------------------- the command line

def test_cli_writes_the_page(tmp_path):
    out = tmp_path / "w.html"
    res = run_memform("whatif", config("llama2-7b.yaml"), "--set", "parallel.tp=1", "--zero", "0,1", "-o", out)
    assert res.returncode == 0, res.stderr
    html = out.read_text()
    assert '<script id="whatif-core">' in html and "--set parallel.tp=1" in html
    assert "wrote" in res.stderr
    bad = run_memform("whatif", config("llama2-7b.yaml"), "-o", tmp_path / "w.txt")
    assert bad.returncode == 2 and ".html" in bad.stderr and "Traceback" not in bad.stderr
    bad = run_memform("whatif", config("llama2-7b.yaml"), "--pp", "two", "-o", out)
    assert bad.returncode == 2 and "--pp" in bad.stderr and "Traceback" not in bad.stderr


# ---------------------------------------------------------------- the real page in Chromium

def _browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright; the browser is Debian's chromium)")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    return sync_playwright


@pytest.fixture(scope="module")
def page_factory(tmp_path_factory):
    sync_playwright = _browser()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        opened = []

        def open_page(html: str):
            path = tmp_path_factory.mktemp("whatif") / "page.html"
            path.write_text(html, encoding="utf-8")
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.route("**/*", lambda route: route.abort() if not route.request.url.startswith("file:")
                       else route.continue_())  # nothing may be fetched from a network
            page.goto(path.as_uri())
            opened.append(page)
            return page, errors

        yield open_page
        browser.close()


def page_numbers(page) -> list[list[str]]:
    cells = page.eval_on_selector_all(
        "#stage-body td[data-category]", "els => els.map(e => [e.dataset.stage, e.dataset.category, e.dataset.bytes])")
    stages: dict[int, dict[str, str]] = {}
    for stage, cat, value in cells:
        stages.setdefault(int(stage), {})[cat] = value
    return [[stages[i][c] for c in CATEGORIES] for i in sorted(stages)]


def estimate_json(name: str, *sets: str) -> dict:
    res = run_memform("estimate", config(name), "--json", *[a for s in sets for a in ("--set", s)])
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def json_numbers(est: dict) -> list[list[str]]:
    return [[str(s["breakdown"][c]) for c in CATEGORIES] for s in est["stages"]]


@pytest.mark.browser
def test_browser_inputs_redraw_the_estimates_numbers(page_factory, llama70b):
    page, errors = page_factory(llama70b)
    assert page_numbers(page) == json_numbers(estimate_json("llama3-70b.yaml"))
    # type tp 8 -> 4 in its box
    page.fill("#in-parallel_tp", "4")
    want = estimate_json("llama3-70b.yaml", "parallel.tp=4")
    assert page_numbers(page) == json_numbers(want)
    fits = page.eval_on_selector_all("#stage-body td[data-category=fits]", "els => els.map(e => e.dataset.fits)")
    assert fits == ["yes" if s["fits"] else "no" for s in want["stages"]]
    assert page.get_attribute("#peak", "data-bytes") == str(want["peak_bytes"])
    # move the micro-batch slider one step (1 -> 2): the micro-batch count follows 64 / (2 × 4) = 8
    page.focus("#in-training_micro_batch_size-slider")
    page.keyboard.press("ArrowRight")
    assert page.input_value("#in-training_micro_batch_size") == "2"
    assert page.input_value("#in-training_num_micro_batches") == "8"
    want = estimate_json("llama3-70b.yaml", "parallel.tp=4", "training.micro_batch_size=2")
    assert page_numbers(page) == json_numbers(want)
    # the bars carry the same bytes
    bars = page.eval_on_selector_all("#chart g.bar", "els => els.map(e => e.dataset.totalBytes)")
    assert bars == [str(s["peak_bytes"]) for s in want["stages"]]
    # a structural variant: pp 8 with full recompute
    page.select_option("#in-parallel_pp", label="8")
    page.select_option("#in-training_recompute", label="full")
    sets = sets_of(page.text_content("#command"))
    assert "parallel.pp=8" in sets and "training.recompute=full" in sets
    assert page_numbers(page) == json_numbers(estimate_json("llama3-70b.yaml", *sets))
    assert len(page_numbers(page)) == 8
    # the step time, MFU and tokens/s as `memform estimate` prints them for the same values
    text = run_memform("estimate", config("llama3-70b.yaml"), "--wide", *[a for s in sets for a in ("--set", s)]).stdout
    line = next(x for x in text.splitlines() if x.startswith("step ≈"))
    step, slowest = re.match(r"step ≈ (\S+ s) \(.*; slowest stage (\d+)\)", line).groups()
    assert page.text_content("#step") == step and f"(slowest stage {slowest})" in page.text_content("#summary")
    assert page.text_content("#mfu") in line and f"{page.text_content('#tps')} tokens/s" in line
    per_stage = page.eval_on_selector_all("#stage-body td[data-category=step]", "els => els.map(e => e.textContent)")
    assert len(per_stage) == 8 and per_stage[int(slowest)] + " s" == step  # the unit is in the column head
    assert errors == []


@pytest.mark.browser
def test_browser_flags_a_failed_require(page_factory, llama70b):
    page, errors = page_factory(llama70b)
    page.fill("#in-parallel_tp", "3")
    assert page.is_visible("#errors")
    assert "parallel.tp must divide model.num_heads" in page.text_content("#error-list")
    assert page.get_attribute("body", "data-valid") == "false"
    assert all(v == "" for row in page_numbers(page) for v in row)  # no number is shown
    res = run_memform("estimate", config("llama3-70b.yaml"), "--json", "--set", "parallel.tp=3")
    assert res.returncode == 2 and "parallel.tp must divide model.num_heads" in res.stderr
    page.fill("#in-parallel_devices", "100")
    page.fill("#in-parallel_tp", "8")
    assert "parallel.devices is 100 but" in page.text_content("#error-list")
    page.fill("#in-parallel_devices", "128")
    assert not page.is_visible("#errors")
    assert page_numbers(page) == json_numbers(estimate_json("llama3-70b.yaml", "parallel.devices=128"))
    assert errors == []


@pytest.mark.browser
def test_browser_deepseek_page(page_factory, deepseek):
    page, errors = page_factory(deepseek)
    assert page_numbers(page) == json_numbers(estimate_json("deepseek-v3.yaml"))
    page.fill("#in-parallel_ep", "16")
    page.fill("#in-model_seq_length", "4096")
    assert page_numbers(page) == json_numbers(estimate_json("deepseek-v3.yaml", "parallel.ep=16",
                                                            "model.seq_length=4096"))
    assert errors == []


@needs_node
@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_bundled_config_page_starts_at_the_estimate(path):
    """One variant per config (its own structure): the page opens on ``memform estimate``'s numbers,
    and doubling the micro-batch size gives the estimate's numbers for that value."""
    model = memform.load_model(path)
    st = model.structure
    one = {"pp": [st.pp], "recompute": None if not isinstance(model.data["training"].get("recompute", "none"), str)
           else [model.data["training"].get("recompute", "none")], "zero": None}
    zero = next((b for b in model.program.bindings.values() if b.path == "parallel.zero"), None)
    if zero is not None:
        one["zero"] = [int(model.bound.value_of(zero.name))]
    html = render_whatif(build_whatif(model, **one))
    mbs = int(model.data["training"].get("micro_batch_size", 1))
    base, doubled = evaluate_in_node(html, [{}, {"inputs": {"training.micro_batch_size": str(2 * mbs)}, "gbs": ""}])
    assert base["valid"], base["errors"]
    assert base["values"] == breakdown(bundled(path))
    assert doubled["valid"], doubled["errors"]
    assert doubled["values"] == breakdown(numbers(path, sets_of(doubled["command"])))


# ---------------------------------------------------------------- the on-disk store

def test_a_second_page_reads_every_variant_from_the_store(tmp_path, monkeypatch):
    """Each variant's compiled structure, JavaScript and labels are stored (purpose ``whatif-`` and a
    digest of the page code): the same page again is built without compiling anything, and is the
    same page; cache=False compiles afresh."""
    monkeypatch.setenv("MEMFORM_CACHE_DIR", str(tmp_path / "cache"))
    options = {"pp": [1, 2, 3], "zero": [0, 1]}
    first = whatif_html(config("llama2-7b.yaml"), ["parallel.tp=2"], **options)
    entries = sorted((tmp_path / "cache").glob("whatif-*/*/*.json"))
    stored = [json.loads(e.read_text()) for e in entries]
    assert stored and all(s["body"] is None or s["body"]["extra"]["js"].startswith("function (") for s in stored)

    def refuse(cls, *args, **kwargs):
        raise AssertionError("compiled again")
    monkeypatch.setattr(CompiledModel, "build", classmethod(refuse))
    assert whatif_html(config("llama2-7b.yaml"), ["parallel.tp=2"], **options) == first
    with pytest.raises(AssertionError, match="compiled again"):
        whatif_html(config("llama2-7b.yaml"), ["parallel.tp=2"], cache=False, **options)
    assert sorted((tmp_path / "cache").glob("whatif-*/*/*.json")) == entries


def test_cli_no_cache_writes_no_entries(tmp_path):
    out = tmp_path / "w.html"
    cache = tmp_path / "cache"
    res = run_memform("whatif", config("llama2-7b.yaml"), "--zero", "0", "--pp", "1", "--no-cache", "-o", out,
                      env_extra={"MEMFORM_CACHE_DIR": str(cache)})
    assert res.returncode == 0, res.stderr
    assert not list(cache.rglob("*.json"))
    res = run_memform("whatif", config("llama2-7b.yaml"), "--zero", "0", "--pp", "1", "-o", tmp_path / "c.html",
                      env_extra={"MEMFORM_CACHE_DIR": str(cache)})
    assert res.returncode == 0, res.stderr
    assert list(cache.glob("whatif-*/*/*.json"))
    assert (tmp_path / "c.html").read_text() == out.read_text()


def test_zero_axis_says_when_the_distributed_optimizer_shards_at_zero_0():
    """Issue 32: deepseek-v3 runs Megatron's distributed optimizer at ZeRO 0; the select showed "0 (config)"
    as if nothing were sharded (common.mf: shard_os applies with dist_opt at any ZeRO stage)."""
    from memform.engine.model import load_model
    from memform.report.whatif import default_axes

    axes = {a.key: a for a in default_axes(load_model(ROOT / "configs" / "deepseek-v3.yaml"))}
    assert "distributed optimizer on" in axes["parallel.zero"].label
    plain = {a.key: a for a in default_axes(load_model(ROOT / "configs" / "gpt3-175b.yaml"))}
    assert plain["parallel.zero"].label == "ZeRO stage"
