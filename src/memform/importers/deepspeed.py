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
Keys read without a memory effect memform models (``gradient_clipping``: the norm is taken in place;
loss scaling; logging) are not warned about; unknown ones are, once each.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from ..errors import MemformError, read_text
from . import hf
from .draft import Draft, Fields, default_name, describe, dtype_name

TITLE = "DeepSpeed config"
#: ``memform import deepspeed`` reads a model file too (``--model``)
TAKES_MODEL = True

#: top-level keys that move no device memory (logging, schedules, checkpoints, loss scaling, norms)
IGNORED = frozenset({
    "steps_per_print", "wall_clock_breakdown", "dump_state", "scheduler", "gradient_clipping",
    "prescale_gradients", "gradient_predivide_factor", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "tensorboard", "wandb", "csv_monitor", "comet", "monitor_config",
    "comms_logger", "flops_profiler", "checkpoint", "load_universal_checkpoint", "elasticity",
    "memory_breakdown", "seed", "timers", "use_node_local_storage",
})
#: zero_optimization keys without a memory effect memform could model (communication choices,
#: checkpointing, ZeRO++ quantisation switches are warned instead)
ZERO_IGNORED = frozenset({
    "reduce_scatter", "allgather_partitions", "use_multi_rank_bucket_allreduce", "load_from_fp32_weights",
    "elastic_checkpoint", "ignore_unused_parameters", "round_robin_gradients", "legacy_stage1",
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "gather_16bit_weights_on_model_save", "memory_efficient_linear", "override_module_apply",
    "stage3_module_granularity_threshold", "stage3_use_all_reduce_for_fetch_params", "cpu_offload_use_pin_memory",
})
FP_IGNORED = frozenset({"loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                        "consecutive_hysteresis", "min_loss_scale", "auto_cast", "fp16_master_weights_and_grads",
                        "immediate_grad_update", "check_grad_overflow"})
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
ADAM_LIKE = {"adam", "adamw", "fusedadam", "cpuadam", "deepspeedcpuadam", "onebitadam", "zerooneadam"}


def read_json(path: Path) -> dict:
    return hf.read_json(path)


def convert(path: Path, draft: Draft, given: set[str], model: Path | None = None) -> int | None:
    """Fill ``draft`` from the ds_config.json at ``path`` on top of ``model`` (memform YAML or config.json)."""
    data = read_json(path)
    if model is None:
        raise MemformError(f"{path}: a ds_config.json describes training, not the model: pass --model "
                           f"MODEL.yaml (a memform config) or --model config.json (Hugging Face)")
    _model(model, draft, given)
    if "name" not in draft:
        draft.set("name", default_name(model), f"from the model file {model.name}")
    top = Fields(data, path)
    draft.set("training.framework", "deepspeed", "DeepSpeed's allocations (formulas/frameworks/deepspeed.mf)")
    draft.header.append(f"model from {model.name}; strategy from {path.name}")
    _precision(top, draft)
    _zero(top, draft)
    _batch(top, draft, given)
    _optimizer(top, draft)
    _checkpointing(top, draft)
    for key in ("amp", "sparse_attention", "pipeline", "compression_training", "data_efficiency",
                "curriculum_learning", "aio", "nebula", "autotuning", "communication_data_type",
                "seq_parallel_communication_data_type", "torch_autocast", "fp8", "zenflow"):
        if top.has(key):
            top.used.add(key)
            draft.warn(f"field '{key}' is not modelled by memform (ignored)")
    draft.warn_unused(top, IGNORED)
    return None


def _model(model: Path, draft: Draft, given: set[str]) -> None:
    """The model underneath: a Hugging Face config.json (the hf importer) or a memform YAML config."""
    if model.suffix == ".json":
        before = len(draft.warnings)
        hf.convert(model, draft, given)
        draft.warnings[before:] = [f"{model.name}: {w}" for w in draft.warnings[before:]]
        # a Hugging Face config.json is trained as transformers builds it (from_config / from_pretrained):
        # the deepspeed profile's activations of transformers' model classes (deepspeed.modeling)
        draft.set("deepspeed.modeling", "transformers",
                  f"{model.name} is a Hugging Face config: transformers' model classes")
        return
    text = read_text(model, "model config")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MemformError(f"{model}: YAML syntax error: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise MemformError(f"{model}: --model must be a memform config with a 'model:' section "
                           f"(or a Hugging Face config.json), got {describe(data)}")

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and value:
                walk(value, f"{path}.")
            else:
                draft.set(path, value, f"from {model.name}")

    walk(data, "")


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


