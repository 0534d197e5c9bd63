"""HyperParallel memory-estimation YAML → a memform config (model, parallel strategy, recompute, device).

MemEst (mindspore-ai/hyper-parallel, ``hyper_parallel/auto_parallel/sapp_nd``) reads this format
with ``nd/common/framework_parsers/cost_model_parser_hyper.py`` (``CostModelParserHyperV2``; at commit
0ef883c its ``config_overrides`` fallback and ``_parse_parallelism`` / ``_parse_batch`` /
``_parse_recompute`` / ``_init_bytes``); its fixture is
``memory_estimation/test_cases/mixtral/default.yaml`` (reference notes ``memest-formulas.md`` §3.1)::

    model:   name, param_init_type, compute_dtype, softmax_compute_type,
             config_overrides: {hidden_size, num_hidden_layers, num_attention_heads, ...}
    data:    max_seq_len
    train:   global_batch_size, micro_batch_size, micro_batch_num,
             accelerator: {dp_replicate, dp_shard, tp_degree, pipeline_parallel_degree,
                           expert_parallel_degree, use_seq_parallel, enable_parallel_optimizer, ...}
             optimizer: {type, max_grad_norm}
             gradient_checkpointing: {activation_checkpoint: none | selective | full}
    context: max_device_memory

Defaults are the parser's own, so that an omitted field means what it means to MemEst. MemEst
prices the run with its parallel-optimizer model (``has_op``: weights and optimizer states sharded
over ``optimizer_weight_shard_size`` ranks, gradients only with ``gradient_accumulation_shard``;
``_cost_model_parser.py`` ``config_optimizer_shard``), parameters in ``param_init_type`` with no
separate master copy, fp32 gradients and Adam moments (``_init_bytes``), flash attention and a
data-parallel vocabulary (``_parse_feature_flags``): that is MindSpore's allocation, so the config
runs under the MindSpore profile (``training.framework: mindspore``, ``formulas/frameworks/mindspore.mf``).

A field the importer neither reads nor lists in a NEUTRAL table (with the reason it cannot change device
memory) is refused (Draft.refuse_unused; ``--accept`` vouches for one), and so is a file whose shape lives
elsewhere (``model.name`` + ``weights_path`` with partial ``config_overrides``), a non-Adam optimizer and
a ``train.mixed_precision`` policy that disagrees with MemEst's dtypes.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import MemformError
from .draft import Draft, Fields, describe, dtype_name, gated_ffn_size
from .mindformers import CP_ALGOS, NEUTRAL_CONTEXT, _any_nonzero, _device, _reasons, read_yaml_file

TITLE = "HyperParallel memory-estimation YAML"

#: MemEst's pipeline schedule names (pp_sched, memest-formulas.md §2.2) → memform schedules
SCHEDULES = {"1f1b": "1f1b", "gpipe": "gpipe", "seqpipe": "seqpipe", "seqsmartvpp": "seqpipe",
             "zero_bubble_v": "zero-bubble-v"}
#: config_overrides fields that move no training memory (each with the reason)
NEUTRAL_OVERRIDES = _reasons(
    ("rotary frequencies and position limits: RoPE has no weights (the sequence is data.max_seq_len)",
     ("rope_theta", "rope_scaling", "partial_rotary_factor")),
    ("norm epsilons, weight initialisation, token ids, names: scalars",
     ("rms_norm_eps", "norm_eps", "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id",
      "model_type", "architectures", "torch_dtype", "use_cache")),
    ("MoE routing and balancing choices: O(experts) scalars per layer",
     ("router_aux_loss_coef", "output_router_logits", "norm_topk_prob", "routed_scaling_factor", "scoring_func",
      "topk_method", "topk_group", "n_group")),
    ("attention dropout at rate 0 in LLM pre-training; MemEst counts no dropout", ("attention_dropout",)),
)
#: top-level sections that do not describe what a device holds
NEUTRAL_SECTIONS = _reasons(
    ("run bookkeeping, checkpoints, logging, datasets, callbacks",
     ("seed", "output_dir", "run_mode", "checkpoint", "logging", "lr_scheduler", "dataset", "profile",
      "callbacks", "trainer")),
)
#: model fields besides config_overrides that move no memory
NEUTRAL_MODEL = _reasons(
    ("where the weights and tokenizer are loaded from", ("weights_path", "tokenizer_path")),
)
#: data fields besides max_seq_len: the host-side loader
NEUTRAL_DATA = _reasons(
    ("the host-side data loader (the device batch is train.micro_batch_size × data.max_seq_len)",
     ("type", "train_path", "eval_path", "shuffle", "num_workers", "pin_memory", "drop_last", "prefetch_factor")),
)
NEUTRAL_TRAIN = _reasons(
    ("schedule lengths, seeds, logging and checkpoint cadence: how many steps, not what a step holds",
     ("lr", "max_steps", "steps", "epochs", "num_train_epochs", "seed", "log_interval", "save_interval",
      "lr_scheduler", "warmup_steps", "checkpoint", "logging", "debug")),
    ("the runtime (torch on Ascend) and where the model is first built (meta: no memory until sharded)",
     ("backend", "init_device")),
)
NEUTRAL_OPTIMIZER = _reasons(
    ("Adam's hyper-parameters and the learning-rate schedule: scalars",
     ("lr", "lr_min", "lr_decay_style", "lr_warmup_ratio", "weight_decay", "betas", "eps", "beta1", "beta2",
      "loss_aggregation")),
    ("gradient clipping: MemEst adds a clipping buffer (has_clip) memform does not count; the norm itself is "
     "a scalar", ("max_grad_norm",)),
)


def convert(path: Path, draft: Draft, given: set[str]) -> int | None:
    """Fill ``draft`` from the YAML at ``path``; the device count is dp × tp × pp × cp (None: derived)."""
    data = read_yaml_file(path)
    top = Fields(data, path)
    model = top.section("model")
    co = model.section("config_overrides")
    if not co.data:
        if top.has("model") and model.has("model_config"):
            raise top.missing("model.config_overrides", ": this file has 'model.model_config', the shape of "
                              f"a MindFormers YAML; import it with 'memform import mindformers {path}'")
        raise top.missing("model.config_overrides", " (HyperParallel's model hyper-parameters: hidden_size, "
                                                    "num_hidden_layers, num_attention_heads, ...)")
    if not co.has("hidden_size") and (model.has("name") or model.has("weights_path")):
        # HyperParallel's trainer builds the model from model.name's module and the config.json in
        # weights_path; config_overrides only changes some of its fields (cost_model_parser_hyper.py:
        # _resolve_via_direct_import, with config_overrides as the fallback)
        raise MemformError(
            f"{path}: the model's shape is not in this file: 'model.config_overrides' has no hidden_size, and "
            f"HyperParallel takes the shape from model '{model.raw('name', '?')}' and the config.json in "
            f"'model.weights_path' ({model.raw('weights_path', 'not given')}), changing only "
            f"{', '.join(sorted(map(str, co.data))) or 'nothing'}. Import that config.json with 'memform import "
            f"hf' (and --set the overrides and the strategy), or give the shape in config_overrides")
    # MindSpore's allocation, as MemEst prices a HyperParallel run (module docstring)
    draft.set("training.framework", "mindspore", "MemEst prices HyperParallel runs with its parallel-optimizer "
              "model (cost_model_parser_hyper.py): frameworks/mindspore.mf")
    if model.has("name"):
        draft.set("name", model.string("name"), "model.name")
    draft.header.append(f"model: {model.raw('name', 'name not stated')}")
    train = top.section("train")
    accel = train.section("accelerator")
    _model(co, top.section("data"), draft)
    _moe(co, draft)
    _precision(model, draft)
    pp = _parallel(accel, draft)
    _batch(train, pp, draft)
    _recompute(train.section("gradient_checkpointing"), co, draft)
    _device_memory(top.section("context"), draft)
    _optimizer(train.section("optimizer"), draft)
    _mixed_precision(train.section("mixed_precision"), draft)
    model.used.update(("config_overrides", "name"))
    draft.refuse_unused(co, NEUTRAL_OVERRIDES)
    draft.refuse_unused(model, NEUTRAL_MODEL)
    draft.refuse_unused(accel)
    train.used.update(("accelerator", "optimizer", "gradient_checkpointing", "mixed_precision"))
    draft.refuse_unused(train, NEUTRAL_TRAIN)
    top.used.update(("model", "data", "train", "context"))
    draft.refuse_unused(top, NEUTRAL_SECTIONS)
    return None


def _model(co: Fields, data: Fields, draft: Draft) -> None:
    h = co.integer("hidden_size")
    a = co.integer("num_attention_heads")
    draft.set("model.hidden_size", h, "config_overrides.hidden_size")
    draft.set("model.num_heads", a, "config_overrides.num_attention_heads")
    kv = co.integer("num_key_value_heads", None)
    draft.set("model.num_kv_heads", kv or a, "config_overrides.num_key_value_heads" if kv else
              "no num_key_value_heads: multi-head attention (MemEst: n_kv = a)")
    draft.set("model.num_layers", co.integer("num_hidden_layers"), "config_overrides.num_hidden_layers")
    multiple = co.integer("multiple_of", 256)
    fdm = co.number("ffn_dim_multiplier", None)
    if co.has("intermediate_size"):
        draft.set("model.ffn_hidden_size", co.integer("intermediate_size"), "config_overrides.intermediate_size")
    else:
        draft.set("model.ffn_hidden_size", gated_ffn_size(h, multiple, fdm),
                  f"no intermediate_size: from multiple_of {multiple}" + (f", ffn_dim_multiplier {fdm}" if fdm else "")
                  + " (Llama's 8h/3 rule)")
    draft.set("model.vocab_size", co.integer("vocab_size"), "config_overrides.vocab_size")
    # the sequence: data.max_seq_len, else max_position_embeddings, else seq_length, else 4096 (MemEst)
    if data.has("max_seq_len"):
        draft.set("model.seq_length", data.integer("max_seq_len"), "data.max_seq_len")
        co.used.update(("max_position_embeddings", "seq_length"))
    else:
        key, seq = co.first(("max_position_embeddings", "seq_length"), co.integer)
        if seq is None:
            draft.default("model.seq_length", 4096, "no data.max_seq_len: MemEst's default 4096")
        else:
            draft.set("model.seq_length", seq, f"no data.max_seq_len: config_overrides.{key}")
    draft.refuse_unused(data, NEUTRAL_DATA)
    act = co.string("hidden_act", "silu")
    if act.lower() in ("silu", "swish", "swiglu"):
        draft.set("model.activation", "swiglu", f"config_overrides.hidden_act {act}" if co.has("hidden_act")
                  else "gated SiLU MLP (MemEst: three FFN matmuls, n_ffMM = 3)")
    else:
        draft.set("model.activation", "gelu", f"config_overrides.hidden_act {act}")
    draft.set("model.norm", "rmsnorm", "RMSNorm (the Llama-family models HyperParallel trains)")
    draft.set("model.bias", False, "no biases (the Llama-family models HyperParallel trains)")
    draft.default("model.dropout", False, "no dropout in LLM pre-training")
    draft.set("model.position_embedding", "rope", "rotary (the Llama-family models HyperParallel trains)")
    draft.set("model.flash_attention", True, "MemEst's HyperParallel parser assumes flash attention (has_fa)")
    tied = co.boolean("tie_word_embeddings", False)
    draft.set("model.tied_embeddings", tied, "config_overrides.tie_word_embeddings" if co.has("tie_word_embeddings")
              else "separate output head (MemEst: tie_emb_out false)")
    if co.has("kv_lora_rank") and co.integer("kv_lora_rank", 0, minimum=0) > 0:
        draft.set("model.attention", "mla", "config_overrides.kv_lora_rank: multi-head latent attention")
        draft.set("model.q_lora_rank", co.integer("q_lora_rank", 0, minimum=0), "config_overrides.q_lora_rank")
        draft.set("model.kv_lora_rank", co.integer("kv_lora_rank"), "config_overrides.kv_lora_rank")
        for key in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            draft.set(f"model.{key}", co.integer(key), f"config_overrides.{key}")
    else:
        co.used.update(("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"))
    mtp = co.integer("mtp_depth", 0, minimum=0)
    if mtp:
        draft.set("model.mtp_layers", mtp, "config_overrides.mtp_depth")


def _moe(co: Fields, draft: Draft) -> None:
    experts = co.integer("num_experts", 1)
    names = ("num_experts_per_tok", "moe_intermediate_size", "num_shared_experts", "n_shared_experts",
             "first_k_dense_replace", "capacity_factor")
    if experts <= 1:
        co.used.update(names)
        return
    draft.set("model.num_experts", experts, "config_overrides.num_experts")
    draft.set("model.moe_top_k", co.integer("num_experts_per_tok", 1), "config_overrides.num_experts_per_tok")
    if co.has("moe_intermediate_size"):
        draft.set("model.moe_ffn_hidden_size", co.integer("moe_intermediate_size"),
                  "config_overrides.moe_intermediate_size")
    else:
        draft.set("model.moe_ffn_hidden_size", draft.get("model.ffn_hidden_size"),
                  "no moe_intermediate_size: each expert is intermediate_size wide")
    key, shared = co.first(("num_shared_experts", "n_shared_experts"), lambda k: co.integer(k, 0, minimum=0))
    draft.set("model.num_shared_experts", shared or 0, f"config_overrides.{key}" if key else "no shared experts")
    dense = co.integer("first_k_dense_replace", 0, minimum=0)
    if dense:
        draft.set("model.first_k_dense", dense, "config_overrides.first_k_dense_replace")
    if co.has("capacity_factor"):
        draft.set("model.capacity_factor", co.number("capacity_factor"), "config_overrides.capacity_factor")
    # MemEst's parser routes HyperParallel's experts dropless through one grouped matmul (gmm = True),
    # so no expert buffer is padded to the capacity (moe.mf: pad = cap only without grouped GEMM)
    draft.set("model.moe_grouped_gemm", True, "MemEst's HyperParallel parser: grouped matmul, dropless (gmm)")


def _precision(model: Fields, draft: Draft) -> None:
    """MemEst's _init_bytes: bytes_p from param_init_type (default float32), bytes_compute from
    compute_dtype (bfloat16), bytes_softmax from softmax_compute_type (float32); gradients, Adam
    moments and norms in fp32."""
    for key, memform_key, default in (("param_init_type", "training.precision.params", "float32"),
                                      ("compute_dtype", "training.precision.activations", "bfloat16")):
        value = dtype_name(model.string(key, default), model, key)
        if model.has(key):
            draft.set(memform_key, value, f"model.{key}")
        else:
            draft.default(memform_key, value, f"no model.{key}: MemEst's default {default}")
    draft.set("training.precision.grads", "fp32", "MemEst's HyperParallel parser: fp32 gradients (bytes_grad 4)")
    softmax = dtype_name(model.string("softmax_compute_type", "float32"), model, "softmax_compute_type")
    draft.set("mindspore.softmax_compute_type", softmax, "model.softmax_compute_type" if
              model.has("softmax_compute_type") else "no model.softmax_compute_type: MemEst's default float32")


def _parallel(accel: Fields, draft: Draft) -> int:
    """MemEst's _parse_parallelism: d = dp_replicate × dp_shard, and the other degrees; returns pp."""
    replicate = accel.integer("dp_replicate", 1)
    shard = accel.integer("dp_shard", 1)
    tp = accel.integer("tp_degree", 1)
    pp = accel.integer("pipeline_parallel_degree", 1)
    cp = accel.integer("context_parallel_degree", 1)
    dp = replicate * shard
    draft.set("parallel.dp", dp, "train.accelerator.dp_replicate × dp_shard")
    draft.set("parallel.tp", tp, "train.accelerator.tp_degree")
    draft.set("parallel.pp", pp, "train.accelerator.pipeline_parallel_degree")
    if cp > 1:
        draft.set("parallel.cp", cp, "train.accelerator.context_parallel_degree")
        algo = accel.string("context_parallel_algo", "colossalai_cp")
        if algo not in CP_ALGOS:
            draft.warn(f"train.accelerator.context_parallel_algo {algo} is not modelled; counted as ring "
                       f"attention (colossalai_cp)")
        draft.set("parallel.cp_algo", CP_ALGOS.get(algo, "ring"), f"context_parallel_algo {algo}"
                  if accel.has("context_parallel_algo") else "MemEst's default colossalai_cp (ring)")
    else:
        accel.used.add("context_parallel_algo")
    ep = accel.integer("expert_parallel_degree", 1)
    etp = accel.integer("expert_tensor_parallel_degree", 0, minimum=0)
    if "model.num_experts" in draft:
        draft.set("parallel.ep", ep, "train.accelerator.expert_parallel_degree")
        if etp:
            draft.set("parallel.expert_tp", etp, "train.accelerator.expert_tensor_parallel_degree")
        elif tp > 1 and tp * ep > dp * tp:
            # _cost_model_parser.py config_dp_tp_exp: t_exp = t unless t_exp · ep exceeds d · t
            draft.set("parallel.expert_tp", 1, f"MemEst: expert TP 1, as tp × ep = {tp * ep} exceeds dp × tp")
    elif ep > 1 or etp:
        draft.warn("train.accelerator.expert_parallel_degree / expert_tensor_parallel_degree are ignored: "
                   "the model has no experts (config_overrides.num_experts)")
    draft.set("parallel.sequence_parallel", accel.boolean("use_seq_parallel", False),
              "train.accelerator.use_seq_parallel")
    vpp = accel.integer("pp_interleave_num", 1)
    if vpp > 1 and pp > 1:
        draft.set("parallel.vpp", vpp, "train.accelerator.pp_interleave_num")
    scheduler = accel.string("pipeline_scheduler", "1f1b")
    if pp > 1:
        if scheduler not in SCHEDULES:
            draft.warn(f"train.accelerator.pipeline_scheduler {scheduler} is not modelled; estimated as 1f1b")
        if accel.has("pipeline_scheduler"):
            draft.set("parallel.pp_schedule", SCHEDULES.get(scheduler, "1f1b"),
                      f"train.accelerator.pipeline_scheduler {scheduler}")
    _parallel_optimizer(accel, dp, cp, draft)
    # comm_fusion: HyperParallel fuses gradient communication into buckets; MemEst's parser does not read it
    accel.used.add("comm_fusion")
    draft.set("mindspore.vocab_emb_dp", True, "MemEst's HyperParallel parser: vocab_emb_dp true")
    return pp


