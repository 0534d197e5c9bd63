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
the CPU -- it only broadcasts rank 0's weights at wrap time (the ranks build the same weights here). HSDP
(HYBRID_SHARD, _HYBRID_SHARD_ZERO2, set as the launcher's FSDP_SHARDING_STRATEGY): accelerate passes no device
mesh, so torch shards within ``dist.new_subgroups(device_count())``; ``FSDP1Case.node`` runs the ranks as nodes
of that many devices (``torch.cpu.device_count`` patched while wrapping; the CPU's own count is 1).

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

from dataclasses import dataclass, replace
from typing import Any

from . import RankJobs, RankStep, rank_result
from .trainer_fsdp import TrainerFSDPCase, model, plugin, warmed_up


@dataclass(frozen=True)
class FSDP1Case(TrainerFSDPCase):
    """One Trainer FSDP1 job on ``world`` gloo ranks (a transformers Llama), and which rank's row (the shape,
    ``ac``, ``bf16`` and ``gas``: :class:`.trainer_fsdp.TrainerFSDPCase`'s)."""

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
    #: devices per node (0: torch's device_count(), 1 on the CPU): HYBRID_SHARD's shard group without a mesh is
    #: one node's ranks (_init_utils.py _init_intra_and_inter_node_groups(device_count())); the ranks run as
    #: if each node held this many (torch.cpu.device_count patched), and the config says device.devices_per_node
    node: int = 0

    def label(self) -> str:
        return (f"hf-fsdp1 llama L{self.L} h{self.h}{f' v{self.vocab}' if self.vocab != 1024 else ''} b{self.b} s{self.s} sdpa {'bf16' if self.bf16 else 'fp32'}"
                f"{' ac' if self.ac else ''}{f' gas{self.gas}' if self.gas > 1 else ''} {self.strategy} "
                f"{self.prefetch}{' fwd' if self.fwd_prefetch else ''}{'' if self.orig else ' flat'} dp{self.world}"
                f"{f' node{self.node}' if self.node else ''} rank{self.rank}")

    def fsdp_options(self) -> dict[str, Any]:
        return {"version": 1, "backward_prefetch": self.prefetch, "use_orig_params": self.orig,
                "forward_prefetch": self.fwd_prefetch}

    def memform_config(self) -> dict[str, Any]:
        cfg = super().memform_config()
        if self.strategy != "full_shard":
            cfg.setdefault("fsdp1", {})["sharding_strategy"] = self.strategy
        if self.node or self.strategy.startswith("hybrid"):     # (the CPU's device_count() is 1)
            cfg.setdefault("device", {})["devices_per_node"] = self.node or 1
        return cfg


Step = RankStep
_JOBS = RankJobs(prefix="memform-hf-fsdp1-")


def measure(case: FSDP1Case) -> Step:
    """The row of ``case``: its job's rank ``case.rank`` (the job is run on first use)."""
    return _JOBS.step(case, case.rank, _measure_item)


def run(cases: list[FSDP1Case]) -> None:
    _JOBS.run(cases, _measure_item)


def _measure_item(d: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    return rank_result(_run_rank, FSDP1Case, d, rank, world)


def _plugin(case: FSDP1Case) -> Any:
    """accelerate's plugin from the Trainer's fsdp_plugin_args (:func:`.trainer_fsdp.plugin`), sync_module_states
    off (accelerate: "not supported on cpu"; a wrap-time broadcast) and a strategy other than full_shard as
    FSDP_SHARDING_STRATEGY gives it to __post_init__ (default FULL_SHARD)."""
    changes: dict[str, Any] = {"sync_module_states": False}
    if case.strategy != "full_shard":
        changes["sharding_strategy"] = case.strategy.upper()
    return plugin(case, **changes)


def _wrap(case: FSDP1Case, module: Any) -> Any:
    """accelerate 1.16 Accelerator.prepare_model's FSDP1 branch: FullyShardedDataParallel with the plugin's
    arguments, then apply_activation_checkpointing (non-reentrant checkpoint_wrapper) per decoder layer."""
    import functools

    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    fsdp = _plugin(case)
    if case.bf16:
        fsdp.set_mixed_precision("bf16")      # AcceleratorState does this for an FSDP job
    fsdp.set_auto_wrap_policy(module)
    kwargs = {"sharding_strategy": fsdp.sharding_strategy or fsdp.reshard_after_forward,
              "cpu_offload": fsdp.cpu_offload, "auto_wrap_policy": fsdp.auto_wrap_policy,
              "mixed_precision": fsdp.mixed_precision_policy, "sync_module_states": fsdp.sync_module_states,
              "backward_prefetch": fsdp.backward_prefetch, "forward_prefetch": fsdp.forward_prefetch,
              "use_orig_params": fsdp.use_orig_params, "param_init_fn": fsdp.param_init_fn,
              "ignored_modules": fsdp.ignored_modules, "limit_all_gathers": fsdp.limit_all_gathers,
              "device_id": torch.device("cpu")}
    count = torch.cpu.device_count
    if case.node:      # HYBRID_SHARD's shard group: dist.new_subgroups(device_count()) ranks, as on a node of that many
        torch.cpu.device_count = lambda: case.node
    try:
        module = FSDP(module, **kwargs)
    finally:
        torch.cpu.device_count = count
    if fsdp.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)

        apply_activation_checkpointing(module, checkpoint_wrapper_fn=functools.partial(
            checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT), auto_wrap_policy=fsdp.auto_wrap_policy)
    return module


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
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from ..fsdp2 import _Samples, fsdp_peaks
    from ..tracker import storage_bytes, storages_of
    from .tracking import replay_reserved, replayed_figures

    wrapped = _wrap(case, model(case))
    handles = [m._handle for m in FSDP.fsdp_modules(wrapped) if m._handle is not None]
    step = warmed_up(case, wrapped, rank)
    forward, states, params, opt = step.forward, step.states, step.params, step.opt
    # gradient accumulation (trainer.py _inner_training_loop: every micro-batch but the last under
    # accelerator.no_sync, FSDP1's FullyShardedDataParallel.no_sync()): the flat parameters keep their
    # unsharded gradients (in the parameters' compute dtype) until the last micro-batch's reduce-scatter
    held: list[Any] = []
    if case.gas > 1:
        with wrapped.no_sync():
            for _ in range(case.gas - 1):
                forward().backward()
        held = [h.flat_param.grad for h in handles if h.flat_param.grad is not None]
    accumulated = sum(st.nbytes() for st in storages_of(held))
    shards = [h.flat_param._local_shard for h in handles]
    # what SHARD_GRAD_OP under no_sync keeps gathered between the micro-batches (_should_free_in_backward)
    kept_before = storages_of(h._get_padded_unsharded_flat_param() for h in handles
                              if h.uses_sharded_strategy and h._get_padded_unsharded_flat_param().untyped_storage().nbytes())
    static = storages_of([*shards, *params, *wrapped.buffers(), step.ids, *states(), *held, *kept_before])
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
    peak, act_peak, fsdp_peak, by_op = fsdp_peaks(sampler, out)
    grad_bytes = sum(st.nbytes() for st in grads)
    opt.step()
    measured = {"params": storage_bytes(shards) + kept_bytes + kept_static, "grads": grad_bytes + accumulated,
                "optimizer": storage_bytes(states()), "activations": activations, "activations_peak": act_peak,
                "comm": fsdp_peak, "peak": peak}
    measured.update(replayed_figures(replay_reserved(sampler, static, states(), _stream_of(sampler))))
    opt.zero_grad(set_to_none=True)
    return {k: int(v) for k, v in measured.items()}, {"peak_by_op": by_op["activations_peak"], "comm_by_op": by_op["comm"],
                                                       "by_op_peak": by_op["peak"]}


BASE = FSDP1Case()


def sweep() -> list[FSDP1Case]:
    """Every Trainer FSDP1 case of ``bench/validate.py --frameworks``: the sharding strategies, the backward
    prefetch modes, flat parameters (use_orig_params false), bf16 mixed precision, fsdp_config
    activation_checkpointing, gradient accumulation under no_sync, a vocabulary large enough that the root
    unit's backward sets the FSDP peak; forward_prefetch with each backward prefetch, bf16, shard_grad_op and
    the large vocabulary (the first unit's concatenation after the embedding's gradient); HSDP (hybrid_shard,
    hybrid_shard_zero2) on 4 ranks as 2 nodes of 2, and on 2 ranks of one-device nodes (torch clamps a shard
    group of one to NO_SHARD); 2 ranks (4 for some jobs), every rank shown."""
    cases: list[FSDP1Case] = []
    fwd = replace(BASE, fwd_prefetch=True)
    hsdp = replace(BASE, world=4, node=2, strategy="hybrid_shard")
    for c in (BASE, replace(BASE, prefetch="backward_pre"), replace(BASE, prefetch="backward_post"),
              replace(BASE, strategy="shard_grad_op"), replace(BASE, strategy="no_shard"),
              replace(BASE, orig=False), replace(BASE, bf16=True), replace(BASE, bf16=True, prefetch="backward_pre"),
              replace(BASE, ac=True), replace(BASE, bf16=True, ac=True), replace(BASE, gas=2),
              replace(BASE, bf16=True, gas=2), replace(BASE, strategy="shard_grad_op", gas=2),
              replace(BASE, strategy="no_shard", bf16=True), replace(BASE, vocab=4096),
              replace(BASE, vocab=4096, bf16=True, prefetch="backward_pre"),
              replace(BASE, world=4, bf16=True),
              fwd, replace(fwd, prefetch="backward_pre"), replace(fwd, prefetch="backward_post"),
              replace(fwd, bf16=True), replace(fwd, strategy="shard_grad_op"), replace(fwd, vocab=4096),
              hsdp, replace(hsdp, bf16=True, prefetch="backward_pre"), replace(hsdp, strategy="hybrid_shard_zero2"),
              replace(BASE, strategy="hybrid_shard")):
        cases += c.ranks()
    return cases


def quick_sweep() -> list[FSDP1Case]:
    """The tests' subset: full_shard in fp32 (the Trainer's defaults), both ranks."""
    return BASE.ranks()
