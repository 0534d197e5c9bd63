"""Every bundled config under every framework profile and recompute mode (and a few schedules and knobs
that reach the stage-dependent lets and the forward temporaries): each stage's peak and allocator reserve,
one JSON line per case. Uses only the public numeric path, so it runs on older checkouts too:

    PYTHONPATH=CHECKOUT/src python bench/reserves.py CHECKOUT > reserves.jsonl

tests/test_reserves_unchanged.py compares the current code with tests/data/reserves-f1ddafe.jsonl, made
this way at commit f1ddafe (the first recording, tests/data/reserves-795b61f.jsonl in git history, was made
before tensors(...) entries had names and lets could read `stage`).

    PYTHONPATH=CHECKOUT/src python bench/reserves.py CHECKOUT --offload > reserves-offload.jsonl

prints the activation-offload cases instead (OFFLOAD: four configs under every profile with each
training.activation_offload mode, and `none` set, which loads offload-decoder.mf and changes nothing),
each stage's [peak, reserve, host bytes]: tests/data/reserves-offload-f1ddafe.jsonl was made this way at
commit f1ddafe (the first, reserves-offload-8deb83c.jsonl, at 8deb83c, when Python -- engine/config.py
OFFLOAD_KEYS -- still chose to load formulas/offload.mf).
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


#: the activation-offload cases: config -> its offload settings (layers and all are for dense decoders only:
#: Mixtral's are refused, and pinned as refused)
OFFLOAD_CONFIGS = ("llama3-8b.yaml", "mixtral-8x7b.yaml", "nemotron-h-8b.yaml", "qwen2-vl-7b.yaml")
OFFLOAD = (["training.activation_offload=none"],
           ["training.activation_offload=layers", "training.activation_offload_layers=8", "training.recompute=none",
            "parallel.pp=1", "parallel.stage_layers=null"],
           ["training.activation_offload=checkpoint", "training.recompute=full"],
           ["training.activation_offload=all", "training.recompute=none"],
           ["training.activation_offload=all", "training.recompute=full"],
           ["training.activation_offload_layers=4"])


def offload_cases() -> list[tuple[str, list[str]]]:
    return [(c, [f"training.framework={f}", *ov]) for c in OFFLOAD_CONFIGS for f in PROFILES for ov in OFFLOAD]


def cases(root: Path) -> list[tuple[str, list[str]]]:
    configs = sorted((root / "configs").glob("*.yaml")) + sorted((root / "configs" / "published").glob("*.yaml"))
    out = [(c.relative_to(root / "configs").as_posix(), [f"training.framework={f}", f"training.recompute={r}"])
           for c in configs for f in PROFILES for r in RECOMPUTE]
    return out + [(name, ov) for name, sets in EXTRA.items() for ov in sets]


def figures(root: Path, name: str, overrides: list[str], host: bool = False) -> list[list[int]] | str:
    """Each stage's [peak, reserve] (and its host bytes with ``host``), or the error's first line."""
    from memform.engine.model import estimate
    from memform.errors import MemformError
    try:
        est = estimate(root / "configs" / name, overrides, numeric=True)
    except MemformError as exc:
        return "error: " + str(exc).splitlines()[0].split(": ", 1)[-1]
    return [[s.peak_bytes, s.reserve, *([s.host_bytes] if host else [])] for s in est.stages]


def main(argv: list[str]) -> None:
    offload = "--offload" in argv
    args = [a for a in argv[1:] if a != "--offload"]
    root = Path(args[0] if args else Path(__file__).resolve().parents[1])
    for name, overrides in (offload_cases() if offload else cases(root)):
        print(json.dumps({"config": name, "set": overrides, "stages": figures(root, name, overrides, offload)}))


if __name__ == "__main__":
    main(sys.argv)
