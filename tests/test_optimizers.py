"""Optimizers other than Adam (issue 30): what each keeps per trained parameter (common.mf `optimizer`),
measured against torch.optim itself on the PyTorch harness (memform.validation.measure: every tensor in
``optimizer.state`` after one step, plus the fp32 master copies of a bf16 model).

Sources: torch/optim/sgd.py (one ``momentum_buffer`` unless momentum is 0), torch/optim/_muon.py (one
``momentum_buffer``, 2-D parameters only: the embedding, head and norms go to AdamW, Liu et al. 2025
§2.2), torch/optim/adamw.py (``exp_avg``, ``exp_avg_sq`` and a 0-dim fp32 ``step`` per parameter, which
memform does not count: 4 bytes per parameter tensor).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import memform
from memform.errors import MemformError

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("torch", reason="PyTorch (the test extra) is not installed")

from memform.validation.compare import Point  # noqa: E402
from memform.validation.measure import measure_step  # noqa: E402

#: AdamW's 0-dim ``step`` tensor, one per parameter it updates (torch/optim/adamw.py _init_group)
STEP = 4


@pytest.mark.parametrize("precision", ["bf16-mixed", "fp32"])
@pytest.mark.parametrize("keys, adam_tensors", [
    ({}, 19),                                            # every one of the 19 parameter tensors
    ({"optimizer": "sgd"}, 0),
    ({"optimizer": "sgd", "sgd_momentum": 0}, 0),
    ({"optimizer": "muon"}, 7),                          # embedding, head, final norm, 2 norms × 2 layers
])
def test_optimizer_states_measured_equal_the_formula(precision, keys, adam_tensors):
    point = Point(L=2, precision=precision)
    cfg = point.config()
    cfg["training"].update(keys)
    measured = measure_step(cfg, precision).optimizer
    assert measured == memform.estimate(cfg).stages[0].values["optimizer"] + STEP * adam_tensors


def test_optimizer_moments_per_parameter():
    # llama3-8b on one stage: Adam 12 bytes per parameter (fp32 master + 2 moments: ZeRO §3.1's K = 12),
    # SGD with momentum and Lion 8, SGD without momentum 4 (the master copy only)
    base = {"parallel.tp": 1, "parallel.pp": 1, "parallel.sequence_parallel": False, "parallel.dp": 1,
            "parallel.distributed_optimizer": False}
    n = memform.estimate(ROOT / "configs" / "llama3-8b.yaml", base).stages[0].param_count
    for keys, per in (({}, 12), ({"training.optimizer": "sgd"}, 8), ({"training.optimizer": "lion"}, 8),
                      ({"training.optimizer": "sgd", "training.sgd_momentum": 0}, 4)):
        est = memform.estimate(ROOT / "configs" / "llama3-8b.yaml", {**base, **keys})
        assert est.stages[0].values["optimizer"] == per * n, keys


def test_profiles_that_model_adam_only_refuse_another_optimizer():
    with pytest.raises(MemformError, match="deepspeed profile models DeepSpeed's Adam"):
        memform.estimate(ROOT / "configs" / "llama2-7b.yaml",
                         {"training.framework": "deepspeed", "training.optimizer": "sgd"})


def test_megatron_optimizer_flags_are_imported(tmp_path):
    from cli_helpers import run_memform as run

    args = tmp_path / "args.txt"
    common = ("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 512 "
              "--max-position-embeddings 512 --micro-batch-size 1 --global-batch-size 8 --swiglu --bf16 "
              "--vocab-size 1024 ")
    args.write_text(common + "--optimizer sgd --sgd-momentum 0.8\n")
    out = tmp_path / "out.yaml"
    r = run("import", "megatron", str(args), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "optimizer: sgd" in out.read_text() and "sgd_momentum: 0.8" in out.read_text()
    args.write_text(common + "--optimizer adafactor\n")
    r = run("import", "megatron", str(args), "-o", str(out))
    assert r.returncode == 2 and "--optimizer" in r.stderr and "adafactor" in r.stderr
