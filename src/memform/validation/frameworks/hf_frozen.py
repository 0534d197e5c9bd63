"""Frozen parameters as fine-tuning scripts freeze them: ``requires_grad_(False)`` on a transformers model's
word embedding and/or output head, then :mod:`.hf`'s step (the Trainer's optimizer takes the parameters that
require gradients). The ground truth for ``formulas/finetune.mf`` ``training.frozen`` (MemEst's ``freeze``:
no gradients, no optimizer states, no backward of the frozen module); memform's side is ``memform import hf``
of the same config.json with ``training.frozen`` set.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .hf import BASE, HFCase, Step
from .hf import measure as _measure

#: memform's training.frozen names -> the transformers Llama modules frozen
MODULES = {"embedding": "model.embed_tokens", "output": "lm_head"}


@dataclass(frozen=True)
class FrozenCase(HFCase):
    """An :class:`~.hf.HFCase` whose ``frozen`` modules (``training.frozen`` names) take no gradient."""

    frozen: tuple[str, ...] = ("embedding",)

    def label(self) -> str:
        return super().label().replace("hf llama", f"hf llama frozen[{'+'.join(self.frozen)}]", 1)

    def build_model(self, dtype: Any) -> Any:
        model = super().build_model(dtype)
        for name in self.frozen:
            model.get_submodule(MODULES[name]).weight.requires_grad_(False)
        return model

    def overrides(self) -> dict[str, Any]:
        return {**super().overrides(), "training.frozen": list(self.frozen)}


def measure(case: FrozenCase, seed: int = 0) -> Step:
    """:func:`.hf.measure` of the case (warm-up step, then the traced one)."""
    return _measure(case, seed)


F = FrozenCase(**{k: getattr(BASE, k) for k in ("h", "L", "heads", "kv_heads", "ffn", "vocab", "b", "s")})
CASES = [F, replace(F, dtype="bf16"), replace(F, dtype="amp-bf16"), replace(F, gc=True),
         replace(F, frozen=("output",)), replace(F, frozen=("output",), dtype="bf16"),
         replace(F, frozen=("embedding", "output"), dtype="amp-bf16"), replace(F, attn="eager", dtype="bf16")]


def sweep() -> list[FrozenCase]:
    return CASES


def quick_sweep() -> list[FrozenCase]:
    return CASES[:2]
