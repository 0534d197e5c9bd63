"""Heterogeneous decoders of Hugging Face ``config.json`` files: DeciLM / Llama-Nemotron (NAS) layers.

Two families describe a different decoder layer per layer, which ``formulas/nas.mf`` models with
per-layer lists (its keys ``model.layer_attention``, ``model.layer_ffn``, ``model.layer_kv_heads``,
``model.layer_ffn_hidden_size``):

- ``nemotron-nas`` (NVIDIA Llama-3.x-Nemotron Super / Ultra / 51B, ``DeciLMForCausalLM``): ``block_configs``,
  one entry per layer, ``attention`` {``no_op``, ``replace_with_linear``, ``n_heads_in_group``} and
  ``ffn`` {``no_op``, ``replace_with_linear``, ``ffn_mult``} (Megatron-LM
  megatron/core/transformer/heterogeneous/heterogeneous_config.py reads the same file:
  ``num_query_groups = num_attention_heads // n_heads_in_group`` and ``ffn_mult_to_intermediate_size``);
- ``deci`` (Deci/DeciLM-7B): ``num_key_value_heads_per_layer``, one K/V head count per layer (variable
  grouped-query attention, as vLLM's DeciLM executor describes it).

:func:`convert` is called by :mod:`.hf` after the uniform fields are read; it replaces the uniform
``model.num_kv_heads`` / ``model.ffn_hidden_size`` (null in a DeciLM config) by the most common per-layer
value and writes the lists. A block field memform does not model (sparsified weights, sink tokens) stops the
import naming ``block_configs[i].attention.FIELD``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .draft import Draft, Fields

#: model types whose config.json this module reads (besides any config with the fields below)
MODEL_TYPES = frozenset({"nemotron-nas", "deci"})
#: the fields it reads
FIELDS = ("block_configs", "num_key_value_heads_per_layer")

#: block_configs[i].attention fields: what each may be for memform to size the layer (None: read)
_ATTN_NEUTRAL = {
    # DeciLM's attention variants for inference (sink tokens, sparsity, prefill windows): the released
    # Nemotron files set them null / false; any other value is a tensor or a mask memform does not count
    "num_sink_tokens": (None,), "sparsify": (None,), "unshifted_sink": (False, None),
    "use_prefill_window_in_sink_attention": (False, None),
}
_FFN_NEUTRAL = {"sparsify": (None,)}
#: nas.mf's per-layer kind characters
_CHAR = {"attention": "A", "mlp": "M", "linear": "L", "no_op": "-"}


def ffn_mult_to_intermediate_size(ffn_mult: float, hidden: int) -> int:
    """DeciLM's MLP width of a layer: ``int(2 · ffn_mult · hidden / 3)`` rounded up to a multiple of 256
    (NVIDIA-NeMo/Automodel nemo_automodel/components/models/decilm/layers.py
    ``_ffn_mult_to_intermediate_size``; Megatron-LM heterogeneous_config.py
    ``MLPConfig.ffn_mult_to_intermediate_size``; the same float arithmetic, so the same integer)."""
    size = int(2 * ffn_mult * hidden / 3)
    return size if size % 256 == 0 else size + 256 - size % 256


def handles(cfg: Fields, model_type: str) -> bool:
    return model_type in MODEL_TYPES or any(cfg.has(k) for k in FIELDS)


def convert(cfg: Fields, draft: Draft, model_type: str) -> None:
    """Write nas.mf's per-layer keys from ``block_configs`` / ``num_key_value_heads_per_layer``."""
    if not handles(cfg, model_type):
        return
    h = cfg.integer("hidden_size")
    a = cfg.integer("num_attention_heads")
    layers = draft.get("model.num_layers")
    if cfg.has("block_configs"):
        if cfg.has("num_key_value_heads_per_layer"):
            raise cfg.error("num_key_value_heads_per_layer", "and 'block_configs' both give per-layer K/V heads: "
                                                               "the file is ambiguous")
        attn, kv, ffn, width = _blocks(cfg, h, a, layers)
    elif cfg.has("num_key_value_heads_per_layer"):
        kv = _kv_list(cfg, a, layers)
        attn, ffn, width = ["attention"] * layers, ["mlp"] * layers, [0] * layers
    else:
        raise cfg.missing("block_configs", f" (model_type {model_type!r} describes its layers there)")
    kv_used = [k for k, kind in zip(kv, attn) if kind == "attention"]
    f_used = [f for f, kind in zip(width, ffn) if kind == "mlp" and f > 0]
    if kv_used:
        common = Counter(kv_used).most_common(1)[0][0]
        draft.set("model.num_kv_heads", common, "the most common per-layer K/V head count (each layer's: "
                                                "model.layer_kv_heads)")
    if f_used:
        common = Counter(f_used).most_common(1)[0][0]
        draft.set("model.ffn_hidden_size", common, "the most common per-layer MLP width (each layer's: "
                                                   "model.layer_ffn_hidden_size)")
    # nas.mf's one-character kinds, one per layer (A attention / M MLP, L linear, - no-op)
    if any(k != "attention" for k in attn):
        n = Counter(attn)
        draft.set("model.layer_attention", "".join(_CHAR[k] for k in attn),
                  f"block_configs attention: {n['attention']} grouped-query (A), {n['linear']} replace_with_linear "
                  f"(L), {n['no_op']} no_op (-)")
    if any(k != "mlp" for k in ffn):
        n = Counter(ffn)
        draft.set("model.layer_ffn", "".join(_CHAR[k] for k in ffn),
                  f"block_configs ffn: {n['mlp']} MLP (M), {n['linear']} replace_with_linear (L), {n['no_op']} "
                  f"no_op (-)")
    if len(set(kv_used)) > 1:
        src = "block_configs n_heads_in_group" if cfg.has("block_configs") else "num_key_value_heads_per_layer"
        draft.set("model.layer_kv_heads", kv, f"{src} (num_attention_heads / n_heads_in_group; 0: no attention)"
                  if cfg.has("block_configs") else src)
    if len(set(f_used)) > 1:
        draft.set("model.layer_ffn_hidden_size", width, "block_configs ffn_mult as DeciLM's "
                                                        "_ffn_mult_to_intermediate_size rounds it (0: no MLP)")


