"""A Hugging Face Trainer job's training arguments → the ``hf-trainer`` keys of a memform config
(``memform import hf config.json --trainer training_args.json [--adapter adapter_config.json]``).

Two shapes of one set of field names are read:

- ``TrainingArguments`` as transformers writes it (``TrainingArguments.to_json_string()`` /
  ``to_dict()``, the ``training_args.json`` many fine-tuning scripts save next to the model; TRL's
  ``SFTConfig`` adds its own fields to the same object);
- a TRL-style YAML recipe (``TrlParser``: ``ModelConfig`` + ``SFTConfig`` + the script's own arguments in
  one mapping, as the alignment-handbook recipes are): ``dtype`` / ``torch_dtype``, ``attn_implementation``,
  ``load_in_4bit``, ``use_peft`` and ``lora_*`` beside the TrainingArguments fields.

What sizes the step (transformers trainer.py / training_args.py, TRL sft_config.py / model_config.py):
``per_device_train_batch_size`` (the micro-batch), ``gradient_accumulation_steps`` (micro-batches per
optimizer step: the ``.grad`` tensors persist across them), ``bf16`` / ``fp16`` (the forward under
torch.autocast), ``optim`` (the optimizer class ``Trainer.get_optimizer_cls_and_kwargs`` picks),
``gradient_checkpointing`` (torch.utils.checkpoint per decoder layer), ``max_grad_norm`` (clipping, in
place), TRL's ``max_length`` (the longest row). Fields that hand the step to another engine (``deepspeed``,
``fsdp``, ``torch_compile``, Liger kernels) or to another kind of training (GRPO / DPO / PPO trainers'
fields) stop the import with the field named; fields that cannot change device memory are listed in
NEUTRAL with the reason; any other field is refused at the end of the import unless ``--accept`` names it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..engine.config import load_yaml
from ..errors import MemformError
from .draft import Draft, Fields, describe, dtype_name, read_json

TITLE = "Hugging Face TrainingArguments"

#: TrainingArguments optim -> hf_trainer.optim (formulas/frameworks/hf-trainer.mf), with what the Trainer
#: builds for it (trainer_optimizer.py handlers)
OPTIM: dict[str, tuple[str, str]] = {
    "adamw_torch": ("adamw_torch", "torch.optim.AdamW"),
    "adamw_torch_fused": ("adamw_torch", "torch.optim.AdamW(fused=True): the same two moments"),
    "adamw_8bit": ("adamw_8bit", "bitsandbytes AdamW(optim_bits=8)"),
    "adamw_bnb_8bit": ("adamw_8bit", "bitsandbytes AdamW(optim_bits=8)"),
    "paged_adamw_8bit": ("adamw_8bit", "bitsandbytes AdamW(optim_bits=8, is_paged=True)"),
    "adafactor": ("adafactor", "transformers Adafactor (no first moment)"),
    "sgd": ("sgd", "torch.optim.SGD (momentum 0: no state)"),
    "lion_32bit": ("lion_32bit", "bitsandbytes Lion(optim_bits=32)"),
    "paged_lion_32bit": ("lion_32bit", "bitsandbytes Lion(optim_bits=32, is_paged=True)"),
    "lion_8bit": ("lion_8bit", "bitsandbytes Lion(optim_bits=8)"),
    "paged_lion_8bit": ("lion_8bit", "bitsandbytes Lion(optim_bits=8, is_paged=True)"),
}
#: paged bitsandbytes optimizers keep their states in CUDA unified memory (bitsandbytes GlobalPageManager,
#: cudaMallocManaged): on the device until memory runs short, then paged to the host by the driver
PAGED_NOTE = ("a paged bitsandbytes optimizer: its states are in CUDA unified memory, on the device until it "
              "runs short, then evicted to the host page by page; memform counts them on the device (the "
              "peak before any eviction)")

#: fields of TRL's preference / RL trainers (trl/trainer/*_config.py): a step that generates, scores or
#: keeps a reference model is not one supervised step
OTHER_TRAINERS: dict[str, str] = {
    "num_generations": "GRPO (GRPOConfig)", "max_completion_length": "GRPO / online DPO / RLOO",
    "max_prompt_length": "DPO / ORPO / KTO / GRPO", "use_vllm": "GRPO / online DPO", "reward_weights": "GRPO",
    "ref_model_sync_steps": "DPO / GRPO", "precompute_ref_log_probs": "DPO / KTO", "rpo_alpha": "DPO",
    "desirable_weight": "KTO", "num_ppo_epochs": "PPO", "kl_coef": "PPO / RLOO",
}

#: fields that change memory in a way the hf-trainer profile does not model, at any value but these
MUST_BE: dict[str, tuple[tuple[Any, ...], str]] = {
    "deepspeed": ((None, "", {}), "the Trainer hands the step to DeepSpeed: import that ds_config with `memform "
                                  "import deepspeed DS_CONFIG --model config.json` (training.framework: deepspeed)"),
    "torch_compile": ((None, False), "torch.compile fuses kernels and changes what the forward saves; the "
                                     "hf-trainer profile sizes eager PyTorch"),
    "torchdynamo": ((None, ""), "a torch.compile backend (see torch_compile)"),
    "use_liger_kernel": ((None, False), "Liger kernels (fused RMSNorm, SwiGLU, linear + cross-entropy) keep "
                                        "other tensors than transformers' eager modules"),
    "use_liger": ((None, False), "Liger kernels (see use_liger_kernel)"),
    "label_smoothing_factor": ((None, 0, 0.0), "the Trainer's LabelSmoother keeps its own fp32 log-softmax of "
                                               "the logits"),
    "neftune_noise_alpha": ((None,), "NEFTune adds a noise tensor to every embedding output"),
    "tp_size": ((None, 0, 1), "tensor parallelism through transformers' tp_plan"),
    "parallelism_config": ((None, {}), "accelerate ParallelismConfig (tp / cp / dp shard sizes)"),
    "optim_target_modules": ((None, [], ""), "GaLore / APOLLO projections of the named modules"),
    "optim_args": ((None, ""), "optimizer arguments (e.g. Adafactor's beta1, which adds a first moment)"),
    "load_in_8bit": ((None, False), "an 8-bit (LLM.int8) base, which finetune.mf does not size"),
    "use_dora": ((None, False), "DoRA adds a magnitude vector per adapted matrix"),
    "lora_modules_to_save": ((None, []), "modules trained in full beside the adapters"),
    "lora_target_parameters": ((None, []), "adapters on parameters (MoE experts) rather than modules"),
    "model_init_kwargs": ((None, {}), "from_pretrained keyword arguments (give the dtype as dtype: instead)"),
}

_EVAL = "evaluation runs between optimizer steps, under no_grad"
_LOG = "logging, saving, hub, reporting or run bookkeeping"
_SCHED = "a learning-rate, schedule or loss-scale value: a scalar, no tensor"
_DATA = "data loading on the host (the batch shape is per_device_train_batch_size × the row length)"
_RUNTIME = "a runtime or launcher value that to_json_string writes (device placement, process state)"
_KERNEL = "a numerics or kernel switch that keeps the same tensors"
_MODEL = "which checkpoint is loaded (its config.json is the model memform reads)"
NEUTRAL: dict[str, str] = {
    **dict.fromkeys(("per_device_eval_batch_size", "per_gpu_eval_batch_size", "eval_accumulation_steps",
                     "eval_delay", "eval_steps", "eval_strategy", "evaluation_strategy", "do_eval", "do_predict",
                     "eval_do_concat_batches", "eval_on_start", "eval_use_gather_object", "batch_eval_metrics",
                     "prediction_loss_only", "bf16_full_eval", "fp16_full_eval", "jit_mode_eval",
                     "include_inputs_for_metrics", "include_for_metrics", "metric_for_best_model",
                     "greater_is_better", "load_best_model_at_end", "predict_with_generate",
                     "generation_max_length", "generation_num_beams", "generation_config", "sortish_sampler",
                     "use_legacy_prediction_loop", "past_index", "label_names", "eval_packing"), _EVAL),
    **dict.fromkeys(("output_dir", "overwrite_output_dir", "do_train", "logging_dir", "logging_strategy",
                     "logging_first_step", "logging_steps", "logging_nan_inf_filter", "log_level",
                     "log_level_replica", "log_on_each_node", "save_strategy", "save_steps", "save_total_limit",
                     "save_safetensors", "save_on_each_node", "save_only_model", "run_name", "report_to",
                     "push_to_hub", "hub_model_id", "hub_strategy", "hub_token", "hub_private_repo",
                     "hub_always_push", "hub_revision", "push_to_hub_model_id", "push_to_hub_organization",
                     "push_to_hub_token", "resume_from_checkpoint", "restore_callback_states_from_checkpoint",
                     "ignore_data_skip", "disable_tqdm", "skip_memory_metrics", "include_tokens_per_second",
                     "include_num_input_tokens_seen", "ray_scope", "trackio_space_id", "project",
                     "liger_kernel_config", "log_completions", "enable_jit_checkpoint", "save_steps_frequency",
                     "model_revision", "trust_remote_code", "lora_task_type", "seed", "data_seed",
                     "full_determinism", "hub_model_revision", "wandb_entity", "wandb_project",
                     "wandb_run_group"), _LOG),
    **dict.fromkeys(("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "num_train_epochs",
                     "max_steps", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_ratio", "warmup_steps",
                     "lora_alpha", "use_rslora", "average_tokens_across_devices", "loss_type"), _SCHED),
    **dict.fromkeys(("dataloader_drop_last", "dataloader_num_workers", "dataloader_prefetch_factor",
                     "dataloader_pin_memory", "dataloader_persistent_workers", "group_by_length",
                     "length_column_name", "remove_unused_columns", "dataset_text_field", "dataset_kwargs",
                     "dataset_num_proc", "dataset_batch_size", "dataset_mixture", "dataset_name", "dataset_config",
                     "dataset_train_split", "dataset_test_split", "dataset_streaming", "chat_template",
                     "chat_template_path", "completion_only_loss", "assistant_only_loss", "eos_token", "pad_token",
                     "packing", "packing_strategy", "pad_to_multiple_of", "shuffle_dataset", "train_sampler_random",
                     "accelerator_config", "dispatch_batches", "split_batches", "ignore_bias_buffers"), _DATA),
    **dict.fromkeys(("local_rank", "_n_gpu", "distributed_state", "__cached__setup_devices", "deepspeed_plugin",
                     "no_cuda", "use_cpu", "use_mps_device", "use_ipex", "tpu_num_cores", "tpu_metrics_debug",
                     "ddp_backend", "ddp_timeout", "ddp_find_unused_parameters", "ddp_bucket_cap_mb",
                     "ddp_broadcast_buffers", "mp_parameters", "debug", "fsdp_min_num_params",
                     "fsdp_transformer_layer_cls_to_wrap", "torch_compile_backend",
                     "torch_compile_mode", "auto_find_batch_size", "torch_empty_cache_steps"), _RUNTIME),
    **dict.fromkeys(("tf32", "fp16_opt_level", "half_precision_backend", "fp16_backend", "use_bnb_nested_quant",
                     "bnb_4bit_quant_type", "bnb_4bit_quant_storage"), _KERNEL),
    **dict.fromkeys(("trackio_bucket_id", "trackio_static_space_id", "dataloader_multiprocessing_context",
                     "dataloader_in_order", "train_sampling_strategy"), _DATA),
    "ddp_static_graph": "DDP's static-graph optimisation: the same gradient buckets",
    "use_cache": "the KV cache the forward returns: dropped before backward (Trainer.compute_loss keeps the loss)",
    "model_name_or_path": _MODEL,
    "padding_free": "flash attention over one packed row of the batch's tokens: at most b × max_length tokens",
}
#: memform's LoRA target keys when TRL's lora_target_modules is null: PEFT's per-model default
#: (peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING: q_proj and v_proj for the
#: Llama family), which are lora.q_proj / lora.v_proj's own defaults (formulas/common.mf)
PEFT_DEFAULT_QV = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "qwen2_moe",
                   "qwen3_moe")


def read(path: Path) -> dict:
    """The arguments file: JSON (training_args.json) or YAML (a TRL recipe), by its content."""
    if path.suffix.lower() in (".yaml", ".yml"):
        data = load_yaml(path, "training arguments YAML")
        if not isinstance(data, dict):
            raise MemformError(f"{path}: training arguments must be a YAML mapping, got {describe(data)}")
        return data
    return read_json(path, "training_args.json")


def convert(path: Path, draft: Draft, given: set[str] | dict, *, adapter: bool = False) -> None:
    """Set ``draft``'s hf-trainer keys from the training arguments at ``path`` (``adapter``: a PEFT
    adapter_config.json was given too, with ``--adapter``)."""
    args = Fields(read(path), path)
    for key, kind in OTHER_TRAINERS.items():
        if args.has(key):
            raise args.error(key, f"is set: this is a TRL {kind} configuration. memform sizes one supervised "
                                  f"training step (Trainer / SFTTrainer); preference and RL trainers also keep a "
                                  f"reference model or generate and score completions, which it does not model")
    _deepspeed(args, draft, path)
    for key, (allowed, why) in MUST_BE.items():
        value = args.raw(key)
        if value not in allowed:
            raise args.error(key, f"is {json.dumps(value)}: {why}. memform cannot size this job with the hf-trainer "
                                  f"profile, so it refuses the file rather than estimate a different step")
    draft.set("training.framework", "hf-trainer", "the Hugging Face Trainer (formulas/frameworks/hf-trainer.mf)")
    _batch(args, draft)
    _precision(args, draft)
    _optimizer(args, draft)
    _checkpointing(args, draft)
    clip = args.number("max_grad_norm", 1.0)    # TrainingArguments default 1.0
    draft.set("training.grad_clip", clip > 0, f"max_grad_norm {clip} (clip_grad_norm_: in place)")
    attn = args.string("attn_implementation", None)
    if attn is not None:
        draft.set("model.flash_attention", attn != "eager",
                  f"attn_implementation {attn}" + ("" if attn == "eager" else ": no a·s² scores kept"))
    _seq(args, draft, given)
    _peft(args, draft, adapter)
    _fsdp(args, draft, path, adapter)
    draft.refuse_unused(args, NEUTRAL)


def _deepspeed(args: Fields, draft: Draft, path: Path) -> None:
    """A job that hands the step to DeepSpeed (TrainingArguments deepspeed: a ds_config path or dict) is the
    deepspeed profile's: refused here with the command that imports it (`memform import deepspeed` with
    --trainer fills the ds_config's "auto" values from these arguments: fill_deepspeed_auto below)."""
    value = args.raw("deepspeed")
    if value in (None, "", {}):
        return
    if isinstance(value, str):
        found = [p for p in (path.parent / value, Path(value)) if p.is_file()]
        ds = str(found[0]) if found else value
    else:
        ds = "DS_CONFIG.json (the 'deepspeed' mapping of this file, saved as JSON)"
    raise args.error("deepspeed", f"is {json.dumps(value)}: the Trainer hands the step to DeepSpeed, which memform "
                                  f"sizes with the deepspeed profile: run `memform import deepspeed {ds} --model "
                                  f"{draft.source} --trainer {path} --devices N` (the ds_config's \"auto\" values "
                                  f"are filled from these arguments, as the Trainer fills them)")


