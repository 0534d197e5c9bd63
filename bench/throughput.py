"""Published training throughput vs. memform's step-time model.

Every run of ``tests/data/published_throughput.yaml`` (Narayanan et al. 2021 Table 1, Korthikanti
et al. 2022 Table 5, the Llama 3 report Table 4; each figure with its source there) is rebuilt as a
memform config on the paper's device preset, and the predicted MFU is printed next to the published
one (Narayanan's Table 1 counts the recompute forward: its MFU is the file's ``derived`` figure, the
same measured time over the model FLOPs without it).

    python bench/throughput.py            # the table; exit status 1 when a run is off by > 25 %
    python bench/throughput.py --json     # the rows as JSON

Each run is also estimated with ``device.sm_count: 0`` (no tile and wave quantization, time.mf
``pad``): the ``pad`` column is how much that adds to the compute part, and the last line gives the
errors without it. The ``fits`` column is memform's memory verdict for the run as rebuilt.

What a paper does not state is filled as memform's defaults: micro-batch size 1, one pipeline chunk
per stage (unless the paper pictures its schedule: Llama 3's Fig. 6 runs two stages per pipeline
rank), no sequence parallelism (each such fill is listed in the run's ``provenance``). How much a
fill moves a figure is one command away, e.g. the Llama 3 rows with one chunk per stage:

    python bench/throughput.py --runs dubey2024 --set parallel.vpp=1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "published_throughput.yaml"
#: the issue's tolerance: predicted MFU within 25 % of the published one
TOLERANCE = 0.25


def runs() -> list[dict[str, Any]]:
    import yaml
    return [r for r in yaml.safe_load(DATA.read_text(encoding="utf-8"))["runs"] if "published" in r and "model" in r]


def published_mfu(run: dict[str, Any]) -> float | None:
    pub, der = run.get("published", {}), run.get("derived") or {}
    for value in (pub.get("model_flops_utilization"), pub.get("bf16_mfu"), der.get("model_flops_utilization")):
        if value is not None:
            return float(value)
    return None


def config_of(run: dict[str, Any]) -> dict[str, Any]:
    """The memform config of one published run (GPT-3-style or Llama-style, per its activation)."""
    m, par, tr, cl = run["model"], run["parallel"], run["training"], run["cluster"]
    llama = m.get("activation") == "swiglu"
    model = {k: m[k] for k in ("hidden_size", "num_heads", "num_kv_heads", "num_layers", "ffn_hidden_size",
                               "vocab_size", "seq_length", "activation") if m.get(k) is not None}
    model.update({"norm": "rmsnorm" if llama else "layernorm", "bias": not llama, "dropout": not llama,
                  "position_embedding": "rope" if llama else "learned",
                  "flash_attention": bool(m.get("flash_attention")) if m.get("flash_attention") is not None else llama})
    vpp = par.get("vpp") or 1
    parallel = {"dp": par["dp"], "tp": par["tp"], "pp": par["pp"], "cp": par.get("cp") or 1, "vpp": vpp,
                "sequence_parallel": bool(par.get("sequence_parallel")),
                "distributed_optimizer": bool(par.get("distributed_optimizer")),
                "pp_schedule": "1f1b", "devices": cl["devices"]}
    if par.get("stage_layers"):   # one count per stage, split over its chunks (engine/partition.py)
        parallel["stage_layers"] = par["stage_layers"]
    if par.get("cp_algo"):
        parallel["cp_algo"] = par["cp_algo"]
    training = {"micro_batch_size": tr.get("micro_batch_size") or 1, "global_batch_size": tr["global_batch_size"],
                "recompute": tr.get("recompute") or "none"}
    return {"name": run["id"], "formulas": ["dense.mf"], "model": model, "parallel": parallel,
            "training": training, "device": {"preset": cl["device"]}}


def predict(run: dict[str, Any], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    import memform
    cfg, overrides = config_of(run), overrides or {}
    est = memform.estimate(cfg, overrides)
    flat = memform.estimate(cfg, {**overrides, "device.sm_count": 0})   # without tile/wave quantization
    want = published_mfu(run)
    got = est.mfu
    return {"id": run["id"], "where": run.get("where", ""), "published_mfu": want, "predicted_mfu": got,
            "relative_error": (got - want) / want if want and got is not None else None,
            "unquantized_error": (flat.mfu - want) / want if want and flat.mfu is not None else None,
            "pad_share": est.time_dict()["parts"]["compute"] / flat.time_dict()["parts"]["compute"] - 1,
            "step_seconds": est.step_seconds, "fits": est.fits,
            "published_seconds": (run.get("published", {}).get("iteration_seconds")
                                  or (run.get("derived") or {}).get("iteration_seconds"))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--runs", metavar="PREFIX", default="", help="only the runs whose id starts with PREFIX")
    ap.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                    help="override a config key in every run (YAML value), to see how much a fill moves a figure")
    args = ap.parse_args(argv)
    from memform.engine.config import parse_override
    from memform.errors import MemformError
    chosen = [r for r in runs() if r["id"].startswith(args.runs)]
    if not chosen:
        ap.error(f"no run id starts with '{args.runs}'")
    try:
        overrides = dict(parse_override(item) for item in args.set)   # as memform's own --set reads it
        rows = [predict(r, overrides) for r in chosen]
    except MemformError as exc:   # a mistyped --set key or value: the message, not a traceback
        print(f"bench/throughput.py: {exc.message}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'run':44s} {'published':>9s} {'memform':>8s} {'error':>7s} {'step s':>8s} {'paper s':>8s} {'pad':>6s} {'fits':>4s}")
        for r in rows:
            err = r["relative_error"]
            print(f"{r['id']:44s} {r['published_mfu']:9.3f} {r['predicted_mfu']:8.3f} {100 * err:+6.1f}% "
                  f"{r['step_seconds']:8.2f} {r['published_seconds'] or float('nan'):8.2f} {100 * r['pad_share']:+5.1f}% {'yes' if r['fits'] else 'no':>4s}")
        for label, key in (("", "relative_error"), ("without tile/wave quantization (device.sm_count 0): ",
                                                   "unquantized_error")):
            errs = [abs(r[key]) for r in rows if r[key] is not None]
            off = sum(e > TOLERANCE for e in errs)
            print(f"{label}{len(errs)} runs: mean |error| {100 * sum(errs) / len(errs):.1f} %, "
                  f"max {100 * max(errs):.1f} %, {off} over {100 * TOLERANCE:.0f} %")
    return 1 if any(r["relative_error"] is not None and abs(r["relative_error"]) > TOLERANCE for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
