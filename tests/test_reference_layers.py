"""One transformer layer's saved activations, measured with PyTorch, against dense.mf byte for byte.

Reference: the PyTorch harness (memform/validation: the model is built from the same config, one
training step runs on the CPU and every live storage is counted, see measure.py). One layer's bytes are
isolated as the difference between the same model with two layers and with one: embedding, output head,
loss and optimizer cancel, so what remains is exactly one decoder layer of one micro-batch
(dp = tp = pp = 1).

The measured layer must equal memform's layer plus one documented remainder, and nothing else:

* ``NORM_STAT`` -- each of the layer's two norms saves a per-token fp32 statistic for backward (RMSNorm
  its 1/rms, ``_RMSNormFn.forward``'s ``rstd``; ATen's ``native_layer_norm`` its rstd): 4 bytes per
  token per norm, which dense.mf's ``norm.act`` (Korthikanti et al. 2022 §4.1 count only the norm's
  input) leaves out -- 0.4 % of this small layer, far less at real widths (4 bytes against ~34·h).
  With full recompute the norms run again in backward: no statistic is kept.
* ``ROUTING`` (MoE layers only) -- the harness's top-k router keeps, per token, its fp32 softmax (4E), the
  top-k values and int64 indices (12k), their int64 expert ids and sort permutation (16k, the dispatch),
  and the fp32 sum and weights cast (8): 80 bytes at E = 4, k = 2 (tracker by-op: _softmax, topk,
  floor_divide, sort, sum, _to_copy), where moe.mf's router.act counts fp32 logits, scores and top-k
  probabilities, 4·(2E + k) = 40 -- so 40 bytes per token more are measured than estimated.

Everything else is exact, so any change of an attention, MLP or norm activation term of dense.mf
(or of mla.mf's ``attention`` block, see MLA below) fails one of these cases (the cases pick out GQA, MQA, MHA, flash against the eager a·s² core, fused
against eager SwiGLU -- in the MLP, in routed experts and in shared experts --, GeLU + LayerNorm with and
without dropout, fp32, and each recompute mode). Shared experts (DeepSeek-V3 report §2.1.2: every token
also passes through N_s ungated experts whose output is added to the routed one; the harness builds them
as one MLP of width N_s·f_exp, torch_models.MoE) read the router's input and add no remainder: the
tracker sees exactly their [gate | up] GEMM output and SwiGLU output (``mm``, ``mul``; eager SwiGLU also
``silu``), moe.mf's ``shared_experts.act``.

MLA (multi-head latent attention, DeepSeek-V2, arXiv:2405.04434, §2.1.2-2.1.3, formulas/mla.mf): the
harness's ``torch_models.MLAttention`` follows eqs. (9)-(19) as Megatron-LM's ``MLASelfAttention`` builds
them (query latent + RMSNorm + up-projection, or a direct query projection without query compression;
one h -> d_c + d_h^R down projection split into the KV latent and the shared rotary key; RMSNorm on the
latent; up-projection to n_h·(d_h + d_v); RoPE on the rotary parts; the flash or unfused core; W^O). The
tracker sees exactly mla.mf's ``linear`` terms (by-op, default case: ``mm`` the query latent and the
[c^KV | k^R] down-projection output -- the KV norm's input is a view of it, so the d_h^R-wide rotary
key is kept with it --, ``mul`` the two latents' norm outputs, ``cat`` Q and K, ``clone`` V and the
output, the flash log-sum-exp), so MLA adds no remainder of its own, only more norms to ``NORM_STAT``:
its KV-latent RMSNorm, and with query compression (q_lora_rank > 0) its query-latent RMSNorm, each keep
their fp32 1/rms per token as the block's two norms do (4 or 3 norms in all). PyTorch's CPU flash kernel
needs one head size for Q, K and V; with d_v ≠ d_h + d_h^R (DeepSeek: 128 against 192) the harness uses
``torch_models._FlashDiffVFn``, which keeps what a kernel with separate K and V head sizes keeps (the
kernel Megatron-LM gives MLA) and pads to the CPU kernel's single head size only inside forward and
backward; :func:`test_mla_flash_stand_in_keeps_what_the_kernel_keeps` holds it against the real kernel.

Framework profiles. The default profile (megatron) loads formulas/frameworks/megatron/moe.mf, which
redefines ``experts.act`` and ``shared_experts.act`` (Transformer Engine's grouped GEMM keeps the fc2
input at its own width), so under megatron moe.mf's own ``experts.act`` line is never evaluated and a
change of it survives every default-profile case (issue 17: ``+ eager_swiglu`` -> ``- eager_swiglu``
at moe.mf:103 was left alive). fsdp2 and deepspeed redefine no layer activation of dense.mf or moe.mf
(fsdp2.mf only ``decoder.act[selective]``, deepspeed.mf only parameter-side terms), torch and
hf-trainer redefine ``mlp.bwd_grads`` / ``experts.bwd_grads`` (backward only) and refuse the harness's
precision (bf16 parameters with fp32 gradients), mindspore redefines mlp, attention, decoder and output.
So the MoE and eager-SwiGLU cases are run once more with ``training.framework = "fsdp2"``: the
measurement is the same (the harness never reads the profile; ``_measured`` is cached per point), the
estimate is taken with the profile set, and the remainder is the same norm_stat + routing -- which pins
moe.mf's generic ``experts.act`` and dense.mf's ``mlp.act`` as the non-Megatron profiles use them. No
profile redefines mla.mf's attention block except mindspore's, so the default-profile MLA cases pin it;
two MLA cases run under fsdp2 as well. None with selective recompute: fsdp2's ``recompute: selective``
is torchtitan's op-level SAC by default (``fsdp2.selective_ac: op``), which the harness does not build.
Skipped only when PyTorch is not installed.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

pytest.importorskip("torch", reason="PyTorch (the 'validate' extra) is not installed")

import memform  # noqa: E402
from memform.validation.compare import Point  # noqa: E402
from memform.validation.measure import measure_step  # noqa: E402

#: the harness's default small Llama: b = 2, s = 64, h = 64, 4 heads of 16, 2 KV heads, f = 176
BASE = Point(L=1)

CASES = {
    "GQA g=a/2, flash": {},
    "MHA g=a, flash": {"kv_heads": 4},
    "MQA g=1, flash": {"kv_heads": 1},
    "GQA, eager a*s^2 core": {"flash": False},
    "eager SwiGLU (silu(gate) * up)": {"swiglu_impl": "eager"},
    "GeLU + LayerNorm + biases, eager core": {"arch": "gpt", "flash": False},
    "GeLU + LayerNorm + dropout masks": {"arch": "gpt", "flash": False, "dropout": True},
    "fp32 everywhere": {"precision": "fp32"},
    "selective recompute, eager core": {"recompute": "selective", "flash": False},
    "full recompute": {"recompute": "full"},
    "wider: h=128, s=128, b=1, MQA": {"h": 128, "s": 128, "b": 1, "kv_heads": 1, "flash": False},
    "MoE, 4 experts, top-2": {"experts": 4, "top_k": 2},
    "MoE, eager SwiGLU experts": {"experts": 4, "top_k": 2, "swiglu_impl": "eager"},
    "MoE + 1 shared expert": {"experts": 4, "top_k": 2, "shared_experts": 1},
    "MoE + 1 shared expert, eager SwiGLU": {"experts": 4, "top_k": 2, "shared_experts": 1, "swiglu_impl": "eager"},
    # MLA (Point's defaults: d_c' = 48, d_c = 32, d_h^R = 8, d_h = d_v = 16, i.e. d_v < d_h + d_h^R = 24 as
    # in DeepSeek-V2/V3's 128 < 192; the flash cases then run torch_models._FlashDiffVFn)
    "MLA, query latent, flash": {"attention": "mla"},
    "MLA, no query compression (V2-Lite), flash": {"attention": "mla", "q_rank": 0},
    "MLA, flash, d_v = d_h + d_h^R (PyTorch's SDPA kernel)": {"attention": "mla", "d_v": 24},
    "MLA, flash, d_v > d_h + d_h^R": {"attention": "mla", "d_nope": 8, "d_v": 24, "kv_rank": 40},
    "MLA, query latent, eager a*s^2 core": {"attention": "mla", "flash": False},
    "MLA, no query compression, eager core": {"attention": "mla", "q_rank": 0, "flash": False},
    "MLA, eager core + dropout masks": {"attention": "mla", "flash": False, "dropout": True},
    "MLA, selective recompute, eager core": {"attention": "mla", "recompute": "selective", "flash": False},
    "MLA, selective recompute, flash": {"attention": "mla", "recompute": "selective"},
    "MLA, full recompute": {"attention": "mla", "recompute": "full"},
    "MLA, fp32": {"attention": "mla", "precision": "fp32"},
    "MLA + MoE + 1 shared expert (a DeepSeek-V2 layer)": {"attention": "mla", "experts": 4, "top_k": 2,
                                                           "shared_experts": 1},
}

#: cases estimated under a profile that keeps moe.mf's / dense.mf's generic layer lines (module docstring):
#: name -> (CASES name, training.framework)
PROFILE_CASES = {
    f"{name} [{framework}]": (name, framework)
    for framework in ("fsdp2",)
    for name in ("GQA g=a/2, flash", "eager SwiGLU (silu(gate) * up)", "MoE, 4 experts, top-2",
                 "MoE, eager SwiGLU experts", "MoE + 1 shared expert", "MoE + 1 shared expert, eager SwiGLU",
                 "MLA, query latent, flash", "MLA + MoE + 1 shared expert (a DeepSeek-V2 layer)")
}


@functools.lru_cache(maxsize=None)
def _measured(point: Point, framework: str | None = None) -> int:
    """What forward leaves saved, measured once per point and profile (a measurement never reads the formula
    files; the profile decides only where a MoE weights its tokens: torch_models.Shape.probs_in_experts)."""
    cfg = point.config()
    if framework:
        cfg["training"]["framework"] = framework
    return measure_step(cfg, point.precision).activations


def _estimated(point: Point, framework: str | None = None) -> int:
    """memform's end-of-forward moment for the same point (as compare.compare takes it), under the default
    profile or ``framework``. Not cached: the estimate must be recomputed from the formula files every
    time (bench/mutate.py serves mutated ones)."""
    cfg = point.config()
    if framework:
        cfg["training"]["framework"] = framework
    stage = memform.estimate(cfg).stages[0]
    return stage.moments.get("warmup", stage.values["activations"])


def _layer(point: Point, framework: str | None = None) -> tuple[int, int]:
    """(measured, estimated) bytes of one decoder layer: the two-layer model less the one-layer one."""
    one, two = dataclasses.replace(point, L=1), dataclasses.replace(point, L=2)
    return (_measured(two, framework) - _measured(one, framework),
            _estimated(two, framework) - _estimated(one, framework))


def norm_stat(point: Point) -> int:
    """4 bytes per token for each of the layer's norms (module docstring): the block's 2, and with MLA the
    KV latent's and, with query compression, the query latent's; none under full recompute."""
    norms = 2 + (1 + (point.q_rank > 0) if point.attention == "mla" else 0)
    return 0 if point.recompute == "full" else norms * 4 * point.b * point.s


def routing(point: Point) -> int:
    """The router's bookkeeping beyond moe.mf's router.act (module docstring), measured at E = 4, k = 2."""
    if point.experts == 1:
        return 0
    assert (point.experts, point.top_k) == (4, 2), "ROUTING was measured for 4 experts, top-2"
    return (80 - 4 * (2 * point.experts + point.top_k)) * point.b * point.s


@pytest.mark.parametrize("name", list(CASES))
def test_one_layer_measured_equals_formula(name):
    point = dataclasses.replace(BASE, **CASES[name])
    measured, estimated = _layer(point)
    assert measured == estimated + norm_stat(point) + routing(point), (
        f"{name}: measured {measured} B, formula {estimated} B + norm statistics {norm_stat(point)} B "
        f"+ routing {routing(point)} B")


@pytest.mark.parametrize("name", list(PROFILE_CASES))
def test_one_layer_measured_equals_formula_generic_profile(name):
    """As above, estimated under fsdp2, which keeps moe.mf's ``experts.act`` and dense.mf's ``mlp.act``
    (megatron redefines the former; module docstring). Same measurement, same remainder, 0 B tolerance."""
    case, framework = PROFILE_CASES[name]
    point = dataclasses.replace(BASE, **CASES[case])
    measured, estimated = _layer(point, framework)
    # the harness's MLA makes V contiguous (torch_models.MLAttention, as Megatron-Core); fsdp2.mf's torchtitan
    # keeps V as a view of wkv_b's whole output (dense.mf mla_v_view), a·d_h more per token
    v_view = ((4 if point.precision == "fp32" else 2) * point.b * point.s * (point.h // point.head_dim) * point.d_nope
              if point.attention == "mla" else 0)
    assert measured == estimated - v_view + norm_stat(point) + routing(point), (
        f"{name}: measured {measured} B, formula ({framework}) {estimated} B - V's view {v_view} B + norm statistics "
        f"{norm_stat(point)} B + routing {routing(point)} B")


def test_eager_swiglu_experts_keep_one_more_f_wide_tensor():
    """Eager SwiGLU experts (silu(gate) then · up, two ATen ops) keep silu(gate) for the product's backward,
    one f_exp-wide bf16 tensor per routed token more than the fused kernel: k·b·s = 2·2·64 = 256 routed
    tokens × 2 bytes × f = 176 = 90,112 bytes, measured (PyTorch derivatives.yaml: mul saves both factors)
    and estimated under the generic profile (moe.mf experts.act's ``eager_swiglu`` term) alike. With the
    router probabilities applied inside the experts (Megatron-Core's per_token_scale, the megatron profile's
    default) the product silu(gate)·up is itself kept by the probability product, one more f-wide tensor:
    2 × 90,112 bytes (frameworks/megatron/moe.mf fc2_in_b)."""
    fused = dataclasses.replace(BASE, experts=4, top_k=2)
    eager = dataclasses.replace(fused, swiglu_impl="eager")
    assert _layer(eager, "fsdp2")[0] - _layer(fused, "fsdp2")[0] == 256 * 2 * 176
    assert _layer(eager, "fsdp2")[1] - _layer(fused, "fsdp2")[1] == 256 * 2 * 176
    assert _layer(eager)[0] - _layer(fused)[0] == 2 * 256 * 2 * 176
    assert _layer(eager)[1] - _layer(fused)[1] == 2 * 256 * 2 * 176


@pytest.mark.parametrize("framework", [None, "fsdp2"])
def test_shared_expert_keeps_its_mlp_tensors_and_no_input(framework):
    """One shared expert of f = 176 (DeepSeek-V3 §2.1.2) runs on all b·s = 128 tokens and keeps, per token,
    its [gate | up] GEMM output 2·2f = 704 bytes and its SwiGLU output (the down projection's input) 2f = 352
    (Korthikanti et al. 2022 §4.1 with SwiGLU's two f-wide GEMMs); its input is the router's, already kept:
    128 × 1056 = 135,168 bytes more than the routed experts alone, measured and estimated (megatron's
    redefined ``shared_experts.act`` and moe.mf's generic one under fsdp2) alike. Eager SwiGLU keeps
    silu(gate) as well (PyTorch derivatives.yaml: mul saves both factors), 2f = 352 bytes per token more."""
    routed = dataclasses.replace(BASE, experts=4, top_k=2)
    shared = dataclasses.replace(routed, shared_experts=1)
    for impl, per_token in (("fused", 3 * 2 * 176), ("eager", 4 * 2 * 176)):
        without, with_shared = (dataclasses.replace(p, swiglu_impl=impl) for p in (routed, shared))
        assert _layer(with_shared)[0] - _layer(without)[0] == 128 * per_token, impl
        assert _layer(with_shared, framework)[1] - _layer(without, framework)[1] == 128 * per_token, impl


def _layer_of(point: Point, framework: str | None, **model) -> tuple[int, int]:
    """As :func:`_layer`, with ``model.*`` keys that :class:`Point` does not write set in both configs."""
    cfgs = []
    for L in (1, 2):
        cfg = dataclasses.replace(point, L=L).config()
        cfg["model"].update(model)
        if framework:
            cfg["training"]["framework"] = framework
        cfgs.append(cfg)
    measured = [measure_step(c, point.precision).activations for c in cfgs]
    estimated = [memform.estimate(c).stages[0].moments["warmup"] for c in cfgs]
    return measured[1] - measured[0], estimated[1] - estimated[0]


@pytest.mark.parametrize("framework", [None, "fsdp2"])
def test_shared_experts_width(framework):
    """The shared experts' total width is model.shared_expert_ffn_hidden_size when given (Qwen2-MoE's
    shared_expert_intermediate_size, Megatron-LM's --moe-shared-expert-intermediate-size), else
    num_shared_experts × moe_ffn_hidden_size (DeepSeek-V3 §2.1.2: each shared expert is as wide as a
    routed one), in the harness and in moe.mf's ``f_sh`` alike. Widths that differ from the dense
    ffn_hidden_size f = 176: a total of 96 keeps 128 tokens × 3 × 2 × 96 bytes; 2 shared experts of
    moe_ffn_hidden_size 48 keep 128 × 3 × 2 × 96 as well (not 2 × f)."""
    routed = dataclasses.replace(BASE, experts=4, top_k=2)
    # (shared experts, model keys of both sides, model keys of the shared side only)
    for n_shared, both, shared_only in ((1, {}, {"shared_expert_ffn_hidden_size": 96}),
                                        (2, {"moe_ffn_hidden_size": 48}, {})):
        without = _layer_of(routed, framework, **both)
        point = dataclasses.replace(routed, shared_experts=n_shared)
        with_shared = _layer_of(point, framework, **both, **shared_only)
        assert with_shared[0] - without[0] == with_shared[1] - without[1] == 128 * 3 * 2 * 96, (n_shared, both)


def test_layer_bytes_by_hand_gqa_flash():
    """The default case derived from tensor shapes, independently of both the formula and the harness
    (b = 2, s = 64: 128 tokens; h = 64, d_h = 16, g = 2 KV heads, f = 176; bf16 = 2 bytes; Llama: RMSNorm,
    SwiGLU, no biases, no dropout), per token:
      2 RMSNorm inputs 2·2h = 256 (Korthikanti §4.1), QKV input 2h = 128, Q 2h = 128, K and V 2·2·g·d_h =
      128 (GQA width, Ainslie et al. 2023), flash log-sum-exp fp32 per head 4a = 16 (Dao et al. 2022 §3.1),
      flash output / o_proj input 2h = 128, MLP input 2h = 128, SwiGLU input [gate|up] 2·2f = 704 and
      output 2f = 352 (fc2 input), and the norms' fp32 statistics 2·4 = 8."""
    per_token = 256 + 128 + 128 + 128 + 16 + 128 + 128 + 704 + 352 + 8
    measured, estimated = _layer(BASE)
    assert measured == 128 * per_token
    assert estimated == 128 * (per_token - 8)


def test_gqa_kv_width_is_measured():
    """K and V are stored at the GQA width g·d_h (Ainslie et al. 2023): MHA (g = 4) minus MQA (g = 1) keeps
    2 tensors × 3 heads × d_h = 16 × 2 bytes = 192 bytes per token more, measured and estimated alike."""
    mha, mqa = (dataclasses.replace(BASE, kv_heads=k) for k in (4, 1))
    assert _layer(mha)[0] - _layer(mqa)[0] == 128 * 192
    assert _layer(mha)[1] - _layer(mqa)[1] == 128 * 192


def test_eager_core_against_flash_is_measured():
    """The eager a·s² core (Korthikanti §4.1) keeps the bf16 softmax output, 2·a·s² per sequence; flash keeps
    the fp32 log-sum-exp, 4·a·s (Dao et al. 2022 §3.1): b·(2·a·s² − 4·a·s) = 2·(2·4·64² − 4·4·64) bytes more."""
    eager, flash = dataclasses.replace(BASE, flash=False), BASE
    expected = 2 * (2 * 4 * 64 * 64 - 4 * 4 * 64)
    assert _layer(eager)[0] - _layer(flash)[0] == expected
    assert _layer(eager)[1] - _layer(flash)[1] == expected


def test_layer_bytes_by_hand_mla_flash():
    """The default MLA case derived from tensor shapes, independently of both mla.mf and the harness
    (b = 2, s = 64: 128 tokens; h = 64, n_h = 4 heads; d_c' = 48, d_c = 32, d_h^R = 8, d_h = d_v = 16;
    f = 176; bf16; RMSNorm, SwiGLU, no biases, no dropout; DeepSeek-V2 eqs. (9)-(19)), per token:
      2 block RMSNorm inputs 2·2h = 256 (Korthikanti §4.1); the down projections' input 2h = 128;
      c^Q (eq. 12) 2·48 = 96 and its RMSNorm output (W^UQ's input) 96; the [c^KV | k^R] down-projection
      output (eqs. 9, 14; the KV norm's input is a view of it) 2·(32 + 8) = 80 and the normalised c^KV
      (W^UKV's input, eqs. 10-11) 2·32 = 64; Q and K (eqs. 16-17) 2·n_h·(d_h + d_h^R) = 192 each; V
      2·n_h·d_v = 128; flash log-sum-exp fp32 per head 4·n_h = 16 (Dao et al. 2022 §3.1); the output /
      W^O input (eq. 19) 2·n_h·d_v = 128; MLP input 2h = 128, [gate|up] 2·2f = 704, SwiGLU output 2f = 352;
      the fp32 1/rms of the 4 RMSNorms (block 2, c^Q, c^KV) 4·4 = 16."""
    per_token = 256 + 128 + 96 + 96 + 80 + 64 + 2 * 192 + 128 + 16 + 128 + 128 + 704 + 352 + 16
    measured, estimated = _layer(dataclasses.replace(BASE, attention="mla"))
    assert measured == 128 * per_token
    assert estimated == 128 * (per_token - 16)


def test_mla_query_latent_is_measured():
    """Query compression (d_c' = 48, eqs. 12-13) keeps c^Q before and after its RMSNorm, 2·2·48 = 192 bytes
    per token, which the direct h -> n_h·(d_h + d_h^R) projection of DeepSeek-V2-Lite (q_lora_rank 0, as
    Megatron-LM's linear_q_proj) does not -- and the latent norm's fp32 1/rms, 4 bytes (NORM_STAT),
    measured only: 128 tokens × (192 + 4) measured, 128 × 192 estimated."""
    with_q, without = (dataclasses.replace(BASE, attention="mla", q_rank=r) for r in (48, 0))
    assert _layer(with_q)[0] - _layer(without)[0] == 128 * (192 + 4)
    assert _layer(with_q)[1] - _layer(without)[1] == 128 * 192


def test_mla_flash_stand_in_keeps_what_the_kernel_keeps():
    """d_v = 24 = d_h + d_h^R runs PyTorch's own CPU flash kernel; d_v = 16 the stand-in
    (torch_models._FlashDiffVFn). Between them only V and the output (n_h·d_v each, Megatron-LM's
    contiguous value and the core's output) change width: 2 tensors × 4 heads × 8 × 2 bytes = 128 bytes
    per token, measured across the two kernels and estimated alike -- so the stand-in keeps no more and
    no less than the kernel it stands in for."""
    kernel, stand_in = (dataclasses.replace(BASE, attention="mla", d_v=d) for d in (24, 16))
    assert _layer(kernel)[0] - _layer(stand_in)[0] == 128 * 2 * 4 * 8 * 2
    assert _layer(kernel)[1] - _layer(stand_in)[1] == 128 * 2 * 4 * 8 * 2


@pytest.mark.parametrize("d_qk,d_v", [(24, 16), (16, 24)])
def test_mla_flash_stand_in_computes_attention(d_qk, d_v):
    """The stand-in's output and gradients equal PyTorch's reference causal attention (the unfused math
    path, float64) with softmax scale 1/sqrt(d_h + d_h^R), for a value head narrower and wider than the
    query/key head."""
    import torch
    import torch.nn.functional as F

    from memform.validation.torch_models import _FlashDiffVFn

    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 32, 4, d_qk, generator=gen, dtype=torch.float64).transpose(1, 2).requires_grad_()
            for _ in range(2))
    v = torch.randn(2, 32, 4, d_v, generator=gen, dtype=torch.float64).transpose(1, 2).requires_grad_()
    grad = torch.randn(2, 4, 32, d_v, generator=gen, dtype=torch.float64)
    results = []
    for attend in (_FlashDiffVFn.apply, lambda *t: F.scaled_dot_product_attention(*t, is_causal=True)):
        out = attend(q, k, v)
        q.grad = k.grad = v.grad = None
        out.backward(grad)
        results.append([out.detach(), q.grad, k.grad, v.grad])
    for got, expected in zip(*results):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("keys,message", [({"bias": True}, "no biases"),
                                          ({"position_embedding": "learned"}, "position_embedding: rope"),
                                          ({"qk_rope_head_dim": 7}, "must be even"),
                                          ({"attention": "gqa"}, "must be one of mha, mla")])
def test_mla_harness_refuses_what_it_does_not_build(keys, message):
    """The harness's MLA is DeepSeek-V2's (no biases, decoupled RoPE over pairs of d_h^R): other set-ups are
    refused with a ValueError naming the key, not measured as something else."""
    from memform.validation.torch_models import Shape

    cfg = dataclasses.replace(BASE, attention="mla").config()
    cfg["model"].update(keys)
    with pytest.raises(ValueError, match=message):
        Shape.from_config(cfg)
