"""Hugging Face ``config.json`` of Liquid AI's LFM2 / LFM2-MoE → ``formulas/mamba.mf`` keys (the short-conv
sublayer ``C`` lives in ``formulas/lfm2.mf``). Called by :mod:`.hf_hybrid` for the model types ``lfm2`` and
``lfm2_moe``; the shared field handling (unknown fields refused, ``--accept``) is :mod:`.hf_hybrid`'s.

- ``lfm2`` (transformers ``Lfm2Config`` / modeling_lfm2.py): every ``Lfm2DecoderLayer`` is an ``operator_norm``
  then a short conv (``Lfm2ShortConv``) or attention (``Lfm2Attention``, q/k RMSNorms per head), residual; then
  ``ffn_norm`` and the SwiGLU ``Lfm2MLP`` (w1, w3, w2), residual: two memform sublayers, ``C-`` or ``*-``. The
  kinds come from ``layer_types`` (``conv`` / ``full_attention``) or, in older files, ``full_attn_idxs``
  (Lfm2Config.__post_init__). The FFN width: ``block_ff_dim`` (else ``intermediate_size``), and with
  ``block_auto_adjust_ff_dim`` int(2/3 · it), times ``block_ffn_dim_multiplier``, rounded up to
  ``block_multiple_of`` (Lfm2MLP.__init__).
- ``lfm2_moe`` (transformers ``Lfm2MoeConfig`` / modeling_lfm2_moe.py): the same layers, the first
  ``num_dense_layers`` with the dense MLP of ``intermediate_size`` as is, the others a sigmoid-routed MoE block
  (``Lfm2MoeSparseMoeBlock``: router weight, ``num_experts`` gated experts of ``moe_intermediate_size``, no
  shared expert; ``expert_bias`` a buffer): ``C-`` / ``*-`` then ``CE`` / ``*E``.
"""

from __future__ import annotations

from ..errors import MemformError
from .draft import Draft, Fields, describe

_INIT = "initialisation only"
KINDS = {"conv": "C", "full_attention": "*"}
#: fields of these configs that move no training memory (beyond hf_hybrid.NEUTRAL / hf.NEUTRAL)
NEUTRAL: dict[str, str] = {
    "norm_eps": "a norm's epsilon", "block_norm_eps": "a norm's epsilon",
    "block_mlp_init_scale": _INIT, "block_out_init_scale": _INIT, "block_use_xavier_init": _INIT,
    "conv_use_xavier_init": _INIT, "initializer_range": _INIT,
    "use_pos_enc": "RoPE on the attention layers (parameter-free: model.position_embedding rope)",
    "full_attn_idxs": "read (model.hybrid_pattern)", "layer_types": "read (model.hybrid_pattern)",
    "block_ff_dim": "read (model.ffn_hidden_size)", "intermediate_size": "read (model.ffn_hidden_size)",
    "block_multiple_of": "read (model.ffn_hidden_size)", "block_ffn_dim_multiplier": "read (model.ffn_hidden_size)",
    "block_auto_adjust_ff_dim": "read (model.ffn_hidden_size)",
    "use_expert_bias": "a routing bias buffer (Lfm2MoeSparseMoeBlock.expert_bias: E floats, not trained)",
    "num_dense_layers": "read (model.hybrid_pattern)",
}


