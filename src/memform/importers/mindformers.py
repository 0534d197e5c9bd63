"""MindFormers training YAML → a memform config (model, MoE, parallel strategy, recompute, device).

MemEst users start from these files. Two layouts are read, told apart by ``use_legacy``
(mindformers/models/configuration_utils.py: ``config_args.get_value("use_legacy", True)``):

* the legacy one (``use_legacy`` absent or true; ``model.model_config.type`` LlamaConfig,
  DeepseekV3Config, TelechatConfig, ChatGLM2Config, ...) with MindFormers' own names (``num_heads``,
  ``n_kv_heads``, ``num_layers``, ``param_init_type``) and a top-level ``moe_config``;
* the current one (``use_legacy: False``; ``model_config.model_type`` qwen3, qwen3_moe, deepseek_v3,
  telechat3), a Hugging Face config plus MindFormers' TransformerConfig keys (``num_attention_heads``,
  ``num_hidden_layers``, ``params_dtype``, ``num_experts`` ... in ``model_config``).

Both spell a setting several ways; the spellings are MindFormers' own
(mindformers/parallel_core/transformer_config_utils.py ``COMMON_CONFIG_MAPPING``: e.g. num_heads /
num_attention_heads / n_head), and two spellings of one setting must agree. The strategy comes from
``parallel_config``, ``parallel`` (parallel optimizer, pipeline schedule), ``recompute_config``,
``runner_config`` and ``context.max_device_memory`` (MemEst's MindFormers parser reads the same:
reference notes ``memest-formulas.md`` §3.2-3.3). The config runs under the MindSpore framework profile
(``training.framework: mindspore``, ``formulas/frameworks/mindspore.mf``).

Every field is read, listed in a NEUTRAL table with the reason it cannot change device memory, or
refused (Draft.refuse_unused; ``--accept`` vouches for one); values memform cannot model (an optimizer
other than Adam, activation swap, auto-parallel strategy search, ...) are refused by name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from ..engine.config import load_yaml
from ..errors import MemformError
from .draft import Draft, Fields, describe, dtype_name

TITLE = "MindFormers YAML"


def _reasons(*groups: tuple[str, tuple[str, ...]]) -> dict[str, str]:
    """{field: why it cannot change device memory} from (reason, fields) groups."""
    return {key: why for why, keys in groups for key in keys}


#: top-level fields that do not describe what a device holds
NEUTRAL_TOP = _reasons(
    ("run bookkeeping: seeds, paths, modes, checkpoint loading/saving and conversion",
     ("seed", "output_dir", "run_mode", "load_checkpoint", "load_ckpt_format", "src_strategy_path_or_dir",
      "src_strategy_path", "auto_trans_ckpt", "only_save_strategy", "resume_training", "use_parallel", "trainer",
      "remove_redundancy", "load_ckpt_async", "use_graceful_exit", "remote_save_url", "transform_process_num",
      "ignore_data_skip", "data_skip_steps", "local_rank", "device_num", "exclude_cann_cpu", "use_legacy",
      "balanced_load", "stop_step", "train_precision_sync", "infer_precision_sync", "postprocess_use_numpy",
      "print_separate_loss", "check_for_nan_in_loss_and_grad", "register_path")),
    ("data loading and evaluation (host-side pipelines; the device batch is runner_config.batch_size)",
     ("train_dataset", "train_dataset_task", "eval_dataset", "eval_dataset_task", "do_eval", "infer",
      "eval_step_interval", "eval_epoch_interval", "processor", "metric", "eval_callbacks")),
    ("learning-rate schedules and their scaling: scalars",
     ("lr_schedule", "grouped_lr_schedule", "layer_scale", "layer_decay", "lr_scale", "lr_scale_factor")),
    ("callbacks, monitors, profiling and autotuning: host-side logging",
     ("callbacks", "monitor_config", "tensorboard", "profile", "profile_start_step", "profile_stop_step",
      "profile_communication", "profile_memory", "profiler_level", "init_start_profile", "profile_rank_ids",
      "profile_pipeline", "mstx", "auto_tune", "filepath_prefix", "autotune_per_step")),
    ("the train-step cell (runner_wrapper: loss scale, in-place gradient clipping), built on the "
     "gradients memform counts", ("runner_wrapper",)),
)
#: model_config fields that move no training memory, or that inference alone reads (both layouts)
NEUTRAL_MODEL = _reasons(
    ("names and registration", ("type", "model_type", "architectures", "auto_register", "auto_map", "model_name",
                                "net_name", "checkpoint_name_or_path", "name_or_path", "_name_or_path",
                                "transformers_version", "mindformers_version", "torch_dtype")),
    ("the step's batch is runner_config.batch_size (base_trainer.py feeds it); model_config.batch_size sizes "
     "the legacy attention-mask bookkeeping and predict()", ("batch_size",)),
    ("token ids and the loss mask: scalars", ("pad_token_id", "bos_token_id", "eos_token_id", "ignore_token_id",
                                              "eod_reset", "use_eod_reset")),
    ("generation and inference only (the KV cache, decoding, paged attention)",
     ("use_past", "is_dynamic", "repetition_penalty", "max_decode_length", "top_k", "top_p", "do_sample",
      "block_size", "num_blocks", "use_past_shard", "parallel_decoding_params", "use_cache", "temperature",
      "quantization_bit", "quantization_config", "pre_seq_len", "prefix_projection", "use_fused_mla")),
    ("position limits and rotary frequencies: RoPE has no weights, and its cos/sin tables are s × head_dim",
     ("max_position_embeddings", "max_position_embedding", "original_max_position_embeddings", "rope_theta",
      "theta", "rotary_base", "rotary_emb_base", "scaling_factor", "rotary_scaling_factor", "rope_scaling",
      "use_rope_scaling", "rope_ratio", "rotary_pct", "rotary_percent", "partial_rotary_factor", "beta_fast",
      "beta_slow", "mscale", "mscale_all_dim", "rotary_dtype", "rotary_cos_format", "rotary_interleaved",
      "use_rope_slice", "use_rope_self_define", "pretrain_seqlen", "rotary_seq_len_interpolation_factor")),
    ("weight initialisation: the values, not the sizes", ("initializer_range", "init_method_std", "init_method",
                                                         "output_layer_init_method", "mean", "sigma",
                                                         "param_init_std_rules")),
    ("kernel choice and weight layout of the same tensors (fused RoPE/SwiGLU, concatenated QKV / gate-up "
     "projections, mask compression, sliced input signatures)",
     ("use_fused_rope", "apply_rope_fusion", "use_fused_swiglu", "bias_swiglu_fusion", "bias_dropout_fusion",
      "qkv_concat", "mlp_concat", "mla_qkv_concat", "use_contiguous_weight_layout_attention",
      "use_interleaved_weight_layout_mlp", "use_attn_mask_compression", "use_eod_attn_mask_compression",
      "input_sliced_sig", "compute_in_2d", "fine_grain_interleave", "input_layout", "sparse_mode",
      "use_flash_attention_2", "mask_func_type", "use_fallback", "layers_group", "fused_norm",
      "use_attention_mask", "apply_query_key_layer_scaling", "embedding_size", "kv_channels_dtype",
      "interleaved_qkv", "num_block",
      "disable_lazy_inline")),
    ("loss weighting and logging: scalars", ("mtp_loss_factor", "mtp_loss_scaling_factor", "return_extra_loss",
                                             "return_hidden_states", "print_separate_loss",
                                             "calculate_per_token_loss", "track_max_attention_logit")),
    ("the residual stream's add dtype in the legacy models: the sum is cast back to compute_dtype before the "
     "next norm (llama_transformer.py LLamaDecodeLayer, telechat_transformer.py: cast(h, ori_dtype)); the "
     "current layout does not read it (fp32_residual_connection is its switch)", ("residual_dtype", "res_dtype")),
    ("MoE routing, balancing and dispatch choices: the router's scores, aux losses and the expert bias buffer "
     "(one float per routed expert) are O(experts) per layer",
     ("routing_policy", "use_fused_ops_topkrouter", "topk_group", "n_group", "moe_router_num_groups",
      "moe_router_group_topk", "use_gating_sigmoid", "scoring_func", "moe_router_score_function", "topk_method",
      "aux_loss_types", "aux_loss_factors", "aux_loss_factor", "aux_loss_config", "z_loss_factor",
      "moe_z_loss_coeff", "router_aux_loss_coef", "moe_aux_loss_coeff", "moe_router_load_balancing_type",
      "balance_via_topk_bias", "moe_router_enable_expert_bias", "topk_bias_update_rate",
      "moe_router_bias_update_rate", "norm_topk_prob", "init_norm_topk_prob", "routed_scaling_factor",
      "moe_router_topk_scaling_factor", "moe_router_pre_softmax", "moe_router_fusion", "router_dense_type",
      "moe_router_dtype", "router_activation_type", "moe_token_drop_policy", "enable_sdrop",
      "moe_router_force_expert_balance", "use_force_load_balance", "moe_token_dispatcher_type",
      "use_allgather_dispatcher", "group_wise_a2a", "comp_comm_parallel", "comp_comm_parallel_degree",
      "use_fused_ops_permute", "moe_permute_fusion", "npu_nums_per_device", "expert_group_size",
      "max_router_load", "enable_deredundency", "enable_gmm_safe_tokens", "use_pad_tokens",
      "callback_moe_droprate", "print_expert_load", "enable_expert_relocation",
      "expert_relocation_initial_iteration", "expert_relocation_freq", "moe_module_name", "output_router_logits",
      "moe_shared_expert_overlap")),
    ("read elsewhere: the parallel strategy is parallel_config's; pet_config (adapters) is refused when set",
     ("parallel_config", "moe_config")),
)
#: model_config fields memform reads (in the functions below), for the record; listed so that they are
#: not reported as unread when a branch does not need them
READ_MODEL = ("multiple_of", "ffn_dim_multiplier")
NEUTRAL_MOE = NEUTRAL_MODEL
#: parallel_config fields that are not degrees memform models
NEUTRAL_PARALLEL_CONFIG = _reasons(
    ("communication fusion grouping", ("gradient_aggregation_group",)),
    ("superseded by parallel.enable_parallel_optimizer, the switch MindSpore reads", ("optimizer_shard",)),
    ("a cost coefficient of the strategy search, not a strategy", ("mem_coeff",)),
    ("a copy of recompute_config's settings (read from here only when recompute_config is absent)",
     ("recompute",)),
)
#: parallel (MindSpore's auto_parallel_context) fields that are not memory
NEUTRAL_PARALLEL = _reasons(
    ("gradient and loss reduction arithmetic", ("gradients_mean", "loss_repeated_mean")),
    ("communication operator choice", ("enable_alltoall",)),
    ("how the dataset is split over data-parallel ranks (the device batch is runner_config.batch_size)",
     ("full_batch", "dataset_strategy")),
    ("strategy file paths", ("strategy_ckpt_config", "strategy_ckpt_save_file", "strategy_ckpt_load_file")),
    ("the search algorithm of auto parallel (refused unless parallel_mode is 1)", ("search_mode",)),
)
NEUTRAL_CONTEXT = _reasons(
    ("execution mode, device choice, compilation and runtime options: memform estimates the tensors a step "
     "holds, not the compiler's or the pool's plan for them",
     ("mode", "device_target", "device_id", "jit_config", "ascend_config", "memory_optimize_level",
      "mempool_block_size", "max_call_depth", "save_graphs", "save_graphs_path", "affinity_cpu_list",
      "runtime_num_threads", "enable_graph_kernel", "graph_kernel_flags", "deterministic", "env_config",
      "pynative_synchronize", "enable_compile_cache", "compile_cache_path", "op_timeout", "max_device_id",
      "print_file_path", "save_dump_path", "enable_reduce_precision", "variable_memory_max_size")),
)
NEUTRAL_RUNNER = _reasons(
    ("epochs and data sinking: how many steps, not what a step holds", ("epochs", "sink_mode", "sink_size",
                                                                       "initial_epoch", "initial_step")),
)
NEUTRAL_OPTIMIZER = _reasons(
    ("Adam's hyper-parameters: scalars", ("betas", "beta1", "beta2", "eps", "epsilon", "weight_decay",
                                          "learning_rate", "lr", "loss_scale", "use_fused", "amsgrad",
                                          "maximize", "fused")),
)
CP_ALGOS = {"colossalai_cp": "ring", "ulysses_cp": "ulysses"}

#: legacy model_config.type → what its decoder layer is, beyond the fields (mindformers/models/...);
#: None type (the oldest files) reads as LlamaConfig, as MemEst's parser does
LEGACY_TYPES = {
    # mindformers/models/llama/llama_layer.py LlamaFeedForward (w1, w2, w3; biases none), LlamaRMSNorm;
    # qkv_has_bias adds q/k/v biases (Qwen2.5 in research/qwen2_5 runs as LlamaForCausalLM)
    "LlamaConfig": {"family": "llama"},
    # research/deepseek3 DeepseekV3Config / mindformers/models/deepseek2: MLA + DeepSeekMoE, RMSNorm, no biases
    "DeepseekV3Config": {"family": "llama"},
    "DeepseekV2Config": {"family": "llama"},
    # research/telechat2 telechat_transformer.py: wo has out_proj_has_bias (default True), the MLP's w2 a bias
    # (telechat_layer.py TelechatFeedForward: w2 has_bias=True, w1/w3 none)
    "TelechatConfig": {"family": "telechat"},
    # mindformers/models/glm2 ChatGLM2Config (GLM-4 9B too): add_qkv_bias, add_bias_linear, padded_vocab_size,
    # multi_query_group_num, kv_channels, rmsnorm
    "ChatGLM2Config": {"family": "glm"},
}
#: current-layout model_type → the MFModelConfig defaults its config class registers
#: (mindformers/models/<name>/configuration_<name>.py register_mf_model_parameter) and what its training
#: model fixes (modeling_<name>_train.py); MFModelConfig's own defaults (mindformers/parallel_core/
#: mf_model_config.py: LayerNorm, add_bias_linear True, gated_linear_unit False) apply to any other
NEW_TYPES = {
    "qwen3": {"normalization": "RMSNorm", "add_bias_linear": False, "gated_linear_unit": True,
              "qk_layernorm": True},  # modeling_qwen3_train.py: qk_layernorm=True
    "qwen3_moe": {"normalization": "RMSNorm", "add_bias_linear": False, "gated_linear_unit": True,
                  "qk_layernorm": True},  # modeling_qwen3_moe_train.py: qk_layernorm=True
    "deepseek_v3": {"normalization": "RMSNorm", "add_bias_linear": False, "gated_linear_unit": True},
    "telechat3": {"normalization": "RMSNorm", "add_bias_linear": False, "gated_linear_unit": True},
}


def hyperparallel_marks(data: Any) -> list[str]:
    """The sections that make a YAML HyperParallel-shaped (MemEst's cost_model_parser_hyper.py reads
    ``model.config_overrides``, ``train.accelerator``, ``data.max_seq_len``)."""
    if not isinstance(data, dict):
        return []
    marks = []
    model, train = data.get("model"), data.get("train")
    if isinstance(model, dict) and isinstance(model.get("config_overrides"), dict):
        marks.append("'model.config_overrides'")
    if isinstance(train, dict) and isinstance(train.get("accelerator"), dict):
        marks.append("'train.accelerator'")
    return marks


def looks_like_hyperparallel(data: Any) -> bool:
    return bool(hyperparallel_marks(data))


def read_yaml_file(path: Path) -> dict:
    data = load_yaml(path, "MindFormers config")
    if not isinstance(data, dict):
        raise MemformError(f"{path}: a MindFormers config must be a YAML mapping, got {describe(data)}")
    return data


#: why two MindFormers spellings of one setting must agree (MindFormers itself stops on a 'Multiple Config')
SPELLINGS = ("two spellings of one MindFormers setting (transformer_config_utils.py COMMON_CONFIG_MAPPING) "
             "disagree; keep one")


def alias(fields: Fields, names: tuple[str, ...], read: Callable[[str], Any]) -> tuple[str | None, Any]:
    """The value of a setting MindFormers spells several ways (transformer_config_utils.py
    COMMON_CONFIG_MAPPING): :meth:`Fields.alias` with MindFormers' reason."""
    return fields.alias(names, read, SPELLINGS)


