"""Reference numbers for dense transformers, each from a cited public source.

- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
  (arXiv:2205.05198): §4.1 eq. (1), §4.2.1 eq. (2), §4.2.2 eq. (4), Table 2, §4.2.3.
- Megatron-LM ``megatron/training/theoretical_memory_usage.py``
  (compute_weight_and_optimizer_memory): 18 bytes/param, or 6 + 12/dp with the distributed optimizer.
- Rajbhandari et al. 2020, "ZeRO" (arXiv:1910.02054) §5 / Figure 1: model states per device
  16Ψ, 4Ψ + 12Ψ/Nd, 2Ψ + 14Ψ/Nd, 16Ψ/Nd (fp16 params and grads, K = 12).
"""

from __future__ import annotations

import pytest

import memform
from estimate_helpers import numbers  # numbers only: the numeric path (tests/test_numeric.py ties it to sympy's)

s, b, h, a, L, v = 2048, 1, 12288, 96, 96, 51200


def decoder_act(est, stage: int = 0) -> int:
    """Per-layer activation bytes of one decoder layer (one micro-batch) on ``stage``."""
    [layer] = [l for l in est.stages[stage].layers if l.block == "decoder"]
    return layer.per_layer_values["activations"]


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_eq1_no_parallelism(gpt3, t):
    # eq. (1): sbh(34 + 5as/h) per layer; with tp only (no SP), eq. (2): sbh(10 + 24/t + 5as/(ht))
    gpt3["parallel"]["tp"] = t
    est = numbers(gpt3)
    expected = s * b * h * (10 + sympy_frac(24, t) + sympy_frac(5 * a * s, h * t))
    assert decoder_act(est) == expected
    if t == 1:
        assert decoder_act(est) == s * b * h * (34 + sympy_frac(5 * a * s, h))


@pytest.mark.parametrize("t", [2, 4, 8])
def test_korthikanti_eq4_tensor_and_sequence_parallel(gpt3, t):
    # eq. (4): sbh/t · (34 + 5as/h)
    gpt3["parallel"].update(tp=t, sequence_parallel=True)
    est = numbers(gpt3)
    assert decoder_act(est) == sympy_frac(s * b * h, t) * (34 + sympy_frac(5 * a * s, h))


@pytest.mark.parametrize("t", [1, 8])
def test_korthikanti_table2_selective_and_full(gpt3, t):
    # Table 2 (TP + SP rows): selective 34sbh/t, full 2sbh/t per layer
    gpt3["parallel"].update(tp=t, sequence_parallel=t > 1)
    sel = numbers(gpt3, {"training.recompute": "selective"})
    full = numbers(gpt3, {"training.recompute": "full"})
    assert decoder_act(sel) == 34 * s * b * h / sympy_frac(t, 1)
    assert decoder_act(full) == 2 * s * b * h / sympy_frac(t, 1)


def test_korthikanti_first_stage_independent_of_p(gpt3):
    # §4.2.3: with 1F1B the first stage holds p micro-batches of L/p layers, so its transformer-layer
    # activations are sbhL/t·(34 + 5as/h) whatever p is.
    gpt3["parallel"].update(tp=8, sequence_parallel=True)
    gpt3["training"]["num_micro_batches"] = 16
    totals = []
    for p in (1, 2, 4, 8):
        est = numbers(gpt3, {"parallel.pp": p})
        [layer] = [l for l in est.stages[0].layers if l.block == "decoder"]
        totals.append(layer.inflight_value * layer.count_value * layer.per_layer_values["activations"])
        assert layer.inflight_value == p
    expected = sympy_frac(s * b * h * L, 8) * (34 + sympy_frac(5 * a * s, h))
    assert totals == [expected] * 4