def _kv_list(cfg: Fields, a: int, layers: int) -> list[int]:
    key = "num_key_value_heads_per_layer"
    value = cfg.raw(key)
    if not isinstance(value, list) or len(value) != layers or \
            not all(isinstance(k, int) and not isinstance(k, bool) and k > 0 for k in value):
        raise cfg.error(key, f"must be a list of {layers} positive integers (one per layer, num_hidden_layers), "
                             f"got {value!r}")
    bad = [k for k in value if a % k]
    if bad:
        raise cfg.error(key, f"has {bad[0]} K/V heads, which does not divide num_attention_heads {a}")
    return list(value)


def _blocks(cfg: Fields, h: int, a: int, layers: int) -> tuple[list[str], list[int], list[str], list[int]]:
    blocks = cfg.raw("block_configs")
    if not isinstance(blocks, list) or len(blocks) != layers:
        raise cfg.error("block_configs", f"must be a list of {layers} blocks (one per layer, num_hidden_layers), "
                                         f"got {_what(blocks)}")
    attn, kv, ffn, width = [], [], [], []
    for i, block in enumerate(blocks):
        where = f"block_configs[{i}]"
        if not isinstance(block, dict) or set(block) - {"attention", "ffn"}:
            extra = sorted(set(block) - {"attention", "ffn"}) if isinstance(block, dict) else []
            raise cfg.error(where, f"must hold 'attention' and 'ffn' only"
                                   + (f"; {', '.join(map(repr, extra))} describes a layer memform does not model"
                                      if extra else f", got {_what(block)}"))
        at = _part(cfg, block, where, "attention", _ATTN_NEUTRAL, ("no_op", "replace_with_linear",
                                                                    "n_heads_in_group", "window_length"))
        kind = _kind(cfg, at, f"{where}.attention")
        attn.append("attention" if kind == "full" else kind)
        if kind == "full":
            group = at.get("n_heads_in_group")
            if not isinstance(group, int) or isinstance(group, bool) or group < 1 or a % group:
                raise cfg.error(f"{where}.attention.n_heads_in_group", f"is {group!r}: a grouped-query attention "
                                f"block needs a positive divisor of num_attention_heads {a}")
            kv.append(a // group)
        else:
            kv.append(0)
        ff = _part(cfg, block, where, "ffn", _FFN_NEUTRAL, ("no_op", "replace_with_linear", "ffn_mult"))
        kind = _kind(cfg, ff, f"{where}.ffn")
        ffn.append("mlp" if kind == "full" else kind)
        if kind == "full":
            mult = ff.get("ffn_mult")
            if not isinstance(mult, (int, float)) or isinstance(mult, bool) or mult <= 0:
                raise cfg.error(f"{where}.ffn.ffn_mult", f"is {mult!r}: an MLP block needs a positive ffn_mult")
            width.append(ffn_mult_to_intermediate_size(mult, h))
        else:
            width.append(0)
    return attn, kv, ffn, width


def _part(cfg: Fields, block: dict, where: str, part: str, neutral: dict, read: tuple[str, ...]) -> dict:
    value = block.get(part)
    if not isinstance(value, dict):
        raise cfg.error(f"{where}.{part}", f"must be an object, got {_what(value)}")
    for key, v in value.items():
        if key in read:
            continue
        if key not in neutral:
            raise cfg.error(f"{where}.{part}.{key}", f"is {v!r}: a block field memform does not know (it reads "
                            f"{', '.join(read)}); the layer it describes cannot be sized")
        if v not in neutral[key]:
            raise cfg.error(f"{where}.{part}.{key}", f"is {v!r}: memform sizes DeciLM blocks with "
                            f"{key} {' / '.join(map(repr, neutral[key]))} only (an inference-time variant whose "
                            f"tensors it does not count)")
    return value


def _kind(cfg: Fields, part: dict, where: str) -> str:
    no_op, linear = part.get("no_op") or False, part.get("replace_with_linear") or False
    for key, v in (("no_op", no_op), ("replace_with_linear", linear)):
        if not isinstance(v, bool):
            raise cfg.error(f"{where}.{key}", f"must be true or false, got {v!r}")
    if no_op and linear:
        raise cfg.error(where, "sets both no_op and replace_with_linear: the file is ambiguous")
    return "no_op" if no_op else ("linear" if linear else "full")


def _what(value: Any) -> str:
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return type(value).__name__ if value is not None else "null"

