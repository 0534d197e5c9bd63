"""DeepSpeed as the ground truth: its own engine, ZeRO optimizers and parameter partitioning, real
training steps on gloo ranks, measured per rank and held against memform's ``deepspeed`` profile.

A case is a small Hugging Face ``LlamaForCausalLM`` (built by transformers from a config of its own
class, random weights, no download) trained by DeepSpeed from a ``ds_config`` dict
(:meth:`DSCase.ds_config`). memform reads *the same* two files -- the model's ``config.json`` and the
``ds_config`` written to a JSON file -- through ``memform import deepspeed ds_config.json --model
config.json`` (which reads the model through ``memform import hf``), with what neither file says given
as ``--set`` overrides (:meth:`DSCase.overrides`): so both importers are checked too. Each rank of a
:func:`..ranks.spawn` gloo group runs what a DeepSpeed training script runs:

- ``deepspeed.init_distributed("gloo")`` on DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``);
- the model: ZeRO-3 builds it under ``deepspeed.zero.Init(config_dict_or_path=ds_config)``, so every
  parameter is partitioned as it is created (transformers' model class is imported first: resolving it
  inside ``zero.Init`` fails on its patched tensor constructors, ``shared/reference/frameworks-on-cpu.md``
  §4);
- ``deepspeed.initialize(model, optimizer=torch.optim.AdamW(...), config=ds_config)`` with
  ``zero_allow_untested_optimizer``: a client torch AdamW, wrapped by DeepSpeed as the HF Trainer's
  default optimizer is (DeepSpeed's own ``FusedAdam`` would JIT-compile a CPU op for minutes; it keeps
  the same two states);
- the steps of a DeepSpeed training loop: ``loss = engine(input_ids, labels=input_ids).loss``,
  ``engine.backward(loss)``, ``engine.step()``.

One warm-up step (the optimizer creates its states) is followed by the traced one
(:class:`.tracking.StepSamples`). A storage's category is *what DeepSpeed holds it as*
(:data:`HELD_AS`: the attribute of the ZeRO optimizer, or the parameter, that refers to it between the
steps or at the end of forward or backward), else the DeepSpeed method that allocated it (:data:`PHASES`),
else the op that made it:

- params: the module's parameters (ZeRO-1/2: views of ``bit16_groups_flat``; ZeRO-3: their
  ``ds_tensor`` partitions);
- grads: the gradients DeepSpeed keeps for the step, at the end of ``engine.backward`` (``.grad`` at
  stage 0, ``grads_in_partition`` behind ``averaged_gradients`` at ZeRO-1/2,
  ``grad_partitions_flat_buffer`` at ZeRO-3);
- optimizer: the fp32 master copy (``single_partition_of_fp32_groups``, ``fp32_partitioned_groups_flat``,
  FP16_UnfusedOptimizer's ``fp32_groups``) and the AdamW states;
- comm: the gradient reduction's buffers at their peak over forward and backward: the IPG buckets
  (``setup_buckets``), the flat copies ``allreduce_bucket`` / ``reduce_scatter_coalesced`` make of them,
  stage 0's flattened all-reduce buckets (``allreduce_gradients``), and any other collective's output.
  What the process group allocates *inside* a collective (gloo's copy of a reduce-scatter input; NCCL
  allocates nothing through the caching allocator) is the backend's: ``backend_peak`` in the notes;
- activations: the rest of what the step creates, live when the forward has returned; activations_peak:
  its largest sum over forward and backward (a parameter's gradient before the reduce hook copies it
  into a bucket is on this side). The optimizer step is traced on its own (``step_peak`` in the notes);
- reserved, reserve and step_peak: the traced step replayed through memform's caching-allocator model
  (:func:`.tracking.replay_reserved`, :func:`.tracking.replayed_figures`), as the transformers harness
  does (on one stream: DeepSpeed's reduction and all-gather streams are not told apart).

ZeRO-3's parameter working set -- the tensors kept gathered below ``stage3_param_persistence_threshold``,
the IPG bucket it allocates once, and, at their peak, the fetched parameters (the all-gather's flat
buffers and the parameters copied out of them) -- is stage-wide, so memform's profile reports it as the
runtime blocks ``zero3_persistent``, ``zero3_fetch`` and ``zero3_cache``, not as params or comm. The
harness measures it as ``measured["zero3"]`` and :func:`zero3_working_set` sets it against the sum of
:data:`ZERO3_BLOCKS` (``tests/test_frameworks_deepspeed.py`` holds the two within the comm threshold);
the shared rows compare the rest.

Rows: one per rank (``DSCase.rank``); the job runs once for all of its ranks.

The one shim: DeepSpeed's ``TorchBackend`` builds its shared-memory all-reduce op with ninja and g++
when it is created (``deepspeed/comm/torch.py`` ``build_shm_op``, ~30 s on 2 cores the first time, then
cached); the op serves only ``inference_all_reduce``, which training never calls, so it is not built.

Needs DeepSpeed 0.19.8 (in the ``frameworks`` extra; ``pip install deepspeed==0.19.8 torch==2.13.0``
pins torch where pip could otherwise fetch a CUDA build). It installs in seconds (pure Python, ~21 MB)
and compiles nothing at run time here.
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import LlamaRankCase, RankJobs, RankStep, imported_config, rank_result
from .tracking import StepSamples, replay_reserved, replayed_figures

#: the DeepSpeed version the harness was checked against
VERSION = "0.19.8"
INSTALL = "pip install deepspeed==0.19.8"


@dataclass(frozen=True)
class DSCase(LlamaRankCase):
    """One DeepSpeed job on ``world`` gloo ranks, and which rank's row (the job runs once for all)."""

    zero: int = 2             # zero_optimization.stage (named so: a case's `stage` is a pipeline stage)
    bf16: bool = False
    #: 8 layers: each rank's ZeRO partition holds 4 of them, as in a real job (a 7B model over 8 ranks),
    #: so the one parameter a partition boundary cuts -- held whole by both ranks' grads_in_partition
    #: (stage_1_and_2.py copy_grads_in_partition) -- is a small part of a partition, as it is there
    L: int = 8
    gc: bool = False
    attn: str = "sdpa"        # transformers' attn_implementation: sdpa (the CPU flash kernel) or eager
    #: zero_optimization.reduce_bucket_size / allgather_bucket_size (and ZeRO-3's prefetch bucket): DeepSpeed's
    #: 5e8 default is a 2 GB fp32 buffer, shrunk for a model of 1.7M parameters (frameworks-on-cpu.md §4)
    bucket: int = 500_000
    #: zero_optimization.stage3_param_persistence_threshold (None: DeepSpeed's default, 1e5 elements,
    #: which keeps every tensor of this model but the embedding and the head gathered)
    persist: int | None = None
    overlap: bool | None = None   # zero_optimization.overlap_comm (None: DeepSpeed's default)
    #: bf16.bf16_master_weights_and_grads and bf16_optimizer_states (DeepSpeedExamples training/
    #: bf16_master_weight's bf16_full.json, without its torch_autocast): 16-bit master, gradients, moments
    master16: bool = False

    def label(self) -> str:
        extra = f" persist{self.persist}" if self.persist is not None else ""
        extra += "" if self.overlap is None else f" overlap{int(self.overlap)}"
        extra += " master16" if self.master16 else ""
        return (f"ds zero{self.zero} L{self.L} h{self.h} b{self.b} s{self.s} {self.attn} "
                f"{'bf16' if self.bf16 else 'fp32'}{' gc' if self.gc else ''} bucket{self.bucket:g}{extra} "
                f"dp{self.world} rank{self.rank}")

    # ---- the two files of the job (hf_config: LlamaRankCase's) ----------------------------------------
    def ds_config(self) -> dict[str, Any]:
        """The ds_config.json of the job, as a DeepSpeed user writes it."""
        zero: dict[str, Any] = {"stage": self.zero, "reduce_bucket_size": self.bucket,
                                "allgather_bucket_size": self.bucket}
        if self.zero == 3:
            zero["stage3_prefetch_bucket_size"] = self.bucket
            if self.persist is not None:
                zero["stage3_param_persistence_threshold"] = self.persist
        if self.overlap is not None:
            zero["overlap_comm"] = self.overlap
        return {"train_micro_batch_size_per_gpu": self.b, "gradient_accumulation_steps": 1,
                "train_batch_size": self.b * self.world, "zero_optimization": zero,
                "bf16": {"enabled": self.bf16, **({"bf16_master_weights_and_grads": True,
                                                    "bf16_optimizer_states": True} if self.master16 else {})},
                "zero_allow_untested_optimizer": True,
                "steps_per_print": 1_000_000}

    # ---- memform's side: the same files through `memform import deepspeed` --------------------------
    def overrides(self) -> dict[str, Any]:
        """What neither file says, as ``--set`` keys: the sequence length of the batch, the attention
        kernel (transformers' sdpa runs the CPU flash kernel: O(s) kept; eager materialises the scores)
        and the recompute mode (``gradient_checkpointing_enable``: every decoder layer)."""
        return {"model.seq_length": self.s, "model.flash_attention": self.attn == "sdpa",
                "training.recompute": "full" if self.gc else "none"}

    def memform_config(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            self.hf_config().save_pretrained(tmp)
            ds = Path(tmp) / "ds_config.json"
            ds.write_text(json.dumps(self.ds_config(), indent=1))
            return imported_config("deepspeed", ds, self.label(), model=str(Path(tmp) / "config.json"),
                                   overrides=self.overrides())


Step = RankStep


#: the jobs run so far in this process (a job runs once for all of its rank rows)
_JOBS = RankJobs(prefix="memform-ds-")


def measure(case: DSCase) -> Step:
    """The row of ``case``: its job's rank ``case.rank`` (the job is run on first use)."""
    return _JOBS.step(case, case.rank, _measure_item)


#: memform's runtime blocks of the ZeRO-3 parameter working set (formulas/frameworks/deepspeed.mf)
ZERO3_BLOCKS = ("zero3_persistent", "zero3_fetch", "zero3_cache")


def zero3_working_set(case: DSCase) -> tuple[int, int]:
    """ZeRO-3's parameter working set of ``case``'s rank: measured, and memform's :data:`ZERO3_BLOCKS`."""
    import memform

    measured = measure(case).measured.get("zero3", 0)
    runtime = memform.estimate(case.memform_config()).stages[0].runtime
    return measured, sum(int(runtime.get(k, 0)) for k in ZERO3_BLOCKS)


def run(cases: list[DSCase]) -> None:
    """Run every job of ``cases`` not run yet, in one spawned group per world size."""
    _JOBS.run(cases, _measure_item)


# ---- one rank ----------------------------------------------------------------------------------------
def _measure_item(d: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """One job on this rank (:func:`..ranks.spawn` runs it in each rank's process)."""
    return rank_result(_run_rank, DSCase, d, rank, world)


def _deepspeed():  # noqa: ANN202 - the deepspeed module, imported on the CPU accelerator, quietly
    import logging
    import warnings

    os.environ["DS_ACCELERATOR"] = "cpu"
    warnings.filterwarnings("ignore")
    import importlib

    import deepspeed
    from deepspeed.utils import logger

    ds_torch = importlib.import_module("deepspeed.comm.torch")   # (deepspeed.comm.torch is the torch module)

    logger.setLevel(logging.ERROR)
    ds_torch.build_shm_op = lambda: None   # the shim of the module docstring
    _wrap_collectives()
    return deepspeed


#: torch.distributed's collectives: what the process group allocates inside them is the backend's own
#: scratch (gloo's copies of its inputs on the CPU; NCCL allocates nothing through the caching allocator),
#: tagged "backend" and reported, not compared
BACKEND_CALLS = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "_all_gather_base",
                 "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base",
                 "all_reduce_coalesced", "all_to_all_single", "all_gather_single")
#: the traces being recorded in this process (their phase stacks take the "backend" tag)
_TRACING: list = []
_WRAPPED = False


def _wrap_collectives() -> None:
    """Wrap torch.distributed's collectives once per process, before DeepSpeed's comm backend binds them."""
    global _WRAPPED
    if _WRAPPED:
        return
    import functools

    import torch.distributed as tdist

    for name in BACKEND_CALLS:
        orig = getattr(tdist, name, None)
        if orig is None:
            continue

        @functools.wraps(orig)
        def wrapped(*a, _orig=orig, **k):  # noqa: ANN001, ANN202
            for t in _TRACING:
                t.phase.append("backend")
            try:
                return _orig(*a, **k)
            finally:
                for t in _TRACING:
                    t.phase.pop()

        setattr(tdist, name, wrapped)
    _WRAPPED = True


#: the attributes DeepSpeed holds each category's tensors in (deepspeed/runtime/): engine.py
#: (DeepSpeedEngine), zero/stage_1_and_2.py (DeepSpeedZeroOptimizer), zero/stage3.py
#: (DeepSpeedZeroOptimizer_Stage3), bf16_optimizer.py (BF16_Optimizer); "param" are the module's
#: parameters, "state" the wrapped torch optimizer's per-parameter states
HELD_AS: dict[str, tuple[str, ...]] = {
    "params": ("param", "bit16_groups_flat", "bit16_groups", "parallel_partitioned_bit16_groups",
               "fp16_partitioned_groups_flat", "fp16_groups", "lp_param_buffer", "bf16_groups",
               "bf16_groups_flat", "bf16_partitioned_groups", "ds_tensor", "persistent_parameters"),
    "grads": ("grad", "averaged_gradients", "grads_in_partition", "grad_partitions_flat_buffer",
              "fp32_groups_gradients", "fp32_groups_gradients_flat", "fp32_groups_gradient_flat_partition",
              "fp32_groups_has_gradients", "__param_id_to_grad_partition"),
    "optimizer": ("state", "single_partition_of_fp32_groups", "fp32_partitioned_groups_flat",
                  "fp32_groups_flat_partition", "fp32_groups"),
    "comm": ("ipg_buffer", "ipg_buckets", "ipg_bucket", "temp_grad_buffer_for_gpu_offload"),
}
#: ops whose outputs are communication buffers (c10d's and gloo's functional collectives)
COLLECTIVES = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "broadcast", "alltoall",
               "all_to_all", "_reduce_scatter_base", "_allgather_base")


