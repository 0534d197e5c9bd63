"""DeciLM / Llama-Nemotron (NAS) decoders as the ground truth: transformers' own Llama modules arranged
layer by layer as a DeciLM ``block_configs`` says, one training step as :mod:`.hf` runs it, held against
``formulas/nas.mf`` under the ``hf-trainer`` profile.

transformers has no DeciLM class (the released checkpoints run NVIDIA's remote ``modeling_decilm.py``).
Its decoder layer is restated here from NVIDIA-NeMo/Automodel
``nemo_automodel/components/models/decilm/layers.py`` (``Block``) with transformers' own modules: a
``LlamaForCausalLM`` whose layer ``i`` keeps ``input_layernorm`` + ``LlamaAttention`` with
``num_attention_heads / n_heads_in_group`` K/V heads, or an ``nn.Linear(h, h, bias=False)`` in the
attention's place (``replace_with_linear``), or neither -- no norm, no residual add (``no_op``); and
likewise ``post_attention_layernorm`` + ``LlamaMLP`` of width ``_ffn_mult_to_intermediate_size(ffn_mult)``,
a linear, or nothing. memform reads the same layers from the DeciLM-format ``config.json`` the case writes
(``model_type: nemotron-nas``, ``block_configs``) through ``memform import hf``, so the importer
(:mod:`memform.importers.hf_nas`) is part of what is checked.

Besides the categories every harness compares, :func:`per_layer` measures what each decoder layer's
forward saves for backward (autograd's saved tensors, by storage) and sets it against nas.mf's ``act``
of that layer.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import hf as _hf
from . import imported_config
from ...importers.hf_nas import ffn_mult_to_intermediate_size

#: one layer: attention (an int: grouped-query attention with that n_heads_in_group; "linear"; "no_op")
#: and FFN (a float: an MLP of that ffn_mult; "linear"; "no_op")
Block = tuple[Any, Any]


@dataclass(frozen=True)
class NASCase:
    """One training step of a DeciLM-layered model (see the module doc); the fields :func:`hf.measure`
    reads are :class:`hf.HFCase`'s."""

    blocks: tuple[Block, ...] = ((2, 2.0), ("no_op", 1.0), ("linear", 3.0), (4, "no_op"), (8, "linear"),
                                 ("no_op", "no_op"))
    h: int = 256
    heads: int = 8
    vocab: int = 1024
    b: int = 2
    s: int = 128
    attn: str = "sdpa"
    gc: bool = False
    dtype: str = "fp32"
    fake: bool = False
    recipe: str = ""
    device: str = "cpu"
    lora_r: int = 0

    @property
    def L(self) -> int:  # noqa: N802 - the paper's name
        return len(self.blocks)

    def label(self) -> str:
        shape = self.recipe or "-".join(f"{_short(a, 'a')}{_short(f, 'f')}" for a, f in self.blocks)
        return (f"hf-nas {shape} h{self.h} b{self.b} s{self.s} {self.attn}{' gc' if self.gc else ''} "
                f"{self.dtype}{' fake' if self.fake else ''}")

    # ---- the config.json a DeciLM checkpoint carries -------------------------------------------------
    def config_json(self) -> dict[str, Any]:
        blocks = []
        for attn, ffn in self.blocks:
            blocks.append({
                "attention": {"n_heads_in_group": attn if isinstance(attn, int) else None,
                              "no_op": attn == "no_op", "replace_with_linear": attn == "linear"},
                "ffn": {"ffn_mult": ffn if isinstance(ffn, float) else None,
                        "no_op": ffn == "no_op", "replace_with_linear": ffn == "linear"}})
        return {"architectures": ["DeciLMForCausalLM"], "model_type": "nemotron-nas", "hidden_size": self.h,
                "num_attention_heads": self.heads, "num_hidden_layers": self.L, "num_key_value_heads": None,
                "intermediate_size": None, "vocab_size": self.vocab, "max_position_embeddings": self.s,
                "rms_norm_eps": 1e-5, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
                "attention_dropout": 0.0, "tie_word_embeddings": False, "rope_theta": 500000.0,
                "block_configs": blocks}

    # ---- transformers' Llama modules, layer by layer ---------------------------------------------------
    def build_model(self, dtype: Any) -> Any:
        import copy

        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        base = LlamaConfig(hidden_size=self.h, intermediate_size=4 * self.h, num_hidden_layers=self.L,
                           num_attention_heads=self.heads, num_key_value_heads=self.heads, vocab_size=self.vocab,
                           max_position_embeddings=self.s, rms_norm_eps=1e-5, hidden_act="silu",
                           attention_bias=False, mlp_bias=False, tie_word_embeddings=False)
        model = LlamaForCausalLM._from_config(base, attn_implementation=self.attn, dtype=dtype)
        layer_cls = _layer_class()
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)   # made in the model's dtype: Module.to cannot swap fake tensors
        try:
            for i, (attn, ffn) in enumerate(self.blocks):
                cfg = copy.deepcopy(model.config)
                if isinstance(attn, int):
                    cfg.num_key_value_heads = self.heads // attn
                if isinstance(ffn, float):
                    cfg.intermediate_size = ffn_mult_to_intermediate_size(ffn, self.h)
                model.model.layers[i] = layer_cls(cfg, i, attn, ffn)
        finally:
            torch.set_default_dtype(default)
        return model

    # ---- memform's side ----------------------------------------------------------------------------
    def overrides(self) -> dict[str, Any]:
        return _hf.HFCase.overrides(self)  # type: ignore[arg-type] - the same fields

    def memform_config(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "config.json"
            path.write_text(json.dumps(self.config_json()))
            return imported_config("hf", path, self.label(), overrides=self.overrides())


def _short(x: Any, kind: str) -> str:
    if x == "no_op":
        return "0"
    if x == "linear":
        return "L"
    return f"g{x}" if kind == "a" else f"m{x:g}"


_LAYER: Any = None


def _layer_class() -> Any:
    """DeciLM's decoder layer (Automodel decilm/layers.py ``Block``) over transformers' Llama modules."""
    global _LAYER
    if _LAYER is not None:
        return _LAYER
    from torch import nn
    from transformers.modeling_layers import GradientCheckpointingLayer
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm

    class NASDecoderLayer(GradientCheckpointingLayer):
        def __init__(self, config: Any, layer_idx: int, attn: Any, ffn: Any) -> None:
            super().__init__()
            self.attn_kind, self.ffn_kind = attn, ffn
            h = config.hidden_size
            if attn != "no_op":
                self.input_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
                self.self_attn = (nn.Linear(h, h, bias=False) if attn == "linear"
                                  else LlamaAttention(config=config, layer_idx=layer_idx))
            if ffn != "no_op":
                self.post_attention_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
                self.mlp = nn.Linear(h, h, bias=False) if ffn == "linear" else LlamaMLP(config)

        def forward(self, hidden_states: Any, attention_mask: Any = None, position_ids: Any = None,
                    cache: Any = None, use_cache: bool | None = False, position_embeddings: Any = None,
                    **kwargs: Any) -> Any:
            if self.attn_kind == "linear":
                hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states))
            elif self.attn_kind != "no_op":
                out, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states),
                                        attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                                        use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
                hidden_states = hidden_states + out
            if self.ffn_kind != "no_op":
                hidden_states = hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))
            return hidden_states

    _LAYER = NASDecoderLayer
    return _LAYER


