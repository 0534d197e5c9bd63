"""Hugging Face ``config.json`` of hybrid Mamba-2 models → ``formulas/mamba.mf``'s keys.

Hooked from :mod:`.hf` for the model types in :data:`MODEL_TYPES`. The layer kinds become
``model.hybrid_pattern``, one Megatron-LM symbol per sublayer (``megatron/core/ssm/
mamba_hybrid_layer_allocation.py`` Symbols: ``M`` Mamba-2, ``*`` attention, ``-`` MLP, ``E`` MoE):

- ``nemotron_h`` (transformers ``NemotronHConfig``; NVIDIA Nemotron-H / Nemotron-Nano-v2 / Nemotron-3):
  ``hybrid_override_pattern`` is that pattern already (``layers_block_type`` / ``layer_types``, the newer
  spelling, are mapped back with NemotronHConfig._list_to_pattern's table); every NemotronHBlock is one
  norm and one mixer (modeling_nemotron_h.py), so one symbol per layer.
- ``granitemoehybrid`` (transformers ``GraniteMoeHybridConfig``; IBM Granite-4.0-H): every
  GraniteMoeHybridDecoderLayer is a Mamba-2 or attention mixer after ``input_layernorm``, then the MoE block
  (router, gated experts) plus the always-on ``shared_mlp`` after ``post_attention_layernorm``: two memform
  sublayers, ``ME`` or ``*E`` (``M-`` / ``*-`` with the shared MLP alone when num_local_experts is 0).
- ``bamba`` (transformers ``BambaConfig``; IBM Bamba): a Mamba-2 or (at ``attn_layer_indices``) attention
  mixer, then a gated MLP, per BambaDecoderLayer: ``M-`` / ``*-``.
- ``falcon_h1`` (transformers ``FalconH1Config``; TII Falcon-H1): every FalconH1DecoderLayer runs the Mamba-2
  mixer and the attention side by side after ``input_layernorm`` (mamba.mf's ``P``), then the gated MLP
  after ``pre_ff_layernorm`` (``-``): ``P-`` per layer.
- ``mamba2`` (transformers ``Mamba2Config``; state-spaces Mamba-2): every Mamba2Block is a norm and a Mamba-2
  mixer, no MLP: ``M`` per layer.
- ``mamba`` (transformers ``MambaConfig``; state-spaces Mamba): every MambaBlock is a norm and a Mamba-1 mixer
  (formulas/mamba1.mf's ``S``), no MLP: ``S`` per layer.
- ``jamba`` (transformers ``JambaConfig``; AI21 Jamba): every JambaMambaDecoderLayer / JambaAttentionDecoderLayer
  is a Mamba-1 mixer (with Jamba's dt / B / C norms) or attention after ``input_layernorm``, then a gated MLP or
  (every ``expert_layer_period`` from ``expert_layer_offset``) a MoE block after ``pre_ff_layernorm``: ``S-``,
  ``SE``, ``*-`` or ``*E`` per layer, attention every ``attn_layer_period`` from ``attn_layer_offset``.

Every field is read, listed in :data:`NEUTRAL` (or :data:`hf.NEUTRAL`) with the reason it cannot change
device memory, or refused with the reason; an unknown field is refused at the end unless ``--accept``
names it, as for every ``hf`` import.
"""

from __future__ import annotations


from ..errors import MemformError
from .draft import Draft, Fields, describe

#: the model types this module imports (hf.convert hands them over)
MODEL_TYPES = frozenset({"nemotron_h", "granitemoehybrid", "falcon_h1", "bamba", "mamba", "mamba2", "jamba",
                         "lfm2", "lfm2_moe"})

#: NemotronHConfig._list_to_pattern: the layer-type names of layers_block_type and their symbols
NEMOTRON_KINDS = {"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*",
                  "mlp": "-", "moe": "E"}