def _batch(args: Fields, draft: Draft) -> None:
    # TrainingArguments: per_gpu_train_batch_size (deprecated) wins when set (training_args.py
    # train_batch_size); per_device_train_batch_size defaults to 8
    key, micro = args.first(("per_gpu_train_batch_size", "per_device_train_batch_size"), args.integer)
    if key is None:
        draft.default("training.micro_batch_size", 8, "TrainingArguments per_device_train_batch_size default")
    else:
        draft.set("training.micro_batch_size", micro, key)
    steps = args.integer("gradient_accumulation_steps", 1)
    draft.set("training.num_micro_batches", steps, "gradient_accumulation_steps (.grad kept across them)")
    if args.raw("auto_find_batch_size") is True:
        draft.warn("auto_find_batch_size: the Trainer halves the batch after an out-of-memory error; memform "
                   f"sizes the batch the file states ({draft.get('training.micro_batch_size')})")


def _precision(args: Fields, draft: Draft) -> str:
    """training.precision.params and hf_trainer.amp; returns the parameters' dtype."""
    bf16 = args.boolean("bf16", False)
    fp16 = args.boolean("fp16", False)
    if bf16 and fp16:
        raise args.error("fp16", "and 'bf16' are both true: TrainingArguments refuses that (pick one)")
    key, dtype = args.alias(("dtype", "torch_dtype"), args.string)
    if dtype is not None and dtype != "auto":
        params = dtype_name(dtype, args, key)
        draft.set("training.precision.params", params, f"{key} {dtype} (from_pretrained dtype)")
    else:
        params = _checkpoint_dtype(draft)
    amp = "bf16" if bf16 else ("fp16" if fp16 else "none")
    if amp != "none" and params != "fp32":
        # autocast over 16-bit weights: the GEMMs run in the weights' dtype already, no weight copies are made
        # (hf-trainer.mf models autocast over fp32 weights: its casts and fp32 residual stream)
        draft.set("hf_trainer.amp", "none", f"{amp} true over a {params} model: autocast casts nothing "
                                            f"(the weights are {params})")
        if amp == "fp16" and params == "bf16":
            draft.warn("fp16 true over a bf16 model: sized as a bf16 step (autocast to fp16 of bf16 weights "
                       "is not modelled)")
    else:
        draft.set("hf_trainer.amp", amp, "bf16 / fp16 (torch.autocast)" if amp != "none" else "bf16 / fp16 false")
    return params


