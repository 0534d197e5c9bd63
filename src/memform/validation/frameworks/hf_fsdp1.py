"""The Hugging Face Trainer's FSDP1 as the ground truth: a transformers model wrapped in torch's
``FullyShardedDataParallel`` (flat parameters) the way accelerate wraps it, on gloo ranks, held against
memform's ``hf-fsdp1`` profile (formulas/frameworks/hf-fsdp1.mf).

What the Trainer does with ``TrainingArguments(fsdp=True, fsdp_config={"version": 1, ...})`` (transformers
5.25, accelerate 1.16, torch 2.13): ``TrainingArguments._process_fsdp_args`` turns ``fsdp_config`` into the
keyword arguments of accelerate's ``FullyShardedDataParallelPlugin`` (``reshard_after_forward`` = the
sharding strategy's name, ``backward_prefetch`` default NO_PREFETCH, ``use_orig_params`` default true,
``limit_all_gathers`` the plugin's default true), and ``Accelerator.prepare_model`` (accelerator.py, its
FSDP1 branch) calls ``FullyShardedDataParallel(model, sharding_strategy=..., cpu_offload=...,
auto_wrap_policy=..., mixed_precision=..., backward_prefetch=..., forward_prefetch=..., use_orig_params=...,
limit_all_gathers=..., device_id=...)`` -- one FlatParameter per decoder layer (TRANSFORMER_BASED_WRAP) and
one for the root (the embedding, the final norm and lm_head) -- then ``apply_activation_checkpointing``
(non-reentrant ``checkpoint_wrapper`` around each decoder layer) when ``fsdp_config``
activation_checkpointing is on. Under bf16 mixed precision ``set_mixed_precision`` gives
``MixedPrecision(param_dtype=reduce_dtype=buffer_dtype=bfloat16)`` over the fp32 flat parameters.
Accelerate enables FSDP only on an accelerator, so the harness builds the plugin from the Trainer's own
``fsdp_plugin_args`` and makes that same ``FullyShardedDataParallel`` call itself, with ``device_id`` the
CPU; ``sync_module_states`` (transformers' default true) is passed false, because accelerate refuses it on
the CPU -- it only broadcasts rank 0's weights at wrap time (the ranks build the same weights here).

The measurement follows :func:`memform.validation.fsdp2.trace_step` (its sampler and categories), for
FSDP1's objects: params = the sharded flat parameters plus the unsharded flat parameters still allocated
after forward (the root unit, which FSDP1 never reshards after forward, ``_post_forward_reshard``; every
unit under SHARD_GRAD_OP); grads = the sharded flat gradients after backward (plus, with gradient
accumulation, the unsharded ones ``no_sync`` keeps between micro-batches); optimizer = AdamW's states;
comm = the largest live bytes of FSDP's own storages: what its ``record_function("FullyShardedDataParallel.
...")`` regions allocate (the padded all-gather outputs, the low-precision shard, the reduce-scatter input
and output, the sharded gradient's cast) and the unsharded gradients autograd makes for a unit's flat
parameter (each original parameter's gradient, then their concatenation into the flat gradient: tensor
hooks on the views FSDP hands the modules and on the flat parameter tag them).
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
class FSDP1Case:
    """One Trainer FSDP1 job on ``world`` gloo ranks (a transformers Llama), and which rank's row."""

    h: int = 128
    L: int = 4
    heads: int = 8
    kv_heads: int = 4
    ffn: int = 352
    vocab: int = 1024
    b: int = 2
    s: int = 256
    world: int = 2
    #: the ShardingStrategy run: the plugin's sharding_strategy, which accelerate takes from the launcher's
    #: FSDP_SHARDING_STRATEGY (``accelerate launch --fsdp_sharding_strategy``; default FULL_SHARD) and prefers
    #: to fsdp_config reshard_after_forward, so a case other than full_shard sets it as the launcher does and
    #: its memform config says fsdp1.sharding_strategy (the importer cannot see the launcher's environment)
    strategy: str = "full_shard"
    #: fsdp_config backward_prefetch (the Trainer's default: no_prefetch)
    prefetch: str = "no_prefetch"
    #: fsdp_config use_orig_params (the Trainer's default: true)
    orig: bool = True
    #: fsdp_config forward_prefetch (the Trainer's default: false)
    fwd_prefetch: bool = False
    #: fsdp_config activation_checkpointing
    ac: bool = False
    #: TrainingArguments bf16 (FSDP1 MixedPrecision(bf16, bf16, bf16) over fp32 flat parameters, autocast)
    bf16: bool = False
    #: TrainingArguments gradient_accumulation_steps (all but the last micro-batch under FSDP's no_sync())
    gas: int = 1
    rank: int = 0

    def job(self) -> "FSDP1Case":
        return replace(self, rank=0)

    def label(self) -> str:
        return (f"hf-fsdp1 llama L{self.L} h{self.h}{f' v{self.vocab}' if self.vocab != 1024 else ''} b{self.b} s{self.s} sdpa {'bf16' if self.bf16 else 'fp32'}"
                f"{' ac' if self.ac else ''}{f' gas{self.gas}' if self.gas > 1 else ''} {self.strategy} "
                f"{self.prefetch}{' fwd' if self.fwd_prefetch else ''}{'' if self.orig else ' flat'} dp{self.world} "
                f"rank{self.rank}")

    # ---- the job's two files --------------------------------------------------------------------------
    def hf_config(self) -> Any:
        return llama_hf_config(self)

    def training_args(self) -> dict[str, Any]:
        """training_args.json of the job, as a Trainer user writes it."""
        return {"output_dir": "out", "per_device_train_batch_size": self.b, "gradient_accumulation_steps": self.gas,
                "bf16": self.bf16, "dtype": "float32", "optim": "adamw_torch", "attn_implementation": "sdpa",
                "fsdp": True, "fsdp_config": {"version": 1, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                              "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
                                              "backward_prefetch": self.prefetch,
                                              "use_orig_params": self.orig,
                                              "forward_prefetch": self.fwd_prefetch,
                                              "activation_checkpointing": self.ac},
                "max_length": self.s}

    def memform_config(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            self.hf_config().save_pretrained(tmp)
            args = Path(tmp) / "training_args.json"
            args.write_text(json.dumps(self.training_args(), indent=1))
            cfg = imported_config("hf", Path(tmp) / "config.json", self.label(), trainer=str(args),
                                  devices=self.world)
        if self.strategy != "full_shard":
            cfg.setdefault("fsdp1", {})["sharding_strategy"] = self.strategy
        return cfg


Step = RankStep
_JOBS = RankJobs(prefix="memform-hf-fsdp1-")


def measure(case: FSDP1Case) -> Step:
    """The row of ``case``: its job's rank ``case.rank`` (the job is run on first use)."""
    return _JOBS.step(case, case.rank, _measure_item)


def run(cases: list[FSDP1Case]) -> None:
    _JOBS.run(cases, _measure_item)


def _measure_item(d: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    try:
        measured, by_op = _run_rank(FSDP1Case(**d), rank, world)
        return {"measured": measured, "notes": {"peak_by_op": by_op.get("activations_peak", {}),
                                                "comm_by_op": by_op.get("comm", {}),
                                                "by_op_peak": by_op.get("peak", {})}}
    except Exception as exc:  # noqa: BLE001 - reported with the case
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300],
                "trace": traceback.format_exc()[-3000:]}