def measure(case: NASCase, seed: int = 0) -> Any:
    """One warm-up and one traced step, as :func:`hf.measure` runs any transformers model."""
    return _hf.measure(case, seed)  # type: ignore[arg-type] - a case with build_model and HFCase's fields


# ---- what each layer's forward saves ---------------------------------------------------------------
def per_layer(case: NASCase, seed: int = 0) -> list[int]:
    """Bytes autograd saves for backward during each decoder layer's forward (distinct storages first saved
    inside that layer; the layer's input, saved by its first norm, is the previous layer's output and
    counts here, as nas.mf's act counts it). Without checkpointing."""
    from .hf import case_per_layer
    return case_per_layer(case, seed)


# ---- the cases --------------------------------------------------------------------------------------
BASE = NASCase()
#: Llama-3.3-Nemotron-Super-49B-v1's first eight blocks (its config.json, tests/data/importers/hf/): GQA
#: with n_heads_in_group 8 and ffn_mult 2.625 / 5.25, two no-op attentions, at real width under fake tensors
SUPER_HEAD = NASCase(blocks=((8, 2.625), (8, 5.25), (8, 5.25), (8, 5.25), (8, 5.25), (8, 5.25),
                             ("no_op", 2.625), ("no_op", 2.625)),
                     h=8192, heads=64, vocab=128256, b=1, s=4096, dtype="bf16", fake=True,
                     recipe="Nemotron-Super-49B blocks 0-7")


def sweep() -> list[NASCase]:
    """Every NAS case of ``bench/validate.py --frameworks``: the mixed toy model under each attention
    kernel, checkpointing and dtype set-up, and the Super's first blocks at real size (fake tensors)."""
    cases = [replace(BASE, attn=attn, gc=gc, dtype=dtype)
             for attn in ("sdpa", "eager") for gc in (False, True) for dtype in _hf.DTYPES]
    # checkpointed, the same layers in reverse order: the largest layer runs its backward first (the order
    # schedules.mf's backward moment assumes; in BASE it is layer 0, whose backward comes last)
    cases += [replace(BASE, blocks=tuple(reversed(BASE.blocks)), attn=attn, gc=True) for attn in ("sdpa", "eager")]
    return cases + [SUPER_HEAD, replace(SUPER_HEAD, gc=True)]


def quick_sweep() -> list[NASCase]:
    return [BASE, replace(BASE, attn="eager", gc=True, dtype="amp-bf16"), SUPER_HEAD]


def estimated_per_layer(case: NASCase) -> list[int]:
    """nas.mf's ``act`` (no recompute) of each decoder layer of ``case``, as the stack binds it."""
    from ...engine.model import load_model, stack_items

    model = load_model(case.memform_config(), {"training.recompute": "none"})
    ev = model.evaluator(keep=frozenset())
    out: list[int] = []
    for item in stack_items(model, ev):
        if item.block != "decoder" or item.count_value == 0:
            continue
        q = model.program.pick("decoder", "act", "none")
        value = ev.number(ev.as_expr(ev.quantity("decoder", "act", "none", overrides=item.bindings), q.loc),
                          q.loc, "decoder.act")
        out += [int(value)] * item.count_value
    return out