def _checkpoint_dtype(draft: Draft) -> str:
    """The load dtype when the arguments do not say: transformers 5's from_pretrained dtype 'auto' loads
    the checkpoint's own dtype (modeling_utils.py from_pretrained: dtype None -> "auto"), config.json's
    dtype / torch_dtype."""
    try:
        data = read_json(Path(draft.source))
    except MemformError:
        data = {}
    stored = data.get("dtype") or data.get("torch_dtype")
    if not isinstance(stored, str):
        draft.default("training.precision.params", "fp32", "no dtype in the arguments or config.json: fp32")
        return "fp32"
    params = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(stored.removeprefix("torch."), "fp32")
    draft.default("training.precision.params", params,
                  f"the checkpoint's dtype {stored} (config.json), what from_pretrained loads in transformers 5")
    draft.warn(f"the training arguments do not say the dtype the model is loaded in: taken as config.json's "
               f"{stored} (from_pretrained dtype='auto', transformers 5); transformers 4 loads fp32 unless the "
               f"script passes torch_dtype: then pass --set training.precision.params=fp32")
    return params


def _optimizer(args: Fields, draft: Draft) -> None:
    name = args.string("optim", "adamw_torch")
    if args.raw("adafactor") is True:       # the deprecated switch (training_args.py: optim = adafactor)
        name = "adafactor"
    if name not in OPTIM:
        raise args.error("optim", f"is {name!r}: the hf-trainer profile sizes {', '.join(sorted(OPTIM))} "
                                  f"(the optimizers whose states it counts, measured by bench/validate.py "
                                  f"--frameworks --only optim=); another optimizer's states are not modelled")
    optim, what = OPTIM[name]
    draft.set("hf_trainer.optim", optim, f"optim {name}: {what}")
    if name.startswith("paged_"):
        draft.warn(f"optim {name}: {PAGED_NOTE}")