def _plugin(case: FSDP1Case) -> Any:
    """accelerate's FullyShardedDataParallelPlugin from the Trainer's own fsdp_plugin_args
    (TrainingArguments._process_fsdp_args of the case's training arguments), sync_module_states off."""
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
    plugin_args["sync_module_states"] = False      # accelerate: "not supported on cpu" (a wrap-time broadcast)
    if case.strategy != "full_shard":     # what FSDP_SHARDING_STRATEGY gives __post_init__ (default FULL_SHARD)
        plugin_args["sharding_strategy"] = case.strategy.upper()
    return FullyShardedDataParallelPlugin(**plugin_args)


def _wrap(case: FSDP1Case, model: Any) -> Any:
    """accelerate 1.16 Accelerator.prepare_model's FSDP1 branch: FullyShardedDataParallel with the plugin's
    arguments, then apply_activation_checkpointing (non-reentrant checkpoint_wrapper) per decoder layer."""
    import functools

    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    plugin = _plugin(case)
    if case.bf16:
        plugin.set_mixed_precision("bf16")      # AcceleratorState does this for an FSDP job
    plugin.set_auto_wrap_policy(model)
    kwargs = {"sharding_strategy": plugin.sharding_strategy or plugin.reshard_after_forward,
              "cpu_offload": plugin.cpu_offload, "auto_wrap_policy": plugin.auto_wrap_policy,
              "mixed_precision": plugin.mixed_precision_policy, "sync_module_states": plugin.sync_module_states,
              "backward_prefetch": plugin.backward_prefetch, "forward_prefetch": plugin.forward_prefetch,
              "use_orig_params": plugin.use_orig_params, "param_init_fn": plugin.param_init_fn,
              "ignored_modules": plugin.ignored_modules, "limit_all_gathers": plugin.limit_all_gathers,
              "device_id": torch.device("cpu")}
    model = FSDP(model, **kwargs)
    if plugin.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)

        apply_activation_checkpointing(model, checkpoint_wrapper_fn=functools.partial(
            checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT), auto_wrap_policy=plugin.auto_wrap_policy)
    return model


