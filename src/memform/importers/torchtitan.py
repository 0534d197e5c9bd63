"""torchtitan job config (``train_configs/*.toml``) → a memform config for the ``fsdp2`` profile.

torchtitan (pytorch/torchtitan) trains with FSDP2 (``fully_shard``), tensor, pipeline and context
parallelism configured in one TOML file: ``[model]`` names a model and a flavor (its hyper-parameters
live in torchtitan's source, copied below), ``[training]`` the batch, sequence length and mixed
precision, ``[parallelism]`` the degrees (older releases: ``[training]`` / ``[experimental]``), and
``[activation_checkpoint]`` the recompute mode. Field names and defaults follow
``torchtitan/config/job_config.py`` (JobConfig); the FSDP settings follow
``torchtitan/models/llama3/parallelize.py`` (``apply_fsdp``) and the activation checkpointing
``torchtitan/distributed/activation_checkpoint.py``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import MemformError, did_you_mean, read_text
from .draft import Draft, Fields, describe, dtype_name, gated_ffn_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

TITLE = "torchtitan job config"


@dataclass(frozen=True)
class Flavor:
    """A torchtitan model flavor: the hyper-parameters its model registry sets."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int | None
    ffn_dim_multiplier: float | None
    multiple_of: int
    vocab_size: int


#: torchtitan/models/llama3/__init__.py ``llama3_configs`` (older releases: models/llama/__init__.py);
#: the FFN width is compute_ffn_hidden_dim(dim, multiple_of, ffn_dim_multiplier) = Llama's 8h/3 rule;
#: vocab_size 128256 (Llama 3 tokenizer, TransformerModelArgs / Llama3Model.Config default), 2048 for
#: the debug model
FLAVORS: dict[str, dict[str, Flavor]] = {
    "llama3": {
        "debugmodel": Flavor(256, 6, 16, None, None, 256, 2048),
        "8B": Flavor(4096, 32, 32, 8, 1.3, 1024, 128256),
        "70B": Flavor(8192, 80, 64, 8, 1.3, 4096, 128256),
        "405B": Flavor(16384, 126, 128, 8, 1.2, 4096, 128256),
    },
}
#: torch.distributed.pipelining schedule names → memform schedules (schedules.mf)
SCHEDULES = {"1F1B": "1f1b", "GPipe": "gpipe", "Interleaved1F1B": "interleaved",
             "ZBVZeroBubble": "zero-bubble-v", "DualPipeV": "dualpipev"}
#: schedules that place several stages on each rank (torchtitan: "looped" schedules)
MULTI_STAGE = frozenset({"Interleaved1F1B", "ZBVZeroBubble", "DualPipeV", "InterleavedZeroBubble",
                         "LoopedBFS"})
#: sections that do not change training memory
IGNORED_SECTIONS = frozenset({"job", "profiling", "metrics", "optimizer", "lr_scheduler", "checkpoint",
                              "comm", "memory_estimation", "fault_tolerance", "validation", "experimental",
                              "float8", "mx", "compile", "quantize", "dataloader"})
#: fields that do not change training memory (data, logging, seeds, norms of the update)
IGNORED_FIELDS = {
    "model": {"tokenizer_path", "hf_assets_path", "print_after_conversion", "converters", "norm_type"},
    "training": {"dataset", "dataset_path", "max_norm", "steps", "gc_freq", "gc_debug", "seed",
                 "deterministic", "warmup_steps", "compile"},
    "parallelism": {"enable_compiled_autograd", "disable_loss_parallel", "enable_async_tensor_parallel",
                    "pipeline_parallel_split_points", "pipeline_parallel_schedule_csv",
                    "pipeline_parallel_layers_per_stage", "context_parallel_rotate_method",
                    "expert_parallel_degree", "pipeline_parallel_microbatches"},
    "activation_checkpoint": {"per_op_sac_force_recompute_mm_shapes_by_fqns", "preserve_rng_state",
                              "determinism_check", "early_stop", "debug"},
}
#: fields older torchtitan releases kept in [training] or [experimental] before [parallelism] existed
DEGREES = ("data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
           "pipeline_parallel_degree", "context_parallel_degree", "fsdp_reshard_after_forward",
           "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size", "pipeline_parallel_microbatches",
           "pipeline_parallel_layers_per_stage", "context_parallel_rotate_method", "expert_parallel_degree",
           "enable_async_tensor_parallel", "disable_loss_parallel", "pipeline_parallel_split_points")


