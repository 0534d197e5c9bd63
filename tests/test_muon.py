"""Muon as fine-tuning jobs run it (issue 30): ``hf_trainer.optim: muon`` (formulas/frameworks/hf-trainer.mf) --
torch.optim.Muon on the decoder layers' matrices, torch.optim.AdamW on the embeddings, head and norms
(Moonlight's split) -- held against torch 2.13's own optimizers on a transformers model's real step
(memform.validation.frameworks.hf_muon; the whole sweep: ``python bench/validate.py --frameworks --only
optim=muon``), the optimizer step's Newton-Schulz temporaries included."""

from __future__ import annotations

import importlib.util

import pytest

import memform
from cli_helpers import ROOT
from memform.importers import Options, import_config

LLAMA31 = ROOT / "tests" / "data" / "importers" / "hf" / "llama-3.1-8b.config.json"


def estimate(**sets):
    over = {"training.framework": "hf-trainer", "hf_trainer.optim": "muon", "training.precision.params": "bf16",
            "model.seq_length": 512, **sets}
    draft = import_config("hf", LLAMA31, Options(overrides=over))
    assert draft.load_error is None, draft.load_error
    return memform.estimate(draft.config()).stages[0]


def test_muon_keeps_one_momentum_and_adamw_two_moments_for_the_rest():
    # torch.optim.Muon: momentum_buffer = zeros_like(param) per matrix; torch.optim.AdamW: exp_avg, exp_avg_sq
    # for the embedding, the head and the norms (Llama-3.1-8B config.json: vocab 128256, hidden 4096, 32 layers;
    # 8,030,261,248 parameters: tests/test_import_hf_models.py), bf16 throughout
    n = 8_030_261_248
    adam = 2 * 128256 * 4096 + (2 * 32 + 1) * 4096
    assert estimate().values["optimizer"] == 2 * n + 2 * adam


def test_the_newton_schulz_step_can_set_the_peak():
    # a short step: the backward's activations are small, and the step's weights + gradients + states + the
    # largest matrix's Newton-Schulz temporaries (down_proj 14336 x 4096 in bf16: (2 + 4)·m·n + 4·4096²) set the
    # stage's peak through the runtime block optimizer_step
    stage = estimate(**{"model.seq_length": 16, "hf_trainer.muon_adamw": "fused"})
    static = stage.values["params"] + stage.values["grads"] + stage.values["optimizer"]
    ns = 6 * 14336 * 4096 + 4 * 4096 ** 2
    assert stage.runtime["optimizer_step"] > 0
    assert stage.model_bytes + stage.runtime["optimizer_step"] == static + ns


def test_muon_with_lora_is_refused():
    over = {"training.framework": "hf-trainer", "hf_trainer.optim": "muon", "lora.rank": 8}
    draft = import_config("hf", LLAMA31, Options(overrides=over))
    assert "hf_trainer.optim: muon is modelled for full fine-tuning" in (draft.load_error or "")


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
def test_torch_muon_measured_on_a_real_step():
    from memform.validation import frameworks
    from memform.validation.frameworks import hf_muon

    case = hf_muon.quick_sweep()[0]
    row = frameworks.compare(case, hf_muon)
    assert row.checked("step"), "the case must make the optimizer step the peak (runtime optimizer_step > 0)"
    over = [f"{c} {row.error(c):+.2%}" for c in row.failures()]
    assert not over, "\n" + frameworks.format_table([row])
