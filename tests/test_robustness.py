"""Determinism and scale: the same inputs give the same bytes, and huge models stay exact.

* ``--json`` output is byte-identical across runs and ``PYTHONHASHSEED`` values (nothing
  depends on set or dict iteration order of hashed objects).
* A 1T-parameter dense model at 1M-token sequences on 100k devices is evaluated in exact
  integers/rationals: every byte count equals the hand-computed integer.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import sympy

import memform
from cli_helpers import memform_command

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("args", [
    ["configs/deepseek-v2-lite.yaml", "--json", "--set", "parallel.pp=3", "--set", "parallel.vpp=3"],
], ids=["moe-mla-interleaved"])
def test_json_is_byte_identical_across_hash_seeds(args):
    procs = [subprocess.Popen([*memform_command(), "estimate", *args], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env={**os.environ, "PYTHONHASHSEED": seed})
             for seed in ("0", "1", "4242")]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err.decode()
    assert outs[0][0] and outs[0][0] == outs[1][0] == outs[2][0]


def test_repeated_estimates_in_one_process_are_identical():
    first = memform.estimate(ROOT / "configs" / "mixtral-8x7b.yaml").to_dict()
    assert memform.estimate(ROOT / "configs" / "mixtral-8x7b.yaml").to_dict() == first


# A dense 1T model: h = 25600, 160 heads, 128 layers, f = 4h (12·h²·128 ≈ 1.007e12 parameters,
# Narayanan et al. 2021 Table 1's 1T row has h = 25600, 160 heads, 128 layers); s = 2^20;
# 100,000 devices = dp 3125 × tp 4 × pp 8.
H, A, L, S, T, PP, M = 25600, 160, 128, 2 ** 20, 4, 8, 16
ONE_T = {
    "name": "dense-1t",
    "model": {"hidden_size": H, "num_heads": A, "num_layers": L, "ffn_hidden_size": 4 * H, "vocab_size": 128000,
              "seq_length": S, "activation": "gelu", "norm": "rmsnorm", "bias": False, "dropout": False,
              "flash_attention": True, "position_embedding": "rope"},
    "parallel": {"dp": 3125, "tp": T, "pp": PP, "sequence_parallel": True, "devices": 100_000},
    "training": {"micro_batch_size": 1, "num_micro_batches": M, "recompute": "full"},
}


def test_one_trillion_parameters_at_one_million_tokens_on_100k_devices_is_exact():
    est = memform.estimate(ONE_T)
    stage = est.stages[1]  # a middle stage: 16 decoder layers, no embedding or head
    layers = L // PP
    # per-layer parameters on one TP rank (Korthikanti §4 / Megatron): QKV + proj 4h²/t, MLP 2hf/t = 8h²/t,
    # two replicated RMSNorm weights 2h
    per_layer = 12 * H * H // T + 2 * H
    assert stage.param_count == layers * per_layer == 31_458_099_200
    # bf16 params (2 B), fp32 grads (4 B), fp32 master + two Adam moments (12 B), no ZeRO
    assert stage.values["params"] == 2 * layers * per_layer
    assert stage.values["grads"] == 4 * layers * per_layer
    assert stage.values["optimizer"] == 12 * layers * per_layer
    # sbh/t elements with SP; full recompute keeps each layer's input, 2sbh/t bytes (Korthikanti Table 2);
    # 1F1B stage 1 holds min(p - 1, m) = 7 micro-batches; the backward rebuilds one layer without
    # recompute: 32 sbh/t + 4as/t with flash attention, GeLU, MHA, no dropout (Korthikanti §4.1),
    # and its GeLU backward holds the gradients of its f-wide output and input less fc2's released input,
    # 2·s·f/t = 8 sbh/t, and the layer output's gradient, 2 sbh/t with SP (dense.mf mlp.bwd_grads, f = 4h)
    sbh_t = S * H // T
    act_full = 2 * sbh_t
    act_none = 32 * sbh_t + 4 * A * S // T
    bwd = 10 * sbh_t
    assert stage.values["activations"] == min(PP - 1, M) * layers * act_full + act_none + bwd == 1_785_263_554_560
    # the SP all-gather buffer holds the full 2sbh (Korthikanti §4.2.2)
    assert stage.values["comm"] == 2 * S * H
    assert stage.peak_bytes == sum(stage.values.values())
    # the closed form, evaluated exactly at the config, gives the same integer
    closed = sympy.sympify(est.to_dict(symbolic=True)["stages"][1]["symbolic"])
    values = {sympy.Symbol(s.name): v for s, v in est.model.bound.values.items()}
    assert sympy.ceiling(closed.xreplace(values)) == stage.peak_bytes


def test_beyond_float_precision_every_byte_counts():
    """Past 2^53 a float cannot tell n from n + 1; exact integers can."""
    big = memform.estimate({**ONE_T, "model": {**ONE_T["model"], "seq_length": 2 ** 40 + 1, "num_heads": 128},
                            "parallel": {"dp": 1, "tp": 1, "pp": 1}})
    act = big.stages[0].values["activations"]
    assert act > 2 ** 53
    bigger = memform.estimate({**ONE_T, "model": {**ONE_T["model"], "seq_length": 2 ** 40 + 2, "num_heads": 128},
                               "parallel": {"dp": 1, "tp": 1, "pp": 1}})
    # one more token adds exactly the per-token bytes, however large the total
    per_token = bigger.stages[0].values["activations"] - act
    even = memform.estimate({**ONE_T, "model": {**ONE_T["model"], "seq_length": 2 ** 40 + 3, "num_heads": 128},
                             "parallel": {"dp": 1, "tp": 1, "pp": 1}})
    assert even.stages[0].values["activations"] - bigger.stages[0].values["activations"] == per_token
    assert per_token > 0 and isinstance(act, int)


def test_irrational_formula_values_are_exact_and_prompt(tmp_path):
    """Square roots and log2 of non-powers stay exact sympy numbers; only the final byte count rounds
    up (this once went through simplify(), which could run for minutes on such sums)."""
    f = tmp_path / "irrational.mf"
    f.write_text('include "dense.mf"\n'
                 "block decoder extends layer { act[none, selective, full] = s * h * 2 ^ 0.5 + log2(h + 3) * 3 ^ 0.5 }\n")
    config = {"formulas": [str(f)], "model": {"hidden_size": 1024, "num_heads": 8, "num_layers": 2,
                                              "vocab_size": 4096, "seq_length": 512}}
    est = memform.estimate(config)
    layer = next(g for g in est.stages[0].layers if g.block == "decoder")
    want = 512 * 1024 * sympy.sqrt(2) + sympy.log(1027, 2) * sympy.sqrt(3)
    got = layer.per_layer_values["activations"]
    assert abs((got - want).evalf(60)) < sympy.Float("1e-40", 60)
    # two such layers, one micro-batch in flight, the embedding and head add whole bytes
    assert est.stages[0].values["activations"] >= sympy.ceiling(2 * want)


def test_error_messages_are_identical_across_hash_seeds():
    """Errors too: a cycle is reported from the same starting point under every hash seed."""
    procs = [subprocess.Popen([*memform_command(), "check", "tests/bad_inputs/cyclic_let_override.mf"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "PYTHONHASHSEED": seed}) for seed in ("0", "1", "4242")]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [2, 2, 2]
    assert b"cyclic definition: kv -> dh -> kv" in outs[0][1]
    assert outs[0][1] == outs[1][1] == outs[2][1]
