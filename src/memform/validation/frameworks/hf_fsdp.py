"""The Hugging Face Trainer's FSDP as the ground truth: a transformers model sharded by accelerate's own
FSDP2 code on gloo ranks, held against memform's ``hf-fsdp2`` profile (formulas/frameworks/hf-fsdp2.mf).

What the Trainer does with ``TrainingArguments(fsdp=True, fsdp_config=...)`` (transformers 5.25,
accelerate 1.16): ``TrainingArguments._process_fsdp_args`` turns the arguments into the keyword arguments
of accelerate's ``FullyShardedDataParallelPlugin`` (``fsdp_plugin_args``), and ``Accelerator.prepare``
(``_prepare_fsdp2``) applies ``fsdp2_apply_ac`` (``fsdp_config`` activation_checkpointing:
``checkpoint_wrapper`` around each decoder layer) and ``fsdp2_prepare_model`` (``fully_shard`` on every
decoder layer, the input embedding, the [final norm, lm_head] tail with ``reshard_after_forward=False``,
then the root; trainable parameters upcast to fp32 when mixed precision is on, ``MixedPrecisionPolicy``
of the mixed-precision dtype for parameters and reductions). Accelerate enables FSDP only on an
accelerator (``AcceleratorState`` leaves a CPU job ``MULTI_CPU``), so the harness builds the plugin from
the Trainer's own ``fsdp_plugin_args`` and calls those two accelerate functions itself with the state they
read (the plugin, the mixed precision, no device mesh): the model is sharded by accelerate's code, not by
memform's. The Trainer sets ``model.config.use_cache = args.use_cache`` (trainer.py:646; False by default),
so the forward builds no KV cache. The step is the Trainer's: the forward under ``torch.autocast`` (bf16 mixed precision,
accelerate's ``native_amp``), ``loss.backward()``, a torch AdamW step, ``zero_grad(set_to_none=True)``.

The measurement is :func:`memform.validation.fsdp2.trace_step` (the FSDP2 harness's: sharded parameters
and what a unit keeps gathered as params, sharded gradients, AdamW states, activations, and FSDP2's own
buffers as comm); memform's side is ``memform import hf config.json --trainer training_args.json
--devices N`` of the same two files. Rows: one per rank (the job runs once for all of them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from . import RankJobs, RankStep, rank_result
from .trainer_fsdp import TrainerFSDPCase, model, plugin, warmed_up


@dataclass(frozen=True)
class FSDPCase(TrainerFSDPCase):
    """One Trainer FSDP2 job on ``world`` gloo ranks (a transformers Llama), and which rank's row (the shape,
    ``ac``, ``bf16`` and ``gas``: :class:`.trainer_fsdp.TrainerFSDPCase`'s)."""

    #: fsdp_config reshard_after_forward (FSDP2: full_shard = true, shard_grad_op = false)
    reshard: bool = True

    def label(self) -> str:
        return (f"hf-fsdp2 llama L{self.L} h{self.h} b{self.b} s{self.s} sdpa {'bf16' if self.bf16 else 'fp32'}"
                f"{' ac' if self.ac else ''}{f' gas{self.gas}' if self.gas > 1 else ''} raf={self.reshard} "
                f"dp{self.world} rank{self.rank}")

    def fsdp_options(self) -> dict[str, Any]:
        return {"version": 2, "reshard_after_forward": self.reshard}


Step = RankStep
_JOBS = RankJobs(prefix="memform-hf-fsdp-")


def measure(case: FSDPCase) -> Step:
    """The row of ``case``: its job's rank ``case.rank`` (the job is run on first use)."""
    return _JOBS.step(case, case.rank, _measure_item)


def run(cases: list[FSDPCase]) -> None:
    _JOBS.run(cases, _measure_item)


def _measure_item(d: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    return rank_result(_run_rank, FSDPCase, d, rank, world)


def _run_rank(case: FSDPCase, rank: int, world: int) -> tuple[dict[str, int], dict[str, Any]]:
    from types import SimpleNamespace

    import torch
    from accelerate.utils.fsdp_utils import fsdp2_apply_ac, fsdp2_prepare_model

    from ..fsdp2 import _local, trace_step
    from ..tracker import storages_of

    wrapped = model(case)
    fsdp = plugin(case)
    mixed = "bf16" if case.bf16 else "no"
    if case.bf16:
        fsdp.set_mixed_precision("bf16")      # AcceleratorState does this for an FSDP job
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=fsdp), torch_device_mesh=None,
                                  mixed_precision=mixed, is_main_process=rank == 0, device=torch.device("cpu"),
                                  parallelism_config=None)
    fsdp.set_auto_wrap_policy(wrapped)          # Accelerator._prepare_fsdp2, in its order
    if fsdp.activation_checkpointing:
        wrapped = fsdp2_apply_ac(accelerator, wrapped)
    wrapped = fsdp2_prepare_model(accelerator, wrapped)
    step = warmed_up(case, wrapped, rank)
    forward, states, params, opt = step.forward, step.states, step.params, step.opt
    # gradient accumulation (trainer.py _inner_training_loop: every micro-batch but the last under
    # accelerator.no_sync, i.e. FSDPModule.set_requires_gradient_sync(False)): FSDP2 keeps each unsharded
    # gradient (FSDPParam.unsharded_accumulated_grad in reduce_dtype, else the unsharded parameter's .grad)
    # until the last micro-batch's reduce-scatter -- measured between the micro-batches, counted as grads
    from ..fsdp2 import _fsdp_params

    accumulated, held = 0, []
    if case.gas > 1:
        wrapped.set_requires_gradient_sync(False)
        for _ in range(case.gas - 1):
            forward().backward()
        held = [fp.unsharded_accumulated_grad if fp.unsharded_accumulated_grad is not None
                else fp._unsharded_param.grad for fp in _fsdp_params(wrapped)]
        accumulated = sum(st.nbytes() for st in storages_of(_local(t) for t in held if t is not None))
        wrapped.set_requires_gradient_sync(True)
    # (the accumulated gradients are grads: the last micro-batch's post_backward adds into them in place)
    static = storages_of([*(_local(p) for p in params), *wrapped.buffers(), step.ids, *(_local(t) for t in states()),
                          *(_local(t) for t in held if t is not None)])
    measured, by_op = trace_step(wrapped, static, forward, opt.step, states, copy_out_is_fsdp=True)
    measured["grads"] += accumulated
    opt.zero_grad(set_to_none=True)
    return {k: int(v) for k, v in measured.items()}, {"peak_by_op": by_op.get("activations_peak", {})}


BASE = FSDPCase()


def sweep() -> list[FSDPCase]:
    """Every Trainer FSDP case of ``bench/validate.py --frameworks``: full_shard and shard_grad_op, fp32 and
    bf16 mixed precision, fsdp_config activation_checkpointing; 2 ranks, both shown."""
    cases: list[FSDPCase] = []
    for c in (BASE, replace(BASE, reshard=False), replace(BASE, bf16=True), replace(BASE, ac=True),
              replace(BASE, bf16=True, ac=True), replace(BASE, gas=2), replace(BASE, bf16=True, gas=2)):
        cases += c.ranks()
    return cases


def quick_sweep() -> list[FSDPCase]:
    """The tests' subset: full_shard in fp32, both ranks."""
    return BASE.ranks()
