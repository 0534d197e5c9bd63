"""Hugging Face ``config.json`` → the ``model:`` section of a memform config.

A ``config.json`` describes the architecture only; the parallel strategy and batch are left
to the shared defaults (written as commented defaults). Field names follow the transformers
configuration classes of the model families below (``LlamaConfig``, ``MixtralConfig``,
``Qwen2MoeConfig``, ``DeepseekV3Config``, ``GPT2Config``, ``GptOssConfig``, ``Glm4MoeConfig``,
``GPTNeoXConfig``, ``GraniteConfig``, ...) and THUDM's ``ChatGLMConfig`` (num_layers, multi_query_group_num,
kv_channels, padded_vocab_size). Architectures memform cannot size (hybrid Mamba / linear attention, parallel
blocks other than GPT-NeoX's, DBRX, OLMo-1) stop the import with the field and what is missing.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import MemformError, read_text
from .draft import Draft, Fields, describe

TITLE = "Hugging Face config.json"

#: fields that do not change training memory (token ids, initialisation, rope base, routing
#: details that move no tensors, inference-only switches)
IGNORED = frozenset({
    "_name_or_path", "architectures", "auto_map", "model_type", "transformers_version", "torch_dtype",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "tokenizer_class", "initializer_range", "use_cache", "pretraining_tp", "rope_theta", "rope_scaling",
    "rotary_pct", "rotary_emb_base", "rotary_dim", "partial_rotary_factor", "sliding_window",
    "use_sliding_window", "max_window_layers", "router_aux_loss_coef", "output_router_logits",
    "router_jitter_noise", "aux_loss_alpha", "seq_aux", "norm_topk_prob", "routed_scaling_factor",
    "scoring_func", "topk_method", "topk_group", "n_group", "ep_size", "is_decoder", "return_dict",
    "output_attentions", "output_hidden_states", "torchscript", "id2label", "label2id",
    "tie_encoder_decoder", "bos_token", "eos_token", "attn_logit_softcapping",
    "final_logit_softcapping", "query_pre_attn_scalar", "embedding_multiplier", "logits_scaling",
    "residual_multiplier", "attention_multiplier", "summary_type", "summary_use_proj",
    "summary_activation", "summary_proj_to_labels", "summary_first_dropout", "scale_attn_weights",
    "reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx", "task_specific_params",
    "quantization_config", "n_ctx",
    # read below, or architecture switches implied by the model type:
    "qk_layernorm", "use_qk_norm", "cache_implementation", "rope_local_base_freq", "sliding_window_pattern",
    "sliding_window_size", "layer_types", "attention_chunk_size", "no_rope_layers", "no_rope_layer_interval",
    "attn_temperature_tuning", "floor_scale", "attn_scale", "use_mrope", "original_max_position_embeddings",
    "moe_layers", "interleave_moe_layer_step", "router_bias", "head_dim", "hidden_activation",
    # THUDM ChatGLM / GLM-4 (modeling_chatglm.py) switches that change no tensor: rope base and layout, the
    # residual taken before or after the norm, kernel choices, the q/k scaling, classifier dropout
    "rope_ratio", "original_rope", "apply_query_key_layer_scaling", "attention_softmax_in_fp32",
    "bias_dropout_fusion", "apply_residual_connection_post_layernorm", "classifier_dropout",
    "multi_query_attention", "layernorm_epsilon", "rmsnorm", "post_layer_norm", "fp32_residual_connection",
    "add_qkv_bias", "add_bias_linear", "use_bias", "norm_type", "norm_epsilon",
    # MiniCPM (modeling_minicpm.py) scales the embedding, residual branches and logits by constants;
    # InternLM2 names its attention kernel; neither moves a tensor
    "scale_emb", "dim_model_base", "scale_depth", "attn_implementation",
})

#: transformers model types whose MLP is gated even though the activation is GeLU (GeGLU keeps
#: the same tensors as SwiGLU: gate, up, down)
GATED_GELU = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text"})
#: model types whose configuration class ties the output head to the embedding by default
TIED_BY_DEFAULT = frozenset({"gpt2", "gpt_bigcode", "opt", "gemma", "gemma2", "gemma3", "gemma3_text"})
#: model types whose linear layers carry biases when the config has no bias field
BIASED_BY_DEFAULT = frozenset({"gpt2", "gpt_bigcode", "opt", "gpt_neox", "gptj", "phi"})
#: model types with learned absolute position embeddings (the others here use RoPE)
LEARNED_POSITIONS = frozenset({"gpt2", "gpt_bigcode", "opt", "bert", "roberta"})
#: transformers Qwen2Attention (and the Qwen2-MoE / -VL language models): q_proj, k_proj, v_proj have
#: bias=True and o_proj bias=False, whatever the config says; the MLPs have no biases
QKV_BIAS_ONLY = frozenset({"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl", "qwen2_vl_text", "qwen2_5_vl_text"})
#: q/k RMSNorms after the projections: per head (transformers Qwen3Attention, Gemma3Attention:
#: RMSNorm(head_dim)) or over the whole projection (Olmo2Attention: RMSNorm(num_heads · head_dim))
QK_NORM_HEAD = frozenset({"qwen3", "qwen3_moe", "gemma3", "gemma3_text", "qwen3_vl_text", "qwen3_vl_moe_text"})
QK_NORM_FULL = frozenset({"olmo2", "olmo3", "olmoe"})  # OlmoeAttention: q_norm RMSNorm(h), k_norm RMSNorm(g·d_h)
#: sandwich norms: post_attention_layernorm and post_feedforward_layernorm after the sublayers besides
#: the two pre-norms (transformers Gemma2DecoderLayer, Gemma3DecoderLayer)
POST_NORMS = frozenset({"gemma2", "gemma3", "gemma3_text"})
#: model types whose attention_bias puts biases on q_proj, k_proj, v_proj only (transformers GlmAttention,
#: Glm4MoeAttention: q/k/v bias=config.attention_bias, o_proj bias=False; the MLPs have none)
ATTENTION_BIAS_IS_QKV = frozenset({"glm", "glm4", "glm4_moe"})
#: model types whose q_norm / k_norm, when use_qk_norm is true, are RMSNorm(head_dim) with weights
#: (transformers Glm4MoeAttention); Llama-4's use_qk_norm is a weightless L2 norm instead
USE_QK_NORM_WEIGHTED = frozenset({"glm4_moe"})
#: model types whose router Linear has a trained bias (GptOssTopKRouter: nn.Linear(h, E, bias=True)).
#: DeepSeek-V3 / Kimi-K2 / GLM-4.5's e_score_correction_bias is a buffer (register_buffer: no gradient, no
#: optimizer state); checkpoints store it, memform does not count it as a parameter.
ROUTER_BIAS = frozenset({"gpt_oss"})
#: layer kinds of ``layer_types`` that are softmax attention (everything memform's attention block models)
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention"})
#: architectures memform cannot size yet: the field (or model type) that says so, and what is not modelled.
#: The importer stops with this message rather than write a config whose count would be wrong.
UNSUPPORTED_FLAGS = {
    # transformers FalconDecoderLayer: attention and MLP both read the block input and are summed
    "parallel_attn": "Falcon's parallel attention + MLP block (transformers FalconDecoderLayer) is not mapped "
                     "(no published Falcon total was at hand to check it; dense.mf's model.parallel_block: "
                     "one_norm describes the block, write the config by hand to use it)",
    "new_decoder_architecture": "Falcon's new decoder architecture (ln_attn and ln_mlp feeding parallel "
                                "attention and MLP, fused grouped QKV) is not mapped",
}
UNSUPPORTED_TYPES = {
    "phi": "Phi-1/2 (transformers PhiDecoderLayer: a one-norm parallel block, and a biased lm_head memform "
           "does not count) is not mapped",
    "gptj": "GPT-J (transformers GPTJBlock: a one-norm parallel block, and a biased lm_head memform does not "
            "count) is not mapped",
    "cohere": "Cohere's parallel block with bias-free LayerNorms (transformers CohereDecoderLayer) is not "
              "modelled",
    "cohere2": "Cohere-2's parallel block with bias-free LayerNorms (transformers Cohere2DecoderLayer) is not "
               "modelled",
    "dbrx": "DBRX (nested attn_config / ffn_config, fused Wqkv with clip_qkv, bias-free LayerNorms) is not "
            "mapped",
    "falcon": None,  # only with parallel_attn / new_decoder_architecture (UNSUPPORTED_FLAGS)
    "RefinedWeb": "Falcon-40B's original RefinedWeb decoder (parallel attention and MLP) is not modelled",
    "RefinedWebModel": "Falcon-7B's original RefinedWebModel decoder (parallel attention and MLP) is not modelled",
    "olmo": "OLMo-1's non-parametric LayerNorms (transformers OlmoLayerNorm: no weight, no bias) are not "
            "modelled",
    "nemotron_h": "hybrid Mamba-2 / attention layers (hybrid_override_pattern) are not modelled",
    "granitemoehybrid": "hybrid Mamba-2 / attention layers (layer_types) are not modelled",
    "qwen3_next": "Gated DeltaNet linear-attention layers (layer_types linear_attention) are not modelled",
    "mamba": "state-space (Mamba) layers are not modelled", "mamba2": "state-space (Mamba-2) layers are not modelled",
    "rwkv": "RWKV recurrent layers are not modelled",
}
DROPOUT_FIELDS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop",
                  "hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "residual_dropout",
                  "embedding_dropout")
EXPERT_FIELDS = ("num_local_experts", "n_routed_experts", "num_experts")
MLA_FIELDS = ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


def read_json(path: Path) -> dict:
    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MemformError(f"{path}:{exc.lineno}:{exc.colno}: JSON syntax error: {exc.msg}") from None
    if not isinstance(data, dict):
        raise MemformError(f"{path}: a config.json must hold a JSON object, got {describe(data)}")
    return data


def convert(path: Path, draft: Draft, given: set[str]) -> None:
    """Fill ``draft`` from the config.json at ``path``; ``given`` = keys set on the command line."""
    data = read_json(path)
    top = Fields(data, path)
    cfg = top
    if "text_config" in data and "hidden_size" not in data and "n_embd" not in data:
        cfg = top.section("text_config")
        draft.warn("a multimodal config: the language model comes from 'text_config'"
                   + ("" if "vision_config" in data else "; its other towers are not imported"))
        top.used.update(k for k in data if k.endswith("_config") and k != "vision_config")
    model_type = top.string("model_type", "") or cfg.string("model_type", "")
    top.used.add("vision_config")
    name = top.string("_name_or_path", "")
    draft.header.append(f"model_type: {model_type or 'not stated'}")
    if name:
        draft.set("name", name.rstrip("/").split("/")[-1], "from _name_or_path")

    _unsupported(cfg, model_type)
    ints = cfg.integer
    hk, h = cfg.first(("hidden_size", "n_embd", "d_model"), ints)
    _same(cfg, hk, h, ("hidden_size", "n_embd", "d_model"))
    if h is None:
        raise cfg.missing("hidden_size")
    ak, a = cfg.first(("num_attention_heads", "n_head", "n_heads"), ints)
    _same(cfg, ak, a, ("num_attention_heads", "n_head", "n_heads"))
    if a is None:
        raise cfg.missing("num_attention_heads")
    # THUDM ChatGLM configs name it num_layers (configuration_chatglm.py); GLM-4 copies also num_hidden_layers
    lk, layers = cfg.first(("num_hidden_layers", "n_layer", "num_layers", "n_layers"), ints)
    _same(cfg, lk, layers, ("num_hidden_layers", "n_layer", "num_layers", "n_layers"))
    if layers is None:
        raise cfg.missing("num_hidden_layers")
    draft.set("model.hidden_size", h)
    draft.set("model.num_heads", a, "num_attention_heads")
    if cfg.has("num_key_value_heads"):
        draft.set("model.num_kv_heads", cfg.integer("num_key_value_heads"), "num_key_value_heads")
        _same(cfg, "num_key_value_heads", cfg.integer("num_key_value_heads"), ("num_kv_heads",))
    elif cfg.has("multi_query_group_num") and cfg.raw("multi_query_attention", False) is True:
        # modeling_chatglm.py SelfAttention: with multi_query_attention, K and V have multi_query_group_num heads
        draft.set("model.num_kv_heads", cfg.integer("multi_query_group_num"),
                  "multi_query_group_num (multi_query_attention true)")
    elif cfg.has("num_kv_heads"):  # transformers FalconConfig
        draft.set("model.num_kv_heads", cfg.integer("num_kv_heads"), "num_kv_heads")
        cfg.used.add("multi_query")
    elif cfg.raw("multi_query", False) is True:  # FalconConfig / GPTBigCodeConfig: one K/V head
        draft.set("model.num_kv_heads", 1, "multi_query true: one key/value head")
    else:
        cfg.used.update(("multi_query", "multi_query_group_num"))  # ChatGLM without multi_query_attention: MHA
        draft.set("model.num_kv_heads", a, "no num_key_value_heads: multi-head attention")
    draft.set("model.num_layers", layers, "num_hidden_layers")
    ffn_key, ffn = cfg.first(("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"), ints)
    _same(cfg, ffn_key, ffn, ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"))
    if ffn is None:
        draft.default("model.ffn_hidden_size", 4 * h, "4 × hidden_size (no intermediate_size)")
    else:
        draft.set("model.ffn_hidden_size", ffn, ffn_key or "")
    if cfg.has("padded_vocab_size"):
        # modeling_chatglm.py Embedding and output_layer are padded_vocab_size rows
        draft.set("model.vocab_size", cfg.integer("padded_vocab_size"), "padded_vocab_size (the embedding's rows)")
        cfg.used.add("vocab_size")
    else:
        draft.set("model.vocab_size", cfg.integer("vocab_size"))
    seq_key, seq = cfg.first(("max_position_embeddings", "n_positions", "seq_length"), ints)
    if seq is not None:
        draft.set("model.seq_length", seq, f"{seq_key}; training often uses a shorter sequence: lower it if so")
    elif "model.seq_length" not in given:
        raise cfg.missing("max_position_embeddings", " (or pass --set model.seq_length=N)")

    _activation(cfg, draft, model_type)
    _norm(cfg, draft)
    _flags(cfg, draft, model_type)
    head_dim = cfg.integer("head_dim", None)
    if head_dim is None and cfg.has("kv_channels"):
        head_dim = cfg.integer("kv_channels")  # modeling_chatglm.py: projection_size = kv_channels × heads
    elif head_dim is not None:
        _same(cfg, "head_dim", head_dim, ("kv_channels",))
    if head_dim is not None and head_dim * a != h and not cfg.has("kv_lora_rank"):
        draft.set("model.head_dim", head_dim, f"head_dim (× {a} heads = {head_dim * a}, not hidden_size {h})")
    elif head_dim is None and h % a and not cfg.has("kv_lora_rank"):
        raise MemformError(f"{path}: hidden_size {h} is not a multiple of num_attention_heads {a} and there is "
                           f"no 'head_dim' field")
    _architecture(cfg, draft, model_type)
    _moe(cfg, draft, model_type)
    _mla(cfg, draft)
    mtp = cfg.integer("num_nextn_predict_layers", 0, minimum=0)
    if mtp:
        draft.set("model.mtp_layers", mtp, "num_nextn_predict_layers")
    if top.has("vision_config"):
        _vision(top.section("vision_config"), draft)
    ignored = IGNORED | {k for k in data if isinstance(k, str) and k.endswith("_token_id")}
    draft.warn_unused(cfg, ignored)
    if cfg is not top:
        draft.warn_unused(top, ignored)
    if cfg.raw("post_layer_norm", True) is False:
        draft.warn("field 'post_layer_norm' is false: the model has no final norm, memform still counts one "
                   "(hidden_size parameters)")
    if cfg.raw("fp32_residual_connection", False) is True:
        draft.warn("field 'fp32_residual_connection' is true: the fp32 residual stream is not modelled "
                   "(memform keeps it at the activation dtype)")
    quant = cfg.raw("quantization_config", None)
    if isinstance(quant, dict) and quant.get("quant_method"):
        draft.warn(f"field 'quantization_config': the checkpoint is stored as {quant.get('quant_method')}; memform "
                   f"sizes training with the profile's parameter dtype (its scales are not counted)")


def _same(cfg: Fields, key: str | None, value, aliases: tuple[str, ...]) -> None:
    """Other spellings of the field ``key`` read (GLM-4 configs carry num_layers and num_hidden_layers, gpt-oss
    experts_per_token and num_experts_per_tok): they must agree, else the file is ambiguous."""
    for other in aliases:
        if other != key and cfg.has(other):
            if key is not None and cfg.raw(other) != value:
                raise cfg.error(other, f"is {cfg.raw(other)!r} but '{cfg.name(key)}' is {value!r}: the file "
                                f"disagrees with itself")
            cfg.used.add(other)


def _unsupported(cfg: Fields, model_type: str) -> None:
    """Stop on architectures memform cannot size (UNSUPPORTED_*), naming the field and what is missing."""
    for key, what in UNSUPPORTED_FLAGS.items():
        if cfg.raw(key, False) is True:
            raise cfg.error(key, f"is true: {what}")
    if cfg.raw("use_parallel_residual", False) is True and model_type != "gpt_neox":
        # StableLmDecoderLayer shares one input_layernorm, others differ again: only GPT-NeoX's is mapped
        raise cfg.error("use_parallel_residual", f"is true: the parallel block of model_type {model_type!r} is not "
                        f"mapped (memform maps GPT-NeoX's x + attn(ln1(x)) + mlp(ln2(x)))")
    what = UNSUPPORTED_TYPES.get(model_type)
    if what:
        raise MemformError(f"{cfg.file}: model_type {model_type!r}: {what}; memform cannot size this model yet")
    kinds = cfg.raw("layer_types", [])
    if isinstance(kinds, list):
        other = sorted({k for k in kinds if isinstance(k, str)} - ATTENTION_LAYER_TYPES)
        if other:
            raise cfg.error("layer_types", f"has {', '.join(other)} layers: memform models softmax-attention "
                            f"decoders only")
    if cfg.has("hybrid_override_pattern"):
        raise cfg.error("hybrid_override_pattern", "describes hybrid Mamba / attention layers, which memform "
                        "does not model")


def _activation(cfg: Fields, draft: Draft, model_type: str) -> None:
    key, act = cfg.first(("hidden_act", "hidden_activation", "activation_function"), cfg.string)
    if act is None:
        draft.default("model.activation", "swiglu", "no hidden_act field: gated SiLU MLP assumed")
        return
    low = act.lower()
    if low in ("silu", "swish"):
        draft.set("model.activation", "swiglu", f"{key} {act}: gated MLP (gate, up, down)")
    elif low.startswith("gelu") and model_type in GATED_GELU:
        draft.set("model.activation", "swiglu", f"{key} {act} in a gated MLP (GeGLU: SwiGLU's tensors)")
    elif low.startswith("gelu"):
        draft.set("model.activation", "gelu", f"{key} {act}")
    else:
        draft.set("model.activation", "gelu", f"{key} {act}: sized as an ungated MLP")
        draft.warn(f"field '{cfg.name(key)}' = {act!r} is not an activation memform models "
                   f"(gelu, silu); sized as an ungated GeLU MLP")


def _norm(cfg: Fields, draft: Draft) -> None:
    if cfg.has("rmsnorm"):  # modeling_chatglm.py: RMSNorm if config.rmsnorm else LayerNorm
        rms = cfg.boolean("rmsnorm")
        draft.set("model.norm", "rmsnorm" if rms else "layernorm", f"rmsnorm {str(rms).lower()}")
        return
    if cfg.has("norm_type"):  # transformers Starcoder2Config: norm_type layer_norm (the only one it builds)
        kind = cfg.string("norm_type")
        if kind.lower() in ("layer_norm", "layernorm"):
            draft.set("model.norm", "layernorm", f"norm_type {kind}")
            return
        if kind.lower() in ("rms_norm", "rmsnorm"):
            draft.set("model.norm", "rmsnorm", f"norm_type {kind}")
            return
        raise cfg.error("norm_type", f"is {kind!r}: memform models layer_norm and rms_norm")
    key, _ = cfg.first(("rms_norm_eps",), cfg.number)
    if key:
        draft.set("model.norm", "rmsnorm", "rms_norm_eps present")
        return
    key, _ = cfg.first(("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", "layernorm_epsilon"), cfg.number)
    if key:
        draft.set("model.norm", "layernorm", f"{key} present")
    else:
        draft.default("model.norm", "rmsnorm", "no rms_norm_eps / layer_norm_eps field")


def _flags(cfg: Fields, draft: Draft, model_type: str) -> None:
    biases = [k for k in ("attention_bias", "mlp_bias", "bias", "use_bias") if cfg.has(k)]
    if cfg.has("add_qkv_bias") or cfg.has("add_bias_linear"):
        # modeling_chatglm.py: query_key_value bias = add_bias_linear or add_qkv_bias; dense (o_proj) and the
        # MLP's dense_h_to_4h / dense_4h_to_h bias = add_bias_linear
        linear = cfg.boolean("add_bias_linear", False)
        draft.set("model.bias", linear, "add_bias_linear (o_proj and MLP biases)")
        draft.set("model.qkv_bias", linear or cfg.boolean("add_qkv_bias", False), "add_qkv_bias / add_bias_linear")
        cfg.used.update(("attention_bias", "mlp_bias", "bias"))
    elif model_type in ATTENTION_BIAS_IS_QKV:
        attn = cfg.boolean("attention_bias", False)
        cfg.used.update(("mlp_bias", "bias"))
        draft.set("model.bias", False, f"{model_type}: no o_proj or MLP biases (transformers GlmAttention)")
        draft.set("model.qkv_bias", attn, "attention_bias (q_proj, k_proj, v_proj only)")
    elif model_type == "gpt_oss":
        # transformers GptOssAttention: q/k/v/o_proj bias=config.attention_bias (GptOssConfig default true);
        # GptOssExperts: gate_up_proj_bias and down_proj_bias always
        attn = cfg.boolean("attention_bias", True)
        draft.set("model.bias", True, "gpt_oss: the experts' gate_up and down projections have biases")
        draft.set("model.qkv_bias", attn, "attention_bias (GptOssConfig default true)")
        if not attn:
            draft.warn("gpt_oss with attention_bias false: o_proj's bias (hidden_size per layer) is still "
                       "counted (memform gives o_proj the MLP's bias setting)")
        cfg.used.update(("mlp_bias", "bias"))
    elif model_type in QKV_BIAS_ONLY:
        cfg.used.update(("attention_bias", "mlp_bias", "bias"))
        draft.set("model.bias", False, f"{model_type}: no o_proj or MLP biases (transformers Qwen2Attention)")
        draft.set("model.qkv_bias", True, f"{model_type}: q_proj, k_proj, v_proj have biases")
    elif cfg.has("attention_bias") and cfg.has("mlp_bias") and cfg.boolean("attention_bias") != cfg.boolean("mlp_bias"):
        attn, mlp = cfg.boolean("attention_bias"), cfg.boolean("mlp_bias")
        draft.set("model.bias", mlp, "mlp_bias (also o_proj's bias in memform)")
        draft.set("model.qkv_bias", attn, "attention_bias")
        if attn:
            draft.warn("attention_bias true with mlp_bias false: o_proj's bias (hidden_size per layer) is not "
                       "counted (memform gives o_proj the MLP's bias setting)")
    elif biases:
        draft.set("model.bias", any(cfg.boolean(k) for k in biases), " / ".join(biases))
        cfg.used.update(("attention_bias", "mlp_bias", "bias", "use_bias"))
    else:
        cfg.used.update(("attention_bias", "mlp_bias", "bias"))
        biased = model_type in BIASED_BY_DEFAULT
        draft.default("model.bias", biased, f"no attention_bias field; {model_type or 'this model type'}'s default")
    rates = {k: cfg.number(k) for k in DROPOUT_FIELDS if cfg.has(k)}
    cfg.used.update(DROPOUT_FIELDS)
    if rates:
        draft.set("model.dropout", any(r > 0 for r in rates.values()),
                  ", ".join(f"{k} {v}" for k, v in rates.items()))
    else:
        draft.default("model.dropout", False, "no dropout field (LLM pre-training usually runs without)")
    draft.default("model.flash_attention", True, "config.json does not say; FlashAttention assumed")
    if cfg.has("tie_word_embeddings"):
        draft.set("model.tied_embeddings", cfg.boolean("tie_word_embeddings"), "tie_word_embeddings")
    else:
        cfg.used.add("tie_word_embeddings")
        tied = model_type in TIED_BY_DEFAULT
        draft.default("model.tied_embeddings", tied,
                      f"no tie_word_embeddings field; {model_type or 'this model type'}'s default")
    rope = any(cfg.has(k) for k in ("rope_theta", "rope_scaling", "rotary_dim", "rotary_pct",
                                    "qk_rope_head_dim", "partial_rotary_factor"))
    if rope or (model_type and model_type not in LEARNED_POSITIONS):
        draft.set("model.position_embedding", "rope", "rotary (rope_theta / model type)")
    elif model_type in LEARNED_POSITIONS:
        draft.set("model.position_embedding", "learned", f"{model_type}: learned absolute positions")
    else:
        draft.default("model.position_embedding", "rope", "no rope_theta or model_type field")


def _architecture(cfg: Fields, draft: Draft, model_type: str) -> None:
    """q/k norms, Gemma's sandwich norms and soft-capping, sliding windows (dense.mf keys)."""
    if model_type in QK_NORM_HEAD or model_type in QK_NORM_FULL:
        draft.set("model.qk_norm", True, f"{model_type}: q_norm / k_norm after the projections")
        if model_type in QK_NORM_FULL:
            draft.set("model.qk_norm_scope", "full", f"{model_type}: normalised over the whole projection "
                      "(transformers Olmo2Attention)")
    elif cfg.has("qk_layernorm") and cfg.boolean("qk_layernorm"):
        draft.set("model.qk_norm", True, "qk_layernorm")
    if cfg.has("use_qk_norm") and cfg.boolean("use_qk_norm"):
        if model_type in USE_QK_NORM_WEIGHTED:
            draft.set("model.qk_norm", True, f"use_qk_norm: {model_type} q_norm / k_norm = RMSNorm(head_dim)")
        else:
            draft.warn("field 'use_qk_norm': Llama-4's q/k L2 norm has no weights; its saved inputs are not counted")
    if model_type == "gpt_oss":
        draft.set("model.attention_sinks", True, "gpt_oss: one learned sink logit per head (GptOssAttention.sinks)")
    if model_type == "gpt_neox":
        # transformers GPTNeoXLayer: use_parallel_residual (GPTNeoXConfig default true) -> x + attn(ln1(x)) +
        # mlp(ln2(x)); false -> the sequential pre-norm block
        cfg.used.add("use_parallel_residual")
        if cfg.raw("use_parallel_residual", True) is not False:
            draft.set("model.parallel_block", "two_norms", "use_parallel_residual: x + attn(ln1(x)) + mlp(ln2(x))")
    if model_type in POST_NORMS:
        draft.set("model.post_norms", True, f"{model_type}: post-attention and post-feedforward norms")
    for key, name in (("final_logit_softcapping", "model.logit_softcap"),
                      ("attn_logit_softcapping", "model.attn_softcap")):
        if cfg.has(key):
            draft.set(name, True, f"{key} {cfg.number(key)}: tanh soft-capping")
    window = cfg.raw("sliding_window", None)
    cfg.used.update(("use_sliding_window", "max_window_layers"))
    if isinstance(window, int) and not isinstance(window, bool) and window > 0 \
            and cfg.raw("use_sliding_window", True) is not False:
        draft.set("model.sliding_window", window, "sliding_window (no training-memory change: eager attention "
                  "still masks full s×s scores, flash keeps O(s))")


