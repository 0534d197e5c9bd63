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


def convert(path: Path, draft: Draft, given: set[str]) -> int | None:
    data = read_yaml_file(path)
    top = Fields(data, path)
    model = top.section("model")
    mc = model.section("model_config")
    if not mc.data:
        if looks_like_hyperparallel(data):
            raise MemformError(f"{path}: required field 'model.model_config' is missing: this file has "
                               f"{' and '.join(hyperparallel_marks(data))}, the shape of a HyperParallel "
                               f"memory-estimation YAML, not a MindFormers one; import it with "
                               f"'memform import hyperparallel {path}'")
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
    sizes = _parallel(pc, top.section("parallel"), mc, moe, draft)
    _recompute(top.section("recompute_config"), draft, sizes)
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


def _parallel(pc: Fields, par: Fields, mc: Fields, moe: Fields, draft: Draft) -> list[list[int]]:
    """The degrees, schedule, parallel optimizer and stage split; returns the body layers MindFormers
    puts in each [stage][chunk] (mindformers/models/utils.py LayerSetting: layer_list)."""
    dp = pc.integer("data_parallel", 1)
    tp = pc.integer("model_parallel", 1)
    pp = pc.integer("pipeline_stage", 1)
    draft.set("parallel.dp", dp, "parallel_config.data_parallel")
    draft.set("parallel.tp", tp, "parallel_config.model_parallel")
    draft.set("parallel.pp", pp, "parallel_config.pipeline_stage")
    vpp = _schedule(pc, par, mc, pp, draft)
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
    _parallel_optimizer(par, dp, cp, draft)
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
    draft.warn_unused(cfg)
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
    draft.warn_unused(opt)


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
    draft.warn_unused(rc, ("select_comm_recompute", "select_recompute_exclude", "select_comm_recompute_exclude"))


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