_INIT = "initialisation only"
_INFER = "inference only (generation, KV / SSM cache)"
NEUTRAL: dict[str, str] = {
    "use_mamba_kernels": "kernel choice (deprecated in transformers: chosen by what is installed; memform's "
                         "model.mamba_impl says which kernels train)",
    "mamba_hidden_act": "read: must be silu (the conv's activation, SiLU in mamba_ssm's kernels)",
    "time_step_min": _INIT, "time_step_max": _INIT, "time_step_floor": _INIT, "time_step_rank": _INIT,
    "mamba_dt_min": _INIT, "mamba_dt_max": _INIT, "mamba_dt_init_floor": _INIT, "mamba_dt_init": _INIT,
    "mamba_dt_scale": _INIT, "rescale_prenorm_residual": _INIT, "A_init_range": _INIT,
    "time_step_limit": "a clamp on dt (its input kept, as counted)", "mamba_dt_limit": "a clamp on dt",
    "mamba_ssm_cache_dtype": _INFER, "num_logits_to_keep": _INFER,
    "residual_in_fp32": "read: must be false (an fp32 residual stream is not modelled)",
    "layer_norm_epsilon": "a norm's epsilon", "rms_norm_eps": "a norm's epsilon",
    "hybrid_override_pattern": "read (model.hybrid_pattern)", "layers_block_type": "read (model.hybrid_pattern)",
    "mtp_hybrid_override_pattern": "the MTP layers' kinds (read with num_nextn_predict_layers, which must be 0)",
    "mtp_layers_block_type": "the MTP layers' kinds (read with num_nextn_predict_layers, which must be 0)",
    "expand": "NemotronH sizes d_inner as mamba_num_heads × mamba_head_dim (read); expand is not used by it",
    "mamba_expand": "NemotronH sizes d_inner as mamba_num_heads × mamba_head_dim (read)",
    "routed_scaling_factor": "a constant scale on the routed output", "n_group": "routing rule (groups)",
    "topk_group": "routing rule (groups)", "norm_topk_prob": "routing rule",
    "moe_shared_expert_overlap": "a stream-overlap switch of the shared experts (same tensors)",
    "output_router_logits": "returns router logits for the aux loss: E floats per token, not kept past the loss",
    "router_aux_loss_coef": "a loss weight",
    "sliding_window": "NemotronH has no sliding-window attention (recorded, changes no training memory)",
}


def convert(cfg: Fields, draft: Draft, given, model_type: str, hf) -> None:  # noqa: ANN001 - hf: the module
    """Fill ``draft`` from a hybrid model's config.json (``cfg``); ``hf`` is :mod:`.hf` (its shared helpers)."""
    if model_type == "nemotron_h":
        _nemotron_h(cfg, draft, given, hf)
    elif model_type == "granitemoehybrid":
        _granite(cfg, draft, given, hf)
    elif model_type == "falcon_h1":
        _falcon_h1(cfg, draft, given, hf)
    elif model_type == "bamba":
        _bamba(cfg, draft, given, hf)
    elif model_type in ("mamba", "mamba2", "jamba"):
        from .hf_mamba1 import convert as convert_ssm   # pure Mamba / Mamba-2 and Jamba (formulas/mamba1.mf)
        convert_ssm(cfg, draft, given, model_type, hf)
    elif model_type in ("lfm2", "lfm2_moe"):
        from .hf_lfm2 import convert as convert_lfm2   # LFM2 short-conv hybrids (formulas/lfm2.mf)
        convert_lfm2(cfg, draft, given, model_type, hf)
    neutral = set(hf.NEUTRAL) | set(NEUTRAL) | {k for k in cfg.data if isinstance(k, str) and k.endswith("_token_id")}
    neutral |= {k for k, v in cfg.data.items() if v is None}
    draft.refuse_unused(cfg, neutral)


def _agree(cfg: Fields, keys: tuple[str, ...], default=None, *, minimum: int = 1):  # noqa: ANN001, ANN202
    """The value of the first of ``keys`` present, every other spelling present agreeing with it
    (:meth:`Fields.alias`); ``default`` where none is present."""
    key, value = cfg.alias(keys, lambda k: cfg.integer(k, minimum=minimum))
    return (key, value) if key is not None else (None, default)


def _head_dim(cfg: Fields, draft: Draft, h: int, a: int, head_dim: int | None) -> None:
    """``model.head_dim`` where the heads are not hidden_size / heads wide; a config that leaves the width
    undetermined stops here."""
    if head_dim is not None and head_dim * a != h:
        draft.set("model.head_dim", head_dim, f"head_dim (× {a} heads = {head_dim * a}, not hidden_size {h})")
    elif head_dim is None and h % a:
        raise MemformError(f"{cfg.file}: hidden_size {h} is not a multiple of num_attention_heads {a} and there "
                           f"is no 'head_dim' field")


