"""Hugging Face ``config.json`` of pure Mamba / Mamba-2 models and of AI21's Jamba → ``formulas/mamba.mf`` keys
(its Mamba-1 sublayer ``S`` lives in ``formulas/mamba1.mf``). Called by :mod:`.hf_hybrid` for the model types
``mamba``, ``mamba2`` and ``jamba``; the shared field handling (unknown fields refused, ``--accept``) is
:mod:`.hf_hybrid`'s.

- ``mamba`` (transformers ``MambaConfig`` / modeling_mamba.py): ``MambaBlock`` = ``norm`` (MambaRMSNorm), then
  ``MambaMixer`` (in_proj h -> 2·d_inner, conv1d, x_proj d_inner -> R + 2N, dt_proj, A_log, D, out_proj); no
  MLP; tied embeddings by default. Pattern ``S`` per layer.
- ``mamba2`` (transformers ``Mamba2Config`` / modeling_mamba2.py): ``Mamba2Block`` = ``norm``, then
  ``Mamba2Mixer`` (d_inner = expand · hidden = num_heads · head_dim; gated group RMSNorm); no MLP. Pattern ``M``.
- ``jamba`` (transformers ``JambaConfig`` / modeling_jamba.py): layer i is attention when
  ``i % attn_layer_period == attn_layer_offset`` else Mamba-1 (JambaConfig.layers_block_type), and its FFN a
  MoE block when ``i % expert_layer_period == expert_layer_offset`` (and num_experts > 1) else a gated MLP
  (JambaConfig.layers_num_experts); each half after its own RMSNorm (JambaMambaDecoderLayer /
  JambaAttentionDecoderLayer: input_layernorm, mixer, residual; pre_ff_layernorm, feed_forward, residual).
"""

from __future__ import annotations

from ..errors import MemformError
from .draft import Draft, Fields

_INIT = "initialisation only"
#: fields of these configs that move no training memory (beyond hf_hybrid.NEUTRAL / hf.NEUTRAL)
NEUTRAL: dict[str, str] = {
    "use_mambapy": "the CPU fallback scan without mamba_ssm (mamba.py's pscan instead of the sequential loop); "
                   "memform's model.mamba_impl torch models the loop",
    "use_associative_scan": "torch.compile's associative scan of the CPU fallback (inactive in eager training)",
    "time_step_scale": _INIT, "time_step_init_scheme": _INIT, "initializer_range": _INIT,
    "layer_norm_epsilon": "a norm's epsilon", "rms_norm_eps": "a norm's epsilon",
    "intermediate_size": "read",
    "attn_layer_period": "read (model.hybrid_pattern)", "attn_layer_offset": "read (model.hybrid_pattern)",
    "expert_layer_period": "read (model.hybrid_pattern)", "expert_layer_offset": "read (model.hybrid_pattern)",
    "calc_logits_for_entire_prompt": "inference only (logits of the prompt)",
    "n_ctx": "the context length (read as max_position_embeddings would be)",
}


def convert(cfg: Fields, draft: Draft, given, model_type: str, hf) -> None:  # noqa: ANN001
    cfg.used.update(NEUTRAL)
    if model_type == "jamba":
        _jamba(cfg, draft, given, hf)
    elif model_type == "mamba":
        _mamba(cfg, draft, given, hf)
    else:
        _mamba2(cfg, draft, given, hf)
    for key in ("num_hidden_layers", "max_position_embeddings", "model_type"):
        cfg.used.add(key)


def _common(cfg: Fields, draft: Draft, given, model_type: str, hf) -> int:  # noqa: ANN001
    """hidden_size, vocab, sequence, norm, dtype-free fields every Mamba config shares; returns h."""
    h = cfg.integer("hidden_size")
    draft.set("model.hidden_size", h)
    draft.set("model.vocab_size", cfg.integer("vocab_size"))
    hf._seq_length(cfg, draft, model_type, given)
    draft.set("model.norm", "rmsnorm", "MambaRMSNorm / Mamba2RMSNorm / JambaRMSNorm (weight only)")
    draft.set("model.position_embedding", "rope", "no position parameters (Mamba's layers carry position)")
    draft.set("model.dropout", bool(cfg.number("attention_dropout", 0)), "attention_dropout")
    if cfg.string("hidden_act", "silu") not in ("silu", "swish"):
        raise cfg.error("hidden_act", "is not silu: the conv1d's activation (and Jamba's gated MLP) are mapped "
                                      "with SiLU only")
    return h


def _layers(cfg: Fields) -> int:
    if cfg.has("n_layer") and not cfg.has("num_hidden_layers"):
        cfg.used.add("n_layer")
        return cfg.integer("n_layer")
    return cfg.integer("num_hidden_layers")


