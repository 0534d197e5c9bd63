"""DeepSpeed ``ds_config.json`` (+ a model) → a memform config with ``training.framework: deepspeed``.

A ds_config.json says how a model is trained (ZeRO stage, buckets, offload, precision, batch), not
what the model is: ``--model`` names a memform model YAML or a Hugging Face ``config.json`` (read by
the ``hf`` importer), and the ds_config's values are written on top of it. Keys and defaults follow
DeepSpeed's own config classes: ``deepspeed/runtime/config.py`` (DeepSpeedConfig: batch sizes, fp16 /
bf16, gradient clipping, data_types) and ``deepspeed/runtime/zero/config.py`` (DeepSpeedZeroConfig).
``"auto"`` is what the Hugging Face Trainer fills in from its TrainingArguments
(``transformers/integrations/deepspeed.py``, HfTrainerDeepSpeedConfig): the bucket sizes it derives
from the model's hidden size are derived the same way here; batch sizes and precision it takes from
the command line, which memform cannot see, so they are left at commented defaults with a warning.
Only the model (``model.*``) comes from ``--model``: the parallelism, recompute and batch are the
ds_config's (a memform YAML's ``model.seq_length`` is kept as a marked default; a config.json's follows the
``hf`` importer's training-length default). The batch follows DeepSpeed's triangle (runtime/config.py
``_set_batch_related_parameters``) once the device count is known (:func:`finish`).

Every key is read, listed as memory-neutral with its reason (:data:`NEUTRAL` and the tables beside it), or
refused: features the deepspeed profile does not model stop the import with the file, the key and why
(:data:`REFUSED`, :data:`ZERO_REFUSED`, AutoTP, non-Adam optimizers); keys memform does not know
(``Draft.refuse_unused``) and switches it cannot vouch for (``torch_autocast.enabled``) stop it unless
``--accept`` names them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..errors import MemformError
from .draft import Draft, Fields, default_name, describe, dtype_name, read_json
from ..engine.values import dotted
from .modelfile import read_model_file

TITLE = "DeepSpeed config"
#: ``memform import deepspeed`` reads a model file too (``--model``)
TAKES_MODEL = True

#: top-level keys that cannot change device memory, each with the reason (DeepSpeedConfig,
#: deepspeed/runtime/config.py and constants.py; the monitors: deepspeed/monitor/config.py)
NEUTRAL = {
    "steps_per_print": "logging interval",
    "wall_clock_breakdown": "timers (logging)",
    "memory_breakdown": "logs see_memory_usage (allocates nothing)",
    "dump_state": "prints the config at start-up",
    "scheduler": "the learning-rate schedule: a scalar per step",
    "gradient_clipping": "the global norm is taken in place on the gradient partitions (clip_grad_norm_)",
    "prescale_gradients": "scales gradients in place before the all-reduce",
    "gradient_predivide_factor": "a scalar divisor of the gradients, applied in place",
    "gradient_allreduce_op": "mean or sum of the same buffers",
    "zero_allow_untested_optimizer": "a permission flag (engine.py _configure_zero_optimizer)",
    "zero_force_ds_cpu_optimizer": "which class steps the offloaded states (the same states)",
    "tensorboard": "monitor (host-side logging)", "wandb": "monitor (host-side logging)",
    "csv_monitor": "monitor (host-side logging)", "comet": "monitor (host-side logging)",
    "monitor_config": "monitor (host-side logging)", "comms_logger": "communication logging",
    "flops_profiler": "a profiler hook at one step (counts, allocates no tensors that persist)",
    "checkpoint": "checkpoint saving / loading options (tag validation, parallel write)",
    "load_universal_checkpoint": "checkpoint loading", "use_node_local_storage": "checkpoint storage",
    "nebula": "asynchronous checkpoint service (host side)",
    "aio": "NVMe async I/O settings: host-side swap buffers",
    "autotuning": "the autotuner's search settings, not the job's",
    "seed": "random seed", "timers": "timers (logging)", "log_level": "logging",
    "disable_python_gc": "Python garbage collection timing (host)",
    "dataloader_drop_last": "the data loader drops a short last batch",
    "vocabulary_size": "only checked for tensor-core alignment (a warning, runtime/config.py _do_warning_check)",
    "curriculum_learning": "schedules the sequence length up to the full length; the peak is the full-length step "
                           "memform estimates",
    "data_efficiency": "data sampling / routing schedules; the peak is the full-length step memform estimates",
    "progressive_layer_drop": "skips layers stochastically; the peak is the full model memform estimates",
    "elasticity": "enabled: false only (checked below)",
    "use_data_before_expert_parallelism": "the order of process groups",
    "data_parallel_group": "a process group handle", "global_rank": "a rank number",
}
#: zero_optimization keys that cannot change device memory (DeepSpeedZeroConfig, runtime/zero/config.py)
ZERO_NEUTRAL = {
    "reduce_scatter": "reduce-scatter or all-reduce of the same IPG bucket (average_tensor)",
    "allgather_partitions": "all-gather or broadcast of the updated partitions, in place",
    "use_multi_rank_bucket_allreduce": "how the bucket's all-reduce is issued",
    "load_from_fp32_weights": "checkpoint loading", "elastic_checkpoint": "checkpoint format",
    "ignore_unused_parameters": "a check for parameters without gradients",
    "round_robin_gradients": "which rank reduces which gradients (same partition sizes)",
    "legacy_stage1": "the older stage-1 code path (same partitions)",
    "stage3_gather_16bit_weights_on_model_save": "at checkpoint save only",
    "stage3_gather_fp16_weights_on_model_save": "at checkpoint save only",
    "gather_16bit_weights_on_model_save": "at checkpoint save only",
    "override_module_apply": "module.apply under ZeRO-3 gathers as needed (initialisation only)",
    "cpu_offload_use_pin_memory": "pinned or pageable host memory",
    "compute_grad_norm": "a scalar norm",
    "parameter_alignment": "partition padding (a few elements)",
    "pipeline_loading_checkpoint": "checkpoint loading", "log_trace_cache_warnings": "logging",
    "enable_sanity_checks": "debug checks", "save_muon_momentum_buffer_in_memory": "Muon only (refused below)",
}
#: zero_optimization keys neutral at their DeepSpeed default only; other values change what ZeRO allocates
ZERO_DEFAULTS = {
    "memory_efficient_linear": (True, "False saves F.linear's inputs the ordinary way under ZeRO-3 "
                                      "(LinearFunctionForZeroStage3 not used)"),
    "stage3_module_granularity_threshold": (0, "leaf modules fetched whole change ZeRO-3's working set"),
    "module_granularity_threshold": (0, "leaf modules fetched whole change ZeRO-3's working set"),
    "stage3_use_all_reduce_for_fetch_params": (False, "fetching parameters by all-reduce allocates full buffers"),
    "use_all_reduce_for_fetch_params": (False, "fetching parameters by all-reduce allocates full buffers"),
    "stage3_allgather_sequential": (False, "sequential all-gathers change the fetch buffers"),
    "allgather_sequential": (False, "sequential all-gathers change the fetch buffers"),
}
#: ZeRO features memform's deepspeed profile does not model: set (not at the listed neutral value), they
#: stop the import with the reason (zero/config.py fields; the papers / code named)
ZERO_REFUSED = {
    "zero_hpz_partition_size": (1, "ZeRO++ hpZ keeps a secondary partition of the 16-bit weights per node "
                                   "(zero/partition_parameters.py ds_secondary_tensor)"),
    "zero_quantized_weights": (False, "ZeRO++ qwZ all-gathers int8 weights through quantisation buffers"),
    "zero_quantized_nontrainable_weights": (False, "ZeRO++ keeps frozen weights quantised"),
    "zero_quantized_gradients": (False, "ZeRO++ qgZ reduces int4 gradients through quantisation buffers"),
    "mics_shard_size": (-1, "MiCS shards over sub-groups and replicates across them (zero/mics.py)"),
    "mics_hierarchical_params_gather": (False, "MiCS hierarchical all-gather buffers (zero/mics.py)"),
    "zenflow": (None, "ZenFlow keeps important gradient columns on the device (runtime/zenflow)"),
    "stage3_model_persistence_threshold": (None, "a limit on persistent (unpartitioned) tensors"),
    "model_persistence_threshold": (None, "a limit on persistent (unpartitioned) tensors"),
    "leaf_module": (None, "ZeRO-3 leaf modules are fetched whole (zero/leaf_module_config.py)"),
    "offload_ratio": (None, "partial optimizer offload"),
}
#: offload_optimizer / offload_param keys (zero/offload_config.py) without device memory: host and NVMe
#: staging (pinned host buffers, swap pipelining), CPU Adam threads
OFFLOAD_NEUTRAL = {
    "pin_memory": "pinned or pageable host memory", "fast_init": "initialisation speed",
    "nvme_path": "where NVMe swap files live", "buffer_count": "host / NVMe swap buffers",
    "buffer_size": "host / NVMe swap buffers", "max_in_cpu": "host memory cap for NVMe swapping",
    "pipeline": "NVMe swap pipelining", "pipeline_read": "NVMe swap pipelining",
    "pipeline_write": "NVMe swap pipelining", "cpuadam_cores_perc": "CPU Adam threads",
}
#: fp16 / bf16 section keys without device memory (runtime/precision_config.py DeepSpeedFP16Config,
#: DeepSpeedBF16Config): loss scaling is a scalar; auto_cast casts the (integer) inputs
FP_NEUTRAL = {
    "loss_scale": "a scalar", "initial_scale_power": "a scalar", "loss_scale_window": "a scalar",
    "hysteresis": "a scalar", "consecutive_hysteresis": "a scalar", "min_loss_scale": "a scalar",
    "auto_cast": "casts the forward's floating inputs to fp16 (token ids are integers)",
    "check_grad_overflow": "an overflow check (a scalar)", "type": "the section's dtype name",
}
#: optimizer.params keys that are scalars (Adam's hyper-parameters, FusedAdam / DeepSpeedCPUAdam switches)
OPT_NEUTRAL = {
    "lr": "a scalar", "betas": "scalars", "eps": "a scalar", "weight_decay": "a scalar",
    "bias_correction": "a switch of the update rule", "adam_w_mode": "decoupled weight decay (update rule)",
    "torch_adam": "torch.optim.Adam instead of FusedAdam (the same two states)",
    "set_grad_none": "FusedAdam frees .grad after the step", "max_coeff": "LAMB trust-ratio clamp",
    "min_coeff": "LAMB trust-ratio clamp", "max_grad_norm": "a scalar", "capturable": "device-side step count",
    "foreach": "multi-tensor kernels of torch.optim", "fused": "torch.optim's fused kernel (same states)",
}
#: element counts of zero_optimization → memform keys (alias first: DeepSpeedZeroConfig field aliases)
COUNTS = (
    (("reduce_bucket_size",), "deepspeed.reduce_bucket_size"),
    (("allgather_bucket_size",), "deepspeed.allgather_bucket_size"),
    (("stage3_prefetch_bucket_size", "prefetch_bucket_size"), "deepspeed.stage3_prefetch_bucket_size"),
    (("stage3_max_live_parameters", "max_live_parameters"), "deepspeed.stage3_max_live_parameters"),
    (("stage3_max_reuse_distance", "max_reuse_distance"), "deepspeed.stage3_max_reuse_distance"),
    (("stage3_param_persistence_threshold", "param_persistence_threshold"),
     "deepspeed.stage3_param_persistence_threshold"),
    (("sub_group_size",), "deepspeed.sub_group_size"),
)
#: what the HF Trainer writes for these when they are "auto" (HfTrainerDeepSpeedConfig.trainer_config_finalize)
HF_AUTO = {
    "deepspeed.reduce_bucket_size": ("hidden_size²", lambda h: h * h),
    "deepspeed.stage3_prefetch_bucket_size": ("int(0.9 × hidden_size²)", lambda h: int(0.9 * h * h)),
    "deepspeed.stage3_param_persistence_threshold": ("10 × hidden_size", lambda h: 10 * h),
}
#: what the HF Trainer fills "auto" batch and precision keys from (TrainingArguments)
AUTO_FROM = {
    "train_micro_batch_size_per_gpu": "per_device_train_batch_size", "gradient_accumulation_steps":
    "gradient_accumulation_steps", "train_batch_size": "world size × per-device batch × accumulation",
    "fp16": "--fp16", "bf16": "--bf16",
}
#: optimizer.type values with Adam's two moments (runtime/config.py ADAM_OPTIMIZER .. ; ops/adam, ops/lamb:
#: exp_avg and exp_avg_sq per parameter); the 1-bit / 0/1 variants keep error-feedback buffers beside them
ADAM_LIKE = {"adam", "adamw", "fusedadam", "cpuadam", "deepspeedcpuadam", "lamb", "fusedlamb"}
#: top-level sections that change memory in ways the profile does not model: refused when enabled
REFUSED = {
    "sparse_attention": "block-sparse attention (ops/sparse_attention) changes the attention's activations",
    "compression_training": "quantisation / pruning of weights and activations (compression/)",
    "weight_quantization": "quantised weights", "quantize_training": "quantised weights (MoQ)",
    "hybrid_engine": "the RLHF hybrid engine keeps inference containers and a KV cache beside training",
    "amp": "NVIDIA Apex AMP (removed from DeepSpeed: runtime/config.py)",
    "eigenvalue": "Hessian eigenvalue estimation keeps extra gradient graphs",
    "compile": "DeepCompile passes (offload, prefetch scheduling) change ZeRO's allocations",
    "sparse_gradients": "sparse embedding gradients",
    "graph_harvesting": "CUDA graph capture keeps static buffers",
}


def convert(path: Path, draft: Draft, given, model: Path | None = None,  # noqa: ANN001
            trainer: Path | None = None) -> int | None:
    """Fill ``draft`` from the ds_config.json at ``path`` on top of ``model`` (memform YAML or config.json);
    ``trainer``: the Hugging Face Trainer's training arguments that run it (their "auto" values and step)."""
    _BATCH.pop(id(draft), None)   # what an earlier import that stopped half-way left under this id
    _CKPT.pop(id(draft), None)
    hinted = None
    if path.suffix.lower() in (".yaml", ".yml"):     # an accelerate config file (accelerate launch --config_file)
        data, hinted, launcher = accelerate_ds_config(path, draft)
    else:
        data, launcher = read_json(path, "ds_config.json"), None
    if model is None:
        raise MemformError(f"{path}: a ds_config.json describes training, not the model: pass --model "
                           f"MODEL.yaml (a memform config) or --model config.json (Hugging Face)")
    _model(model, draft, given)
    args = None
    if trainer is not None:
        from . import hf_trainer

        args = Fields(hf_trainer.read(trainer), trainer)
        data = hf_trainer.fill_deepspeed_auto(args, data, path, draft)
    if "name" not in draft:
        draft.set("name", default_name(model), f"from the model file {model.name}")
    top = Fields(data, path)
    draft.set("training.framework", "deepspeed", "DeepSpeed's allocations (formulas/frameworks/deepspeed.mf)")
    draft.set("training.optimizer", "adam", "DeepSpeed's Adam (the deepspeed profile's optimizer)")
    draft.header.append(f"model from {model.name}; strategy from {path.name}")
    _precision(top, draft)
    _zero(top, draft)
    _batch(top, draft)
    _optimizer(top, draft)
    _checkpointing(top, draft)
    _pipeline(top, draft)
    _parallel(top, draft)
    for key, why in REFUSED.items():
        if top.has(key):
            _refuse_enabled(top, key, why)
    draft.refuse_unused(top, NEUTRAL)
    if launcher is not None:
        draft.refuse_unused(launcher[0], ACCELERATE_NEUTRAL)
        draft.refuse_unused(launcher[1], ACCELERATE_DS_NEUTRAL)
    if args is not None:
        from . import hf_trainer

        hf_trainer.deepspeed_step(args, draft, given, has_optimizer=top.has("optimizer"))
    return hinted