def convert(cfg: Fields, draft: Draft, given, model_type: str, hf) -> None:  # noqa: ANN001
    cfg.used.update(NEUTRAL)
    h = cfg.integer("hidden_size")
    for key in ("block_dim", "conv_dim", "conv_dim_out"):
        # LFM2's original config names the decoder / conv widths again: they must be hidden_size (Lfm2ShortConv
        # builds in_proj h -> 3h, conv and out_proj over h whatever they say)
        if cfg.has(key) and cfg.integer(key) != h:
            raise cfg.error(key, f"is {cfg.integer(key)}, not hidden_size {h}: transformers' Lfm2ShortConv sizes "
                                 f"the conv by hidden_size, a different width is not modelled")
        cfg.used.add(key)
    layers = cfg.integer("num_hidden_layers")
    kinds = _kinds(cfg, layers)
    a = cfg.integer("num_attention_heads")
    if cfg.has("num_heads") and cfg.integer("num_heads") != a:
        raise cfg.error("num_heads", f"is {cfg.integer('num_heads')} but num_attention_heads is {a}")
    cfg.used.add("num_heads")
    head_dim = cfg.integer("head_dim", h // a)
    if head_dim * a != h:
        draft.set("model.head_dim", head_dim, f"head_dim (× {a} heads, not hidden_size {h})")
    elif h % a:
        raise MemformError(f"{cfg.file}: hidden_size {h} is not a multiple of num_attention_heads {a}")
    if cfg.boolean("block_use_swiglu", True) is not True:
        raise cfg.error("block_use_swiglu", "is false: transformers' Lfm2MLP is always SwiGLU (w1, w3, w2)")
    moe = model_type == "lfm2_moe"
    dense = cfg.integer("num_dense_layers", 2, minimum=0) if moe else layers
    ffn = ["-" if i < dense else "E" for i in range(layers)]
    pattern = "".join(k + f for k, f in zip(kinds, ffn))
    draft.set("model.hidden_size", h)
    draft.set("model.vocab_size", cfg.integer("vocab_size"))
    hf._seq_length(cfg, draft, model_type, given)
    draft.set("model.num_layers", 2 * layers, f"{layers} decoder layers, two sublayers each (short conv or "
                                              f"attention after operator_norm, then the FFN after ffn_norm)")
    draft.set("model.hybrid_pattern", pattern, "layer_types / full_attn_idxs (C short conv, * attention), "
                                               + ("num_dense_layers (- MLP, E MoE)" if moe else "- the SwiGLU MLP"))
    draft.set("model.hybrid_ffn_paired", True, "the FFN runs in the mixer's decoder layer (one checkpoint per pair)")
    draft.set("model.num_heads", a, "num_attention_heads")
    draft.set("model.num_kv_heads", cfg.integer("num_key_value_heads", a), "num_key_value_heads")
    draft.set("model.qk_norm", True, "Lfm2Attention q_layernorm / k_layernorm (RMSNorm over head_dim)")
    draft.set("model.norm", "rmsnorm", "Lfm2RMSNorm (weight only)")
    draft.set("model.position_embedding", "rope", "RoPE on the attention layers (no position parameters)")
    draft.set("model.activation", "swiglu", "Lfm2MLP: w2(silu(w1 x) · w3 x)")
    draft.set("model.swiglu_impl", "eager", "Lfm2MLP: eager silu(w1 x) * w3 x")
    draft.set("model.bias", False, "Lfm2Attention / Lfm2MLP: no biases")
    draft.set("model.dropout", False, "LFM2 has no dropout")
    tied = cfg.boolean("tie_embedding", True) if cfg.has("tie_embedding") else True
    tied = cfg.boolean("tie_word_embeddings", tied)
    cfg.used.add("tie_embedding")
    draft.set("model.tied_embeddings", tied, "tie_word_embeddings (Lfm2Config: tie_embedding, default true)")
    draft.set("model.short_conv_kernel", cfg.integer("conv_L_cache", 3), "conv_L_cache")
    draft.set("model.short_conv_bias", cfg.boolean("conv_bias", False), "conv_bias (in_proj, conv, out_proj)")
    draft.set("model.ffn_hidden_size", _ffn(cfg, moe), "Lfm2MLP width" + ("" if moe else " (block_ff_dim rule)"))
    if moe:
        experts = cfg.integer("num_experts", 32)
        if dense < layers:
            draft.set("model.num_experts", experts, "num_experts")
            draft.set("model.moe_top_k", cfg.integer("num_experts_per_tok", 4), "num_experts_per_tok")
            draft.set("model.moe_ffn_hidden_size", cfg.integer("moe_intermediate_size", 1792),
                      "moe_intermediate_size (Lfm2MoeExperts gate_up_proj 2f × h, down_proj)")
            draft.set("model.num_shared_experts", 0, "Lfm2MoeSparseMoeBlock: router and routed experts only")
        cfg.used.update(("num_experts_per_tok", "moe_intermediate_size"))
    for key in ("num_hidden_layers", "max_position_embeddings", "model_type"):
        cfg.used.add(key)


def _kinds(cfg: Fields, layers: int) -> list[str]:
    """One pattern symbol per decoder layer (Lfm2Config.__post_init__: layer_types, else full_attn_idxs)."""
    if cfg.has("layer_types") and cfg.raw("layer_types") is not None:
        kinds = cfg.raw("layer_types")
        if not isinstance(kinds, list) or len(kinds) != layers or any(k not in KINDS for k in kinds):
            raise cfg.error("layer_types", f"must list conv / full_attention for each of the {layers} layers, got "
                                           f"{describe(kinds)}")
        return [KINDS[k] for k in kinds]
    idxs = cfg.raw("full_attn_idxs")
    if idxs is None:
        return ["*"] * layers   # Lfm2Config: every layer attention when neither is given
    if not isinstance(idxs, list) or any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < layers
                                         for i in idxs):
        raise cfg.error("full_attn_idxs", f"must list layer indices below num_hidden_layers {layers}, got "
                                          f"{describe(idxs)}")
    return ["*" if i in idxs else "C" for i in range(layers)]


def _ffn(cfg: Fields, moe: bool) -> int:
    """Lfm2MLP's width (Lfm2MLP.__init__; Lfm2MoeMLP takes intermediate_size as is)."""
    key = "block_ff_dim" if cfg.has("block_ff_dim") and not moe else "intermediate_size"
    f = cfg.integer(key, 12288 if not moe else 7168)
    if moe or not cfg.boolean("block_auto_adjust_ff_dim", True):
        return f
    f = int(2 * f / 3)
    mult = cfg.raw("block_ffn_dim_multiplier", 1.0)
    if mult is not None:
        mult = cfg.number("block_ffn_dim_multiplier", 1.0)
        multiple = cfg.integer("block_multiple_of", 256)
        f = int(mult * f)
        f = multiple * ((f + multiple - 1) // multiple)
    return f
