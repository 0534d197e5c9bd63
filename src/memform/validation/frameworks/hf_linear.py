"""Hugging Face transformers' Gated DeltaNet hybrids (Qwen3-Next) as the ground truth for ``deltanet.mf``.

The step is :mod:`.hf`'s (``Trainer.training_step`` as transformers 5 writes it, traced by
:class:`~.tracking.StepSamples`), on a ``Qwen3NextForCausalLM`` built from a toy ``Qwen3NextConfig``: Gated
DeltaNet layers and gated full-attention layers (``full_attention_interval``), MoE with a gated shared
expert or a dense MLP. On a CPU transformers runs its PyTorch fallbacks (``torch_chunk_gated_delta_rule``,
``causal_conv1d_fn`` as ``F.conv1d``): memform's side is ``memform import hf`` of the same config.json with
``model.gdn_kernel: torch``. The sequence is a multiple of the chunk size (64), as the fallback pads it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .hf import HFCase, Step
from .hf import measure as _measure


@dataclass(frozen=True)
class LinearCase(HFCase):
    """A Qwen3-Next step: the :class:`~.hf.HFCase` fields plus the Gated DeltaNet shape."""

    model: str = "qwen3_next"
    h: int = 64
    L: int = 4
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 128
    vocab: int = 512
    b: int = 2
    s: int = 128
    lin_k_heads: int = 2
    lin_v_heads: int = 4
    lin_k_dim: int = 16
    lin_v_dim: int = 16
    conv: int = 4
    interval: int = 4         # full_attention_interval
    layer_types: tuple[str, ...] = ()   # transformers layer_types (overrides the interval)
    experts: int = 0          # num_experts (0: a dense MLP in every layer)
    top_k: int = 2
    moe_ffn: int = 32
    shared_ffn: int = 32

    def label(self) -> str:
        moe = f" moe{self.experts}x{self.top_k}" if self.experts else ""
        if self.recipe:
            return (f"hf qwen3_next {self.recipe} L{self.L} b{self.b} s{self.s} {self.attn}{' gc' if self.gc else ''} "
                    f"{self.dtype}{' fake' if self.fake else ''}")
        pattern = "".join("G" if k[0] == "l" else "*" for k in self.layer_types) or f"every{self.interval}"
        return (f"hf qwen3_next L{self.L} h{self.h} gdn{self.lin_k_heads}/{self.lin_v_heads}x{self.lin_k_dim}/"
                f"{self.lin_v_dim} {pattern}{moe} b{self.b} s{self.s} {self.attn}"
                f"{' gc' if self.gc else ''} {self.dtype}")

    def hf_config(self) -> Any:
        from transformers import AutoConfig

        kw: dict[str, Any] = dict(
            hidden_size=self.h, intermediate_size=self.ffn, num_hidden_layers=self.L,
            num_attention_heads=self.heads, num_key_value_heads=self.kv_heads, head_dim=self.head_dim,
            vocab_size=self.vocab, max_position_embeddings=self.s, tie_word_embeddings=False,
            linear_num_key_heads=self.lin_k_heads, linear_num_value_heads=self.lin_v_heads,
            linear_key_head_dim=self.lin_k_dim, linear_value_head_dim=self.lin_v_dim,
            linear_conv_kernel_dim=self.conv, full_attention_interval=self.interval,
            num_experts=self.experts, num_experts_per_tok=self.top_k, moe_intermediate_size=self.moe_ffn,
            shared_expert_intermediate_size=self.shared_ffn)
        if self.layer_types:
            kw["layer_types"] = list(self.layer_types)
        return AutoConfig.for_model("qwen3_next", **kw)

    def overrides(self) -> dict[str, Any]:
        # transformers on a CPU: the PyTorch fallbacks of the delta rule and the convolution
        return {**super().overrides(), "model.gdn_kernel": "torch"}


def measure(case: LinearCase, seed: int = 0) -> Step:
    """:func:`.hf.measure` of the case (warm-up step, then the traced one)."""
    return _measure(case, seed)


BASE = LinearCase()
#: the layer shape of a published dense Gated DeltaNet hybrid at its training length, traced with fake tensors:
#: Qwen3.5-27B's text model as debaditc/kvfit src/kvfit/data/models.json @ bd4ccabf records its config.json
#: (hidden 5120, intermediate 17408, 24 heads / 4 KV heads of 256, linear 16 key / 48 value heads of 128,
#: vocabulary 248320), four of its 64 layers (one full-attention layer, three Gated DeltaNet), one 4K sequence
QWEN35_27B_LAYERS = replace(BASE, h=5120, L=4, heads=24, kv_heads=4, head_dim=256, ffn=17408, vocab=248320, b=1,
                            s=4096, lin_k_heads=16, lin_v_heads=48, lin_k_dim=128, lin_v_dim=128, dtype="bf16",
                            fake=True, recipe="Qwen3.5-27B layers")


def sweep() -> list[LinearCase]:
    """The Qwen3-Next cases of ``bench/validate.py --frameworks``: dense and MoE, fp32, bf16 and autocast,
    eager attention and checkpointing, GVA (value heads > key heads) and not, two chunks and four."""
    # (MoE under autocast is left out: transformers' experts under CPU autocast keep more than moe.mf counts,
    # as the Mixtral row of hf.py does -- a gap of the MoE formulas under hf_trainer.amp, not of Gated DeltaNet)
    return [BASE, replace(BASE, dtype="bf16"), replace(BASE, dtype="amp-bf16"), replace(BASE, attn="eager"),
            replace(BASE, s=200), replace(BASE, s=100, dtype="amp-bf16"),
            replace(BASE, gc=True), replace(BASE, lin_v_heads=2, lin_v_dim=32, s=256),
            replace(BASE, lin_k_heads=4, lin_v_heads=8, s=256, b=1, dtype="amp-bf16"),
            replace(BASE, experts=8, top_k=2), replace(BASE, experts=8, top_k=2, dtype="bf16"), QWEN35_27B_LAYERS]


def quick_sweep() -> list[LinearCase]:
    """The subset the test suite runs."""
    return [BASE, replace(BASE, experts=8, top_k=2), replace(BASE, dtype="amp-bf16")]