def _precision(top: Fields, draft: Draft) -> None:
    enabled = {}
    for name in ("fp16", "bf16", "bfloat16"):
        if not top.has(name):
            top.used.add(name)
            continue
        section = top.section(name)
        flag = section.raw("enabled", False)
        section.used.update(FP_IGNORED)
        draft.warn_unused(section)
        key = "bf16" if name == "bfloat16" else name
        if isinstance(flag, str) and flag.lower() == "auto":
            enabled[key] = "auto"
        else:
            enabled[key] = section.boolean("enabled", False)
    on = [k for k, v in enabled.items() if v is True]
    if len(on) > 1:
        raise MemformError(f"{top.file}: fp16.enabled and bf16.enabled are both true; DeepSpeed allows one "
                           f"(runtime/config.py: 'bfloat16 and fp16 modes cannot be simultaneously enabled')")
    if on:
        dtype = on[0]
        draft.set("training.precision.params", dtype, f"{dtype}.enabled: true")
        draft.set("training.precision.activations", dtype, f"{dtype}.enabled: true (activations in the model dtype)")
    elif "auto" in enabled.values():
        auto = [k for k, v in enabled.items() if v == "auto"]
        draft.default("training.precision.params", "bf16",
                      f"{' / '.join(f'{k}.enabled' for k in auto)} is \"auto\": the HF Trainer takes it from "
                      f"{' / '.join(AUTO_FROM[k] for k in auto)}; bf16 assumed")
        draft.warn(f"{' and '.join(f'{k}.enabled' for k in auto)} \"auto\": the precision comes from the HF "
                   f"Trainer's command line; bf16 assumed (--set training.precision.params=fp16|fp32)")
    else:
        draft.set("training.precision.params", "fp32", "neither fp16 nor bf16 enabled: DeepSpeed trains in fp32")
        draft.set("training.precision.activations", "fp32", "fp32 training")
    types = top.section("data_types")
    if types.has("grad_accum_dtype"):
        draft.set("training.precision.grads", dtype_name(types.string("grad_accum_dtype"), types, "grad_accum_dtype"),
                  "data_types.grad_accum_dtype")
    draft.warn_unused(types)


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
        section.used.update(("pin_memory", "fast_init", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu",
                             "pipeline", "pipeline_read", "pipeline_write", "ratio"))
        draft.warn_unused(section)
    for key, target in (("cpu_offload", "deepspeed.offload_optimizer"), ("cpu_offload_param", "deepspeed.offload_param")):
        if zero.has(key) and zero.boolean(key):  # deprecated spellings (zero/config.py new_param_fn)
            draft.set(target, "cpu", f"zero_optimization.{key}: true (deprecated form)")
    for key in ("zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_gradients",
                "zero_quantized_nontrainable_weights", "mics_shard_size", "stage3_model_persistence_threshold",
                "model_persistence_threshold", "offload_ratio"):
        if zero.has(key):
            zero.used.add(key)
            draft.warn(f"zero_optimization.{key} is not modelled by memform (ignored)")
    draft.warn_unused(zero, ZERO_IGNORED)


def _batch(top: Fields, draft: Draft, given: set[str]) -> None:
    values = {}
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"):
        raw = top.raw(key, None)
        if isinstance(raw, str) and raw.strip().lower() == "auto":
            draft.warn(f"{key} is \"auto\": the HF Trainer sets it from {AUTO_FROM[key]}; the model file's "
                       f"value or memform's default is kept (pass --set for the real value)")
        elif raw is not None:
            values[key] = top.integer(key)
    micro, gas, total = (values.get(k) for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                                                  "train_batch_size"))
    if micro is not None:
        draft.set("training.micro_batch_size", micro, "train_micro_batch_size_per_gpu")
    if gas is not None:
        draft.set("training.num_micro_batches", gas, "gradient_accumulation_steps")
    if total is not None:
        draft.set("training.global_batch_size", total, "train_batch_size (= micro batch × accumulation × DP)")
    if micro is not None and gas is not None and total is not None and "parallel.dp" not in given:
        # DeepSpeedConfig._batch_assertion: train_batch_size == micro × accumulation × data-parallel size
        if total % (micro * gas):
            raise MemformError(f"{top.file}: train_batch_size {total} is not micro batch {micro} × gradient "
                               f"accumulation {gas} × a data-parallel size (runtime/config.py _batch_assertion)")
        draft.set("parallel.dp", total // (micro * gas),
                  "train_batch_size / (train_micro_batch_size_per_gpu × gradient_accumulation_steps)")
    elif total is not None and micro is None:
        draft.warn("train_batch_size without train_micro_batch_size_per_gpu: the micro batch depends on the world "
                   "size; pass --set training.micro_batch_size=N")
        draft.entries.pop("training.global_batch_size", None)


def _optimizer(top: Fields, draft: Draft) -> None:
    if not top.has("optimizer"):
        top.used.add("optimizer")
        draft.warn("no 'optimizer' section: the client's optimizer is used (the HF Trainer passes AdamW); "
                   "memform counts Adam's two moments")
        return
    section = top.section("optimizer")
    kind = str(section.raw("type", "") or "")
    section.used.add("params")
    draft.warn_unused(section)
    if kind.replace("_", "").lower() not in ADAM_LIKE:
        draft.warn(f"optimizer.type {kind!r}: memform counts Adam's two fp32 moments per parameter")


def _checkpointing(top: Fields, draft: Draft) -> None:
    if not top.has("activation_checkpointing"):
        top.used.add("activation_checkpointing")
        return
    section = top.section("activation_checkpointing")
    section.used.update(section.data)  # every field: the section configures deepspeed.checkpointing
    draft.warn("activation_checkpointing configures deepspeed.checkpointing, which the model code has to call "
               "(partition_activations splits the saved inputs over tensor-parallel ranks); the recompute mode "
               "is not imported: set training.recompute (full for checkpointed layers)")