def test_korthikanti_first_stage_symbolic_has_no_p(gpt3):
    # the same statement for the closed form: the decoder part of stage 0 does not contain p
    gpt3["parallel"].update(tp=8, pp=4, sequence_parallel=True)
    est = memform.estimate(gpt3)
    [layer] = [l for l in est.stages[0].layers if l.block == "decoder"]
    import sympy
    term = sympy.simplify(layer.inflight * layer.count * layer.per_layer["activations"])
    assert "p" not in {str(x) for x in term.free_symbols}


def megatron_weight_and_optimizer_bytes(*, h, L, f, v, a, g, p, t, dp, dist_opt, norm_size=2):
    """Megatron-LM theoretical_memory_usage.compute_weight_and_optimizer_memory, restated."""
    layer = 2 * h * (f + norm_size) + 2 * h * h * (1 + g / a)
    block = layer * L + norm_size * h
    embedding = h * v
    shard = (block / p + embedding) / t
    per_param = 18 if not dist_opt else 6 + 12 / dp
    return shard * per_param


@pytest.mark.parametrize("dist_opt", [False, True])
def test_megatron_weights_and_optimizer_gpt3_175b(dist_opt):
    # configs/gpt3-175b.yaml (t = 8, p = 8, dp = 8). memform also counts GPT-3's learned position
    # embedding (s·h, replicated) and the linear biases, which Megatron's estimate leaves out: < 1%.
    est = numbers("configs/gpt3-175b.yaml", {"parallel.distributed_optimizer": dist_opt})
    ref = megatron_weight_and_optimizer_bytes(h=h, L=L, f=4 * h, v=v, a=a, g=a, p=8, t=8, dp=8,
                                              dist_opt=dist_opt)
    ours = est.stages[0].static_bytes
    assert abs(ours - ref) / ref < 0.01
    # the bytes per parameter themselves are exact: 18, or 6 + 12/dp
    per_param = ours / est.stages[0].param_count
    assert per_param == pytest.approx(18 if not dist_opt else 6 + 12 / 8, rel=1e-9)


@pytest.mark.parametrize("zero, coeff", [
    (0, lambda psi, nd: 16 * psi),
    (1, lambda psi, nd: 4 * psi + sympy_frac(12 * psi, nd)),
    (2, lambda psi, nd: 2 * psi + sympy_frac(14 * psi, nd)),
    (3, lambda psi, nd: sympy_frac(16 * psi, nd)),
])
def test_zero_paper_model_states(gpt3, zero, coeff):
    # ZeRO §5 / Fig. 1, fp16 params + fp16 grads + fp32 (master, momentum, variance): K = 12
    nd = 64
    cfg = gpt3 | {"parallel": {"dp": nd, "tp": 1, "pp": 1, "zero": zero}}
    cfg["training"] = dict(gpt3["training"], precision={"params": "fp16", "grads": "fp16"})
    est = numbers(cfg)
    psi = est.stages[0].param_count
    expected = coeff(psi, nd)
    assert abs(est.stages[0].static_bytes - expected) <= 3  # each of 3 categories rounds up < 1 byte


def test_zero_paper_figure1_numbers():
    # Fig. 1: Ψ = 7.5B, Nd = 64 → 120 GB, 31.4 GB, 16.6 GB, 1.9 GB. Build a model of exactly 7.5B
    # per-device params is awkward, so check the per-parameter factors our formulas produce instead.
    psi, nd = 7.5e9, 64
    cfg = {"model": {"hidden_size": 4096, "num_heads": 32, "num_layers": 8, "vocab_size": 32000,
                     "seq_length": 1024},
           "parallel": {"dp": nd}, "training": {"precision": {"params": "fp16", "grads": "fp16"}}}
    got = []
    for zero in range(4):
        est = numbers(cfg, {"parallel.zero": zero})
        st = est.stages[0]
        got.append(round(st.static_bytes / st.param_count * psi / 1e9, 1))
    assert got == [120.0, 31.4, 16.6, 1.9]


def sympy_frac(n, d):
    import sympy
    return sympy.Rational(n, d)