def at_default(fields: Fields, key: str, default: Any, why: str) -> None:
    """A field memform models only at MindFormers' default value: refused (file, field, why) at any other."""
    value = fields.raw(key)
    if value is None or value == default:
        return
    raise fields.error(key, f"is {describe(value)}: {why}; memform cannot model it, so it refuses the file "
                            f"rather than estimate another run (set it to {describe(default)} to estimate "
                            f"the run without it)")


class _Unset(Fields):
    """A section whose null fields count as unset: MindFormers' config classes take None for their
    default (PretrainedConfig keyword arguments, MFModelConfig's Optional fields)."""

    def unused(self, ignored=()):
        return [k for k in super().unused(ignored) if self.data.get(k) is not None]

    def section(self, key: str) -> "Fields":
        inner = super().section(key)
        return _Unset(inner.data, inner.file, inner.where)


def convert(path: Path, draft: Draft, given: set[str]) -> int | None:
    data = read_yaml_file(path)
    top = _Unset(data, path)
    model = top.section("model")
    mc = model.section("model_config")
    legacy = top.boolean("use_legacy", True)
    if not mc.data:
        if looks_like_hyperparallel(data):
            raise MemformError(f"{path}: required field 'model.model_config' is missing: this file has "
                               f"{' and '.join(hyperparallel_marks(data))}, the shape of a HyperParallel "
                               f"memory-estimation YAML, not a MindFormers one; import it with "
                               f"'memform import hyperparallel {path}'")
        raise top.missing("model.model_config")
    if legacy and mc.has("type"):
        _family(mc, legacy, mc.string("type"))  # an unknown model class is the first thing to say
    if not any(mc.has(k) for k in ("hidden_size", "num_layers", "num_hidden_layers")):
        if top.has("pretrained_model_dir"):
            # MindFormers' current layout: model_config holds overrides, the shape is read from the
            # Hugging Face config.json in pretrained_model_dir (configuration_utils.py)
            raise MemformError(
                f"{path}: the model's shape is not in this file: 'model.model_config' has no hidden_size or "
                f"num_hidden_layers, and MindFormers reads them from the config.json in 'pretrained_model_dir' "
                f"({top.raw('pretrained_model_dir')}). Import that config.json with 'memform import hf' and "
                f"set this file's strategy with --set (parallel.tp, parallel.pp, parallel.dp, ...), or copy the "
                f"config.json's fields into model.model_config")
        raise mc.missing("hidden_size")
    top.used.add("pretrained_model_dir")
    arch = model.section("arch").string("type", "") if model.has("arch") else ""
    model.section("arch").used.update(("type", "auto_register"))
    kind = mc.string("type", "") if legacy else mc.raw("model_type", "")
    draft.header.append(f"model: {arch or kind or 'type not stated'} "
                        f"({'legacy' if legacy else 'current, use_legacy: False'} MindFormers layout)")
    # MindSpore's allocation (parallel optimizer, replicated vocabulary, dtypes): frameworks/mindspore.mf
    draft.set("training.framework", "mindspore", "MindFormers trains on MindSpore")
    if legacy and arch == "DeepseekV3ForCausalLM":
        # research/deepseek3: lm_head's bf16 logits split per loss term, no fp32 cast before the loss
        draft.set("mindspore.loss_logits_dtype", "bf16", "arch DeepseekV3ForCausalLM: the loss reads the head's "
                  "compute-dtype logits (research/deepseek3 DeepseekV3ForCausalLM.construct)")
    moe = top.section("moe_config")
    _model(mc, draft, legacy, kind)
    _moe(moe, mc, draft, legacy)
    pc = top.section("parallel_config")
    par = top.section("parallel")
    sizes = _parallel(pc, par, mc, moe, draft, legacy)
    # the oldest files keep the recompute settings in parallel_config.recompute (TransformerRecomputeConfig)
    old = not top.has("recompute_config") and isinstance(pc.data.get("recompute"), dict)
    _recompute(pc.section("recompute") if old else top.section("recompute_config"), draft, sizes)
    _fp32_residual(mc, draft)
    runner = top.section("runner_config")
    _training(runner, pc, draft)
    ctx = top.section("context")
    _device(ctx, draft)
    _optimizer(top.section("optimizer"), draft)
    _refused_top(top, mc, draft)
    model.used.update(("model_config", "arch"))
    draft.refuse_unused(model)
    draft.refuse_unused(mc, NEUTRAL_MODEL)
    draft.refuse_unused(moe, NEUTRAL_MOE)
    draft.refuse_unused(pc, NEUTRAL_PARALLEL_CONFIG)
    draft.refuse_unused(par, NEUTRAL_PARALLEL)
    draft.refuse_unused(runner, NEUTRAL_RUNNER)
    draft.refuse_unused(ctx, NEUTRAL_CONTEXT)
    top.used.update(("model", "moe_config", "parallel_config", "parallel", "recompute_config", "context",
                     "runner_config", "optimizer", "swap_config", "micro_batch_interleave_num"))
    draft.refuse_unused(top, NEUTRAL_TOP)
    return None


