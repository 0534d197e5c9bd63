"""Fit of the A100 presets' ``collective_efficiency`` (time.mf ``coll_eff``) on measured per-layer times.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
arXiv:2205.05198) Table 4 gives the forward + backward time of one transformer layer of their 22B GPT
(h 6144, 64 heads, s 2048, micro-batch 4, tensor parallelism 8 on one DGX A100 of Selene, Table 3) under
five settings. memform's per-layer time is the step's compute + tp + memory parts with 48 layers less
those with 47 (one micro-batch: global batch 4 = micro-batch 4, Table 3). Its tp part is the only one
that depends on the collective efficiency c (time.mf ``xfer``: bytes / (c · intra_node_bandwidth)):
time = A + B / c per setting. c is the least-squares fit of the five relative errors (closed form in
1/c), rounded to two decimals; the end-to-end runs of ``bench/throughput.py`` (Narayanan et al. 2021
Tables 1 and 2, Korthikanti et al. 2022 Table 5 and §6.3) were not used and are its check.

    python bench/tp_layer_fit.py          # the table and the fit
    python bench/tp_layer_fit.py --json
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("memform_bench_throughput", ROOT / "bench" / "throughput.py")
throughput = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(throughput)

#: Korthikanti et al. 2022 Table 4 ("Time to complete the forward and backward pass of a single transformer
#: layer of the 22B model"): experiment -> (recompute, sequence parallelism, forward ms, backward ms, combined ms)
TABLE4 = {
    "Baseline no recompute": ("none", False, 7.7, 11.9, 19.6),
    "Sequence Parallelism": ("none", True, 7.2, 11.8, 19.0),
    "Baseline with recompute": ("full", False, 7.7, 19.5, 27.2),
    "Selective Recompute": ("selective", False, 7.7, 13.2, 20.9),
    "Selective + Sequence": ("selective", True, 7.2, 13.1, 20.3),
}
#: the 22B run of the throughput table (Table 3's model and layout; its device preset a100-80g)
RUN = "korthikanti2022-table5-22b-selective"
LAYER_PARTS = ("compute", "tp", "memory")


def layer_parts(recompute: str, sp: bool, efficiency: float = 1.0) -> dict[str, float]:
    """memform's seconds per layer (one micro-batch) of the 22B model: each part at 48 layers less at 47."""
    import memform
    run = next(r for r in throughput.runs() if r["id"] == RUN)
    cfg = throughput.config_of(run)
    assert cfg["training"]["global_batch_size"] == cfg["training"]["micro_batch_size"] * cfg["parallel"]["dp"]
    over = {"training.recompute": recompute, "parallel.sequence_parallel": sp,
            "device.collective_efficiency": efficiency}
    parts = []
    for layers in (cfg["model"]["num_layers"], cfg["model"]["num_layers"] - 1):
        c = copy.deepcopy(cfg)
        c["model"]["num_layers"] = layers
        parts.append(memform.estimate(c, over).time_dict()["parts"])
    return {k: parts[0][k] - parts[1][k] for k in LAYER_PARTS}


#: held out, Korthikanti et al. 2022 §6.2 (Figure 8's text): "For the 530B and 1T cases, the overhead is just
#: 2%, compared to 36% overhead for full recompute" -- per layer, selective recompute + sequence parallelism
#: and full recompute (no SP) over the baseline (neither), in percent
OVERHEADS = {"korthikanti2022-table5-530b-selective": (2, 36), "korthikanti2022-table5-1t-selective": (2, 36)}


def one_layer(run_id: str, recompute: str, sp: bool, efficiency: float) -> float:
    """memform's seconds of one layer and micro-batch (compute + tp + memory) of a throughput run's model
    and tensor parallelism, on one stage (2 layers less 1: no pipeline, no data parallelism)."""
    import memform
    cfg = throughput.config_of(next(r for r in throughput.runs() if r["id"] == run_id))
    cfg["parallel"].update(pp=1, vpp=1, dp=1, devices=cfg["parallel"]["tp"])
    cfg["parallel"].pop("stage_layers", None)
    cfg["training"]["global_batch_size"] = cfg["training"]["micro_batch_size"]
    over = {"training.recompute": recompute, "parallel.sequence_parallel": sp,
            "device.collective_efficiency": efficiency}
    total = []
    for layers in (2, 1):
        c = copy.deepcopy(cfg)
        c["model"]["num_layers"] = layers
        total.append(sum(memform.estimate(c, over).time_dict()["parts"][k] for k in LAYER_PARTS))
    return total[0] - total[1]


def overheads(run_id: str, efficiency: float) -> tuple[float, float]:
    """(selective + SP, full recompute) per-layer time over the baseline's, minus 1, in percent."""
    base = one_layer(run_id, "none", False, efficiency)
    return (100 * (one_layer(run_id, "selective", True, efficiency) / base - 1),
            100 * (one_layer(run_id, "full", False, efficiency) / base - 1))


def fit() -> dict:
    rows = []
    for name, (rc, sp, fwd, bwd, combined) in TABLE4.items():
        p = layer_parts(rc, sp)
        rows.append({"experiment": name, "recompute": rc, "sequence_parallel": sp, "measured_ms": combined,
                     "other_ms": 1e3 * (p["compute"] + p["memory"]), "tp_ms_at_line_rate": 1e3 * p["tp"]})
    # minimise sum(((A + B x) / y - 1)^2) over x = 1 / c
    num = sum(r["tp_ms_at_line_rate"] / r["measured_ms"] * (1 - r["other_ms"] / r["measured_ms"]) for r in rows)
    den = sum((r["tp_ms_at_line_rate"] / r["measured_ms"]) ** 2 for r in rows)
    c = round(den / num, 2)
    for r in rows:
        for label, eff in (("line_rate", 1.0), ("fitted", c)):
            r[f"memform_ms_{label}"] = r["other_ms"] + r["tp_ms_at_line_rate"] / eff
            r[f"error_{label}"] = r[f"memform_ms_{label}"] / r["measured_ms"] - 1
    return {"collective_efficiency": c, "exact": den / num, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = fit()
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"{'Korthikanti 2022 Table 4 (22B, TP 8, A100)':44s} {'measured':>8s} {'GEMM+mem':>8s} {'tp':>6s} "
          f"{'c = 1':>14s} {'c = ' + format(res['collective_efficiency'], '.2f'):>14s}")
    for r in res["rows"]:
        print(f"{r['experiment']:44s} {r['measured_ms']:8.1f} {r['other_ms']:8.2f} {r['tp_ms_at_line_rate']:6.2f} "
              f"{r['memform_ms_line_rate']:6.2f} {100 * r['error_line_rate']:+6.1f}% "
              f"{r['memform_ms_fitted']:6.2f} {100 * r['error_fitted']:+6.1f}%")
    print(f"collective_efficiency = {res['collective_efficiency']:.2f} (least squares {res['exact']:.4f}): "
          f"TP all-reduces at {res['collective_efficiency'] * 300:.0f} of NVLink 3's 300 GB/s per direction")
    print("held out, Korthikanti §6.2: per-layer overhead over the baseline, selective + SP / full recompute")
    for run_id, (sel, full) in OVERHEADS.items():
        line = " ".join(f"c = {c:.2f}: {a:+.1f} % / {b:+.1f} %" for c in (1.0, res["collective_efficiency"])
                        for a, b in [overheads(run_id, c)])
        print(f"  {run_id}: stated {sel} % / {full} %; memform {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