#: the methods whose allocations are a category, by the DeepSpeed object they belong to: the gradient
#: reduction (buckets, flattened copies, reduced outputs: comm) and ZeRO-3's parameter fetch (the
#: gathered parameters: "gathered", memform's zero3_fetch / zero3_cache runtime blocks)
PHASES: dict[str, tuple[tuple[str, str], ...]] = {
    # engine.py: stage 0 (and BF16_Optimizer) all-reduces the gradients in buckets (buffered_allreduce_fallback)
    "engine": (("allreduce_gradients", "comm"),),
    # stage_1_and_2.py: the IPG buffers (setup_buckets) and their reduction (reduce_ipg_grads, average_tensor);
    # reduce_gradients: ZeRO-1's reduction without overlap
    "DeepSpeedZeroOptimizer": (("setup_buckets", "comm"), ("reduce_ipg_grads", "comm"),
                               ("reduce_gradients", "comm")),
    # stage3.py: the bucket's all-reduce / reduce-scatter and the partitioning of its gradients
    "DeepSpeedZeroOptimizer_Stage3": (("_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads", "comm"),),
    # partitioned_param_coordinator.py: fetch_sub_module all-gathers a module's parameters (and prefetches)
    "PartitionedParameterCoordinator": (("fetch_sub_module", "gathered"),),
}


