"""DeepSpeed's BF16_Optimizer: which gradient tensors are alive after a backward (one CPU rank, gloo).

    DS_ACCELERATOR=cpu MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 \\
        python bench/ds_bf16_grads.py

bf16 + ZeRO-1 + data_types.grad_accum_dtype fp32 is wrapped in BF16_Optimizer (engine.py
_do_optimizer_sanity_check); so is bf16 with ZeRO-0 under the PipelineEngine (Megatron-DeepSpeed, BLOOM's
"ZERO_STAGE=0 ... implements its own zero stage 1 equivalent"). Prints the live bf16 ``.grad`` bytes and the
fp32 accumulation buffer per parameter after each of two micro-batches. Measured with deepspeed 0.19.8, torch
2.13 CPU: 2.00 and 4.00 bytes per parameter after both (formulas/frameworks/deepspeed.mf grad_mem,
deepspeed.keep_lp_grads); with ``"bf16": {"immediate_grad_update": true}`` the bf16 ``.grad`` is freed.
"""

from __future__ import annotations

import os
import sys

import torch


def main() -> int:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    deepspeed.init_distributed("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    n = sum(p.numel() for p in model.parameters())
    immediate = "--immediate" in sys.argv
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
           "bf16": {"enabled": True, "immediate_grad_update": immediate},
           "zero_optimization": {"stage": 1}, "data_types": {"grad_accum_dtype": "fp32"},
           "zero_allow_untested_optimizer": True}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=cfg)
    print(f"optimizer {type(engine.optimizer).__name__}, {n} parameters, immediate_grad_update {immediate}")
    for micro in range(2):
        loss = engine(torch.randn(2, 256, dtype=torch.bfloat16)).float().pow(2).mean()
        engine.backward(loss)
        low = sum(p.grad.numel() * p.grad.element_size() for p in engine.module.parameters() if p.grad is not None)
        high = sum(t.numel() * t.element_size() for t in engine.optimizer.fp32_groups_gradients_flat)
        print(f"after backward {micro}: bf16 .grad {low / n:.2f} bytes per parameter, fp32 buffer {high / n:.2f}")
        engine.step()
    return 0


if __name__ == "__main__":
    sys.exit(main())