def _parallel_optimizer(accel: Fields, dp: int, cp: int, draft: Draft) -> None:
    """has_op (enable_parallel_optimizer, MemEst's default true), the shard size (optimizer_weight_shard_size,
    default all ranks) and has_grad_shard (gradient_accumulation_shard, default false)."""
    enabled = accel.boolean("enable_parallel_optimizer", True)
    draft.set("mindspore.parallel_optimizer", enabled, "train.accelerator.enable_parallel_optimizer"
              if accel.has("enable_parallel_optimizer") else "no enable_parallel_optimizer: MemEst's default true")
    size = accel.integer("optimizer_weight_shard_size", 0, minimum=-1)
    grad_shard = accel.boolean("gradient_accumulation_shard", False)
    if not enabled:
        if accel.has("optimizer_weight_shard_size"):
            draft.warn(f"train.accelerator.optimizer_weight_shard_size {size} is ignored: "
                       f"enable_parallel_optimizer is false, so nothing is sharded")
        return
    if size > 1:
        draft.set("parallel.zero_shard_max", size, "train.accelerator.optimizer_weight_shard_size")
        if (dp * cp) % size:
            draft.warn(f"train.accelerator.optimizer_weight_shard_size {size} does not divide dp × cp = {dp * cp}: "
                       f"parameters split over tp_degree stay unsharded (MindSpore's rule, frameworks/mindspore.mf)")
    draft.set("parallel.grad_accumulation_shard", grad_shard, "train.accelerator.gradient_accumulation_shard"
              if accel.has("gradient_accumulation_shard") else
              "no gradient_accumulation_shard: MemEst's default false (gradients not sharded)")


