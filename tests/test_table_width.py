"""``memform estimate``'s table fits a 100-column terminal; ``--wide`` keeps every figure with its unit.

The figures are checked against the estimate's own bytes (the table is a view of them), the width by
counting characters of every line."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import ROOT, run_memform
from estimate_helpers import bundled

import memform
from memform.report.table import WIDTH, render_table

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
GIB = 2 ** 30


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_every_bundled_config_fits_100_columns(config: Path):
    est = bundled(config)  # memform.estimate's first answer, shared with the other every-bundled-config loops
    text = render_table(est)
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    # every stage's peak is in the table, in the unit named above it
    unit = next(line for line in text.splitlines() if line.endswith(" per device")).split()[0]
    size = {"TiB": 2 ** 40, "GiB": GIB, "MiB": 2 ** 20, "KiB": 2 ** 10}[unit]
    rows = [line.split() for line in text.splitlines() if line[:5].strip().isdigit() and line[5:7] == "  "]
    assert [int(r[0]) for r in rows] == [s.stage for s in est.stages]
    header = next(line.split() for line in text.splitlines() if line.startswith("stage  layers"))
    col = header.index("peak") - len(header)  # counted from the right: labels may hold several words
    for r, s in zip(rows, est.stages):
        assert float(r[col]) == pytest.approx(s.peak_bytes / size, abs=0.006)


def test_long_layer_groups_wrap_and_wide_keeps_them_on_one_line():
    config = ROOT / "configs" / "qwen2-vl-7b.yaml"
    est = memform.estimate(config)
    label = est.terminal_label(0)
    assert len(label) > 40
    narrow = render_table(est)
    assert label not in narrow and all(word in narrow for word in label.split())
    wide = render_table(est, wide=True)
    assert label in wide and "GiB" in wide.splitlines()[3]


def test_the_cli_table_and_wide():
    r = run_memform("estimate", "configs/deepseek-v3.yaml")
    assert r.returncode == 0 and r.stdout.endswith("\n")
    assert max(len(line) for line in r.stdout.splitlines()) <= WIDTH
    assert "GiB per device" in r.stdout
    w = run_memform("estimate", "configs/deepseek-v3.yaml", "--wide")
    assert w.returncode == 0 and "stage  layers" in w.stdout and " GiB  " in w.stdout
    assert max(len(line) for line in w.stdout.splitlines()) > WIDTH  # unabridged


@pytest.mark.parametrize("config, summary", [
    # Nemotron-H-8B's pattern alternates kinds layer by layer (52 groups): each block's count instead
    # (24 Mamba-2, 24 MLP, 4 attention: the paper's Table 1 split of its 52 layers)
    ("nemotron-h-8b.yaml", "1xembedding 24xmamba_layer 24xmlp_layer 4xattn_layer 1xoutput (54 groups)"),
])
def test_an_interleaved_stage_is_labelled_with_each_blocks_count(config, summary):
    est = memform.estimate(ROOT / "configs" / config)
    assert len(est.terminal_label(0).split()) == 54
    narrow = render_table(est)
    assert all(word in narrow.split() for word in summary.split()) and narrow.count("groups)") == 1
    assert len(narrow.splitlines()) < 15
    assert est.terminal_label(0) in render_table(est, wide=True)   # --wide: every group in order
