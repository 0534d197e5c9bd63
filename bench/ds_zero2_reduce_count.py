"""DeepSpeed ZeRO-1 and ZeRO-2 over 4 micro-batches: the gradient bytes each backward and the step communicate
(two CPU ranks, gloo).

    PYTHONPATH=src python bench/ds_zero2_reduce_count.py     # one line per stage and phase

Wraps torch.distributed's collectives (all_reduce, reduce, reduce_scatter, all_gather and their tensor / base
forms, broadcast) and sums, per rank, the bytes of the tensors each call is given, separately for every
backward and for the optimizer step. What time.mf prices (zero2_rs_mb): ZeRO-2 reduces its gradients in every
micro-batch's backward (stage_1_and_2.py reduce_ready_partitions_and_remove_grads: "if self.partition_gradients
or self.is_gradient_accumulation_boundary()"), ZeRO-1 only in the last one. Measured with deepspeed 0.19.8,
torch 2.13 CPU: bench/results/issue33-stop49/ds_zero2_reduce_count.txt.
"""

from __future__ import annotations

import sys

import torch

MICRO = 4
NAMES = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base",
         "all_gather", "all_gather_into_tensor", "_all_gather_base", "broadcast")
PHASE = ["init"]
LOG: dict[str, dict[str, int]] = {}


def _bytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_bytes(t) for t in x)
    return 0


def _wrap() -> None:
    """Count torch.distributed's collectives before DeepSpeed's comm backend binds them."""
    import torch.distributed as dist

    for name in NAMES:
        orig = getattr(dist, name, None)
        if orig is None or getattr(orig, "_counted", False):
            continue

        def counted(*args, _orig=orig, _name=name, **kwargs):
            # the first tensor argument, positional or named: the one reduced / gathered into
            first = next((x for x in (*args, *kwargs.values()) if _bytes(x)), None)
            ph = LOG.setdefault(PHASE[0], {})
            ph[_name] = ph.get(_name, 0) + (_bytes(first) if first is not None else 0)
            return _orig(*args, **kwargs)
        counted._counted = True
        setattr(dist, name, counted)


def measure(stage: int, rank: int, world: int) -> dict:
    """One ZeRO stage on this rank (memform.validation.ranks.spawn runs it in each rank's process)."""
    import os

    from memform.validation.frameworks.deepspeed import _deepspeed

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    _wrap()
    deepspeed = _deepspeed()
    deepspeed.init_distributed("gloo")
    LOG.clear()
    PHASE[0] = "init"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    n = sum(p.numel() for p in model.parameters())
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": MICRO,
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 4 * n, "allgather_bucket_size": 4 * n},
           "zero_allow_untested_optimizer": True}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=cfg)
    for micro in range(MICRO):
        PHASE[0] = f"backward {micro}"
        loss = engine(torch.randn(2, 256)).pow(2).mean()
        engine.backward(loss)
        PHASE[0] = "step" if micro == MICRO - 1 else f"backward {micro}"
        engine.step()
    PHASE[0] = "done"
    return {"stage": stage, "params": n, "log": {k: v for k, v in LOG.items() if k not in ("init", "done")}}


def main() -> int:
    from memform.validation.ranks import spawn

    for per_rank in spawn(2, measure, [1, 2], prefix="memform-ds-zero2-"):
        r = per_rank[0]
        n = r["params"]
        print(f"ZeRO-{r['stage']}, {n} parameters, 2 ranks, {MICRO} micro-batches: collective bytes per rank (rank "
              f"0), in units of the fp32 gradients (4 bytes x parameters)")
        for ph in sorted(r["log"], key=lambda k: (k == "step", k)):
            print(f"  {ph:<12} " + ", ".join(f"{name} {b / (4 * n):.3f}" for name, b in sorted(r["log"][ph].items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
