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

import json
import tempfile
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import RankJobs, RankStep, imported_config, llama_hf_config


@dataclass(frozen=True)
class FSDPCase:
    """One Trainer FSDP job on ``world`` gloo ranks (a transformers Llama), and which rank's row."""

    h: int = 128
    L: int = 4
    heads: int = 8
    kv_heads: int = 4
    ffn: int = 352
    vocab: int = 1024
    b: int = 2
    s: int = 256
    world: int = 2
    #: fsdp_config reshard_after_forward (FSDP2: full_shard = true, shard_grad_op = false)
    reshard: bool = True
    #: fsdp_config activation_checkpointing (accelerate's checkpoint_wrapper on every decoder layer)
    ac: bool = False
    #: TrainingArguments bf16 (accelerate mixed precision: fp32 shards, bf16 MixedPrecisionPolicy, autocast)
    bf16: bool = False
    #: TrainingArguments gradient_accumulation_steps: the Trainer runs all but the last micro-batch under
    #: accelerate's no_sync (FSDP2: set_requires_gradient_sync(False)), which keeps unsharded gradients
    gas: int = 1
    rank: int = 0

    def job(self) -> "FSDPCase":
        return replace(self, rank=0)

    def label(self) -> str:
        return (f"hf-fsdp2 llama L{self.L} h{self.h} b{self.b} s{self.s} sdpa {'bf16' if self.bf16 else 'fp32'}"
                f"{' ac' if self.ac else ''}{f' gas{self.gas}' if self.gas > 1 else ''} raf={self.reshard} "
                f"dp{self.world} rank{self.rank}")

    # ---- the job's two files --------------------------------------------------------------------------
    def hf_config(self) -> Any:
        return llama_hf_config(self)

    def training_args(self) -> dict[str, Any]:
        """training_args.json of the job, as a Trainer user writes it."""
        return {"output_dir": "out", "per_device_train_batch_size": self.b, "gradient_accumulation_steps": self.gas,
                "bf16": self.bf16, "dtype": "float32", "optim": "adamw_torch", "attn_implementation": "sdpa",
                "fsdp": True, "fsdp_config": {"version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                              "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
                                              "reshard_after_forward": self.reshard,
                                              "activation_checkpointing": self.ac},
                "max_length": self.s}

    def memform_config(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            self.hf_config().save_pretrained(tmp)
            args = Path(tmp) / "training_args.json"
            args.write_text(json.dumps(self.training_args(), indent=1))
            return imported_config("hf", Path(tmp) / "config.json", self.label(), trainer=str(args),
                                   devices=self.world)


Step = RankStep
_JOBS = RankJobs(prefix="memform-hf-fsdp-")


def measure(case: FSDPCase) -> Step:
    """The row of ``case``: its job's rank ``case.rank`` (the job is run on first use)."""
    return _JOBS.step(case, case.rank, _measure_item)


def run(cases: list[FSDPCase]) -> None:
    _JOBS.run(cases, _measure_item)


def _measure_item(d: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    try:
        measured, by_op = _run_rank(FSDPCase(**d), rank, world)
        return {"measured": measured, "notes": {"peak_by_op": by_op}}
    except Exception as exc:  # noqa: BLE001 - reported with the case
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300],
                "trace": traceback.format_exc()[-3000:]}


def _plugin(case: FSDPCase) -> Any:
    """accelerate's FullyShardedDataParallelPlugin from the Trainer's own fsdp_plugin_args
    (TrainingArguments._process_fsdp_args of the case's training arguments)."""
    import logging
    import warnings

    from accelerate.utils import FullyShardedDataParallelPlugin
    from transformers import TrainingArguments

    logging.getLogger("transformers").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        given = case.training_args()
        args = TrainingArguments(output_dir=tmp, use_cpu=True, report_to=[], save_strategy="no",
                                 per_device_train_batch_size=case.b, fsdp=given["fsdp"],
                                 fsdp_config=dict(given["fsdp_config"]))
        plugin_args = dict(args.fsdp_plugin_args)
    return FullyShardedDataParallelPlugin(**plugin_args)


