"""Issue 32, robustness: every command end to end with hypothesis-drawn values for every config key.

``tests/test_fuzz_config.py`` fuzzes what ``memform.estimate`` accepts; here each command of the
command line (estimate, report, solve, search, whatif, compare, import) runs in-process through
``memform.cli.main`` on a small config with one or two keys that ``memform keys`` lists set to a
drawn value: huge (``1e400`` as the YAML reader takes it: an exact 10^400), tiny, negative, NaN,
infinite, of the wrong type, a list, a mapping, a string. Each run must end with exit status 0 or
2 (``solve`` and ``search`` also 1: "nothing fits" is their answer, not an error) and never a traceback; a 2 comes
with one ``memform: error:`` paragraph. Values no key can take (NaN, infinities, mappings) must be
refused naming the key. A few cases run the real console script in a subprocess.

The default run draws a few examples per command (about 20 s in all); ``-m slow`` draws many more
(``MEMFORM_FUZZ_EXAMPLES`` scales it).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import traceback
from pathlib import Path

import pytest
import yaml
from cli_helpers import ROOT, run_memform
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memform import cli
from memform.cli.keys import key_docs
from memform.errors import EXIT_USER_ERROR
from memform.lang.loader import load_program
from memform.resources import formulas_dir

#: a small dense model with a time model (a search ranks by step time): quick to estimate and compile
BASE = {"name": "fuzz",
        "model": {"hidden_size": 256, "num_heads": 4, "num_layers": 4, "ffn_hidden_size": 1024,
                  "vocab_size": 1024, "seq_length": 256},
        "parallel": {"dp": 2, "tp": 2, "pp": 2},
        "training": {"micro_batch_size": 1, "global_batch_size": 8},
        "device": {"capacity_gib": 80, "peak_flops_bf16": 1e15, "intra_node_bandwidth": 4.5e11,
                   "inter_node_bandwidth": 5e10}}
#: every key `memform keys` lists for moe.mf (which includes dense.mf, common.mf, time.mf) and the
#: structural keys memform reads itself
KEYS = [d.path for d in key_docs(load_program([formulas_dir() / "moe.mf"]))]
#: YAML text for values Python's YAML writer cannot spell: the reader takes 1e400 as the exact 10^400
RAW = {"HUGE": "1e400", "NEG_HUGE": "-1e400"}
#: values that no key accepts: the refusal must name the key
NEVER = ("NaN", "inf", "-inf", "mapping")
SCALARS = st.sampled_from([
    0, -1, 1, 3, 7, 2 ** 31, 2 ** 63, 10 ** 30, -10 ** 30, "HUGE", "NEG_HUGE",
    0.5, 1e-320, 1e-300, 1e300, -1e300, math.nan, math.inf, -math.inf,
    True, False, None, "", "x", "1e400", "bf16", "full", "none", "1f1b", "swiglu", "cuda-caching",
    [1, 2], [], ["M", "*"], {"a": 1},
])
#: how many examples each command draws (the default run's budget is about 20 s for the file)
FAST = {"estimate": 15, "report": 8, "solve": 6, "search": 4, "whatif": 2, "compare": 6, "import": 15}
SLOW_FACTOR = int(os.environ.get("MEMFORM_FUZZ_EXAMPLES", 100)) // 10


def kind(value: object) -> str | None:
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if value in (math.inf, -math.inf):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return "mapping"
    return None


def config_text(plants: list[tuple[str, object]]) -> str:
    data = json.loads(json.dumps(BASE))
    raw = {}
    for path, value in plants:
        node = data
        parts = path.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        if isinstance(value, str) and value in RAW:
            raw[f"__raw_{len(raw)}__"] = RAW[value]
            value = f"__raw_{len(raw) - 1}__"
        node[parts[-1]] = value
    text = yaml.safe_dump(data, allow_unicode=True)
    for marker, spelled in raw.items():
        text = text.replace(marker, spelled)
    return text


def run(argv: list[str]) -> tuple[int, str]:
    """``memform ARGV`` in-process: its exit status and stderr; a traceback fails the test."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(argv)
    except SystemExit as exc:  # argparse: exit 2 with its usage line
        code = exc.code
    except Exception:  # noqa: BLE001 (the point: nothing may escape)
        pytest.fail(f"memform {' '.join(argv)} raised:\n{traceback.format_exc()}")
    return code, err.getvalue()