#: accelerate config keys (accelerate/commands/config/config_args.py ClusterConfig) that cannot change device
#: memory: where and how the processes are launched
ACCELERATE_NEUTRAL = dict.fromkeys(
    ("compute_environment", "debug", "machine_rank", "main_process_ip", "main_process_port", "main_training_function",
     "rdzv_backend", "same_network", "tpu_env", "tpu_use_cluster", "tpu_use_sudo", "tpu_name", "tpu_zone",
     "commands", "command_file", "gpu_ids", "enable_cpu_affinity", "num_machines", "downcast_bf16",
     "dynamo_config", "ipex_config", "mpirun_config"), "the launcher's process placement, not the step")
ACCELERATE_DS_NEUTRAL = dict.fromkeys(
    ("deepspeed_multinode_launcher", "deepspeed_hostfile", "deepspeed_exclusion_filter", "deepspeed_inclusion_filter",
     "zero3_save_16bit_model", "offload_optimizer_nvme_path", "offload_param_nvme_path", "zero3_init_flag"),
    "launcher placement, checkpoint saving, NVMe paths, or how ZeRO-3 builds the model (the step's shards are the "
    "same)")


def accelerate_ds_config(path: Path, draft: Draft) -> tuple[dict, int | None, tuple[Fields, Fields]]:
    """The ds_config accelerate builds from its config file's deepspeed_config (accelerate 1.16
    utils/dataclasses.py DeepSpeedPlugin.__post_init__: without deepspeed_config_file, train_batch_size and
    train_micro_batch_size_per_gpu "auto", gradient_accumulation_steps and gradient_clipping as given else
    "auto", zero_stage (default 2) and the offload devices; then set_mixed_precision fills fp16 / bf16 from
    mixed_precision), the device count it launches (num_processes: all machines'), and the two mappings
    read, for their unread keys."""
    from ..engine.config import load_yaml

    raw = load_yaml(path, "accelerate config")
    if not isinstance(raw, dict):
        raise MemformError(f"{path}: an accelerate config must be a YAML mapping, got {describe(raw)}")
    top = Fields(raw, path)
    kind = top.string("distributed_type", "NO")
    if kind != "DEEPSPEED":
        raise top.error("distributed_type", f"is {kind!r}: `memform import deepspeed` reads an accelerate config of "
                                            f"distributed_type DEEPSPEED (an FSDP job: put its settings in the "
                                            f"Trainer's fsdp_config and use `memform import hf --trainer`)")
    if top.boolean("use_cpu", False):
        raise top.error("use_cpu", "is true: a CPU job holds no device memory")
    ds = top.section("deepspeed_config")
    if ds.has("deepspeed_config_file"):
        name = ds.string("deepspeed_config_file")
        found = [p for p in (path.parent / name, Path(name)) if p.is_file()]
        if not found:
            raise ds.error("deepspeed_config_file", f"names {name!r}, which is not a file")
        config = read_json(found[0], "ds_config.json")
        config.setdefault("gradient_accumulation_steps", 1)
        ds.used.update(("zero_stage", "offload_optimizer_device", "offload_param_device"))  # auto entries only
        # the plugin's own values fill "auto" entries only (fill_match must_match=False)
        for key, target in (("gradient_accumulation_steps", "gradient_accumulation_steps"),
                            ("gradient_clipping", "gradient_clipping")):
            if ds.has(key) and config.get(target) == "auto":
                config[target] = ds.raw(key)
    else:
        config = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                  "gradient_accumulation_steps": ds.raw("gradient_accumulation_steps", "auto"),
                  "zero_optimization": {"stage": ds.integer("zero_stage", 2, minimum=0),
                                        "offload_optimizer": {"device": ds.string("offload_optimizer_device", "none")},
                                        "offload_param": {"device": ds.string("offload_param_device", "none")}},
                  "gradient_clipping": ds.raw("gradient_clipping", "auto")}
        if config["zero_optimization"]["stage"] != 3:
            del config["zero_optimization"]["offload_param"]   # DeepSpeed: offload_param only with stage 3
    mixed = top.string("mixed_precision", "no")
    if mixed not in ("no", "fp16", "bf16"):
        raise top.error("mixed_precision", f"is {mixed!r}: fp8 through accelerate is not modelled")
    if mixed != "no":          # DeepSpeedPlugin.set_mixed_precision
        other = "bf16" if mixed == "fp16" else "fp16"
        config.setdefault(mixed, {"enabled": True})
        for key in ("fp16", "bf16"):
            config.setdefault(key, {"enabled": False})
            if config[key].get("enabled") == "auto":
                config[key]["enabled"] = key == mixed
        if config[other].get("enabled") is True:
            raise top.error("mixed_precision", f"is {mixed} and the ds_config enables {other}: accelerate refuses that")
    devices = top.integer("num_processes", 1) if top.has("num_processes") else None
    draft.header.append(f"ds_config as accelerate builds it from {path.name} (DeepSpeedPlugin): "
                        f"{json_text(config)}")
    return config, devices, (top, ds)


