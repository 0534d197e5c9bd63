"""``memform compare`` with N variants (issue 16): several configs, ``--variant``, ``--set-a/-b``
and ``--vary`` sweeps; failed variants as rows; every output format; the grouped chart; and the
setup line (parallel degrees, batching, sequence, devices, parameter count) in report and plot titles.

Expected numbers always come from ``memform estimate --json`` of the same config and overrides
(the engine's own reference cases live in the engine's tests), so these tests check that a
comparison neither changes, drops nor mislabels them. The failing variant is Llama-3-70B at
tp = 3: its 64 attention heads (``configs/llama3-70b.yaml``) are not divisible by 3, which
``formulas/dense.mf``'s ``require`` refuses.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from cli_helpers import ROOT, run_memform
from cli_inprocess import memform_in_process  # memform.cli.main in this process (same output)

import memform
from memform.analysis.compare import MAX_VARIANTS, compare, parse_variant, plan
from memform.engine.interpreter import CATEGORIES
from memform.errors import MemformError
from memform.report.render import render_comparison, setup_line, tex_escape
from memform.units import human_bytes, signed_bytes

SVG_NS = "{http://www.w3.org/2000/svg}"
THREE = ["configs/llama2-7b.yaml", "configs/llama3-8b.yaml", "configs/mixtral-8x7b.yaml"]


def estimate_json(config: str, *sets: str) -> dict:
    args = ["estimate", config, "--json"] + [x for s in sets for x in ("--set", s)]
    r = memform_in_process(*args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def compare_json(*args: str) -> dict:
    r = memform_in_process("compare", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def numbers(d: dict) -> dict:
    """What a comparison must carry over unchanged from ``estimate --json``."""
    return {"peak_bytes": d["peak_bytes"], "peak_stage": d["peak_stage"], "setup": d["setup"],
            "parameters": d["parameters"],
            "stages": [(s["stage"], s["breakdown"], s["peak_bytes"]) for s in d["stages"]]}


def expected_delta(base: dict, other: dict, stage: int) -> dict | None:
    if stage >= len(base["stages"]) or stage >= len(other["stages"]):
        return None
    a, b = base["stages"][stage], other["stages"][stage]
    return {**{c: b["breakdown"][c] - a["breakdown"][c] for c in CATEGORIES}, "peak": b["peak_bytes"] - a["peak_bytes"]}


# ------------------------------------------------------------------ N configs
def test_three_configs_json_equals_each_estimate_and_deltas_vs_first():
    d = compare_json(*THREE)
    ests = [estimate_json(c) for c in THREE]
    assert [v["key"] for v in d["variants"]] == ["A", "B", "C"] and d["baseline"] == "A"
    for v, e in zip(d["variants"], ests):
        assert v["ok"] and v["error"] is None
        assert numbers(v["estimate"]) == numbers(e)
        assert v["peak_delta_bytes"] == (None if v["key"] == "A" else e["peak_bytes"] - ests[0]["peak_bytes"])
        n = max(len(x["stages"]) for x in ests)
        assert [s["delta"] for s in v["stage_deltas"]] == (
            [None] * n if v["key"] == "A" else [expected_delta(ests[0], e, i) for i in range(n)])
    # the two-variant fields still describe A and B
    assert numbers(d["a"]) == numbers(ests[0]) and numbers(d["b"]) == numbers(ests[1])
    assert d["peak_delta_bytes"] == ests[1]["peak_bytes"] - ests[0]["peak_bytes"]
    keys = {k["key"]: k["values"] for k in d["config_keys"]}
    assert keys["name"] == ["llama2-7b", "llama3-8b", "mixtral-8x7b"]
    assert keys["model.vocab_size"] == [32000, 128256, 32000]   # the configs' own values


def test_three_configs_terminal_shows_every_variant_side_by_side():
    r = run_memform("compare", *THREE)
    assert r.returncode == 0, r.stderr
    ests = [estimate_json(c) for c in THREE]
    out = r.stdout
    for key, e in zip("ABC", ests):
        assert f"{key} = {e['model']}" in out
        assert f"peak {human_bytes(e['peak_bytes'])} on stage {e['peak_stage']}" in out
    assert f"peak C - A: {signed_bytes(ests[2]['peak_bytes'] - ests[0]['peak_bytes'])}" in out
    header = next(l for l in out.splitlines() if l.startswith("stage 0"))
    assert header.split() == ["stage", "0", "A", "B", "B", "-", "A", "C", "C", "-", "A"]
    assert "name: llama2-7b | llama3-8b | mixtral-8x7b" in out


# ------------------------------------------------------------------ sweeps
SWEEP = [1, 2, 4, 8]


def test_vary_sweep_numbers_equal_estimate_with_set():
    d = compare_json("configs/llama2-7b.yaml", "--vary", "parallel.tp=" + ",".join(map(str, SWEEP)), "--free-devices")
    assert [v["label"] for v in d["variants"]] == [f"llama2-7b (parallel.tp={t})" for t in SWEEP]
    assert d["sweep"] == [{"key": "parallel.tp", "values": [str(t) for t in SWEEP]}]
    ests = [estimate_json("configs/llama2-7b.yaml", f"parallel.tp={t}") for t in SWEEP]
    for v, e in zip(d["variants"], ests):
        assert numbers(v["estimate"]) == numbers(e)
        if v["key"] != "A":
            assert [s["delta"] for s in v["stage_deltas"]] == [expected_delta(ests[0], e, i)
                                                              for i in range(len(e["stages"]))]
    assert {"key": "parallel.tp", "values": SWEEP} in d["config_keys"]


def test_vary_sweep_terminal_uses_one_row_per_variant():
    r = memform_in_process("compare", "configs/llama2-7b.yaml", "--vary", "parallel.tp=1,2,4,8", "--free-devices")
    assert r.returncode == 0, r.stderr
    ests = [estimate_json("configs/llama2-7b.yaml", f"parallel.tp={t}") for t in SWEEP]
    assert r.stdout.startswith("compare: llama2-7b: parallel.tp = 1, 2, 4, 8")
    stage0 = r.stdout.split("\nstage 0")[1].split("\nstage 1")[0].splitlines()
    rows = {l.split()[0]: l.split() for l in stage0[1:] if l.strip()}
    for key, e in zip("ABCD", ests):   # A B C D rows: the breakdown, then the peak
        assert " ".join(rows[key][-2:]) == human_bytes(e["stages"][0]["peak_bytes"])
    d = ests[3]["stages"][0]["peak_bytes"] - ests[0]["stages"][0]["peak_bytes"]
    assert signed_bytes(d) in " ".join(rows["D-A"])


def test_vary_of_a_degree_keeps_the_config_device_count():
    """issue 32: "tp 2 -> 4" is a question about the same cluster. llama2-7b runs dp 2 × tp 2 × pp 2 on 8
    devices: a variant that changes tp (not dp) takes dp = 8 / (tp × pp), and tp 8 with pp 2 cannot hold 8
    devices, which that variant says; --free-devices lets the count follow the degrees (the old behaviour)."""
    d = compare_json("configs/llama2-7b.yaml", "--vary", "parallel.tp=1,2,4,8")
    assert [v["label"] for v in d["variants"]] == ["llama2-7b (parallel.tp=1, parallel.dp=4)", "llama2-7b (parallel.tp=2)",
                                                   "llama2-7b (parallel.tp=4, parallel.dp=1)", "llama2-7b (parallel.tp=8)"]
    for v, sets in zip(d["variants"][:3], (["parallel.tp=1", "parallel.dp=4"], ["parallel.tp=2"],
                                           ["parallel.tp=4", "parallel.dp=1"])):
        assert numbers(v["estimate"]) == numbers(estimate_json("configs/llama2-7b.yaml", *sets))
        assert v["estimate"]["setup"]["devices"] == 8
    assert not d["variants"][3]["ok"]
    assert "keeps the config's 8 devices, which tp × pp × cp = 16 does not divide" in d["variants"][3]["error"]
    # dp given by the variant itself, or a key outside the device product: nothing is added
    cmp = compare(ROOT / "configs/llama2-7b.yaml", variants=["parallel.tp=4,parallel.dp=2", "training.recompute=full"])
    assert [v.overrides for v in cmp.variants[1:]] == [["parallel.tp=4", "parallel.dp=2"], ["training.recompute=full"]]
    assert cmp.variants[1].est.setup["devices"] == 16
    free = compare_json("configs/llama2-7b.yaml", "--vary", "parallel.tp=1,2", "--free-devices")
    assert [v["estimate"]["setup"]["devices"] for v in free["variants"]] == [4, 8]


def test_several_vary_make_the_cartesian_product():
    base = ROOT / "configs/llama2-7b.yaml"
    cmp = compare(base, vary=["parallel.tp=1,2", "training.recompute=none,full"], free_devices=True)
    combos = [(t, m) for t in (1, 2) for m in ("none", "full")]
    assert [v.overrides for v in cmp.variants] == [[f"parallel.tp={t}", f"training.recompute={m}"] for t, m in combos]
    for v, (t, m) in zip(cmp.variants, combos):
        e = memform.estimate(base, [f"parallel.tp={t}", f"training.recompute={m}"])
        assert [s.values for s in v.est.stages] == [s.values for s in e.stages]


def test_variant_and_set_ab_and_vary_combine():
    runs, sweep = plan(["x.yaml", "y.yaml"], variants=["parallel.tp=4,training.recompute=[full,none]"],
                       set_a=["parallel.dp=1"], set_b=["parallel.pp=2"], vary=["parallel.cp=1,2"])
    assert runs == [("x.yaml", ["parallel.dp=1", "parallel.cp=1"]), ("x.yaml", ["parallel.dp=1", "parallel.cp=2"]),
                    ("y.yaml", ["parallel.pp=2", "parallel.cp=1"]), ("y.yaml", ["parallel.pp=2", "parallel.cp=2"]),
                    ("x.yaml", ["parallel.tp=4", "training.recompute=[full,none]", "parallel.cp=1"]),
                    ("x.yaml", ["parallel.tp=4", "training.recompute=[full,none]", "parallel.cp=2"])]
    assert sweep == [("parallel.cp", ["1", "2"])]
    # one config: --set-b makes B that config again; --variant then is B, and --set-b applies to it
    assert plan(["x.yaml"], set_b=["a.b=1"])[0] == [("x.yaml", []), ("x.yaml", ["a.b=1"])]
    assert plan(["x.yaml"], variants=["a.b=2"], set_b=["a.c=1"])[0] == [("x.yaml", []), ("x.yaml", ["a.b=2", "a.c=1"])]


def test_bad_variant_and_sweep_specs_are_user_errors():
    with pytest.raises(MemformError, match="'2' is not KEY=VALUE"):
        parse_variant("parallel.tp=4,2")
    assert parse_variant("model.x=[1, 2],a.b='c,d'") == ["model.x=[1, 2]", "a.b='c,d'"]
    with pytest.raises(MemformError, match=f"at most {MAX_VARIANTS}"):
        plan(["x.yaml"], vary=["parallel.tp=" + ",".join(map(str, range(1, 10))),
                               "parallel.dp=" + ",".join(map(str, range(1, 9)))])
    for args, text in [(["--vary", "parallel.tp"], "--vary expects KEY=VALUE1,VALUE2"),
                       (["--vary", "parallel.tp=1,,2", "--free-devices"], "empty item"),
                       (["--vary", "parallel.tp=1,1", "--free-devices"], "given twice"),
                       ([], "two variants or more")]:
        r = memform_in_process("compare", "configs/llama2-7b.yaml", *args)
        assert r.returncode == 2 and text in r.stderr and "Traceback" not in r.stderr, r.stderr


# ------------------------------------------------------------------ failures
def test_failing_variant_is_a_row_with_its_error():
    r = memform_in_process("estimate", "configs/llama3-70b.yaml", "--set", "parallel.tp=3")
    assert r.returncode == 2
    message = r.stderr.strip().removeprefix("memform: error: ")
    assert "num_heads" in message
    d = compare_json("configs/llama3-70b.yaml", "--vary", "parallel.tp=4,3,8", "--free-devices")
    ok = [v["ok"] for v in d["variants"]]
    assert ok == [True, False, True]
    b = d["variants"][1]
    assert b["error"] == message and b["estimate"] is None and b["peak_delta_bytes"] is None
    assert all(s["delta"] is None for s in b["stage_deltas"])
    assert {"key": "parallel.tp", "values": [4, 3, 8]} in d["config_keys"]   # read from the config anyway
    e8 = estimate_json("configs/llama3-70b.yaml", "parallel.tp=8")
    assert numbers(d["variants"][2]["estimate"]) == numbers(e8)
    t = memform_in_process("compare", "configs/llama3-70b.yaml", "--vary", "parallel.tp=4,3,8", "--free-devices")
    assert t.returncode == 0, t.stderr
    assert f"B = llama3-70b (parallel.tp=3)\n    FAILED: {message}" in t.stdout


def test_failing_baseline_hands_over_to_the_first_that_estimated():
    cmp = compare(ROOT / "configs/llama3-70b.yaml", vary=["parallel.tp=3,4,8"], free_devices=True)
    assert cmp.baseline == 1 and not cmp.variants[0].ok
    txt = render_comparison(cmp, "txt")
    assert "deltas against B" in txt and "peak C - B:" in txt


def test_every_variant_failing_exits_2_with_every_message():
    r = memform_in_process("compare", "configs/llama3-70b.yaml", "--vary", "parallel.tp=3,5", "--free-devices")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "every variant failed" in r.stderr
    assert "parallel.tp = 3;" in r.stderr and "parallel.tp = 5;" in r.stderr
    r = memform_in_process("compare", "configs/no-such.yaml", "configs/llama3-70b.yaml", "--set", "parallel.tp=3")
    assert r.returncode == 2 and "no-such.yaml" in r.stderr and "parallel.tp = 3;" in r.stderr


# ------------------------------------------------------------------ formats
@pytest.fixture(scope="module")
def mixed():
    """Four variants of Llama-3-70B, tp 2, 3 (fails), 4, 8 and their ``estimate --json``."""
    cmp = compare(ROOT / "configs/llama3-70b.yaml", vary=["parallel.tp=2,3,4,8"], free_devices=True)
    ests = {t: memform.estimate(ROOT / "configs/llama3-70b.yaml", [f"parallel.tp={t}"]) for t in (2, 4, 8)}
    return cmp, ests


def test_markdown_has_every_variant_failure_and_delta(mixed):
    cmp, ests = mixed
    md = render_comparison(cmp, "md")
    assert md.startswith("# Comparison: llama3-70b: parallel.tp = 2, 3, 4, 8\n")
    assert "| **B** | llama3-70b (parallel.tp=3) | **failed**: parallel.tp must divide" in md
    for key, t in (("C", 4), ("D", 8)):
        assert f"**{signed_bytes(ests[t].peak_bytes - ests[2].peak_bytes)}**" in md
        assert f"- **{key}** llama3-70b: {setup_line(ests[t])}" in md
    assert "| stage | category | A | C | C − A | change | D | D − A | change |" in md
    assert "| `parallel.tp` | 2 | 3 | 4 | 8 |" in md


def test_html_tables_and_grouped_chart_carry_exact_bytes(mixed, tmp_path):
    cmp, ests = mixed
    html = render_comparison(cmp, "html")
    assert html.startswith("<!DOCTYPE html>")
    root = ET.fromstring(html)
    rows = {tr.get("data-variant"): tr for tr in root.find(".//table[@id='variants']").iter("tr")
            if tr.get("data-variant")}
    assert rows["b"].get("data-ok") == "false" and "num_heads" in "".join(rows["b"].itertext())
    by_key = {"a": ests[2], "c": ests[4], "d": ests[8]}
    for k, e in by_key.items():
        assert rows[k].find(".//td[@data-side='peak']").get("data-bytes") == str(e.peak_bytes)
    for tr in root.find(".//table[@id='diffs']").iter("tr"):
        if tr.get("data-stage") is None:
            continue
        i, c = int(tr.get("data-stage")), tr.get("data-category")
        val = {k: (e.stages[i].peak_bytes if c == "peak" else e.stages[i].values[c]) for k, e in by_key.items()}
        cells = [td for td in tr.iter("td") if td.get("data-side")]
        assert {td.get("data-side"): int(td.get("data-bytes")) for td in cells if td.get("data-side") != "delta"} == val
        assert {td.get("data-variant"): int(td.get("data-bytes")) for td in cells if td.get("data-side") == "delta"} \
            == {k: val[k] - val["a"] for k in ("c", "d")}
    svg = root.find(f".//{SVG_NS}svg")
    bars = [g for g in svg.iter(f"{SVG_NS}g") if g.get("class") == "bar"]
    assert [g.get("data-bar") for g in bars] == [f"{k}-{i}" for i in range(4) for k in "acd"]
    for g in bars:
        k, i = g.get("data-bar").split("-")
        segs = {r.get("data-category"): int(r.get("data-bytes")) for r in g.iter(f"{SVG_NS}rect")}
        assert segs == {c: v for c, v in by_key[k].stages[int(i)].values.items() if v > 0}
    # group labels are the stage numbers; bars of one group sit left of the next group's
    assert [t.text for t in svg.iter(f"{SVG_NS}text") if t.get("class") == "group"] == ["0", "1", "2", "3"]
    xs = [float(next(g.iter(f"{SVG_NS}rect")).get("x")) for g in bars]
    assert xs == sorted(xs)


def test_tex_balances_and_escapes(mixed):
    cmp, _ = mixed
    tex = render_comparison(cmp, "tex")
    assert tex.count("\\begin{tabular}") == tex.count("\\end{tabular}") == 3
    assert tex.count("{") - tex.count("\\{") == tex.count("}") - tex.count("\\}")
    assert tex_escape(cmp.variants[1].error) in tex
    assert "model.num\\_heads" in tex


def test_cli_formats_from_suffix(tmp_path):
    args = ["compare", "configs/llama3-70b.yaml", "--vary", "parallel.tp=4,3,8", "--free-devices"]
    for suffix, start in ((".md", "# Comparison"), (".html", "<!DOCTYPE html>"), (".tex", "\\documentclass")):
        out = tmp_path / f"c{suffix}"
        r = memform_in_process(*args, "-o", out)
        assert r.returncode == 0, r.stderr
        assert out.read_text().startswith(start)
        assert "variant B (llama3-70b (parallel.tp=3)) failed" in r.stderr
    r = memform_in_process(*args, "-o", tmp_path / "c.docx")
    assert r.returncode == 2 and ".md" in r.stderr


def test_png_output_is_a_png(tmp_path):
    out = tmp_path / "cmp.png"
    r = run_memform("compare", *THREE, "-o", out)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_svg_chart_has_a_bar_group_per_stage_and_the_legend(mixed, tmp_path):
    from memform.report.plot import plot_comparison
    cmp, ests = mixed
    out = plot_comparison(cmp, tmp_path / "cmp.svg")
    text = out.read_text()
    assert ET.parse(out).getroot().tag == f"{SVG_NS}svg"
    for label in ("parameters", "optimizer states", "pipeline stage", "B = llama3-70b (parallel.tp=3), failed",
                  "D = llama3-70b (parallel.tp=8)", f"device {human_bytes(ests[2].capacity_bytes)}"):
        assert label in text, label


# ------------------------------------------------------------------ setup line in titles (issue 16 b)
def header_setup(config: str) -> str:
    """The setup line the ``estimate`` header prints (its second line, unwrapped with --wide)."""
    r = run_memform("estimate", config, "--wide")
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()[1].strip()


def test_report_titles_carry_the_setup_line(tmp_path):
    config = "configs/mixtral-8x7b.yaml"
    line = header_setup(config)
    assert line == setup_line(memform.estimate(ROOT / config))   # one formatting function everywhere
    assert "ep=8" in line and "46,702,792,704" in line and "16 devices" in line
    outs = {}
    for suffix in (".md", ".html", ".tex"):
        outs[suffix] = tmp_path / f"r{suffix}"
        r = memform_in_process("report", config, "-o", outs[suffix])
        assert r.returncode == 0, r.stderr
    md = outs[".md"].read_text().splitlines()
    assert md[0].startswith("# mixtral-8x7b") and f"{line}." in md[:5]
    root = ET.fromstring(outs[".html"].read_text())
    assert root.find(".//span[@class='setup']").text == f"{line}."
    assert line in root.find(f".//{SVG_NS}svg/{SVG_NS}title").text
    tex = outs[".tex"].read_text()
    title = tex[tex.index("\\title{"):tex.index("\\author")]
    assert tex_escape(line) in title


def test_plot_title_carries_the_setup_line(tmp_path):
    config = "configs/mixtral-8x7b.yaml"
    line = header_setup(config)
    out = tmp_path / "p.svg"
    r = run_memform("plot", config, "-o", out)
    assert r.returncode == 0, r.stderr
    text = out.read_text()   # matplotlib keeps every drawn string as a comment next to its glyphs
    degrees, rest = line.split(", ", 1)
    assert degrees in text and "46,702,792,704" in text and "45.10 B expert" in text
    for piece in rest.split(", "):
        assert piece.split(";")[0] in text, piece


def test_compare_headers_carry_each_variants_setup_line():
    r = memform_in_process("compare", "configs/llama2-7b.yaml", "--set-b", "parallel.tp=1", "--set-b", "parallel.dp=4")
    assert r.returncode == 0, r.stderr
    a = setup_line(memform.estimate(ROOT / "configs/llama2-7b.yaml"))
    b = setup_line(memform.estimate(ROOT / "configs/llama2-7b.yaml", ["parallel.tp=1", "parallel.dp=4"]))
    # each wrapped within 100 columns: 4 spaces in, continued 6 in (issue 32)
    out = r.stdout.replace("\n      ", " ")
    assert f"    {a}\n" in out and f"    {b}\n" in out
    assert max(len(line) for line in r.stdout.splitlines()) <= 100
    assert "parallel.tp: 2 -> 1" in r.stdout   # the two-variant form is as before


def test_variants_with_a_device_show_their_step_time_and_its_difference():
    # issue 14: memory is the constraint, time the objective -- a comparison of plans shows each one's
    # step time (the estimate's own line) and its difference from the baseline's
    data = compare_json("configs/llama3-70b.yaml", "--vary", "parallel.tp=4,8", "--free-devices")
    want = [estimate_json("configs/llama3-70b.yaml", f"parallel.tp={t}")["time"]["step_seconds"] for t in (4, 8)]
    got = [v["estimate"]["time"]["step_seconds"] for v in data["variants"]]
    assert got == want
    assert data["variants"][0]["step_delta_seconds"] is None
    assert data["variants"][1]["step_delta_seconds"] == pytest.approx(want[1] - want[0], rel=1e-12)
    r = memform_in_process("compare", "configs/llama3-70b.yaml", "--vary", "parallel.tp=4,8", "--free-devices")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert sum(l.strip().startswith("step ≈ ") for l in lines) == 2
    delta = next(l for l in lines if l.startswith("step B - A: "))
    assert delta.startswith(f"step B - A: {want[1] - want[0]:+.3g} s (")
    for fmt in ("md", "html", "tex"):
        r = memform_in_process("compare", "configs/llama3-70b.yaml", "--vary", "parallel.tp=4,8", "--free-devices", "--format", fmt)
        assert r.returncode == 0, r.stderr
        step = "step $\\approx$ " if fmt == "tex" else "step ≈ "
        assert r.stdout.count(step) == 2 and f"{want[1] - want[0]:+.3g} s vs A" in r.stdout, fmt


def test_a_variant_without_a_time_model_shows_no_step_line():
    # llama2-7b names no device peak FLOP/s: no time model, so no step line and no step difference
    data = compare_json("configs/llama2-7b.yaml", "configs/llama3-70b.yaml")
    assert [v["step_delta_seconds"] for v in data["variants"]] == [None, None]
    r = memform_in_process("compare", "configs/llama2-7b.yaml", "configs/llama3-70b.yaml")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("step ≈ ") == 1 and "step B - A" not in r.stdout