def _batch(train: Fields, pp: int, draft: Draft) -> None:
    """MemEst's _parse_batch: b = micro_batch_size (1), m = micro_batch_num (default p), gbs."""
    draft.set("training.micro_batch_size", train.integer("micro_batch_size", 1), "train.micro_batch_size"
              if train.has("micro_batch_size") else "no train.micro_batch_size: MemEst's default 1")
    m = train.integer("micro_batch_num", None)
    gbs = train.integer("global_batch_size", None)
    if m is not None:
        draft.set("training.num_micro_batches", m, "train.micro_batch_num")
    if gbs is not None:
        draft.set("training.global_batch_size", gbs, "train.global_batch_size")
    if m is None and gbs is None:
        draft.default("training.num_micro_batches", pp, "no train.micro_batch_num: MemEst's default, "
                      "one per pipeline stage")


def _recompute(gc: Fields, co: Fields, draft: Draft) -> None:
    """train.gradient_checkpointing.activation_checkpoint (none / selective / full), as MemEst's
    _parse_recompute; config_overrides full_rec / sel_rec (which that parser does not read) must agree."""
    modes = ("none", "selective", "full")
    if gc.has("activation_checkpoint"):
        mode = gc.string("activation_checkpoint")
        if mode not in modes:
            raise gc.error("activation_checkpoint", f"must be none, selective or full, got {describe(mode)}")
        draft.set("training.recompute", mode, "train.gradient_checkpointing.activation_checkpoint")
    elif co.has("full_rec") or co.has("sel_rec"):
        mode = "full" if co.boolean("full_rec", False) else "selective" if co.boolean("sel_rec", False) else "none"
        draft.set("training.recompute", mode, "config_overrides.full_rec / sel_rec (no gradient_checkpointing)")
    else:
        mode = "none"
        draft.default("training.recompute", "none", "no train.gradient_checkpointing: MemEst's default none")
    for key, means in (("full_rec", "full"), ("sel_rec", "selective")):
        if co.has(key) and not isinstance(co.raw(key), bool):
            draft.warn(f"config_overrides.{key} {co.raw(key)!r} (per-stage recompute) is not read by MemEst's "
                       f"HyperParallel parser; recompute {mode} assumed (train.gradient_checkpointing)")
        elif co.has(key) and co.boolean(key) != (mode == means):
            draft.warn(f"config_overrides.{key} {co.boolean(key)} disagrees with recompute {mode}; MemEst's "
                       f"HyperParallel parser follows train.gradient_checkpointing.activation_checkpoint, as here")
        co.used.add(key)
    offset = co.raw("offset", 0)
    if _any_nonzero(offset if isinstance(offset, list) else [offset]):
        draft.warn(f"config_overrides.offset {offset} is not read by MemEst's HyperParallel parser (offset 0); "
                   f"an even split of the layers over the pipeline stages is assumed")
    if gc.has("recompute_slice_activation"):
        sliced = gc.boolean("recompute_slice_activation")
        draft.set("mindspore.recompute_slice_activation", sliced and mode == "full",
                  "train.gradient_checkpointing.recompute_slice_activation"
                  + ("" if mode == "full" or not sliced else " (only a fully recomputed layer keeps a sliced input)"))
    draft.refuse_unused(gc)


