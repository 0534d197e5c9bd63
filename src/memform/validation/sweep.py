"""The validation sweeps: which tiny models and set-ups are measured.

Each shape axis (micro-batch b, sequence s, layers L, hidden h) is varied one at a time around a
base point, and every shape runs in four set-ups that exercise the three recompute variants and
both attention cores (Llama-style). Extra points cover the precision recipes, the SwiGLU kernels,
MHA/MQA, a larger vocabulary, GPT-style layers (LayerNorm, GeLU, biases, learned positions, dropout:
Korthikanti et al.'s own setting) and Mixtral-style top-k MoE layers. All are CPU-cheap (h ≤ 256, s ≤ 256).
"""

from __future__ import annotations

from dataclasses import replace

from .compare import Point

BASE = Point(b=2, s=64, L=2, h=64)

#: (recompute, flash attention): no recompute with either core, selective (recomputes the unfused
#: core) and full recompute
SETUPS: tuple[tuple[str, bool], ...] = (("none", True), ("none", False), ("selective", False), ("full", True))


def shapes() -> list[Point]:
    pts = [BASE]
    pts += [replace(BASE, b=b) for b in (1, 4)]
    pts += [replace(BASE, s=s) for s in (32, 128, 256)]
    pts += [replace(BASE, L=L) for L in (1, 4)]
    pts += [replace(BASE, h=h) for h in (128, 256)]
    return pts


def extras() -> list[Point]:
    pts = [replace(BASE, precision="fp32"), replace(BASE, precision="fp32", flash=False, s=128),
           replace(BASE, swiglu_impl="eager"), replace(BASE, swiglu_impl="eager", recompute="selective", flash=False),
           replace(BASE, kv_heads=4), replace(BASE, kv_heads=1, h=128, s=128),
           replace(BASE, vocab=2048, h=128)]
    gpt = replace(BASE, arch="gpt", dropout=True, flash=False)
    pts += [gpt, replace(gpt, recompute="selective"), replace(gpt, recompute="full"), replace(gpt, b=4, s=128),
            replace(gpt, h=128, L=3), replace(gpt, precision="fp32"), replace(gpt, dropout=False, flash=True),
            replace(gpt, experts=4)]
    # a vocabulary smaller than h: a decoder layer's backward, not the loss, sets the activation peak
    dec = replace(BASE, vocab=128, h=256)
    pts += [dec, replace(dec, flash=False, s=256), replace(dec, recompute="selective", flash=False, s=256),
            replace(dec, recompute="full"), replace(dec, recompute="full", flash=False, s=256),
            replace(dec, arch="gpt", dropout=True, flash=False, s=128), replace(dec, experts=4),
            replace(dec, experts=4, recompute="full"), replace(dec, experts=4, flash=False, s=256)]
    moe = replace(BASE, experts=4)
    pts += [moe, replace(moe, flash=False), replace(moe, recompute="selective", flash=False),
            replace(moe, recompute="full"), replace(moe, experts=8, s=128), replace(moe, top_k=1, h=128),
            replace(moe, swiglu_impl="eager"), replace(moe, precision="fp32", b=4)]
    return pts


def amp_sweep() -> list[Point]:
    """PyTorch AMP as the Hugging Face Trainer runs it (fp32 model, forward under CPU bf16 autocast),
    estimated with the hf-trainer profile (``bench/validate.py --amp``): the four set-ups on the base
    shape and on larger b, s, h, eager SwiGLU, GPT-style layers with dropout (LayerNorm, GeLU, biases,
    the unfused core's softmax and dropout), MoE, and a small vocabulary (a decoder layer's backward
    sets the peak)."""
    amp = replace(BASE, precision="amp-bf16")
    gpt = replace(amp, arch="gpt", dropout=True, flash=False)
    dec = replace(amp, vocab=128, h=256)
    pts = [replace(amp, recompute=r, flash=f) for r, f in SETUPS]
    pts += [replace(amp, b=4), replace(amp, s=256, flash=False), replace(amp, h=256), replace(amp, swiglu_impl="eager"),
            gpt, replace(gpt, recompute="selective"), replace(gpt, recompute="full"), replace(gpt, h=128, L=3),
            replace(amp, experts=4), replace(amp, experts=4, recompute="full"),
            dec, replace(dec, flash=False, s=256), replace(dec, recompute="full")]
    return pts


def quick_amp_sweep() -> list[Point]:
    """The AMP cases the test suite runs: no recompute (flash), full recompute (the autocast cache
    moment), GPT-style with dropout (unfused core), MoE."""
    amp = replace(BASE, precision="amp-bf16")
    return [amp, replace(amp, recompute="full", L=3), replace(amp, arch="gpt", dropout=True, flash=False, s=32),
            replace(amp, experts=4, s=32)]


def full_sweep() -> list[Point]:
    """Every shape in every set-up, plus the extra points (what ``bench/validate.py`` runs)."""
    return [replace(p, recompute=r, flash=f) for p in shapes() for r, f in SETUPS] + extras()


def quick_sweep() -> list[Point]:
    """A few seconds' worth for the test suite: each recompute variant, both cores, both precisions,
    both architectures (GPT with dropout), MoE, and a case whose activation peak is a decoder layer's
    backward (small vocabulary)."""
    return [BASE, replace(BASE, arch="gpt", dropout=True, flash=False, s=32),
            replace(BASE, recompute="selective", flash=False, b=1),
            replace(BASE, recompute="full", L=3), replace(BASE, precision="fp32", h=128, swiglu_impl="eager"),
            replace(BASE, experts=4, s=32), replace(BASE, vocab=128, h=256, recompute="full")]
