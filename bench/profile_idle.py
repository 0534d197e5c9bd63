"""How much of a GPU stream's span a PyTorch-profiler trace leaves without a kernel (schedules.mf ``idle``).

DualPipe's ``idle = 0.080`` (formulas/schedules.mf) is this script's answer for DeepSeek's training profile,
deepseek-ai/profile-data ``train.json`` (one forward and one backward chunk of 4 MoE layers overlapped,
EP 64, on H800s; the repository's README). The file is not bundled; with a copy of it:

    python bench/profile_idle.py train.json          # every GPU stream, the busiest first
    python bench/profile_idle.py train.json --json

Per stream (a trace's ``pid``/``tid`` of ``kernel``, ``gpu_memset`` and ``gpu_memcpy`` events): the span
from the first kernel's start to the last one's end, the union of the kernels' intervals (busy), the rest
(idle), and the gaps between consecutive kernels split at 10 us: launch gaps, and waits (on another
stream's work, e.g. an all-to-all the next kernel needs).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

GPU_CATEGORIES = ("kernel", "gpu_memset", "gpu_memcpy")
LAUNCH_GAP_US = 10.0


def streams(trace: dict) -> list[dict]:
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    by_stream: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES:
            by_stream[(e.get("pid"), e.get("tid"))].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    out = []
    for (pid, tid), spans in by_stream.items():
        spans.sort()
        busy, gaps = 0.0, []
        cur_s, cur_e = spans[0]
        for s, t in spans[1:]:
            if s > cur_e:
                busy += cur_e - cur_s
                gaps.append(s - cur_e)
                cur_s, cur_e = s, t
            else:
                cur_e = max(cur_e, t)
        busy += cur_e - cur_s
        span = cur_e - spans[0][0]
        small = [g for g in gaps if g <= LAUNCH_GAP_US]
        out.append({"pid": pid, "tid": tid, "kernels": len(spans), "span_ms": span / 1e3, "busy_ms": busy / 1e3,
                    "idle_ms": (span - busy) / 1e3, "idle_share": (span - busy) / span if span else 0.0,
                    "launch_gaps": len(small), "launch_gap_ms": sum(small) / 1e3,
                    "waits": len(gaps) - len(small), "wait_ms": (sum(gaps) - sum(small)) / 1e3})
    return sorted(out, key=lambda r: -r["kernels"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path, help="a PyTorch-profiler (Chrome trace) JSON file")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        trace = json.loads(args.trace.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"bench/profile_idle.py: cannot read {args.trace} as a JSON trace: {exc}", file=sys.stderr)
        return 2
    rows = streams(trace)
    if not rows:
        print(f"bench/profile_idle.py: {args.trace} has no GPU kernel events", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'stream (pid/tid)':18s} {'kernels':>7s} {'span ms':>8s} {'busy ms':>8s} {'idle':>6s} "
          f"{'launch gaps (<=10us)':>21s} {'waits':>16s}")
    for r in rows:
        print(f"{str(r['pid']) + '/' + str(r['tid']):18s} {r['kernels']:7d} {r['span_ms']:8.2f} {r['busy_ms']:8.2f} "
              f"{100 * r['idle_share']:5.1f}% {r['launch_gaps']:8d} {r['launch_gap_ms']:7.2f} ms {r['waits']:5d} {r['wait_ms']:7.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
