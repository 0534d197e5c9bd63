"""Every bundled config under every framework profile and recompute mode (and a few schedules and knobs
that reach the stage-dependent lets and the forward temporaries): each stage's peak and allocator reserve,
one JSON line per case. Uses only the public numeric path, so it runs on older checkouts too:

    PYTHONPATH=CHECKOUT/src python bench/reserves.py CHECKOUT > reserves.jsonl

tests/test_reserves_unchanged.py compares the current code with tests/data/reserves-795b61f.jsonl, made
this way at commit 795b61f (before tensors(...) entries had names and lets could read `stage`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PROFILES = ("megatron", "deepspeed", "fsdp2", "hf-trainer", "mindspore", "torch")
RECOMPUTE = ("none", "selective", "full")
#: config -> override sets beyond the profile x recompute grid
EXTRA = {
    "llama3-8b.yaml": [["training.framework=hf-trainer", "hf_trainer.amp=bf16"],
                       ["training.framework=hf-trainer", "hf_trainer.amp=bf16", "training.recompute=full"],
                       ["training.framework=hf-trainer", "hf_trainer.amp=fp16", "parallel.dp=2"]],
    "llama2-7b.yaml": [["training.framework=hf-trainer", "hf_trainer.amp=bf16"],
                       ["training.framework=megatron", "megatron.backward_regrad=autograd"],
                       ["training.framework=megatron", "megatron.backward_regrad=autograd", "parallel.pp=4", "parallel.vpp=2"],
                       ["training.framework=fsdp2", "parallel.pp=4"],
                       ["training.framework=torch", "parallel.pp_schedule=torch-1f1b", "parallel.pp=4"],
                       ["training.framework=torch", "parallel.pp_schedule=torch-zbv", "parallel.pp=4", "parallel.vpp=2"],
                       ["training.framework=torch", "parallel.pp_schedule=torch-dualpipev", "parallel.pp=4", "parallel.vpp=2"],
                       ["training.framework=torch", "parallel.pp_schedule=torch-interleaved", "parallel.pp=4", "parallel.vpp=2"],
                       ["parallel.pp_schedule=dualpipe", "parallel.pp=4", "parallel.vpp=2"],
                       ["parallel.pp_schedule=interleaved-memest", "parallel.pp=4", "parallel.vpp=2"]],
    "llama3-70b.yaml": [["training.framework=megatron", "megatron.backward_regrad=autograd"]],
    "qwen2.5-72b.yaml": [["training.framework=hf-trainer", "hf_trainer.amp=bf16"]],
    "mixtral-8x7b.yaml": [["training.framework=hf-trainer", "hf_trainer.amp=bf16"]],
    "nemotron-h-8b.yaml": [["training.framework=hf-trainer", "hf_trainer.amp=bf16"],
                           ["training.framework=hf-trainer", "hf_trainer.amp=bf16", "training.recompute=full"]],
    "llama-3.3-nemotron-super-49b.yaml": [["training.framework=hf-trainer", "hf_trainer.amp=bf16"]],
    "qwen3-next-80b-a3b.yaml": [["training.framework=hf-trainer", "hf_trainer.amp=bf16"]],
}


def cases(root: Path) -> list[tuple[str, list[str]]]:
    out = [(c.name, [f"training.framework={f}", f"training.recompute={r}"])
           for c in sorted((root / "configs").glob("*.yaml")) for f in PROFILES for r in RECOMPUTE]
    return out + [(name, ov) for name, sets in EXTRA.items() for ov in sets]


def figures(root: Path, name: str, overrides: list[str]) -> list[list[int]] | str:
    """Each stage's [peak, reserve], or the error's first line."""
    from memform.engine.model import estimate
    from memform.errors import MemformError
    try:
        est = estimate(root / "configs" / name, overrides, numeric=True)
    except MemformError as exc:
        return "error: " + str(exc).splitlines()[0].split(": ", 1)[-1]
    return [[s.peak_bytes, s.reserve] for s in est.stages]


def main(argv: list[str]) -> None:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parents[1])
    for name, overrides in cases(root):
        print(json.dumps({"config": name, "set": overrides, "stages": figures(root, name, overrides)}))


if __name__ == "__main__":
    main(sys.argv)
