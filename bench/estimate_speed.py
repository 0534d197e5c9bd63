"""Wall time of one full estimate (load, bind, partition, evaluate, JSON with closed forms) per
bundled config, in-process after warm-up. Target (issue 7): well under a second each.

    python bench/estimate_speed.py [configs/*.yaml ...]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import memform
from memform.engine.symbolic import tidy

ROOT = Path(__file__).resolve().parent.parent


def time_one(path: Path, repeat: int = 3) -> tuple[float, float]:
    """(median seconds for estimate(), median seconds for estimate() + to_dict())"""
    plain, full = [], []
    for _ in range(repeat):
        tidy.cache_clear()  # time a cold estimate, not the closed-form cache
        t0 = time.perf_counter()
        est = memform.estimate(path)
        t1 = time.perf_counter()
        est.to_dict()
        t2 = time.perf_counter()
        plain.append(t1 - t0)
        full.append(t2 - t0)
    return statistics.median(plain), statistics.median(full)


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted((ROOT / "configs").glob("*.yaml"))
    memform.estimate(paths[0])  # warm caches (grammar, imports)
    print(f"{'config':<28} {'estimate':>10} {'+json':>10}")
    worst = 0.0
    for p in paths:
        plain, full = time_one(p)
        worst = max(worst, full)
        print(f"{p.stem:<28} {plain * 1000:>8.0f}ms {full * 1000:>8.0f}ms")
    print(f"slowest estimate+json: {worst:.3f}s ({'under' if worst < 1 else 'OVER'} the 1 s target)")
    return 0 if worst < 1 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