def _checkpointing(args: Fields, draft: Draft) -> None:
    # transformers 5: activation_checkpointing, with gradient_checkpointing its deprecated alias (training_args.py
    # __post_init__ copies one to the other; to_json_string writes both)
    same = "activation_checkpointing and gradient_checkpointing are one setting (transformers 5) and disagree"
    key, on = args.alias(("activation_checkpointing", "gradient_checkpointing"), args.boolean, same)
    on = bool(on)
    draft.set("training.recompute", "full" if on else "none",
              f"{key}: torch.utils.checkpoint per decoder layer" if on else f"{key or 'gradient_checkpointing'} false")
    _, kwargs = args.alias(("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"), args.raw, same)
    if on and isinstance(kwargs, dict) and kwargs.get("use_reentrant") is True:
        draft.warn("gradient_checkpointing_kwargs use_reentrant true: sized as the non-reentrant checkpoint "
                   "(the same saved layer inputs; bench/validate.py --frameworks measures the non-reentrant one)")
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    if on and kwargs.get("every_n_layers", 1) not in (1, None):
        raise args.error("activation_checkpointing_kwargs", f"every_n_layers {kwargs['every_n_layers']!r} "
                         "checkpoints every n-th decoder only (transformers 5.25 activation_checkpointing_enable), "
                         "which the hf-trainer profile does not model: 1 (every decoder) only")
    # TRL's activation_offloading (SFTConfig; trl/models/activation_offloading.py): every saved tensor of the
    # model but the output head's in host memory; transformers' own offload kwarg: the checkpoints' inputs
    trl = args.boolean("activation_offloading", False)
    if trl:
        draft.set("training.activation_offload", "all",
                  "activation_offloading: TRL's OffloadActivations, every saved tensor but the head's to the host")
    elif kwargs.get("offload") is True:
        if on:
            draft.set("training.activation_offload", "checkpoint",
                      "activation_checkpointing_kwargs offload: each checkpoint's input in pinned host memory "
                      "(torch save_on_cpu)")
        else:
            draft.warn("activation_checkpointing_kwargs offload has no effect without activation_checkpointing")


def _seq(args: Fields, draft: Draft, given) -> None:  # noqa: ANN001 - a mapping of --set keys
    """TRL's max_length (max_seq_length before TRL 0.20): the longest row, what a packed row holds."""
    key, length = args.alias(("max_length", "max_seq_length"), args.integer,
                             "TRL reads max_length (max_seq_length is its former name)")
    if key is None or "model.seq_length" in given:
        return
    draft.set("model.seq_length", length, f"{key} (rows padded or packed up to it: the step's largest)")
    # the model importer's training-length default (also as `memform import deepspeed` prefixes it)
    draft.warnings[:] = [w for w in draft.warnings if not (w.startswith("model.seq_length = ") or
                                                           ": model.seq_length = " in w and "is a default" in w)]


def _peft(args: Fields, draft: Draft, adapter: bool) -> None:
    """TRL ModelConfig: use_peft with lora_r / lora_dropout / lora_target_modules, load_in_4bit with
    bnb_4bit_quant_type / use_bnb_nested_quant (trl/trainer/utils.py get_peft_config, get_quantization_config)."""
    use_peft = args.boolean("use_peft", False)
    lora_fields = [k for k in ("lora_r", "lora_dropout", "lora_target_modules") if args.has(k)]
    if not use_peft:
        args.used.update(("lora_r", "lora_dropout", "lora_target_modules"))
        if lora_fields:
            draft.warn(f"{', '.join(lora_fields)} set but use_peft is false: TRL trains the whole model "
                       f"(get_peft_config returns None)")
    elif adapter:
        raise args.error("use_peft", "is true and --adapter gives an adapter_config.json too: give the LoRA "
                                     "settings once")
    else:
        from . import peft

        r = args.integer("lora_r", 16)                      # ModelConfig defaults: r 16, dropout 0.05
        draft.set("lora.rank", r, "lora_r" if args.has("lora_r") else "TRL ModelConfig lora_r default")
        draft.set("lora.dropout", float(args.number("lora_dropout", 0.05)), "lora_dropout")
        targets = args.raw("lora_target_modules")
        if targets is None:
            model_type = _model_type(draft)
            if model_type not in PEFT_DEFAULT_QV:
                raise args.missing("lora_target_modules", f" (PEFT's default targets for model_type "
                                                          f"{model_type!r} are not read: name the modules)")
            draft.warn("lora_target_modules not set: PEFT's default for this model type, q_proj and v_proj")
            targets = ["q_proj", "v_proj"]
        on = peft._targets(Fields({"target_modules": targets}, args.file, args.where))
        for key in peft.TARGETS:
            draft.set(f"lora.{key}", key in on, "lora_target_modules")
    if args.boolean("load_in_4bit", False):
        if not use_peft and not adapter:
            raise args.error("load_in_4bit", "is true without LoRA (use_peft, or --adapter): a 4-bit base is "
                                             "frozen, transformers refuses to train it alone")
        kind = args.string("bnb_4bit_quant_type", "nf4")
        if kind not in ("nf4", "fp4"):
            raise args.error("bnb_4bit_quant_type", f"is {kind!r}: bitsandbytes 4-bit types are nf4 and fp4")
        draft.set("lora.base_quant", kind, "load_in_4bit, bnb_4bit_quant_type (TRL default nf4)")
        draft.set("lora.double_quant", args.boolean("use_bnb_nested_quant", False), "use_bnb_nested_quant")
        # TRL's BitsAndBytesConfig: bnb_4bit_compute_dtype = the model dtype; quant_storage = it too, the
        # same packed bytes in a 16-bit view
        draft.set("lora.compute_dtype", draft.get("training.precision.params", "fp32"),
                  "bnb_4bit_compute_dtype = dtype (TRL get_quantization_config)")


