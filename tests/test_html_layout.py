"""Issue 32: every HTML output as a new user opens it, in headless Chromium (Playwright, Debian's chromium).

Each page (``memform report``, ``search --format html``, ``whatif``, ``compare``) is written by the
command line in-process and opened at 1280, 1400 and 1920 px; a screenshot of each is kept under a
pytest tmp directory (not committed: ``--basetemp`` chooses where). No table may be clipped: a
table fits its container (``scrollWidth <= clientWidth``) and the page does not scroll sideways, or
the table scrolls inside its own box and its key columns (what-if's peak and fits, the search's step
time and MFU, compare's stage, category and baseline) lie within the window. The charts state the
fit verdict with the digits it needs, the search scatter turns logarithmic over orders of magnitude,
and the what-if tp slider offers exactly the values ``memform estimate`` accepts.

One small check runs by default (two pages at 1280 px, seconds); the full set is ``-m slow``.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest
from cli_helpers import ROOT

import memform
from memform import cli
from memform.errors import MemformError
from memform.report.chart import gib_near, near_bytes, verdict
from memform.report.search import log_axis

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
GIB = 2 ** 30

#: the header cells that must stay in the window when a table scrolls in its own box
KEY_HEADERS = ("#stages th[data-col=peak], #stages th[data-col=fits], #stages th[data-col=step], "
               "#plans th[data-field=step_seconds], #plans th[data-field=mfu], #plans th[data-field=peak_bytes], "
               "#diffs th:nth-child(-n+3)")

CLIPPING = """(keys) => {
  const out = [];
  const vw = document.documentElement.clientWidth;
  if (document.documentElement.scrollWidth > vw + 1)
    out.push(`the page scrolls sideways: ${document.documentElement.scrollWidth} px in a ${vw} px window`);
  for (const t of document.querySelectorAll("table")) {
    if (t.offsetParent === null) continue;               // in a closed <details>
    const box = t.parentElement;
    const name = t.id || t.className || "table";
    if (t.scrollWidth <= box.clientWidth + 1) continue;
    const scrolls = ["auto", "scroll"].includes(getComputedStyle(box).overflowX);
    const edge = Math.min(vw, box.getBoundingClientRect().right);
    const heads = [...t.querySelectorAll(keys)];
    const lost = heads.filter(h => h.getBoundingClientRect().right > edge + 1).map(h => h.textContent.trim());
    if (!scrolls) out.push(`${name}: ${t.scrollWidth} px in a ${box.clientWidth} px container that does not scroll`);
    else if (!heads.length) out.push(`${name}: ${t.scrollWidth} px in a ${box.clientWidth} px box and no key columns`);
    else if (lost.length) out.push(`${name}: key columns ${lost.join(", ")} beyond the window (${edge} px)`);
  }
  return out;
}"""


def config(name: str) -> Path:
    return ROOT / "configs" / name


def write(tmp: Path, name: str, *argv: str) -> Path:
    """Run ``memform ARGV -o tmp/name`` in-process (exit 0 expected) and return the page."""
    out = tmp / name
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main([*map(str, argv), "-o", str(out)])
    assert code == 0, err.getvalue()
    return out


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright; the browser is Debian's chromium)")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("html-screenshots")


def open_page(browser, path: Path, width: int):
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.route("**/*", lambda route: route.abort() if not route.request.url.startswith("file:") else route.continue_())
    page.goto(path.as_uri())
    return page, errors


def check_layout(browser, path: Path, width: int, shots: Path) -> None:
    page, errors = open_page(browser, path, width)
    try:
        page.screenshot(path=str(shots / f"{path.stem}-{width}.png"), full_page=True)
        assert page.evaluate(CLIPPING, KEY_HEADERS) == [], (path.name, width)
        assert errors == []
    finally:
        page.close()


# ---------------------------------------------------------------- the number formats (no browser)

@pytest.mark.parametrize("value, capacity, digits, want", [
    (int(80.04 * GIB), 80 * GIB, 1, "80.04"),       # the case: "80.0" at the 80.00 line read as fitting
    (80 * GIB + 2 ** 20, 80 * GIB, 1, "80.001"),    # 1 MiB over
    (80 * GIB - 2 ** 20, 80 * GIB, 1, "79.999"),    # 1 MiB under: never "80.0" either
    (80 * GIB, 80 * GIB, 1, "80.0"),                # exactly the capacity
    (int(34.2 * GIB), 80 * GIB, 1, "34.2"),         # far from it: one decimal
    (80 * GIB + 1, 80 * GIB, 1, "80.000000001"),    # one byte over: the nine decimals a byte needs
])
def test_bar_figures_compare_with_the_capacity_as_the_bytes_do(value, capacity, digits, want):
    assert gib_near(value, capacity, digits) == want


def test_peak_labels_and_verdicts():
    cap = 80 * GIB
    assert near_bytes(cap + 4 * 2 ** 20, cap) == "80.004 GiB"       # human_bytes says 80.00 GiB for both
    assert near_bytes(int(40.5 * GIB), cap) == "40.50 GiB"
    assert verdict(cap + 2 ** 20, cap) == "does not fit (short by 1.00 MiB)"
    assert verdict(cap - 2 ** 30, cap) == "fits (1.00 GiB to spare)"
    assert verdict(cap - 2 ** 30, cap, fits=False) == "does not fit"  # the allocator's reserved bytes decide


@pytest.mark.parametrize("values, want", [
    ([7.4, 750.0], [5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]),  # llama3-70b on 64 devices
    ([1.0, 2.0, 19.0], None),                                               # within 20x: linear
    ([1e-3, 1e6], [1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6]),  # many decades: powers of ten
])
def test_scatter_axis_is_logarithmic_over_orders_of_magnitude(values, want):
    got = log_axis(values)
    assert (got is None) if want is None else got[2] == want


# ---------------------------------------------------------------- the default run: two pages, one width

def test_report_and_whatif_pages_keep_their_tables_in_view(browser, shots, tmp_path):
    report = write(tmp_path, "report.html", "report", config("llama3-70b.yaml"), "--set", "device.capacity_gib=40.5")
    whatif = write(tmp_path, "whatif.html", "whatif", config("llama2-7b.yaml"), "--pp", "2", "--zero", "1",
                   "--recompute", "selective")
    for path in (report, whatif):
        check_layout(browser, path, 1280, shots)
    page, errors = open_page(browser, report, 1280)
    # 40.502 GiB on a 40.50 GiB device: the bar reads 40.502 (not 40.5: as many decimals as tell the two apart)
    # and the chart says it does not fit (40.54 GiB until stop 49's MLP backward, dense.mf mlp.bwd_grads)
    assert page.text_content("svg .verdict").startswith("peak 40.502 GiB on stage 0: does not fit")
    page.close()
    page, errors = open_page(browser, whatif, 1280)
    assert page.is_visible("#stage-body td[data-category=fits]") and page.is_visible("#stage-body td[data-category=peak]")
    # llama2-7b (8 devices, distributed optimizer): the device count follows the degrees and says so
    assert page.text_content("#devices-used").startswith("These values use 8 devices")
    page.fill("#in-parallel_tp", "4")
    assert page.get_attribute("#devices-used", "data-devices") == "16"
    assert "changed from the config's 8" in page.text_content("#devices-used")
    assert errors == []
    page.close()


# ---------------------------------------------------------------- the full set (-m slow)

@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("html-pages")
    return {
        "report": write(tmp, "report.html", "report", config("llama3-70b.yaml")),
        "report-deepseek": write(tmp, "report-deepseek.html", "report", config("deepseek-v3.yaml")),
        "search": write(tmp, "search.html", "search", config("llama3-70b.yaml"), "--devices", "64", "--format", "html",
                        "--no-progress"),
        "whatif": write(tmp, "whatif.html", "whatif", config("llama3-70b.yaml")),
        "compare": write(tmp, "compare.html", "compare", config("llama3-70b.yaml"), "--vary", "parallel.tp=4,8"),
        "compare-8": write(tmp, "compare-8.html", "compare", config("llama3-70b.yaml"), "--vary", "parallel.tp=1,2,4,8",
                           "--vary", "training.recompute=none,full"),
    }


@pytest.mark.slow
@pytest.mark.parametrize("width", [1280, 1400, 1920])
@pytest.mark.parametrize("name", ["report", "report-deepseek", "search", "whatif", "compare", "compare-8"])
def test_every_html_output_keeps_its_tables_in_view(browser, pages, shots, name, width):
    check_layout(browser, pages[name], width, shots)


@pytest.mark.slow
def test_search_page_draws_step_times_on_a_log_axis(browser, pages):
    page, errors = open_page(browser, pages["search"], 1280)
    assert page.get_attribute("#scatter", "data-xlog") == "true"   # 7 s to 750 s
    assert "log scale" in page.text_content("#scatter")
    assert page.is_visible("#plans th[data-field=step_seconds]") and page.is_visible("#plans th[data-field=mfu]")
    assert errors == []
    page.close()


@pytest.mark.slow
def test_whatif_tp_slider_offers_exactly_what_the_estimate_accepts(browser, pages):
    """Each offered tp is a value ``memform estimate`` accepts with the page's other values, each value
    up to 64 it leaves out is one the estimate refuses (tp must divide the heads, the ffn width, ...)."""
    page, errors = open_page(browser, pages["whatif"], 1280)
    offered = [int(v) for v in page.get_attribute("#in-parallel_tp-slider", "data-steps").split(",")]
    accepted = []
    for tp in range(1, 65):
        try:
            memform.estimate(config("llama3-70b.yaml"), [f"parallel.tp={tp}"])
        except MemformError:
            continue
        accepted.append(tp)
    assert offered == accepted == [1, 2, 4, 8]    # 64 query heads, 8 KV heads (Llama 3 70B)
    # the slider steps through them: 8 -> (one step right) stays 8 (the last), one step left -> 4
    page.focus("#in-parallel_tp-slider")
    page.keyboard.press("ArrowLeft")
    assert page.input_value("#in-parallel_tp") == "4"
    assert page.get_attribute("#devices-used", "data-changed") == "true"
    assert "changed from the config's 128" in page.text_content("#devices-used")
    # ZeRO: Megatron's distributed optimizer shards the optimizer states at ZeRO 0 as at ZeRO-1
    options = page.eval_on_selector_all("#in-parallel_zero option", "els => els.map(e => e.textContent)")
    assert options[0] == "0 (config) = effective 1 (distributed optimizer)"
    assert errors == []
    page.close()