def _refused_top(top: Fields, mc: Fields, draft: Draft) -> None:
    """Top-level switches that change memory in ways memform does not model, refused unless off."""
    swap = top.section("swap_config")
    # mindformers/tools/register/template.py SwapConfig: swap moves activations to host memory
    at_default(swap, "swap", False, "activation swap to host memory (SwapConfig) is not modelled")
    swap.used.update(swap.data)
    # MindSpore MicroBatchInterleaved: each micro-batch split in n interleaved slices, whose live
    # activations memform does not model
    at_default(top, "micro_batch_interleave_num", 1, "micro-batch interleaving (MicroBatchInterleaved) is not "
                                                     "modelled")
    layers = mc.raw("no_recompute_layers")
    if layers not in (None, [], False):
        # ChatGLM2Config no_recompute_layers: named layers kept out of recompute_config.recompute, which
        # memform's per-stage counts (the first n layers of a stage) cannot place
        raise mc.error("no_recompute_layers", f"is {describe(layers)}: layers excluded from recompute by index "
                                              f"are not modelled")
    if mc.has("pet_config"):
        raise mc.error("pet_config", "sets a parameter-efficient fine-tuning wrapper (LoRA, prefix tuning); "
                                     "memform models MindFormers runs that train every weight")


def _model(mc: Fields, draft: Draft, legacy: bool, kind: str) -> None:
    fam = _family(mc, legacy, kind)
    h = mc.integer("hidden_size")
    _, a = alias(mc, ("num_heads", "num_attention_heads", "n_head"), mc.integer)
    if a is None:
        raise mc.missing("num_heads" if legacy else "num_attention_heads")
    draft.set("model.hidden_size", h)
    draft.set("model.num_heads", a, "num_heads / num_attention_heads")
    kv_key, kv = alias(mc, ("n_kv_heads", "num_key_value_heads", "num_query_groups"), lambda k: mc.integer(k))
    if fam == "glm":
        # ChatGLM2Config: multi_query_group_num K/V groups when multi_query_attention (glm2_transformer.py)
        if mc.boolean("multi_query_attention", False):
            kv_key, kv = "multi_query_group_num", mc.integer("multi_query_group_num")
        mc.used.add("multi_query_group_num")
    draft.set("model.num_kv_heads", kv or a, kv_key or "no n_kv_heads / num_key_value_heads: multi-head attention")
    _, layers = alias(mc, ("num_layers", "num_hidden_layers", "n_layer"), mc.integer)
    if layers is None:
        raise mc.missing("num_layers" if legacy else "num_hidden_layers")
    draft.set("model.num_layers", layers, "num_layers / num_hidden_layers")
    ffn_key, ffn = alias(mc, ("intermediate_size", "ffn_hidden_size"), mc.integer)
    if ffn is not None:
        draft.set("model.ffn_hidden_size", ffn, ffn_key)
    elif legacy:
        multiple = mc.integer("multiple_of", 256)
        fdm = mc.number("ffn_dim_multiplier", None)
        draft.set("model.ffn_hidden_size", llama_ffn_width(h, multiple, fdm),
                  f"from multiple_of {multiple}" + (f", ffn_dim_multiplier {fdm}" if fdm else "") +
                  " (LlamaFeedForward's 8h/3 rule)")
    else:
        raise mc.missing("intermediate_size")
    mc.used.update(READ_MODEL)
    vocab_key = "padded_vocab_size" if mc.has("padded_vocab_size") else "vocab_size"
    # ChatGLM2Config: the embedding and the output layer have padded_vocab_size rows (glm2.py)
    draft.set("model.vocab_size", mc.integer(vocab_key), vocab_key)
    mc.used.add("vocab_size")
    _seq_length(mc, draft, legacy)
    _attention(mc, draft, fam, legacy, kind, h, a)
    _mlp(mc, draft, fam, legacy, kind)
    _norm_bias_dropout(mc, draft, fam, legacy, kind)
    _precision(mc, draft, legacy)
    _, mtp = alias(mc, ("mtp_depth", "num_nextn_predict_layers", "mtp_num_layers"),
                   lambda k: mc.integer(k, 0, minimum=0))
    if mtp:
        draft.set("model.mtp_layers", mtp, "mtp_depth / num_nextn_predict_layers")