class _Samples(StepSamples):
    """:class:`.tracking.StepSamples` whose new storages take the tag of the DeepSpeed method running
    (:data:`PHASES`, :data:`BACKEND_CALLS`), the innermost one."""

    def __init__(self, ignore) -> None:  # noqa: ANN001 - storages, as StepSamples takes them
        super().__init__(ignore)
        self.phase: list[str] = []

    def _classify(self, op: str) -> str | None:
        return self.phase[-1] if self.phase else None


def _wrap_phases(trace, engine) -> list:  # noqa: ANN001
    """Wrap the :data:`PHASES` methods of the engine, its optimizer and ZeRO-3's parameter coordinators
    (instance attributes) so that what they allocate is tagged; returns the (object, name) pairs to delete
    again."""
    import functools

    objs = [("engine", engine), (type(engine.optimizer).__name__, engine.optimizer)]
    offload = getattr(engine.optimizer, "parameter_offload", None)
    if offload is not None:
        coords = getattr(offload, "param_coordinators", None) or {}
        objs += [("PartitionedParameterCoordinator", c) for c in
                 (coords.values() if isinstance(coords, dict) else coords)]
        if hasattr(offload, "get_param_coordinator"):
            objs.append(("PartitionedParameterCoordinator", offload.get_param_coordinator()))
    undo = []
    for kind, obj in objs:
        for name, tag in PHASES.get(kind, ()):
            orig = getattr(obj, name, None)
            if orig is None or name in vars(obj):
                continue

            @functools.wraps(orig)
            def wrapped(*a, _orig=orig, _tag=tag, **k):  # noqa: ANN001, ANN202
                trace.phase.append(_tag)
                try:
                    return _orig(*a, **k)
                finally:
                    trace.phase.pop()

            setattr(obj, name, wrapped)
            undo.append((obj, name))
    return undo


