"""torch.optim.Muon on a transformers model's step: the ground truth for ``hf_trainer.optim: muon``
(formulas/frameworks/hf-trainer.mf: Muon's momentum buffers, the AdamW moments beside them, and the optimizer
step's Newton-Schulz temporaries).

The split is Moonlight's (Liu et al. 2025, "Muon is Scalable for LLM Training", §2.2): torch 2.13's
``torch.optim.Muon`` (its defaults: momentum 0.95, Nesterov, 5 Newton-Schulz steps) on every 2-D parameter of
the decoder layers, ``torch.optim.AdamW`` on the rest (embedding, head, norms) -- ``foreach`` as torch
defaults it on CUDA, or single-tensor as on the CPU. The model and the traced forward / backward are the
transformers harness's (:mod:`.hf`); the optimizer step that follows the traced one is traced too: its
``step`` row is the weights, gradients and states live through it plus the largest sum of the temporaries the
two optimizers make, held against memform's step moment (the stage's model bytes plus its
``optimizer_step`` runtime block, which a case here is shaped to make positive: a short sequence and a wide
MLP, so that the step, not the backward, is the stage's peak).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .hf import BASE, HFCase, Step
from .hf import measure as _measure

#: the step peak each built pair of optimizers measured, by the id of its first trained parameter
_STEP: dict[int, int] = {}


class _Pair:
    """Muon and AdamW stepped one after the other, as one optimizer for the harness (state, step, zero_grad);
    the second ``step`` (the one after the traced forward / backward) is traced."""

    def __init__(self, muon: Any, adamw: Any, key: int) -> None:
        self.muon, self.adamw, self.key, self.calls = muon, adamw, key, 0

    @property
    def state(self) -> dict:
        return {**self.muon.state, **self.adamw.state}

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        self.calls += 1
        if self.calls != 2:
            self.muon.step()
            self.adamw.step()
            return
        from ..samples import StorageSamples

        # the storages the step updates in place (weights, gradients, states) are not its temporaries
        held = [t for opt in (self.muon, self.adamw) for g in opt.param_groups for p in g["params"]
                for t in (p, p.grad) if t is not None]
        held += [t for st in self.state.values() for t in st.values() if hasattr(t, "untyped_storage")]
        trace = StorageSamples([t.untyped_storage() for t in held])
        with trace.mode:
            self.muon.step()
            self.adamw.step()
        _STEP[self.key] = trace.peak(lambda serial: True)[0]


@dataclass(frozen=True)
class MuonCase(HFCase):
    """An :class:`~.hf.HFCase` stepped by torch.optim.Muon + torch.optim.AdamW (``adamw``: foreach or single)."""

    adamw: str = "foreach"

    def label(self) -> str:
        return super().label().replace("hf ", f"hf optim=muon+adamw-{self.adamw} ", 1).replace(
            " b", f" f{self.ffn} v{self.vocab} b", 1)

    def optimizer(self, trained: list[Any]) -> Any:
        import torch

        names = {id(p): n for n, p in self._model.named_parameters()}
        hidden = [p for p in trained if p.ndim == 2 and ".layers." in names[id(p)]]
        rest = [p for p in trained if not (p.ndim == 2 and ".layers." in names[id(p)])]
        muon = torch.optim.Muon(hidden, lr=1e-3)
        adamw = torch.optim.AdamW(rest, lr=1e-3, foreach=self.adamw == "foreach")
        return _Pair(muon, adamw, id(trained[0]))

    def build_model(self, dtype: Any) -> Any:
        model = super().build_model(dtype)
        object.__setattr__(self, "_model", model)      # optimizer() reads the parameter names
        return model

    def overrides(self) -> dict[str, Any]:
        return {**super().overrides(), "hf_trainer.optim": "muon", "hf_trainer.muon_adamw": self.adamw}


def measure(case: MuonCase) -> Step:
    """The transformers harness's step, with the traced optimizer step as ``step``: the static bytes through
    it (weights, gradients, states) plus its temporaries' peak."""
    step = _measure(case)
    first = next(p for p in case._model.parameters() if p.requires_grad)
    temps = _STEP.pop(id(first))
    m = step.measured
    step.measured["step"] = m["params"] + m["grads"] + m["optimizer"] + temps
    return step


#: a short sequence, one row and a wide MLP (h 128 -> f 704: Muon's largest matrix) over a small vocabulary, so
#: that the optimizer step is the step's peak: fp32 and bf16, both AdamW implementations
SHAPE = replace(BASE, s=16, b=1, ffn=704, vocab=256)
CASES = [MuonCase(**{**SHAPE.__dict__, "adamw": a, "dtype": d}) for d in ("fp32", "bf16") for a in ("foreach", "single")]
#: ... and a large vocabulary beside a narrow MLP, where AdamW's step on the embedding and head (their second
#: moments' foreach copy, or one table's sqrt and quotient) outgrows Muon's
WIDE_VOCAB = replace(BASE, s=16, b=1, vocab=4096)
CASES += [MuonCase(**{**WIDE_VOCAB.__dict__, "adamw": a}) for a in ("foreach", "single")]


def sweep() -> list[MuonCase]:
    return list(CASES)


def quick_sweep() -> list[MuonCase]:
    return CASES[:1]