def _run_rank(case: FSDPCase, rank: int, world: int) -> tuple[dict[str, int], dict[str, Any]]:
    import contextlib
    from types import SimpleNamespace

    import torch
    from accelerate.utils.fsdp_utils import fsdp2_apply_ac, fsdp2_prepare_model
    from transformers import AutoModelForCausalLM

    from ..fsdp2 import _local, trace_step
    from ..tracker import storages_of

    torch.manual_seed(0)     # the same weights on every rank, as from_pretrained loads them
    model = AutoModelForCausalLM.from_config(case.hf_config(), attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    model.config.use_cache = False   # the Trainer's last init step: config.use_cache = args.use_cache (False)
    plugin = _plugin(case)
    mixed = "bf16" if case.bf16 else "no"
    if case.bf16:
        plugin.set_mixed_precision("bf16")      # AcceleratorState does this for an FSDP job
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), torch_device_mesh=None,
                                  mixed_precision=mixed, is_main_process=rank == 0, device=torch.device("cpu"),
                                  parallelism_config=None)
    plugin.set_auto_wrap_policy(model)          # Accelerator._prepare_fsdp2, in its order
    if plugin.activation_checkpointing:
        model = fsdp2_apply_ac(accelerator, model)
    model = fsdp2_prepare_model(accelerator, model)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4, foreach=False)
    gen = torch.Generator().manual_seed(1 + rank)
    ids = torch.randint(0, case.vocab, (case.b, case.s), generator=gen)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if case.bf16 else contextlib.nullcontext()

    def forward():  # noqa: ANN202 - the loss
        with autocast:
            return model(input_ids=ids, labels=ids).loss

    def states() -> list[Any]:
        return [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]

    # warm-up step: the optimizer creates its states
    forward().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    # gradient accumulation (trainer.py _inner_training_loop: every micro-batch but the last under
    # accelerator.no_sync, i.e. FSDPModule.set_requires_gradient_sync(False)): FSDP2 keeps each unsharded
    # gradient (FSDPParam.unsharded_accumulated_grad in reduce_dtype, else the unsharded parameter's .grad)
    # until the last micro-batch's reduce-scatter -- measured between the micro-batches, counted as grads
    from ..fsdp2 import _fsdp_params

    accumulated, held = 0, []
    if case.gas > 1:
        model.set_requires_gradient_sync(False)
        for _ in range(case.gas - 1):
            forward().backward()
        held = [fp.unsharded_accumulated_grad if fp.unsharded_accumulated_grad is not None
                else fp._unsharded_param.grad for fp in _fsdp_params(model)]
        accumulated = sum(st.nbytes() for st in storages_of(_local(t) for t in held if t is not None))
        model.set_requires_gradient_sync(True)
    # (the accumulated gradients are grads: the last micro-batch's post_backward adds into them in place)
    static = storages_of([*(_local(p) for p in params), *model.buffers(), ids, *(_local(t) for t in states()),
                          *(_local(t) for t in held if t is not None)])
    measured, by_op = trace_step(model, static, forward, opt.step, states, copy_out_is_fsdp=True)
    measured["grads"] += accumulated
    opt.zero_grad(set_to_none=True)
    return {k: int(v) for k, v in measured.items()}, by_op.get("activations_peak", {})


def _ranks(case: FSDPCase) -> list[FSDPCase]:
    return [replace(case, rank=r) for r in range(case.world)]


BASE = FSDPCase()


def sweep() -> list[FSDPCase]:
    """Every Trainer FSDP case of ``bench/validate.py --frameworks``: full_shard and shard_grad_op, fp32 and
    bf16 mixed precision, fsdp_config activation_checkpointing; 2 ranks, both shown."""
    cases: list[FSDPCase] = []
    for c in (BASE, replace(BASE, reshard=False), replace(BASE, bf16=True), replace(BASE, ac=True),
              replace(BASE, bf16=True, ac=True), replace(BASE, gas=2), replace(BASE, bf16=True, gas=2)):
        cases += _ranks(c)
    return cases


def quick_sweep() -> list[FSDPCase]:
    """The tests' subset: full_shard in fp32, both ranks."""
    return _ranks(BASE)