def read_toml(path: Path) -> dict[str, Any]:
    text = read_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MemformError(f"{path}: TOML syntax error: {exc}") from None
    return data


class _Sections:
    """The job config's sections; a field is looked up in [parallelism], then the older places."""

    def __init__(self, data: dict[str, Any], path: Path):
        self.top = Fields(data, path)
        for name in data:
            if not isinstance(data[name], dict):
                raise self.top.error(name, f"must be a [section] table, got {describe(data[name])}")
        self.model = self.top.section("model")
        self.training = self.top.section("training")
        self.parallelism = self.top.section("parallelism")
        self.experimental = self.top.section("experimental")
        self.ac = self.top.section("activation_checkpoint")

    def where(self, key: str) -> Fields:
        """The section that holds ``key`` ([parallelism] first, as current torchtitan has it)."""
        for sec in (self.parallelism, self.training, self.experimental):
            if sec.has(key):
                return sec
        return self.parallelism


def _flavor(s: _Sections) -> tuple[str, str, Flavor]:
    name = s.model.string("name", "llama3")
    flavor = s.model.string("flavor", "debugmodel")
    if name not in FLAVORS:
        raise s.model.error("name", f"is {name!r}: memform knows torchtitan's {', '.join(sorted(FLAVORS))} "
                                    f"flavors{did_you_mean(name, FLAVORS)}")
    if flavor not in FLAVORS[name]:
        raise s.model.error("flavor", f"is {flavor!r}: torchtitan's {name} flavors are "
                                      f"{', '.join(FLAVORS[name])}{did_you_mean(flavor, FLAVORS[name])}")
    return name, flavor, FLAVORS[name][flavor]


def convert(path: Path, draft: Draft, given: set[str]) -> int | None:
    """Fill ``draft`` from the job config at ``path``; there is no device count in it (None)."""
    s = _Sections(read_toml(path), path)
    name, flavor_name, fl = _flavor(s)
    draft.header.append(f"torchtitan model {name} flavor {flavor_name} (torchtitan/models/{name}/__init__.py)")
    draft.set("training.framework", "fsdp2", "torchtitan shards with FSDP2 (fully_shard, parallelize.py apply_fsdp)")
    src = f"{name} {flavor_name}"
    draft.set("model.hidden_size", fl.dim, f"{src}: dim")
    draft.set("model.num_heads", fl.n_heads, f"{src}: n_heads")
    draft.set("model.num_kv_heads", fl.n_kv_heads or fl.n_heads, f"{src}: n_kv_heads" if fl.n_kv_heads
              else f"{src}: no n_kv_heads, multi-head attention")
    draft.set("model.num_layers", fl.n_layers, f"{src}: n_layers")
    draft.set("model.ffn_hidden_size", gated_ffn_size(fl.dim, fl.multiple_of, fl.ffn_dim_multiplier),
              f"{src}: FeedForward hidden_dim from multiple_of {fl.multiple_of}, ffn_dim_multiplier "
              f"{fl.ffn_dim_multiplier}")
    draft.set("model.vocab_size", fl.vocab_size, f"{src}: vocab_size")
    # Llama3 blocks (models/llama3/model.py): RMSNorm, SwiGLU as w2(silu(w1(x)) * w3(x)) in eager PyTorch,
    # rotary positions, no biases or dropout, untied output head, SDPA (flash/cuDNN/efficient kernels),
    # and the loss F.cross_entropy over logits upcast to fp32 (components/loss.py cross_entropy_loss)
    for key, value, note in (("activation", "swiglu", "Llama3 FeedForward w1/w3/w2"),
                             ("swiglu_impl", "eager", "F.silu(w1(x)) * w3(x): eager PyTorch"),
                             ("norm", "rmsnorm", "RMSNorm"), ("bias", False, "Linear(bias=False)"),
                             ("dropout", False, "no dropout"), ("position_embedding", "rope", "RoPE"),
                             ("tied_embeddings", False, "separate output Linear"),
                             ("flash_attention", True, "scaled_dot_product_attention (fused kernels)"),
                             ("cross_entropy", "eager", "F.cross_entropy on fp32 logits")):
        draft.set(f"model.{key}", value, f"torchtitan {name}: {note}")
    seq = s.training.integer("seq_len", 2048)
    draft.set("model.seq_length", seq, "[training] seq_len" if s.training.has("seq_len")
              else "torchtitan's default seq_len 2048")
    pp = _parallel(s, draft, fl)
    _batch(s, draft, pp)
    _precision(s, draft)
    _recompute(s, draft, fl.n_layers, pp, draft.get("parallel.vpp", 1))
    _warnings(s, draft)
    return None


