"""Megatron-LM's hybrid Mamba-2 arguments → ``formulas/mamba.mf``'s keys (hooked from :mod:`.megatron`).

A hybrid model is what ``pretrain_mamba.py`` (``MambaModel``) or ``pretrain_gpt.py --is-hybrid-model``
trains: ``--num-layers`` sublayers, each of the kind one symbol of the layer pattern says (Megatron-LM
``megatron/core/ssm/mamba_hybrid_layer_allocation.py`` Symbols: ``M`` Mamba-2, ``*`` attention, ``-`` MLP,
``E`` MoE). The pattern is ``--hybrid-override-pattern``, else the one ``allocate_layers`` makes from
``--hybrid-attention-ratio`` and ``--hybrid-mlp-ratio`` (all Mamba-2 when both are 0). The Mamba-2 shape:
``--mamba-state-dim`` (128), ``--mamba-head-dim`` (64), ``--mamba-num-groups`` (8), ``--mamba-num-heads``
(default: ``expand`` 2 × hidden / head dim, MambaMixer's d_inner), Megatron-LM's defaults in parentheses
(``megatron/training/arguments.py`` _add_network_size_args).
"""

from __future__ import annotations

from typing import Any

from .draft import Draft

#: the launchers of Megatron-LM's hybrid models (MambaModel)
LAUNCHERS = frozenset({"pretrain_mamba.py", "pretrain_hybrid.py"})
SYMBOLS = "M*-E"
#: the arguments read here (so that megatron.py's REFUSED table does not stop them)
ARGUMENTS = ("is-hybrid-model", "hybrid-override-pattern", "hybrid-attention-ratio", "hybrid-mlp-ratio",
             "mamba-state-dim", "mamba-head-dim", "mamba-num-groups", "mamba-num-heads", "mamba-expand",
             "mamba-d-conv", "mamba-chunk-size")


def allocate(layers: int, attention_ratio: float, mlp_ratio: float) -> str:
    """The layer pattern Megatron-LM's ``allocate_layers`` builds from the two ratios (no override): the
    attention layers spread evenly with Mamba-2 sections before, between and after them, then the MLP layers
    spread evenly over the remaining Mamba-2 positions (``_allocate_auto``; Waleffe et al. 2024, "An Empirical
    Study of Mamba-based Language Models", §3: the 8B hybrid's 24 Mamba-2, 4 attention and 28 MLP layers)."""
    kinds = ["M"] * layers
    n_attn = round(layers * attention_ratio)
    n_mamba = layers - n_attn
    section = n_mamba / (n_attn + 1)
    budget = section
    for i in range(layers):
        if budget < 0.5:
            kinds[i] = "*"
            budget += section
        else:
            budget -= 1
    n_mlp = round(layers * mlp_ratio)
    if n_mlp > 0:
        per_mlp = (n_mamba - n_mlp) / n_mlp
        budget = per_mlp
        for i in range(layers):
            if kinds[i] != "M":
                continue
            if budget < 0.5:
                kinds[i] = "-"
                budget += per_mlp
            else:
                budget -= 1
    return "".join(kinds)


def is_hybrid(f: Any) -> bool:
    return f.boolean("is-hybrid-model", False) or f.has("hybrid-override-pattern")


def apply(f: Any, draft: Draft, layers: int, h: int) -> None:
    """Write ``model.hybrid_pattern`` and the Mamba-2 shape of a hybrid model's arguments ``f``."""
    f.used.update(ARGUMENTS)
    ratios = {k: f.number(k, 0.0) for k in ("hybrid-attention-ratio", "hybrid-mlp-ratio")}
    for key, value in ratios.items():
        if not 0 <= value <= 1:
            raise f.error(key, f"is {value}: a share of the layers, between 0 and 1")
    if sum(ratios.values()) > 1:
        raise f.error("hybrid-mlp-ratio", "plus --hybrid-attention-ratio exceeds 1 (Megatron-LM allocate_layers "
                                          "asserts it)")
    if f.has("hybrid-override-pattern"):
        pattern = f.string("hybrid-override-pattern")
        if "/" in pattern:
            raise f.error("hybrid-override-pattern", f"is {pattern!r}: the multi-token-prediction layers after "
                                                     f"'/' are not modelled by mamba.mf")
        bad = sorted(set(pattern) - set(SYMBOLS))
        if bad:
            raise f.error("hybrid-override-pattern", f"has {', '.join(repr(c) for c in bad)}: the layer symbols are "
                                                     f"M (Mamba-2), * (attention), - (MLP), E (MoE)")
        if len(pattern) != layers:
            raise f.error("hybrid-override-pattern", f"has {len(pattern)} symbols for --num-layers {layers} "
                                                     f"(Megatron-LM requires one per layer)")
        auto = allocate(layers, *ratios.values())
        if any(ratios.values()) and any(auto.count(c) != pattern.count(c) for c in SYMBOLS):
            raise f.error("hybrid-override-pattern", "has other layer counts than --hybrid-attention-ratio / "
                                                     "--hybrid-mlp-ratio give (Megatron-LM refuses it)")
        draft.set("model.hybrid_pattern", pattern, "--hybrid-override-pattern")
    else:
        pattern = allocate(layers, *ratios.values())
        draft.set("model.hybrid_pattern", pattern,
                  f"Megatron-LM allocate_layers(--num-layers {layers}, attention ratio "
                  f"{ratios['hybrid-attention-ratio']:g}, MLP ratio {ratios['hybrid-mlp-ratio']:g})")
    if "E" in pattern and not draft.get("model.num_experts"):
        raise f.error("hybrid-override-pattern", "has MoE layers (E) but there is no --num-experts")
    head = f.integer("mamba-head-dim", 64)
    draft.set("model.mamba_state_dim", f.integer("mamba-state-dim", 128),
              "--mamba-state-dim" if f.has("mamba-state-dim") else "Megatron-LM's default 128")
    draft.set("model.mamba_head_dim", head, "--mamba-head-dim" if f.has("mamba-head-dim") else
              "Megatron-LM's default 64")
    draft.set("model.mamba_num_groups", f.integer("mamba-num-groups", 8),
              "--mamba-num-groups" if f.has("mamba-num-groups") else "Megatron-LM's default 8")
    if f.has("mamba-num-heads"):
        draft.set("model.mamba_num_heads", f.integer("mamba-num-heads"), "--mamba-num-heads")
    else:
        expand = f.integer("mamba-expand", 2)
        if (expand * h) % head:
            raise f.error("mamba-head-dim", f"{head} does not divide d_inner = {expand} × {h} (MambaMixer: d_inner "
                                            f"must be a multiple of the head dimension)")
        draft.set("model.mamba_num_heads", expand * h // head, f"MambaMixer: expand {expand} × hidden {h} / head "
                                                               f"dim {head}")
    if f.has("mamba-d-conv"):
        draft.set("model.mamba_conv_kernel", f.integer("mamba-d-conv"), "--mamba-d-conv")
    if f.has("mamba-chunk-size"):
        draft.set("model.mamba_chunk_size", f.integer("mamba-chunk-size"), "--mamba-chunk-size")