def json_text(data: Any) -> str:
    import json

    return json.dumps(data, separators=(", ", ": "))


def _refuse_enabled(top: Fields, key: str, why: str) -> None:
    """A section memform does not model: refused unless it says ``enabled: false`` (or is empty / false)."""
    raw = top.raw(key)
    if raw in (False, {}, []):
        return
    if isinstance(raw, dict):
        # a section is on when its own "enabled" is (sparse_attention has a mode instead: present is on)
        flag = raw.get("enabled", key in ("sparse_attention", "pipeline", "compression_training"))
        if flag is False or (isinstance(flag, str) and flag.lower() == "false"):
            return
    raise top.error(key, f"is set: {why}; memform's deepspeed profile does not model it, so the estimate would "
                         f"be silently wrong (remove the section, or set its \"enabled\": false, to estimate "
                         f"without it)")


def _model(model: Path, draft: Draft, given) -> None:  # noqa: ANN001 - the overrides mapping
    """The model underneath: a Hugging Face config.json (the hf importer) or a memform YAML config, of
    which only the model (``model.*``) is taken: the ds_config is the strategy."""
    data = read_model_file(model, draft, given)
    if data is None:
        # a Hugging Face config.json is trained as transformers builds it (from_config / from_pretrained):
        # the deepspeed profile's activations of transformers' model classes (deepspeed.modeling)
        draft.set("deepspeed.modeling", "transformers",
                  f"{model.name} is a Hugging Face config: transformers' model classes")
        return
    dropped = []
    for path, value in dotted(data).items():
        if path == "model.seq_length" and "model.seq_length" not in given:
            draft.default(path, value, f"{model.name}'s training length (a ds_config gives none); set yours")
        elif path.startswith("model.") or path == "name":
            draft.set(path, value, f"from {model.name}")
        else:
            dropped.append(path)
    if "model.seq_length" not in draft and "model.seq_length" not in given:
        raise MemformError(f"{model}: the model file gives no model.seq_length and a ds_config.json none either: "
                           f"pass --set model.seq_length=N (the training sequence length)")
    if "model.seq_length" not in given:
        draft.warn(f"model.seq_length = {draft.get('model.seq_length')} is {model.name}'s: a ds_config.json does not "
                   f"give the sequence length; pass --set model.seq_length=N with your training sequence")
    if dropped:
        # the job's parallelism, recompute and batch are the ds_config's (a ZeRO data-parallel job), not
        # those of the run the model file describes
        draft.warn(f"{model.name}: only its model (model.*) is used; not carried: {', '.join(dropped)} (the "
                   f"ds_config is the strategy: pass --set for what it does not say, e.g. training.recompute)")


