"""A Hugging Face ``quantization_config`` (``config.json`` of a quantized checkpoint, or the
``BitsAndBytesConfig`` a fine-tuning script passes to ``from_pretrained``) → the ``lora.base_quant`` keys
(formulas/finetune.mf): QLoRA's 4-bit base (Dettmers et al. 2023 §3; transformers
``BitsAndBytesConfig``: load_in_4bit, bnb_4bit_quant_type, bnb_4bit_use_double_quant,
bnb_4bit_compute_dtype). Other storage formats are warned about, as before: memform sizes their training
with the profile's parameter dtype.
"""

from __future__ import annotations

from typing import Any

from .draft import Draft, Fields

#: BitsAndBytesConfig bnb_4bit_compute_dtype spellings (torch dtype names) -> memform dtypes
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "torch.bfloat16": "bf16",
           "torch.float16": "fp16", "torch.float32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}


def convert(cfg: Fields, draft: Draft, key: str = "quantization_config") -> None:
    """Set ``lora.base_quant`` and its keys from ``cfg[key]`` where it is a bitsandbytes 4-bit config."""
    quant: Any = cfg.raw(key, None)
    if not isinstance(quant, dict) or not quant.get("quant_method"):
        return
    q = Fields(quant, cfg.file, f"{cfg.where}{key}.")
    four_bit = q.raw("load_in_4bit", q.raw("_load_in_4bit", False))
    if q.raw("quant_method") != "bitsandbytes" or four_bit is not True:
        draft.warn(f"field '{key}': the checkpoint is stored as {quant.get('quant_method')}"
                   f"{' (8-bit)' if q.raw('load_in_8bit') else ''}; memform sizes training with the profile's "
                   f"parameter dtype (its scales are not counted)")
        return
    kind = q.string("bnb_4bit_quant_type", "fp4")          # BitsAndBytesConfig's default: fp4
    if kind not in ("nf4", "fp4"):
        raise q.error("bnb_4bit_quant_type", f"is {kind!r}: bitsandbytes 4-bit types are nf4 and fp4")
    draft.set("lora.base_quant", kind, f"{key}.load_in_4bit, bnb_4bit_quant_type")
    dq = q.raw("bnb_4bit_use_double_quant", False)
    if not isinstance(dq, bool):
        raise q.error("bnb_4bit_use_double_quant", f"must be true or false, got {dq!r}")
    draft.set("lora.double_quant", dq, "bnb_4bit_use_double_quant")
    storage = q.raw("bnb_4bit_quant_storage", "uint8")
    if storage not in ("uint8", "torch.uint8", None):
        raise q.error("bnb_4bit_quant_storage", f"is {storage!r}: memform sizes the 4-bit codes packed in uint8 "
                                                "(FSDP's bf16 storage is not modelled)")
    compute = q.raw("bnb_4bit_compute_dtype", None)
    if compute is not None:
        if str(compute) not in _DTYPES:
            raise q.error("bnb_4bit_compute_dtype", f"is {compute!r}: expected bfloat16, float16 or float32")
        draft.set("lora.compute_dtype", _DTYPES[str(compute)], "bnb_4bit_compute_dtype")
    skip = q.raw("llm_int8_skip_modules", None)
    if skip not in (None, [], ["lm_head"]):
        draft.warn(f"field '{key}.llm_int8_skip_modules' = {skip}: memform quantizes every decoder projection "
                   f"(modules left in 16 bits are not modelled)")