def _moe_pattern(cfg: Fields, draft: Draft, model_type: str, layers: int) -> None:
    """Which layers are MoE, as ``model.moe_layer_freq`` (moe.mf: i % N == 0, or a 0/1 list)."""
    only = cfg.raw("mlp_only_layers", [])
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only):
        raise cfg.error("mlp_only_layers", f"must be a list of layer indices, got {describe(only)}")
    if cfg.has("moe_layers") and isinstance(cfg.raw("moe_layers"), list):
        moe = set(cfg.raw("moe_layers"))  # Llama-4: the MoE layer indices themselves
        source = "moe_layers"
    elif cfg.has("decoder_sparse_step") or cfg.has("interleave_moe_layer_step"):
        # transformers Qwen2MoeDecoderLayer: MoE when (layer_idx + 1) % decoder_sparse_step == 0;
        # Llama4TextConfig: moe_layers = range(step - 1, L, step) -- both (i + 1) % N == 0
        key = "decoder_sparse_step" if cfg.has("decoder_sparse_step") else "interleave_moe_layer_step"
        step = cfg.integer(key)
        moe = {i for i in range(layers) if (i + 1) % step == 0}
        source = f"{key} {step}: (i + 1) % {step} == 0"
    elif cfg.has("moe_layer_freq"):
        # transformers DeepseekV3DecoderLayer: MoE when layer_idx % moe_layer_freq == 0 (after
        # first_k_dense_replace): moe.mf's own rule, written as it is
        freq = cfg.integer("moe_layer_freq")
        if freq != 1:
            draft.set("model.moe_layer_freq", freq, "moe_layer_freq")
        return
    else:
        return
    moe -= set(only)
    if only:
        source += f", minus mlp_only_layers {sorted(only)}"
    pattern = [1 if i in moe else 0 for i in range(layers)]
    if all(pattern):
        return
    draft.set("model.moe_layer_freq", pattern, source)


