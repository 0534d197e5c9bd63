"""The Megatron-LM / Megatron-Core profile (formulas/frameworks/megatron.mf), the default.

Expected numbers are computed here from the sources, not from memform's formulas:

* Megatron-LM ``megatron/training/theoretical_memory_usage.py`` (NVIDIA/Megatron-LM):
  ``compute_weight_and_optimizer_memory``, ``compute_activation_memory`` (SP + selective) and
  ``compute_activation_memory_without_sp``, restated below as written there; where that estimate
  simplifies what Megatron-Core allocates, the allocation is added with the module that makes it
  ("correction" below: replicated norm weights and biases, the position table, the final norm on
  the last stage, the distributed optimizer sharding over DP×CP);
* Megatron's schedule (``pipeline_parallel/schedules.py``, interleaved 1F1B: warm-up forwards
  2(p - 1) + (vp - 1)p + 1 on the first rank, the chunk of forward k is (k mod p·vp) div p);
* ``transformer_block.py`` ``_checkpointed_forward`` (uniform recompute), Transformer Engine's
  Float8Tensor / MXFP8Tensor layouts and saved GEMM inputs (``module/linear.py``,
  ``module/base.py`` get_weight_workspace), TE ``optimizers/fused_adam.py`` state dtypes.
"""

from __future__ import annotations

import copy
from fractions import Fraction as Fr
from pathlib import Path

import pytest

from cli_helpers import ROOT
from cli_inprocess import memform_in_process  # memform.cli.main in this process (same output)
from memform.errors import MemformError
from memform.importers import Options, import_config
from estimate_helpers import numbers  # numbers only: the numeric path (tests/test_numeric.py ties it to sympy's)

STATIC = ("params", "grads", "optimizer")

#: GPT-3 175B (Brown et al. 2020, Table 2.1) as Megatron's GPT defaults build it: GeLU, LayerNorm,
#: biases, dropout, learned positions, tied embeddings; Korthikanti et al. 2022 Table 3's strategy
GPT3 = {"name": "gpt3", "model": {"hidden_size": 12288, "num_heads": 96, "num_layers": 96,
                                  "ffn_hidden_size": 49152, "vocab_size": 51200, "seq_length": 2048},
        "parallel": {"dp": 8, "tp": 8, "pp": 8, "sequence_parallel": True},
        "training": {"micro_batch_size": 1, "global_batch_size": 1536, "recompute": "selective"}}
#: Llama-3-70B (Dubey et al. 2024, Table 3): GQA 64/8, SwiGLU 28672, RMSNorm, no biases, untied
LLAMA = {"name": "llama70", "model": {"hidden_size": 8192, "num_heads": 64, "num_kv_heads": 8,
                                      "num_layers": 80, "ffn_hidden_size": 28672, "vocab_size": 128256,
                                      "seq_length": 4096, "activation": "swiglu", "norm": "rmsnorm",
                                      "bias": False, "dropout": False, "flash_attention": True,
                                      "position_embedding": "rope", "tied_embeddings": False},
         "parallel": {"dp": 4, "tp": 8, "pp": 4, "sequence_parallel": True, "distributed_optimizer": True},
         "training": {"micro_batch_size": 1, "global_batch_size": 64, "recompute": "selective"}}


def cfg(base: dict, **sections) -> dict:
    out = copy.deepcopy(base)
    for section, values in sections.items():
        out.setdefault(section, {}).update(values)
    return out


def exact(stage, cats=STATIC) -> Fr:
    """The exact (rational) bytes of ``cats`` on ``stage`` (ints and fractions on the numeric path)."""
    return sum((Fr(str(stage.exact[c])) for c in cats), Fr(0))


def shape(c: dict) -> dict:
    m = c["model"]
    h, a = m["hidden_size"], m["num_heads"]
    return dict(h=h, a=a, g=m.get("num_kv_heads", a), f=m.get("ffn_hidden_size", 4 * h), L=m["num_layers"],
                v=m["vocab_size"], s=m["seq_length"], swiglu=m.get("activation") == "swiglu",
                norm_size=1 if m.get("norm") == "rmsnorm" else 2, untied=not m.get("tied_embeddings", False),
                bias=m.get("bias", True), learned=m.get("position_embedding", "learned") == "learned")