def _rope_bias_dropout_tying(cfg: Fields, draft: Draft) -> None:
    """The fields Falcon-H1 and Bamba spell alike: rotary positions (no parameters), one bias switch for
    attention and MLP together, attention dropout, embedding tying."""
    draft.set("model.position_embedding", "rope", "rotary: no position parameters")
    biases = {k: cfg.boolean(k, False) for k in ("attention_bias", "mlp_bias")}
    if biases["attention_bias"] != biases["mlp_bias"]:
        raise cfg.error("attention_bias", "differs from mlp_bias: memform's model.bias covers both together")
    draft.set("model.bias", biases["attention_bias"], "attention_bias / mlp_bias")
    draft.set("model.dropout", bool(cfg.number("attention_dropout", 0)), "attention_dropout")
    draft.set("model.tied_embeddings", cfg.boolean("tie_word_embeddings", False), "tie_word_embeddings")


def _pattern(cfg: Fields) -> tuple[str, str]:
    """(pattern, source field) of a NemotronH config."""
    if cfg.has("hybrid_override_pattern"):
        pattern = cfg.raw("hybrid_override_pattern")
        if not isinstance(pattern, str) or not pattern:
            raise cfg.error("hybrid_override_pattern", f"must be a string of layer symbols, got {describe(pattern)}")
        bad = sorted(set(pattern) - {"M", "*", "-", "E"})
        if bad:
            raise cfg.error("hybrid_override_pattern", f"has {', '.join(repr(c) for c in bad)}: the layer symbols "
                            f"are M (Mamba-2), * (attention), - (MLP), E (MoE) (Megatron-LM "
                            f"mamba_hybrid_layer_allocation.py Symbols)")
        return pattern, "hybrid_override_pattern"
    for key in ("layers_block_type", "layer_types"):
        if cfg.has(key):
            kinds = cfg.raw(key)
            if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
                raise cfg.error(key, f"must be a list of layer-type names, got {describe(kinds)}")
            unknown = sorted({k for k in kinds if k not in NEMOTRON_KINDS})
            if unknown:
                raise cfg.error(key, f"has {', '.join(unknown)}: NemotronH's layer types are "
                                     f"{', '.join(sorted(NEMOTRON_KINDS))}")
            return "".join(NEMOTRON_KINDS[k] for k in kinds), key
    raise cfg.missing("hybrid_override_pattern", " (or layers_block_type: the kind of every layer)")


