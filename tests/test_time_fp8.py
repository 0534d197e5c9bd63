"""FP8 GEMMs, grouped expert GEMMs, attention and memory-bound kernel efficiency, DualPipe (issue 33).

formulas/time.mf prices FP8 GEMMs with DeepGEMM's measured throughput (deepseek-ai/DeepGEMM README,
first release, H800), the routed experts' grouped GEMMs with per-expert row padding and shared waves, the
SMs DeepSeek-V3's all-to-all kernels hold (§3.2.2), DualPipe's bubble (DeepSeek-V3 Table 2), and the
attention and memory-bound kernels at the efficiencies measured in DeepSeek's training profile
(deepseek-ai/profile-data train.json). The expected numbers below are those sources' own, or the
formulas' terms evaluated by hand on a unit device (10^12 FLOP/s: compute picoseconds = FLOPs).
"""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest
from memform.engine.config import parse_yaml


from cli_helpers import ROOT, run_memform
from estimate_helpers import numbers  # numbers only: the numeric path (tests/test_numeric.py ties it to sympy's)

UNIT_DEVICE = {"peak_flops_bf16": 10 ** 12, "efficiency": 1, "intra_node_bandwidth": 10 ** 12,
               "inter_node_bandwidth": 10 ** 12, "devices_per_node": 8, "capacity_gib": 80}
H100 = parse_yaml((ROOT / "configs" / "devices" / "h100-sxm.yaml").read_text())
DSV3 = ROOT / "configs" / "published" / "deepseek-v3-report.yaml"


# ------------------------------------------------------------- the H100 preset against DeepGEMM's table

#: DeepGEMM README (first release, Feb 2025), H800, FP8 with 1x128 / 128x128 scaling: (M, N, K, TFLOPS)
DEEPGEMM_FIT = [(4096, 32768, 512, 590), (4096, 24576, 1536, 990), (4096, 7168, 2048, 1025),
                (4096, 4096, 7168, 1304), (4096, 7168, 16384, 1358)]
#: ... its grouped (contiguous layout) rows, not used by the fit: (groups, M per group, N, K, TFLOPS)
DEEPGEMM_HELD_OUT = [(4, 8192, 4096, 7168, 1297), (4, 8192, 7168, 2048, 1099),
                     (8, 4096, 4096, 7168, 1288), (8, 4096, 7168, 2048, 1093)]


def _preset_fp8_tflops(K: int) -> float:
    # time.mf: a GEMM of depth K costs 2·M·N·(K + k8) FLOPs at F8·e8
    return H100["peak_flops_fp8"] * H100["efficiency_fp8"] * K / (K + H100["gemm_fp8_k0"]) / 1e12


@pytest.mark.parametrize("M,N,K,tflops", DEEPGEMM_FIT)
def test_the_fp8_preset_reproduces_deepgemms_dense_rows(M, N, K, tflops):
    assert _preset_fp8_tflops(K) == pytest.approx(tflops, rel=0.03)


@pytest.mark.parametrize("E,M,N,K,tflops", DEEPGEMM_HELD_OUT)
def test_the_fp8_preset_predicts_deepgemms_grouped_rows(E, M, N, K, tflops):
    assert _preset_fp8_tflops(K) == pytest.approx(tflops, rel=0.05)


# ------------------------------------------------------------- the B200 preset against OpenXLA's table

B200 = parse_yaml((ROOT / "configs" / "devices" / "b200.yaml").read_text())
#: OpenXLA's GPU cost model table (matmul_interpolator_data.h, kDefaultMatmulPTable, key sm_100,
#: "f8e4m3fnxf8e4m3fn->bf16"), batch 4 of m x n outputs at depth k: (M = 4·m, N, K, TFLOPS). The fit: its
#: three largest GEMMs
XLA_B200_FIT = [(16384, 4096, 1024, 2260.5), (16384, 4096, 2048, 2527.9), (16384, 4096, 4096, 2592.8)]
#: ... the next-largest, not used by the fit
XLA_B200_HELD_OUT = [(16384, 2048, 1024, 2198.0), (16384, 2048, 2048, 2362.5), (16384, 2048, 4096, 2501.1),
                     (16384, 1024, 1024, 1869.0), (16384, 1024, 2048, 2244.0), (16384, 1024, 4096, 2360.5)]