class _Tagger:
    """Tags the unsharded gradients of FSDP1's flat parameters as FSDP's: each view FSDP hands a module
    (FlatParamHandle._use_unsharded_views, in forward and in the pre-backward hook) gets a tensor hook that
    tags its gradient, and every flat parameter one that tags the concatenated flat gradient autograd
    accumulates into it."""

    def __init__(self, sampler: Any, handles: list[Any]) -> None:
        from torch.distributed.fsdp._flat_param import FlatParamHandle

        self.sampler, self.handles, self.hooks = sampler, handles, []
        self._orig = FlatParamHandle._use_unsharded_views
        tagger = self

        def use_unsharded_views(handle, as_params):  # noqa: ANN001, ANN202
            out = tagger._orig(handle, as_params)
            import torch
            if torch.is_grad_enabled():
                for info in handle.flat_param._param_infos:
                    view = getattr(info.module, info.param_name, None)
                    if view is not None and view.requires_grad and view.grad_fn is not None:
                        tagger.hooks.append(view.register_hook(tagger._tag))
            return out

        FlatParamHandle._use_unsharded_views = use_unsharded_views
        for h in handles:
            self.hooks.append(h.flat_param.register_hook(self._tag))

    def _tag(self, grad: Any) -> None:
        self.sampler.tag([grad.untyped_storage()], "fsdp")

    def close(self) -> None:
        from torch.distributed.fsdp._flat_param import FlatParamHandle

        FlatParamHandle._use_unsharded_views = self._orig
        for h in self.hooks:
            h.remove()


def _stream_of(sampler: Any):  # noqa: ANN202
    """The stream FSDP1 allocates a storage on (fully_sharded_data_parallel.py _init_streams: the unshard
    stream for the all-gather, the post-backward stream for the reduce-scatter); the rest: default."""
    def stream_of(serial: int) -> str | int:
        if sampler.tags.get(serial) != "fsdp":
            return 0
        op = sampler.op_of.get(serial, "")
        if "reduce_scatter" in op or op in ("constant_pad_nd", "empty_like", "_to_copy"):
            return "reduce-scatter"
        if "allgather" in op or "all_gather" in op:
            return "all-gather"
        return 0
    return stream_of