def _nemotron_h(cfg: Fields, draft: Draft, given, hf) -> None:  # noqa: ANN001
    """transformers NemotronHConfig / modeling_nemotron_h.py."""
    pattern, source = _pattern(cfg)
    cfg.used.update(("hybrid_override_pattern", "layers_block_type", "layer_types"))
    layers = len(pattern)
    if cfg.has("num_hidden_layers") and cfg.integer("num_hidden_layers") != layers:
        raise cfg.error("num_hidden_layers", f"is {cfg.integer('num_hidden_layers')} but {source} has {layers} "
                                             f"layers: the file disagrees with itself")
    h = cfg.integer("hidden_size")
    a = cfg.integer("num_attention_heads")
    draft.set("model.hidden_size", h)
    draft.set("model.num_heads", a, "num_attention_heads")
    draft.set("model.num_kv_heads", cfg.integer("num_key_value_heads", a), "num_key_value_heads")
    draft.set("model.num_layers", layers, f"the symbols of {source}: one NemotronHBlock (norm + one mixer) each")
    draft.set("model.hybrid_pattern", pattern, f"{source} (M Mamba-2, * attention, - MLP, E MoE)")
    # older NemotronH configs (Nemotron-H-8B/47B/56B) name it attention_head_dim
    _head_dim(cfg, draft, h, a, _agree(cfg, ("head_dim", "attention_head_dim"))[1])
    draft.set("model.ffn_hidden_size", cfg.integer("intermediate_size", 21504), "intermediate_size")
    draft.set("model.vocab_size", cfg.integer("vocab_size"))
    hf._seq_length(cfg, draft, "nemotron_h", given)
    # NemotronHMLP: up_proj -> relu2 -> down_proj, no gate (ACT2FN relu2 = square(relu(x)): relu keeps its
    # output, down_proj the square's: two f-wide tensors, as a GeLU MLP keeps -- dense.mf's ungated MLP)
    act = cfg.string("mlp_hidden_act", "relu2")
    if cfg.has("hidden_act") and cfg.string("hidden_act") != act:
        raise cfg.error("hidden_act", f"is {cfg.string('hidden_act')!r} but 'mlp_hidden_act' is {act!r}: the file "
                                      f"disagrees with itself")
    cfg.used.add("hidden_act")
    if act not in ("relu2", "relu", "gelu", "gelu_pytorch_tanh"):
        raise cfg.error("mlp_hidden_act", f"is {act!r}: memform maps NemotronH's ungated MLP activations "
                                          f"(relu2, relu, gelu)")
    draft.set("model.activation", "gelu", f"mlp_hidden_act {act}: an ungated MLP (up_proj, down_proj), two f-wide "
                                          f"tensors kept, as dense.mf's GeLU MLP")
    if cfg.string("mamba_hidden_act", "silu") not in ("silu", "swish"):
        raise cfg.error("mamba_hidden_act", "is not silu: mamba_ssm's kernels apply SiLU after the conv1d")
    draft.set("model.norm", "rmsnorm", "NemotronHRMSNorm (weight only)")
    draft.set("model.norm_fp32_output", True, "NemotronHRMSNorm: weight × normalised input in fp32, cast after")
    # NemotronHAttention has no rotary or learned positions: memform's rope is its parameter-free setting
    draft.set("model.position_embedding", "rope", "NemotronHAttention: no position parameters")
    biases = {k: cfg.boolean(k, False) for k in ("attention_bias", "mlp_bias", "use_bias")}
    if biases["attention_bias"] != biases["mlp_bias"]:
        raise cfg.error("attention_bias", "differs from mlp_bias: memform's model.bias covers both together")
    draft.set("model.bias", biases["attention_bias"], "attention_bias / mlp_bias")
    draft.set("model.mamba_proj_bias", biases["use_bias"], "use_bias (NemotronHMamba2Mixer in_proj / out_proj)")
    dropout = any(cfg.number(k, 0) for k in ("attention_dropout", "hidden_dropout"))
    cfg.used.update(("attention_dropout", "hidden_dropout"))
    draft.set("model.dropout", bool(dropout), "attention_dropout / hidden_dropout")
    draft.set("model.tied_embeddings", cfg.boolean("tie_word_embeddings", False), "tie_word_embeddings")
    if cfg.boolean("residual_in_fp32", False):
        raise cfg.error("residual_in_fp32", "is true: an fp32 residual stream is not modelled")
    # the Mamba-2 mixer (NemotronHMamba2Mixer: intermediate_size = mamba_num_heads · mamba_head_dim)
    _, heads = _agree(cfg, ("mamba_num_heads", "mamba_n_heads"), 128)
    _, pdim = _agree(cfg, ("mamba_head_dim", "mamba_d_head"), 64)
    _, groups = _agree(cfg, ("n_groups", "mamba_num_groups", "mamba_n_groups"), 8)
    _, state = _agree(cfg, ("ssm_state_size", "mamba_state_dim", "mamba_d_state"), 128)
    _, kernel = _agree(cfg, ("conv_kernel", "mamba_d_conv"), 4)
    _, chunk = _agree(cfg, ("chunk_size", "mamba_chunk_size"), 128)
    draft.set("model.mamba_num_heads", heads, "mamba_num_heads")
    draft.set("model.mamba_head_dim", pdim, "mamba_head_dim")
    draft.set("model.mamba_num_groups", groups, "n_groups")
    draft.set("model.mamba_state_dim", state, "ssm_state_size")
    draft.set("model.mamba_conv_kernel", kernel, "conv_kernel")
    draft.set("model.mamba_chunk_size", chunk, "chunk_size")
    conv_bias = cfg.boolean("use_conv_bias", True) if cfg.has("use_conv_bias") else cfg.boolean("mamba_conv_bias",
                                                                                                True)
    cfg.used.update(("use_conv_bias", "mamba_conv_bias", "mamba_proj_bias"))
    if cfg.boolean("mamba_proj_bias", False) and not biases["use_bias"]:
        draft.warn("field 'mamba_proj_bias' is true but NemotronHMamba2Mixer reads use_bias for in_proj / out_proj "
                   "(false here): no projection biases counted")
    draft.set("model.mamba_conv_bias", conv_bias, "use_conv_bias")
    if heads % groups:
        raise cfg.error("n_groups", f"{groups} does not divide mamba_num_heads {heads}")
    # the MoE layers (NemotronHMoE: NemotronHTopkRouter h×E, non-gated relu2 experts, one shared NemotronHMLP)
    if "E" in pattern:
        experts = cfg.integer("n_routed_experts", 8) if cfg.has("n_routed_experts") else \
            cfg.integer("num_local_experts", 8)
        cfg.used.update(("n_routed_experts", "num_local_experts"))
        if cfg.has("moe_latent_size") and cfg.raw("moe_latent_size") is not None:
            raise cfg.error("moe_latent_size", "is set: NemotronH's latent expert projections (fc1_latent_proj, "
                                               "fc2_latent_proj) are not modelled")
        draft.set("model.num_experts", experts, "n_routed_experts")
        draft.set("model.moe_top_k", cfg.integer("num_experts_per_tok", 2), "num_experts_per_tok")
        f_exp = cfg.integer("moe_intermediate_size", 7688)
        draft.set("model.moe_ffn_hidden_size", f_exp, "moe_intermediate_size (non-gated relu2 experts)")
        shared = cfg.integer("moe_shared_expert_intermediate_size", 7688, minimum=0)
        if cfg.integer("n_shared_experts", 1, minimum=0) and shared:
            draft.set("model.num_shared_experts", -(-shared // f_exp),
                      f"moe_shared_expert_intermediate_size {shared} / expert size {f_exp}, rounded up (the width "
                      f"below sizes it)")
            draft.set("model.shared_expert_ffn_hidden_size", shared,
                      "moe_shared_expert_intermediate_size: one NemotronHMLP of this width")
        else:
            draft.set("model.num_shared_experts", 0, "no shared expert")
        draft.warn("NemotronH's router (sigmoid scores, e_score_correction_bias buffer) is sized as moe.mf's "
                   "router: its saved per-token scores are approximate")
    cfg.used.update(("n_routed_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                     "moe_shared_expert_intermediate_size", "n_shared_experts", "moe_latent_size"))
    mtp = cfg.integer("num_nextn_predict_layers", 0, minimum=0)
    if mtp:
        raise cfg.error("num_nextn_predict_layers", f"is {mtp}: NemotronH's multi-token-prediction layers "
                                                    f"(mtp_layers_block_type) are not modelled by mamba.mf")
    for key in ("num_hidden_layers", "max_position_embeddings", "head_dim", "model_type"):
        cfg.used.add(key)


#: GraniteMoeHybridConfig.layer_types names (layers_block_type spelling too) and their mixer symbol
GRANITE_KINDS = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*"}


def _granite(cfg: Fields, draft: Draft, given, hf) -> None:  # noqa: ANN001
    """transformers GraniteMoeHybridConfig / modeling_granitemoehybrid.py (IBM Granite-4.0-H)."""
    key = "layer_types" if cfg.has("layer_types") else "layers_block_type"
    kinds = cfg.raw(key)
    if not isinstance(kinds, list) or not kinds or not all(isinstance(k, str) for k in kinds):
        raise cfg.error(key, f"must be the list of layer kinds (mamba, attention), got {describe(kinds)}")
    unknown = sorted({k for k in kinds if k not in GRANITE_KINDS})
    if unknown:
        raise cfg.error(key, f"has {', '.join(unknown)}: Granite-4.0-H's layer kinds are mamba and attention")
    cfg.used.update(("layer_types", "layers_block_type"))
    layers = len(kinds)
    if cfg.has("num_hidden_layers") and cfg.integer("num_hidden_layers") != layers:
        raise cfg.error("num_hidden_layers", f"is {cfg.integer('num_hidden_layers')} but {key} has {layers} "
                                             f"entries: the file disagrees with itself")
    experts = cfg.integer("num_local_experts", 8, minimum=0)
    ffn_symbol = "E" if experts else "-"
    pattern = "".join(GRANITE_KINDS[k] + ffn_symbol for k in kinds)
    h = cfg.integer("hidden_size")
    a = cfg.integer("num_attention_heads")
    draft.set("model.hidden_size", h)
    draft.set("model.num_heads", a, "num_attention_heads")
    draft.set("model.num_kv_heads", cfg.integer("num_key_value_heads", a), "num_key_value_heads")
    draft.set("model.num_layers", 2 * layers, f"{layers} GraniteMoeHybridDecoderLayers, two sublayers each (mixer, "
                                              f"then MoE + shared MLP), each after its own norm")
    draft.set("model.hybrid_pattern", pattern, f"{key}: M Mamba-2 / * attention, each followed by {ffn_symbol}")
    draft.set("model.hybrid_ffn_paired", True, "the MoE block runs in the mixer's GraniteMoeHybridDecoderLayer "
                                               "(one checkpoint per pair)")
    if h % a:
        raise MemformError(f"{cfg.file}: hidden_size {h} is not a multiple of num_attention_heads {a}")
    shared = cfg.integer("shared_intermediate_size", 1024, minimum=0)
    draft.set("model.vocab_size", cfg.integer("vocab_size"))
    hf._seq_length(cfg, draft, "granitemoehybrid", given)
    act = cfg.string("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise cfg.error("hidden_act", f"is {act!r}: Granite-4.0-H's gated MLPs are mapped with SiLU (SwiGLU) only")
    draft.set("model.activation", "swiglu", f"hidden_act {act}: gated experts and shared MLP (input_linear h -> 2f)")
    draft.set("model.norm", "rmsnorm", "GraniteMoeHybridRMSNorm")
    draft.set("model.position_embedding", "rope", f"position_embedding_type {cfg.string('position_embedding_type', 'none')}: "
                                                  f"no position parameters")
    cfg.used.add("position_embedding_type")
    draft.set("model.bias", cfg.boolean("attention_bias", False), "attention_bias (the MLPs have none)")
    draft.set("model.dropout", bool(cfg.number("attention_dropout", 0)), "attention_dropout")
    draft.set("model.tied_embeddings", cfg.boolean("tie_word_embeddings", False), "tie_word_embeddings")
    if experts:
        draft.set("model.num_experts", experts, "num_local_experts")
        draft.set("model.moe_top_k", cfg.integer("num_experts_per_tok", 2), "num_experts_per_tok")
        f_exp = cfg.integer("intermediate_size", 11008)
        draft.set("model.moe_ffn_hidden_size", f_exp, "intermediate_size (GraniteMoeHybridExperts gate_up_proj)")
        draft.set("model.ffn_hidden_size", f_exp, "intermediate_size")
        if shared:
            draft.set("model.num_shared_experts", -(-shared // f_exp),
                      f"shared_intermediate_size {shared} / expert size {f_exp}, rounded up (the width below sizes it)")
            draft.set("model.shared_expert_ffn_hidden_size", shared, "shared_intermediate_size (shared_mlp, no gate)")
        else:
            draft.set("model.num_shared_experts", 0, "shared_intermediate_size 0")
    else:
        draft.set("model.ffn_hidden_size", shared, "shared_intermediate_size: the shared_mlp is the layer's MLP")
        cfg.used.add("intermediate_size")
    cfg.used.update(("num_local_experts", "num_experts_per_tok", "intermediate_size", "shared_intermediate_size"))
    _mamba2_ibm(cfg, draft, h)
    for key in ("num_hidden_layers", "max_position_embeddings", "model_type"):
        cfg.used.add(key)


def _mamba2_ibm(cfg: Fields, draft: Draft, h: int) -> None:
    """The Mamba-2 fields of IBM's hybrids (GraniteMoeHybridMambaLayer, BambaMixer: d_inner = mamba_expand ×
    hidden_size over mamba_n_heads heads of mamba_d_head, "auto" = d_inner / heads)."""
    heads = cfg.integer("mamba_n_heads", 128)
    expand = cfg.integer("mamba_expand", 2)
    d_inner = expand * h
    head_dim = cfg.raw("mamba_d_head", "auto")
    if head_dim in ("auto", None):
        head_dim = d_inner // heads
    else:
        head_dim = cfg.integer("mamba_d_head")
    if heads * head_dim != d_inner:
        raise cfg.error("mamba_d_head", f"× mamba_n_heads = {heads * head_dim}, not mamba_expand × hidden_size = "
                                        f"{d_inner} (GraniteMoeHybridMambaLayer sizes d_inner by the expansion)")
    cfg.used.update(("mamba_d_head", "mamba_expand"))
    groups = cfg.integer("mamba_n_groups", 1)
    draft.set("model.mamba_num_heads", heads, "mamba_n_heads")
    draft.set("model.mamba_head_dim", head_dim, "mamba_d_head")
    draft.set("model.mamba_num_groups", groups, "mamba_n_groups")
    draft.set("model.mamba_state_dim", cfg.integer("mamba_d_state", 256), "mamba_d_state")
    draft.set("model.mamba_conv_kernel", cfg.integer("mamba_d_conv", 4), "mamba_d_conv")
    draft.set("model.mamba_chunk_size", cfg.integer("mamba_chunk_size", 256), "mamba_chunk_size")
    draft.set("model.mamba_conv_bias", cfg.boolean("mamba_conv_bias", True), "mamba_conv_bias")
    draft.set("model.mamba_proj_bias", cfg.boolean("mamba_proj_bias", False), "mamba_proj_bias")
    if heads % groups:
        raise cfg.error("mamba_n_groups", f"{groups} does not divide mamba_n_heads {heads}")


_MUP = "a muP multiplier: scales a tensor (transformers FalconH1 makes a scaled copy where one is kept, counted)"
#: FalconH1Config fields that move no training memory beyond what mamba.mf's P layer counts
NEUTRAL_FALCON_H1 = {
    "lm_head_multiplier": _MUP, "embedding_multiplier": _MUP, "mlp_multipliers": _MUP, "key_multiplier": _MUP,
    "attention_out_multiplier": _MUP, "attention_in_multiplier": _MUP + " (the attention's own input copy)",
    "ssm_multipliers": _MUP + " (the mup_vector product is zxbcdt itself)",
    "ssm_in_multiplier": _MUP + " (the mixer's own input copy)", "ssm_out_multiplier": _MUP,
    "mamba_norm_before_gate": "the gated norm's order (read with mamba_rms_norm: without the norm there is none)",
    "attn_layer_indices": "null in Falcon-H1's configs (every layer has attention)",
}


def _falcon_h1(cfg: Fields, draft: Draft, given, hf) -> None:  # noqa: ANN001
    """transformers FalconH1Config / modeling_falcon_h1.py (TII Falcon-H1)."""
    cfg.used.update(NEUTRAL_FALCON_H1)
    if cfg.raw("attn_layer_indices") not in (None, []):
        raise cfg.error("attn_layer_indices", "is set: Falcon-H1 layers without attention are not mapped")
    layers = cfg.integer("num_hidden_layers")
    h = cfg.integer("hidden_size")
    a = cfg.integer("num_attention_heads")
    draft.set("model.hidden_size", h)
    draft.set("model.num_heads", a, "num_attention_heads")
    draft.set("model.num_kv_heads", cfg.integer("num_key_value_heads", a), "num_key_value_heads")
    draft.set("model.num_layers", 2 * layers, f"{layers} FalconH1DecoderLayers, two sublayers each (Mamba-2 and "
                                              f"attention side by side, then the MLP), each after its own norm")
    draft.set("model.hybrid_pattern", "P-" * layers, "FalconH1DecoderLayer: P (mamba ∥ self_attn), then - (MLP)")
    draft.set("model.hybrid_ffn_paired", True, "the MLP runs in the mixers' FalconH1DecoderLayer (one checkpoint)")
    _head_dim(cfg, draft, h, a, cfg.integer("head_dim", None))
    draft.set("model.ffn_hidden_size", cfg.integer("intermediate_size", 14336), "intermediate_size")
    draft.set("model.vocab_size", cfg.integer("vocab_size"))
    hf._seq_length(cfg, draft, "falcon_h1", given)
    act = cfg.string("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise cfg.error("hidden_act", f"is {act!r}: FalconH1's gated MLP and the conv's activation are mapped with "
                                      f"SiLU only")
    draft.set("model.activation", "swiglu", f"hidden_act {act}: FalconH1MLP gate_proj, up_proj, down_proj")
    draft.set("model.norm", "rmsnorm", "FalconH1RMSNorm")
    _rope_bias_dropout_tying(cfg, draft)
    heads = cfg.integer("mamba_n_heads", 128)
    d_ssm = cfg.integer("mamba_d_ssm", None)
    d_inner = d_ssm if d_ssm is not None else cfg.integer("mamba_expand", 2) * h
    cfg.used.update(("mamba_d_ssm", "mamba_expand"))
    if d_inner % heads:
        raise cfg.error("mamba_n_heads", f"{heads} does not divide the mixer's width {d_inner} (mamba_d_ssm)")
    pdim = cfg.raw("mamba_d_head", "auto")
    if pdim not in ("auto", None) and cfg.integer("mamba_d_head") * heads != d_inner:
        raise cfg.error("mamba_d_head", f"× mamba_n_heads is not mamba_d_ssm {d_inner}")
    cfg.used.add("mamba_d_head")
    groups = cfg.integer("mamba_n_groups", 1)
    if heads % groups:
        raise cfg.error("mamba_n_groups", f"{groups} does not divide mamba_n_heads {heads}")
    draft.set("model.mamba_num_heads", heads, "mamba_n_heads")
    draft.set("model.mamba_head_dim", d_inner // heads, f"mamba_d_ssm {d_inner} / mamba_n_heads {heads}")
    draft.set("model.mamba_num_groups", groups, "mamba_n_groups")
    draft.set("model.mamba_state_dim", cfg.integer("mamba_d_state", 256), "mamba_d_state")
    draft.set("model.mamba_conv_kernel", cfg.integer("mamba_d_conv", 4), "mamba_d_conv")
    draft.set("model.mamba_chunk_size", cfg.integer("mamba_chunk_size", 256), "mamba_chunk_size")
    draft.set("model.mamba_conv_bias", cfg.boolean("mamba_conv_bias", True), "mamba_conv_bias")
    draft.set("model.mamba_proj_bias", cfg.boolean("mamba_proj_bias", False), "mamba_proj_bias (in_proj)")
    draft.set("model.mamba_out_proj_bias", cfg.boolean("projectors_bias", False), "projectors_bias (out_proj)")
    draft.set("model.mamba_gated_norm", cfg.boolean("mamba_rms_norm", False), "mamba_rms_norm")
    draft.set("model.mamba_mup_vector", True, "FalconH1Mixer: in_proj's output × mup_vector (an fp32 buffer)")
    for key in ("num_hidden_layers", "max_position_embeddings", "model_type", "head_dim"):
        cfg.used.add(key)


def _bamba(cfg: Fields, draft: Draft, given, hf) -> None:  # noqa: ANN001
    """transformers BambaConfig / modeling_bamba.py (IBM Bamba): BambaDecoderLayer = input_layernorm, a BambaMixer
    or (layer index in attn_layer_indices) BambaAttention, then pre_ff_layernorm and a gated BambaMLP."""
    layers = cfg.integer("num_hidden_layers")
    attn = cfg.raw("attn_layer_indices") or []
    if not isinstance(attn, list) or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers
                                         for i in attn):
        raise cfg.error("attn_layer_indices", f"must list layer indices below num_hidden_layers {layers}")
    cfg.used.add("attn_layer_indices")
    if cfg.number("z_loss_coefficient", 0):
        raise cfg.error("z_loss_coefficient", "is set: the z-loss's logsumexp over the logits is not modelled")
    cfg.used.add("z_loss_coefficient")
    h = cfg.integer("hidden_size")
    a = cfg.integer("num_attention_heads")
    if h % a:
        raise MemformError(f"{cfg.file}: hidden_size {h} is not a multiple of num_attention_heads {a}")
    draft.set("model.hidden_size", h)
    draft.set("model.num_heads", a, "num_attention_heads")
    draft.set("model.num_kv_heads", cfg.integer("num_key_value_heads", a), "num_key_value_heads")
    draft.set("model.num_layers", 2 * layers, f"{layers} BambaDecoderLayers, two sublayers each (mixer, then MLP)")
    draft.set("model.hybrid_pattern", "".join(("*" if i in attn else "M") + "-" for i in range(layers)),
              "attn_layer_indices: * there, M elsewhere, each followed by its MLP (-)")
    draft.set("model.hybrid_ffn_paired", True, "the MLP runs in the mixer's BambaDecoderLayer (one checkpoint)")
    draft.set("model.ffn_hidden_size", cfg.integer("intermediate_size", 14336), "intermediate_size")
    draft.set("model.vocab_size", cfg.integer("vocab_size"))
    hf._seq_length(cfg, draft, "bamba", given)
    act = cfg.string("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise cfg.error("hidden_act", f"is {act!r}: Bamba's gated MLP is mapped with SiLU only")
    draft.set("model.activation", "swiglu", f"hidden_act {act}: BambaMLP gate_proj, up_proj, down_proj")
    draft.set("model.norm", "rmsnorm", "BambaRMSNorm")
    _rope_bias_dropout_tying(cfg, draft)
    _mamba2_ibm(cfg, draft, h)
    for key in ("max_position_embeddings", "model_type"):
        cfg.used.add(key)
