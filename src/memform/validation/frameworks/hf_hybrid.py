"""Hugging Face transformers' hybrid Mamba-2 models as the ground truth (issue 34): NemotronH (Mamba-2,
attention and MLP layers, one symbol of ``hybrid_override_pattern`` each), GraniteMoeHybrid (Granite-4.0-H:
a Mamba-2 or attention mixer, then a MoE block with a shared MLP, per decoder layer) and FalconH1 (Mamba-2 and
attention side by side, then an MLP, per decoder layer) trained one step on the CPU; and (ssm_sweep) AI21's Jamba
(a Mamba-1 or attention mixer, then an MLP or MoE block, per decoder layer), state-spaces' Mamba (Mamba-1 blocks)
and Mamba-2 (Mamba-2 blocks), whose Mamba-1 mixers transformers runs on the CPU through its sequential PyTorch
selective scan (formulas/mamba1.mf, model.mamba_impl: torch).

The step is :mod:`.hf`'s (``Trainer.training_step`` as transformers 5 writes it, traced per category);
the model is transformers' own ``NemotronHForCausalLM`` built from a config of ``NemotronHConfig``, and
memform reads the same ``config.json`` through ``memform import hf`` (the hybrid importer,
``memform.importers.hf_hybrid``). On the CPU transformers runs the Mamba-2 mixer through its PyTorch
reference (``causal_conv1d_fn``, ``mamba2_chunk_scan``: mamba_ssm's kernels need CUDA), which the case
tells memform with ``model.mamba_impl: torch``; the CUDA kernels keep far less (``formulas/mamba.mf``:
``combined``, ``split``), which a CPU step cannot show.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from . import hf
from .hf import Step

#: transformers' config class keywords of each model type the harness builds
MODEL_TYPES = ("nemotron_h", "granitemoehybrid", "falcon_h1", "jamba", "mamba", "mamba2")
#: the model types whose decoder layer holds two memform sublayers (a mixer, then its MLP / MoE)
PAIRED = ("granitemoehybrid", "falcon_h1", "jamba")


@dataclass(frozen=True)
class HybridCase(hf.HFCase):
    """One NemotronH training step: :class:`hf.HFCase` plus the layer pattern and the Mamba-2 shape."""

    model: str = "nemotron_h"
    pattern: str = "M*M-"
    mamba_heads: int = 8
    mamba_head_dim: int = 16
    groups: int = 2
    state: int = 16
    chunk: int = 64

    def label(self) -> str:
        if self.model in ("jamba", "mamba"):
            # the Mamba-1 mixer (mamba1.mf): d_inner = 2·h, N = state, R = ceil(h / 16)
            return (f"hf {self.model} {self.pattern} h{self.h} a{self.heads}/{self.kv_heads} "
                    f"ssm1 d{2 * self.h}/n{self.state} {f'moe{self.experts}x{self.top_k} ' if self.experts else ''}"
                    f"b{self.b} s{self.s} {self.attn}{' gc' if self.gc else ''} {self.dtype}")
        return (f"hf {self.model} {self.pattern} h{self.h} a{self.heads}/{self.kv_heads} "
                f"ssm{self.mamba_heads}x{self.mamba_head_dim}/g{self.groups}/n{self.state}/q{self.chunk} "
                f"{f'moe{self.experts}x{self.top_k} ' if self.model == 'granitemoehybrid' else ''}"
                f"{('gated-norm ' if self.experts == 1 else '') if self.model == 'falcon_h1' else ''}"
                f"b{self.b} s{self.s} {self.attn}{' gc' if self.gc else ''} {self.dtype}")

    def hf_config(self) -> Any:
        from transformers import AutoConfig

        if self.model == "falcon_h1":
            # FalconH1DecoderLayer: Mamba-2 and attention side by side, then the MLP (pattern: one P per layer)
            return AutoConfig.for_model(
                self.model, hidden_size=self.h, num_hidden_layers=len(self.pattern), num_attention_heads=self.heads,
                num_key_value_heads=self.kv_heads, head_dim=self.head_dim or self.h // self.heads,
                intermediate_size=self.ffn, vocab_size=self.vocab, max_position_embeddings=self.s,
                tie_word_embeddings=False, use_cache=False, mamba_n_heads=self.mamba_heads,
                mamba_d_ssm=self.mamba_heads * self.mamba_head_dim, mamba_d_head=self.mamba_head_dim,
                mamba_n_groups=self.groups, mamba_d_state=self.state, mamba_chunk_size=self.chunk,
                mamba_rms_norm=self.experts == 1)
        if self.model == "jamba":
            # JambaConfig places attention by period / offset: the pattern's one * (or none) gives them; the
            # FFN of every second layer (from layer 1) is the MoE block when experts > 1
            star = self.pattern.find("*")
            period, offset = (len(self.pattern), star) if star >= 0 else (len(self.pattern) + 1, len(self.pattern))
            return AutoConfig.for_model(
                self.model, hidden_size=self.h, num_hidden_layers=len(self.pattern), num_attention_heads=self.heads,
                num_key_value_heads=self.kv_heads, intermediate_size=self.ffn, vocab_size=self.vocab,
                max_position_embeddings=self.s, tie_word_embeddings=False, use_cache=False,
                attn_layer_period=period, attn_layer_offset=offset, expert_layer_period=2, expert_layer_offset=1,
                num_experts=max(self.experts, 1), num_experts_per_tok=self.top_k, mamba_d_state=self.state)
        if self.model == "mamba":
            return AutoConfig.for_model(
                self.model, hidden_size=self.h, num_hidden_layers=len(self.pattern), vocab_size=self.vocab,
                state_size=self.state, tie_word_embeddings=False, use_cache=False)
        if self.model == "mamba2":
            return AutoConfig.for_model(
                self.model, hidden_size=self.h, num_hidden_layers=len(self.pattern), vocab_size=self.vocab,
                num_heads=self.mamba_heads, head_dim=self.mamba_head_dim, n_groups=self.groups,
                expand=self.mamba_heads * self.mamba_head_dim // self.h, state_size=self.state, chunk_size=self.chunk,
                tie_word_embeddings=False, use_cache=False)
        if self.model == "granitemoehybrid":
            # GraniteMoeHybridDecoderLayer: a Mamba-2 or attention mixer, then the MoE block + shared MLP
            return AutoConfig.for_model(
                self.model, hidden_size=self.h, layer_types=["mamba" if c == "M" else "attention" for c in self.pattern],
                num_hidden_layers=len(self.pattern), num_attention_heads=self.heads,
                num_key_value_heads=self.kv_heads, intermediate_size=self.ffn, shared_intermediate_size=2 * self.ffn,
                num_local_experts=self.experts, num_experts_per_tok=self.top_k, vocab_size=self.vocab,
                max_position_embeddings=self.s, tie_word_embeddings=False, use_cache=False,
                mamba_n_heads=self.mamba_heads, mamba_d_head=self.mamba_head_dim, mamba_n_groups=self.groups,
                mamba_d_state=self.state, mamba_chunk_size=self.chunk, mamba_expand=self.mamba_heads
                * self.mamba_head_dim // self.h)

        # use_cache False: a training step keeps no generation cache (NemotronHModel builds one otherwise)
        return AutoConfig.for_model(
            self.model, hidden_size=self.h, hybrid_override_pattern=self.pattern,
            num_hidden_layers=len(self.pattern), num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
            head_dim=self.head_dim or self.h // self.heads, intermediate_size=self.ffn, vocab_size=self.vocab,
            max_position_embeddings=self.s, tie_word_embeddings=False, use_cache=False,
            mamba_num_heads=self.mamba_heads, mamba_head_dim=self.mamba_head_dim, n_groups=self.groups,
            ssm_state_size=self.state, chunk_size=self.chunk)

    def build_model(self, dtype: Any) -> Any:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_config(self.hf_config(), attn_implementation=self.attn_impl(), dtype=dtype)

    def attn_impl(self) -> str:
        """transformers' attention implementation: Mamba / Mamba2 have no attention and accept only "eager",
        which builds no mask for them (memform's side keeps the case's sdpa: no eager 4-D mask to count)."""
        return "eager" if self.model in ("mamba", "mamba2") else self.attn

    def overrides(self) -> dict[str, Any]:
        # on the CPU transformers trains the mixer through its PyTorch reference scan
        return {**super().overrides(), "model.mamba_impl": "torch"}


def measure(case: HybridCase, seed: int = 0) -> Step:
    """:func:`hf.measure`: the warm-up step, then the traced one."""
    return hf.measure(case, seed)


# ---- what each layer's forward saves ---------------------------------------------------------------
def per_layer(case: HybridCase, seed: int = 0) -> list[int]:
    """Bytes autograd saves for backward during each decoder layer's forward (distinct storages first saved
    inside that layer, parameters left out; the layer's input, saved by its norm, is the previous layer's
    output and counts here, as mamba.mf's norm.act counts it). Without checkpointing. One entry per
    transformers decoder layer: a NemotronHBlock (one symbol), a GraniteMoeHybridDecoderLayer (two)."""
    from .hf import case_per_layer
    # Mamba / Mamba2 keep their layers in a backbone
    return case_per_layer(case, seed, lambda m: m.backbone.layers if hasattr(m, "backbone") else m.model.layers)


def estimated_per_layer(case: HybridCase) -> list[int]:
    """mamba.mf's ``act`` (no recompute) of each transformers decoder layer of ``case`` (Granite: the sum of
    its mixer and MoE sublayers)."""
    from ...engine.model import load_model, stack_items

    model = load_model(case.memform_config(), {"training.recompute": "none"})
    ev = model.evaluator(keep=frozenset())
    out: list[int] = []
    for item in stack_items(model, ev):
        if item.block in ("embedding", "output") or item.count_value == 0:
            continue
        q = model.program.pick(item.block, "act", "none")
        value = ev.number(ev.as_expr(ev.quantity(item.block, "act", "none", overrides=item.bindings), q.loc),
                          q.loc, f"{item.block}.act")
        out += [int(value)] * item.count_value
    if case.model in PAIRED:
        out = [out[i] + out[i + 1] for i in range(0, len(out), 2)]
    return out


BASE = HybridCase(h=64, heads=4, kv_heads=2, ffn=128, vocab=512, b=2, s=256)
#: Falcon-H1's decoder layer (Mamba-2 and attention side by side, then the MLP); experts=1 turns the mixer's
#: gated RMSNorm on (mamba_rms_norm), off by default as in Falcon-H1's configs
FALCON = replace(BASE, model="falcon_h1", pattern="PP", experts=0)
#: Granite-4.0-H's decoder layer (a Mamba-2 or attention mixer, then the MoE block with the shared MLP)
GRANITE = replace(BASE, model="granitemoehybrid", pattern="M*M", ffn=32, experts=4, top_k=2)


#: AI21 Jamba's decoder layers (Mamba-1 with dt / B / C norms, or attention; then a gated MLP, or a MoE block in
#: every second layer): S-, *E, S-, SE
JAMBA = replace(BASE, model="jamba", pattern="S*SS", ffn=96, experts=4, top_k=2, s=128)
#: state-spaces Mamba (Mamba-1 blocks only) and Mamba-2 (Mamba-2 blocks only), no MLP
MAMBA = replace(BASE, model="mamba", pattern="SS", experts=0, s=128)
MAMBA2 = replace(BASE, model="mamba2", pattern="MM", experts=0)


def ssm_sweep() -> list[HybridCase]:
    """The Jamba, Mamba and Mamba-2 cases (issue 34): each dtype set-up, checkpointing, eager attention."""
    cases = [replace(JAMBA, dtype=dtype) for dtype in hf.DTYPES]
    cases += [replace(JAMBA, gc=True), replace(JAMBA, gc=True, dtype="amp-bf16"), replace(JAMBA, attn="eager"),
              replace(JAMBA, experts=0)]
    cases += [replace(MAMBA, dtype=dtype) for dtype in hf.DTYPES] + [replace(MAMBA, gc=True)]
    cases += [replace(MAMBA2, dtype=dtype) for dtype in hf.DTYPES] + [replace(MAMBA2, gc=True)]
    return cases


def sweep() -> list[HybridCase]:
    """Every NemotronH case of ``bench/validate.py --frameworks``: the pattern of Nemotron-H's blocks
    (M, *, -), each dtype set-up, checkpointing, eager attention, a sequence that does not fill its
    last chunk, other SSM shapes."""
    cases = [replace(BASE, dtype=dtype) for dtype in hf.DTYPES]
    cases += [replace(BASE, gc=True), replace(BASE, gc=True, dtype="amp-bf16"), replace(BASE, attn="eager"),
              replace(BASE, pattern="MM-M*-", s=200),
              replace(BASE, pattern="M-M*", mamba_heads=16, mamba_head_dim=8, groups=4, state=32, chunk=32),
              replace(BASE, pattern="M", b=1, s=512, chunk=128)]
    cases += [replace(GRANITE, dtype=dtype) for dtype in hf.DTYPES]
    cases += [replace(GRANITE, gc=True), replace(GRANITE, gc=True, dtype="amp-bf16"), replace(GRANITE, experts=0)]
    cases += [replace(FALCON, dtype=dtype) for dtype in hf.DTYPES]
    cases += [replace(FALCON, experts=1), replace(FALCON, gc=True), replace(FALCON, gc=True, dtype="amp-bf16"),
              replace(FALCON, attn="eager")]
    return cases + ssm_sweep()


def quick_sweep() -> list[HybridCase]:
    """The subset the test suite runs."""
    return [BASE, replace(BASE, gc=True, dtype="amp-bf16"), replace(GRANITE, gc=True), replace(FALCON, dtype="amp-bf16")]