def _device_memory(ctx: Fields, draft: Draft) -> None:
    if ctx.has("max_device_memory"):
        _device(ctx, draft)
    else:
        draft.default("device.capacity_gib", 64, "no context.max_device_memory: MemEst's default 64GB")
    draft.refuse_unused(ctx, NEUTRAL_CONTEXT)


def _optimizer(opt: Fields, draft: Draft) -> None:
    kind = opt.string("type", "adamw")
    if "adam" not in kind.lower():
        raise opt.error("type", f"is {kind}: memform models Adam's two moments per parameter (MemEst's "
                                f"HyperParallel parser prices AdamW)")
    draft.refuse_unused(opt, NEUTRAL_OPTIMIZER)


def _mixed_precision(mp: Fields, draft: Draft) -> None:
    """train.mixed_precision (HyperParallel's trainer): MemEst's parser prices bytes from model.compute_dtype
    (forward/backward) and fp32 gradients; a policy that says otherwise is refused rather than ignored."""
    if not mp.data:
        return
    enabled = mp.boolean("enabled", True)
    compute = draft.get("training.precision.activations")
    params = draft.get("training.precision.params")
    if not enabled and compute != params:
        raise mp.error("enabled", f"is false (no mixed precision: compute in the parameters' {params}) while "
                                  f"model.compute_dtype is {compute}")
    if enabled and mp.has("param_dtype"):
        dtype = dtype_name(mp.string("param_dtype"), mp, "param_dtype")
        if dtype != compute:
            raise mp.error("param_dtype", f"is {mp.raw('param_dtype')}, the compute copy of the weights, while "
                                          f"model.compute_dtype is {compute}: the two must agree")
    if mp.has("reduce_dtype") and dtype_name(mp.string("reduce_dtype"), mp, "reduce_dtype") != "fp32":
        raise mp.error("reduce_dtype", f"is {mp.raw('reduce_dtype')}: memform prices HyperParallel runs with "
                                       f"MemEst's fp32 gradients")
    # output_dtype: the forward output's cast, inside the activations memform counts in compute_dtype
    mp.used.add("output_dtype")
    draft.refuse_unused(mp)
