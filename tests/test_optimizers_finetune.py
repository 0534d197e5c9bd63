"""8-bit AdamW and Adafactor for every profile built on common.mf (issue 30): their states per trained
parameter (common.mf moment_bytes, finetune.mf af_vec / small_params), measured against the optimizers
themselves on the PyTorch harness (memform.validation.measure: every tensor in ``optimizer.state`` after
one step, plus the fp32 master copies of a bf16-mixed model).

Sources: bitsandbytes 0.50 optim/optimizer.py Optimizer2State.init_state (uint8 state1 / state2, an fp32
absmax1 / absmax2 per 256 values, fp32 states for tensors under min_8bit_size = 4096 values, the qmap1 /
qmap2 tables shared by all parameters: 2 × 256 fp32); torch/optim/_adafactor.py (row_var r×1, col_var 1×c
per matrix, variance per vector, a 0-dim fp32 ``step`` per parameter: not counted by memform).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import memform
from memform.errors import MemformError

ROOT = Path(__file__).resolve().parent.parent
ONE = {"parallel.tp": 1, "parallel.pp": 1, "parallel.sequence_parallel": False, "parallel.dp": 1,
       "parallel.distributed_optimizer": False}


@pytest.mark.parametrize("keys, per_param", [
    ({}, 12),                                                       # fp32 master + two fp32 moments (ZeRO K = 12)
    # master + two uint8 moments + two fp32 absmax per 256 values: 4 + 2·(1 + 4/256)
    ({"training.optimizer": "adamw8bit"}, 4 + 2 * (1 + 4 / 256)),
    # bitsandbytes before 0.44: blocks of 2048
    ({"training.optimizer": "adamw8bit", "training.optimizer_block_size": 2048}, 4 + 2 * (1 + 4 / 2048)),
])
def test_8bit_adamw_bytes_per_parameter(keys, per_param):
    # Llama-3-8B (h 4096: no tensor under 4096 values, every state 8-bit)
    est = memform.estimate(ROOT / "configs" / "llama3-8b.yaml", {**ONE, **keys}).stages[0]
    assert est.values["optimizer"] == pytest.approx(per_param * est.param_count, rel=1e-12)


def test_adafactor_keeps_a_row_and_a_column_per_matrix():
    # Llama-3-8B (h 4096, kv 1024, f 14336, v 128256, untied, separate gate/up in transformers' eager
    # SwiGLU): per layer (4096+4096) + 2·(1024+4096) + (4096+4096) + 3·(14336+4096) + 2·4096 norms;
    # embedding and head v + h each, final norm h; over the fp32 master copy (4 bytes per parameter)
    over = {**ONE, "training.optimizer": "adafactor", "model.swiglu_impl": "eager"}
    est = memform.estimate(ROOT / "configs" / "llama3-8b.yaml", over).stages[0]
    layer = 8192 + 2 * 5120 + 8192 + 3 * 18432 + 2 * 4096
    vectors = 32 * layer + 2 * (128256 + 4096) + 4096
    assert est.values["optimizer"] == 4 * est.param_count + 4 * vectors


def test_adafactor_with_tensor_parallelism_is_refused():
    with pytest.raises(MemformError, match="adafactor is modelled without tensor parallelism"):
        memform.estimate(ROOT / "configs" / "llama3-8b.yaml", {"training.optimizer": "adafactor"})


torch = pytest.importorskip("torch", reason="PyTorch (the test extra) is not installed")

from memform.validation.compare import Point  # noqa: E402
from memform.validation.measure import measure_step  # noqa: E402

#: Point(L=2): 19 parameter tensors (embedding, head, final norm, 2 × [2 norms, q, k, v, o, fc1, fc2])
TENSORS = 19


@pytest.mark.parametrize("precision", ["bf16-mixed", "fp32"])
@pytest.mark.parametrize("h, head_dim, optimizer, extra", [
    # torch.optim.Adafactor: + its 0-dim fp32 step per tensor
    (64, 16, "adafactor", 4 * TENSORS),
    (128, 32, "adafactor", 4 * TENSORS),
    # bitsandbytes AdamW8bit: + the two 256-value fp32 quantization maps every parameter shares; h 128: every
    # matrix has >= 4096 values (k: 128 × 64), the norms (128) keep fp32 states -- both counted exactly
    (128, 32, "adamw8bit", 2 * 256 * 4),
])
def test_optimizer_states_measured_equal_the_formula(precision, h, head_dim, optimizer, extra):
    if optimizer == "adamw8bit":
        pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (pip install '.[test]')")
    cfg = Point(L=2, h=h, head_dim=head_dim, precision=precision).config()
    cfg["training"]["optimizer"] = optimizer
    measured = measure_step(cfg, precision).optimizer
    assert measured == memform.estimate(cfg).stages[0].values["optimizer"] + extra