# ---- theoretical_memory_usage.py, restated ----------------------------------------------------------

def megatron_params_most_loaded(*, h, a, g, f, L, v, swiglu, norm_size, untied, p, t, **_) -> Fr:
    """compute_weight_and_optimizer_memory: num_parameters_on_most_loaded_model_shard (dense, MHA/GQA)."""
    gated_linear_multiplier = Fr(3, 2) if swiglu else 1
    self_attn_term = 2 * h * h * (1 + Fr(g, a)) * 1          # query_projection_to_hidden_size_ratio = 1
    layer = 2 * h * (f * gated_linear_multiplier + norm_size) + self_attn_term
    embedding_size = h * v
    block = layer * L + norm_size * h                         # + final_layernorm
    shard = (block / p + embedding_size) / t
    if untied and p == 1:
        shard += Fr(embedding_size, t)
    return shard


def megatron_bytes_per_parameter(dist_opt: bool, dp: int) -> Fr:
    return Fr(18) if not dist_opt else 6 + Fr(12, dp)


def megatron_activation_memory(*, s, b, h, f, L, v, p, t, vp, m) -> Fr:
    """compute_activation_memory (first pipeline stage, SP + selective recompute)."""
    act = s * b * h * (18 + 4 * Fr(f, h)) * L
    act += 8 * s * b * p                      # input to embedding
    act += s * b * h * p                      # dropout in embedding layer
    if vp is not None:
        act *= 1 + Fr(p - 1, p * vp)
    if vp is None and p > 1:
        act *= min(1, Fr(m, p))
    if p == 1:
        act += s * b * h * 4 * (1 + Fr(v, h))
    return act / t


def megatron_layer_term(*, s, b, h, f, L, p, t, vp, m, **_) -> Fr:
    """The transformer-layer part of compute_activation_memory, with the same pipeline factor."""
    act = s * b * h * (18 + 4 * Fr(f, h)) * L
    if vp is not None:
        act *= 1 + Fr(p - 1, p * vp)
    elif p > 1:
        act *= min(1, Fr(m, p))
    return act / t


# ---- what Megatron-Core allocates beyond that estimate (stage 0 of p) ----------------------------------

def corrections(*, h, a, g, f, L, s, swiglu, norm_size, bias, learned, p, t, **_) -> Fr:
    kv = g * h // a
    layers = Fr(L, p)
    # norm weights are replicated over TP (TENorm / the layer_norm_weight of TELayerNormColumnParallelLinear),
    # the estimate divides them by t
    out = layers * 2 * norm_size * h * (1 - Fr(1, t))
    # the final norm lives on the last stage (GPTModel decoder.final_layernorm), the estimate spreads it /p
    out += norm_size * h * (1 - Fr(1, t)) if p == 1 else -Fr(norm_size * h, p * t)
    if bias:   # ColumnParallelLinear splits its bias, RowParallelLinear keeps it whole (tensor_parallel/layers.py)
        out += layers * (Fr(h + 2 * kv, t) + h + Fr((2 if swiglu else 1) * f, t) + h)
    if learned:  # LanguageModelEmbedding.position_embeddings, s×h, not TP-split
        out += s * h
    return out


WEIGHT_CASES = [
    # (id, config, overrides)
    ("gpt3-t8p8-ddp", GPT3, {"parallel": {"distributed_optimizer": False}}),
    ("gpt3-t8p8-distopt-d8", GPT3, {"parallel": {"distributed_optimizer": True}}),
    ("gpt3-t8p1-distopt-d64", GPT3, {"parallel": {"pp": 1, "dp": 64, "distributed_optimizer": True}}),
    ("llama70-t8p4-distopt-d4", LLAMA, {}),
    ("llama70-t8p4-ddp", LLAMA, {"parallel": {"distributed_optimizer": False}}),
    ("llama70-t1p1-distopt-d64", LLAMA, {"parallel": {"tp": 1, "pp": 1, "dp": 64, "sequence_parallel": False}}),
    ("llama70-t8p4-vpp5", LLAMA, {"parallel": {"vpp": 5}}),
]