def _run_rank(case: FSDP1Case, rank: int, world: int) -> tuple[dict[str, int], dict[str, Any]]:
    import contextlib

    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from transformers import AutoModelForCausalLM

    from ..fsdp2 import _Samples
    from ..tracker import storage_bytes, storages_of
    from .tracking import replay_reserved, replayed_figures

    torch.manual_seed(0)     # the same weights on every rank, as from_pretrained loads them
    model = AutoModelForCausalLM.from_config(case.hf_config(), attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    model.config.use_cache = False   # the Trainer's last init step: config.use_cache = args.use_cache (False)
    model = _wrap(case, model)
    handles = [m._handle for m in FSDP.fsdp_modules(model) if m._handle is not None]
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
    # accelerator.no_sync, FSDP1's FullyShardedDataParallel.no_sync()): the flat parameters keep their
    # unsharded gradients (in the parameters' compute dtype) until the last micro-batch's reduce-scatter
    held: list[Any] = []
    if case.gas > 1:
        with model.no_sync():
            for _ in range(case.gas - 1):
                forward().backward()
        held = [h.flat_param.grad for h in handles if h.flat_param.grad is not None]
    accumulated = sum(st.nbytes() for st in storages_of(held))
    shards = [h.flat_param._local_shard for h in handles]
    # what SHARD_GRAD_OP under no_sync keeps gathered between the micro-batches (_should_free_in_backward)
    kept_before = storages_of(h._get_padded_unsharded_flat_param() for h in handles
                              if h.uses_sharded_strategy and h._get_padded_unsharded_flat_param().untyped_storage().nbytes())
    static = storages_of([*shards, *params, *model.buffers(), ids, *states(), *held, *kept_before])
    kept_static = sum(st.nbytes() for st in kept_before)

    sampler = _Samples(static)
    sampler.region_prefixes = ("FullyShardedDataParallel._",)   # not .forward: the whole module forward runs in it
    tagger = _Tagger(sampler, handles)
    try:
        with sampler.mode:
            loss = forward()
            # the unsharded flat parameters still allocated after forward (params: the root unit; every unit
            # under SHARD_GRAD_OP)
            kept = storages_of(h._get_padded_unsharded_flat_param() for h in handles if h.uses_sharded_strategy
                               and h._get_padded_unsharded_flat_param().untyped_storage().nbytes())
            kept_serials = sampler.serials(kept)
            before = {id(st) for st in kept_before}      # (counted once: kept_static)
            kept_bytes = sum(st.nbytes() for st in kept if id(st) not in before)
            activations = sampler.live_bytes(lambda s: s not in kept_serials and sampler.tags.get(s) != "fsdp")
            loss.backward()
    finally:
        tagger.close()
    # the padded unsharded flat parameters (all-gather destinations, made at wrap time and re-allocated by
    # resizing their storage, _flat_param.py _alloc_storage): on the CPU FSDP1 all-gathers into torch.chunk
    # views of them (_all_gather_flat_param), so the sampler first saw them through a view op, which it takes
    # for the backend's scratch -- they are FSDP's
    sampler.tag([t for h in handles if h.uses_sharded_strategy
                 for t in (h.flat_param._full_param_padded, getattr(h.flat_param, "_full_prec_full_param_padded", None))
                 if t is not None], "fsdp")
    grads = storages_of([*(h.flat_param.grad for h in handles), *(p.grad for p in params)])
    out = kept_serials | sampler.serials(grads) | sampler.tagged("backend")
    peak, at = sampler.peak(lambda s: s not in out)
    act_peak, act_at = sampler.peak(lambda s: s not in out and sampler.tags.get(s) != "fsdp")
    fsdp_peak, fsdp_at = sampler.peak(lambda s: s not in out and sampler.tags.get(s) == "fsdp")
    by_op = {"peak": sampler.by_op(at, lambda s: s not in out),
             "activations_peak": sampler.by_op(act_at, lambda s: s not in out and sampler.tags.get(s) != "fsdp"),
             "comm": sampler.by_op(fsdp_at, lambda s: s not in out and sampler.tags.get(s) == "fsdp")}
    grad_bytes = sum(st.nbytes() for st in grads)
    opt.step()
    measured = {"params": storage_bytes(shards) + kept_bytes + kept_static, "grads": grad_bytes + accumulated,
                "optimizer": storage_bytes(states()), "activations": activations, "activations_peak": act_peak,
                "comm": fsdp_peak, "peak": peak}
    measured.update(replayed_figures(replay_reserved(sampler, static, states(), _stream_of(sampler))))
    opt.zero_grad(set_to_none=True)
    return {k: int(v) for k, v in measured.items()}, by_op


def _ranks(case: FSDP1Case) -> list[FSDP1Case]:
    return [replace(case, rank=r) for r in range(case.world)]


BASE = FSDP1Case()


def sweep() -> list[FSDP1Case]:
    """Every Trainer FSDP1 case of ``bench/validate.py --frameworks``: the sharding strategies, the backward
    prefetch modes, flat parameters (use_orig_params false), bf16 mixed precision, fsdp_config
    activation_checkpointing, gradient accumulation under no_sync, a vocabulary large enough that the root
    unit's backward sets the FSDP peak; 2 ranks (one job on 4), every rank shown. (forward_prefetch is refused
    by the importer: ``FSDP1Case(fwd_prefetch=True)`` measures what it adds, not modelled.)"""
    cases: list[FSDP1Case] = []
    for c in (BASE, replace(BASE, prefetch="backward_pre"), replace(BASE, prefetch="backward_post"),
              replace(BASE, strategy="shard_grad_op"), replace(BASE, strategy="no_shard"),
              replace(BASE, orig=False), replace(BASE, bf16=True), replace(BASE, bf16=True, prefetch="backward_pre"),
              replace(BASE, ac=True), replace(BASE, bf16=True, ac=True), replace(BASE, gas=2),
              replace(BASE, bf16=True, gas=2), replace(BASE, strategy="shard_grad_op", gas=2),
              replace(BASE, strategy="no_shard", bf16=True), replace(BASE, vocab=4096),
              replace(BASE, vocab=4096, bf16=True, prefetch="backward_pre"),
              replace(BASE, world=4, bf16=True)):
        cases += _ranks(c)
    return cases


def quick_sweep() -> list[FSDP1Case]:
    """The tests' subset: full_shard in fp32 (the Trainer's defaults), both ranks."""
    return _ranks(BASE)