def _moe(cfg: Fields, draft: Draft, model_type: str = "") -> None:
    key, experts = cfg.first(EXPERT_FIELDS, lambda k: cfg.integer(k, minimum=0))
    for other in ("moe_intermediate_size", "num_experts_per_tok", "n_shared_experts",
                  "shared_expert_intermediate_size", "first_k_dense_replace", "moe_layer_freq",
                  "decoder_sparse_step", "mlp_only_layers", "intermediate_size_mlp"):
        cfg.used.add(other)
    if not experts or experts <= 1:
        return
    draft.set("model.num_experts", experts, key)
    if model_type in ROUTER_BIAS:
        draft.set("model.router_bias", True, f"{model_type}: the router's Linear has a bias (GptOssTopKRouter)")
    if not cfg.has("num_experts_per_tok"):
        raise cfg.missing("num_experts_per_tok", f" ({key} = {experts} makes this a mixture of experts)")
    draft.set("model.moe_top_k", cfg.integer("num_experts_per_tok"), "num_experts_per_tok")
    _same(cfg, "num_experts_per_tok", cfg.integer("num_experts_per_tok"), ("experts_per_token",))
    expert_ffn = cfg.integer("moe_intermediate_size", None)
    if expert_ffn is None:
        expert_ffn = draft.get("model.ffn_hidden_size")
        draft.set("model.moe_ffn_hidden_size", expert_ffn, "no moe_intermediate_size: intermediate_size")
    else:
        draft.set("model.moe_ffn_hidden_size", expert_ffn, "moe_intermediate_size")
    shared = cfg.integer("n_shared_experts", None, minimum=0)
    if shared is not None:
        draft.set("model.num_shared_experts", shared, "n_shared_experts")
    elif cfg.has("shared_expert_intermediate_size") and cfg.integer("shared_expert_intermediate_size", minimum=0):
        # transformers Qwen2MoeSparseMoeBlock: one shared expert of this width, scaled by
        # sigmoid(shared_expert_gate(x)), shared_expert_gate = Linear(hidden_size, 1, bias=False)
        width = cfg.integer("shared_expert_intermediate_size", minimum=0)
        count = -(-width // expert_ffn)
        draft.set("model.num_shared_experts", count,
                  f"shared_expert_intermediate_size {width} / expert size {expert_ffn}, rounded up (the width "
                  f"below is what sizes it)")
        draft.set("model.shared_expert_ffn_hidden_size", width, "shared_expert_intermediate_size")
        draft.set("model.shared_expert_gate", True, "shared_expert_gate: sigmoid gate hidden_size -> 1")
    elif cfg.has("shared_intermediate_size") and cfg.integer("shared_intermediate_size", minimum=0):
        # transformers GraniteMoeSharedMoE: a shared MLP of shared_intermediate_size (input_linear h -> 2·width,
        # output_linear width -> h), added to the routed output without a gate
        width = cfg.integer("shared_intermediate_size", minimum=0)
        draft.set("model.num_shared_experts", -(-width // expert_ffn),
                  f"shared_intermediate_size {width} / expert size {expert_ffn}, rounded up (the width below sizes it)")
        draft.set("model.shared_expert_ffn_hidden_size", width, "shared_intermediate_size (GraniteMoeShared)")
    else:
        cfg.used.add("shared_intermediate_size")
        draft.set("model.num_shared_experts", 0, "no shared experts")
    first_dense = cfg.integer("first_k_dense_replace", 0, minimum=0)
    if first_dense:
        draft.set("model.first_k_dense", first_dense, "first_k_dense_replace")
    _moe_pattern(cfg, draft, model_type, draft.get("model.num_layers"))
    if cfg.has("intermediate_size_mlp"):
        # Llama-4: dense layers' MLP is intermediate_size_mlp wide, experts (and the shared one) intermediate_size
        draft.set("model.ffn_hidden_size", cfg.integer("intermediate_size_mlp"), "intermediate_size_mlp (dense layers)")
        if model_type.startswith("llama4"):
            draft.set("model.num_shared_experts", 1, "llama4: one shared expert of intermediate_size")


def _mla(cfg: Fields, draft: Draft) -> None:
    cfg.used.update(("kv_lora_rank", "q_lora_rank", *MLA_FIELDS))
    if not cfg.has("kv_lora_rank"):
        return
    draft.set("model.attention", "mla", "kv_lora_rank present: multi-head latent attention")
    q_rank = cfg.integer("q_lora_rank", 0, minimum=0)
    draft.set("model.q_lora_rank", q_rank, "q_lora_rank" if cfg.has("q_lora_rank") else
              "q_lora_rank null: queries not compressed")
    draft.set("model.kv_lora_rank", cfg.integer("kv_lora_rank"))
    for key in MLA_FIELDS:
        if not cfg.has(key):
            raise cfg.missing(key, " (kv_lora_rank is set, so this is multi-head latent attention)")
        draft.set(f"model.{key}", cfg.integer(key))


#: vision_config fields that move no training memory, or that vision.mf does not distinguish
IGNORED_VISION = frozenset({
    "model_type", "spatial_patch_size", "initializer_range", "torch_dtype", "layer_norm_eps",
    "attention_dropout", "dropout", "projection_dim", "out_hidden_size", "tokens_per_second",
    "window_size", "fullatt_block_indexes", "vision_use_head", "num_positions", "hidden_act",
    "_name_or_path", "architectures", "transformers_version",
})


def _vision(vc: Fields, draft: Draft) -> None:
    """A vision tower (Qwen2-VL ``vision_config``, CLIP/SigLIP fields) → ``model.vision.*`` of vision.mf."""
    # Qwen2-VL: embed_dim is the ViT width and hidden_size the LM width it projects to
    width_key, width = vc.first(("embed_dim", "hidden_size"), vc.integer)
    if width is None:
        raise vc.missing("hidden_size")
    draft.set("model.vision.hidden_size", width, f"vision_config.{width_key}")
    vc.used.add("hidden_size")  # with embed_dim present it is the LM width the merger projects to
    draft.set("model.vision.num_heads", vc.integer("num_heads") if vc.has("num_heads")
              else vc.integer("num_attention_heads"), "vision_config heads")
    vc.used.update(("num_heads", "num_attention_heads"))
    depth_key, depth = vc.first(("depth", "num_hidden_layers"), vc.integer)
    if depth is None:
        raise vc.missing("depth")
    draft.set("model.vision.num_layers", depth, f"vision_config.{depth_key}")
    if vc.has("intermediate_size"):
        draft.set("model.vision.ffn_hidden_size", vc.integer("intermediate_size"), "vision_config.intermediate_size")
    else:
        ratio = vc.number("mlp_ratio", 4)
        draft.set("model.vision.ffn_hidden_size", int(ratio * width), f"mlp_ratio {ratio} × width")
    vc.used.add("mlp_ratio")
    draft.set("model.vision.patch_size", vc.integer("patch_size", 14), "vision_config.patch_size")
    for key, name in (("temporal_patch_size", "temporal_patch_size"), ("spatial_merge_size", "spatial_merge_size")):
        if vc.has(key):
            draft.set(f"model.vision.{name}", vc.integer(key), f"vision_config.{key}")
    chans_key, chans = vc.first(("in_chans", "in_channels", "num_channels"), vc.integer)
    if chans is not None:
        draft.set("model.vision.in_channels", chans, f"vision_config.{chans_key}")
    if vc.has("image_size"):
        draft.set("model.vision.image_size", vc.integer("image_size"), "vision_config.image_size")
    else:
        merge = draft.get("model.vision.spatial_merge_size", 1)
        edge = 16 * draft.get("model.vision.patch_size") * merge  # 448 px for Qwen2-VL's 14 px × 2
        draft.default("model.vision.image_size", edge,
                      "dynamic resolution: an image edge is assumed; set your training images' size")
    draft.default("model.vision.images_per_sample", 1, "images per training sequence: set your data's")
    act = vc.string("hidden_act", "gelu")
    if "gelu" not in act.lower():
        draft.warn(f"vision_config.hidden_act {act}: vision.mf models a GeLU MLP with biases "
                   f"(the ViT's MLP memory is approximate)")
    draft.warn_unused(vc, IGNORED_VISION)