@pytest.mark.parametrize("base, over", [c[1:] for c in WEIGHT_CASES], ids=[c[0] for c in WEIGHT_CASES])
def test_weights_and_optimizer_match_theoretical_memory_usage(base, over):
    c = cfg(base, **over)
    par = c["parallel"]
    sh = shape(c)
    p, t, dp, dist = par.get("pp", 1), par.get("tp", 1), par["dp"], par.get("distributed_optimizer", False)
    params = megatron_params_most_loaded(**sh, p=p, t=t) + corrections(**sh, p=p, t=t)
    expected = params * megatron_bytes_per_parameter(dist, dp)
    stage = numbers(c).stages[0]
    assert exact(stage) == expected
    assert Fr(stage.param_count) == params or abs(stage.param_count - params) < 1


def test_correction_is_small_against_the_estimate_itself():
    # the corrections are what theoretical_memory_usage.py leaves out: 0.013 % of Llama-70B's stage 0
    # (replicated norms), 0.93 % of GPT-3's (biases and the 2048 x 12288 position table)
    for base, bound in ((LLAMA, Fr(2, 10000)), (GPT3, Fr(1, 100))):
        sh = shape(base)
        p, t = base["parallel"]["pp"], base["parallel"]["tp"]
        assert abs(corrections(**sh, p=p, t=t)) < bound * megatron_params_most_loaded(**sh, p=p, t=t)


@pytest.mark.parametrize("dp, cp", [(2, 1), (8, 1), (64, 1), (4, 2)])
def test_distributed_optimizer_bytes_per_parameter(dp, cp):
    # 2 (bf16 param) + 4 (fp32 main grad, not sharded) + 12/(dp·cp) (fp32 main shard + exp_avg +
    # exp_avg_sq): distrib_optimizer.py; DDP builds the buffers over the DP×CP group
    # (distributed_data_parallel.py: intra_dp_cp_group). theoretical_memory_usage.py writes 6 + 12/dp,
    # which is the same without CP.
    c = cfg(LLAMA, parallel={"dp": dp, "cp": cp})
    stage = numbers(c).stages[0]
    n = Fr(stage.param_count)
    assert exact(stage, ("params",)) == 2 * n
    assert exact(stage, ("grads",)) == 4 * n
    assert exact(stage, ("optimizer",)) == Fr(12, dp * cp) * n


def test_overlap_and_bucket_flags_add_no_memory():
    # param_and_grad_buffer.py start_grad_sync / start_param_sync: reduce-scatter and all-gather on
    # views of the grad and param buffers (local_data_view = shard_buffer(bucket.grad_data)[rank])
    plain = numbers(LLAMA)
    over = {"parallel.overlap_grad_reduce": True, "megatron.overlap_param_gather": True,
            "megatron.ddp_bucket_size": 40_000_000}
    est = numbers(LLAMA, over)
    assert [s.values for s in est.stages] == [s.values for s in plain.stages]
    stage = est.stages[0]
    assert exact(stage) == (6 + Fr(12, 4)) * stage.param_count


# ---- activations against compute_activation_memory ---------------------------------------------------