def _degree(s: _Sections, key: str, default: int, *, minimum: int = 1) -> tuple[int, str]:
    sec = s.where(key)
    value = sec.integer(key, default, minimum=minimum)
    return value, (f"[{sec.where.rstrip('.')}] {key}" if sec.has(key) else f"torchtitan's default {key} {default}")


def _parallel(s: _Sections, draft: Draft, fl: Flavor) -> int:
    """The degrees, HSDP, the pipeline schedule and the reshard policy; returns the pipeline degree."""
    tp, tp_note = _degree(s, "tensor_parallel_degree", 1)
    pp, pp_note = _degree(s, "pipeline_parallel_degree", 1)
    cp, cp_note = _degree(s, "context_parallel_degree", 1)
    replicate, _ = _degree(s, "data_parallel_replicate_degree", 1)
    shard_sec = s.where("data_parallel_shard_degree")
    shard = shard_sec.integer("data_parallel_shard_degree", -1, minimum=-1)
    if shard == 0:
        raise shard_sec.error("data_parallel_shard_degree", "must be -1 (the leftover ranks) or a positive integer, got 0")
    draft.set("parallel.tp", tp, tp_note)
    draft.set("parallel.pp", pp, pp_note)
    if cp > 1:
        draft.set("parallel.cp", cp, cp_note)
        rotate = s.where("context_parallel_rotate_method").string("context_parallel_rotate_method", "allgather")
        # torch's context parallel SDPA: all-gather the K/V shards, or pass them round ("alltoall")
        draft.set("parallel.cp_algo", "allgather" if rotate == "allgather" else "ring",
                  f"context_parallel_rotate_method {rotate}")
    # torchtitan applies sequence parallelism with every TP plan (parallelize.py apply_tp)
    draft.set("parallel.sequence_parallel", tp > 1, "torchtitan's TP plan is sequence-parallel" if tp > 1
              else "no tensor parallelism")
    if shard > 0:
        draft.set("parallel.dp", replicate * shard, "data_parallel_replicate_degree × data_parallel_shard_degree")
        if replicate > 1:
            # HSDP (apply_fsdp on the ["dp_replicate", "fsdp"] mesh): shard over dp_shard × cp ranks
            draft.set("parallel.zero_shard_max", shard * cp, "HSDP: FSDP shards over data_parallel_shard_degree "
                      "× context_parallel_degree ranks, replicated data_parallel_replicate_degree times")
    if shard == 1 and cp == 1:
        draft.warn("data_parallel_shard_degree 1 and no context parallelism: torchtitan applies no FSDP "
                   "(DDP or one device, mixed precision by torch.autocast); estimated as fully_shard over 1 rank")
    _reshard(s, draft, pp)
    schedule = s.where("pipeline_parallel_schedule").string("pipeline_parallel_schedule", "1F1B")
    if pp > 1:
        if schedule not in SCHEDULES:
            fallback = "interleaved" if schedule in MULTI_STAGE else "1f1b"
            draft.warn(f"pipeline_parallel_schedule {schedule} is not modelled; estimated as {fallback}")
        draft.set("parallel.pp_schedule", SCHEDULES.get(schedule, "interleaved" if schedule in MULTI_STAGE
                                                        else "1f1b"), f"pipeline_parallel_schedule {schedule}")
        if schedule in MULTI_STAGE:
            per_stage = s.where("pipeline_parallel_layers_per_stage").integer("pipeline_parallel_layers_per_stage", None)
            if per_stage is None:
                vpp = 2
                draft.default("parallel.vpp", vpp, "a looped schedule without pipeline_parallel_layers_per_stage: "
                              "2 stages per rank assumed")
            else:
                stages = -(-fl.n_layers // per_stage)
                if stages % pp:
                    raise MemformError(f"{s.top.file}: {stages} pipeline stages ({fl.n_layers} layers / "
                                       f"pipeline_parallel_layers_per_stage {per_stage}) do not split over "
                                       f"pipeline_parallel_degree {pp} ranks")
                draft.set("parallel.vpp", stages // pp, f"{fl.n_layers} layers / {per_stage} per stage / pp {pp}")
    return pp


def _reshard(s: _Sections, draft: Draft, pp: int) -> None:
    sec = s.where("fsdp_reshard_after_forward")
    policy = sec.string("fsdp_reshard_after_forward", "default")
    # apply_fsdp: "always" → True, "never" → False, "default" → not pp_enabled; the [norm, output] unit
    # reshards only with "always"
    if policy not in ("default", "always", "never"):
        raise sec.error("fsdp_reshard_after_forward", f"must be default, always or never, got {policy!r}")
    raf = {"always": True, "never": False}.get(policy, pp == 1)
    note = f"fsdp_reshard_after_forward {policy}" + (" (no pipeline parallelism)" if policy == "default" and pp == 1
                                                   else " with pipeline parallelism" if policy == "default" else "")
    draft.set("fsdp2.reshard_after_forward", raf, note)
    draft.set("fsdp2.reshard_head_after_forward", policy == "always",
              f"apply_fsdp: [norm, output] reshard_after_forward = (policy == always), policy {policy}")


def _batch(s: _Sections, draft: Draft, pp: int) -> None:
    key, local = s.training.first(("local_batch_size", "batch_size"), s.training.integer)
    if local is None:
        key, local = "local_batch_size", 8
    note = f"[training] {key}" if s.training.has(key) else "torchtitan's default local_batch_size 8"
    gbs = s.training.integer("global_batch_size", -1, minimum=-1)
    if pp > 1:
        mb_sec = s.where("pipeline_parallel_microbatch_size")
        micro = mb_sec.integer("pipeline_parallel_microbatch_size", 1)
        if local % micro:
            raise mb_sec.error("pipeline_parallel_microbatch_size", f"{micro} must divide the local batch size {local}")
        draft.set("training.micro_batch_size", micro, "pipeline_parallel_microbatch_size")
        per_step = local // micro
        how = f"{note} {local} / pipeline_parallel_microbatch_size {micro}"
    else:
        draft.set("training.micro_batch_size", local, note)
        per_step = 1
        how = "one forward/backward per step"
    if gbs > 0:
        # gradient accumulation: global / (local × dp) steps of local batches (train.py forward_backward_step)
        # (× local / micro-batch pipeline micro-batches each): memform's m = global / (micro-batch × dp)
        draft.set("training.global_batch_size", gbs, "[training] global_batch_size")
    else:
        draft.set("training.num_micro_batches", per_step, how)


def _precision(s: _Sections, draft: Draft) -> None:
    param = dtype_name(s.training.string("mixed_precision_param", "bfloat16"), s.training, "mixed_precision_param")
    reduce = dtype_name(s.training.string("mixed_precision_reduce", "float32"), s.training, "mixed_precision_reduce")
    p_note = "[training] mixed_precision_param" if s.training.has("mixed_precision_param") else \
        "torchtitan's default mixed_precision_param bfloat16"
    draft.set("training.precision.params", param, p_note)
    draft.set("training.precision.activations", param, f"{p_note}: forward/backward compute dtype")
    draft.set("fsdp2.param_dtype", param, p_note)
    draft.set("fsdp2.reduce_dtype", reduce, "[training] mixed_precision_reduce" if s.training.has(
        "mixed_precision_reduce") else "torchtitan's default mixed_precision_reduce float32")
    # torchtitan builds the model in fp32: the sharded parameters and AdamW's states are fp32
    draft.set("training.precision.master_weights", True, "torchtitan's model is fp32; FSDP2's sharded fp32 "
              "parameters are what the optimizer steps")
    offload = s.training.boolean("enable_cpu_offload", False)
    if offload:
        draft.set("fsdp2.cpu_offload", True, "[training] enable_cpu_offload (CPUOffloadPolicy)")


def _recompute(s: _Sections, draft: Draft, layers: int, pp: int, vpp: int) -> None:
    mode = s.ac.string("mode", "selective")
    if mode in ("none", "full"):
        draft.set("training.recompute", mode, f"[activation_checkpoint] mode {mode}")
        return
    if mode != "selective":
        raise s.ac.error("mode", f"must be none, selective or full, got {mode!r} (memory_budget needs "
                                 f"torch.compile's partitioner, which memform does not model)")
    option = str(s.ac.raw("selective_ac_option", "2"))
    if option == "op":
        draft.set("training.recompute", "selective", "[activation_checkpoint] selective, selective_ac_option op")
        draft.set("fsdp2.selective_ac", "op", "op-level SAC (activation_checkpoint.py _apply_op_sac)")
        return
    if not option.isdigit() or int(option) < 0:
        raise s.ac.error("selective_ac_option", f"must be 'op' or a positive integer, got {option!r}")
    every = int(option)
    # _apply_layer_sac: a process-wide counter over the blocks it wraps, from 1; block k is checkpointed
    # when k % every == 0 (every 0: all of them). Each pipeline rank counts its own blocks, chunk after chunk.
    chunk = layers // (pp * vpp) if layers % (pp * vpp) == 0 else None
    if chunk is None:
        draft.warn(f"{layers} layers do not split evenly over pp × vpp = {pp * vpp} chunks: every-{every} "
                   f"layer checkpointing counted over the whole model")
    modes = []
    for i in range(layers):
        if chunk is None:
            count = i + 1
        else:
            piece, j = divmod(i, chunk)
            count = (piece // pp) * chunk + j + 1
        modes.append("full" if every == 0 or count % every == 0 else "none")
    draft.set("training.recompute", "none", "the blocks without a checkpoint keep everything")
    draft.set("training.recompute_layers", modes, f"selective_ac_option {every}: every {every}"
              f"{'th' if every != 1 else ''} block checkpointed in full")


def _warnings(s: _Sections, draft: Draft) -> None:
    if s.top.has("compile") and s.top.section("compile").boolean("enable", False) or \
            s.training.boolean("compile", False):
        draft.warn("torch.compile is enabled: its fusions keep fewer activations than the eager model "
                   "memform counts")
    converters = s.model.raw("converters", [])
    if s.top.has("float8") and s.top.section("float8").boolean("enable_float8_linear", False):
        converters = converters or "float8"
    if converters:
        draft.warn(f"model converters {converters!r} (float8 / mx) are not modelled: bf16 sizes used")
    ep = s.where("expert_parallel_degree").integer("expert_parallel_degree", 1)
    if ep > 1:
        draft.warn("expert_parallel_degree > 1 has no effect on a dense llama3 model (ignored)")
    s.top.used.update(IGNORED_SECTIONS | {"model", "training", "parallelism", "activation_checkpoint"})
    draft.warn_unused(s.top)
    for sec, name in ((s.model, "model"), (s.training, "training"), (s.parallelism, "parallelism"),
                      (s.ac, "activation_checkpoint")):
        ignored = IGNORED_FIELDS.get(name, set()) | (set(DEGREES) if name == "training" else set())
        draft.warn_unused(sec, ignored)


def finish(draft: Draft) -> None:
    """After the shared strategy step (dp from ``--devices``): the HSDP shard group of ``-1`` shard degrees."""
    s = _Sections(read_toml(draft.source), draft.source)
    replicate = s.where("data_parallel_replicate_degree").integer("data_parallel_replicate_degree", 1)
    shard = s.where("data_parallel_shard_degree").integer("data_parallel_shard_degree", -1, minimum=-1)
    if replicate == 1 or shard > 0 or "parallel.zero_shard_max" in draft:
        return
    dp = draft.get("parallel.dp", 1)
    if dp % replicate:
        raise MemformError(f"{draft.source}: data_parallel_replicate_degree {replicate} does not divide the data-"
                           f"parallel ranks ({dp}); pass --devices N (the world size) for "
                           f"data_parallel_shard_degree -1")
    cp = draft.get("parallel.cp", 1)
    draft.set("parallel.zero_shard_max", dp // replicate * cp, f"HSDP: data_parallel_shard_degree -1 = dp {dp} / "
              f"data_parallel_replicate_degree {replicate}, × cp {cp}")
