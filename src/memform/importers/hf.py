"""Hugging Face ``config.json`` → the ``model:`` section of a memform config.

A ``config.json`` describes the architecture only; the parallel strategy and batch are left
to the shared defaults (written as commented defaults). Field names follow the transformers
configuration classes of the model families below (``LlamaConfig``, ``MixtralConfig``,
``Qwen2MoeConfig``, ``DeepseekV3Config``, ``GPT2Config``, ``GptOssConfig``, ``Glm4MoeConfig``,
``GPTNeoXConfig``, ``GraniteConfig``, ...) and THUDM's ``ChatGLMConfig`` (num_layers, multi_query_group_num,
kv_channels, padded_vocab_size). Architectures memform cannot size (hybrid Mamba / linear attention, parallel
blocks other than GPT-NeoX's, DBRX, OLMo-1) stop the import with the field and what is missing. DeciLM /
Nemotron-NAS per-layer blocks (``block_configs``, ``num_key_value_heads_per_layer``) are read by :mod:`.hf_nas`.

Every field is read, listed in NEUTRAL with the reason it cannot change device memory (NEUTRAL_AT: only at
the values listed), refused with the reason (REFUSED_FIELDS, UNSUPPORTED_*), or -- a field this module does
not know -- refused at the end of the import unless ``--accept`` names it (Draft.refuse_unused). The training
sequence is not in a config.json: ``model.seq_length`` defaults to DEFAULT_SEQ (4096) capped by
max_position_embeddings, with one warning naming ``--set model.seq_length=N``.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import MemformError
from . import hf_hybrid, hf_linear, hf_nas
from .draft import Draft, Fields, describe, read_json

TITLE = "Hugging Face config.json"

#: fields that cannot change training memory, each with the reason. Every other field of a config.json
#: is read below, refused with the reason (REFUSED_FIELDS, UNSUPPORTED_*), or refused by
#: Draft.refuse_unused at the end of the import unless ``--accept`` vouches for it.
_TOKEN = "a token id (indexes the vocabulary; no tensor)"
_PROVENANCE = "provenance or bookkeeping (names, versions, class names)"
_ROPE = ("rotary position settings (base, scaling, layout): sin/cos are computed, no trained tensor or saved "
         "activation changes")
_ROUTING = ("a routing rule or loss weight: picks experts or scales a loss, moves no tensor (the experts' sizes "
            "are read)")
_SCALE = "a constant scale on scores, residuals, embeddings or logits: multiplies an existing tensor, no new one"
_OUTPUT = "what the forward pass returns (cache, attentions, hidden states): off in training"
_INIT = "initialisation only"
_KERNEL = "a kernel / numerics choice that keeps the same tensors"
NEUTRAL: dict[str, str] = {
    "_name_or_path": _PROVENANCE, "architectures": _PROVENANCE, "auto_map": _PROVENANCE,
    "model_type": "read: picks the family rules below", "transformers_version": _PROVENANCE,
    "tokenizer_class": _PROVENANCE, "_commit_hash": _PROVENANCE, "name_or_path": _PROVENANCE,
    "torch_dtype": "the checkpoint's storage dtype; training dtypes come from the memform profile",
    "dtype": "the checkpoint's storage dtype; training dtypes come from the memform profile",
    "bos_token_id": _TOKEN, "eos_token_id": _TOKEN, "pad_token_id": _TOKEN, "sep_token_id": _TOKEN,
    "decoder_start_token_id": _TOKEN, "bos_token": _TOKEN, "eos_token": _TOKEN,
    "initializer_range": _INIT, "initializer_factor": _INIT, "init_std": _INIT,
    "embedding_init_std": _INIT, "initializer_cutoff_factor": _INIT,
    "use_cache": _OUTPUT, "output_attentions": _OUTPUT, "output_hidden_states": _OUTPUT, "return_dict": _OUTPUT,
    "output_router_logits": "returns router logits for the aux loss: E floats per token, not kept past the loss",
    "torchscript": "tracing switch", "is_decoder": "decoder-only models are decoders already",
    "id2label": "classifier labels (no head in causal LM training)", "label2id": "classifier labels",
    "task_specific_params": "generation presets", "tie_encoder_decoder": "encoder-decoder models only",
    "cache_implementation": "inference KV-cache class", "use_sliding_window_cache": "inference KV-cache class",
    "pretraining_tp": "Llama-2 inference switch splitting the linear layers' matmuls (same weights)",
    "rope_theta": _ROPE, "rope_scaling": _ROPE, "rope_parameters": _ROPE, "rotary_pct": _ROPE,
    "rotary_emb_base": _ROPE, "rotary_dim": _ROPE, "partial_rotary_factor": _ROPE, "rope_ratio": _ROPE,
    "original_rope": _ROPE, "use_mrope": _ROPE, "original_max_position_embeddings": _ROPE,
    "rope_local_base_freq": _ROPE, "no_rope_layers": _ROPE + " (Llama-4: the layers without RoPE)",
    "no_rope_layer_interval": _ROPE, "rope_interleaved": _ROPE, "position_embedding_type": _ROPE,
    "rope_type": _ROPE,
    "use_sliding_window": "read with sliding_window",
    "max_window_layers": "which layers use the window (no training-memory change, see sliding_window)",
    "sliding_window_pattern": "which layers use the window (no training-memory change, see sliding_window)",
    "sliding_window_size": "the window span (no training-memory change, see sliding_window)",
    "attention_chunk_size": "Llama-4 chunked attention: a mask over the same scores (flash keeps O(s))",
    "attn_temperature_tuning": _SCALE, "floor_scale": _SCALE, "attn_scale": _SCALE,
    "for_llm_compressor": "Llama-4: selects llm-compressor's calibration code path (Llama4TextConfig); same tensors",
    "router_aux_loss_coef": _ROUTING, "router_jitter_noise": _ROUTING, "aux_loss_alpha": _ROUTING,
    "seq_aux": _ROUTING, "norm_topk_prob": _ROUTING, "routed_scaling_factor": _ROUTING, "scoring_func": _ROUTING,
    "topk_method": _ROUTING, "topk_group": _ROUTING, "n_group": _ROUTING, "router_z_loss_coef": _ROUTING,
    "ep_size": "the expert-parallel size the checkpoint was saved with (memform's parallel.ep sets it)",
    "attn_logit_softcapping": "read (model.attn_softcap)", "final_logit_softcapping": "read (model.logit_softcap)",
    "query_pre_attn_scalar": _SCALE, "embedding_multiplier": _SCALE, "logits_scaling": _SCALE,
    "residual_multiplier": _SCALE, "attention_multiplier": _SCALE, "scale_emb": _SCALE, "dim_model_base": _SCALE,
    "scale_depth": _SCALE, "attn_factor": _SCALE,
    # GPT-2's sequence-summary head is for classification only; the rest are its attention scalings
    "summary_type": "GPT-2 classification head (not in causal LM training)",
    "summary_use_proj": "GPT-2 classification head", "summary_activation": "GPT-2 classification head",
    "summary_proj_to_labels": "GPT-2 classification head", "summary_first_dropout": "GPT-2 classification head",
    "scale_attn_weights": _SCALE, "reorder_and_upcast_attn": _KERNEL, "scale_attn_by_inverse_layer_idx": _SCALE,
    "quantization_config": "read (importers/quant.py): bitsandbytes 4-bit -> lora.base_quant; other formats "
                           "warned (training sizes the profile's dtypes)",
    "n_ctx": "GPT-2's context length, = n_positions (read)",
    "attn_implementation": _KERNEL, "_attn_implementation": _KERNEL,
    "attention_softmax_in_fp32": _KERNEL + " (FlashAttention assumed: no s×s probabilities kept)",
    "apply_query_key_layer_scaling": _SCALE, "bias_dropout_fusion": _KERNEL,
    "apply_residual_connection_post_layernorm": "ChatGLM: which tensor the residual adds (same tensors)",
    "classifier_dropout": "classifier head only", "layernorm_epsilon": "a norm's epsilon",
    "rms_norm_eps": "read: the norm kind", "layer_norm_eps": "read: the norm kind",
    "layer_norm_epsilon": "read: the norm kind", "norm_epsilon": "read: the norm kind",
    "multi_query_attention": "read with multi_query_group_num", "use_flash_attn": _KERNEL,
    "fused_bias_fc": _KERNEL, "fused_mlp": _KERNEL, "fused_dropout_add_ln": _KERNEL,
    # read by _architecture / _moe_pattern, or implied by the model type
    "qk_layernorm": "read (model.qk_norm)", "use_qk_norm": "read (model.qk_norm)",
    "head_dim": "read (model.head_dim)", "hidden_activation": "read (model.activation)",
    "layer_types": "read: softmax-attention kinds only (others are refused)",
    "moe_layers": "read (model.moe_layer_freq)", "interleave_moe_layer_step": "read (model.moe_layer_freq)",
    "vision_config": "read (model.vision.*)",
    "image_token_id": _TOKEN, "image_token_index": _TOKEN, "video_token_id": _TOKEN, "video_token_index": _TOKEN,
    "boi_token_index": _TOKEN, "eoi_token_index": _TOKEN, "vision_start_token_id": _TOKEN,
    "vision_end_token_id": _TOKEN, "vision_token_id": _TOKEN, "audio_token_id": _TOKEN,
    "mm_tokens_per_image": "image tokens per image (the vision tower's image size sets it: model.vision.*)",
    "vision_feature_layer": "which ViT layer feeds the projector", "vision_feature_select_strategy":
        "which ViT tokens feed the projector",
    "image_seq_length": "image tokens per image (model.vision.image_size sets it)",
    "eoa_token_id": _TOKEN, "boa_token_id": _TOKEN,
    # MiniMax-M2 (configuration_minimax_m2.py): the router's e_score_correction_bias is a buffer (no gradient,
    # no optimizer state); transformers' MiniMaxM2ForCausalLM builds no MTP modules and the released checkpoint
    # stores none (its Hub total is matched without them: test_minimax_m2_total)
    "use_routing_bias": "MiniMax-M2's e_score_correction_bias: a buffer, no trained parameter",
    "use_mtp": "MiniMax-M2: MTP modules are not built by transformers' MiniMaxM2ForCausalLM nor stored in the "
               "released checkpoint",
    "num_mtp_modules": "MiniMax-M2: see use_mtp", "mtp_transformer_layers": "MiniMax-M2: see use_mtp",
    "input_jitter_noise": _ROUTING,
    # PretrainedConfig's generic attributes, written by save_pretrained into every config.json
    "problem_type": "classifier heads only", "tf_legacy_loss": "a TensorFlow loss switch",
    "use_bfloat16": "a TensorFlow dtype switch", "prefix": "generation prompt text",
    "finetuning_task": "provenance", "chunk_size_feed_forward": "read: must be 0 (NEUTRAL_AT)",
    "is_encoder_decoder": "read: must be false (NEUTRAL_AT)", "add_cross_attention": "read: must be false",
    "cross_attention_hidden_size": "used only with add_cross_attention (must be false)",
    "pruned_heads": "read: must be empty (NEUTRAL_AT)", "tie_word_embeddings": "read (model.tied_embeddings)",
    "max_length": "generation length", "min_length": "generation length", "do_sample": "generation setting",
    "early_stopping": "generation setting", "num_beams": "generation setting", "num_beam_groups":
    "generation setting", "diversity_penalty": "generation setting", "temperature": "generation setting",
    "top_k": "generation setting", "top_p": "generation setting", "typical_p": "generation setting",
    "repetition_penalty": "generation setting", "length_penalty": "generation setting",
    "no_repeat_ngram_size": "generation setting", "encoder_no_repeat_ngram_size": "generation setting",
    "bad_words_ids": "generation setting", "num_return_sequences": "generation setting",
    "output_scores": "generation setting", "return_dict_in_generate": "generation setting",
    "forced_bos_token_id": _TOKEN, "forced_eos_token_id": _TOKEN, "remove_invalid_values": "generation setting",
    "exponential_decay_length_penalty": "generation setting", "suppress_tokens": "generation setting",
    "begin_suppress_tokens": "generation setting", "tokenizer_class_name": _PROVENANCE,
    "use_bidirectional_attention": "the attention mask's direction: the same tensors",
    "_sliding_window_pattern": "which layers use the window (no training-memory change, see sliding_window)",
    "rope_interleave": _ROPE, "qk_head_dim": "DeepSeek-V3: qk_nope_head_dim + qk_rope_head_dim (both read)",
    "swiglu_alpha": "gpt-oss's clamped-SwiGLU constants: the same tensors",
    "swiglu_limit": "gpt-oss's clamped-SwiGLU constants: the same tensors",
    "norm_eps": "a norm's epsilon (the norm kind comes from the model type)",
}
#: fields memory-neutral at the values listed only; any other value is refused with the reason given
NEUTRAL_AT: dict[str, tuple[tuple, str]] = {
    # Qwen3-Coder / Qwen3-MoE config.json carry "qkv_bias": false, which transformers' Qwen3MoeConfig does not
    # read (Qwen3MoeAttention: bias=config.attention_bias); a true value would mean biases memform cannot place
    "qkv_bias": ((False,), "q/k/v biases under a field transformers' configuration classes do not read: set "
                           "attention_bias, or write model.qkv_bias with --set"),
    # transformers Phi3 / PhiMoE: lm_head = Linear(h, v, bias=config.lm_head_bias); memform's head has no bias
    "lm_head_bias": ((False,), "a biased output head (vocab_size more parameters) is not modelled by dense.mf"),
    # MiniMax-M2 (configuration_minimax_m2.py, modeling MiniMaxM2Attention): q_norm / k_norm over the whole
    # projection when qk_norm_type is per_layer -- the only kind the released file uses and memform maps
    "qk_norm_type": (("per_layer",), "only MiniMax-M2's per_layer q/k norms (RMSNorm over num_heads · head_dim) "
                                     "are mapped"),
    # Gemma-3's transformers class reads these to build the vision tower; text-only importing drops them
    "attention_k_eq_v": ((False,), "keys equal to values would drop the v_proj weights memform counts"),
    # PretrainedConfig.chunk_size_feed_forward: apply_chunking_to_forward splits the FFN over the sequence
    "chunk_size_feed_forward": ((0,), "a feed-forward computed in sequence chunks keeps other activations"),
    "is_encoder_decoder": ((False,), "encoder-decoder models are not mapped"),
    "add_cross_attention": ((False,), "cross-attention layers are not mapped"),
    "pruned_heads": (({},), "pruned attention heads are not mapped"),
    # transformers SeedOssAttention: o_proj bias=config.attention_out_bias; StableLmAttention: q/k/v
    # bias=config.use_qkv_bias -- neither is mapped
    "attention_out_bias": ((False,), "an o_proj bias apart from the q/k/v ones is not mapped"),
    "use_qkv_bias": ((False,), "StableLM's q/k/v biases are not mapped (write model.qkv_bias with --set)"),
}
#: model types whose import memform has checked against the model class itself: the totals of the real
#: config.json fixtures (tests/data/importers/hf, published counts), and the types whose configuration
#: defaults import to exactly the parameters transformers' own model has on the meta device
#: (``python bench/hf_coverage.py``, transformers 5.25: within 0.01 %, a bias or norm at most). Any other
#: model type is read from its fields like a Llama-style decoder, with a warning: a tensor its class builds
#: that no config field announces (an attention output gate, an extra norm) would be missed.
CHECKED_TYPES = frozenset({
    # real config.json fixtures with published totals
    "chatglm", "deepseek_v2", "deepseek_v3", "gemma2", "gemma3", "gemma3_text", "glm4_moe", "gpt2", "gpt_neox",
    "gpt_oss", "granite", "kimi_k2", "llama", "llama4", "llama4_text", "mistral", "mixtral", "olmo2", "olmoe",
    "phi3", "qwen2", "qwen2_vl", "qwen2_5_vl", "qwen3", "qwen3_moe", "qwen3_vl", "qwen3_vl_moe",
    # configuration defaults equal to transformers' model (bench/hf_coverage.py)
    "apertus", "apertus1p5_text", "arcee", "axk1", "codegen", "cwm", "emu3", "ernie4_5", "exaone", "exaone4",
    "exaone_moe", "flex_olmo", "flint", "gemma", "glm", "glm4", "glm4_moe_lite", "gpt-sw3", "granitemoe",
    "granitemoeshared", "helium", "internlm3", "iquestcoder", "jais2", "kolibri1", "mellum", "minicpm3",
    "minimax_m2", "ministral3", "nanochat", "olmo3", "phimoe", "qwen2_moe", "qwen3_5_moe_text", "qwen3_5_text",
    "sarvam_mla", "seed_oss", "smollm3", "solar_open", "stablelm", "starcoder2", "vaultgemma",
    # hybrid and linear-attention stacks read by their own modules (tests/test_arch_*.py; bench/hf_coverage.py)
    "bamba", "falcon_h1", "granitemoehybrid", "jamba", "lfm2", "lfm2_moe", "mamba", "mamba2", "nemotron_h",
    "qwen3_next",
})
#: remote-code model classes checked the same way (their config.json names no model_type)
CHECKED_CLASSES = frozenset({"ChatGLMModel", "ChatGLMForConditionalGeneration"})
#: transformers model types whose MLP is gated even though the activation is GeLU (GeGLU keeps
#: the same tensors as SwiGLU: gate, up, down)
GATED_GELU = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text", "vaultgemma"})
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
QK_NORM_HEAD = frozenset({"qwen3", "qwen3_moe", "gemma3", "gemma3_text", "qwen3_vl_text", "qwen3_vl_moe_text",
                          "qwen3_vl", "qwen3_vl_moe"})  # the wrappers' type when read from the top level
#: OlmoeAttention: q_norm RMSNorm(h), k_norm RMSNorm(g·d_h); MiniMaxM2Attention (transformers
#: modeling_minimax_m2.py): q_norm RMSNorm(num_attention_heads · head_dim), k_norm RMSNorm(num_key_value_heads ·
#: head_dim) -- its config says use_qk_norm true, qk_norm_type per_layer
QK_NORM_FULL = frozenset({"olmo2", "olmo3", "olmoe", "minimax_m2"})
#: sandwich norms: post_attention_layernorm and post_feedforward_layernorm after the sublayers besides
#: the two pre-norms (transformers Gemma2DecoderLayer, Gemma3DecoderLayer)
POST_NORMS = frozenset({"gemma2", "gemma3", "gemma3_text"})
#: model types whose attention_bias puts biases on q_proj, k_proj, v_proj only (transformers GlmAttention,
#: Glm4MoeAttention: q/k/v bias=config.attention_bias, o_proj bias=False; the MLPs have none)
ATTENTION_BIAS_IS_QKV = frozenset({"glm", "glm4", "glm4_moe"})
#: model types whose q_norm / k_norm, when use_qk_norm is true, are RMSNorm(head_dim) with weights
#: (transformers Glm4MoeAttention); Llama-4's use_qk_norm is a weightless L2 norm instead (USE_QK_NORM_L2)
USE_QK_NORM_WEIGHTED = frozenset({"glm4_moe"})
#: transformers Llama4TextAttention: qk_norm = Llama4TextL2Norm() (x / ||x||, no weight) when use_qk_norm
USE_QK_NORM_L2 = frozenset({"llama4", "llama4_text"})
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
    # attention output gates that no config.json field announces (the model class builds them)
    "minicpm5_moe": "MiniCPM5-MoE's attention output gate (MiniCPM5MoeAttention q_gate_proj: the query projection "
                    "twice as wide, a sigmoid gate on the attention output) is not mapped",
    "beam": "Beam's gated attention (BeamAttention gate_proj and a per-head gate_bias) and its four norms per "
            "layer (pre/post feed-forward layernorms) are not mapped",
    "lfm2_vl": "LFM2-VL's SigLIP2 tower and pixel-unshuffle projector are not sized (its LFM2 language model is: "
               "import the text_config alone, model_type lfm2)",
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
    "rwkv": "RWKV recurrent layers are not modelled",
    "falcon_mamba": "Falcon-Mamba's Mamba-1 mixers normalise B, C and dt with weightless RMSNorms (transformers "
                    "FalconMambaMixer rms_forward), which mamba1.mf does not model (it models Mamba's and Jamba's)",
    "minimax": "MiniMax-Text-01's lightning (linear) attention layers are not modelled",
    "minimax_m1": "MiniMax-M1's lightning (linear) attention layers (attn_type_list) are not modelled",
    "gemma3n": "Gemma-3n's AltUp / LAuReL blocks and per-layer input embeddings are not modelled",
    "glm_moe_dsa": "DeepSeek sparse attention's indexer (index_n_heads, index_head_dim) is not modelled",
    "deepseek_v32": "DeepSeek-V3.2's sparse-attention indexer (index_n_heads, index_head_dim) is not modelled",
}
#: fields that change the model's tensors in ways memform does not model: set (not empty / false), they stop
#: the import with the reason
REFUSED_FIELDS = {
    # MiniMax-M1 / MiniMax-Text-01 (remote code): attn_type_list 0 = lightning (linear) attention, 1 = softmax
    "attn_type_list": "lightning (linear) attention layers (MiniMax-M1 / Text-01) are not modelled",
    # Qwen3.5 / Qwen3-Next Gated DeltaNet, Nemotron-H / Granite-4.0-H Mamba layers (besides model_type)
    "linear_num_value_heads": "linear-attention (Gated DeltaNet) layers are not modelled",
    "mamba_d_state": "Mamba layers are not modelled", "ssm_state_size": "state-space (Mamba) layers are not modelled",
    # DeepSeek-V3.2 / GLM-5 sparse attention: a lightning indexer per layer (index_n_heads × index_head_dim)
    "index_head_dim": "DeepSeek sparse attention's indexer (its own projections and norm per layer) is not modelled",
    "index_n_heads": "DeepSeek sparse attention's indexer (its own projections and norm per layer) is not modelled",
    # Qwen3-VL vision_config.deepstack_visual_indexes is read in _vision; a text model with per-layer FFN list:
    "intermediate_size_per_layer": "per-layer FFN widths are not modelled (one decoder layer shape per stack)",
    "num_kv_heads_per_layer": "per-layer K/V head counts are not modelled (one decoder layer shape per stack)",
    # Gemma-3n (transformers Gemma3nTextConfig): AltUp, LAuReL and per-layer input embeddings
    "altup_num_inputs": "Gemma-3n's AltUp / LAuReL blocks and per-layer embeddings are not modelled",
    "hidden_size_per_layer_input": "Gemma-3n's per-layer input embeddings are not modelled",
    # Qwen3-Next / Qwen3.5: a sigmoid output gate on attention (q_proj twice as wide)
    "attn_output_gate": "the gated attention output (q_proj twice as wide) is not modelled",
    # ERNIE-4.5-MoE (moe_num_experts, moe_k, moe_layer_start_index / interval) and Hunyuan-MoE (moe_topk):
    # MoE fields under names memform does not map
    "moe_num_experts": "ERNIE-4.5's MoE fields (moe_num_experts, moe_k, moe_layer_start_index / end_index / "
                       "interval, moe_num_shared_experts) are not mapped",
    "moe_topk": "Hunyuan-MoE's MoE fields (moe_topk, num_shared_expert, moe_intermediate_size lists) are not mapped",
    # OLMoE / DBRX clamp q/k/v (a saved mask per element)
    "clip_qkv": "clamping q/k/v keeps a mask per element memform does not count",
}
DROPOUT_FIELDS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop",
                  "hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "residual_dropout",
                  "embedding_dropout")
EXPERT_FIELDS = ("num_local_experts", "n_routed_experts", "num_experts")
MLA_FIELDS = ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


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
    if model_type in hf_hybrid.MODEL_TYPES:  # hybrid Mamba-2 stacks: mamba.mf (issue 34)
        import sys
        return hf_hybrid.convert(cfg, draft, given, model_type, sys.modules[__name__])

    _unsupported(cfg, model_type)
    # a multimodal wrapper (llava) is checked by its language model's type; ChatGLM's remote-code config.json
    # names no model_type, its class in architectures
    checked = CHECKED_TYPES | hf_nas.MODEL_TYPES | hf_linear.MODEL_TYPES
    text_type = cfg.string("model_type", "") if cfg is not top else model_type
    arches = top.raw("architectures") if isinstance(top.raw("architectures"), list) else []
    if model_type not in checked and text_type not in checked and not set(arches) & CHECKED_CLASSES:
        draft.warn(f"model_type {model_type or 'not stated'!r} is read from its fields as a Llama-style decoder; "
                   f"memform has not checked it against the model class (bench/hf_coverage.py), so a tensor the "
                   f"class builds that no field announces (an attention output gate, an extra norm) is missed")
    if cfg is not top:
        _neutral_at(top, model_type)
    ints = cfg.integer
    hk, h = cfg.alias(("hidden_size", "n_embd", "d_model"), ints)
    if h is None:
        raise cfg.missing("hidden_size")
    ak, a = cfg.alias(("num_attention_heads", "n_head", "n_heads"), ints)
    if a is None:
        raise cfg.missing("num_attention_heads")
    # THUDM ChatGLM configs name it num_layers (configuration_chatglm.py); GLM-4 copies also num_hidden_layers
    lk, layers = cfg.alias(("num_hidden_layers", "n_layer", "num_layers", "n_layers"), ints)
    if layers is None:
        raise cfg.missing("num_hidden_layers")
    draft.set("model.hidden_size", h)
    draft.set("model.num_heads", a, "num_attention_heads")
    if cfg.has("num_key_value_heads"):
        draft.set("model.num_kv_heads", cfg.alias(("num_key_value_heads", "num_kv_heads"), ints)[1],
                  "num_key_value_heads")
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
    ffn_key, ffn = cfg.alias(("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"), ints)
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
    _seq_length(cfg, draft, model_type, given)

    _activation(cfg, draft, model_type)
    _norm(cfg, draft, model_type)
    _flags(cfg, draft, model_type, top)
    head_dim = cfg.integer("head_dim", None)
    if head_dim is None and cfg.has("kv_channels"):
        head_dim = cfg.integer("kv_channels")  # modeling_chatglm.py: projection_size = kv_channels × heads
    elif head_dim is not None:
        cfg.alias(("head_dim", "kv_channels"), ints)
    if head_dim is not None and head_dim * a != h and not cfg.has("kv_lora_rank"):
        draft.set("model.head_dim", head_dim, f"head_dim (× {a} heads = {head_dim * a}, not hidden_size {h})")
    elif head_dim is None and h % a and not cfg.has("kv_lora_rank"):
        raise MemformError(f"{path}: hidden_size {h} is not a multiple of num_attention_heads {a} and there is "
                           f"no 'head_dim' field")
    _architecture(cfg, draft, model_type)
    _moe(cfg, draft, model_type)
    _mla(cfg, draft)
    hf_nas.convert(cfg, draft, model_type)   # DeciLM / Nemotron-NAS per-layer blocks (formulas/nas.mf)
    hf_linear.convert(cfg, draft, model_type)   # Gated DeltaNet hybrids (formulas/deltanet.mf)
    mtp = cfg.integer("num_nextn_predict_layers", 0, minimum=0)
    if mtp:
        draft.set("model.mtp_layers", mtp, "num_nextn_predict_layers")
    if top.has("vision_config"):
        from . import hf_vision  # Qwen3-VL, Gemma-3, Llama-4 towers (the rest: _vision)
        hf_vision.read(top, top.section("vision_config"), draft, model_type, _vision)
    # REFUSED_FIELDS stopped the import when set; left null / empty / false they describe nothing
    neutral = set(NEUTRAL) | set(NEUTRAL_AT) | set(REFUSED_FIELDS) | set(hf_linear.NEUTRAL) \
        | {k for k in data if isinstance(k, str) and k.endswith("_token_id")} | _nulls(top) | _nulls(cfg)
    if cfg is not top:
        # the model's own fields are read from text_config; the wrapper's own ids and names stay neutral
        neutral |= {k for k in cfg.data if isinstance(k, str) and k.endswith("_token_id")}
    draft.refuse_unused(cfg, neutral)
    if cfg is not top:
        draft.refuse_unused(top, neutral)
    from . import quant   # bitsandbytes 4-bit -> lora.base_quant (QLoRA); other formats warned
    quant.convert(cfg if cfg.has("quantization_config") else top, draft)


def _neutral_at(fields: Fields, model_type: str) -> None:
    """Refuse a NEUTRAL_AT field set to a value other than its memory-neutral ones."""
    for key, (allowed, why) in NEUTRAL_AT.items():
        value = fields.data.get(key)
        if key == "qkv_bias" and model_type in QKV_BIAS_ONLY:
            continue  # read in _flags (Qwen2MoeAttention: bias=config.qkv_bias)
        if key in fields.data and value is not None and value not in allowed:
            raise fields.error(key, f"is {json.dumps(value)}: {why} (memform imports it at "
                                    f"{' / '.join(json.dumps(a) for a in allowed)} only)")


def _nulls(fields: Fields) -> set[str]:
    """Fields set to null: the configuration class's default applies, which is what the model-type rules
    above assume (a null that means something else -- DeciLM's per-layer num_key_value_heads -- comes with
    block_configs, read by hf_nas)."""
    return {k for k, v in fields.data.items() if v is None}


#: training sequence assumed when the command line gives none: config.json states the longest context
#: the model supports (max_position_embeddings), not a training length -- Llama-4-Scout's 10,485,760 would
#: size activations for 10M-token sequences. 4096 is a common pre-training length (Llama-2, Llama-3's
#: first stage: 8192; OLMo-2: 4096), capped by the model's own maximum.
DEFAULT_SEQ = 4096


def _seq_length(cfg: Fields, draft: Draft, model_type: str, given) -> None:  # noqa: ANN001 - a mapping
    """``model.seq_length``: the training sequence (see DEFAULT_SEQ), never the context limit silently."""
    seq_key, longest = cfg.first(("max_position_embeddings", "n_positions", "seq_length"), cfg.integer)
    for key in ("max_position_embeddings", "n_positions", "seq_length", "n_ctx"):
        if cfg.has(key):
            cfg.integer(key)  # type-checked, and read: the context limit caps the default below
    if "model.seq_length" in given:
        return  # --set model.seq_length wins (Draft.apply)
    if model_type in LEARNED_POSITIONS:
        # learned absolute positions: the position table has max_position_embeddings rows, and dense.mf sizes
        # that table by model.seq_length (embedding params s·h), so it must be the table's length
        if longest is None:
            raise cfg.missing("max_position_embeddings", " (or pass --set model.seq_length=N)")
        draft.set("model.seq_length", longest, f"{seq_key}: the learned position table's rows")
        return
    seq = DEFAULT_SEQ if longest is None else min(DEFAULT_SEQ, longest)
    if longest is None:
        limit = "no max_position_embeddings field"
    elif longest < DEFAULT_SEQ:
        limit = f"capped at {seq_key} {longest}"
    else:
        limit = f"{seq_key} {longest} is the context limit"
    draft.default("model.seq_length", seq, f"a training length of {DEFAULT_SEQ} tokens ({limit}); set yours")
    draft.warn(f"model.seq_length = {seq} is a default: config.json gives the longest context the model "
               f"supports{f' ({seq_key} {longest})' if longest is not None else ''}, not a training length; pass "
               f"--set model.seq_length=N with your training sequence")


def _unsupported(cfg: Fields, model_type: str) -> None:
    """Stop on architectures memform cannot size (UNSUPPORTED_*), naming the field and what is missing."""
    for key, what in UNSUPPORTED_FLAGS.items():
        if cfg.raw(key, False) is True:
            raise cfg.error(key, f"is true: {what}")
    if cfg.raw("use_parallel_residual", False) is True and model_type != "gpt_neox":
        # StableLmDecoderLayer shares one input_layernorm, others differ again: only GPT-NeoX's is mapped
        raise cfg.error("use_parallel_residual", f"is true: the parallel block of model_type {model_type!r} is not "
                        f"mapped (memform maps GPT-NeoX's x + attn(ln1(x)) + mlp(ln2(x)))")
    claimed = hf_linear.claimed(model_type)   # Gated DeltaNet hybrids: read by hf_linear (deltanet.mf)
    what = UNSUPPORTED_TYPES.get(model_type)
    if what:
        raise MemformError(f"{cfg.file}: model_type {model_type!r}: {what}; memform cannot size this model yet")
    kinds = cfg.raw("layer_types", [])
    if isinstance(kinds, list):
        other = sorted({k for k in kinds if isinstance(k, str)} - ATTENTION_LAYER_TYPES - claimed)
        if other:
            raise cfg.error("layer_types", f"has {', '.join(other)} layers: memform models softmax-attention "
                            f"decoders only")
    if cfg.has("hybrid_override_pattern"):
        raise cfg.error("hybrid_override_pattern", "describes hybrid Mamba / attention layers, which memform "
                        "does not model")
    for key, why in REFUSED_FIELDS.items():
        value = cfg.raw(key)
        if value in (None, [], {}, False, 0) or key in claimed:
            continue
        if key == "attn_type_list" and isinstance(value, list) and 0 not in value:
            continue  # MiniMax-M2: every layer 1 (softmax attention) -- nothing but ordinary attention
        raise cfg.error(key, f"is set: {why}; memform cannot size this model yet, and an import that skipped "
                             f"the field would be silently wrong")
    _neutral_at(cfg, model_type)
    if (cfg.raw("use_mtp", False) is True or cfg.integer("num_mtp_modules", 0, minimum=0)) \
            and model_type != "minimax_m2":
        raise cfg.error("use_mtp", f"is set for model_type {model_type!r}: multi-token-prediction modules memform "
                                   f"maps only as DeepSeek's num_nextn_predict_layers (MiniMax-M2's are not built)")
    for key in ("post_layer_norm", "fp32_residual_connection"):
        cfg.used.add(key)
    if cfg.raw("post_layer_norm", True) is False:
        # modeling_chatglm.py GLMTransformer: final_layernorm only if post_layer_norm
        raise cfg.error("post_layer_norm", "is false: a model without the final norm is not modelled (dense.mf "
                                           "counts one)")
    if cfg.raw("fp32_residual_connection", False) is True:
        raise cfg.error("fp32_residual_connection", "is true: an fp32 residual stream is not modelled (memform "
                                                    "keeps the residual at the activation dtype)")


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


def _norm(cfg: Fields, draft: Draft, model_type: str = "") -> None:
    if model_type == "nemotron":
        # transformers NemotronLayerNorm1P: a LayerNorm with weight and bias (norm_eps names its epsilon)
        draft.set("model.norm", "layernorm", "nemotron: NemotronLayerNorm1P (weight and bias)")
        return
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


def _flags(cfg: Fields, draft: Draft, model_type: str, top: Fields | None = None) -> None:
    top = cfg if top is None else top
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
        # transformers >= 5 Qwen2MoeAttention: q/k/v bias=config.qkv_bias (default true); older: always true
        qkv = cfg.boolean("qkv_bias", True)
        draft.set("model.qkv_bias", qkv, f"{model_type}: q_proj, k_proj, v_proj biases (qkv_bias, default true)")
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
        draft.set("model.tied_embeddings", cfg.boolean("tie_word_embeddings"), f"{cfg.name('tie_word_embeddings')}")
        if top is not cfg and top.has("tie_word_embeddings"):
            # Qwen3-VL and Gemma-3 configs state it twice: both are read, they must agree
            if top.boolean("tie_word_embeddings") != cfg.boolean("tie_word_embeddings"):
                # transformers >= 5 PreTrainedModel.get_expanded_tied_weights_keys reads the wrapper model's own
                # config (the lm_head sits in the ForConditionalGeneration class): the top level decides
                tied = top.boolean("tie_word_embeddings")
                draft.set("model.tied_embeddings", tied, "tie_word_embeddings (top level; text_config disagrees)")
                draft.warn(f"field 'tie_word_embeddings' is {str(tied).lower()} but "
                           f"'{cfg.name('tie_word_embeddings')}' is {str(not tied).lower()}: the top-level value "
                           f"is used (transformers ties the head by the wrapper's config); --set "
                           f"model.tied_embeddings={str(not tied).lower()} if your framework reads text_config")
    elif top is not cfg and top.has("tie_word_embeddings"):
        # a multimodal wrapper (Qwen3VLConfig, Gemma3Config, ...) states it at the top level; transformers ties
        # the language model's head by it when text_config does not say
        draft.set("model.tied_embeddings", top.boolean("tie_word_embeddings"), "tie_word_embeddings (top level)")
        cfg.used.add("tie_word_embeddings")
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
        if model_type in QK_NORM_HEAD or model_type in QK_NORM_FULL:
            # Qwen3-Coder / Qwen3-MoE and MiniMax-M2 say use_qk_norm true: their attention classes build the
            # weighted q_norm / k_norm whatever the field says, set above from the model type
            pass
        elif model_type in USE_QK_NORM_WEIGHTED:
            draft.set("model.qk_norm", True, f"use_qk_norm: {model_type} q_norm / k_norm = RMSNorm(head_dim)")
        elif model_type in USE_QK_NORM_L2:
            draft.warn("field 'use_qk_norm': Llama-4's q/k L2 norm (Llama4TextL2Norm) has no weights; its saved "
                       "inputs (q and k per token) are not counted")
        else:
            mapped = sorted(QK_NORM_HEAD | QK_NORM_FULL | USE_QK_NORM_WEIGHTED | USE_QK_NORM_L2)
            raise cfg.error("use_qk_norm", f"is true for model_type {model_type!r}: whether its q/k norms have "
                                           f"weights, and over what width, is not known to memform (mapped: "
                                           f"{', '.join(mapped)})")
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
    if cfg.has("mlp_layer_types"):
        # transformers 5's per-layer list (Glm4MoeLiteDecoderLayer and kin: MoE where mlp_layer_types[i] ==
        # "sparse", a dense MLP where "dense")
        kinds = cfg.raw("mlp_layer_types")
        if not isinstance(kinds, list) or len(kinds) != layers:
            raise cfg.error("mlp_layer_types", f"must list one MLP kind per layer ({layers}), got {describe(kinds)}")
        odd = sorted({k for k in kinds if k not in ("dense", "sparse")}, key=str)
        if odd:
            raise cfg.error("mlp_layer_types", f"has {', '.join(map(str, odd))} layers: memform reads dense and "
                                               f"sparse (MoE) MLP layers")
        moe = {i for i, k in enumerate(kinds) if k == "sparse"}
        source = "mlp_layer_types (sparse: MoE)"
    elif cfg.has("moe_layers") and isinstance(cfg.raw("moe_layers"), list):
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
    for other in ("moe_intermediate_size", "num_experts_per_tok", "n_shared_experts", "num_shared_experts",
                  "shared_expert_intermediate_size", "first_k_dense_replace", "moe_layer_freq",
                  "decoder_sparse_step", "mlp_only_layers", "intermediate_size_mlp", "mlp_layer_types"):
        cfg.used.add(other)
    if not experts or experts <= 1:
        if "sparse" in (cfg.raw("mlp_layer_types") or []):
            raise cfg.error("mlp_layer_types", "has sparse (MoE) layers but the file names no experts "
                                               f"({', '.join(EXPERT_FIELDS)})")
        return
    draft.set("model.num_experts", experts, key)
    if model_type in ROUTER_BIAS:
        draft.set("model.router_bias", True, f"{model_type}: the router's Linear has a bias (GptOssTopKRouter)")
    if not cfg.has("num_experts_per_tok"):
        raise cfg.missing("num_experts_per_tok", f" ({key} = {experts} makes this a mixture of experts)")
    # gpt-oss carries experts_per_token beside num_experts_per_tok
    draft.set("model.moe_top_k", cfg.alias(("num_experts_per_tok", "experts_per_token"), cfg.integer)[1],
              "num_experts_per_tok")
    expert_ffn = cfg.integer("moe_intermediate_size", None)
    if expert_ffn is None:
        expert_ffn = draft.get("model.ffn_hidden_size")
        draft.set("model.moe_ffn_hidden_size", expert_ffn, "no moe_intermediate_size: intermediate_size")
    else:
        draft.set("model.moe_ffn_hidden_size", expert_ffn, "moe_intermediate_size")
    # ExaoneMoe spells it num_shared_experts (shared MLP moe_intermediate_size × count wide, as DeepSeek's)
    shared_key, shared = cfg.alias(("n_shared_experts", "num_shared_experts"), lambda k: cfg.integer(k, minimum=0))
    if shared is not None:
        draft.set("model.num_shared_experts", shared, shared_key)
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


#: vision_config fields that move no training memory, each with the reason (the rest are read by _vision,
#: refused by REFUSED_VISION, or refused at the end of the import unless --accept names them)
NEUTRAL_VISION: dict[str, str] = {
    "model_type": _PROVENANCE, "_name_or_path": _PROVENANCE, "architectures": _PROVENANCE,
    "transformers_version": _PROVENANCE, "torch_dtype": NEUTRAL["torch_dtype"], "dtype": NEUTRAL["dtype"],
    "initializer_range": _INIT, "initializer_factor": _INIT, "layer_norm_eps": "a norm's epsilon",
    "spatial_patch_size": "Qwen2-VL: = patch_size (read)", "hidden_act": "read (warned unless GeLU)",
    "attention_dropout": "ViT attention dropout: vision.mf keeps no dropout masks (0 in released VLMs)",
    "dropout": "ViT dropout: vision.mf keeps no dropout masks (0 in released VLMs)",
    "projection_dim": "CLIP's image-text projection, not used when the ViT feeds a language model",
    "out_hidden_size": "the merger's output width = the language model's hidden_size",
    "tokens_per_second": _ROPE, "window_size": "Qwen2.5-VL window attention: a mask over the same tensors",
    "fullatt_block_indexes": "Qwen2.5-VL: which ViT layers attend globally (a mask)",
    "rope_parameters": _ROPE, "rope_theta": _ROPE, "vocab_size": "not used by a vision tower (no token embedding)",
    **{k: NEUTRAL[k] for k in ("id2label", "label2id", "output_attentions", "output_hidden_states", "return_dict",
                               "problem_type", "torchscript", "use_bfloat16", "tf_legacy_loss", "prefix",
                               "finetuning_task", "chunk_size_feed_forward", "is_encoder_decoder",
                               "add_cross_attention", "pruned_heads", "is_decoder", "tie_word_embeddings",
                               "tokenizer_class", "task_specific_params", "use_cache", "_attn_implementation",
                               "attn_implementation")},
}
#: vision_config fields that change the tower's tensors in ways vision.mf does not model (a Qwen2-VL ViT: rotary
#: positions, one patch merger): set, they stop the import
REFUSED_VISION = {
    # transformers Qwen3VLVisionModel: deepstack_merger_list, one Qwen3VLVisionPatchMerger per listed layer
    "deepstack_visual_indexes": "Qwen3-VL's DeepStack mergers (one patch merger per listed ViT layer) are not "
                                "modelled by vision.mf",
    # transformers Qwen3VLVisionModel.pos_embed = nn.Embedding(num_position_embeddings, hidden_size)
    "num_position_embeddings": "a learned position table in the ViT (Qwen3-VL) is not modelled by vision.mf",
    "num_positions": "a learned position table in the ViT is not modelled by vision.mf",
    # transformers SiglipVisionTransformer: head = SiglipMultiheadAttentionPoolingHead when vision_use_head
    "vision_use_head": "SigLIP's attention-pooling head is not modelled by vision.mf",
}


def _vision(vc: Fields, draft: Draft, handled: frozenset = frozenset(), neutral: frozenset = frozenset()) -> None:
    """A vision tower (Qwen2-VL ``vision_config``, CLIP/SigLIP fields) → ``model.vision.*`` of vision.mf;
    ``handled``: REFUSED_VISION fields a family reader (hf_vision) has read, ``neutral``: its neutral ones."""
    for key, why in REFUSED_VISION.items():
        if key not in handled and vc.has(key) and vc.raw(key) not in ([], False):
            raise vc.error(key, f"is set: {why}; the vision tower would be sized wrongly (to size the language "
                                f"model alone, import its text_config as a file of its own)")
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
    draft.refuse_unused(vc, set(NEUTRAL_VISION) | set(REFUSED_VISION) | set(neutral))


def finish(draft: Draft) -> None:
    """After the shared strategy step, the global batch. A config.json states none (it describes the
    architecture). A Trainer's arguments (``--trainer``) state the per-device batch and the accumulation
    steps, and the world size the rest: transformers' ``Trainer.get_total_train_batch_size`` (trainer.py,
    transformers 5.25) is micro-batch × gradient_accumulation_steps × the data-parallel size, written when
    the device count is known (``--devices``). Otherwise the file says so: a search ranks plans by step
    time only at one global batch, and refuses, naming the key, until it is set."""
    if "training.global_batch_size" in draft:
        return
    dp = draft.entries.get("parallel.dp")
    steps = draft.entries.get("training.num_micro_batches")
    micro = draft.get("training.micro_batch_size")
    if draft.get("training.framework") == "hf-trainer" and dp is not None and not dp.default and steps is not None \
            and all(isinstance(x, int) and not isinstance(x, bool) for x in (dp.value, steps.value, micro)):
        if steps.note != "set on the command line":
            del draft.entries["training.num_micro_batches"]   # follows from the global batch, at any dp
        draft.set("training.global_batch_size", micro * steps.value * dp.value,
                  f"Trainer total_train_batch_size: per-device batch {micro} × gradient_accumulation_steps "
                  f"{steps.value} × data-parallel size {dp.value}")
        return
    what = "a config.json states no training batch" if draft.get("training.framework") != "hf-trainer" else \
        "the Trainer's global batch needs the world size (pass --devices N)"
    draft.header += [f"No training.global_batch_size: {what}. `memform search` ranks plans by step time",
                     "only at one global batch and refuses without it: --set training.global_batch_size=N."]