def _model_type(draft: Draft) -> str:
    try:
        data = read_json(Path(draft.source))
    except MemformError:
        return ""
    kind = data.get("model_type")
    return kind if isinstance(kind, str) else ""


# ---- FSDP (TrainingArguments fsdp / fsdp_config) ----------------------------------------------------------
#: fsdp_config fields (after the "fsdp_" prefix transformers strips: training_args.py _process_fsdp_args) that
#: cannot change device memory under FSDP2, with the reason
FSDP_NEUTRAL: dict[str, str] = {
    "cpu_ram_efficient_loading": "how the checkpoint is loaded (rank 0 reads it, the others start on the meta "
                                 "device): the sharded model trained is the same",
    "state_dict_type": "how checkpoints are saved, between steps",
    "min_num_params": "read only with auto_wrap_policy SIZE_BASED_WRAP",
    # transformers' _process_fsdp_args passes these to accelerate only for fsdp_config version 1
    "sync_module_states": "FSDP1: rank 0's weights broadcast once at wrap time (not read for version 2)",
    "forward_prefetch": "FSDP1 only (not read for version 2)",
    "backward_prefetch": "FSDP1 only (not read for version 2)",
    "use_orig_params": "FSDP1 only (FSDP2 keeps per-parameter DTensor shards, the original parameters)",
    "limit_all_gathers": "FSDP1 only (not read for version 2)",
    "xla_fsdp_v2": "read only with xla true", "xla_fsdp_grad_ckpt": "read only with xla true",
    "xla_fsdp_settings": "read only with xla true",
}
#: decoder-only model types whose transformers classes the hf-trainer profile is measured on and whose
#: decoder layers are accelerate's TRANSFORMER_BASED_WRAP units (LlamaDecoderLayer, Qwen3DecoderLayer, ...)
FSDP_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def _fsdp_items(args: Fields) -> tuple[bool, list[str]]:
    """Whether FSDP is on, and the legacy option words of a string / list ``fsdp`` (training_args.py
    _apply_legacy_fsdp_to_config)."""
    value = args.raw("fsdp")
    if value in (None, False, "", []):
        return False, []
    if value is True:
        return True, []
    if isinstance(value, str):
        return True, value.split()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return True, list(value)
    raise args.error("fsdp", f"must be true, an option string or a list of options, got {describe(value)}")


