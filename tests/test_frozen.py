"""Frozen parameters (issue 30; MemEst's ``freeze``, memest-formulas.md §2.3): ``training.frozen``
(formulas/finetune.mf) -- a frozen word embedding or output head has no gradient and no optimizer state,
and a frozen head keeps no input; measured against transformers with ``requires_grad_(False)`` on
``model.embed_tokens`` / ``lm_head`` (validation/frameworks/hf_frozen.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import memform
from memform.errors import MemformError

ROOT = Path(__file__).resolve().parent.parent
ONE = {"parallel.tp": 1, "parallel.pp": 1, "parallel.sequence_parallel": False, "parallel.dp": 1,
       "parallel.distributed_optimizer": False}
#: Llama-3-8B's word embedding and head: 128256 × 4096 each (its config.json), untied
VH = 128256 * 4096


@pytest.mark.parametrize("frozen, frozen_params", [
    (["embedding"], VH), (["output"], VH), (["embedding", "output"], 2 * VH),
])
def test_frozen_parameters_have_no_gradients_or_optimizer_states(frozen, frozen_params):
    cfg = ROOT / "configs" / "llama3-8b.yaml"
    base = memform.estimate(cfg, ONE).stages[0].values
    est = memform.estimate(cfg, {**ONE, "training.frozen": frozen}).stages[0].values
    assert est["params"] == base["params"]                                 # still held
    assert base["grads"] - est["grads"] == 4 * frozen_params               # fp32 main grads (Megatron)
    assert base["optimizer"] - est["optimizer"] == 12 * frozen_params      # master + two moments (ZeRO K = 12)


def test_a_frozen_head_keeps_no_input():
    # the head's input, s·b·h at bytes_a, is saved only for its weight's gradient (derivatives.yaml mm)
    cfg = ROOT / "configs" / "llama3-8b.yaml"
    over = {**ONE, "training.recompute": "none"}
    base = memform.estimate(cfg, over).stages[0]
    est = memform.estimate(cfg, {**over, "training.frozen": ["output"]}).stages[0]
    s, b, h = 8192, 1, 4096
    assert base.moments["warmup"] - est.moments["warmup"] == 2 * s * b * h


def test_an_unknown_frozen_name_is_refused():
    with pytest.raises(MemformError, match="training.frozen"):
        memform.estimate(ROOT / "configs" / "llama3-8b.yaml", {**ONE, "training.frozen": ["decoder"]})


@pytest.mark.parametrize("index", [0, 4, 6])
def test_frozen_modules_measured_with_transformers(index):
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install '.[test]')")
    pytest.importorskip("transformers", reason="transformers is not installed (pip install '.[test]')")
    from memform.validation import frameworks
    from memform.validation.frameworks import hf_frozen

    case = hf_frozen.CASES[index]
    row = frameworks.compare(case, hf_frozen)
    for cat in ("params", "grads", "optimizer"):
        assert abs(row.error(cat)) <= 0.001, f"{case.label()}: {cat} {row.error(cat):+.2%}"
    # a frozen embedding leaves the first layer's first RMSNorm without its fp32 input copy (4h + 4 bytes
    # per token, not modelled: frameworks/hf-trainer/finetune.mf): over-estimated, by at most 3 %
    for cat in ("activations", "activations_peak"):
        assert -0.01 <= row.error(cat) <= 0.03, f"{case.label()}: {cat} {row.error(cat):+.2%}"
    # what transformers measured: no gradient and no AdamW state for the frozen matrices (1024 × 128)
    m = row.measured
    assert m["grads"] == m["params"] - len(case.frozen) * 1024 * 128 * (2 if case.dtype == "bf16" else 4)
