"""TrainingArguments ``optim`` as the Trainer builds it: the ground truth for ``hf_trainer.optim``
(formulas/frameworks/hf-trainer.mf state_bytes, frameworks/hf-trainer/finetune.mf).

The optimizer is the one ``Trainer.create_optimizer`` makes -- a real ``Trainer`` over the case's
transformers model with ``TrainingArguments(optim=...)``, so its two weight-decay groups, the optimizer
class ``get_optimizer_cls_and_kwargs`` picks (bitsandbytes ``AdamW(optim_bits=8)`` for ``adamw_8bit``,
transformers ``Adafactor``, torch ``SGD``, bitsandbytes ``Lion``) and, for bitsandbytes' 8-bit optimizers, the
``GlobalOptimManager`` override it registers for every ``nn.Embedding`` weight (``optim_bits: 32``: the
word embedding keeps fp32 moments; trainer.py create_optimizer) are all the Trainer's own. bitsandbytes
0.50.2's 8-bit AdamW runs on the CPU (its blockwise quantize / optimizer-update kernels have CPU
implementations), so the step is real; memform's side is ``memform import hf`` of the same config.json with
``hf_trainer.optim`` set.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from typing import Any

from .hf import ALL_LINEAR, BASE, HFCase, Step
from .hf import measure as _measure

#: the optimizer each built model's Trainer made, by the id of its first trained parameter (the harness
#: asks the case for an optimizer over the trained parameters after build_model)
_MADE: dict[int, Any] = {}


@dataclass(frozen=True)
class OptimCase(HFCase):
    """An :class:`~.hf.HFCase` whose optimizer is the Trainer's for TrainingArguments ``optim``."""

    optim: str = "adamw_8bit"
    #: PEFT LoRA rank of adapters added before the Trainer is made (its optimizer takes the adapters only);
    #: HFCase.lora_r stays 0 so that the harness does not wrap the model again
    adapter_r: int = 0

    def label(self) -> str:
        lora = f" lora{self.adapter_r}[all-linear]" if self.adapter_r else ""
        return super().label().replace("hf ", f"hf optim={self.optim} ", 1).replace(" b", f"{lora} b", 1)

    def build_model(self, dtype: Any) -> Any:
        import logging
        import warnings

        from transformers import Trainer, TrainingArguments

        model = super().build_model(dtype)
        if self.adapter_r:
            from peft import get_peft_model

            model = get_peft_model(model, self._lora())
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logging.getLogger("transformers").setLevel(logging.ERROR)
            args = TrainingArguments(output_dir=tmp, optim=self.optim, use_cpu=True, report_to=[],
                                     bf16=self.dtype == "amp-bf16", save_strategy="no")
            trainer = Trainer(model=model, args=args)
            opt = trainer.create_optimizer()
        first = next(p for p in model.parameters() if p.requires_grad)
        _MADE[id(first)] = getattr(opt, "optimizer", opt)    # accelerate may wrap it later; the raw one here
        return model

    def optimizer(self, trained: list[Any]) -> Any:
        return _MADE.pop(id(trained[0]))

    def overrides(self) -> dict[str, Any]:
        return {**super().overrides(), "hf_trainer.optim": self.optim}

    def _lora(self) -> Any:
        return replace(self, lora_r=self.adapter_r, lora_targets=ALL_LINEAR).lora_config()

    def memform_config(self) -> dict[str, Any]:
        if not self.adapter_r:
            return super().memform_config()
        from pathlib import Path

        from . import imported_config

        with tempfile.TemporaryDirectory() as tmp:
            self.hf_config().save_pretrained(tmp)
            self._lora().save_pretrained(tmp)          # adapter_config.json, as PEFT writes it
            return imported_config("hf", Path(tmp) / "config.json", self.label(), overrides=self.overrides(),
                                   adapter=str(Path(tmp) / "adapter_config.json"))


def measure(case: OptimCase, seed: int = 0) -> Step:
    """:func:`.hf.measure` of the case (warm-up step with the optimizer's first step, then the traced one).
    bitsandbytes' GlobalOptimManager is a process-wide singleton: the Trainer's embedding override stays in
    it, by (group, parameter) index too (optim/optimizer.py check_overrides: index2config), and a later
    8-bit optimizer in the same process would inherit it -- so it is cleared before and after the step."""
    _reset_bnb()
    try:
        return _measure(case, seed)
    finally:
        _reset_bnb()


def _reset_bnb() -> None:
    try:
        from bitsandbytes.optim import GlobalOptimManager
    except ImportError:
        return
    GlobalOptimManager.get_instance().initialize()


O = OptimCase(**{k: getattr(BASE, k) for k in ("h", "L", "heads", "kv_heads", "ffn", "vocab", "b", "s")})
#: 8-bit AdamW under the three dtype set-ups, with checkpointing, on a MoE, under LoRA; Adafactor and SGD as
#: the Trainer makes them. (Norms of h >= 4096 values, which reach bitsandbytes' min_8bit_size, are checked
#: against the formula in tests/test_trainer_import.py: a real step at h 4096 reads -31 % activation peak
#: with torch AdamW too, L1 h4096 f1024 s256 bf16, an hf-trainer gap of that shape, not the optimizer's.)
CASES = [O, replace(O, dtype="bf16"), replace(O, dtype="amp-bf16"), replace(O, gc=True),
         replace(O, model="mixtral", experts=4, top_k=2),
         # QLoRA-style: 8-bit AdamW over fp32 adapters on a bf16 base (the states do not follow the dtype)
         replace(O, adapter_r=8, dtype="bf16"),
         replace(O, optim="adafactor"), replace(O, optim="sgd"),
         # bitsandbytes Lion: one state, fp32 or 8-bit (the embedding again in 32 bits)
         replace(O, optim="lion_32bit", dtype="bf16"), replace(O, optim="lion_8bit")]


def sweep() -> list[OptimCase]:
    return CASES


def quick_sweep() -> list[OptimCase]:
    return CASES[:2]