def check(argv: list[str], plants: list[tuple[str, object]], allowed=(0, EXIT_USER_ERROR)) -> None:
    code, err = run(argv)
    assert code in allowed, (argv, plants, code, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    if code == EXIT_USER_ERROR:
        assert err.startswith("memform: error: ") or err.startswith("usage: "), err[-2000:]
    never = [path for path, value in plants if kind(value) in NEVER]
    if never and len(plants) == 1:
        assert code == EXIT_USER_ERROR and never[0] in err, (plants, err[-2000:])


def commands(path: Path, out: Path) -> dict[str, tuple[list[str], tuple[int, ...]]]:
    c = str(path)
    two = (0, EXIT_USER_ERROR)
    return {
        "estimate": (["estimate", c], two),
        "estimate-json": (["estimate", c, "--json"], two),
        "report": (["report", c, "--format", "html", "-o", str(out / "r.html")], two),
        "report-md": (["report", c], two),
        "solve": (["solve", c, "--for", "training.micro_batch_size", "--max", "64"], (0, 1, EXIT_USER_ERROR)),
        "search": (["search", c, "--devices", "8", "--tp", "1,2", "--pp", "1,2", "--cp", "1", "--zero", "1",
                    "--recompute", "none", "--mbs", "1", "--no-progress", "--format", "html", "-o",
                    str(out / "s.html")], (0, 1, EXIT_USER_ERROR)),  # 1: nothing fits
        "whatif": (["whatif", c, "--pp", "2", "--zero", "0", "--recompute", "none", "-o", str(out / "w.html")], two),
        "compare": (["compare", c, "--vary", "parallel.tp=1,2", "--format", "html", "-o", str(out / "c.html")], two),
    }


PLANTS = st.lists(st.tuples(st.sampled_from(KEYS), SCALARS), min_size=1, max_size=2)


def fuzz(command: str, tmp_path_factory, plants: list[tuple[str, object]], variants: tuple[str, ...] = ()) -> None:
    tmp = tmp_path_factory.mktemp("fuzz")
    path = tmp / "fuzz.yaml"
    path.write_text(config_text(plants), encoding="utf-8")
    table = commands(path, tmp)
    for name in (command, *variants):
        argv, allowed = table[name]
        check(argv, plants, allowed)


def _settings(command: str, slow: bool):
    n = FAST[command] * (SLOW_FACTOR if slow else 1)
    return settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck))


def _make(command: str, slow: bool, variants: tuple[str, ...] = ()):
    @_settings(command, slow)
    @given(plants=PLANTS)
    def test(tmp_path_factory, plants):
        fuzz(command, tmp_path_factory, plants, variants)
    test.__name__ = f"test_{command}_{'many' if slow else 'few'}"
    test.__doc__ = f"memform {command} on drawn values of every key: exit 0 or 2, no traceback."
    return pytest.mark.slow(test) if slow else test


test_estimate_few = _make("estimate", False, ("estimate-json",))
test_report_few = _make("report", False, ("report-md",))
test_solve_few = _make("solve", False)
test_search_few = _make("search", False)
test_whatif_few = _make("whatif", False)
test_compare_few = _make("compare", False)
test_estimate_many = _make("estimate", True, ("estimate-json",))
test_report_many = _make("report", True, ("report-md",))
test_solve_many = _make("solve", True)
test_search_many = _make("search", True)
test_whatif_many = _make("whatif", True)
test_compare_many = _make("compare", True)


# ---------------------------------------------------------------- import: drawn values in a real config.json

HF = ROOT / "tests" / "data" / "importers" / "hf" / "qwen3-8b.config.json"
HF_KEYS = sorted(json.loads(HF.read_text()))


def _import_case(tmp_path_factory, plants) -> None:
    data = json.loads(HF.read_text())
    for key, value in plants:
        data[key] = RAW.get(value, value) if isinstance(value, str) else value
    tmp = tmp_path_factory.mktemp("fuzz-import")
    src = tmp / "config.json"
    src.write_text(json.dumps(data), encoding="utf-8")  # NaN / Infinity as Python's json writes them
    code, err = run(["import", "hf", str(src), "-o", str(tmp / "out.yaml")])
    assert code in (0, EXIT_USER_ERROR), (plants, code, err[-2000:])
    assert "Traceback" not in err
    if code == EXIT_USER_ERROR:
        assert "memform: error: " in err or err.startswith("usage: "), err[-2000:]


