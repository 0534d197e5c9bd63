"""What torch.compile'd cross-entropy keeps for its backward (formulas/dense.mf ce_saved, ce_impl "compiled").

torchtitan compiles its loss under training.compile since 2025 (components/loss.py build_cross_entropy_loss at
e7c0cae: ``loss_fn = torch.compile(loss_fn)``), the loss being ``F.cross_entropy(pred.flatten(0, 1).float(),
labels.flatten(0, 1))``. This script runs that function eager and compiled on CPU and prints every tensor
autograd saves for the backward (saved_tensors_hooks), with dtype and storage bytes:

    PYTHONPATH=src python bench/compiled_ce.py

Measured (torch 2.13 CPU, b 2, s 64, v 4096): eager saves the fp32 log-probs (4 bytes per logit); compiled
saves the bf16 logits (2 bytes per logit), the int64 labels and two fp32 per-token reductions (max and
log-sum-exp), and no fp32 tensor of the logits' size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cross_entropy_loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def saved_tensors(fn, b: int = 2, s: int = 64, v: int = 4096) -> list[tuple[tuple[int, ...], str, int]]:
    pred = torch.randn(b, s, v, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, v, (b, s))
    saved: dict[int, tuple[tuple[int, ...], str, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        saved[storage.data_ptr()] = (tuple(t.shape), str(t.dtype), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn(pred, labels)
    loss.backward()
    return list(saved.values())


def main() -> None:
    b, s, v = 2, 64, 4096
    for name, fn in (("eager", cross_entropy_loss), ("compiled", torch.compile(cross_entropy_loss))):
        rows = saved_tensors(fn, b, s, v)
        total = sum(n for _, _, n in rows)
        print(f"{name:9s} saved {total:>9,d} bytes = {total / (b * s * v):.3f} per logit: {rows}")


if __name__ == "__main__":
    main()