def _b200_fp8_tflops(M: int, N: int, K: int) -> float:
    # time.mf: 2·M·N·K FLOPs + pad's idle tile slots (256 x 128 tiles over sm_count SMs) + 2·M·N·k8, at F8·e8
    sms = B200["sm_count"]
    idle = 2 * K * (math.ceil(math.ceil(M / 256) * math.ceil(N / 128) / sms) * sms * 256 * 128 - M * N)
    flops = 2 * M * N * K
    return flops * B200["peak_flops_fp8"] * B200["efficiency_fp8"] / (flops + idle + 2 * M * N * B200["gemm_fp8_k0"]) / 1e12


@pytest.mark.parametrize("M,N,K,tflops", XLA_B200_FIT)
def test_the_b200_fp8_preset_reproduces_xlas_largest_gemms(M, N, K, tflops):
    assert _b200_fp8_tflops(M, N, K) == pytest.approx(tflops, rel=0.02)


@pytest.mark.parametrize("M,N,K,tflops", XLA_B200_HELD_OUT)
def test_the_b200_fp8_preset_predicts_xlas_next_largest_gemms(M, N, K, tflops):
    assert _b200_fp8_tflops(M, N, K) == pytest.approx(tflops, rel=0.10)


# ------------------------------------------------------------------------ exact terms, unit device

def _gpt_fp8(k8=0, hbm=0, sms=0, h=1024, a=16, L=2, s=1024, v=51200, b=1, m=2):
    """A GPT-style model (GeLU, f = 4h, no flash) with Transformer Engine FP8 GEMMs at 2·10^12 FLOP/s
    peak and e8 = 0.5: the GEMMs run at 10^12 FLOP/s, compute picoseconds = FLOPs."""
    dev = {**UNIT_DEVICE, "peak_flops_fp8": 2 * 10 ** 12, "efficiency_fp8": 0.5, "gemm_fp8_k0": k8,
           "sm_count": sms}
    if hbm:
        dev["memory_bandwidth"] = hbm
    return {"name": "gpt8", "formulas": ["dense.mf"],
            "model": {"hidden_size": h, "num_heads": a, "num_layers": L, "vocab_size": v, "seq_length": s,
                      "activation": "gelu", "norm": "layernorm", "bias": False, "dropout": False},
            "parallel": {"dp": 1, "tp": 1, "pp": 1},
            "training": {"micro_batch_size": b, "num_micro_batches": m, "recompute": "none"},
            "megatron": {"fp8": "hybrid", "fp8_recipe": "tensorwise"},
            "device": dev}


@pytest.mark.parametrize("k8", [720, 100])
def test_fp8_depth_term_is_2_k8_flops_per_gemm_output(k8):
    # every FP8 GEMM output element costs 2·k8 FLOPs more: forward QKV (tok×3h), proj (tok×h), fc1
    # (tok×4h), fc2 (tok×h) = 9·tok·h outputs; backward dX (tok×h, tok×h, tok×h, tok×4h) = 7·tok·h and
    # dW (h×3h, h×h, h×4h, 4h×h) = 12·h²; the BF16 head (DeepSeek-V3 §3.3) pays none
    h, L, s, b, m = 1024, 2, 1024, 1, 2
    tok = s * b
    base = numbers(_gpt_fp8(0)).stages[0].time_ps["compute"]
    with_k8 = numbers(_gpt_fp8(k8)).stages[0].time_ps["compute"]
    assert with_k8 - base == m * L * 2 * k8 * (16 * tok * h + 12 * h * h)