IMPORT_PLANTS = st.lists(st.tuples(st.sampled_from(HF_KEYS), SCALARS), min_size=1, max_size=3)


@settings(max_examples=FAST["import"], deadline=None, suppress_health_check=list(HealthCheck))
@given(plants=IMPORT_PLANTS)
def test_import_few(tmp_path_factory, plants):
    """memform import hf on a real Qwen3-8B config.json with drawn values: exit 0 or 2, no traceback."""
    _import_case(tmp_path_factory, plants)


@pytest.mark.slow
@settings(max_examples=FAST["import"] * SLOW_FACTOR, deadline=None, suppress_health_check=list(HealthCheck))
@given(plants=IMPORT_PLANTS)
def test_import_many(tmp_path_factory, plants):
    _import_case(tmp_path_factory, plants)


# ---------------------------------------------------------------- the tracebacks found, as fixed cases

@pytest.mark.parametrize("command", ["estimate-json", "report", "solve", "search", "whatif", "compare"])
@pytest.mark.parametrize("plant", [
    ("device.capacity_gib", "HUGE"),                # the regression: OverflowError formatting the error
    ("allocator.max_split_size_mb", "HUGE"),        # int(inf) in the allocator replay's settings
    ("device.intra_node_bandwidth", "HUGE"),        # solve: 10^400 into a float in the compiled time terms
    ("device.context_mib", 1e-320),                 # solve: a 10^320 denominator into an int64 column
    ("device.capacity_gib", 10 ** 30),              # search: 2^130 bytes of headroom into an int64 column
    ("training.global_batch_size", 10 ** 30),       # solve, search: gbs % (b × dp) over an int64 column
])
def test_found_tracebacks_are_clear_errors(tmp_path_factory, command, plant):
    tmp = tmp_path_factory.mktemp("found")
    path = tmp / "fuzz.yaml"
    path.write_text(config_text([plant]), encoding="utf-8")
    argv, _ = commands(path, tmp)[command]
    code, err = run(argv)
    refused_by = {"device.capacity_gib": ("search",), "training.global_batch_size": ("solve", "search")}
    if plant[1] == 10 ** 30 and command not in refused_by[plant[0]]:  # a silly value the other commands take
        assert code in (0, EXIT_USER_ERROR) and "Traceback" not in err, err[-2000:]
        return
    assert code == EXIT_USER_ERROR and plant[0] in err and any(f"2^{n}" in err for n in (200, 33, 62)), err[-2000:]
    assert "\n\n" not in err.strip()  # one paragraph


# ---------------------------------------------------------------- the real console script

def test_console_script_on_a_huge_capacity(tmp_path):
    """``device.capacity_gib: 1e400`` (issue 32): exit 2, one line naming the key, no traceback (every
    command: ``-m slow``)."""
    path = tmp_path / "huge.yaml"
    path.write_text(config_text([("device.capacity_gib", "HUGE")]), encoding="utf-8")
    res = run_memform("estimate", path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.startswith("memform: error: config key 'device.capacity_gib'")
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("command", ["estimate", "report", "solve", "search", "whatif", "compare", "sensitivity",
                                     "derive"])
@pytest.mark.parametrize("plant", [("device.capacity_gib", "HUGE"), ("model.hidden_size", math.nan),
                                   ("parallel.tp", "x"), ("allocator.max_split_size_mb", "HUGE")])
def test_console_script_every_command(tmp_path, command, plant):
    path = tmp_path / "bad.yaml"
    path.write_text(config_text([plant]), encoding="utf-8")
    extra = {"solve": ["--for", "training.micro_batch_size"], "sensitivity": ["--wrt", "parallel.tp"],
             "search": ["--devices", "8", "--no-progress"], "whatif": ["-o", "-"],
             "compare": ["--vary", "training.micro_batch_size=1,2"]}.get(command, [])  # not the planted key
    res = run_memform(command, path, *extra)
    assert res.returncode == 2 and "Traceback" not in res.stderr and plant[0] in res.stderr, res.stderr[-2000:]
