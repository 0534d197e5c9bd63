#!/usr/bin/env python
"""Every causal-LM model type the installed transformers knows, through `memform import hf`.

    python bench/hf_coverage.py            # the table and the summary (needs transformers and torch)
    python bench/hf_coverage.py --only qwen

For each model type in transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` the configuration class's own
defaults are written as a config.json and imported. An import ends one of three ways: it loads
(``ok``), it is refused with a one-paragraph reason (``refused``: an architecture or a field memform does
not model), or it crashes (a traceback: a defect). For every import that loads, transformers builds the
same model on the meta device and its parameter count is compared with memform's total (``parameters.
total``: MTP modules, which transformers does not build, are counted by memform).

The model types whose total agrees within 0.01 % are the ones `memform import hf` reads without the
"modeling code not checked" warning (``memform.importers.hf.CHECKED_TYPES``); this script says which
listed type no longer agrees, and which agreeing type is not listed. Exits 1 on a crash, a listed type that
disagrees, or an imported type more than 0.1 % off that is not listed (so not warned about).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

#: agreement of a checked type's total with transformers' model (relative)
EXACT = 1e-4
#: an unchecked type off by more than this is a silent error (the warning covers the rest)
SILENT = 1e-3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", metavar="TEXT", help="only model types containing TEXT")
    args = ap.parse_args(argv)
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError as exc:
        print(f"bench/hf_coverage.py needs transformers and torch: {exc}", file=sys.stderr)
        return 2
    import memform
    from memform.errors import MemformError
    from memform.importers import Options, import_config
    from memform.importers.hf import CHECKED_TYPES

    types = sorted(t for t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if not args.only or args.only in t)
    rows, bad = [], []
    tmp = Path(tempfile.mkdtemp())
    for mt in types:
        try:
            cfg = AutoConfig.for_model(mt)
            if getattr(cfg, "num_nextn_predict_layers", 0):
                cfg.num_nextn_predict_layers = 0   # MTP modules: memform counts them, transformers does not build them
            path = tmp / f"{mt}.json"
            path.write_text(json.dumps(cfg.to_dict(), default=str))
        except Exception as exc:  # noqa: BLE001 - transformers' own defaults that do not build
            rows.append((mt, "no config", f"transformers: {str(exc).splitlines()[0][:60]}"))
            continue
        try:
            draft = import_config("hf", path, Options(name=mt))
        except MemformError as exc:
            rows.append((mt, "refused", str(exc).split(": ", 2)[-1][:80]))
            continue
        except Exception as exc:  # noqa: BLE001 - a crash is the defect this script looks for
            rows.append((mt, "CRASH", repr(exc)[:80]))
            bad.append(f"{mt}: the import crashed: {exc!r}")
            continue
        if draft.load_error:
            rows.append((mt, "refused", f"does not load: {draft.load_error[:70]}"))
            continue
        try:
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(cfg)
            theirs = sum(p.numel() for p in model.parameters())
        except Exception as exc:  # noqa: BLE001
            rows.append((mt, "ok", f"transformers does not build its defaults: {str(exc)[:50]}"))
            continue
        ours = memform.estimate(draft.config()).parameters["total"]
        err = (ours - theirs) / theirs
        listed = mt in CHECKED_TYPES
        note = f"{ours:,} vs {theirs:,} ({err:+.4%})" + ("" if listed else ", warned: modeling not checked")
        rows.append((mt, "ok", note))
        if listed and abs(err) > EXACT:
            bad.append(f"{mt}: listed in CHECKED_TYPES but {err:+.4%} from transformers' model")
        elif not listed and abs(err) <= EXACT:
            print(f"note: {mt} agrees within {EXACT:.2%} and could join CHECKED_TYPES")
        elif not listed and abs(err) > SILENT and not any(w for w in draft.warnings if "not checked" in w):
            bad.append(f"{mt}: {err:+.4%} from transformers' model with no warning")
    width = max(len(r[0]) for r in rows) if rows else 10
    for mt, status, note in rows:
        print(f"{mt:<{width}}  {status:<9}  {note}")
    counts = {s: sum(1 for r in rows if r[1] == s) for s in ("ok", "refused", "no config", "CRASH")}
    print(f"{len(rows)} model types: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    for line in bad:
        print(f"FAIL {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