def _held(engine, params) -> dict[int, tuple[str, Any]]:  # noqa: ANN001
    """id(storage) -> (attribute path, storage) for every tensor the engine's optimizer and the module's
    parameters hold (the first path found; the parameters first)."""
    import torch

    out: dict[int, tuple[str, Any]] = {}
    seen: set[int] = set()

    def visit(obj, path: str, depth: int) -> None:  # noqa: ANN001
        if id(obj) in seen or depth > 6:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.device.type != "meta":
                st = obj.untyped_storage()
                if st.nbytes():
                    out.setdefault(id(st), (path, st))
            for attr in ("ds_tensor", "grad"):
                sub = getattr(obj, attr, None)
                if isinstance(sub, torch.Tensor):
                    visit(sub, f"{path}.{attr}", depth + 1)
            return
        if isinstance(obj, dict):
            for k, v in list(obj.items()):
                visit(v, f"{path}[{k if isinstance(k, (str, int)) else '*'}]", depth + 1)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                visit(v, f"{path}[{i}]", depth + 1)
        elif isinstance(obj, torch.optim.Optimizer):
            # (its param_groups hold DeepSpeed's master partitions, found under their own names, or at
            # stage 0 the module's parameters)
            visit(obj.state, f"{path}.state", depth + 1)
        elif type(obj).__module__.startswith("deepspeed") and hasattr(obj, "__dict__"):
            for k, v in list(vars(obj).items()):
                if k not in ("module", "_modules", "param_names", "client_model"):
                    visit(v, f"{path}.{k}", depth + 1)

    for i, p in enumerate(params):
        visit(p, f"param[{i}]", 0)
    visit(engine.optimizer, "opt", 0)
    return out