def _dt_rank(cfg: Fields, key: str, h: int) -> int:
    """``"auto"``: ceil(hidden / 16) (MambaConfig / JambaConfig __post_init__; Gu & Dao §3.6)."""
    value = cfg.raw(key, "auto")
    cfg.used.add(key)
    if value in ("auto", None):
        return -(-h // 16)
    return cfg.integer(key)


def _residual(cfg: Fields, draft: Draft) -> None:
    # MambaBlock / Mamba2Block: residual.to(float32); the next norm casts back to its weight's dtype first
    # (hidden_states.to(norm.weight.dtype)): the fp32 sum is transient, no tensor kept for backward grows
    if cfg.boolean("residual_in_fp32", True):
        draft.warn("residual_in_fp32: the residual stream is added in fp32 (MambaBlock); with 16-bit weights each "
                   "layer's fp32 sum is a transient tensor memform does not count")


def _mamba(cfg: Fields, draft: Draft, given, hf) -> None:  # noqa: ANN001
    """transformers MambaConfig / MambaForCausalLM (state-spaces/mamba-*-hf)."""
    h = _common(cfg, draft, given, "mamba", hf)
    layers = _layers(cfg)
    draft.set("model.num_layers", layers, "num_hidden_layers: one MambaBlock (norm + Mamba-1 mixer) each")
    draft.set("model.num_heads", 1, "no attention (a placeholder: no attention layer in the pattern)")
    draft.set("model.hybrid_pattern", "S" * layers, "every layer a Mamba-1 mixer after its norm (MambaBlock)")
    expand = cfg.integer("expand", 2)
    d_inner = cfg.integer("intermediate_size", expand * h)
    if d_inner != expand * h and cfg.has("expand"):
        raise cfg.error("intermediate_size", f"is {d_inner} but expand × hidden_size is {expand * h}: the file "
                                             f"disagrees with itself")
    cfg.used.update(("expand", "intermediate_size"))
    draft.set("model.mamba1_d_inner", d_inner, "intermediate_size (expand × hidden_size)")
    draft.set("model.mamba1_state_dim", cfg.integer("state_size", 16), "state_size")
    draft.set("model.mamba1_dt_rank", _dt_rank(cfg, "time_step_rank", h), "time_step_rank (auto: ceil(h / 16))")
    draft.set("model.mamba_conv_kernel", cfg.integer("conv_kernel", 4), "conv_kernel")
    draft.set("model.mamba_conv_bias", cfg.boolean("use_conv_bias", True), "use_conv_bias")
    draft.set("model.mamba_proj_bias", cfg.boolean("use_bias", False), "use_bias (in_proj and out_proj)")
    draft.set("model.tied_embeddings", cfg.boolean("tie_word_embeddings", True), "tie_word_embeddings (default true)")
    _residual(cfg, draft)


def _mamba2(cfg: Fields, draft: Draft, given, hf) -> None:  # noqa: ANN001
    """transformers Mamba2Config / Mamba2ForCausalLM (state-spaces/mamba2-*, Mamba-Codestral)."""
    h = _common(cfg, draft, given, "mamba2", hf)
    layers = _layers(cfg)
    heads = cfg.integer("num_heads", 128)
    head_dim = cfg.integer("head_dim", 64)
    expand = cfg.integer("expand", 2)
    if expand * h != heads * head_dim:
        raise cfg.error("num_heads", f"× head_dim = {heads * head_dim}, not expand × hidden_size = {expand * h} "
                                     f"(Mamba2Config.validate_architecture)")
    groups = cfg.integer("n_groups", 8)
    if heads % groups:
        raise cfg.error("n_groups", f"{groups} does not divide num_heads {heads}")
    draft.set("model.num_layers", layers, "num_hidden_layers: one Mamba2Block (norm + Mamba-2 mixer) each")
    draft.set("model.num_heads", 1, "no attention (a placeholder: no attention layer in the pattern)")
    draft.set("model.hybrid_pattern", "M" * layers, "every layer a Mamba-2 mixer after its norm (Mamba2Block)")
    draft.set("model.mamba_num_heads", heads, "num_heads")
    draft.set("model.mamba_head_dim", head_dim, "head_dim")
    draft.set("model.mamba_num_groups", groups, "n_groups")
    draft.set("model.mamba_state_dim", cfg.integer("state_size", 128), "state_size")
    draft.set("model.mamba_conv_kernel", cfg.integer("conv_kernel", 4), "conv_kernel")
    draft.set("model.mamba_chunk_size", cfg.integer("chunk_size", 256), "chunk_size")
    draft.set("model.mamba_conv_bias", cfg.boolean("use_conv_bias", True), "use_conv_bias")
    draft.set("model.mamba_proj_bias", cfg.boolean("use_bias", False), "use_bias (in_proj and out_proj)")
    draft.set("model.tied_embeddings", cfg.boolean("tie_word_embeddings", False), "tie_word_embeddings")
    # Mamba2's time_step_rank is unused by the Mamba-2 mixer (dt is one value per head from in_proj)
    cfg.used.update(("time_step_rank", "time_step_limit", "time_step_min", "time_step_max", "time_step_floor",
                     "rescale_prenorm_residual"))
    _residual(cfg, draft)


def _jamba(cfg: Fields, draft: Draft, given, hf) -> None:  # noqa: ANN001
    """transformers JambaConfig / JambaForCausalLM (ai21labs/Jamba-v0.1, AI21-Jamba-1.5 / 1.6)."""
    h = _common(cfg, draft, given, "jamba", hf)
    layers = _layers(cfg)
    periods = {}
    for key, default_period, default_offset in (("attn", 8, 4), ("expert", 2, 1)):
        period = cfg.integer(f"{key}_layer_period", default_period)
        offset = cfg.integer(f"{key}_layer_offset", default_offset, minimum=0)
        if offset >= period:
            raise cfg.error(f"{key}_layer_offset", f"is {offset}, not below {key}_layer_period {period} "
                                                   f"(JambaConfig.validate_architecture)")
        periods[key] = (period, offset)
    experts = cfg.integer("num_experts", 16) if cfg.has("num_experts") else cfg.integer("num_local_experts", 16)
    cfg.used.update(("num_experts", "num_local_experts"))
    if cfg.has("layers_block_type"):
        kinds = cfg.raw("layers_block_type")
        if not isinstance(kinds, list) or len(kinds) != layers or any(k not in ("mamba", "attention") for k in kinds):
            raise cfg.error("layers_block_type", f"must list mamba / attention for each of the {layers} layers")
        attn = [k == "attention" for k in kinds]
    else:
        attn = [i % periods["attn"][0] == periods["attn"][1] for i in range(layers)]
    moe = [experts > 1 and i % periods["expert"][0] == periods["expert"][1] for i in range(layers)]
    pattern = "".join(("*" if a else "S") + ("E" if e else "-") for a, e in zip(attn, moe))
    a = cfg.integer("num_attention_heads")
    if h % a:
        raise MemformError(f"{cfg.file}: hidden_size {h} is not a multiple of num_attention_heads {a}")
    draft.set("model.num_heads", a, "num_attention_heads")
    draft.set("model.num_kv_heads", cfg.integer("num_key_value_heads", a), "num_key_value_heads")
    draft.set("model.num_layers", 2 * layers, f"{layers} Jamba decoder layers, two sublayers each (Mamba-1 or "
                                              f"attention, then MLP or MoE), each after its own RMSNorm")
    draft.set("model.hybrid_pattern", pattern, "attn_layer_period / offset (* attention, S Mamba-1), "
                                               "expert_layer_period / offset (E MoE, - MLP)")
    draft.set("model.hybrid_ffn_paired", True, "the FFN runs in the mixer's decoder layer (one checkpoint per pair)")
    f = cfg.integer("intermediate_size", 14336)
    draft.set("model.ffn_hidden_size", f, "intermediate_size (JambaMLP gate_proj, up_proj, down_proj)")
    draft.set("model.activation", "swiglu", "hidden_act silu: gated MLP and experts")
    draft.set("model.bias", False, "JambaAttention / JambaMLP: no biases")
    draft.set("model.tied_embeddings", cfg.boolean("tie_word_embeddings", False), "tie_word_embeddings")
    if any(moe):
        draft.set("model.num_experts", experts, "num_experts")
        draft.set("model.moe_top_k", cfg.integer("num_experts_per_tok", 2), "num_experts_per_tok")
        draft.set("model.moe_ffn_hidden_size", f, "intermediate_size (JambaExperts gate_up_proj 2f × h)")
        draft.set("model.num_shared_experts", 0, "JambaSparseMoeBlock: router and routed experts only")
    cfg.used.add("num_experts_per_tok")
    expand = cfg.integer("mamba_expand", 2)
    draft.set("model.mamba1_d_inner", expand * h, "mamba_expand × hidden_size")
    draft.set("model.mamba1_state_dim", cfg.integer("mamba_d_state", 16), "mamba_d_state")
    draft.set("model.mamba1_dt_rank", _dt_rank(cfg, "mamba_dt_rank", h), "mamba_dt_rank (auto: ceil(h / 16))")
    draft.set("model.mamba1_dt_norms", True, "JambaMambaMixer dt_layernorm, b_layernorm, c_layernorm")
    draft.set("model.mamba_conv_kernel", cfg.integer("mamba_d_conv", 4), "mamba_d_conv")
    draft.set("model.mamba_conv_bias", _flag(cfg, "mamba_conv_bias", True), "mamba_conv_bias")
    draft.set("model.mamba_proj_bias", _flag(cfg, "mamba_proj_bias", False), "mamba_proj_bias (in_proj, out_proj)")
    cfg.used.update(("layers_block_type", "attention_dropout"))


def _flag(cfg: Fields, key: str, default: bool) -> bool:
    """A boolean some published Jamba configs write as a string ("true" / "false")."""
    value = cfg.raw(key, default)
    cfg.used.add(key)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return cfg.boolean(key, default)
