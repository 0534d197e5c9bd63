"""What the Hugging Face Trainer's FSDP harnesses share (:mod:`.hf_fsdp`: FSDP2, :mod:`.hf_fsdp1`: FSDP1): the
job's case (a transformers Llama on gloo ranks, and the Trainer arguments of its FSDP job), the job's two files
and memform's import of them, accelerate's FSDP plugin built from the Trainer's own ``fsdp_plugin_args``, and a
rank's model, optimizer and batch up to the measured step (the warm-up step done).

transformers 5.25's ``TrainingArguments._process_fsdp_args`` turns ``fsdp`` / ``fsdp_config`` into the keyword
arguments of accelerate 1.16's ``FullyShardedDataParallelPlugin``; accelerate enables FSDP only on an accelerator
(``AcceleratorState`` leaves a CPU job ``MULTI_CPU``), so each harness builds the plugin from those arguments and
applies it as accelerate's FSDP1 / FSDP2 branch does. The Trainer sets ``model.config.use_cache =
args.use_cache`` (trainer.py:646; False by default), so the forward builds no KV cache; its step is the forward
under ``torch.autocast`` (bf16 mixed precision, accelerate's ``native_amp``), ``loss.backward()``, a torch AdamW
step and ``zero_grad(set_to_none=True)``.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from . import LlamaRankCase, imported_config


@dataclass(frozen=True)
class TrainerFSDPCase(LlamaRankCase):
    """One Trainer FSDP job (``fsdp_options``: what its FSDP version adds to ``fsdp_config``)."""

    #: fsdp_config activation_checkpointing (a checkpoint_wrapper around every decoder layer)
    ac: bool = False
    #: TrainingArguments bf16 (accelerate's mixed precision: fp32 shards, bf16 unsharded parameters, autocast)
    bf16: bool = False
    #: TrainingArguments gradient_accumulation_steps: the Trainer runs all but the last micro-batch under
    #: accelerate's no_sync (FSDP1: FullyShardedDataParallel.no_sync(); FSDP2: set_requires_gradient_sync(False))
    gas: int = 1

    def fsdp_options(self) -> dict[str, Any]:
        """The job's fsdp_config entries of its FSDP version (``version`` among them)."""
        raise NotImplementedError

    def training_args(self) -> dict[str, Any]:
        """training_args.json of the job, as a Trainer user writes it."""
        return {"output_dir": "out", "per_device_train_batch_size": self.b, "gradient_accumulation_steps": self.gas,
                "bf16": self.bf16, "dtype": "float32", "optim": "adamw_torch", "attn_implementation": "sdpa",
                "fsdp": True, "fsdp_config": {**self.fsdp_options(), "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                              "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
                                              "activation_checkpointing": self.ac},
                "max_length": self.s}

    def memform_config(self) -> dict[str, Any]:
        """``memform import hf config.json --trainer training_args.json --devices <world>`` of the job's files."""
        with tempfile.TemporaryDirectory() as tmp:
            self.hf_config().save_pretrained(tmp)
            args = Path(tmp) / "training_args.json"
            args.write_text(json.dumps(self.training_args(), indent=1))
            return imported_config("hf", Path(tmp) / "config.json", self.label(), trainer=str(args),
                                   devices=self.world)


def plugin(case: TrainerFSDPCase, **changes: Any) -> Any:
    """accelerate's FullyShardedDataParallelPlugin from the Trainer's own fsdp_plugin_args
    (TrainingArguments._process_fsdp_args of the case's training arguments), with ``changes`` to them."""
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
        plugin_args = {**args.fsdp_plugin_args, **changes}
    return FullyShardedDataParallelPlugin(**plugin_args)


def model(case: TrainerFSDPCase) -> Any:
    """The rank's transformers model as the Trainer holds it before accelerate wraps it: the same weights on
    every rank (as from_pretrained loads them), train mode, no KV cache."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    built = AutoModelForCausalLM.from_config(case.hf_config(), attn_implementation="sdpa", dtype=torch.float32)
    built.train()
    built.config.use_cache = False   # the Trainer's last init step: config.use_cache = args.use_cache (False)
    return built


def warmed_up(case: TrainerFSDPCase, wrapped: Any, rank: int) -> SimpleNamespace:
    """The rank's step over the wrapped model: ``params``, the AdamW ``opt`` (torch's, foreach off),
    ``forward()`` (the loss of the rank's batch, under autocast with bf16) and ``states()`` (AdamW's state
    tensors), after one warm-up step (the optimizer creates its states)."""
    import contextlib

    import torch

    params = list(wrapped.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4, foreach=False)
    gen = torch.Generator().manual_seed(1 + rank)
    ids = torch.randint(0, case.vocab, (case.b, case.s), generator=gen)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if case.bf16 else contextlib.nullcontext()

    def forward():  # noqa: ANN202 - the loss
        with autocast:
            return wrapped(input_ids=ids, labels=ids).loss

    def states() -> list[Any]:
        return [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]

    forward().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return SimpleNamespace(params=params, opt=opt, ids=ids, forward=forward, states=states)