def _category(path: str) -> str | None:
    """The category of an attribute path of :func:`_held` (its last named attribute decides)."""
    import re

    names = [n for n in re.split(r"[.\[\]]+", path) if n and not n.isdigit() and n != "*"]
    for name in reversed(names):
        name = name.rsplit("__", 1)[-1] if name.startswith("_") and "__" in name[1:] else name
        for cat, attrs in HELD_AS.items():
            if name in attrs or name.lstrip("_") in attrs:
                return cat
    return None


def _run_rank(case: DSCase, rank: int, world: int) -> tuple[dict[str, int], dict[str, Any]]:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    deepspeed = _deepspeed()
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.models.llama import modeling_llama  # noqa: F401 - resolved before zero.Init

    deepspeed.init_distributed("gloo")     # the group ranks.spawn made: DeepSpeed's comm wraps it
    ds_config = case.ds_config()
    cfg = case.hf_config()
    torch.manual_seed(0)
    if case.zero == 3:
        # the dtype comes from the config (bf16.enabled): given dtype= as well, partition_parameters.py
        # _set_dtype ignores it and, on the CPU accelerator, picks bf16 whatever the config says
        with deepspeed.zero.Init(config_dict_or_path=ds_config):
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation=case.attn)
    else:
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=case.attn)
    if case.gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    client = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=client, config=ds_config)
    gen = torch.Generator().manual_seed(7 + rank)
    ids = torch.randint(0, case.vocab, (case.b, case.s), generator=gen)
    params = list(engine.module.parameters())

    held: dict[int, str] = {}    # serial -> what holds it when first seen held (forward, backward ends)

    def hold(trace: StepSamples) -> None:
        for path, st in _held(engine, params).values():
            serial = trace._alive_serial(st)
            if serial is not None:
                held.setdefault(serial, path)

    def train_step(trace: StepSamples | None) -> None:
        loss = engine(input_ids=ids, labels=ids).loss
        if trace is not None:
            trace.mark("forward")
            hold(trace)
        engine.backward(loss)
        del loss
        if trace is not None:
            trace.mark("backward")
            hold(trace)
        engine.step()
        if trace is not None:
            trace.mark("step")

    train_step(None)                       # warm-up: the optimizer's states exist
    gc.collect()
    before = _held(engine, params)         # what DeepSpeed holds between steps: not traced
    static = [st for _, st in before.values()] + [ids.untyped_storage()]
    static += [buf.untyped_storage() for buf in engine.module.buffers()]
    trace = _Samples(ignore=static)
    undo = _wrap_phases(trace, engine)
    _TRACING.append(trace)
    try:
        with trace.mode:
            train_step(trace)
    finally:
        _TRACING.remove(trace)
        for obj, name in undo:
            delattr(obj, name)
    gc.collect()

    # ---- categories -------------------------------------------------------------------------------
    # what DeepSpeed holds between steps, by the attribute holding it (ZeRO-3: see _static_category)
    static_cat: dict[str, int] = {"params": 0, "grads": 0, "optimizer": 0, "comm": 0, "zero3": 0, "other": 0}
    static_paths: dict[str, list] = {}
    for path, st in before.values():
        cat = _static_category(path, case.zero)
        static_cat[cat] += st.nbytes()
        static_paths.setdefault(cat, []).append((path, st.nbytes()))
    # a storage the step creates: what holds it at the end of forward or backward (a parameter's: ZeRO-3's
    # gathered copy), else the DeepSpeed method that made it (PHASES, BACKEND_CALLS), else a collective's
    # output; the rest is the activation side
    traced_cat = {serial: _category(path) or "other" for serial, path in held.items()}
    traced_cat = {s: ("gathered" if c == "params" else c) for s, c in traced_cat.items()}
    for serial, tag in trace.tags.items():
        traced_cat.setdefault(serial, tag)
    collective = lambda s: any(k in trace.op_of.get(s, "") for k in COLLECTIVES)  # noqa: E731
    is_comm = lambda s: traced_cat.get(s) == "comm" or (s not in traced_cat and collective(s))  # noqa: E731
    is_gathered = lambda s: traced_cat.get(s) == "gathered"  # noqa: E731
    is_backend = lambda s: traced_cat.get(s) == "backend"  # noqa: E731
    is_grad = lambda s: traced_cat.get(s) == "grads"  # noqa: E731
    act = lambda s: s not in traced_cat and not collective(s)  # noqa: E731
    fwd, bwd, stp = trace.marks["forward"], trace.marks["backward"], trace.marks["step"]
    peak, at = _peak(trace, act, 0, bwd + 1)
    step_peak, step_at = _peak(trace, act, bwd + 1, stp + 1)
    comm_peak, comm_at = _peak(trace, is_comm, 0, bwd + 1)
    gathered_peak, gathered_at = _peak(trace, is_gathered, 0, bwd + 1)
    measured = {
        "params": static_cat["params"],
        "grads": static_cat["grads"] + trace.at(bwd, is_grad),
        "optimizer": static_cat["optimizer"],
        "activations": trace.at(fwd, act),
        "activations_peak": peak,
        "comm": static_cat["comm"] + comm_peak,
    }
    if case.zero == 3:
        # ZeRO-3's parameter working set: the tensors kept gathered below the persistence threshold, the
        # IPG bucket and, at their peak over forward and backward, the gathered (fetched) parameters --
        # memform's runtime blocks zero3_persistent, zero3_fetch and zero3_cache
        measured["zero3"] = static_cat["zero3"] + gathered_peak
    notes = {
        "rank": rank, "optimizer_class": type(engine.optimizer).__name__,
        "peak_by_op": trace.by_op(at, act, 12), "forward_by_op": trace.by_op(fwd, act, 12),
        "step_peak": step_peak, "step_by_op": trace.by_op(step_at, act, 8),
        "comm_by_op": trace.by_op(comm_at, is_comm, 8), "static_comm": static_cat["comm"],
        "gathered_peak": gathered_peak, "gathered_by_op": trace.by_op(gathered_at, is_gathered, 8),
        "zero3_static": static_cat["zero3"], "backend_peak": _peak(trace, is_backend, 0, stp + 1)[0],
        "static_paths": {k: sorted(v, key=lambda x: -x[1])[:4] for k, v in static_paths.items()},
    }
    if os.environ.get("MEMFORM_DS_DEBUG"):   # every traced storage of at least that many bytes, with its life
        life: dict[int, list] = {}
        for i, sample in enumerate(trace.samples):
            for serial, n in sample:
                rec = life.setdefault(serial, [trace.op_of.get(serial), n, i, i, traced_cat.get(serial)])
                rec[1], rec[3] = max(rec[1], n), i
        least = int(os.environ["MEMFORM_DS_DEBUG"])
        notes["debug"] = {"marks": trace.marks, "n": len(trace.samples),
                          "big": sorted(([k, *v] for k, v in life.items() if v[1] >= least), key=lambda r: r[3])}
    # the reserve: the traced step replayed through memform's allocator model, DeepSpeed's own tensors first
    # and the optimizer's after the first step (one stream: DeepSpeed's side streams are not told apart)
    opt_states = [st for path, st in before.values() if _category(path) == "optimizer"]
    others = [st for path, st in before.values() if _category(path) != "optimizer"]
    measured.update(replayed_figures(replay_reserved(trace, [*others, ids], opt_states)))
    engine.destroy()
    return measured, notes


