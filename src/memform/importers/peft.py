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
from .draft import Draft, Fields, describe, read_json

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
#: fields that cannot change training memory, each with the reason; every other field is read (r,
#: target_modules, lora_dropout), checked against MUST_BE, or refused at the end of the import unless
#: ``--accept`` names it (Draft.refuse_unused)
_INIT = "how the adapters are initialised (same tensors)"
NEUTRAL: dict[str, str] = {
    "peft_type": "read: LORA only", "task_type": "the model head PEFT wraps (a causal LM's own head)",
    "base_model_name_or_path": "provenance", "revision": "provenance", "peft_version": "provenance",
    "auto_mapping": "provenance (the PEFT class that saved it)",
    "inference_mode": "true in saved adapters; training sets it false (memform sizes training)",
    "lora_alpha": "a scale on the adapter output (alpha / r): multiplies, no tensor",
    "alpha_pattern": "per-module alpha scales: multiply, no tensor",
    "use_rslora": "the scale alpha / sqrt(r) instead of alpha / r: no tensor",
    "init_lora_weights": _INIT, "loftq_config": _INIT, "eva_config": _INIT, "corda_config": _INIT,
    "lora_ga_config": _INIT,
    "fan_in_fan_out": "weight layout of GPT-2's Conv1D (the adapter shapes are the same)",
    "runtime_config": "runtime switches not saved with the model (ephemeral GPU offload)",
    "layers_pattern": "the name of the layer list; only used with layers_to_transform (must be empty)",
    "megatron_config": "Megatron-Core LoRA layers: the same A and B matrices",
    "megatron_core": "the Megatron-Core module name (see megatron_config)",
    "ensure_weight_tying": "ties adapters on tied embeddings (no adapters on embeddings are sized)",
    "alora_invocation_tokens": "activated-LoRA token ids (no tensor)",
    "qalora_group_size": "used only with use_qalora (must be false)",
    "arrow_config": "Arrow routing between several adapters: null for one LoRA adapter",
}
#: fields that, set to anything but these values, train something the lora keys do not describe
MUST_BE: dict[str, tuple[object, ...]] = {
    "bias": ("none", None), "modules_to_save": (None, []), "rank_pattern": ({}, None),
    "layers_to_transform": (None, []), "lora_bias": (False, None), "trainable_token_indices": (None, {}, []),
    "target_parameters": (None, []), "layer_replication": (None, []), "use_qalora": (False, None),
    "use_bdlora": (None, False), "kasa_config": (None,), "monteclora_config": (None,), "velora_config": (None,),
    # LoraConfig.exclude_modules: modules left out of target_modules -- fewer adapters than memform would count
    "exclude_modules": (None, [], ""),
    # several adapters routed per token (peft/tuners/lora/arrow.py): more adapters than one
    "arrow_config": (None,),
}


def convert(path: Path, draft: Draft) -> None:
    """Set ``draft``'s ``lora.*`` keys from the adapter_config.json at ``path``."""
    cfg = Fields(read_json(path, "adapter_config.json"), path)
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
    draft.set("lora.dropout", float(cfg.number("lora_dropout", 0.0)), "lora_dropout")
    if cfg.boolean("use_dora", False):       # null / false: plain LoRA (the key's default)
        draft.set("lora.dora", True, "use_dora")
    on = _targets(cfg)
    for key in TARGETS:
        draft.set(f"lora.{key}", key in on, "target_modules")
    draft.refuse_unused(cfg, NEUTRAL)


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