def _fsdp(args: Fields, draft: Draft, path: Path, adapter: bool) -> None:
    """TrainingArguments fsdp + fsdp_config -> training.framework: hf-fsdp2 (formulas/frameworks/hf-fsdp2.mf),
    as transformers 5.25's TrainingArguments._process_fsdp_args builds accelerate's FSDP plugin and
    accelerate 1.16's fsdp2_prepare_model / fsdp2_apply_ac apply it; with fsdp_config version 1 hf-fsdp1
    (frameworks/hf-fsdp1.mf: accelerate's FullyShardedDataParallel call, _fsdp1); what they do otherwise is
    refused."""
    on, items = _fsdp_items(args)
    raw = args.raw("fsdp_config")
    if not on:
        if raw not in (None, {}, ""):
            draft.warn("fsdp_config is set but fsdp is off: the Trainer ignores it (_process_fsdp_args)")
        return
    conf = _fsdp_config(args, raw, path)
    version = conf.integer("version", 2)
    if version not in (1, 2):
        raise conf.error("version", f"is {version}: transformers' FSDP versions are 1 (FullyShardedDataParallel, "
                                    f"the hf-fsdp1 profile) and 2 (fully_shard, the hf-fsdp2 profile)")
    if version == 1:
        _fsdp1_words(conf, draft, items)
    raf, offload = True, False
    for item in items:                  # _apply_legacy_fsdp_to_config: fsdp_config's own values win (setdefault)
        if version == 1 and item in FSDP1_STRATEGIES:
            continue                    # (FSDP1: the strategy's name, read by _fsdp1_words)
        if item == "full_shard":
            raf = True
        elif item == "shard_grad_op":
            raf = False
        elif item == "offload":
            offload = True
        elif item != "auto_wrap":
            raise args.error("fsdp", f"holds {item!r}: with fsdp_config version 2 transformers accepts full_shard, "
                                     f"shard_grad_op, offload and auto_wrap (hybrid_shard / no_shard are FSDP1's)")
    if version == 2:
        raf = conf.boolean("reshard_after_forward", raf)
    offload = conf.boolean("cpu_offload", offload)
    if conf.boolean("xla", False):
        raise conf.error("xla", "is true: torch_xla's FSDP is not modelled")
    policy = conf.string("auto_wrap_policy", "TRANSFORMER_BASED_WRAP")
    if policy != "TRANSFORMER_BASED_WRAP":
        raise conf.error("auto_wrap_policy", f"is {policy!r}: memform's FSDP units are the decoder layers "
                                             f"(TRANSFORMER_BASED_WRAP); size-based or no wrapping makes other units")
    wrap = conf.raw("transformer_layer_cls_to_wrap")
    names = [wrap] if isinstance(wrap, str) else wrap
    if names is not None and (not isinstance(names, list) or len(names) != 1
                              or not str(names[0]).endswith("DecoderLayer")):
        raise conf.error("transformer_layer_cls_to_wrap", f"is {wrap!r}: memform's FSDP units are the decoder layers "
                                                          f"(one class, e.g. LlamaDecoderLayer, the model's "
                                                          f"_no_split_modules default)")
    model_type = _model_type(draft)
    if model_type not in FSDP_MODEL_TYPES:
        raise args.error("fsdp", f"is on for a {model_type or 'unknown'!r} model: the hf-fsdp{version} profile is measured "
                                 f"on dense decoder-only models ({', '.join(FSDP_MODEL_TYPES)})")
    if draft.get("model.tied_embeddings"):
        raise args.error("fsdp", "is on for a model with tied embeddings: accelerate puts the shared embedding in the "
                                 "root unit (FSDP1) or "
                                 "[final norm, lm_head] unit, kept gathered through the step, which is not modelled")
    if adapter or draft.get("lora.rank", 0):
        raise args.error("fsdp", f"is on with LoRA adapters: PEFT under FSDP{version} is not modelled (hf-fsdp{version})")
    if draft.get("hf_trainer.optim") != "adamw_torch":
        raise args.error("optim", f"is {args.raw('optim')!r} with fsdp: the hf-fsdp{version} profile models torch "
                                  f"AdamW over the FSDP{version} shards only")
    for key in ("offload_params", "activation_checkpointing_offload"):
        if conf.has(key):
            # accelerate's own spellings (its config file, FullyShardedDataParallelPlugin): transformers 5.25's
            # _process_fsdp_args reads cpu_offload and activation_checkpointing only, so the Trainer drops these
            conf.raw(key)
            draft.warn(f"fsdp_config {key}: not read by the Trainer (transformers' _process_fsdp_args passes "
                       f"cpu_offload and activation_checkpointing to accelerate, not {key}): no effect, sized without it")
    ac = conf.boolean("activation_checkpointing", False)
    if ac and draft.get("training.recompute") == "full":
        raise conf.error("activation_checkpointing", "and the activation_checkpointing (gradient_checkpointing) "
                                                     "training argument are both true: the Trainer refuses that")
    if ac and args.raw("use_cache") is True:
        # the Trainer sets config.use_cache = args.use_cache (trainer.py:646); under checkpoint_wrapper the
        # model does not know it is checkpointed, builds its DynamicCache, and the checkpoint's saved
        # arguments hold it (every layer's K and V) until backward
        raise args.error("use_cache", "is true with fsdp_config activation_checkpointing: every layer's KV cache is "
                                      "held by the checkpoints until backward, which is not modelled")
    if version == 1:
        _fsdp1(conf, draft, offload)
    draft.refuse_unused(conf, FSDP_NEUTRAL)
    if version == 2:
        draft.set("training.framework", "hf-fsdp2", "fsdp: the Trainer's FSDP2 through accelerate (formulas/"
                                                    "frameworks/hf-fsdp2.mf)")
        draft.set("fsdp2.reshard_after_forward", raf, "fsdp_config reshard_after_forward (full_shard: true, "
                                                      "shard_grad_op: false)")
        draft.set("fsdp2.cpu_offload", offload, "fsdp_config cpu_offload (CPUOffloadPolicy)")
    # trainer.py _inner_training_loop runs every micro-batch but the last under accelerator.no_sync
    # (FSDP2: set_requires_gradient_sync(False)) unless accelerator_config gradient_accumulation_kwargs
    # sync_each_batch: FSDP2 then keeps the unsharded gradients (in reduce_dtype) across the micro-batches
    accel = args.raw("accelerator_config")
    kwargs = (accel.get("gradient_accumulation_kwargs") or {}) if isinstance(accel, dict) else {}
    sync_each = bool(kwargs.get("sync_each_batch", False)) if isinstance(kwargs, dict) else False
    draft.set("parallel.grad_accumulation_shard", sync_each,
              "accelerator_config gradient_accumulation_kwargs sync_each_batch: reduce-scatter every micro-batch"
              if sync_each else "the Trainer accumulates under accelerate's no_sync (set_requires_gradient_sync"
                                "(False)): unsharded gradients held across gradient_accumulation_steps")
    if ac:
        draft.set("training.recompute", "full", "fsdp_config activation_checkpointing: accelerate's "
                                                "checkpoint_wrapper per decoder layer (fsdp2_apply_ac)")
    amp = draft.get("hf_trainer.amp")
    mixed = "bf16" if args.raw("bf16") is True else ("fp16" if args.raw("fp16") is True else None)
    if mixed:
        # fsdp2_prepare_model upcasts every trainable parameter to fp32; set_mixed_precision: param_dtype =
        # reduce_dtype = the mixed dtype (accelerate utils/fsdp_utils.py, utils/dataclasses.py)
        why = f"{mixed} true with fsdp: accelerate's MixedPrecisionPolicy(param_dtype=reduce_dtype={mixed})"
        draft.set("training.precision.params", mixed, why + ": the gathered parameters")
        draft.set("training.precision.grads", mixed, why + ": the gradients' reduce-scatter")
        draft.set("training.precision.master_weights", True, f"{mixed} true with fsdp: fsdp2_prepare_model "
                                                              f"upcasts the trainable shards to fp32 (FSDP1: "
                                                              f"prepare_model upcasts 16-bit flat parameters)")
        draft.set("training.precision.optimizer", "fp32", "AdamW moments of the fp32 shards")
        draft.set("hf_trainer.amp", "none", f"{mixed} true with fsdp: autocast over {mixed} gathered weights "
                                            f"casts none of them")
    elif amp not in (None, "none"):
        draft.set("hf_trainer.amp", "none", "no mixed precision")


#: FSDP1's sharding strategies as transformers' legacy fsdp words and fsdp_config reshard_after_forward name
#: them (accelerate utils/constants.py FSDP_SHARDING_STRATEGY, lower case)
FSDP1_STRATEGIES = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2")
#: fsdp_config backward_prefetch (accelerate FSDP_BACKWARD_PREFETCH) -> fsdp1.backward_prefetch
FSDP1_PREFETCH = {"BACKWARD_PRE": "backward_pre", "BACKWARD_POST": "backward_post", "NO_PREFETCH": "none"}


def _fsdp1_words(conf: Fields, draft: Draft, items: list[str]) -> None:
    """FSDP1's sharding strategy as the Trainer hands it to accelerate, and what accelerate 1.16 makes of it.

    transformers 5.25 passes fsdp_config reshard_after_forward (or a legacy fsdp word, _apply_legacy_fsdp_to_config)
    to FullyShardedDataParallelPlugin(reshard_after_forward=<strategy name>); the plugin's __post_init__ first
    sets sharding_strategy from the launcher's FSDP_SHARDING_STRATEGY environment variable (default FULL_SHARD),
    and Accelerator.prepare_model calls FullyShardedDataParallel(sharding_strategy=plugin.sharding_strategy or
    plugin.reshard_after_forward): the Trainer's value is never the one applied (measured: bench/validate.py
    --frameworks --only hf-fsdp1, shard_grad_op given, full_shard run). Sized as FULL_SHARD, with a warning."""
    given = next((i for i in items if i in FSDP1_STRATEGIES), None)
    value = conf.raw("reshard_after_forward") if conf.has("reshard_after_forward") else given
    if value is None:
        return
    if isinstance(value, bool) or str(value).lower() in ("true", "false", "yes", "no", "1", "0"):
        raise conf.error("reshard_after_forward", f"is {value!r} with version 1: accelerate raises (FSDP1 takes a "
                                                  f"sharding strategy's name: {', '.join(FSDP1_STRATEGIES)})")
    name = str(value).lower()
    if name not in FSDP1_STRATEGIES:
        raise conf.error("reshard_after_forward", f"is {value!r}: FSDP1's sharding strategies are "
                                                  f"{', '.join(FSDP1_STRATEGIES)}")
    if name != "full_shard":
        where = "fsdp_config reshard_after_forward" if conf.has("reshard_after_forward") else f"fsdp {given!r}"
        draft.warn(f"{where} is {name}: accelerate 1.16 does not apply it under the Trainer (the plugin's "
                   f"sharding_strategy, from the launcher's FSDP_SHARDING_STRATEGY, default FULL_SHARD, wins in "
                   f"prepare_model): sized as full_shard -- if your launcher sets FSDP_SHARDING_STRATEGY, set "
                   f"fsdp1.sharding_strategy to it (--set fsdp1.sharding_strategy=NAME: full_shard, shard_grad_op, "
                   f"no_shard, hybrid_shard, hybrid_shard_zero2; HSDP shards within a node's "
                   f"device.devices_per_node ranks)")