def _peak(trace, keep, start: int, end: int) -> tuple[int, int]:  # noqa: ANN001
    """The largest sum of the live storages ``keep`` accepts over samples [start, end), and where."""
    best, where = 0, -1
    for i in range(start, min(end, len(trace.samples))):
        total = trace.at(i, keep)
        if total > best:
            best, where = total, i
    return best, where


def _static_category(path: str, stage: int) -> str:
    """The category of a tensor DeepSpeed holds between steps (:func:`_category`); at ZeRO-3 a parameter's
    whole tensor (one kept gathered below stage3_param_persistence_threshold) and the IPG bucket allocated
    once are the parameter working set ("zero3": memform's zero3_persistent runtime block), its partitions
    (``ds_tensor``, the flat 16-bit partition buffer) the params."""
    cat = _category(path) or "other"
    if stage == 3 and cat == "comm":
        return "zero3"
    if stage == 3 and cat == "params" and not path.endswith(".ds_tensor") and "partitioned" not in path \
            and "lp_param_buffer" not in path:
        return "zero3"
    return cat


# ---- the cases -------------------------------------------------------------------------------------
BASE = DSCase()


def sweep() -> list[DSCase]:
    """Every DeepSpeed case of ``bench/validate.py --frameworks``: ZeRO 0-3 in fp32 and bf16; ZeRO-3 also
    with the HF Trainer's "auto" persistence threshold (10 × hidden: the decoder's matrices are fetched) and
    with gradient checkpointing; ZeRO-2 with overlap_comm and with eager attention. 2 ranks, both shown."""
    cases: list[DSCase] = []
    for stage in (0, 1, 2, 3):
        for bf16 in (False, True):
            cases += replace(BASE, zero=stage, bf16=bf16).ranks()
    z3 = replace(BASE, zero=3, persist=10 * BASE.h)
    cases += z3.ranks() + replace(z3, bf16=True).ranks() + replace(z3, gc=True).ranks()
    cases += replace(BASE, zero=2, overlap=True).ranks() + replace(BASE, zero=2, attn="eager", bf16=True).ranks()
    return cases


def quick_sweep() -> list[DSCase]:
    """The tests' subset: ZeRO-2 and ZeRO-3 (the HF Trainer's persistence threshold) in fp32, both ranks."""
    return replace(BASE, zero=2).ranks() + replace(BASE, zero=3, persist=10 * BASE.h).ranks()