def interleaved_chunk0_passes(p: int, vp: int, m: int) -> int:
    """Forward passes of chunk 0 held by the first rank when its first backward starts (schedules.py
    forward_backward_pipelining_with_interleaving: 2(p - 1) + (vp - 1)p warm-up forwards, then one
    more; forward k runs chunk (k mod p·vp) div p)."""
    n = min(m * vp, 2 * (p - 1) + (vp - 1) * p + 1)
    return sum(1 for k in range(n) if (k % (p * vp)) // p == 0)


ACT_CASES = [
    # (id, parallel overrides, num_micro_batches)
    ("p8-m192", {}, 192),
    ("p8-m4", {}, 4),
    ("p8-vpp2", {"vpp": 2}, 192),
    ("p8-vpp3", {"vpp": 3}, 192),
    ("p4-t4-vpp4", {"pp": 4, "tp": 4, "vpp": 4}, 64),
    ("p1", {"pp": 1}, 8),
]


@pytest.mark.parametrize("par, m", [c[1:] for c in ACT_CASES], ids=[c[0] for c in ACT_CASES])
def test_first_stage_activations_match_compute_activation_memory(par, m):
    c = cfg(GPT3, parallel=par)
    c["training"] = {"micro_batch_size": 1, "num_micro_batches": m, "recompute": "selective"}
    c["parallel"]["dp"] = 1
    sh = shape(c)
    p, t, vp = c["parallel"]["pp"], c["parallel"]["tp"], c["parallel"].get("vpp")
    args = dict(s=sh["s"], b=1, h=sh["h"], f=sh["f"], L=sh["L"], v=sh["v"], p=p, t=t, vp=vp, m=m)
    stage = numbers(c).stages[0]
    decoders = sum(l.inflight_value * l.count_value * l.per_layer_values["activations"]
                   for l in stage.layers if l.block == "decoder")
    # the transformer layers: exactly Megatron's term, interleaving penalty 1 + (p - 1)/(p·vp) included
    assert Fr(str(decoders)) == megatron_layer_term(**args)
    # the whole stage: Megatron adds the int64 token ids (8sb per micro-batch, not kept by the model:
    # memform has no such tensor) and scales the embedding's dropout mask by the same penalty, where the
    # schedule holds it once per chunk-0 pass on the first rank
    held = interleaved_chunk0_passes(p, vp, m) if vp else min(p, m)
    megatron_total = megatron_activation_memory(**args)
    ids = 8 * sh["s"] * held / Fr(t) if vp is None else 8 * sh["s"] * p * (1 + Fr(p - 1, p * vp)) / t
    emb_megatron = sh["s"] * sh["h"] * (min(p, m) if vp is None else p * (1 + Fr(p - 1, p * vp))) / Fr(t)
    emb_memform = sh["s"] * sh["h"] * held / Fr(t)
    assert stage.moments["warmup"] == megatron_total - ids - emb_megatron + emb_memform


def test_per_layer_without_sp_matches_compute_activation_memory_without_sp():
    # compute_activation_memory_without_sp: sbh(10 + 24/t) per layer (Korthikanti eq. 2, selective)
    for t in (2, 4, 8):
        c = cfg(GPT3, parallel={"tp": t, "sequence_parallel": False, "pp": 1, "dp": 1})
        c["training"] = {"micro_batch_size": 1, "num_micro_batches": 1, "recompute": "selective"}
        [layer] = [l for l in numbers(c).stages[0].layers if l.block == "decoder"]
        s, h = 2048, 12288
        assert Fr(str(layer.per_layer_values["activations"])) == s * h * (10 + Fr(24, t))


def test_llama_activations_exceed_megatrons_gelu_mha_formula_by_what_it_leaves_out():
    """compute_activation_memory assumes a GeLU MLP (4f/h), full-width K and V and dropout masks.
    For Llama-3-70B (t 8, SP, selective, flash) the layer keeps instead, per token and TP rank:
    SwiGLU's [gate | up] fc1 output 2f wide (+2f bytes beyond GeLU's f), K and V at GQA width
    (4(h - kv) bytes fewer), no dropout masks (2h fewer), and flash attention's fp32 log-sum-exp
    (4a; Dao et al. 2022 §3.1). Net +4.8 % per layer."""
    sh = shape(LLAMA)
    h, a, g, f = sh["h"], sh["a"], sh["g"], sh["f"]
    kv, t, s = g * h // a, 8, sh["s"]
    megatron = s * h * (18 + 4 * Fr(f, h)) / t
    expected = megatron + Fr(s, t) * (2 * f - 4 * (h - kv) - 2 * h + 4 * a)
    [layer] = [l for l in numbers(LLAMA).stages[0].layers if l.block == "decoder"]
    assert Fr(str(layer.per_layer_values["activations"])) == expected
    assert expected / megatron - 1 == pytest.approx(0.0479, abs=5e-4)


# ---- --recompute-method uniform ---------------------------------------------------------------------

LLAMA7 = ROOT / "configs" / "llama2-7b.yaml"   # 32 layers, pp 2 (16 per stage), tp 2 + SP, h 4096, s 4096


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
def test_uniform_recompute_keeps_one_input_per_group_and_recomputes_the_group(n):
    # _checkpointed_forward, uniform: groups of n layers, one checkpoint each keeping the group's input
    # (2sbh/t with SP, Korthikanti Table 2); its backward re-runs the n layers' forward at once
    full = {"training.recompute": "full"}
    one = numbers(LLAMA7, full).stages[0]
    est = numbers(LLAMA7, {**full, "megatron.recompute_uniform_layers": n}).stages[0]
    s, h, t, p = 4096, 4096, 2, 2
    inputs = p * (16 // n)                     # 1F1B stage 0 holds p micro-batches; no dropout: embedding 0
    assert est.moments["warmup"] == inputs * 2 * s * h // t
    # one layer's activations without recompute (what each recomputed layer rebuilds)
    [layer] = [l for l in numbers(LLAMA7, {"training.recompute": "none"}).stages[0].layers
               if l.block == "decoder"]
    rebuilt = layer.per_layer_values["activations"]
    grow = (est.moments["backward"] - est.moments["warmup"]) - (one.moments["backward"] - one.moments["warmup"])
    assert grow == (n - 1) * rebuilt


def test_distribute_saved_activations_splits_the_kept_input_over_tp():
    # tensor_parallel/random.py CheckpointFunction: split_tensor_into_1d_equal_chunks(args[0]) over TP
    over = {"training.recompute": "full", "parallel.sequence_parallel": False}
    plain = numbers(LLAMA7, over).stages[0]
    split = numbers(LLAMA7, {**over, "megatron.distribute_saved_activations": True}).stages[0]
    assert plain.moments["warmup"] == 2 * 2 * 4096 * 4096 * 16          # p micro-batches × 16 inputs 2sbh
    assert split.moments["warmup"] == plain.moments["warmup"] // 2


# ---- FP8 with Transformer Engine ----------------------------------------------------------------------

def llama7_gemm_weights_stage0() -> int:
    """Llama-2-7B GEMM weight elements on stage 0 (16 layers, tp 2): QKV h×3h, proj h×h, fc1 h×2f
    (gate | up), fc2 f×h -- TE LayerNormLinear / Linear modules; no biases."""
    h, f, t = 4096, 11008, 2
    return 16 * (3 * h * h + h * h + 2 * h * f + f * h) // t


FP8_WEIGHT_CASES = [
    # (id, overrides, extra bytes per GEMM weight element beyond the bf16 model)
    # Float8Tensor: rowwise _data + _transpose (Hopper: TN-only fp8 GEMMs), cached across micro-batches
    ("delayed-hopper", {"megatron.fp8": "hybrid"}, Fr(2)),
    ("tensorwise-hopper", {"megatron.fp8": "e4m3", "megatron.fp8_recipe": "tensorwise"}, Fr(2)),
    # Blackwell: one fp8 copy serves both GEMM layouts
    ("delayed-blackwell", {"megatron.fp8": "hybrid", "megatron.fp8_weight_transpose": False}, Fr(1)),
    # MXFP8Tensor: rowwise and columnwise data, one uint8 E8M0 scale per 32 elements each
    ("mxfp8", {"megatron.fp8": "e4m3", "megatron.fp8_recipe": "mxfp8"}, 2 * (1 + Fr(1, 32))),
    # --fp8-param-gather: the fp8 form replaces the 2-byte bf16 weight
    ("param-gather-hopper", {"megatron.fp8": "hybrid", "megatron.fp8_param_gather": True}, Fr(0)),
    ("param-gather-blackwell", {"megatron.fp8": "hybrid", "megatron.fp8_param_gather": True,
                                "megatron.fp8_weight_transpose": False}, Fr(-1)),
    ("param-gather-mxfp8", {"megatron.fp8": "hybrid", "megatron.fp8_recipe": "mxfp8",
                            "megatron.fp8_param_gather": True}, Fr(1, 16)),
]


@pytest.mark.parametrize("over, extra", [c[1:] for c in FP8_WEIGHT_CASES], ids=[c[0] for c in FP8_WEIGHT_CASES])
def test_fp8_weight_copies(over, extra):
    base = numbers(LLAMA7).stages[0]
    est = numbers(LLAMA7, over).stages[0]
    assert exact(est, ("params",)) - exact(base, ("params",)) == extra * llama7_gemm_weights_stage0()
    # main grads (fp32) and the optimizer (fp32 main shard + moments) do not change
    assert exact(est, ("grads", "optimizer")) == exact(base, ("grads", "optimizer"))


FP8_ACT_CASES = [
    # (id, overrides, bytes per saved GEMM-input element)
    ("delayed", {"megatron.fp8": "hybrid"}, Fr(1)),
    ("mxfp8", {"megatron.fp8": "hybrid", "megatron.fp8_recipe": "mxfp8"}, 1 + Fr(1, 32)),
]


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("over, elem", [c[1:] for c in FP8_ACT_CASES], ids=[c[0] for c in FP8_ACT_CASES])
def test_fp8_saved_gemm_inputs(over, elem, flash):
    # TE Linear / LayerNormLinear save their quantized input (or its transpose) for wgrad instead of the
    # bf16 one: the QKV and fc1 inputs (norm outputs, h), fc2's (the SwiGLU output, f), the output
    # projection's (h); the latter is also flash attention's output O, kept in bf16 by the kernel.
    # Per token on a TP rank with SP (s·b/t tokens): bf16 = 2 bytes each.
    def layer(o):
        [l] = [l for l in numbers(LLAMA7, {"model.flash_attention": flash, **o}).stages[0].layers
               if l.block == "decoder"]
        return Fr(str(l.per_layer_values["activations"]))
    s, h, f, t = 4096, 4096, 11008, 2
    proj = (elem + 2) if flash else elem
    expected_change = Fr(s, t) * ((elem - 2) * (h + h + f) + (proj - 2) * h)
    assert layer(over) - layer({}) == expected_change


MIXTRAL = ROOT / "configs" / "mixtral-8x7b.yaml"  # h 4096, GQA 32/8, 8 experts top-2 of f 14336, ep 8, tp 1


def test_fp8_moe_layer_weights_and_expert_inputs():
    # frameworks/megatron/moe.mf: the local experts (TEGroupedMLP) and attention are TE GEMMs, the
    # router (TopKRouter, torch linear) and the norms are not
    h, f, kv, experts_local = 4096, 14336, 1024, 8 // 8
    gemm = (h * (h + 2 * kv) + h * h) + experts_local * 3 * h * f
    # grouped GEMM: the experts hold exactly their routed tokens (no capacity padding)
    over = {"training.recompute": "none", "model.flash_attention": True, "model.moe_grouped_gemm": True}

    def moe_layer(o):
        [l] = [l for l in numbers(MIXTRAL, {**over, **o}).stages[0].layers if l.block == "moe_decoder"]
        return Fr(str(l.per_layer_values["params"])), Fr(str(l.per_layer_values["activations"]))
    (p0, a0), (p1, a1) = moe_layer({}), moe_layer({"megatron.fp8": "hybrid"})
    assert p1 - p0 == 2 * gemm                                   # Float8Tensor data + transpose
    # per micro-batch the ep rank's experts see s·b·k routed tokens (balanced routing, top-2 of s = 4096):
    # their fc1 input (h) and fc2 input (f) drop to 1 byte; attention's QKV input drops, its output
    # projection keeps an fp8 copy beside flash attention's bf16 O: net 0 there
    routed = 4096 * 2
    assert a1 - a0 == -routed * (h + f)


# ---- --use-precision-aware-optimizer ------------------------------------------------------------------

PAO_CASES = [
    # (id, overrides, optimizer bytes per parameter before the 1/(dp·cp) shard)
    # TE FusedAdam: int16 remainder of the fp32 master of a bf16 param (2), moments in their dtypes
    ("fp32-moments", {}, 2 + 4 + 4),
    ("bf16-moments", {"megatron.exp_avg_dtype": "bf16", "megatron.exp_avg_sq_dtype": "bf16"}, 2 + 2 + 2),
    ("fp8-moments", {"megatron.exp_avg_dtype": "fp8", "megatron.exp_avg_sq_dtype": "fp8"}, 2 + 1 + 1),
    ("fp16-master", {"megatron.main_params_dtype": "fp16"}, 2 + 4 + 4),
    ("no-remainders", {"megatron.store_param_remainders": False}, 4 + 4 + 4),
]


@pytest.mark.parametrize("over, per_param", [c[1:] for c in PAO_CASES], ids=[c[0] for c in PAO_CASES])
def test_precision_aware_optimizer_state_bytes(over, per_param):
    est = numbers(LLAMA7, {"megatron.precision_aware_optimizer": True, **over}).stages[0]
    assert exact(est, ("optimizer",)) == Fr(per_param, 2) * est.param_count   # dp 2


def test_bf16_main_grads():
    # --main-grads-dtype bf16 / --grad-reduce-in-bf16: a bf16 grad buffer (grad_reduce_in_fp32 False)
    est = numbers(LLAMA7, {"megatron.precision_aware_optimizer": True,
                                    "training.precision.grads": "bf16"}).stages[0]
    assert exact(est, ("grads",)) == 2 * est.param_count


# ---- every model, bad input -----------------------------------------------------------------------------

KNOBS = {"training.framework": "megatron", "megatron.fp8": "hybrid", "megatron.fp8_param_gather": True, "megatron.precision_aware_optimizer": True,
         "megatron.exp_avg_dtype": "bf16", "training.recompute": "full", "megatron.recompute_uniform_layers": 1,
         "parallel.distributed_optimizer": True}


# every bundled config with these knobs on: tests/test_bundled_configs.py


@pytest.mark.parametrize("key, value, needle", [
    ("megatron.fp8", "fp4", "megatron.fp8"),
    ("megatron.fp8_recipe", "nvfp4", "megatron.fp8_recipe"),
    ("megatron.recompute_uniform_layers", "0", "megatron.recompute_uniform_layers"),
    ("megatron.main_params_dtype", "fp8", "megatron.main_params_dtype"),
    ("megatron.distribute_saved_activations", "true", "megatron.distribute_saved_activations"),
    ("megatron.exp_avg_dtype", "float7", "megatron.exp_avg_dtype"),
])
def test_bad_megatron_keys_are_clear_errors(key, value, needle):
    r = memform_in_process("estimate", LLAMA7, "--set", f"{key}={value}")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("memform: error:") and needle in r.stderr


def test_precision_aware_optimizer_needs_the_distributed_optimizer():
    with pytest.raises(MemformError, match="parallel.distributed_optimizer"):
        numbers(LLAMA7, {"megatron.precision_aware_optimizer": True,
                                  "parallel.distributed_optimizer": False})


# ---- memform import megatron ---------------------------------------------------------------------------

ARGS = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 11008 --num-attention-heads 32 --seq-length 4096 "
        "--vocab-size 32000 --swiglu --normalization RMSNorm --disable-bias-linear "
        "--untie-embeddings-and-output-weights --position-embedding-type rope --attention-dropout 0 "
        "--hidden-dropout 0 --use-flash-attn --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
        "--sequence-parallel --use-distributed-optimizer --micro-batch-size 1 --global-batch-size 64 --bf16 ")


def test_import_maps_the_profile_flags(tmp_path: Path):
    path = tmp_path / "args.txt"
    path.write_text(ARGS + "--overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 50000000 "
                    "--recompute-granularity full --recompute-method uniform --recompute-num-layers 4 "
                    "--fp8-format hybrid --fp8-param-gather --use-precision-aware-optimizer "
                    "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 --main-grads-dtype bf16")
    draft = import_config("megatron", path, Options(devices=8))
    c = draft.config()
    assert c["training"]["framework"] == "megatron"
    assert c["training"]["recompute"] == "full" and c["training"]["precision"]["grads"] == "bf16"
    assert c["parallel"]["overlap_grad_reduce"] is True and c["parallel"]["dp_bucket_mib"] == 0
    assert c["megatron"] == {"overlap_param_gather": True, "ddp_bucket_size": 50000000,
                             "recompute_uniform_layers": 4, "fp8": "hybrid", "fp8_recipe": "delayed",
                             "fp8_param_gather": True, "fp8_weight_transpose": True,
                             "precision_aware_optimizer": True, "main_params_dtype": "fp32",
                             "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}
    assert draft.warnings == []
    # the imported config is llama2-7b.yaml plus those knobs
    expected = numbers(LLAMA7, {f"megatron.{k}": v for k, v in c["megatron"].items()} | {
        "training.recompute": "full", "training.precision.grads": "bf16"})
    assert [s.peak_bytes for s in numbers(c).stages] == [s.peak_bytes for s in expected.stages]


def test_import_maps_no_overlap_p2p_communication(tmp_path: Path):
    # arguments.py's --no-overlap-p2p-communication (store_false: Megatron-LM overlaps by default) turns the
    # interleaved schedule's overlapped pipeline sends off (time.mf cost pp, schedules.mf p2p_async)
    path = tmp_path / "args.txt"
    path.write_text(ARGS + "--num-layers-per-virtual-pipeline-stage 4 --no-overlap-p2p-communication")
    c = import_config("megatron", path, Options(devices=8)).config()
    assert c["megatron"]["overlap_p2p_comm"] is False
    path.write_text(ARGS + "--num-layers-per-virtual-pipeline-stage 4")
    assert "overlap_p2p_comm" not in import_config("megatron", path, Options(devices=8)).config().get("megatron", {})


# ---- the default profile over any formula files: include "..." if "dense.mf" ---------------------------

def test_profile_physics_loads_only_over_dense_mf(tmp_path: Path):
    from memform.lang.loader import load_program
    from memform.resources import formulas_dir
    dense = load_program([formulas_dir() / "dense.mf", formulas_dir() / "frameworks/megatron.mf"])
    # the included file comes before the profile, which stays the program's last file
    assert [Path(f).as_posix().split("formulas/")[-1] for f in dense.files[-2:]] == \
        ["frameworks/megatron/megatron-core.mf", "frameworks/megatron.mf"]
    # a model of one's own, not built on dense.mf: the default profile adds nothing (and needs none of
    # dense.mf's names)
    own = tmp_path / "own.mf"
    own.write_text('include "common.mf"\nblock blob extends layer { params = 10 }\nstack { blob * 2 }\n')
    prog = load_program([own, formulas_dir() / "frameworks/megatron.mf"])
    assert not [f for f in prog.files if "megatron-core" in f]
    cfg_own = {"formulas": [str(own)]}
    assert numbers(cfg_own).stages[0].values["params"] == 2 * 10 * 2       # bf16
    with pytest.raises(MemformError, match="unknown config key 'megatron'"):
        numbers(cfg_own, {"megatron.fp8": "hybrid"})


def test_conditional_include_prints_back_and_checks_its_path(tmp_path: Path):
    from memform.lang.loader import load_program
    from memform.lang.parser import parse_file, parse_text
    from memform.lang.printer import print_file
    tree = parse_file(ROOT / "formulas/frameworks/megatron.mf")
    assert print_file(tree).strip() == 'include "megatron/megatron-core.mf" if "dense.mf"'
    assert print_file(parse_text(print_file(tree), "again.mf")) == print_file(tree)
    bad = tmp_path / "bad.mf"
    bad.write_text('include "common.mf" if "./nowhere.mf"\n')
    with pytest.raises(MemformError, match=r'if "./nowhere.mf": no such formula file') as err:
        load_program([bad])
    assert "bad.mf:1:1" in str(err.value)
