"""Per-layer saved bytes of PEFT LoRA decoders (transformers + PEFT on the CPU) against memform's per-layer
decoder activations: where a LoRA step's total agrees by compensation.

For each case (``hf_qlora``'s and ``hf``'s LoRA set-ups, bf16, SDPA), the model is built as the harness builds
it (``case.build_model``; 4-bit base where the case has one), PEFT's ``get_peft_model`` adds the adapters, and
one training forward runs under ``torch.autograd.graph.saved_tensors_hooks``: every storage autograd saves is
attributed to the decoder layer whose forward saved it first (``hf.saved_per_layer``; parameters left out).
bitsandbytes 0.42's ``ctx.tensors`` are not saved tensors and are not seen here (``--frameworks --only bnb0.42``
measures them). memform's column is the decoder block's per-layer ``activations`` of the same case
(``memform import hf`` of its config.json and adapter_config.json).

What it shows (recorded in ``bench/results/lora_layer_saved.json``): with the embedding frozen, layer 0's first
norm keeps no input (nothing before it needs a gradient), while every layer's SDPA keeps its output, the output
projection's input, which memform counts under LoRA only with an adapter on o_proj or ``lora.bnb_keeps_input``.

    python bench/lora_layer_saved.py            # the table
    python bench/lora_layer_saved.py --json     # and the recording
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "bench" / "results" / "lora_layer_saved.json"


def cases() -> list:
    from memform.validation.frameworks.hf import BASE
    from memform.validation.frameworks.hf_qlora import Q

    return [replace(BASE, lora_r=8, dtype="bf16"), replace(Q, double_quant=False),
            replace(BASE, lora_r=8, dtype="bf16", L=4)]


def measure(case) -> list[int]:  # noqa: ANN001
    import torch
    from peft import get_peft_model

    from memform.validation.frameworks.hf import saved_per_layer

    torch.manual_seed(0)
    model = case.build_model(torch.bfloat16)
    model.train()
    model = get_peft_model(model, case.lora_config())
    ids = torch.randint(0, case.vocab, (case.b, case.s))
    return saved_per_layer(model, model.base_model.model.model.layers, ids)


def memform_per_layer(case) -> int:  # noqa: ANN001
    from memform.engine.model import estimate_numbers

    stage = estimate_numbers(case.memform_config()).stages[0]
    return int(next(g for g in stage.layers if g.block == "decoder").per_layer_values["activations"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help=f"write {RESULT.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    rows = []
    for case in cases():
        layers, est = measure(case), memform_per_layer(case)
        rows.append({"case": case.label(), "measured_per_layer": layers, "memform_per_layer": est})
        print(f"{case.label():60s} measured {layers}  memform {est}  "
              f"(layer 0 {layers[0] - est:+d}, others {layers[-1] - est:+d})")
    if args.json:
        RESULT.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
