"""Gradient clipping (issue 30; MemEst's ``has_clip``): what PyTorch's ``clip_grad_norm_`` allocates --
measured, one scalar per gradient, nothing gradient-sized -- and ``training.grad_clip`` (finetune.mf), which
counts MemEst's buffer (the parameters at the optimizer's width, instead of the activations when larger)
only with ``frameworks/clip-copy.mf`` (a framework whose clipping copies the gradients).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import memform

ROOT = Path(__file__).resolve().parent.parent
ONE = {"parallel.tp": 1, "parallel.pp": 1, "parallel.sequence_parallel": False, "parallel.dp": 1,
       "parallel.distributed_optimizer": False}


@pytest.mark.parametrize("foreach", [True, False])
def test_torch_clip_grad_norm_allocates_scalars_only(foreach):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install '.[test]')")
    from memform.validation.samples import StorageSamples

    params = [torch.nn.Parameter(torch.randn(256, 256, dtype=torch.bfloat16)) for _ in range(6)]
    params.append(torch.nn.Parameter(torch.randn(256)))
    for p in params:
        p.grad = torch.randn_like(p)
    trace = StorageSamples(ignore=[t.untyped_storage() for p in params for t in (p, p.grad)])
    with trace.mode:
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=foreach)
    peak, _ = trace.peak(lambda serial: True)
    # six bf16 norms and one fp32 norm (16 bytes), their stack as fp32 (28) and the total norm (4): 48 bytes
    # for 786,688 bytes of gradients
    assert peak == 48


def test_grad_clip_costs_nothing_in_place_and_memest_buffer_with_clip_copy_mf(tmp_path):
    cfg = ROOT / "configs" / "llama3-8b.yaml"
    over = {**ONE, "training.recompute": "full"}
    base = memform.estimate(cfg, over).stages[0]
    clip = memform.estimate(cfg, {**over, "training.grad_clip": True}).stages[0]
    assert clip.values == base.values
    # clipping that copies the gradients (frameworks/clip-copy.mf): MemEst's buffer, params · bytes_os (fp32), replaces the
    # activations and buffers of the forward/backward moment when larger
    import yaml

    data = yaml.safe_load(cfg.read_text())
    data["formulas"] = [*data.get("formulas", ["dense.mf"]), "frameworks/clip-copy.mf"]
    data.setdefault("training", {})["grad_clip"] = True
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    est = memform.estimate(tmp_path / "c.yaml", over).stages[0]
    n = base.param_count
    dynamic = base.values["activations"] + base.values["comm"]
    assert est.values["runtime"] - base.values["runtime"] == pytest.approx(max(0, 4 * n - dynamic), rel=1e-9)
    assert est.values["runtime"] > base.values["runtime"]
