#!/usr/bin/env python
"""The GPU check: small real training jobs on a CUDA GPU against memform's figures.

    python bench/gpu_truth.py            # on a machine with a CUDA GPU: a few minutes
    python bench/gpu_truth.py --dry-run  # anywhere: build every job's memform config and estimate only

Each job is a transformers model (``memform.validation.frameworks.hf``: ``from_config``, random weights,
the HF Trainer's training step, torch AdamW) run on the GPU with its real kernels (cuBLAS, flash SDPA,
CUDA autocast) -- the same code ``bench/validate.py --frameworks`` runs on the CPU. Per job it prints
what the caching allocator reports over the traced forward + backward (``torch.cuda.max_memory_allocated``
and ``max_memory_reserved``, peaks reset after a warm-up step) next to memform's allocated figure for
the same config (params + grads + optimizer + activation peak + comm; the device context is not in
either), the dispatcher-level activation peak, and the reserved / allocated ratio the allocator showed.
Then the reserved side, twice: the job's own traced allocations replayed through memform's model of the
caching allocator (``memform.allocator``: this checks the allocator model itself against the real one),
and memform's reserved figure for the config (the estimate's own replay, no trace).

Without a CUDA GPU it says so and exits 0 (``--dry-run`` still checks every job's config). Exits 1 if
memform's allocated figure is more than 10 % from max_memory_allocated, or the replayed trace's reserved
peak more than 10 % from max_memory_reserved, on any job; 2 if transformers or PyTorch is missing.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

#: the threshold on memform's allocated figure against torch.cuda.max_memory_allocated
LIMIT = 0.10


def jobs():  # noqa: ANN201 - HFCase list
    from memform.validation.frameworks.hf import HFCase

    # a ~0.4B Llama (h 1024, 16 layers, GQA 16/8, SwiGLU 2816, 32K vocabulary): big enough that kernels'
    # workspaces are small next to it, small enough for any GPU
    base = HFCase(h=1024, L=16, heads=16, kv_heads=8, ffn=2816, vocab=32000, b=4, s=1024, device="cuda",
                  recipe="llama-0.4B")
    return [replace(base, dtype="amp-bf16"), replace(base, dtype="amp-bf16", gc=True),
            replace(base, dtype="bf16"), replace(base, dtype="bf16", attn="eager", s=512),
            replace(base, dtype="fp32", b=2)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="estimate every job without running it (no GPU needed)")
    args = ap.parse_args(argv)
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        print(f"bench/gpu_truth.py needs PyTorch and transformers (pip install '.[frameworks]'): {exc}",
              file=sys.stderr)
        return 2
    from memform.validation import frameworks
    from memform.validation.frameworks import hf

    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA GPU here: nothing to measure (bench/gpu_truth.py runs where torch.cuda.is_available(); "
              "--dry-run estimates the jobs)")
        return 0
    device = torch.cuda.get_device_name() if not args.dry_run else "dry run"
    print(f"device: {device}; torch {torch.__version__}, transformers {transformers.__version__}")
    head = (f"{'job':<52} {'max alloc':>10} {'memform':>10} {'err':>7} {'max reserved':>12} "
            f"{'res/alloc':>9} {'act.peak meas/est':>20} {'replayed':>10} {'err':>7} {'memform res':>11} {'err':>7}")
    print(head)
    over = []
    start = time.perf_counter()
    for job in jobs():
        est = frameworks.estimated(job.memform_config())
        est_alloc = est["params"] + est["grads"] + est["optimizer"] + est["activations_peak"]
        if args.dry_run:
            print(f"{job.label():<52} {'-':>10} {_gib(est_alloc):>10} {'memform reserved':>40} {_gib(est['reserved'])}")
            continue
        step = hf.measure(job)
        alloc, reserved = step.allocator["max_allocated"], step.allocator["max_reserved"]
        err = (est_alloc - alloc) / alloc
        if abs(err) > LIMIT:
            over.append(job.label())
        act = f"{_gib(step.measured['activations_peak'])} / {_gib(est['activations_peak'])}"
        replayed = step.measured["reserved"]
        rerr, merr = (replayed - reserved) / reserved, (est["reserved"] - reserved) / reserved
        if abs(rerr) > LIMIT:
            over.append(job.label() + " (replayed reserved)")
        print(f"{job.label():<52} {_gib(alloc):>10} {_gib(est_alloc):>10} {err:+7.1%} {_gib(reserved):>12} "
              f"{reserved / alloc:>9.3f} {act:>20} {_gib(replayed):>10} {rerr:+7.1%} {_gib(est['reserved']):>11} "
              f"{merr:+7.1%}")
        torch.cuda.empty_cache()
    print(f"{len(jobs())} jobs in {time.perf_counter() - start:.1f} s; "
          + ("estimates only (--dry-run)" if args.dry_run else
             f"{len(over)} over ±{LIMIT:.0%} (memform's allocated figure vs max_memory_allocated, the replayed "
             f"trace vs max_memory_reserved)"))
    for label in over:
        print(f"OVER {label}")
    return 1 if over else 0


def _gib(n: int) -> str:
    return f"{n / 2 ** 30:.3f}G"


if __name__ == "__main__":
    sys.exit(main())
