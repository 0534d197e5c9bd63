"""Run one real training step and measure the bytes each memory category really holds.

Three precision set-ups, each expressed by memform's config keys (``training.precision``, the profile):

- ``bf16-mixed`` (Megatron-LM's bf16 recipe, Micikevicius et al. 2018 §3): bf16 working parameters,
  fp32 ``main_grad`` buffers that a post-accumulate-grad hook adds each bf16 gradient into (the bf16
  ``.grad`` is dropped at once), and AdamW over fp32 master copies whose ``.grad`` *is* the main-grad
  buffer; after the step the master weights are copied back into the bf16 parameters.
- ``fp32``: fp32 parameters, gradients in ``.grad``, AdamW over the parameters themselves.
- ``amp-bf16`` (PyTorch AMP as the Hugging Face Trainer runs it with ``bf16=True``): the ``fp32`` set-up
  with the forward under ``torch.autocast("cpu", dtype=torch.bfloat16)``. Autocast casts each GEMM's
  inputs and weights to bf16; the casts its autograd graph keeps count as activations (they are made
  during forward), and the cache of cast weights is emptied when the autocast region exits, before
  ``activations`` is read. memform estimates it with ``training.framework: hf-trainer`` (:data:`AMP`).

What is counted (bytes are storage sizes; views share storage and count once):

- params: the model's parameters (the working copy used in forward/backward);
- grads: the fp32 main-grad buffers (bf16-mixed) or the ``.grad`` tensors (fp32), after backward;
- optimizer: fp32 master weights (bf16-mixed) plus every tensor in ``optimizer.state`` after the step:
  ``exp_avg``, ``exp_avg_sq`` and the 4-byte ``step`` counter PyTorch keeps per parameter tensor;
- activations: every storage created during ``forward`` that is still alive when forward returns —
  whatever keeps it (autograd saved tensors, checkpoint closures, the loss) — measured by
  :class:`~memform.validation.tracker.LiveStorages`. Buffers (rotary tables, causal mask) and the input
  token ids/labels exist before forward and are not activations;
- activations_peak: the largest sum, sampled after every ATen op of forward + backward, of the live
  storages those ops created (:class:`~memform.validation.timeline.StorageTimeline`), less every
  parameter gradient (marked by a post-accumulate-grad hook when autograd accumulates it: the bf16
  ``.grad`` the main-grad hook then frees, or the fp32 ``.grad``). It counts saved and recomputed
  activations, activation gradients, the loss and its gradients and kernel stand-ins' scratch; not the
  parameters, main grads, master weights, optimizer state (all made before forward) or the optimizer
  step (not traced).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from ..engine.binding import get_path
from .timeline import StorageTimeline
from .torch_models import build
from .tracker import LiveStorages, storage_bytes, storages_of

#: precision set-ups: torch dtype of the model and memform's matching ``training.precision`` keys
PRECISIONS: dict[str, tuple[torch.dtype, dict[str, Any]]] = {
    "bf16-mixed": (torch.bfloat16, {"params": "bf16", "grads": "fp32", "optimizer": "fp32",
                                    "activations": "bf16", "master_weights": True}),
    "fp32": (torch.float32, {"params": "fp32", "grads": "fp32", "optimizer": "fp32",
                             "activations": "fp32", "master_weights": False}),
}
#: autocast set-ups: the dtype the forward is autocast to (over an fp32 model) and the config keys that
#: describe it to memform (the hf-trainer profile; CPU autocast's op lists)
AMP: dict[str, tuple[torch.dtype, dict[str, Any]]] = {
    "amp-bf16": (torch.bfloat16, {"training": {"framework": "hf-trainer", "precision": {"params": "fp32"}},
                                  "hf_trainer": {"amp": "bf16", "autocast_device": "cpu", "modeling": "plain"}}),
}


@dataclass
class Measured:
    """Measured bytes per memory category for one training step (see the module docstring)."""

    params: int
    grads: int
    optimizer: int
    activations: int
    activations_by_op: dict[str, int] = field(default_factory=dict)
    loss: float = 0.0
    activations_peak: int = 0
    peak_by_op: dict[str, int] = field(default_factory=dict)
    peak_phase: str = ""

    def as_dict(self) -> dict[str, int]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "activations_peak": self.activations_peak}


def measure_step(cfg: Mapping[str, Any], precision: str = "bf16-mixed", seed: int = 0) -> Measured:
    """Build the model of ``cfg`` and run forward, backward and one AdamW step, measuring each category."""
    if precision not in PRECISIONS and precision not in AMP:
        raise ValueError(f"precision must be one of {', '.join([*PRECISIONS, *AMP])}, got {precision!r}")
    # the tensors are tiny: intra-op threads only add contention (on a busy CI runner, many-fold) and
    # do not change what is allocated
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(cfg, precision, seed)
    finally:
        torch.set_num_threads(threads)


def _measure(cfg: Mapping[str, Any], precision: str, seed: int) -> Measured:
    # an autocast set-up trains the fp32 model, its forward autocast to amp_dtype
    amp_dtype = AMP[precision][0] if precision in AMP else None
    dtype = torch.float32 if amp_dtype is not None else PRECISIONS[precision][0]
    model = build(cfg, dtype, seed)
    params = list(model.parameters())
    b = int(cfg["training"].get("micro_batch_size", 1))
    s, v = model.sh.seq, model.sh.vocab
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, v, (b, s), generator=gen)
    labels = torch.randint(0, v, (b, s), generator=gen)

    mixed = dtype != torch.float32
    # forward + backward run under a StorageTimeline for the peak of live activation-side bytes;
    # every parameter gradient autograd accumulates is marked (before the main-grad hook below
    # frees the bf16 one): it belongs to the grads category, not to the activations
    timeline = StorageTimeline()
    grad_serials: set[int] = set()
    hooks = [p.register_post_accumulate_grad_hook(
        lambda p: grad_serials.update(timeline.serials([p.grad.untyped_storage()]))) for p in params]
    if mixed:
        for p in params:
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32)
            p.register_post_accumulate_grad_hook(_accumulate_main_grad)
        master = [p.detach().float().clone() for p in params]
        for mp, p in zip(master, params):
            mp.grad = p.main_grad
        opts = optimizers(cfg, [n for n, _ in model.named_parameters()], master)
    else:
        master = []
        opts = optimizers(cfg, [n for n, _ in model.named_parameters()], params)

    static = storages_of([*params, *model.buffers(), ids, labels, *master])
    if mixed:
        static += storages_of(p.main_grad for p in params)
    timeline.ignore(static)
    with timeline:
        with LiveStorages() as fwd:
            autocast = torch.autocast("cpu", dtype=amp_dtype) if amp_dtype is not None else contextlib.nullcontext()
            with autocast:
                loss = model(ids, labels)
        activations = fwd.alive_bytes(exclude=static)
        by_op = fwd.by_op(exclude=static)
        timeline.mark("forward")
        loss.backward()
    for hook in hooks:
        hook.remove()
    peak, at = timeline.peak(exclude=grad_serials)
    peak_by_op = timeline.live_at(at, exclude=grad_serials)
    phase = "forward" if at <= timeline.marks["forward"] else "backward"

    grads = storage_bytes(p.main_grad for p in params) if mixed else storage_bytes(p.grad for p in params)
    for opt in opts:
        opt.step()
    if mixed:
        with torch.no_grad():
            for mp, p in zip(master, params):
                p.copy_(mp)
    states = [t for opt in opts for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    optimizer = storage_bytes([*master, *states])
    return Measured(params=storage_bytes(params), grads=grads, optimizer=optimizer, activations=activations,
                    activations_by_op=by_op, loss=float(loss.detach()), activations_peak=peak,
                    peak_by_op=peak_by_op, peak_phase=phase)


def optimizers(cfg: Mapping[str, Any], names: list[str], tensors: list[torch.Tensor]) -> list[torch.optim.Optimizer]:
    """``training.optimizer`` of ``cfg`` over ``tensors`` (the parameters, or their fp32 masters), as
    common.mf counts it: AdamW; SGD with ``training.sgd_momentum`` (0.9 by default); Muon (torch.optim.Muon)
    for the decoder blocks' matrices and AdamW for the rest (embedding, head, norms). Lion is not in
    torch.optim: refused."""
    kind = str(get_path(cfg, "training.optimizer", "adam"))
    if kind == "adam":
        return [torch.optim.AdamW(tensors, lr=1e-3, foreach=False)]
    if kind == "sgd":
        momentum = float(get_path(cfg, "training.sgd_momentum", 0.9))
        return [torch.optim.SGD(tensors, lr=1e-3, momentum=momentum, foreach=False)]
    if kind == "muon":
        hidden = [t for n, t in zip(names, tensors) if n.startswith("blocks.") and t.ndim == 2]
        rest = [t for n, t in zip(names, tensors) if not (n.startswith("blocks.") and t.ndim == 2)]
        return [torch.optim.Muon(hidden, lr=1e-3), torch.optim.AdamW(rest, lr=1e-3, foreach=False)]
    if kind == "adafactor":   # torch.optim.Adafactor: factored second moment, no first (finetune.mf)
        return [torch.optim.Adafactor(tensors, lr=1e-3, foreach=False)]
    if kind == "adamw8bit":   # bitsandbytes' block-wise 8-bit AdamW (runs on the CPU from 0.45 on)
        import bitsandbytes as bnb

        return [bnb.optim.AdamW8bit(tensors, lr=1e-3)]
    raise ValueError(f"the PyTorch harness runs training.optimizer adam, sgd, muon, adafactor or adamw8bit, not {kind!r}")


def _accumulate_main_grad(p: torch.Tensor) -> None:
    """Megatron-style gradient accumulation into the fp32 main-grad buffer; the bf16 grad is freed."""
    p.main_grad.add_(p.grad)
    p.grad = None