def _fsdp1(conf: Fields, draft: Draft, offload: bool) -> None:
    """fsdp_config version 1 -> training.framework: hf-fsdp1 (formulas/frameworks/hf-fsdp1.mf): the keyword
    arguments transformers 5.25's _process_fsdp_args gives accelerate's plugin for FSDP1, with their defaults
    there (backward_prefetch NO_PREFETCH, use_orig_params true, forward_prefetch false; limit_all_gathers: the
    plugin's default true). The sharding strategy is the launcher's (_fsdp1_words)."""
    prefetch = conf.string("backward_prefetch", "NO_PREFETCH").upper()
    if prefetch not in FSDP1_PREFETCH:
        raise conf.error("backward_prefetch", f"is {prefetch!r}: accelerate takes {', '.join(FSDP1_PREFETCH)}")
    limit = conf.boolean("limit_all_gathers", True)
    if not limit:
        raise conf.error("limit_all_gathers", "is false: without FSDP1's rate limiter the CPU thread issues all-gathers "
                                              "ahead of the GPU without bound, so how many units are unsharded at once "
                                              "is not a formula of the model (not modelled)")
    draft.set("training.framework", "hf-fsdp1", "fsdp_config version 1: the Trainer's FSDP1 through accelerate "
                                                "(formulas/frameworks/hf-fsdp1.mf)")
    draft.set("fsdp1.sharding_strategy", "full_shard", "accelerate's plugin sharding_strategy (FSDP_SHARDING_STRATEGY, "
                                                       "default FULL_SHARD) wins over fsdp_config reshard_after_forward")
    draft.set("fsdp1.backward_prefetch", FSDP1_PREFETCH[prefetch], f"fsdp_config backward_prefetch {prefetch}")
    draft.set("fsdp1.forward_prefetch", conf.boolean("forward_prefetch", False),
              "fsdp_config forward_prefetch (the Trainer's default false)")
    draft.set("fsdp1.use_orig_params", conf.boolean("use_orig_params", True), "fsdp_config use_orig_params "
                                                                               "(transformers' default true)")
    draft.set("fsdp1.limit_all_gathers", True, "fsdp_config limit_all_gathers (accelerate's default true)")
    draft.set("fsdp1.cpu_offload", offload, "fsdp_config cpu_offload (CPUOffload(offload_params=True))")


def _fsdp_config(args: Fields, raw: Any, path: Path) -> Fields:
    """fsdp_config: a mapping, or the path of a JSON file (relative to the arguments file, else as given),
    its keys without the "fsdp_" prefix, as _process_fsdp_args reads them."""
    where = args.file
    if isinstance(raw, str) and raw:
        found = [p for p in (path.parent / raw, Path(raw)) if p.is_file()]
        if not found:
            raise args.error("fsdp_config", f"names {raw!r}, which is not a file (relative to {path.parent} or "
                                            f"the current folder)")
        where = found[0]
        raw = read_json(where, "fsdp_config")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise args.error("fsdp_config", f"must be a mapping or a JSON file name, got {describe(raw)}")
    data = {(k[5:] if isinstance(k, str) and k.startswith("fsdp_") else k): v for k, v in raw.items()}
    return Fields(data, where, "fsdp_config." if where == args.file else "")


# ---- the Trainer running a ds_config (memform import deepspeed DS --model config.json --trainer ARGS) ------
def _fill(node: dict, key: str, value: Any, hf_key: str, filled: list[str], mismatches: list[str],
          must_match: bool = True) -> None:
    """HfTrainerDeepSpeedConfig.fill_match (transformers 5.25 integrations/deepspeed.py:110): an "auto" value
    becomes the Trainer's; any other must equal it (a mismatch is collected, and the Trainer raises)."""
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.get(part) if isinstance(node.get(part), dict) else None
        if node is None:
            return
    if node.get(leaf) == "auto":
        node[leaf] = value
        filled.append(f"{key} = {json.dumps(value)} ({hf_key})")
    elif must_match and node.get(leaf) is not None and node.get(leaf) != value:
        mismatches.append(f"ds {key}={json.dumps(node.get(leaf))} vs hf {hf_key}={json.dumps(value)}")