def test_fp8_casts_move_three_bytes_per_left_operand_element():
    # DeepGEMM takes FP8 operands cast by separate kernels (README "Notices"; DeepSeek's profile:
    # per_token_cast_to_fp8 and per_channel_cast_and_transpose): each GEMM's left operand read in BF16 and
    # written in FP8 with a 4-byte scale per 128, 3 + 4/128 bytes per element. Left operands per layer:
    # forward X (QKV, proj, fc1: tok×h; fc2: tok×4h) 7·tok·h, dX's dY 9·tok·h, dW's Xᵀ 7·tok·h
    h, L, s, b, m, hbm = 1024, 2, 1024, 1, 2, 10 ** 12
    tok = s * b
    base = numbers(_gpt_fp8(0, hbm=0)).stages[0].time_ps["compute"]
    cast = numbers(_gpt_fp8(0, hbm=hbm)).stages[0].time_ps["compute"]
    # at 10^12 B/s one byte is one picosecond
    assert cast - base == m * L * Fraction(3 * 128 + 4, 128) * 23 * tok * h


def _moe(E=6, k=2, f=512, h=1024, s=1024, sms=1, grouped=True):
    return {"name": "moe", "formulas": ["moe.mf"],
            "model": {"hidden_size": h, "num_heads": 8, "num_layers": 1, "vocab_size": 51200, "seq_length": s,
                      "activation": "swiglu", "norm": "rmsnorm", "bias": False, "num_experts": E, "moe_top_k": k,
                      "moe_ffn_hidden_size": f, "moe_grouped_gemm": grouped},
            "parallel": {"dp": 1, "tp": 1, "pp": 1},
            "training": {"micro_batch_size": 1, "num_micro_batches": 1, "recompute": "none"},
            "device": {**UNIT_DEVICE, "sm_count": sms}}


def _gpad(E, M, N, K, sms=1, tm=256, tn=128):
    # time.mf gpad: whole tiles per expert, the group's tiles over shared waves of sms tiles
    tiles = E * math.ceil(M / tm) * math.ceil(N / tn)
    return 2 * K * (math.ceil(tiles / sms) * sms * tm * tn - E * M * N)


@pytest.mark.parametrize("E,k", [(6, 2), (8, 2), (16, 1), (3, 1)])
def test_grouped_expert_gemms_pad_each_experts_rows_to_whole_tiles(E, k):
    # DeepGEMM README, contiguous layout: "each expert segment must be aligned to the GEMM M block size";
    # balanced routing gives each of E experts k·s/E tokens (6 experts, top-2, 1,024 tokens: 341⅓ rows in
    # 2 tiles of 256). All other GEMM shapes here are whole tiles (h, f multiples of 256, 1,024 tokens), so
    # the idle slots with one SM are the experts' alone: fc1 (2f wide) and fc2 forward, dX, dW
    h, f, s = 1024, 512, 1024
    Me = Fraction(k * s, E)
    expected = (_gpad(E, Me, 2 * f, h) + _gpad(E, Me, h, f)                       # forward
                + _gpad(E, Me, h, 2 * f) + _gpad(E, h, 2 * f, Me)                 # fc1 dX, dW
                + _gpad(E, Me, f, h) + _gpad(E, f, h, Me))                        # fc2 dX, dW
    with_tiles = numbers(_moe(E, k, sms=1)).stages[0].time_ps["compute"]
    without = numbers(_moe(E, k, sms=0)).stages[0].time_ps["compute"]
    assert with_tiles - without == expected
    assert (expected > 0) == (Me % 256 != 0)


# -------------------------------------------------------- DeepSeek-V3 as its report trains it

def test_deepseek_v3_all_to_all_sms_stretch_compute_by_132_over_112():
    # §3.2.2: "only 20 SMs are sufficient to fully utilize the bandwidths of IB and NVLink"; the other 112
    # of the H800's 132 run the computation they overlap (DualPipe, overlap = 1)
    held = numbers(str(DSV3)).stages[1].time_ps["compute"]
    free = numbers(str(DSV3), {"parallel.comm_sms": 0}).stages[1].time_ps["compute"]
    assert held / free == pytest.approx(132 / 112, rel=1e-12)