def llama_ffn_width(hidden: int, multiple_of: int, ffn_dim_multiplier: float | None) -> int:
    """LlamaFeedForward's width without intermediate_size (mindformers/models/llama/llama_layer.py):
    4h, times (ffn_dim_multiplier + 0.01) first, then 2/3, rounded up to multiple_of. It is Meta's rule
    (draft.gated_ffn_size) without a multiplier; with one it differs (Llama-3-70B: 1.3, 256 → 28672, which
    Meta reaches with multiple_of 4096)."""
    width = 4 * hidden
    if ffn_dim_multiplier is not None:
        width = int((ffn_dim_multiplier + 0.01) * width)
    width = int(2 * width / 3)
    return multiple_of * ((width + multiple_of - 1) // multiple_of)


def _family(mc: Fields, legacy: bool, kind: str) -> str:
    if legacy:
        if not kind:
            return "llama"  # the oldest files name no type; MemEst's parser reads them as Llama
        if kind not in LEGACY_TYPES:
            raise mc.error("type", f"is {kind}: memform knows the decoder layers of the legacy "
                                   f"{', '.join(sorted(LEGACY_TYPES))} only (their biases, norms and MLPs "
                                   f"are not all in the YAML), so it cannot tell this model's size")
        return LEGACY_TYPES[kind]["family"]
    if kind not in NEW_TYPES:
        missing = [k for k in ("normalization", "add_bias_linear", "gated_linear_unit") if not mc.has(k)]
        if missing:
            raise mc.error("model_type", f"is {describe(kind or None)}: the current MindFormers layout takes "
                                         f"the layer layout from the model class's registered defaults, which "
                                         f"memform knows for {', '.join(sorted(NEW_TYPES))} only; give "
                                         f"{', '.join(missing)} in model_config to import another")
    return "mcore"


def _seq_length(mc: Fields, draft: Draft, legacy: bool) -> None:
    if mc.has("seq_length"):
        draft.set("model.seq_length", mc.integer("seq_length"), "seq_length")
    elif legacy:
        raise mc.missing("seq_length")
    else:
        # MFModelConfig.seq_length defaults to 4096 (mindformers/parallel_core/mf_model_config.py)
        draft.set("model.seq_length", 4096, "no model_config.seq_length: MFModelConfig's default 4096")


def _attention(mc: Fields, draft: Draft, fam: str, legacy: bool, kind: str, h: int, a: int) -> None:
    flagged = mc.boolean("multi_latent_attention", False)
    mla = mc.has("kv_lora_rank") or flagged
    head_key, head_dim = alias(mc, ("head_dim", "kv_channels"), mc.integer)
    if mla:
        draft.set("model.attention", "mla", "kv_lora_rank / multi_latent_attention: multi-head latent attention")
        draft.set("model.q_lora_rank", mc.integer("q_lora_rank", 0, minimum=0), "q_lora_rank (null/0: none)")
        draft.set("model.kv_lora_rank", mc.integer("kv_lora_rank"))
        _, nope = alias(mc, ("qk_nope_head_dim", "qk_head_dim"), mc.integer)
        _, rope = alias(mc, ("qk_rope_head_dim", "qk_pos_emb_head_dim"), mc.integer)
        if nope is None or rope is None:
            raise mc.missing("qk_nope_head_dim" if nope is None else "qk_rope_head_dim")
        draft.set("model.qk_nope_head_dim", nope, "qk_nope_head_dim")
        draft.set("model.qk_rope_head_dim", rope, "qk_rope_head_dim")
        draft.set("model.v_head_dim", mc.integer("v_head_dim"))
        # MLA's q/k layer norms are the latent norms (q_a_layernorm, kv_a_layernorm) mla.mf counts
        mc.used.update(("qk_layernorm", "use_qk_norm"))
    else:
        mc.used.update(("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                        "multi_latent_attention", "qk_head_dim", "qk_pos_emb_head_dim"))
        if head_dim is not None and head_dim * a != h:
            draft.set("model.head_dim", head_dim, f"{head_key} (× {a} heads = {head_dim * a}, not hidden_size {h})")
        elif head_dim is None and h % a:
            raise mc.error("hidden_size", f"{h} is not a multiple of the {a} heads and no head_dim is given")
        forced = NEW_TYPES.get(kind, {}).get("qk_layernorm") if not legacy else None
        _, qk = alias(mc, ("qk_layernorm", "use_qk_norm"), mc.boolean)
        if forced:
            draft.set("model.qk_norm", True, f"{kind}: modeling_{kind}_train.py builds q/k RMSNorm(head_dim) "
                                             f"(qk_layernorm=True)")
        elif qk:
            draft.set("model.qk_norm", True, "qk_layernorm: q/k RMSNorm(head_dim)")
    draft.set("model.flash_attention", mc.boolean("use_flash_attention", not legacy),
              "use_flash_attention" if mc.has("use_flash_attention") else
              ("legacy default off" if legacy else "MFModelConfig's default use_flash_attention True"))
    pos_key, pos = alias(mc, ("position_embedding_type", "extend_method"), mc.string)
    if pos is not None and pos.lower().startswith("learned"):
        draft.set("model.position_embedding", "learned", pos_key)
    elif pos is not None and pos.lower() not in ("rope", "none", "yarn", "llama3", "linear", "ntk", "pi",
                                                  "dynamic_ntk", "partial_rope", "mrope", "dynamic"):
        # extend_method: the legacy RoPE scalings (None, PI, NTK, LINEAR, YARN: llama_layer.py FreqsMgr)
        raise mc.error(pos_key, f"is {describe(pos)}: memform models rotary and learned absolute positions")
    else:
        draft.set("model.position_embedding", "rope", f"{pos_key} {pos}" if pos else "rotary (MindFormers' LLMs)")
    at_default(mc, "use_alibi_mask", False, "ALiBi keeps an a × s × s bias memform does not count")
    at_default(mc, "window_size", None, "sliding-window attention is not modelled in MindFormers' layout")


def _mlp(mc: Fields, draft: Draft, fam: str, legacy: bool, kind: str) -> None:
    act = mc.string("hidden_act", "silu" if legacy or kind in NEW_TYPES else "gelu")
    if legacy:
        gated = fam in ("llama", "telechat", "glm")  # LlamaFeedForward / TelechatFeedForward / GLM's swiglu
        why = "the legacy model's gated MLP (w1, w3 → w2)"
    else:
        default = NEW_TYPES.get(kind, {}).get("gated_linear_unit", False)
        gated = mc.boolean("gated_linear_unit", default)
        why = "gated_linear_unit" if mc.has("gated_linear_unit") else f"{kind}'s registered gated_linear_unit"
    mc.used.add("gated_linear_unit")
    silu = act.lower() in ("silu", "swish", "swiglu", "fusedswiglu")
    if gated and silu:
        draft.set("model.activation", "swiglu", f"hidden_act {act}, {why}: gated SiLU (gate, up, down)")
    elif not gated and act.lower() in ("gelu", "fast_gelu", "gelu_tanh", "gelu_new"):
        draft.set("model.activation", "gelu", f"hidden_act {act}, no gate")
    else:
        raise mc.error("hidden_act", f"is {act}{' with' if gated else ' without'} a gated MLP ({why}): memform "
                                     f"models gated SiLU (SwiGLU) and ungated GeLU MLPs")


def _norm_bias_dropout(mc: Fields, draft: Draft, fam: str, legacy: bool, kind: str) -> None:
    # the epsilon spellings are one setting (COMMON_CONFIG_MAPPING: rms_norm_eps / layernorm_epsilon);
    # the kind of norm is normalization (current layout), rmsnorm (ChatGLM2Config), else RMSNorm
    mc.used.update(("rms_norm_eps", "norm_eps", "layernorm_epsilon", "layer_norm_epsilon"))
    if mc.has("normalization"):
        norm = mc.string("normalization")
        if norm not in ("RMSNorm", "LayerNorm"):
            raise mc.error("normalization", f"must be RMSNorm or LayerNorm, got {describe(norm)}")
        draft.set("model.norm", norm.lower(), "normalization")
    elif fam == "glm":
        draft.set("model.norm", "rmsnorm" if mc.boolean("rmsnorm", True) else "layernorm", "ChatGLM2Config rmsnorm")
    elif legacy or kind in NEW_TYPES:
        draft.set("model.norm", "rmsnorm", "RMSNorm (MindFormers' LlamaRMSNorm / the class's normalization)")
    else:
        draft.set("model.norm", "layernorm", "MFModelConfig's default normalization LayerNorm")
    # final norm: every MindFormers LLM ends in one (post_layer_norm: ChatGLM2Config's, default True)
    at_default(mc, "post_layer_norm", True, "a GLM without its final norm is not modelled")
    # ChatGLM2: the residual taken after the norm rather than before: the same tensors, held the same way
    mc.used.add("apply_residual_connection_post_layernorm")
    _, sandwich = alias(mc, ("sandwich_norm",), mc.boolean)
    if sandwich:
        draft.set("model.post_norms", True, "sandwich_norm: norms on the attention and MLP outputs")
    # biases: add_bias_linear is every linear layer's (current layout; ChatGLM2's dense layers), the
    # q/k/v spellings (qkv_has_bias / attention_bias / add_qkv_bias) the attention input projections'
    _, qkv = alias(mc, ("qkv_has_bias", "attention_bias", "add_qkv_bias"), mc.boolean)
    default_linear = False if legacy else NEW_TYPES.get(kind, {}).get("add_bias_linear", True)
    linear = mc.boolean("add_bias_linear", default_linear)
    # TelechatConfig is two models: research/telechat2 (TelechatFeedForward w2 has_bias=True) and
    # research/telechat3 (net_name telechat3_*; w1, w2, w3 without biases); wo's bias is out_proj_has_bias
    # (default True) in both
    telechat3 = fam == "telechat" and str(mc.raw("net_name", "")).startswith("telechat3")
    out_bias = mc.boolean("out_proj_has_bias", fam == "telechat")
    mlp_bias = mc.boolean("mlp_has_bias", fam == "telechat" and not telechat3)
    for key in ("add_mlp_fc1_bias_linear", "add_mlp_fc2_bias_linear"):
        at_default(mc, key, None, "one MLP layer's bias alone is not modelled (model.bias covers all of them)")
    if fam == "telechat" and not telechat3 and (out_bias or mlp_bias) and not linear:
        # memform's model.bias puts biases on the output projection and on all the MLP's layers; TeleChat
        # has them on wo and w2 only: w1 and w3's (2 × intermediate_size per layer) are counted too
        draft.set("model.bias", True, "TeleChat: wo (out_proj_has_bias) and the MLP's w2 have biases")
        draft.warn("TeleChat's biases are on wo and w2 only; memform's model.bias counts w1 and w3's too "
                   "(2 × intermediate_size parameters per layer more than the model has)")
    elif out_bias != linear or mlp_bias != linear:
        raise mc.error("out_proj_has_bias" if out_bias != linear else "mlp_has_bias",
                       "differs from the other linear layers' biases: memform puts biases on all of the "
                       "output projection and MLP layers or none")
    else:
        draft.set("model.bias", linear, "add_bias_linear" if mc.has("add_bias_linear") else
                  ("no biases (legacy layers)" if legacy else f"{kind}'s registered add_bias_linear"))
    draft.set("model.qkv_bias", bool(qkv) or linear, "qkv_has_bias / attention_bias / add_qkv_bias")
    # the models read tie_word_embeddings (legacy LlamaConfig; current layout modeling_qwen3_train.py:
    # share_embeddings_and_output_weights=config.tie_word_embeddings); untie_embeddings_and_output_weights
    # is MFModelConfig's copy that the training models do not read
    tied = mc.boolean("tie_word_embeddings", False)
    mc.used.add("untie_embeddings_and_output_weights")
    draft.set("model.tied_embeddings", tied, "tie_word_embeddings" if mc.has("tie_word_embeddings") else
              "no tie_word_embeddings: a separate output layer")
    drops = {k: mc.number(k) for k in ("hidden_dropout", "attention_dropout", "hidden_dropout_prob",
                                       "attention_dropout_prob", "emb_dropout_prob", "embed_dropout_prob")
             if mc.has(k)}
    on = sorted(k for k, v in drops.items() if v)
    if on:
        draft.set("model.dropout", True, f"{', '.join(on)} > 0")
    else:
        draft.set("model.dropout", False, "dropout rates 0" if drops else "MindFormers' LLM configs train "
                                                                         "without dropout")
    mc.used.add("fp32_residual_connection")  # checked once the recompute is known (_fp32_residual)


def _fp32_residual(mc: Fields, draft: Draft) -> None:
    """fp32_residual_connection (current layout, transformer_layer.py): the residual adds run in float32 and
    the MLP norm's input is not cast back, so a layer that keeps its activations keeps that input in fp32,
    which memform's MindSpore profile does not model; a fully recomputed layer keeps only its input, cast
    back to compute_dtype at the layer's end, so with every layer recomputed the switch moves no memory."""
    if not mc.boolean("fp32_residual_connection", False):
        return
    every = draft.get("training.recompute") == "full" and draft.get("training.recompute_layers") is None
    if not every:
        raise mc.error("fp32_residual_connection", "is true and not every layer is fully recomputed: such a "
                       "layer keeps its MLP norm's input in float32 (transformer_layer.py adds the residual in "
                       "fp32 and does not cast it back before pre_mlp_layernorm), which memform's MindSpore "
                       "profile does not model")
    draft.warn("model_config.fp32_residual_connection: every layer is fully recomputed, so only the layer being "
               "recomputed holds its MLP norm's input in float32 (2·s·b·h bytes more, once, not counted)")


def _precision(mc: Fields, draft: Draft, legacy: bool) -> None:
    """Parameter and compute dtypes; absent, the config class's defaults: LlamaConfig float16 / float16
    (mindformers/models/llama/llama_config.py), the current layout's params_dtype float32 / compute_dtype
    bfloat16 (parallel_core/model_parallel_config.py, mf_model_config.py)."""
    key, params = alias(mc, ("param_init_type", "params_dtype"), mc.string)
    if params is not None:
        draft.set("training.precision.params", dtype_name(params, mc, key), key)
    else:
        draft.default("training.precision.params", "fp16" if legacy else "fp32",
                      "LlamaConfig's param_init_type float16" if legacy else "TransformerConfig's params_dtype float32")
    if mc.has("compute_dtype"):
        draft.set("training.precision.activations", dtype_name(mc.string("compute_dtype"), mc, "compute_dtype"),
                  "compute_dtype")
    else:
        draft.default("training.precision.activations", "fp16" if legacy else "bf16",
                      "LlamaConfig's compute_dtype float16" if legacy else "MFModelConfig's compute_dtype bfloat16")
    key, norm = alias(mc, ("layernorm_compute_type", "layernorm_compute_dtype"), mc.string)
    if norm is not None:
        draft.set("mindspore.layernorm_compute_type", dtype_name(norm, mc, key), f"model_config.{key}")
    key, soft = alias(mc, ("softmax_compute_type", "softmax_compute_dtype"), mc.string)
    if soft is not None:
        draft.set("mindspore.softmax_compute_type", dtype_name(soft, mc, key), f"model_config.{key}")
    elif mc.has("attention_softmax_in_fp32"):
        # ChatGLM2Config / COMMON_CONFIG_MAPPING: attention_softmax_in_fp32 is softmax_compute_dtype fp32
        draft.set("mindspore.softmax_compute_type", "fp32" if mc.boolean("attention_softmax_in_fp32") else
                  draft.get("training.precision.activations", "bf16"), "attention_softmax_in_fp32")
    mc.used.add("attention_softmax_in_fp32")
    if mc.has("fused_rms_norm"):
        draft.set("mindspore.fused_rms_norm", mc.boolean("fused_rms_norm"), "model_config.fused_rms_norm")
    if mc.has("embedding_init_type"):
        emb = dtype_name(mc.string("embedding_init_type"), mc, "embedding_init_type")
        if emb != draft.get("training.precision.params"):
            # no memform key holds the embedding table's own dtype
            draft.warn(f"model_config.embedding_init_type {mc.raw('embedding_init_type')}: the embedding table "
                       f"is counted in param_init_type ({draft.get('training.precision.params')}) like the other "
                       f"weights (an over-estimate of its weight and gradient bytes)")


def _moe_pick(moe: Fields, mc: Fields, names: tuple[str, ...], read: str, default: Any = None) -> tuple[str, Any]:
    """A MoE setting from moe_config (legacy) or model_config (current layout); both must agree."""
    got = []
    for fields in (moe, mc):
        reader = {"int": lambda k, f=fields: f.integer(k, minimum=0), "num": lambda k, f=fields: f.number(k),
                  "bool": lambda k, f=fields: f.boolean(k)}[read]
        key, value = alias(fields, names, reader)
        if key is not None:
            got.append((fields.name(key), value))
    if len(got) == 2 and got[0][1] != got[1][1]:
        raise MemformError(f"{moe.file}: fields '{got[0][0]}' ({got[0][1]!r}) and '{got[1][0]}' ({got[1][1]!r}) "
                           f"are one MoE setting and disagree")
    return got[0] if got else ("", default)


def _moe(moe: Fields, mc: Fields, draft: Draft, legacy: bool) -> None:
    src, experts = _moe_pick(moe, mc, ("expert_num", "n_routed_experts", "num_experts", "num_moe_experts"), "int", 1)
    names = (("num_experts_chosen", "num_experts_per_tok", "moe_router_topk"),
             ("moe_intermediate_size", "moe_ffn_hidden_size"), ("n_shared_experts", "shared_expert_num"),
             ("first_k_dense_replace",), ("capacity_factor", "moe_expert_capacity_factor"), ("use_gmm", "moe_grouped_gemm"),
             ("moe_shared_expert_intermediate_size",), ("moe_layer_freq",), ("use_shared_expert_gating",),
             ("expert_model_parallel",))
    if experts <= 1:
        for group in names:
            for fields in (moe, mc):
                fields.used.update(group)
        return
    draft.set("model.num_experts", experts, src)
    key, k = _moe_pick(moe, mc, names[0], "int", 1)
    draft.set("model.moe_top_k", k, key or "MoE top-k default 1")
    key, width = _moe_pick(moe, mc, names[1], "int")
    if width:
        draft.set("model.moe_ffn_hidden_size", width, key)
    else:
        draft.set("model.moe_ffn_hidden_size", draft.get("model.ffn_hidden_size"),
                  "no moe_intermediate_size: each expert is intermediate_size wide")
    key, shared = _moe_pick(moe, mc, names[2], "int", 0)
    key_w, shared_w = _moe_pick(moe, mc, names[6], "int")
    if shared_w:
        # transformer_config.py: moe_shared_expert_intermediate_size, when set, is the shared MLP's width
        # whatever shared_expert_num says
        draft.set("model.num_shared_experts", max(shared, 1), key or key_w)
        draft.set("model.shared_expert_ffn_hidden_size", shared_w, key_w)
    else:
        draft.set("model.num_shared_experts", shared, key or "no shared experts")
    key, dense = _moe_pick(moe, mc, names[3], "int", 0)
    if dense:
        draft.set("model.first_k_dense", dense, key)
    freq = mc.raw("moe_layer_freq", moe.raw("moe_layer_freq", 1))
    if not dense and freq != 1:
        # gpt_layer_specs.py: first_k_dense_replace wins; else layer i is MoE when i % N == 0, or a 0/1 list
        # of num_layers entries
        ok = (isinstance(freq, int) and not isinstance(freq, bool) and freq > 0) or (
            isinstance(freq, list) and len(freq) == draft.get("model.num_layers") and set(freq) <= {0, 1})
        if not ok:
            raise mc.error("moe_layer_freq", f"must be a positive integer or a 0/1 list of num_layers entries, "
                                             f"got {describe(freq)}")
        draft.set("model.moe_layer_freq", freq, "moe_layer_freq")
    key, cap = _moe_pick(moe, mc, names[4], "num")
    if cap is not None:
        draft.set("model.capacity_factor", cap, key)
    key, gmm = _moe_pick(moe, mc, names[5], "bool")
    if gmm is not None:
        draft.set("model.moe_grouped_gemm", gmm, key)
    key, gate = _moe_pick(moe, mc, names[8], "bool", False)
    if gate:
        draft.set("model.shared_expert_gate", True, key)
    # MoEConfig.ep_extend_tp (default True) is declared but read by no model (modules/transformer/moe.py)
    moe.used.add("ep_extend_tp")


def _expert_tp(moe: Fields, pc: Fields, tp: int, draft: Draft, legacy: bool = True) -> None:
    """``expert_model_parallel`` is the experts' model-parallel degree, 1 or model_parallel; absent,
    the experts split over model_parallel in the legacy layout (llama_layer.py LlamaFeedForward: mp_moe)
    and are not split in the current one (batched_layers.py: expert_tensor_parallel_size None → 1)."""
    for fields in (moe, pc):
        if fields.has("expert_model_parallel"):
            etp = fields.integer("expert_model_parallel")
            if etp not in (1, tp):
                raise fields.error("expert_model_parallel", f"must be 1 or model_parallel ({tp}), got {etp} "
                                   f"(MindFormers accepts no other value)")
            draft.set("parallel.expert_tp", etp, fields.name("expert_model_parallel"))
            return
        fields.used.add("expert_model_parallel")
    if legacy:
        draft.set("parallel.expert_tp", tp, "no expert_model_parallel: experts split over model_parallel")
    else:
        draft.set("parallel.expert_tp", 1, "no expert_model_parallel: the current layout's expert TP 1 "
                                           "(batched_layers.py)")
def _parallel(pc: Fields, par: Fields, mc: Fields, moe: Fields, draft: Draft,
              legacy: bool = True) -> list[list[int]]:
    """The degrees, schedule, parallel optimizer and stage split; returns the body layers MindFormers
    puts in each [stage][chunk] (mindformers/models/utils.py LayerSetting: layer_list)."""
    dp = pc.integer("data_parallel", 1)
    tp = pc.integer("model_parallel", 1)
    pp = pc.integer("pipeline_stage", 1)
    # MindSpore's parallel_mode: 0 data parallel, 1 semi-auto (the degrees as written), 2 auto (the
    # strategy searched), 3 hybrid (hand-written communication): only 1, and 0 without model degrees,
    # say what each device holds
    mode = par.integer("parallel_mode", 1, minimum=0)
    if mode in (2, 3) or (mode == 0 and tp * pp > 1) or mode > 3:
        raise par.error("parallel_mode", f"is {mode}: memform models the semi-auto parallel mode (1), in which "
                                         f"parallel_config's degrees are the strategy; "
                                         + ("auto parallel searches its own" if mode == 2 else
                                            "hybrid parallel's communication is hand-written" if mode == 3 else
                                            "data-parallel mode ignores model_parallel and pipeline_stage"))
    draft.set("parallel.dp", dp, "parallel_config.data_parallel")
    draft.set("parallel.tp", tp, "parallel_config.model_parallel")
    draft.set("parallel.pp", pp, "parallel_config.pipeline_stage")
    vpp = _schedule(pc, par, mc, pp, draft)
    cp = pc.integer("context_parallel", 1)
    algo = pc.string("context_parallel_algo", "colossalai_cp")
    if cp > 1:
        draft.set("parallel.cp", cp, "parallel_config.context_parallel")
        if algo not in CP_ALGOS:
            # transformer_config_utils.py get_cp_comm_type: MindFormers accepts these two only
            raise pc.error("context_parallel_algo", f"must be colossalai_cp or ulysses_cp, got {describe(algo)}")
        draft.set("parallel.cp_algo", CP_ALGOS[algo], f"context_parallel_algo {algo}")
    # use_ring_attention: the legacy models' ring flash attention over the context-parallel ranks
    # (llama_transformer.py LLamaAttention), the P2P ring colossalai_cp already is
    if mc.boolean("use_ring_attention", False) and cp > 1 and algo != "colossalai_cp":
        raise mc.error("use_ring_attention", f"is true while parallel_config.context_parallel_algo is {algo}")
    if "model.num_experts" in draft:
        draft.set("parallel.ep", pc.integer("expert_parallel", 1), "parallel_config.expert_parallel")
        _expert_tp(moe, pc, tp, draft, legacy)
    else:
        pc.used.update(("expert_parallel", "expert_model_parallel"))
        moe.used.add("expert_model_parallel")
    # ulysses_degree_in_cp: the hybrid algorithm's split, which MindFormers' two cp algorithms do not read
    pc.used.add("ulysses_degree_in_cp")
    draft.set("parallel.sequence_parallel", pc.boolean("use_seq_parallel", False), "use_seq_parallel")
    if legacy:
        # TransformerOpParallelConfig's default is vocab_emb_dp=True (mindformers/modules/transformer)
        draft.set("mindspore.vocab_emb_dp", pc.boolean("vocab_emb_dp", True),
                  "parallel_config.vocab_emb_dp" if pc.has("vocab_emb_dp") else
                  "no vocab_emb_dp: MindFormers' default True")
    else:
        # the current layout turns vocab_emb_dp off (transformer_config.py: "vocab_emb_dp is not supported in
        # MCore"); VocabParallelEmbedding splits the table over model_parallel when it divides the vocabulary
        pc.used.add("vocab_emb_dp")
        split = tp > 1 and draft.get("model.vocab_size") % tp == 0
        draft.set("mindspore.vocab_emb_dp", not split, "current layout: the table split over model_parallel "
                  "(VocabParallelEmbedding)" if split else "current layout: the table replicated (tp 1, or "
                  "model_parallel does not divide the vocabulary: VocabParallelEmbedding)")
    _parallel_optimizer(par, dp, cp, draft)
    if mc.has("parallel_optimizer") or mc.raw("type") == "TelechatConfig":
        # research/telechat2 telechat.py: the embedding table's Parameter(parallel_optimizer=
        # config.parallel_optimizer), TelechatConfig's default False: left out of the parallel optimizer
        inside = mc.boolean("parallel_optimizer", False)
        if draft.get("mindspore.parallel_optimizer") and not inside:
            raise mc.error("parallel_optimizer", ("is false" if mc.has("parallel_optimizer") else
                                                  "is absent (TelechatConfig's default false)")
                           + ": the embedding table is then left out of the parallel optimizer, which memform "
                             "shards with every other weight (set it to true, or turn "
                             "parallel.enable_parallel_optimizer off, to estimate)")
    offset = mc.raw("offset", 0)
    layers, mtp = draft.get("model.num_layers"), draft.get("model.mtp_layers", 0)
    sizes = None
    if pp > 1 and isinstance(offset, list) and _any_nonzero(offset):
        sizes = _stage_layers(offset, layers, mtp, pp, vpp, draft)
    elif pp > 1 and isinstance(offset, int) and not isinstance(offset, bool) and offset:
        draft.warn(f"model_config.offset {offset} (one number) is not imported: an even split of the layers "
                   f"over the {pp} stages is assumed (give one offset per stage)")
    return sizes or _even_sizes(layers, pp, vpp)


def _any_nonzero(offset: list[Any]) -> bool:
    return any(_any_nonzero(o) if isinstance(o, list) else o for o in offset)


def _even_sizes(layers: int, pp: int, vpp: int) -> list[list[int]]:
    """memform's split without parallel.stage_layers: layers // (pp × vpp) per chunk, the remainder
    to the first chunks (a split memform refuses when it is uneven)."""
    base, extra = divmod(layers, pp * vpp)
    return [[base + (1 if c * pp + s < extra else 0) for c in range(vpp)] for s in range(pp)]


#: MindSpore's pipeline_scheduler names (set_auto_parallel_context pipeline_config) → memform schedules
SCHEDULES = {"1f1b": "1f1b", "gpipe": "gpipe", "seqpipe": "seqpipe", "zero_bubble_v": "zero-bubble-v"}


def _schedule(pc: Fields, par: Fields, mc: Fields, pp: int, draft: Draft) -> int:
    """``model_config.pp_interleave_num`` chunks per stage, which LayerSetting uses only with
    ``parallel.pipeline_config.pipeline_interleave`` (else 1); ``pipeline_scheduler``; returns vpp."""
    vpp = mc.integer("pp_interleave_num", 1)
    cfg = par.section("pipeline_config")
    interleave = cfg.boolean("pipeline_interleave", False)
    scheduler = cfg.string("pipeline_scheduler", "1f1b")
    if vpp > 1 and not interleave:
        draft.warn(f"model_config.pp_interleave_num {vpp} without parallel.pipeline_config.pipeline_interleave: "
                   f"true is not used by MindFormers (LayerSetting sets it to 1); one chunk per stage assumed")
        vpp = 1
    if vpp > 1 and pp > 1:
        draft.set("parallel.vpp", vpp, "model_config.pp_interleave_num (pipeline_interleave: true)")
    if pp > 1 and cfg.has("pipeline_scheduler"):
        if scheduler not in SCHEDULES:
            draft.warn(f"parallel.pipeline_config.pipeline_scheduler {scheduler} is not modelled; "
                       f"estimated as 1f1b")
        draft.set("parallel.pp_schedule", SCHEDULES.get(scheduler, "1f1b"),
                  f"parallel.pipeline_config.pipeline_scheduler {scheduler}")
        if scheduler == "seqpipe":
            draft.set("parallel.seq_chunks", pc.integer("seq_split_num", 1), "parallel_config.seq_split_num")
    draft.refuse_unused(cfg)
    return vpp if pp > 1 else 1


def _parallel_optimizer(par: Fields, dp: int, cp: int, draft: Draft) -> None:
    """MindSpore's parallel optimizer (AutoParallel.hsdp / parallel_optimizer_config): weights and
    optimizer states sharded over ``optimizer_weight_shard_size`` ranks (-1: all that hold the slice),
    gradients too with gradient_accumulation_shard (MindSpore's default True) or level2/3."""
    enabled = par.boolean("enable_parallel_optimizer", False)
    draft.set("mindspore.parallel_optimizer", enabled, "parallel.enable_parallel_optimizer"
              if par.has("enable_parallel_optimizer") else "no enable_parallel_optimizer: MindSpore's default off")
    opt = par.section("parallel_optimizer_config")
    if not enabled:
        if opt.has("optimizer_weight_shard_size"):
            draft.warn(f"parallel_optimizer_config.optimizer_weight_shard_size "
                       f"{opt.raw('optimizer_weight_shard_size')} is ignored: parallel.enable_parallel_optimizer "
                       f"is false, so nothing is sharded")
        opt.used.update(opt.data)
        return
    size = opt.integer("optimizer_weight_shard_size", -1, minimum=-1)
    if size == 0:
        raise opt.error("optimizer_weight_shard_size", "must be -1 (all ranks) or a positive group size, got 0")
    if size > 1:
        draft.set("parallel.zero_shard_max", size, "parallel_optimizer_config.optimizer_weight_shard_size")
        if (dp * cp) % size:
            # operator_info.cc CreateGroupForOptShard: the size must divide the ranks holding the slice
            draft.warn(f"parallel_optimizer_config.optimizer_weight_shard_size {size} does not divide "
                       f"data_parallel × context_parallel = {dp * cp}: MindSpore makes no shard group for "
                       f"parameters split over model_parallel, which stay unsharded (as estimated)")
    elif size == 1:
        draft.warn("parallel_optimizer_config.optimizer_weight_shard_size 1 is ignored by MindSpore "
                   "(set_optimizer_weight_shard_size: it must be larger than 1); the whole group shards")
    draft.set("parallel.grad_accumulation_shard", opt.boolean("gradient_accumulation_shard", True),
              "parallel_optimizer_config.gradient_accumulation_shard" if opt.has("gradient_accumulation_shard")
              else "no gradient_accumulation_shard: MindSpore's default True")
    if opt.has("parallel_optimizer_threshold"):
        threshold = opt.number("parallel_optimizer_threshold")
        if threshold < 0:
            raise opt.error("parallel_optimizer_threshold", f"must not be negative (KB), got {threshold}")
        draft.set("mindspore.parallel_optimizer_threshold", threshold,
                  "parallel_optimizer_config.parallel_optimizer_threshold (KB)")
    if opt.has("optimizer_level"):
        level = opt.string("optimizer_level")
        if level not in ("level1", "level2", "level3"):
            raise opt.error("optimizer_level", f"must be level1, level2 or level3, got {describe(level)}")
        draft.set("mindspore.optimizer_level", level, "parallel_optimizer_config.optimizer_level")
    draft.refuse_unused(opt)


def _stage_layers(offset: list[Any], layers: int, mtp: int, pp: int, vpp: int,
                  draft: Draft) -> list[list[int]] | None:
    """LayerSetting gives chunk v of stage i ``L // (pp × vpp) + offset[v][i]`` layers; a flat offset
    list is broadcast to every chunk (np.broadcast_to). MemEst counts MTP layers in ``L``
    (is_mtp_in_offset, memest-formulas.md §2.1); either count is accepted, whichever adds up, and the
    MTP layers (memform places them after the body) come off the last chunk. Returns the body layers
    per [stage][chunk], or None (not imported: even split)."""
    nested = all(isinstance(row, list) for row in offset)
    rows = offset if nested else [offset] * vpp

    def integers(row: Any) -> bool:
        return isinstance(row, list) and len(row) == pp and \
            all(isinstance(o, int) and not isinstance(o, bool) for o in row)

    if len(rows) != vpp or not all(integers(row) for row in rows):
        shape = f"{vpp} lists (one per pp_interleave_num chunk) of {pp} integers" if vpp > 1 else f"{pp} integers"
        draft.warn(f"model_config.offset {offset} is not {shape} (one per pipeline stage); not imported: "
                   f"an even split of the layers is assumed")
        return None
    for total, on_last in ((layers, 0), (layers + mtp, mtp)):
        base = total // (pp * vpp)
        sizes = [[base + rows[c][st] for c in range(vpp)] for st in range(pp)]
        if sum(map(sum, sizes)) != total or min(map(min, sizes)) < 0 or sizes[-1][-1] < on_last:
            continue
        sizes[-1][-1] -= on_last
        split = [sum(chunks) for chunks in sizes]
        note = "model_config.offset" + (f" (the {mtp} MTP layer(s) counted on the last stage)" if on_last else "")
        draft.set("parallel.stage_layers", split, note)
        even = [[n // vpp + (1 if c < n % vpp else 0) for c in range(vpp)] for n in split]
        if vpp > 1 and even != sizes:
            draft.warn(f"model_config.offset {offset} gives the chunks of a stage different layer counts "
                       f"({sizes}); memform splits each stage's layers evenly over its pp_interleave_num chunks "
                       f"({even})")
        return sizes
    draft.warn(f"model_config.offset {offset} does not add up to num_layers {layers}"
               + (f" (or {layers + mtp} with mtp_depth)" if mtp else "") + f" over {pp} stages"
               + (f" × {vpp} chunks" if vpp > 1 else "") + "; not imported: an even split is assumed")
    return None


def _recompute_counts(value: Any, sizes: list[list[int]]) -> list[list[int]] | None:
    """Layers recomputed in each [stage][chunk], as LayerSetting._format_recompute_list reads
    ``recompute`` / ``select_recompute``: true = every layer; one count per stage (true = all, false =
    none) shared out over the stage's chunks one layer at a time, chunk 0 first
    (_alloc_recompute_layer); or one list per chunk of per-stage counts; counts capped at the layers
    there. None when ``value`` has none of these shapes."""
    pp, vpp = len(sizes), len(sizes[0])
    if value is True:
        return [row[:] for row in sizes]
    if value is False or value is None:
        return [[0] * vpp for _ in range(pp)]

    def count(n: Any, cap: int) -> int | None:
        if isinstance(n, bool):
            return cap if n else 0
        return min(n, cap) if isinstance(n, int) and n >= 0 else None

    out = [[0] * vpp for _ in range(pp)]
    if isinstance(value, int):  # one count for every stage (MindFormers itself wants a list)
        value = [value] * pp
    if isinstance(value, list) and len(value) == pp and not any(isinstance(n, list) for n in value):
        for st, n in enumerate(value):
            left = count(n, sum(sizes[st]))
            if left is None:
                return None
            while left:
                for c in range(vpp):
                    if left and out[st][c] < sizes[st][c]:
                        out[st][c] += 1
                        left -= 1
        return out
    if isinstance(value, list) and len(value) == vpp and all(isinstance(r, (list, bool)) for r in value):
        for c, row in enumerate(value):
            items = [row] * pp if isinstance(row, bool) else row
            if len(items) != pp:
                return None
            for st, n in enumerate(items):
                got = count(n, sizes[st][c])
                if got is None:
                    return None
                out[st][c] = got
        return out
    return None


def _per_stage(counts: list[list[int]]) -> list[int] | None:
    """One count per stage when every chunk of a stage has the same (memform: the first n layers of
    each chunk of the stage); None otherwise."""
    if all(len(set(chunks)) == 1 for chunks in counts):
        return [chunks[0] for chunks in counts]
    return None


def _recompute(rc: Fields, draft: Draft, sizes: list[list[int]]) -> None:
    """MindFormers' LayerSetting (mindformers/models/utils.py): ``recompute`` true recomputes every
    layer, a list the first n layers of each stage (per chunk: see _recompute_counts);
    ``select_recompute`` true (or op patterns) makes the other layers selective, a list the first n
    layers of each stage; the comm-recompute switches and recompute_slice_activation go to the
    MindSpore profile's knobs. Per-chunk counts that differ between the chunks of a stage are written
    as one mode per layer (training.recompute_layers)."""
    full = rc.raw("recompute", False)
    select = rc.raw("select_recompute", False)
    rc.used.update(("recompute", "select_recompute"))
    pp = len(sizes)
    base = "none"
    sel_counts = None
    if select is True or (isinstance(select, (list, dict)) and select and
                          all(isinstance(k, str) for k in select)):
        base = "selective"
        if select is not True:
            draft.warn("recompute_config.select_recompute by op pattern is imported as selective recompute of "
                       "every layer (the MindSpore profile's selective: the SwiGLU activation, and the attention "
                       "core without flash attention)")
    elif isinstance(select, list) and _any_nonzero(select):
        sel_counts = _recompute_counts(select, sizes)
        if sel_counts is None:
            draft.warn(f"recompute_config.select_recompute {select} is not one layer count per pipeline stage "
                       f"({pp}) nor one such list per chunk; selective recompute of every layer assumed")
            base = "selective"
    full_counts = None
    if full is True:
        draft.set("training.recompute", "full", "recompute_config.recompute")
    elif isinstance(full, (int, list)) and not isinstance(full, bool) and (
            _any_nonzero(full) if isinstance(full, list) else full > 0):
        full_counts = _recompute_counts(full, sizes)
        if full_counts is None:
            draft.warn(f"recompute_config.recompute {full} is not one layer count per pipeline stage ({pp}) nor "
                       f"one such list per chunk; not imported: no full recompute assumed (activations "
                       f"overestimated)")
    if full is not True:
        why = ("the layers recompute_config.recompute leaves out" if full_counts is not None else
               "recompute_config.select_recompute" if base != "none" else "recompute_config: no recompute")
        draft.set("training.recompute", base, why)
    _recompute_layers(full_counts, sel_counts, base, sizes, draft)
    for key in ("mp_comm_recompute", "parallel_optimizer_comm_recompute"):
        if rc.has(key):
            draft.set(f"mindspore.{key}", rc.boolean(key), f"recompute_config.{key}")
    if rc.has("recompute_slice_activation"):
        # LayerSetting.set passes it to Cell.recompute only when recompute is true (every layer)
        sliced = rc.boolean("recompute_slice_activation") and full is True
        draft.set("mindspore.recompute_slice_activation", sliced, "recompute_config.recompute_slice_activation"
                  + ("" if full is True or not rc.boolean("recompute_slice_activation") else
                     ": MindFormers' LayerSetting applies it only with recompute: true"))
    comm = rc.raw("select_comm_recompute", False)
    if comm is not False and comm != [] and comm != {}:
        # recomputing selected layers' communication only frees memory: the estimate stays an upper bound
        draft.warn(f"recompute_config.select_comm_recompute {comm} is not modelled: the communication outputs "
                   f"it recomputes are counted as kept (an over-estimate)")
    for key in ("select_recompute_exclude", "select_comm_recompute_exclude"):
        value = rc.raw(key, False)
        if value not in (False, [], {}):
            raise rc.error(key, f"is {describe(value)}: operators excluded from recompute are kept, which memform "
                                f"does not model")
    draft.refuse_unused(rc)


def _recompute_layers(full: list[list[int]] | None, select: list[list[int]] | None, base: str,
                      sizes: list[list[int]], draft: Draft) -> None:
    """Per-stage counts as training.(selective_)recompute_num_layers; else one mode per body layer in
    forward order (chunk 0 of every stage, then chunk 1, ...), as memform lays the chunks out."""
    per_full = None if full is None else _per_stage(full)
    per_select = None if select is None else _per_stage(select)
    if (full is None or per_full is not None) and (select is None or per_select is not None):
        if per_full is not None:
            draft.set("training.recompute_num_layers", per_full, "recompute_config.recompute: first n layers "
                      "per stage" + (" (per chunk)" if len(sizes[0]) > 1 else ""))
        if per_select is not None:
            draft.set("training.selective_recompute_num_layers", per_select, "recompute_config.select_recompute: "
                      "first n layers per stage" + (" (per chunk)" if len(sizes[0]) > 1 else ""))
        return
    pp, vpp = len(sizes), len(sizes[0])
    stage_layers = draft.get("parallel.stage_layers")
    totals = stage_layers if stage_layers is not None else [sum(row) for row in sizes]
    chunked = [[n // vpp + (1 if c < n % vpp else 0) for c in range(vpp)] for n in totals]
    modes = []
    for c in range(vpp):
        for st in range(pp):
            for j in range(chunked[st][c]):
                if full is not None and j < full[st][c]:
                    modes.append("full")
                elif select is not None and j < select[st][c]:
                    modes.append("selective")
                else:
                    modes.append(base)
    draft.set("training.recompute_layers", modes, "recompute_config.recompute / select_recompute: the first n "
              "layers of each chunk, counts that differ between a stage's chunks (LayerSetting)")


def _training(runner: Fields, pc: Fields, draft: Draft) -> None:
    draft.set("training.micro_batch_size", runner.integer("batch_size", 1), "runner_config.batch_size")
    if draft.get("parallel.pp") > 1:
        draft.set("training.num_micro_batches", pc.integer("micro_batch_num", 1), "parallel_config.micro_batch_num")
        # base_trainer.py: "gradient_accumulation_steps will not take effect in pipeline parallel"
        runner.used.add("gradient_accumulation_steps")
    else:
        pc.used.add("micro_batch_num")
        steps = runner.integer("gradient_accumulation_steps", 1)
        draft.set("training.num_micro_batches", steps, "runner_config.gradient_accumulation_steps")


def _device(ctx: Fields, draft: Draft) -> None:
    """context.max_device_memory: the device memory MindSpore may use (callers refuse the rest of context)."""
    raw = ctx.raw("max_device_memory")
    if raw is None:
        return
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(GB|MB)\s*", str(raw), re.IGNORECASE)
    if not match:
        raise ctx.error("max_device_memory", f"must look like \"58GB\", got {describe(raw)}")
    value = float(match.group(1)) / (1024 if match.group(2).upper() == "MB" else 1)
    draft.set("device.capacity_gib", int(value) if value.is_integer() else value, "context.max_device_memory")


#: MindFormers' Adam family (mindformers/core/optim): two fp32 moments per parameter
ADAM_TYPES = ("adamw", "adam", "fusedadamweightdecay", "adamweightdecay", "fp32stateadamweightdecay",
              "pmaadamw", "adamwithmaxgradnorm",
              "adamweightdecayx")  # research/llama3/optim.py AdamWeightDecayX: adam_m, adam_v clone_state


def _optimizer(opt: Fields, draft: Draft) -> None:
    kind = opt.string("type", "AdamW")
    if kind.lower() not in ADAM_TYPES:
        raise opt.error("type", f"is {kind}: memform models MindFormers' Adam optimizers (AdamW, "
                                f"FusedAdamWeightDecay, ...); another keeps other optimizer states")
    draft.refuse_unused(opt, NEUTRAL_OPTIMIZER)
