"""PEFT's ``adapter_config.json`` → the ``lora:`` keys of a memform config (``memform import hf --adapter``).

PEFT writes the file next to the adapter weights (``LoraConfig.save_pretrained``; peft/tuners/lora/config.py
names the fields). What sizes training memory is the rank ``r``, the projections the adapters sit on
(``target_modules``) and ``lora_dropout`` (formulas/common.mf, dense.mf). Anything that would train more
than the LoRA adapters -- DoRA's magnitude vectors, trained biases, ``modules_to_save``, per-module ranks --
or put them on other modules than memform's seven projections stops the import with the field: an adapter
memform would size wrongly is refused, never warned past.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import MemformError
from .draft import Draft, Fields, describe

#: memform's LoRA keys (formulas/common.mf), each with the module names that mean it: transformers'
#: Llama / Mistral / Qwen / Gemma (q_proj ...), Mixtral's experts (w1 gate, w3 up, w2 down), GPT-NeoX /
#: Falcon (dense_h_to_4h, dense_4h_to_h), OPT / Phi (fc1, fc2, out_proj)
TARGETS: dict[str, tuple[str, ...]] = {
    "q_proj": ("q_proj", "query"),
    "k_proj": ("k_proj", "key"),
    "v_proj": ("v_proj", "value"),
    "o_proj": ("o_proj", "out_proj"),
    "gate_proj": ("gate_proj", "w1"),
    "up_proj": ("up_proj", "w3", "fc1", "dense_h_to_4h"),
    "down_proj": ("down_proj", "w2", "fc2", "dense_4h_to_h"),
}
#: fields that do not change training memory
IGNORED = frozenset({
    "peft_type", "task_type", "base_model_name_or_path", "revision", "inference_mode", "lora_alpha",
    "use_rslora", "init_lora_weights", "fan_in_fan_out", "auto_mapping", "alpha_pattern", "peft_version",
    "target_modules", "r", "lora_dropout", "modules_to_save", "use_dora", "bias", "rank_pattern",
    "layers_to_transform", "layers_pattern", "exclude_modules", "lora_bias", "megatron_config",
    "megatron_core", "loftq_config", "eva_config", "corda_config", "runtime_config", "layer_replication",
    "trainable_token_indices", "target_parameters", "use_qalora", "qalora_group_size", "arrow_config",
    "ensure_weight_tying", "alora_invocation_tokens", "kasa_config", "lora_ga_config", "monteclora_config",
    "use_bdlora", "velora_config",
})
#: fields that, set to anything but these values, train something the lora keys do not describe
MUST_BE: dict[str, tuple[object, ...]] = {
    "use_dora": (False, None), "bias": ("none", None), "modules_to_save": (None, []), "rank_pattern": ({}, None),
    "layers_to_transform": (None, []), "lora_bias": (False, None), "trainable_token_indices": (None, {}, []),
    "target_parameters": (None, []), "layer_replication": (None, []), "use_qalora": (False, None),
    "use_bdlora": (None, False), "kasa_config": (None,), "monteclora_config": (None,), "velora_config": (None,),
}


def convert(path: Path, draft: Draft, read_json) -> None:  # noqa: ANN001 - hf.read_json
    """Set ``draft``'s ``lora.*`` keys from the adapter_config.json at ``path``."""
    cfg = Fields(read_json(path), path)
    kind = cfg.string("peft_type", "LORA")
    if kind.upper() != "LORA":
        raise cfg.error("peft_type", f"is {kind!r}: memform sizes LoRA adapters only (peft_type LORA)")
    for key, allowed in MUST_BE.items():
        value = cfg.raw(key)
        if value not in allowed:
            raise cfg.error(key, f"is {json.dumps(value)}: it trains more than the LoRA adapters memform sizes "
                                 f"(allowed: {', '.join(json.dumps(a) for a in allowed)})")
    r = cfg.integer("r", minimum=1)
    draft.set("lora.rank", r, f"r ({path.name})")
    draft.set("lora.dropout", float(cfg.raw("lora_dropout", 0.0) or 0.0), "lora_dropout")
    on = _targets(cfg)
    for key in TARGETS:
        draft.set(f"lora.{key}", key in on, "target_modules")
    draft.warn_unused(cfg, IGNORED)


def _targets(cfg: Fields) -> set[str]:
    """memform's target keys named by ``target_modules`` (a list, "all-linear", or a module name)."""
    value = cfg.raw("target_modules")
    if value is None:
        raise cfg.missing("target_modules", " (PEFT's per-model default is not read: name the modules)")
    if isinstance(value, str):
        if value == "all-linear":        # PEFT: every Linear but the output head
            return set(TARGETS)
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise cfg.error("target_modules", f"must be a list of module names or 'all-linear', got {describe(value)}")
    on: set[str] = set()
    for name in value:
        keys = [k for k, names in TARGETS.items() if name.split(".")[-1] in names]
        if not keys:
            known = sorted({n for names in TARGETS.values() for n in names})
            raise MemformError(f"{cfg.file}: target_modules names {name!r}, a module memform has no adapter key for "
                               f"(it sizes adapters on {', '.join(known)}; a fused QKV projection such as "
                               f"c_attn or query_key_value is not modelled)")
        on.update(keys)
    return on