def count(fields: Fields, key: str) -> Any:
    """An element count as DeepSpeed takes it: an integer, a number such as 5e8 (or "5e8"), or "auto"."""
    value = fields.raw(key)
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise fields.error(key, f"must be a number of elements or \"auto\", got {describe(value)}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or value != int(value):
        raise fields.error(key, f"must be a non-negative whole number of elements or \"auto\", got {describe(value)}")
    return int(value)


def _flag(fields: Fields, key: str, default: bool) -> Any:
    """A boolean that may be "auto" (the HF Trainer fills it): "auto" is returned as such."""
    raw = fields.raw(key, default)
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return "auto"
    return fields.boolean(key, default)


def _precision(top: Fields, draft: Draft) -> None:
    enabled, sections = {}, {}
    for name in ("fp16", "bf16", "bfloat16"):
        if not top.has(name):
            top.used.add(name)
            continue
        section = top.section(name)
        key = "bf16" if name == "bfloat16" else name
        sections[key] = section
        enabled[key] = _flag(section, "enabled", False)
    on = [k for k, v in enabled.items() if v is True]
    if len(on) > 1:
        raise MemformError(f"{top.file}: fp16.enabled and bf16.enabled are both true; DeepSpeed allows one "
                           f"(runtime/config.py: 'bfloat16 and fp16 modes cannot be simultaneously enabled')")
    dtype = None
    if on:
        dtype = on[0]
        draft.set("training.precision.params", dtype, f"{dtype}.enabled: true")
        draft.set("training.precision.activations", dtype, f"{dtype}.enabled: true (activations in the model dtype)")
    elif "auto" in enabled.values():
        auto = [k for k, v in enabled.items() if v == "auto"]
        dtype = "bf16"
        draft.default("training.precision.params", "bf16",
                      f"{' / '.join(f'{k}.enabled' for k in auto)} is \"auto\": the HF Trainer takes it from "
                      f"{' / '.join(AUTO_FROM[k] for k in auto)}; bf16 assumed")
        draft.warn(f"{' and '.join(f'{k}.enabled' for k in auto)} \"auto\": the precision comes from the HF "
                   f"Trainer's command line; bf16 assumed (--set training.precision.params=fp16|fp32)")
    else:
        draft.set("training.precision.params", "fp32", "neither fp16 nor bf16 enabled: DeepSpeed trains in fp32")
        draft.set("training.precision.activations", "fp32", "fp32 training")
    for key, section in sections.items():
        _master(top, key, section, draft, active=enabled[key] is True or (enabled[key] == "auto" and key == dtype))
        draft.refuse_unused(section, FP_NEUTRAL)
    types = top.section("data_types")
    if types.has("grad_accum_dtype"):
        draft.set("training.precision.grads", dtype_name(types.string("grad_accum_dtype"), types, "grad_accum_dtype"),
                  "data_types.grad_accum_dtype")
        if dtype == "fp16" and draft.get("training.precision.grads") == "fp32":
            # fp16 with fp32 accumulation: stage_1_and_2.py's grad_accum attribute (param.grad = None once copied)
            draft.set("deepspeed.keep_lp_grads", False, "fp16 with fp32 accumulation: the 16-bit .grad freed once "
                      "copied into grad_accum (stage_1_and_2.py use_grad_accum_attribute)")
            # engine.py _do_optimizer_sanity_check: only a bf16 model gets BF16_Optimizer (ZeRO-1); fp16 keeps
            # DeepSpeedZeroOptimizer, its IPG bucket included
            draft.set("deepspeed.bf16_optimizer", False, "fp16 with fp32 accumulation: DeepSpeedZeroOptimizer, not "
                      "BF16_Optimizer (engine.py _do_optimizer_sanity_check)")
    if types.has("param_dtype"):  # engine.py _assert_valid_mixed_precision_config: must be the fp16/bf16 mode's
        param = dtype_name(types.string("param_dtype"), types, "param_dtype")
        if param != draft.get("training.precision.params"):
            raise types.error("param_dtype", f"is {param} but the enabled precision is "
                                             f"{draft.get('training.precision.params')} (DeepSpeed rejects the mismatch)")
    # buffers (rotary inv_freq, norms' running stats) are a few vectors: their dtype moves no measurable memory
    draft.refuse_unused(types, {"buffer_dtype": "the dtype of module buffers (a few vectors)"})
    if top.has("communication_data_type"):
        # runtime/config.py get_communication_data_type: fp32, fp16 or bf16, else DeepSpeed raises ValueError
        spelled = top.string("communication_data_type").lower()
        if spelled not in ("fp32", "fp16", "bf16"):
            raise top.error("communication_data_type", f"is {spelled!r}: DeepSpeed accepts fp16, bf16 or fp32 only "
                                                       f"(runtime/config.py get_communication_data_type raises "
                                                       f"ValueError on anything else)")
        comm = spelled
        if comm != draft.get("training.precision.params"):
            # stage_1_and_2.py _gradient_reduction_buffer_dtype / engine.py communication_data_type: the IPG
            # buckets and the reduction's flat copies in that dtype
            raise top.error("communication_data_type", f"is {comm}, not the model dtype "
                            f"{draft.get('training.precision.params')}: the gradient buckets are then allocated in "
                            f"{comm} (stage_1_and_2.py _gradient_reduction_buffer_dtype), which memform does not model")
    if top.has("seq_parallel_communication_data_type"):
        top.used.add("seq_parallel_communication_data_type")  # read only with sequence_parallel_size > 1 (refused)
    if top.has("torch_autocast"):
        auto = top.section("torch_autocast")
        on = auto.raw("enabled", False)
        auto.used.update(("dtype", "lower_precision_safe_modules"))
        if on is True or (isinstance(on, str) and on.lower() == "true"):
            # torch.autocast over the forward (runtime/torch_autocast.py): norms, softmax and the loss run in
            # fp32, which changes the activations the profile counts; the weights stay in the fp16/bf16 dtype
            # (engine.py _configure_distributed_model). Taken on trust only with --accept.
            draft.refuse_unread("torch_autocast.enabled")
        draft.refuse_unused(auto)


def _master(top: Fields, key: str, section: Fields, draft: Draft, *, active: bool) -> None:
    """bf16.bf16_master_weights_and_grads / bf16_optimizer_states, fp16.fp16_master_weights_and_grads
    (runtime/precision_config.py; DeepSpeed PR #7700): the ZeRO master copy and its step gradients in 16
    bits (deepspeed.master_weights_and_grads), Adam's moments in bf16 (training.precision.optimizer)."""
    master = section.boolean(f"{key}_master_weights_and_grads", False)
    states = section.boolean("bf16_optimizer_states", False) if key == "bf16" else False
    if key == "bf16":
        immediate = section.boolean("immediate_grad_update", False)
        if immediate and active:
            # BF16_Optimizer (bf16_optimizer.py accumulate_hp_grads_and_remove_lp): each gradient is added
            # into the fp32 buffer in its hook and the bf16 .grad freed (lp_param.grad = None)
            draft.set("deepspeed.keep_lp_grads", False, "bf16.immediate_grad_update: true (the bf16 .grad "
                      "freed once added into the fp32 buffer)")
    if states and not master:
        raise section.error("bf16_optimizer_states", "needs bf16_master_weights_and_grads: true (runtime/config.py: "
                                                     "'bf16_optimizer_states requires bf16_master_weights_and_grads')")
    if not master or not active:
        return
    draft.set("deepspeed.master_weights_and_grads", key, f"{section.name(f'{key}_master_weights_and_grads')}: true "
              f"(the ZeRO master partition and its step gradients in {key})")
    if states:
        draft.set("training.precision.optimizer", "bf16", "bf16.bf16_optimizer_states: true (Adam's moments in bf16)")
    else:
        draft.set("training.precision.optimizer", "fp32", f"{key}_master_weights_and_grads without bf16_optimizer_states: "
                  f"fp32 moments (DeepSpeedCPUAdam, offload required)")


def _zero(top: Fields, draft: Draft) -> None:
    raw = top.raw("zero_optimization", None)
    if isinstance(raw, bool):  # the deprecated boolean form: true is stage 1 (zero/config.py read_zero_config_deprecated)
        draft.set("parallel.zero", 1 if raw else 0, f"zero_optimization: {str(raw).lower()} (deprecated form: stage 1)")
        return
    zero = top.section("zero_optimization")
    stage = zero.integer("stage", 0, minimum=0)
    if stage > 3:
        raise zero.error("stage", f"must be 0, 1, 2 or 3, got {stage}")
    draft.set("parallel.zero", stage, "zero_optimization.stage" if zero.has("stage") else
              "no zero_optimization.stage: DeepSpeed's default 0")
    hidden = draft.get("model.hidden_size")
    for keys, target in COUNTS:
        key, value = zero.first(keys, lambda k: count(zero, k))
        if key is None:
            continue
        if value == "auto":
            how = HF_AUTO.get(target)
            if how is None or not isinstance(hidden, int):
                draft.warn(f"zero_optimization.{key} is \"auto\" and memform cannot derive it "
                           f"{'without the model hidden size' if how else '(the HF Trainer does not fill it)'}; "
                           f"DeepSpeed's default is used")
                continue
            if target != "deepspeed.reduce_bucket_size" and stage != 3:
                continue  # the Trainer fills the stage-3 keys only for ZeRO-3; DeepSpeed ignores them otherwise
            draft.set(target, how[1](hidden), f"zero_optimization.{key} \"auto\": the HF Trainer's {how[0]} "
                      f"(hidden_size {hidden}, transformers integrations/deepspeed.py)")
        else:
            draft.set(target, value, f"zero_optimization.{key}")
    for key, target in (("overlap_comm", "deepspeed.overlap_comm"), ("contiguous_gradients", "deepspeed.contiguous_gradients")):
        if zero.has(key):
            draft.set(target, zero.boolean(key), f"zero_optimization.{key}")
    for key, target in (("offload_optimizer", "deepspeed.offload_optimizer"), ("offload_param", "deepspeed.offload_param")):
        if not zero.has(key):
            zero.used.add(key)
            continue
        section = zero.section(key)
        device = section.string("device", "none").lower()
        if device not in ("none", "cpu", "nvme"):
            raise section.error("device", f"must be none, cpu or nvme, got {describe(device)}")
        if device == "nvme":
            draft.warn(f"zero_optimization.{key}.device nvme: counted as cpu offload (the device holds the "
                       f"same; memform's host bytes then stand for what NVMe holds)")
            device = "cpu"
        draft.set(target, device, f"zero_optimization.{key}.device")
        if section.has("ratio") and section.number("ratio") != 1:
            # stage3.py subgroup_to_device: the first (1 - ratio) of the sub-groups stay on the device
            raise section.error("ratio", f"is {section.raw('ratio')}: partial optimizer offload (ZeRO-3 "
                                         f"subgroup_to_device) is not modelled; memform offloads all or nothing")
        if section.raw("super_offload", False) not in (False, "false"):
            raise section.error("super_offload", "is set: SuperOffload (superchip CPU-GPU pipelining) is not "
                                                 "modelled")
        section.used.update(("ratio", "super_offload"))
        draft.refuse_unused(section, OFFLOAD_NEUTRAL)
    for key, target in (("cpu_offload", "deepspeed.offload_optimizer"), ("cpu_offload_param", "deepspeed.offload_param")):
        if zero.has(key) and zero.boolean(key):  # deprecated spellings (zero/config.py new_param_fn)
            draft.set(target, "cpu", f"zero_optimization.{key}: true (deprecated form)")
    for key, (neutral, why) in ZERO_DEFAULTS.items():
        if zero.has(key) and zero.raw(key) != neutral:
            draft.refuse_unread(zero.name(key))
    for key, (neutral, why) in ZERO_REFUSED.items():
        if not zero.has(key):
            continue
        value = zero.raw(key)
        if value == neutral or (neutral == 1 and value == 0) or (neutral == -1 and value in (0, 1)) \
                or (neutral is None and value in ({}, [], False)):
            continue
        shown = "set" if isinstance(value, (dict, list)) else f"{describe(value)}"
        raise zero.error(key, f"is {shown}: {why}; memform's deepspeed profile does not model it, so the "
                              f"estimate would be silently wrong (remove it to estimate plain ZeRO)")
    draft.refuse_unused(zero, ZERO_NEUTRAL)


def _batch(top: Fields, draft: Draft) -> None:
    """The three batch keys as given (None: absent or "auto"); the micro-batch is settled in :func:`finish`,
    once the data-parallel size is known."""
    values: dict[str, int | None] = {}
    for key in BATCH_KEYS:
        raw = top.raw(key, None)
        if isinstance(raw, str) and raw.strip().lower() == "auto":
            draft.warn(f"{key} is \"auto\": the HF Trainer sets it from {AUTO_FROM[key]}; the model file's "
                       f"value or memform's default is kept (pass --set for the real value)")
            values[key] = None
        else:
            values[key] = None if raw is None else top.integer(key)
    _BATCH[id(draft)] = (top.file, values)


#: train_micro_batch_size_per_gpu, gradient_accumulation_steps, train_batch_size (runtime/constants.py)
BATCH_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
#: convert → finish: each draft's batch keys (finish sees only the draft)
_BATCH: dict[int, tuple[Path, dict[str, int | None]]] = {}
#: convert → finish: each draft's activation_checkpointing switches that are on
_CKPT: dict[int, list[str]] = {}


def finish(draft: Draft) -> None:
    """DeepSpeed's batch triangle, once the data-parallel size is known (deepspeed/runtime/config.py
    ``_set_batch_related_parameters``, then ``_batch_assertion``: train_batch_size == micro × accumulation
    × the data-parallel world size). With --devices (or --set parallel.dp) the missing side follows; without
    them, the three given sides set dp."""
    switches = _CKPT.pop(id(draft), [])
    if draft.get("training.recompute", "none") != "none":
        for name in switches:
            if name.endswith("cpu_checkpointing") or draft.get("parallel.tp", 1) > 1:
                draft.refuse_unread(name)
    file, values = _BATCH.pop(id(draft), (draft.source, {}))
    micro, gas, total = (values.get(k) for k in BATCH_KEYS)
    dp_entry = draft.entries.get("parallel.dp")
    dp = None if dp_entry is None or dp_entry.default else dp_entry.value
    names = {"micro": "train_micro_batch_size_per_gpu", "gas": "gradient_accumulation_steps",
             "total": "train_batch_size"}

    def own(key: str) -> bool:  # not set on the command line
        entry = draft.entries.get(key)
        return entry is None or entry.default or entry.note != "set on the command line"

    def put(key: str, value: int, note: str) -> None:
        if own(key):
            draft.set(key, value, note)

    if dp is None:
        if micro is not None and gas is not None and total is not None:
            if total % (micro * gas):
                raise MemformError(f"{file}: train_batch_size {total} is not train_micro_batch_size_per_gpu {micro} "
                                   f"× gradient_accumulation_steps {gas} × a data-parallel size (runtime/config.py "
                                   f"_batch_assertion)")
            dp = total // (micro * gas)
            if own("parallel.dp"):
                draft.set("parallel.dp", dp, "train_batch_size / (train_micro_batch_size_per_gpu × "
                          "gradient_accumulation_steps)")
        elif total is not None:
            # gradient_accumulation_steps or the micro batch follows from train_batch_size only once the
            # data-parallel size is known (_set_batch_related_parameters divides by the world size)
            draft.warn(f"train_batch_size {total} is split by the data-parallel size: pass --devices N (or "
                       f"--set parallel.dp=N) to derive the {'accumulation steps' if micro else 'micro batch'} "
                       f"from it; without it memform assumes "
                       f"{'no accumulation' if gas is None else f'{gas} accumulation steps'}")
            total = None
        if micro is not None:
            put("training.micro_batch_size", micro, "train_micro_batch_size_per_gpu")
        if gas is not None:
            put("training.num_micro_batches", gas, "gradient_accumulation_steps")
        if total is not None and own("training.micro_batch_size") and own("training.num_micro_batches"):
            put("training.global_batch_size", total, "train_batch_size (= micro batch × accumulation × dp)")
        return
    where = f"dp {dp} ({'--devices' if 'parallel.devices' in draft else '--set parallel.dp'})"
    given = {k: v for k, v in (("micro", micro), ("gas", gas), ("total", total)) if v is not None}
    how = "given"
    if total is not None and micro is not None and gas is None:
        gas, how = total // micro // dp, "train_batch_size / (train_micro_batch_size_per_gpu × dp)"
    elif total is not None and gas is not None and micro is None:
        micro, how = total // dp // gas, "train_batch_size / (dp × gradient_accumulation_steps)"
    elif micro is not None and total is None:
        gas = 1 if gas is None else gas
        total, how = micro * gas * dp, "train_micro_batch_size_per_gpu × gradient_accumulation_steps × dp"
    elif total is not None and micro is None and gas is None:
        gas, micro, how = 1, total // dp, "train_batch_size / dp (no accumulation)"
    if micro is None:  # nothing usable (absent or "auto"): memform's defaults stay
        return
    if micro < 1 or gas < 1 or total != micro * gas * dp:
        parts = [f"{names[k]} {v}" for k, v in given.items()]
        listed = " and ".join(parts) if len(parts) < 3 else f"{', '.join(parts[:-1])} and {parts[-1]}"
        raise MemformError(f"{file}: {listed} do not fit {where}: DeepSpeed needs train_batch_size == "
                           f"train_micro_batch_size_per_gpu × gradient_accumulation_steps × data-parallel size "
                           f"(runtime/config.py _batch_assertion; here {total} != {micro} × {gas} × {dp})")
    for key, target in (("micro", "training.micro_batch_size"), ("gas", "training.num_micro_batches"),
                        ("total", "training.global_batch_size")):
        value = {"micro": micro, "gas": gas, "total": total}[key]
        if key == "total" and not (own("training.micro_batch_size") and own("training.num_micro_batches")):
            continue  # --set micro batch / accumulation: the user's batch, not the ds_config's triangle
        put(target, value, names[key] if key in given else f"{how} ({where})")


def _optimizer(top: Fields, draft: Draft) -> None:
    if not top.has("optimizer"):
        top.used.add("optimizer")
        draft.warn("no 'optimizer' section: the client's optimizer is used (the HF Trainer passes AdamW); "
                   "memform counts Adam's two moments")
        return
    section = top.section("optimizer")
    kind = str(section.raw("type", "") or "")
    if kind.replace("_", "").replace("-", "").lower() not in ADAM_LIKE:
        raise section.error("type", f"is {kind!r}: memform's deepspeed profile counts Adam's states (fp32 master, "
                                    f"exp_avg, exp_avg_sq: Adam, AdamW, FusedAdam, CPUAdam, Lamb); "
                                    f"{kind or 'this optimizer'}'s states (1-bit error feedback, one moment, "
                                    f"Muon's momentum) are not modelled")
    section.used.add("legacy_fusion")  # an old FusedAdam switch (runtime/config.py LEGACY_FUSION)
    params = section.section("params")
    if params.raw("amsgrad", False) not in (False, "false"):
        raise params.error("amsgrad", "is true: AMSGrad keeps a third state (max_exp_avg_sq) the profile does not count")
    states = params.raw("fp32_optimizer_states", None)
    if states is not None and draft.get("deepspeed.master_weights_and_grads") != "bf16":
        params.used.add("fp32_optimizer_states")  # DeepSpeedCPUAdam: fp32 states unless bf16 masters (engine.py)
    elif states is not None:
        if params.boolean("fp32_optimizer_states") is False:
            draft.set("training.precision.optimizer", "bf16",
                      "optimizer.params.fp32_optimizer_states: false (DeepSpeedCPUAdam's moments in bf16)")
    draft.refuse_unused(params, OPT_NEUTRAL)
    draft.refuse_unused(section)


def _checkpointing(top: Fields, draft: Draft) -> None:
    """activation_checkpointing configures deepspeed.checkpointing (runtime/activation_checkpointing/config.py),
    which only model code that calls deepspeed.checkpointing.checkpoint uses; the recompute mode is not in it."""
    if not top.has("activation_checkpointing"):
        top.used.add("activation_checkpointing")
        return
    section = top.section("activation_checkpointing")
    neutral = {"number_checkpoints": "a count hint", "synchronize_checkpoint_boundary": "a device sync",
               "profile": "timers", "contiguous_memory_optimization": "copies the checkpoints into one buffer "
                                                                     "(the same bytes)"}
    # partition_activations splits the checkpointed inputs over the tensor-parallel ranks, cpu_checkpointing
    # moves them to the host (activation_checkpointing/checkpointing.py): less device memory than the profile
    # counts, but only for recomputed layers, and partitioning only over tp > 1 -- settled in finish()
    _CKPT[id(draft)] = [section.name(key) for key in ("partition_activations", "cpu_checkpointing")
                        if section.has(key) and section.boolean(key)]
    draft.refuse_unused(section, neutral)
    if draft.get("training.recompute") is not None:
        return     # the Trainer's gradient_checkpointing said it (--trainer)
    draft.warn("activation_checkpointing configures deepspeed.checkpointing, which the model code has to call; "
               "the recompute mode is not in a ds_config: set training.recompute (full for checkpointed layers)")


def _pipeline(top: Fields, draft: Draft) -> None:
    """The ``pipeline`` section configures DeepSpeed's PipelineEngine (runtime/config.py get_pipeline_config; the
    pipeline degree and the layers of each stage are the PipelineModule's, in the model code: parallel.pp,
    parallel.stage_layers). pipe_partitioned / grad_partitioned (default true) split what the stages keep and
    exchange over the TP ranks (pipe/engine.py: frameworks/deepspeed.mf ds_pipe_part, ds_grad_part)."""
    if not top.has("pipeline"):
        top.used.add("pipeline")
        return
    section = top.section("pipeline")
    for key in ("pipe_partitioned", "grad_partitioned"):
        if section.has(key):
            draft.set(f"deepspeed.{key}", section.boolean(key), f"{section.name(key)} (PipelineEngine)")
    neutral = {"stages": "the PipelineModule's num_stages decides the stages (parallel.pp)",
               "partition": "how the PipelineModule assigns layers to stages (parallel.stage_layers says the result)",
               "seed_layers": "RNG seeding of each layer's initialisation"}
    # activation_checkpoint_interval > 0: the PipelineModule checkpoints groups of that many layers
    # (pipe/module.py), a recompute pattern the import does not map: refused unless 0
    if section.data.get("activation_checkpoint_interval") == 0:   # (read without marking it read)
        neutral["activation_checkpoint_interval"] = "0: the PipelineModule checkpoints nothing"
        neutral["use_reentrant"] = "the checkpoint function, unused without checkpointing"
    draft.refuse_unused(section, neutral)


def _parallel(top: Fields, draft: Draft) -> None:
    """Parallelism a ds_config may turn on beyond ZeRO's data parallelism: refused above one."""
    tp = top.section("tensor_parallel")
    size = tp.integer("autotp_size", 1, minimum=0) if tp.has("autotp_size") else 1
    if size > 1:
        # AutoTP (module_inject/auto_tp.py, engine.py _configure_tensor_parallel) shards the nn.Linear layers
        # it recognises and keeps the embedding (and, unless a vocab-parallel head is chosen, the head)
        # replicated; memform's parallel.tp is Megatron's layout (vocab-parallel embedding and head, fused loss)
        raise tp.error("autotp_size", f"is {size}: DeepSpeed AutoTP shards the Linear layers it recognises and "
                                      f"keeps the embedding replicated (module_inject/auto_tp.py), which memform's "
                                      f"parallel.tp (Megatron's layout) does not describe; AutoTP is not modelled")
    tp.used.update(tp.data)  # without AutoTP the section's other settings are unused (engine.py)
    ep = top.section("expert_parallel")
    if ep.has("autoep_size") and ep.integer("autoep_size", 1) > 1:
        raise ep.error("autoep_size", "is above 1: DeepSpeed AutoEP is not modelled by the deepspeed profile")
    ep.used.update(ep.data)  # without AutoEP the section's other settings are unused
    if top.has("sequence_parallel_size") and top.integer("sequence_parallel_size") > 1:
        raise top.error("sequence_parallel_size", "is above 1: DeepSpeed-Ulysses / ALST sequence parallelism is not "
                                                  "modelled by the deepspeed profile")
    top.used.add("sequence_parallel_size")
    if top.has("elasticity") and top.section("elasticity").raw("enabled", False) not in (False, "false"):
        raise top.error("elasticity", "is enabled: elastic training picks the batch sizes at launch "
                                      "(elasticity/elasticity.py); give them instead")