def fill_deepspeed_auto(args: Fields, data: dict, ds_path: Path, draft: Draft) -> dict:
    """The ds_config as the Trainer hands it to DeepSpeed: its "auto" values filled from the training
    arguments and the others checked against them, as HfTrainerDeepSpeedConfig.trainer_config_process does
    (transformers 5.25 integrations/deepspeed.py:138-194; the bucket sizes of trainer_config_finalize are
    the deepspeed importer's HF_AUTO). train_batch_size "auto" (world size × micro batch × accumulation) is
    left to the importer's batch triangle, which knows the world size from --devices. Also sets
    training.recompute from gradient_checkpointing (the Trainer calls gradient_checkpointing_enable)."""
    import copy

    for key, kind in OTHER_TRAINERS.items():
        if args.has(key):
            raise args.error(key, f"is set: this is a TRL {kind} configuration. memform sizes one supervised "
                                  f"training step (Trainer / SFTTrainer)")
    data = copy.deepcopy(data)
    _, micro = args.first(("per_gpu_train_batch_size", "per_device_train_batch_size"), args.integer)
    micro = 8 if micro is None else micro                          # TrainingArguments default
    steps = args.integer("gradient_accumulation_steps", 1)
    clip = args.number("max_grad_norm", 1.0)
    fp16 = args.boolean("fp16", False) or args.boolean("fp16_full_eval", False)
    bf16 = args.boolean("bf16", False) or args.boolean("bf16_full_eval", False)
    finding = not args.boolean("auto_find_batch_size", False)
    filled: list[str] = []
    mismatches: list[str] = []
    _fill(data, "train_micro_batch_size_per_gpu", micro, "per_device_train_batch_size", filled, mismatches, finding)
    _fill(data, "gradient_accumulation_steps", steps, "gradient_accumulation_steps", filled, mismatches)
    if data.get("train_batch_size") == "auto":
        del data["train_batch_size"]      # world size × micro × accumulation: the batch triangle (--devices)
        filled.append("train_batch_size = dp × micro batch × accumulation (world_size × per_device_train_batch_size "
                      "× gradient_accumulation_steps)")
    _fill(data, "gradient_clipping", clip, "max_grad_norm", filled, mismatches)
    for key, field_name, default in (("optimizer.params.lr", "learning_rate", 5e-5),
                                     ("optimizer.params.eps", "adam_epsilon", 1e-8),
                                     ("optimizer.params.weight_decay", "weight_decay", 0.0),
                                     ("scheduler.params.warmup_max_lr", "learning_rate", 5e-5)):
        _fill(data, key, args.number(field_name, default), field_name, filled, mismatches)
    _fill(data, "optimizer.params.betas", [args.number("adam_beta1", 0.9), args.number("adam_beta2", 0.999)],
          "adam_beta1+adam_beta2", filled, mismatches)
    _fill(data, "scheduler.params.warmup_min_lr", 0, "(not a Trainer argument)", filled, mismatches, False)
    _fill(data, "fp16.enabled", fp16, "fp16|fp16_full_eval", filled, mismatches)
    _fill(data, "bf16.enabled", bf16, "bf16|bf16_full_eval", filled, mismatches)
    if mismatches:
        raise MemformError(f"{args.file} and {ds_path} disagree, and the Trainer refuses to start "
                           f"(HfTrainerDeepSpeedConfig.trainer_config_finalize: \"Please correct the following DeepSpeed "
                           f"config values that mismatch TrainingArguments values\"): {'; '.join(mismatches)}")
    filled = [f for f in filled if not f.startswith(("optimizer.params", "scheduler.params"))] + (
        ["the optimizer / scheduler scalars"] if any(f.startswith(("optimizer.params", "scheduler.params"))
                                                     for f in filled) else [])
    if filled:
        draft.header.append(f'"auto" values of {ds_path.name} filled from {args.file.name} as the HF Trainer fills '
                            f"them (HfTrainerDeepSpeedConfig.trainer_config_process): " + "; ".join(filled))
    _checkpointing(args, draft)
    return data


def deepspeed_step(args: Fields, draft: Draft, given, *, has_optimizer: bool) -> None:  # noqa: ANN001
    """What the training arguments say of the step beyond the ds_config (after the deepspeed importer read
    it): the sequence length, the attention kernel, the optimizer the Trainer makes when the ds_config has
    none; fields that change the step in ways the deepspeed profile does not model are refused."""
    for key, (allowed, why) in MUST_BE.items():
        if key in ("deepspeed", "optim_args", "model_init_kwargs"):
            continue
        value = args.raw(key)
        if value not in allowed:
            raise args.error(key, f"is {json.dumps(value)}: {why}. memform cannot size this job, so it refuses the "
                                  f"file rather than estimate a different step")
    named = args.raw("deepspeed")
    if isinstance(named, str) and named and Path(named).name != draft.source.name:
        draft.warn(f"{args.file.name} names deepspeed {named!r}; the ds_config read is {draft.source.name}")
    if args.boolean("use_peft", False) or args.boolean("load_in_4bit", False):
        raise args.error("use_peft" if args.boolean("use_peft", False) else "load_in_4bit",
                         "is true: PEFT adapters / a 4-bit base under DeepSpeed are not modelled by the deepspeed profile")
    args.used.update(("lora_r", "lora_dropout", "lora_target_modules", "lora_alpha", "bnb_4bit_quant_type",
                      "use_bnb_nested_quant", "optim_args", "model_init_kwargs"))
    name = args.string("optim", "adamw_torch")
    if has_optimizer:
        if args.has("optim") and name not in ("adamw_torch", "adamw_torch_fused"):
            draft.warn(f"optim {name!r}: not used, the ds_config's optimizer section makes DeepSpeed's own "
                       f"(transformers integrations/deepspeed.py deepspeed_optim_sched)")
    elif name not in ("adamw_torch", "adamw_torch_fused") or args.raw("optim_args"):
        raise args.error("optim", f"is {name!r} and the ds_config has no optimizer section: DeepSpeed wraps the "
                                  f"Trainer's {name} optimizer, whose states the deepspeed profile does not count "
                                  f"(it counts Adam's two moments)")
    key, dtype = args.alias(("dtype", "torch_dtype"), args.string)
    loaded = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(str(dtype).removeprefix("torch."), dtype)
    if key is not None and loaded not in ("auto", draft.get("training.precision.params")):
        draft.warn(f"{key} {dtype}: DeepSpeed casts the model to the ds_config's precision "
                   f"({draft.get('training.precision.params')}; engine.py _configure_distributed_model)")
    attn = args.string("attn_implementation", None)
    if attn is not None:
        draft.set("model.flash_attention", attn != "eager",
                  f"attn_implementation {attn}" + ("" if attn == "eager" else ": no a·s² scores kept"))
    _seq(args, draft, given)
    for key in ("per_gpu_train_batch_size", "per_device_train_batch_size", "gradient_accumulation_steps",
                "max_grad_norm", "fp16", "bf16", "fp16_full_eval", "bf16_full_eval", "auto_find_batch_size",
                "learning_rate", "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay", "use_peft",
                "load_in_4bit", "adafactor", "fsdp", "fsdp_config"):
        args.used.add(key)
    if args.raw("fsdp") not in (None, False, "", []):
        raise args.error("fsdp", "is set with a ds_config: the Trainer runs either DeepSpeed or FSDP")
    draft.refuse_unused(args, NEUTRAL)
