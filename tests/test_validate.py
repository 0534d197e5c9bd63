"""memform's estimates against real PyTorch training steps (CPU), a small subset of bench/validate.py.

The expected numbers are measurements: each case builds the model from the memform config, runs a
training step and counts live storages (memform/validation/measure.py). Skipped, with the reason
shown by ``-ra``, only when PyTorch is not installed (it is part of the ``test`` extra).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch (the 'validate' extra) is not installed")

import memform  # noqa: E402
from memform.validation.compare import THRESHOLDS, Point, Row, compare  # noqa: E402
from memform.validation.measure import measure_step  # noqa: E402
from memform.validation.sweep import BASE, quick_amp_sweep, quick_sweep  # noqa: E402
from memform.validation.timeline import StorageTimeline  # noqa: E402
from memform.validation.torch_models import _RMSNormFn, _SwiGLUFn, build  # noqa: E402
from memform.validation.tracker import LiveStorages  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=None)
def measured_activations(point: Point) -> int:
    """One measured training step per point for the whole module (they are deterministic)."""
    return measure_step(point.config(), point.precision).activations


def test_tracker_counts_a_shared_storage_once_and_forgets_freed_ones():
    x = torch.ones(16, 16)
    with LiveStorages() as tr:
        y = x * 2                      # new 1 KiB storage
        view = y.view(256)             # same storage: counted once
        z = torch.sin(x)               # another 1 KiB
    assert tr.alive_bytes() == 2 * 16 * 16 * 4
    del y, z
    assert tr.alive_bytes() == 16 * 16 * 4    # `view` keeps y's storage alive; z's is gone
    del view
    assert tr.alive_bytes() == 0


def test_timeline_peak_counts_what_was_live_at_once():
    x = torch.ones(16, 16)                       # made before tracing: not counted
    with StorageTimeline(ignore=[x.untyped_storage()]) as tl:
        y = x * 2                                # op 1: +1 KiB
        z = torch.sin(y)                         # op 2: +1 KiB -> 2 KiB live
        del y
        w = torch.cos(z)                         # op 3: y is gone -> 2 KiB
        big = torch.zeros(64, 64)                # op 4: +16 KiB -> 18 KiB
        x.add_(1)                                # op 5: in place on an ignored storage
        del big, w, z
        v = torch.ones(8)                        # op 6: 32 B
    assert tl.live_bytes() == [1024, 2048, 2048, 2048 + 16384, 2048 + 16384, 32]
    assert tl.peak() == (2048 + 16384, 4)
    assert tl.live_at(4) == {"zeros": 16384, "sin": 1024, "cos": 1024}
    grads = tl.serials([v.untyped_storage()])    # classed afterwards, e.g. as a gradient
    assert tl.live_bytes(exclude=grads)[-1] == 0


def test_eager_cross_entropy_backward_holds_two_fp32_logit_gradients():
    # PyTorch's F.cross_entropy = log_softmax + nll_loss (derivatives.yaml): nll_loss_backward writes
    # the fp32 gradient of the log-probs, _log_softmax_backward_data the logits' while it is live; with
    # v ≫ h that is the peak of the step: exactly 2 · 4 · s·b·v bytes over what forward saved
    m = measure_step(BASE.config(), BASE.precision)
    assert m.peak_phase == "backward"
    assert m.activations_peak - m.activations == 2 * 4 * BASE.s * BASE.b * BASE.vocab


def test_validation_catches_a_backward_moment_without_the_layer_transients():
    # MemEst's 1F1B backward moment (warm-up + the stage's last layer's act[none], _bwd_overhead.py)
    # misses the recomputed decoder layer and its gradients once a decoder layer sets the peak
    point = dataclasses.replace(BASE, vocab=128, h=256, recompute="full")
    row = compare(point)
    stage = memform.estimate(point.config()).stages[0]
    last = stage.layers[-1]
    assert last.block == "output"
    memest = dict(row.estimated, activations_peak=stage.moments["warmup"] + int(last.per_layer_values["activations"]))
    assert not row.failures()
    assert Row(point, row.measured, memest).failures() == ["activations_peak"]


def test_hand_written_backward_functions_are_correct():
    # the fused-kernel stand-ins must train like the real thing: finite differences in float64
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: _RMSNormFn.apply(x, w, 1e-5), (x, w))
    ab = torch.randn(3, 5, 12, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_SwiGLUFn.apply, (ab,))


@pytest.mark.parametrize("point", quick_sweep(), ids=lambda p: p.label().replace(" ", "-"))
def test_estimate_matches_measured_step(point):
    row = compare(point)
    errors = {c: f"{row.error(c):+.2%}" for c in THRESHOLDS}
    assert not row.failures(), f"{point.label()}: {errors}; alive after forward by op: {row.activations_by_op}"


@pytest.mark.parametrize("point", [BASE, dataclasses.replace(BASE, experts=4)], ids=["dense", "moe"])
def test_parameter_count_is_exact(point):
    cfg = point.config()
    model = build(cfg, torch.bfloat16)
    assert memform.estimate(cfg).stages[0].param_count == sum(p.numel() for p in model.parameters())


def test_recompute_modes_keep_less():
    base = dataclasses.replace(BASE, flash=False)
    act = {mode: measured_activations(dataclasses.replace(base, recompute=mode)) for mode in ("none", "selective", "full")}
    assert act["none"] > act["selective"] > act["full"] > 0


def test_eager_swiglu_keeps_one_more_f_wide_tensor_per_layer():
    # autograd's saving rules (derivatives.yaml): silu keeps its input, mul both factors, so eager
    # silu(gate) * up keeps silu(gate) on top of the fused kernel's [gate | up] and output
    fused = measured_activations(BASE)
    eager = measured_activations(dataclasses.replace(BASE, swiglu_impl="eager"))
    assert eager - fused == BASE.L * 2 * BASE.s * BASE.b * BASE.ffn   # bf16: 2 bytes


def test_validation_catches_a_formula_that_ignores_the_eager_swiglu():
    eager = dataclasses.replace(BASE, swiglu_impl="eager")
    measured = measure_step(eager.config()).as_dict()
    stage = memform.estimate(BASE.config()).stages[0]      # the fused formula for an eager model
    wrong = {c: stage.values[c] for c in ("params", "grads", "optimizer")}
    wrong["activations"] = getattr(stage, "moments", {}).get("warmup", stage.values["activations"])
    assert Row(eager, measured, wrong).failures() == ["activations"]


def load_bench():
    """bench/validate.py as a module (run in-process: a subprocess would pay PyTorch's import again)."""
    spec = importlib.util.spec_from_file_location("validate_bench", ROOT / "bench" / "validate.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_bench_script_runs_and_reports(capsys):
    assert load_bench().main(["--quick", "--only", "L3"]) == 0
    out = capsys.readouterr().out
    assert "1 cases" in out and "0 over their bounds" in out and "activations" in out and "act. peak" in out


def test_bench_script_exits_1_when_an_estimate_is_off(monkeypatch, capsys):
    bench = load_bench()
    import memform.validation.compare as cmp

    def off_by_a_fifth(point: Point) -> Row:
        row = compare(point)
        row.estimated["params"] = int(row.measured["params"] * 1.2)
        return row

    monkeypatch.setattr(cmp, "compare", off_by_a_fifth)
    assert bench.main(["--quick", "--only", "full"]) == 1
    assert "FAIL" in capsys.readouterr().out


# ---- PyTorch AMP (the HF Trainer's bf16=True: fp32 model, forward under autocast) vs frameworks/hf-trainer.mf

@pytest.mark.parametrize("point", quick_amp_sweep(), ids=lambda p: p.label().replace(" ", "-"))
def test_amp_estimate_matches_measured_step(point):
    row = compare(point)
    errors = {c: f"{row.error(c):+.2%}" for c in THRESHOLDS}
    assert not row.failures(), f"{point.label()}: {errors}; alive after forward by op: {row.activations_by_op}"


def test_autocast_forward_ends_with_every_checkpointed_layers_weight_copies():
    # autocast caches the bf16 cast of every fp32 weight until the autocast region exits; checkpointed
    # (MoE) layers keep nothing else, so the step peaks at the forward's end: what forward leaves saved,
    # plus a bf16 copy of each Linear weight of the blocks, plus the fp32 logits the loss reads
    point = dataclasses.replace(BASE, precision="amp-bf16", experts=4, recompute="full")
    cfg = point.config()
    m = measure_step(cfg, point.precision)
    model = build(cfg, torch.float32)
    copies = 2 * sum(mod.weight.numel() for mod in model.blocks.modules() if isinstance(mod, torch.nn.Linear))
    assert m.peak_phase == "forward"
    assert m.activations_peak == m.activations + copies + 4 * point.s * point.b * point.vocab
    stage = memform.estimate(cfg).stages[0]
    assert stage.peak_moment == "forward_end"
    assert abs(stage.moments["forward_end"] - m.activations_peak) / m.activations_peak < 0.001


def test_bench_script_runs_the_amp_cases(capsys):
    assert load_bench().main(["--amp", "--quick", "--only", "moe"]) == 0
    out = capsys.readouterr().out
    assert "1 cases" in out and "amp-bf16" in out and "0 over their bounds" in out
