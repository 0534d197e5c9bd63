"""MindFormers training YAML → a memform config (model, MoE, parallel strategy, recompute, device).

MemEst users start from these files. The fields read are the ones MemEst's MindFormers parser
normalises (reference notes ``memest-formulas.md`` §3.2-3.3): ``model.model_config.*``,
``moe_config.*``, ``parallel_config.*``, ``parallel.enable_parallel_optimizer`` and
``parallel.parallel_optimizer_config``, ``recompute_config``, ``runner_config.batch_size`` and
``context.max_device_memory``. The config runs under the MindSpore framework profile
(``training.framework: mindspore``, ``formulas/frameworks/mindspore.mf``), whose ``mindspore.*``
knobs take MindSpore's own settings (parallel optimizer, vocab_emb_dp, compute dtypes, comm recompute).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..engine.config import load_yaml
from ..errors import MemformError
from .draft import Draft, Fields, describe, dtype_name, gated_ffn_size

TITLE = "MindFormers YAML"

#: top-level sections that do not describe memory (I/O, datasets, schedules, callbacks, ...)
IGNORED_SECTIONS = frozenset({
    "seed", "output_dir", "run_mode", "load_checkpoint", "load_ckpt_format", "src_strategy_path_or_dir",
    "auto_trans_ckpt", "only_save_strategy", "resume_training", "use_parallel", "trainer",
    "train_dataset", "train_dataset_task", "eval_dataset", "eval_dataset_task", "do_eval",
    "eval_step_interval", "eval_epoch_interval", "lr_schedule", "callbacks", "profile",
    "profile_start_step", "profile_stop_step", "profile_communication", "profile_memory",
    "init_start_profile", "processor", "metric", "layer_scale", "layer_decay", "lr_scale",
    "lr_scale_factor", "runner_wrapper", "micro_batch_interleave_num", "monitor_config",
    "tensorboard", "ignore_data_skip", "data_skip_steps", "swap_config", "remove_redundancy",
    "use_legacy", "pretrained_model_dir", "print_separate_loss", "train_precision_sync",
    "infer_precision_sync", "postprocess_use_numpy", "moe_config", "parallel_config", "parallel",
    "recompute_config", "context", "runner_config", "model", "optimizer", "auto_tune", "filepath_prefix",
    "autotune_per_step", "src_strategy_path", "load_ckpt_async", "use_graceful_exit",
})
#: model_config fields that move no training memory, or that inference alone reads
IGNORED_MODEL = frozenset({
    "type", "batch_size", "max_position_embeddings", "rope_theta", "theta", "scaling_factor",
    "extend_method", "use_past", "is_dynamic", "pad_token_id", "bos_token_id", "eos_token_id",
    "ignore_token_id", "repetition_penalty", "max_decode_length", "top_k", "top_p", "do_sample",
    "checkpoint_name_or_path", "embedding_init_type", "fine_grain_interleave", "use_attn_mask_compression",
    "fused_rms_norm", "use_fused_rope", "use_fused_swiglu", "block_size", "num_blocks", "qkv_concat",
    "parallel_decoding_params", "input_sliced_sig", "return_extra_loss", "init_method_std",
    "rotary_dtype", "router_dense_type",
    "use_rope_slice", "use_ring_attention", "use_eod_attn_mask_compression", "return_hidden_states",
    "mtp_loss_factor", "use_force_load_balance", "input_layernorm_compute_type", "rotary_emb_base",
    "use_fallback", "auto_map", "pet_config", "use_past_shard", "compute_in_2d", "use_flash_attention_2",
    "moe_config", "parallel_config", "model_name", "kv_channels_dtype", "use_rope_self_define",
})
IGNORED_MOE = frozenset({
    "routing_policy", "use_fused_ops_topkrouter", "topk_group", "n_group", "use_gating_sigmoid",
    "aux_loss_types", "aux_loss_factors", "aux_loss_factor", "z_loss_factor", "balance_via_topk_bias",
    "topk_bias_update_rate", "norm_topk_prob", "routed_scaling_factor", "comp_comm_parallel",
    "comp_comm_parallel_degree", "group_wise_a2a", "enable_sdrop", "router_dense_type",
    "calculate_per_token_loss", "enable_deredundency", "npu_nums_per_device", "use_allgather_dispatcher",
    "expert_group_size", "max_router_load", "use_fused_ops_permute",
    "enable_cold_hot_expert", "update_step", "hot_expert_num", "cold_token_percent", "moe_module_name",
    "callback_moe_droprate", "init_norm_topk_prob", "use_pad_tokens", "enable_gmm_safe_tokens",
    "router_activation_type", "aux_loss_config", "first_k_dense_replace", "shared_expert_num",
})
IGNORED_PARALLEL_CONFIG = frozenset({
    "gradient_aggregation_group", "optimizer_shard", "recompute",
    "seq_split_num", "use_ring_attention", "mem_coeff",
})
CP_ALGOS = {"colossalai_cp": "ring", "ulysses_cp": "ulysses"}


def read_yaml_file(path: Path) -> dict:
    data = load_yaml(path, "MindFormers config")
    if not isinstance(data, dict):
        raise MemformError(f"{path}: a MindFormers config must be a YAML mapping, got {describe(data)}")
    return data


def convert(path: Path, draft: Draft, given: set[str]) -> int | None:
    data = read_yaml_file(path)
    top = Fields(data, path)
    model = top.section("model")
    mc = model.section("model_config")
    if not mc.data:
        raise top.missing("model.model_config")
    arch = model.section("arch").string("type", "") if model.has("arch") else ""
    kind = mc.string("type", "")
    draft.header.append(f"model: {arch or kind or 'type not stated'}")
    # MindSpore's allocation (parallel optimizer, replicated vocabulary, dtypes): frameworks/mindspore.mf
    draft.set("training.framework", "mindspore", "MindFormers trains on MindSpore")
    _model(mc, draft)
    moe = top.section("moe_config")
    _moe(moe, mc, draft)
    pc = top.section("parallel_config")
    _parallel(pc, top.section("parallel"), mc, moe, draft)
    _recompute(top.section("recompute_config"), draft)
    _training(top, pc, draft)
    _device(top.section("context"), draft)
    optimizer = top.section("optimizer").string("type", "AdamW") if top.has("optimizer") else "AdamW"
    if "adam" not in optimizer.lower():
        draft.warn(f"optimizer.type {optimizer}: memform counts Adam's two moments")
    draft.warn_unused(mc, IGNORED_MODEL)
    draft.warn_unused(moe, IGNORED_MOE)
    draft.warn_unused(pc, IGNORED_PARALLEL_CONFIG)
    draft.warn_unused(top, IGNORED_SECTIONS)
    return None


def _model(mc: Fields, draft: Draft) -> None:
    h = mc.integer("hidden_size")
    a = mc.integer("num_heads")
    draft.set("model.hidden_size", h)
    draft.set("model.num_heads", a)
    kv = mc.integer("n_kv_heads", None)
    draft.set("model.num_kv_heads", kv or a, "n_kv_heads" if kv else "n_kv_heads null: multi-head attention")
    draft.set("model.num_layers", mc.integer("num_layers"))
    if mc.has("intermediate_size"):
        draft.set("model.ffn_hidden_size", mc.integer("intermediate_size"), "intermediate_size")
    else:
        multiple = mc.integer("multiple_of", 256)
        fdm = mc.number("ffn_dim_multiplier", None)
        draft.set("model.ffn_hidden_size", gated_ffn_size(h, multiple, fdm),
                  f"from multiple_of {multiple}" + (f", ffn_dim_multiplier {fdm}" if fdm else "") +
                  " (Llama's 8h/3 rule)")
    mc.used.update(("multiple_of", "ffn_dim_multiplier"))
    draft.set("model.vocab_size", mc.integer("vocab_size"))
    draft.set("model.seq_length", mc.integer("seq_length"))
    act = mc.string("hidden_act", "silu")
    if act.lower() in ("silu", "swish", "swiglu"):
        draft.set("model.activation", "swiglu", f"hidden_act {act}: gated MLP (gate, up, down)"
                  if mc.has("hidden_act") else "MindFormers' LlamaFeedForward: gated SiLU")
    else:
        draft.set("model.activation", "gelu", f"hidden_act {act}")
    if mc.has("rms_norm_eps") or mc.has("norm_eps") or not mc.has("layernorm_epsilon"):
        draft.set("model.norm", "rmsnorm", "RMSNorm (rms_norm_eps / MindFormers' Llama and DeepSeek models)")
    else:
        draft.set("model.norm", "layernorm", "layernorm_epsilon")
    mc.used.update(("rms_norm_eps", "norm_eps", "layernorm_epsilon"))
    draft.set("model.bias", mc.boolean("qkv_has_bias", False) or mc.boolean("mlp_has_bias", False),
              "qkv_has_bias / mlp_has_bias")
    draft.default("model.dropout", False, "MindFormers' LLM configs train without dropout")
    mc.used.update(("hidden_dropout_prob", "attention_dropout_prob"))
    draft.set("model.flash_attention", mc.boolean("use_flash_attention", False), "use_flash_attention")
    draft.set("model.tied_embeddings", mc.boolean("tie_word_embeddings", False), "tie_word_embeddings")
    draft.set("model.position_embedding", "rope", "rotary (MindFormers' Llama and DeepSeek models)")
    if mc.has("param_init_type"):
        draft.set("training.precision.params", dtype_name(mc.string("param_init_type"), mc, "param_init_type"),
                  "param_init_type")
    if mc.has("compute_dtype"):
        draft.set("training.precision.activations", dtype_name(mc.string("compute_dtype"), mc, "compute_dtype"),
                  "compute_dtype")
    for key in ("layernorm_compute_type", "softmax_compute_type"):
        if mc.has(key):
            draft.set(f"mindspore.{key}", dtype_name(mc.string(key), mc, key), f"model_config.{key}")
    if mc.has("fused_rms_norm"):
        draft.set("mindspore.fused_rms_norm", mc.boolean("fused_rms_norm"), "model_config.fused_rms_norm")
    if mc.has("kv_lora_rank"):
        draft.set("model.attention", "mla", "kv_lora_rank present: multi-head latent attention")
        draft.set("model.q_lora_rank", mc.integer("q_lora_rank", 0, minimum=0), "q_lora_rank (null/0: none)")
        draft.set("model.kv_lora_rank", mc.integer("kv_lora_rank"))
        for key in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            draft.set(f"model.{key}", mc.integer(key))
    else:
        mc.used.update(("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"))
    mtp = mc.integer("mtp_depth", 0, minimum=0)
    if mtp:
        draft.set("model.mtp_layers", mtp, "mtp_depth")


def _moe(moe: Fields, mc: Fields, draft: Draft) -> None:
    experts = moe.integer("expert_num", 1)
    if experts <= 1:
        moe.used.update(moe.data)
        return
    draft.set("model.num_experts", experts, "moe_config.expert_num")
    draft.set("model.moe_top_k", moe.integer("num_experts_chosen", 1), "moe_config.num_experts_chosen")
    if moe.has("moe_intermediate_size"):
        draft.set("model.moe_ffn_hidden_size", moe.integer("moe_intermediate_size"), "moe_config.moe_intermediate_size")
    else:
        draft.set("model.moe_ffn_hidden_size", draft.get("model.ffn_hidden_size"),
                  "no moe_intermediate_size: each expert is intermediate_size wide")
    draft.set("model.num_shared_experts", moe.integer("shared_expert_num", 0, minimum=0),
              "moe_config.shared_expert_num")
    dense = moe.integer("first_k_dense_replace", 0, minimum=0)
    if dense:
        draft.set("model.first_k_dense", dense, "moe_config.first_k_dense_replace")
    if moe.has("capacity_factor"):
        draft.set("model.capacity_factor", moe.number("capacity_factor"), "moe_config.capacity_factor")
    if moe.has("use_gmm"):
        draft.set("model.moe_grouped_gemm", moe.boolean("use_gmm"), "moe_config.use_gmm")


def _expert_tp(moe: Fields, pc: Fields, tp: int, draft: Draft) -> None:
    """``expert_model_parallel`` is the experts' model-parallel degree, 1 or model_parallel; absent,
    the experts split over model_parallel (llama_layer.py LlamaFeedForward: mp_moe)."""
    for fields in (moe, pc):
        if fields.has("expert_model_parallel"):
            etp = fields.integer("expert_model_parallel")
            if etp not in (1, tp):
                raise fields.error("expert_model_parallel", f"must be 1 or model_parallel ({tp}), got {etp} "
                                   f"(MindFormers accepts no other value)")
            draft.set("parallel.expert_tp", etp, fields.name("expert_model_parallel"))
            return
        fields.used.add("expert_model_parallel")
    draft.set("parallel.expert_tp", tp, "no expert_model_parallel: experts split over model_parallel")


def _parallel(pc: Fields, par: Fields, mc: Fields, moe: Fields, draft: Draft) -> None:
    dp = pc.integer("data_parallel", 1)
    tp = pc.integer("model_parallel", 1)
    pp = pc.integer("pipeline_stage", 1)
    draft.set("parallel.dp", dp, "parallel_config.data_parallel")
    draft.set("parallel.tp", tp, "parallel_config.model_parallel")
    draft.set("parallel.pp", pp, "parallel_config.pipeline_stage")
    vpp = mc.integer("pp_interleave_num", 1)
    if vpp > 1:
        draft.set("parallel.vpp", vpp, "model_config.pp_interleave_num")
    cp = pc.integer("context_parallel", 1)
    algo = pc.string("context_parallel_algo", "colossalai_cp")
    if cp > 1:
        draft.set("parallel.cp", cp, "parallel_config.context_parallel")
        if algo not in CP_ALGOS:
            draft.warn(f"parallel_config.context_parallel_algo {algo} is not modelled; counted as ring attention")
        draft.set("parallel.cp_algo", CP_ALGOS.get(algo, "ring"), f"context_parallel_algo {algo}")
    if "model.num_experts" in draft:
        draft.set("parallel.ep", pc.integer("expert_parallel", 1), "parallel_config.expert_parallel")
        _expert_tp(moe, pc, tp, draft)
    else:
        pc.used.update(("expert_parallel", "expert_model_parallel"))
        moe.used.add("expert_model_parallel")
    draft.set("parallel.sequence_parallel", pc.boolean("use_seq_parallel", False), "use_seq_parallel")
    # TransformerOpParallelConfig's default is vocab_emb_dp=True (mindformers/modules/transformer)
    draft.set("mindspore.vocab_emb_dp", pc.boolean("vocab_emb_dp", True),
              "parallel_config.vocab_emb_dp" if pc.has("vocab_emb_dp") else
              "no vocab_emb_dp: MindFormers' default True")
    _parallel_optimizer(par, dp, draft)
    offset = mc.raw("offset", 0)
    layers, mtp = draft.get("model.num_layers"), draft.get("model.mtp_layers", 0)
    if isinstance(offset, list) and any(offset) and pp > 1:
        _stage_layers(offset, layers, mtp, pp, draft)
    elif isinstance(offset, int) and offset and pp > 1:
        draft.warn(f"model_config.offset {offset} (one number) is not imported: give one entry per stage")


def _parallel_optimizer(par: Fields, dp: int, draft: Draft) -> None:
    """MindSpore's parallel optimizer (AutoParallel.hsdp / parallel_optimizer_config): weights and
    optimizer states sharded over ``optimizer_weight_shard_size`` ranks (-1: all that hold the slice),
    gradients too with gradient_accumulation_shard (MindSpore's default True) or level2/3."""
    enabled = par.boolean("enable_parallel_optimizer", False)
    draft.set("mindspore.parallel_optimizer", enabled, "parallel.enable_parallel_optimizer"
              if par.has("enable_parallel_optimizer") else "no enable_parallel_optimizer: MindSpore's default off")
    opt = par.section("parallel_optimizer_config")
    if not enabled:
        opt.used.update(opt.data)
        return
    size = opt.integer("optimizer_weight_shard_size", -1, minimum=-1)
    if size == 0:
        raise opt.error("optimizer_weight_shard_size", "must be -1 (all ranks) or a positive group size, got 0")
    if size > 1:
        draft.set("parallel.zero_shard_max", size, "parallel_optimizer_config.optimizer_weight_shard_size")
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
    draft.warn_unused(opt)


def _stage_layers(offset: list[Any], layers: int, mtp: int, pp: int, draft: Draft) -> None:
    """MindFormers gives each stage ``L // pp + offset[i]`` layers (MemEst counts MTP in ``L``)."""
    if len(offset) != pp or not all(isinstance(o, int) and not isinstance(o, bool) for o in offset):
        draft.warn(f"model_config.offset {offset} is not one integer per pipeline stage ({pp}); "
                   f"not imported (even split used)")
        return
    for total, on_last in ((layers, 0), (layers + mtp, mtp)):
        split = [total // pp + o for o in offset]
        if sum(split) == total and split[-1] >= on_last:
            split[-1] -= on_last
            note = "model_config.offset" + (f" (the {mtp} MTP layer(s) counted on the last stage)" if on_last else "")
            draft.set("parallel.stage_layers", split, note)
            return
    draft.warn(f"model_config.offset {offset} does not add up to num_layers {layers} over {pp} stages; "
               f"not imported (even split used)")


def _stage_counts(value: Any, pp: int, layers: int) -> list[int] | None:
    """A per-stage layer count list (MindFormers: true = every layer of the stage, false = none);
    None when it is not one entry per stage (e.g. per pp-interleave chunk)."""
    if not isinstance(value, list) or len(value) != pp:
        return None
    counts = []
    for n in value:
        if isinstance(n, bool):
            counts.append(layers if n else 0)
        elif isinstance(n, int) and n >= 0:
            counts.append(n)
        else:
            return None
    return counts


def _recompute(rc: Fields, draft: Draft) -> None:
    """MindFormers' LayerSetting (mindformers/models/utils.py): ``recompute`` true recomputes every
    layer, a list the first n layers of each stage; ``select_recompute`` true (or op patterns) makes the
    other layers selective, a list the first n layers of each stage; the comm-recompute switches and
    recompute_slice_activation go to the MindSpore profile's knobs."""
    full = rc.raw("recompute", False)
    select = rc.raw("select_recompute", False)
    rc.used.update(("recompute", "select_recompute"))
    pp, layers = draft.get("parallel.pp"), draft.get("model.num_layers")
    base = "none"
    if select is True or (isinstance(select, (list, dict)) and select and
                          all(isinstance(k, str) for k in select)):
        base = "selective"
        if select is not True:
            draft.warn("recompute_config.select_recompute by op pattern is imported as selective recompute of "
                       "every layer (the MindSpore profile's selective: the SwiGLU activation, and the attention "
                       "core without flash attention)")
    elif isinstance(select, list) and any(select):
        counts = _stage_counts(select, pp, layers)
        if counts is None:
            draft.warn(f"recompute_config.select_recompute {select} is not one layer count per pipeline stage "
                       f"({pp}); imported as selective recompute of every layer")
            base = "selective"
        else:
            draft.set("training.selective_recompute_num_layers", counts,
                      "recompute_config.select_recompute: first n layers per stage")
    if full is True:
        draft.set("training.recompute", "full", "recompute_config.recompute")
    elif isinstance(full, int) and not isinstance(full, bool) and full > 0:
        draft.set("training.recompute", base, "the layers recompute_config.recompute leaves out")
        draft.set("training.recompute_num_layers", full, "recompute_config.recompute: first n layers per stage")
    elif isinstance(full, list) and any(full):
        counts = _stage_counts(full, pp, layers)
        if counts is None:
            draft.warn(f"recompute_config.recompute {full} is not one layer count per pipeline stage ({pp}); "
                       f"not imported (activations overestimated)")
            draft.set("training.recompute", base, "recompute_config.select_recompute")
        else:
            draft.set("training.recompute", base, "the layers recompute_config.recompute leaves out")
            draft.set("training.recompute_num_layers", counts, "recompute_config.recompute: first n layers per stage")
    else:
        draft.set("training.recompute", base, "recompute_config.select_recompute" if base != "none" else
                  "recompute_config: no recompute")
    for key in ("mp_comm_recompute", "parallel_optimizer_comm_recompute"):
        if rc.has(key):
            draft.set(f"mindspore.{key}", rc.boolean(key), f"recompute_config.{key}")
    if rc.has("recompute_slice_activation"):
        # LayerSetting.set passes it to Cell.recompute only when recompute is true (every layer)
        sliced = rc.boolean("recompute_slice_activation") and full is True
        draft.set("mindspore.recompute_slice_activation", sliced, "recompute_config.recompute_slice_activation"
                  + ("" if full is True or not rc.boolean("recompute_slice_activation") else
                     ": MindFormers' LayerSetting applies it only with recompute: true"))
    draft.warn_unused(rc, ("select_comm_recompute", "select_recompute_exclude", "select_comm_recompute_exclude"))


def _training(top: Fields, pc: Fields, draft: Draft) -> None:
    runner = top.section("runner_config")
    draft.set("training.micro_batch_size", runner.integer("batch_size", 1), "runner_config.batch_size")
    if draft.get("parallel.pp") > 1:
        draft.set("training.num_micro_batches", pc.integer("micro_batch_num", 1), "parallel_config.micro_batch_num")
    else:
        pc.used.add("micro_batch_num")
        steps = runner.integer("gradient_accumulation_steps", 1)
        draft.set("training.num_micro_batches", steps, "runner_config.gradient_accumulation_steps")


def _device(ctx: Fields, draft: Draft) -> None:
    raw = ctx.raw("max_device_memory")
    ctx.used.update(ctx.data)
    if raw is None:
        return
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(GB|MB)\s*", str(raw), re.IGNORECASE)
    if not match:
        raise ctx.error("max_device_memory", f"must look like \"58GB\", got {describe(raw)}")
    value = float(match.group(1)) / (1024 if match.group(2).upper() == "MB" else 1)
    draft.set("device.capacity_gib", int(value) if value.is_integer() else value, "context.max_device_memory")
