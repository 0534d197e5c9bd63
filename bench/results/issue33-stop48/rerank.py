"""Re-rank the search results dump_searches.py stored with the memform on PYTHONPATH and print
bench/throughput.py's --ranks table (the same matching as its rank(): the search rows do not depend on
the ranking, so one dump ranks under two versions of SearchResult.plans()).

    PYTHONPATH=src python bench/results/issue33-stop48/rerank.py DUMP_DIR [RUN_PREFIX]
"""
import pickle, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import throughput as T
d = Path(sys.argv[1])
order = [r["id"] for r in T.runs()]
rows = []
for rid in order:
    p = d / f"{rid}.pkl"
    if not p.exists():
        continue
    x = pickle.load(open(p, "rb"))
    res, want = x["result"], x["want"]
    def position(rs):
        for i, row in enumerate(rs, 1):
            for alt in T._alternatives(row):
                if all(alt.get(k, 1) == v for k, v in want.items()):
                    return i, alt
        return None, None
    shown, every = res.plans(), res.plans(keep_all=True)
    at, hit = position(shown); at_all, hit_all = position(every)
    top = shown[0] if shown else None
    rows.append({"id": rid, "devices": x["devices"], "layout": want, "rank": at, "rank_all": at_all,
                 "listed": len(shown), "fitting": len(every),
                 "step_ratio": (hit_all["step_seconds"] / top["step_seconds"]) if hit_all and top else None,
                 "top": {k: top[k] for k in ("tp", "pp", "dp", "cp", "vpp", "zero", "recompute", "micro_batch_size")} if top else None,
                 "top_why": (top or {}).get("why", "")})
    if len(sys.argv) > 2 and rid.startswith(sys.argv[2]):
        for i, r in enumerate(shown[:12], 1):
            print(i, {k: r[k] for k in ("tp","pp","dp","cp","vpp","zero","recompute","micro_batch_size","step_seconds","peak_gib")}, r.get("why",""))
import os, json
if os.environ.get("S7_JSON"):
    json.dump(rows, open(os.environ["S7_JSON"], "w"))
T._print_ranks(rows, False)
