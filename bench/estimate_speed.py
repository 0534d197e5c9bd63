"""How long one estimate takes, on every path, for every bundled config, measured side by side.

    python bench/estimate_speed.py [configs/*.yaml ...] [--repeat N]

Columns (medians; every figure measured in this run, on this machine):

* ``cli hit``: ``memform estimate CONFIG`` in a fresh process, its compiled structure already in
  the on-disk cache (a private cache directory this script fills first, as a Python loop would);
* ``cli new``: a fresh process with no compiled structure for the config (a config memform has not
  seen, e.g. an importer's output): the numeric evaluator's numbers (ints and fractions, no sympy);
* ``cli cold``: the same with ``--no-cache``: nothing read from the cache directory (the bundled formula
  files' syntax trees come from the installation's store, memform/lang/bundled.py: parsed once per install,
  at build time for a wheel, on first use in a checkout, as Python's .pyc files; a user's file is parsed);
* ``cli sympy``: the ``cli new`` case with sympy's numbers instead (the interpreter with every symbol
  replaced by its value, ``keep=frozenset()``: what a cache miss ran before the numeric evaluator);
* ``cli interp``: a fresh process printing the same table from the symbolic interpreter
  (``memform.engine.model.estimate``), no fast path;
* ``warm fast``: ``memform.estimate(CONFIG)`` in this process after the first call (what a
  planner or notebook calling it in a loop gets);
* ``warm interp``: ``memform.engine.model.estimate(CONFIG)`` in this process, with sympy's own
  caches warm (its best case) and ``cold interp`` with them cleared before each call;
* ``compile``: compiling the structure in this process (the fast path's one-off cost);
* ``x``: warm interpreted / warm fast.

Targets (issues 15, 32): warm estimate of deepseek-v3 <= 5 ms, a cold CLI with a warm cache <= 0.4 s,
and with no compiled structure (``cli new``, ``cli cold``) <= 0.4 s.
Also checks that every fast result equals the interpreter's, number for number.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEMFORM = Path(sys.executable).with_name("memform")
SYMPY_NUMBERS = ("import sys; from memform.engine.model import estimate; from memform.report.table import render_table; "
                 "from memform.cli.main import write_text; write_text(render_table(estimate(sys.argv[1], keep=frozenset())))")
INTERPRETED = ("import sys; from memform.engine.model import estimate; from memform.report.table import render_table; "
               "from memform.cli.main import write_text; write_text(render_table(estimate(sys.argv[1])))")


#: CPU seconds (user + system) of the last :func:`_cli` call's runs, median: on a machine shared with
#: other work the wall-clock figures grow with its load, the CPU figures much less
CPU: dict[str, float] = {}


def _cli(args: list[str], env: dict[str, str], repeat: int) -> tuple[float, str]:
    times, cpu, out = [], [], ""
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if r.returncode:
            raise SystemExit(f"{' '.join(args)} failed: {r.stderr}")
        out = r.stdout
    CPU["last"] = statistics.median(cpu)
    return statistics.median(times), out


def _median(fn, repeat: int, before=None) -> float:
    times = []
    for _ in range(repeat):
        if before:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure (default 3)")
    args = ap.parse_args(argv)
    paths = args.configs or sorted((ROOT / "configs").glob("*.yaml"))
    cache = tempfile.mkdtemp(prefix="memform-bench-cache-")
    os.environ["MEMFORM_CACHE_DIR"] = cache
    env = dict(os.environ)
    cli = [str(MEMFORM)] if MEMFORM.exists() else [sys.executable, "-m", "memform"]

    import sympy.core.cache

    import memform
    from memform.fastpath import fastcache
    from memform.engine.model import estimate as interpreted
    from memform.engine.symbolic import tidy
    from memform.report.table import render_table

    def cold_sympy() -> None:
        sympy.core.cache.clear_cache()
        tidy.cache_clear()

    new_cache = tempfile.mkdtemp(prefix="memform-bench-new-")
    new_env = {**env, "MEMFORM_CACHE_DIR": new_cache}
    head = (f"{'config':<22} {'cli hit':>8} {'cli new':>8} {'cli cold':>9} {'cli sympy':>9} {'cli interp':>10} "
            f"{'warm fast':>10} "
            f"{'warm interp':>11} {'cold interp':>11} {'compile':>8} {'x':>6}  same")
    print(head)
    results = {}
    all_same = True
    for p in paths:
        p = p.resolve()
        fastcache._MEMO.clear()
        compile_s = _median(lambda: fastcache.fast_estimate(p, cache=False, compile=True), 1,
                            before=lambda: fastcache._MEMO.clear())
        fastcache._MEMO.clear()
        fast = fastcache.fast_estimate(p, compile=True)  # fills the disk cache (and this process's memo again)
        full = interpreted(p)
        same = fast.to_dict() == full.to_dict() and render_table(fast) == render_table(full)
        all_same &= same
        warm_fast = _median(lambda: memform.estimate(p), max(50, args.repeat))
        warm_interp = _median(lambda: interpreted(p), args.repeat)
        cold_interp = _median(lambda: interpreted(p), args.repeat, before=cold_sympy)
        hit, out_hit = _cli(cli + ["estimate", str(p)], env, args.repeat)
        _cli(cli + ["estimate", str(p)], new_env, 1)  # records the checked program in the cache, compiles nothing
        new, out_new = _cli(cli + ["estimate", str(p)], new_env, args.repeat)
        new_cpu = CPU["last"]
        miss, out_miss = _cli(cli + ["estimate", str(p), "--no-cache"], env, args.repeat)
        miss_cpu = CPU["last"]
        sympy_cli, out_sympy = _cli([sys.executable, "-c", SYMPY_NUMBERS, str(p)], new_env, args.repeat)
        interp_cli, out_interp = _cli([sys.executable, "-c", INTERPRETED, str(p)], env, args.repeat)
        same &= out_hit == out_new == out_miss == out_sympy == out_interp
        all_same &= same
        results[p.stem] = (hit, warm_fast, new, miss, new_cpu, miss_cpu)
        print(f"{p.stem:<22} {hit:>7.2f}s {new:>7.2f}s {miss:>8.2f}s {sympy_cli:>8.2f}s {interp_cli:>9.2f}s "
              f"{warm_fast * 1e3:>8.2f}ms "
              f"{warm_interp * 1e3:>9.1f}ms {cold_interp * 1e3:>9.1f}ms {compile_s:>7.2f}s "
              f"{warm_interp / warm_fast:>5.0f}x  {'yes' if same else 'NO'}")
    worst_hit = max(r[0] for r in results.values())
    print(f"slowest cold CLI with a warm cache: {worst_hit:.2f} s (target <= 0.4 s: "
          f"{'met' if worst_hit <= 0.4 else 'NOT met'})")
    worst_new, worst_cold = max(r[2] for r in results.values()), max(r[3] for r in results.values())
    print(f"slowest CLI without a compiled structure: {worst_new:.2f} s with the formula files parsed, "
          f"{worst_cold:.2f} s with nothing cached (target <= 0.4 s: {'met' if worst_cold <= 0.4 else 'NOT met'}); "
          f"CPU seconds {max(r[4] for r in results.values()):.2f} and {max(r[5] for r in results.values()):.2f}")
    ok = worst_hit <= 0.4 and worst_cold <= 0.4 and all_same
    if "deepseek-v3" in results:
        ds = results["deepseek-v3"][1] * 1e3
        print(f"warm estimate of deepseek-v3: {ds:.2f} ms (target <= 5 ms: {'met' if ds <= 5 else 'NOT met'})")
        ok &= ds <= 5
    print(f"fast path equals the interpreter on every config: {'yes' if all_same else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