def test_dualpipe_bubble_is_table_2s_with_b_the_full_backward():
    # DeepSeek-V3 Table 2: (PP/2 - 1)(F&B + B - 3W) with B = 2F (the full backward chunk), W = F,
    # F&B = F + B: (PP/2 - 1)·2F, in slots of F + B = 3F: 7 · 2/3 for PP 16
    est = numbers(str(DSV3))
    st, m = est.stages[1], 15360 // 128
    busy = sum(st.time_ps[k] for k in ("compute", "memory", "tp", "cp", "ep", "pp", "gaps"))
    assert st.time_ps["bubble"] == pytest.approx(float(Fraction(7 * 2, 3) * busy / m), rel=1e-9)


def test_deepseek_v3_chunk_pair_is_its_profiles():
    # deepseek-ai/profile-data train.json: one forward and one backward chunk of 4 MoE layers (EP64, 4K
    # tokens, balanced routing) keep the compute stream busy 118.2 ms. A rank of stage 1 runs 8 MoE
    # layers (4 per DualPipe piece) for each of 120 micro-batches per direction pair: its compute and
    # memory-bound time per micro-batch is one such pair
    st = numbers(str(DSV3)).stages[1]
    pair_ms = (st.time_ps["compute"] + st.time_ps["memory"]) / 1e12 * 1e3 / 120
    assert pair_ms == pytest.approx(118.2, rel=0.05)


def test_dualpipe_leaves_the_compute_stream_idle_as_deepseeks_profile_does():
    # the same pair's kernels cover 118.19 of the 128.54 ms from the first kernel's start to the last one's
    # end (bench/profile_idle.py on train.json: 8.0 % idle, schedules.mf dualpipev idle = 0.080): the
    # kernels' time stretched by 1 / (1 - 0.080), and a one-direction schedule leaves none
    st = numbers(str(DSV3)).stages[1]
    busy = st.time_ps["compute"] + st.time_ps["memory"]
    assert st.time_ps["gaps"] == pytest.approx(busy * 0.080 / 0.920, rel=1e-9)
    assert (busy + st.time_ps["gaps"]) / 1e9 / 120 == pytest.approx(128.54, rel=0.05)   # ms per pair
    one = numbers(str(DSV3), {"parallel.pp_schedule": "1f1b"}).stages[1]
    assert one.time_ps["gaps"] == 0 and one.time_ps["compute"] > 0


def test_deepseek_v3_mfu_is_far_from_100_percent_and_states_its_peak():
    # 180K H800 hours per trillion tokens = 1,543 tokens/s per GPU = 45.5 % of the BF16 peak with memform's
    # FLOPs per token; before issue 33's FP8 terms memform said 98.4 %
    est = numbers(str(DSV3))
    assert 0.45 < est.mfu < 0.65
    r = run_memform("estimate", str(DSV3))
    assert r.returncode == 0 and "% of the dense BF16 peak" in r.stdout, r.stdout[-400:]
    j = run_memform("estimate", str(DSV3), "--json")
    assert json.loads(j.stdout)["time"]["mfu_peak"].startswith("dense BF16")


@pytest.mark.parametrize("key,value,named", [
    ("device.efficiency_fp8", "1.5", "device.efficiency_fp8"),
    ("device.attention_efficiency", "-0.1", "device.attention_efficiency"),
    ("device.memory_efficiency", "0", "device.memory_efficiency"),
    ("device.gemm_fp8_k0", "-1", "device.gemm_fp8_k0"),
    ("parallel.comm_sms", "132", "parallel.comm_sms"),
])
def test_bad_efficiency_values_are_a_one_paragraph_error(key, value, named):
    r = run_memform("estimate", str(DSV3), "--set", f"{key}={value}")
    assert r.returncode == 2 and named in r.stderr and "Traceback" not in r.stderr, r.stderr
