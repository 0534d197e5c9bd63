"""Hugging Face ``config.json`` of Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5) → the keys of ``deltanet.mf``.

Called from :mod:`memform.importers.hf` for the model types below; ``hf`` reads the shared fields (hidden size,
heads, MoE, ...), this module the linear-attention ones. Field names and defaults are transformers'
``Qwen3NextConfig`` / ``Qwen3_5TextConfig`` (configuration_qwen3_next.py, configuration_qwen3_5.py):
``linear_num_key_heads`` 16, ``linear_num_value_heads`` 32, ``linear_key_head_dim`` / ``linear_value_head_dim``
128, ``linear_conv_kernel_dim`` 4; ``layer_types`` (``linear_attention`` / ``full_attention``), else
``full_attention_interval`` (default 4: layer i is full attention when (i + 1) % 4 == 0), written as
``model.full_attention_interval`` where the pattern is that rule, else as ``model.linear_attention_pattern``
(one letter per layer: G Gated DeltaNet, * softmax attention). The full-attention
layers of these classes always have the output gate (Qwen3NextAttention: q_proj 2 · heads · head_dim) and
per-head q/k RMSNorms.
"""

from __future__ import annotations

from .draft import Draft, Fields, describe

#: model types whose decoder layers are Gated DeltaNet or gated attention (transformers Qwen3NextDecoderLayer,
#: Qwen3_5DecoderLayer, Qwen3_5MoeDecoderLayer)
MODEL_TYPES = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"})
#: the config fields this module reads (hf.py lets them through its refusals for MODEL_TYPES)
FIELDS = frozenset({"linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                    "linear_conv_kernel_dim", "full_attention_interval", "layer_types", "attn_output_gate"})
#: the layer kinds of ``layer_types`` read here
LAYER_KINDS = frozenset({"linear_attention", "full_attention"})
#: transformers' defaults (Qwen3NextConfig / Qwen3_5TextConfig class attributes)
DEFAULTS = {"linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}
KEYS = {"linear_num_key_heads": "model.linear_num_key_heads", "linear_num_value_heads": "model.linear_num_value_heads",
        "linear_key_head_dim": "model.linear_key_head_dim", "linear_value_head_dim": "model.linear_value_head_dim",
        "linear_conv_kernel_dim": "model.linear_conv_kernel_dim"}
#: memory-neutral fields of these configs, with the reason
NEUTRAL = {
    "mamba_ssm_dtype": "the dtype of the inference-time recurrent state cache (no training tensor)",
    "mtp_use_dedicated_embeddings": "read with mtp_num_hidden_layers (must be false)",
    "mtp_num_hidden_layers": "read (model.mtp_layers)",
}


def claimed(model_type: str) -> frozenset[str]:
    """The fields (and ``layer_types`` kinds) hf.py must not refuse for ``model_type``."""
    return FIELDS | LAYER_KINDS if model_type in MODEL_TYPES else frozenset()


def convert(cfg: Fields, draft: Draft, model_type: str) -> None:
    """Set deltanet.mf's keys from the linear-attention fields of ``cfg`` (a Qwen3-Next / Qwen3.5 text config)."""
    if model_type not in MODEL_TYPES:
        return
    layers = draft.get("model.num_layers")
    pattern = _pattern(cfg, layers)
    cfg.used.update(FIELDS | set(NEUTRAL))
    if cfg.has("attn_output_gate") and cfg.raw("attn_output_gate") is False:
        raise cfg.error("attn_output_gate", f"is false, but transformers' {model_type} attention always has the "
                                            f"output gate (q_proj twice as wide); a config that disagrees is not "
                                            f"mapped")
    draft.set("model.attention_output_gate", True,
              f"{model_type}: q_proj 2 · heads · head_dim, o_proj(attn · sigmoid(gate)) (attn_output_gate)")
    draft.set("model.qk_norm", True, f"{model_type}: q_norm / k_norm = RMSNorm(head_dim)")
    # Qwen3.5's released text configs name the checkpoint's MTP modules (mtp.* tensors, which transformers'
    # classes do not build -- as DeepSeek's num_nextn_predict_layers, counted): Qwen3-Next's layout, the
    # shared embedding and head, fc 2h -> h, three norms and one gated-attention decoder layer, which is
    # moe.mf's mtp block (Qwen3-Next-80B's 1,650,471,424 MTP parameters to the parameter, test_arch_deltanet)
    mtp = cfg.integer("mtp_num_hidden_layers", 0, minimum=0)
    if mtp:
        if cfg.raw("mtp_use_dedicated_embeddings", False) is not False:
            raise cfg.error("mtp_use_dedicated_embeddings", "is set: MTP modules with their own embedding table are "
                                                            "not modelled (moe.mf's share the model's)")
        draft.set("model.mtp_layers", mtp, "mtp_num_hidden_layers: the checkpoint's MTP module(s) (not built by "
                                           "transformers; counted as DeepSeek's num_nextn_predict_layers are)")
    if not any(pattern):
        return  # every layer softmax attention (gated): no Gated DeltaNet keys
    for field, key in KEYS.items():
        value = cfg.integer(field, DEFAULTS[field])
        draft.set(key, value, field if cfg.has(field) else f"{field} absent: {model_type}'s default {value}")
    hv, hk = draft.get("model.linear_num_value_heads"), draft.get("model.linear_num_key_heads")
    if hv % hk:
        raise cfg.error("linear_num_value_heads", f"is {hv}, not a multiple of linear_num_key_heads {hk}: each "
                                                  f"key head serves linear_num_value_heads / linear_num_key_heads "
                                                  f"value heads")
    interval = _interval(pattern)
    if interval:
        draft.set("model.full_attention_interval", interval,
                  "full_attention_interval" if not cfg.has("layer_types") else
                  f"layer_types: every {interval}th layer full_attention")
    else:
        draft.set("model.linear_attention_pattern", "".join("G" if k else "*" for k in pattern),
                  "layer_types: G = linear_attention (Gated DeltaNet), * = full_attention")


def _pattern(cfg: Fields, layers: int) -> list[int]:
    """1 per Gated DeltaNet layer, 0 per full-attention layer (Qwen3NextConfig.__post_init__)."""
    kinds = cfg.raw("layer_types", None)
    if kinds is not None:
        if not isinstance(kinds, list) or any(k not in LAYER_KINDS for k in kinds):
            raise cfg.error("layer_types", f"must list 'linear_attention' / 'full_attention' per layer, got "
                                           f"{describe(kinds)}")
        if len(kinds) != layers:
            raise cfg.error("layer_types", f"has {len(kinds)} entries for {layers} layers (num_hidden_layers)")
        return [1 if k == "linear_attention" else 0 for k in kinds]
    interval = cfg.integer("full_attention_interval", 4)
    return [1 if (i + 1) % interval else 0 for i in range(layers)]


def _interval(pattern: list[int]) -> int:
    """N when the pattern is Qwen3-Next's full_attention_interval rule ((i + 1) % N == 0 full attention)."""
    for n in range(2, len(pattern) + 1):
        if pattern == [1 if (i + 1) % n else 0 for i in range(len(pattern))]:
            return n
    return 0
