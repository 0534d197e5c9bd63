"""Hugging Face transformers' LFM2 and LFM2-MoE (Liquid AI) as the ground truth (issue 34): each decoder layer
a double-gated short convolution (``Lfm2ShortConv``) or an attention with q/k RMSNorms, then a SwiGLU MLP (or,
in LFM2-MoE past ``num_dense_layers``, a sigmoid-routed MoE block), trained one step on the CPU.

The step is :mod:`.hf`'s (``Trainer.training_step`` as transformers 5 writes it, traced per category); the
model is transformers' own ``Lfm2ForCausalLM`` / ``Lfm2MoeForCausalLM``, and memform reads the same
``config.json`` through ``memform import hf`` (``memform.importers.hf_lfm2``: pattern ``C-`` / ``*-`` /
``CE`` / ``*E``, formulas/lfm2.mf's ``C`` sublayer). On the CPU transformers runs the conv through its
``F.conv1d`` fallback (padded output, ``model.mamba_impl: torch``); Dao's ``causal_conv1d`` kernel on CUDA
writes no padding rows, which a CPU step cannot show.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from . import hf
from .hf import Step
from .hf_hybrid import estimated_per_layer as _hybrid_estimated

MODEL_TYPES = ("lfm2", "lfm2_moe")


@dataclass(frozen=True)
class Lfm2Case(hf.HFCase):
    """One LFM2 training step: :class:`hf.HFCase` plus the layer kinds (C conv, * attention), the conv width
    and, for LFM2-MoE, the dense prefix."""

    model: str = "lfm2"
    pattern: str = "CC*C"
    conv_k: int = 3
    dense_layers: int = 1

    def label(self) -> str:
        moe = f"moe{self.experts}x{self.top_k}/d{self.dense_layers} " if self.model == "lfm2_moe" else ""
        return (f"hf {self.model} {self.pattern} h{self.h} a{self.heads}/{self.kv_heads} k{self.conv_k} "
                f"f{self.ffn} {moe}b{self.b} s{self.s} {self.attn}{' gc' if self.gc else ''} {self.dtype}")

    def hf_config(self) -> Any:
        from transformers import AutoConfig

        kinds = ["conv" if c == "C" else "full_attention" for c in self.pattern]
        kw: dict[str, Any] = dict(
            hidden_size=self.h, num_hidden_layers=len(self.pattern), num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads, intermediate_size=self.ffn, vocab_size=self.vocab,
            max_position_embeddings=self.s, tie_word_embeddings=False, use_cache=False, layer_types=kinds,
            conv_L_cache=self.conv_k)
        if self.model == "lfm2_moe":
            kw.update(num_experts=self.experts, num_experts_per_tok=self.top_k, moe_intermediate_size=self.ffn // 2,
                      num_dense_layers=self.dense_layers)
        else:
            # block_auto_adjust_ff_dim: Lfm2MLP's width is 2/3 of intermediate_size rounded up to block_multiple_of
            kw.update(block_multiple_of=32)
        return AutoConfig.for_model(self.model, **kw)

    def build_model(self, dtype: Any) -> Any:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_config(self.hf_config(), attn_implementation=self.attn, dtype=dtype)

    def overrides(self) -> dict[str, Any]:
        # on the CPU transformers runs the short conv through its F.conv1d fallback (padded output)
        return {**super().overrides(), "model.mamba_impl": "torch"}


def measure(case: Lfm2Case, seed: int = 0) -> Step:
    """:func:`hf.measure`: the warm-up step, then the traced one."""
    return hf.measure(case, seed)


def per_layer(case: Lfm2Case, seed: int = 0) -> list[int]:
    """Bytes autograd saves during each decoder layer's forward (:func:`hf.saved_per_layer`), no checkpointing."""
    from .hf import case_per_layer
    return case_per_layer(case, seed)


def estimated_per_layer(case: Lfm2Case) -> list[int]:
    """mamba.mf's ``act`` (no recompute) of each LFM2 decoder layer: its mixer and FFN sublayers summed."""
    out = _hybrid_estimated(case)
    return [out[i] + out[i + 1] for i in range(0, len(out), 2)]


BASE = Lfm2Case(h=64, heads=4, kv_heads=2, ffn=192, vocab=512, b=2, s=256)
MOE = replace(BASE, model="lfm2_moe", pattern="C*CC", ffn=128, experts=4, top_k=2, dense_layers=1)


def sweep() -> list[Lfm2Case]:
    """Every LFM2 case of ``bench/validate.py --frameworks``: each dtype set-up, checkpointing, eager attention,
    a wider conv, LFM2-MoE."""
    cases = [replace(BASE, dtype=dtype) for dtype in hf.DTYPES]
    cases += [replace(BASE, gc=True), replace(BASE, gc=True, dtype="amp-bf16"), replace(BASE, attn="eager"),
              replace(BASE, pattern="CCCC", conv_k=4, s=200)]
    cases += [replace(MOE, dtype=dtype) for dtype in hf.DTYPES] + [replace(MOE, gc=True)]
    return cases


def quick_sweep() -> list[Lfm2Case]:
    """The subset the test suite runs."""
    return [BASE, replace(BASE, gc=True, dtype="amp-bf16")]
