"""Megatron-LM arguments of Gated DeltaNet hybrids → the keys of ``deltanet.mf`` (called from
:mod:`memform.importers.megatron`).

Megatron-Core builds Gated DeltaNet layers with ``--experimental-attention-variant gated_delta_net``
(megatron/core/ssm/gated_delta_net.py); ``--linear-attention-freq`` says which layers
(``get_linear_attention_pattern`` in models/gpt/experimental_attention_variant_module_specs.py: an int N makes
layer i softmax attention when ``(i + 1) % N == 0``, the others linear -- Qwen3-Next's full_attention_interval --;
a Python list expression of 0/1 gives one entry per layer, 1 = linear); ``--linear-num-key-heads``,
``--linear-num-value-heads``, ``--linear-key-head-dim``, ``--linear-value-head-dim``,
``--linear-conv-kernel-dim`` the shape; ``--attention-output-gate`` the sigmoid gate of the softmax-attention
layers (q projection twice as wide).
"""

from __future__ import annotations

import re

from .draft import Draft, Fields
from .shell import list_expression

#: the shape arguments and the deltanet.mf keys they set (Megatron-LM arguments.py: all required with the variant
#: here, since memform does not restate TransformerConfig's defaults)
SHAPE = {"linear-num-key-heads": "model.linear_num_key_heads", "linear-num-value-heads": "model.linear_num_value_heads",
         "linear-key-head-dim": "model.linear_key_head_dim", "linear-value-head-dim": "model.linear_value_head_dim",
         "linear-conv-kernel-dim": "model.linear_conv_kernel_dim"}
ARGS = ("experimental-attention-variant", "linear-attention-freq", "attention-output-gate", *SHAPE)


def convert(f: Fields, draft: Draft, layers: int) -> None:
    """Set deltanet.mf's keys from the Gated DeltaNet arguments of ``f``."""
    f.used.update(ARGS)
    if f.boolean("attention-output-gate", False):
        draft.set("model.attention_output_gate", True, "--attention-output-gate: o_proj(attn · sigmoid(gate)), "
                                                       "the gate projected with the queries")
    variant = f.string("experimental-attention-variant", None)
    if variant is None:
        return
    if variant != "gated_delta_net":
        raise f.error("experimental-attention-variant", f"is {variant!r}: memform models gated_delta_net (Gated "
                                                        f"DeltaNet, formulas/deltanet.mf) only")
    pattern = _pattern(f, layers)
    if not any(pattern):
        return
    for arg, key in SHAPE.items():
        if not f.has(arg):
            raise f.missing(arg, " (--experimental-attention-variant gated_delta_net sizes its layers by it)")
        draft.set(key, f.integer(arg), f"--{arg}")
    hv, hk = draft.get("model.linear_num_value_heads"), draft.get("model.linear_num_key_heads")
    if hv % hk:
        raise f.error("linear-num-value-heads", f"is {hv}, not a multiple of --linear-num-key-heads {hk}")
    every = next((n for n in range(2, layers + 1)
                  if pattern == [0 if (i + 1) % n == 0 else 1 for i in range(layers)]), 0)
    if every:
        draft.set("model.full_attention_interval", every,
                  f"--linear-attention-freq: layer i softmax attention when (i + 1) % {every} == 0")
    else:
        draft.set("model.linear_attention_pattern", "".join("G" if x else "*" for x in pattern),
                  "--linear-attention-freq: G = Gated DeltaNet (1), * = softmax attention (0)")


def _pattern(f: Fields, layers: int) -> list[int]:
    if not f.has("linear-attention-freq"):
        raise f.missing("linear-attention-freq", " (which layers --experimental-attention-variant makes linear)")
    raw = f.raw("linear-attention-freq")
    text = "".join(raw) if isinstance(raw, list) else str(raw).strip()
    if re.fullmatch(r"\d+", text):
        every = int(text)
        if every < 1:
            raise f.error("linear-attention-freq", f"must be a positive integer or a list of 0/1, got {text}")
        return [0 if (i + 1) % every == 0 else 1 for i in range(layers)]
    try:
        pattern = list_expression(text)
    except ValueError:
        raise f.error("linear-attention-freq", f"must be an integer or a Python list expression of 0/1 such as "
                                               f"([1]*3+[0])*12, got {text!r}") from None
    if any(x not in (0, 1) for x in pattern) or len(pattern) != layers:
        raise f.error("linear-attention-freq", f"{text} must hold one 0 (softmax attention) or 1 (Gated DeltaNet) "
                                               f"per layer ({layers}), got {len(pattern)} entries")
    return pattern
