"""Dump each published run's full search result (as bench/throughput.py rank() searches it) to a pickle.

    PYTHONPATH=src python bench/results/issue33-stop48/dump_searches.py DUMP_DIR [RUN_PREFIX]
"""
import pickle, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import throughput as T
from memform.analysis.search import default_space, search
from memform.engine.model import load_model
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
prefix = sys.argv[2] if len(sys.argv) > 2 else ""
for run in T.runs():
    if not run["id"].startswith(prefix):
        continue
    if (out / f"{run['id']}.pkl").exists():
        continue
    t0 = time.time()
    cfg = T.config_of(run)
    devices = cfg["parallel"].pop("devices")
    model = load_model(cfg, {})
    res = search(model, default_space(model, devices))
    want = {k: cfg["parallel"].get(k, 1) for k in T.LAYOUT}
    with open(out / f"{run['id']}.pkl", "wb") as f:
        pickle.dump({"id": run["id"], "devices": devices, "want": want, "result": res}, f)
    print(run["id"], len(res), f"{time.time()-t0:.1f}s", flush=True)
