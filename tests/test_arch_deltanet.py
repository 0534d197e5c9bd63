"""Gated DeltaNet hybrids (formulas/deltanet.mf, importers/hf_linear.py): Qwen3-Next's released config.json at
its published totals, the per-layer parameter count of each mixer against transformers' own modules, the
importer's layer patterns and refusals, and one real transformers training step on CPU against the estimate
(validation/frameworks/hf_linear.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import memform
from memform.importers import Options, import_config
from hf_helpers import import_hf

HF = Path(__file__).resolve().parent / "data" / "importers" / "hf"
ROOT = Path(__file__).resolve().parents[1]
NEXT = HF / "qwen3-next-80b-a3b-instruct.trimmed.config.json"


def total(cfg, overrides=None) -> int:
    est = memform.estimate(cfg, overrides=overrides or {})
    return sum(stage.param_count for stage in est.stages)



# Qwen3-Next-80B-A3B-Instruct (tests/data/importers/hf/README.md): the Hub safetensors total recorded by
# debaditc/kvfit src/kvfit/data/models.json @ bd4ccabf (81,324,862,720) holds one MTP module (mtp.*: a
# gated-attention MoE layer, fc 2h -> h, three norms = 1,650,471,424); transformers' Qwen3NextForCausalLM
# builds none: 79,674,391,296 (sum of numel over the model built from this config.json on the meta device,
# transformers 5). Both exact; the published "80B total" (transformers docs model_doc/qwen3_next.md).
@pytest.mark.parametrize("overrides, expected", [
    ({}, 79_674_391_296),
    ({"model.mtp_layers": 1}, 81_324_862_720),
])
def test_qwen3_next_80b_totals(overrides, expected):
    draft = import_hf(NEXT)
    assert draft.load_error is None
    assert draft.config()["formulas"] == ["deltanet.mf"]
    assert total(draft.config(), overrides) == expected


def test_bundled_config_is_the_published_total():
    # configs/qwen3-next-80b-a3b.yaml carries the MTP module: the Hub safetensors total
    single = {"parallel.dp": 1, "parallel.ep": 1, "parallel.pp": 1}
    assert total(str(ROOT / "configs" / "qwen3-next-80b-a3b.yaml"), single) == 81_324_862_720


# Per-layer parameters of each mixer against transformers' modules (toy shapes, numel summed):
# Qwen3NextGatedDeltaNet = in_proj_qkvz h(2kd+2vd) + in_proj_ba h·2Hv + conv1d cd·K + dt_bias + A_log 2Hv
# + norm d_v + out_proj vd·h; Qwen3NextAttention with the gate: q_proj h·2a·dh + k,v h·g·dh + o_proj a·dh·h +
# q/k norms 2dh.
SHAPES = [
    dict(h=64, nk=2, nv=4, dk=16, dv=16, K=4, a=4, g=2, dh=16),
    dict(h=96, nk=3, nv=6, dk=8, dv=24, K=3, a=6, g=3, dh=8),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda d: f"h{d['h']}-{d['nk']}/{d['nv']}")
def test_mixer_params_match_transformers_modules(shape):
    pytest.importorskip("transformers")
    from transformers import AutoConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention, Qwen3NextGatedDeltaNet

    d = shape
    hf = AutoConfig.for_model("qwen3_next", hidden_size=d["h"], linear_num_key_heads=d["nk"],
                              linear_num_value_heads=d["nv"], linear_key_head_dim=d["dk"],
                              linear_value_head_dim=d["dv"], linear_conv_kernel_dim=d["K"], num_hidden_layers=4,
                              num_attention_heads=d["a"], num_key_value_heads=d["g"], head_dim=d["dh"],
                              intermediate_size=128, num_experts=0, vocab_size=100)
    gdn = sum(p.numel() for p in Qwen3NextGatedDeltaNet(hf, 0).parameters())
    attn = sum(p.numel() for p in Qwen3NextAttention(hf, 3).parameters())
    cfg = {"name": "x", "formulas": ["deltanet.mf"], "model": {
        "hidden_size": d["h"], "num_heads": d["a"], "num_kv_heads": d["g"], "head_dim": d["dh"], "num_layers": 4,
        "ffn_hidden_size": 128, "vocab_size": 100, "seq_length": 64, "activation": "swiglu", "norm": "rmsnorm",
        "bias": False, "dropout": False, "flash_attention": True, "position_embedding": "rope",
        "qk_norm": True, "attention_output_gate": True, "full_attention_interval": 4,
        "linear_num_key_heads": d["nk"], "linear_num_value_heads": d["nv"], "linear_key_head_dim": d["dk"],
        "linear_value_head_dim": d["dv"], "linear_conv_kernel_dim": d["K"]}}
    mlp_norms = 3 * d["h"] * 128 + 2 * d["h"]
    head = 2 * 100 * d["h"] + d["h"]
    assert total(cfg) == head + 3 * (gdn + mlp_norms) + (attn + mlp_norms)


@pytest.mark.parametrize("fields, key, expected", [
    ({"full_attention_interval": 4}, "model.full_attention_interval", 4),
    ({"full_attention_interval": 2}, "model.full_attention_interval", 2),
    ({}, "model.full_attention_interval", 4),  # Qwen3NextConfig's default interval
    ({"layer_types": ["linear_attention", "full_attention", "full_attention", "linear_attention"]},
     "model.linear_attention_pattern", "G**G"),
])
def test_layer_pattern_is_read(tmp_path, fields, key, expected):
    cfg = {"model_type": "qwen3_next", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "num_hidden_layers": 4, "intermediate_size": 128, "vocab_size": 100,
           "max_position_embeddings": 64, "num_experts": 0, **fields}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    draft = import_hf(path)
    assert draft.get(key) == expected
    assert draft.load_error is None


@pytest.mark.parametrize("fields, words", [
    ({"layer_types": ["linear_attention", "mamba", "full_attention", "full_attention"]}, "layer_types"),
    ({"layer_types": ["linear_attention", "full_attention"]}, "2 entries for 4 layers"),
    ({"linear_num_key_heads": 3, "linear_num_value_heads": 4}, "linear_num_value_heads"),
    ({"attn_output_gate": False}, "attn_output_gate"),
])
def test_bad_linear_fields_are_refused_naming_the_field(tmp_path, fields, words):
    cfg = {"model_type": "qwen3_next", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "num_hidden_layers": 4, "intermediate_size": 128, "vocab_size": 100,
           "max_position_embeddings": 64, "num_experts": 0, **fields}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(memform.MemformError, match=words):
        import_hf(path)


@pytest.mark.parametrize("override, words", [
    ({"parallel.cp": 2}, "context parallelism"),
    ({"model.full_attention_interval": 0, "model.linear_attention_pattern": "G*"}, "one letter per layer"),
    ({"model.linear_attention_pattern": "GGX*" * 12}, "linear_attention_pattern"),
    ({"model.linear_attention_pattern": "GGG*" * 12}, "not both"),
])
def test_user_mistakes_name_the_key(override, words):
    with pytest.raises(memform.MemformError, match=words):
        memform.estimate(import_hf(NEXT).config(), overrides=override)


def test_transformers_step_within_thresholds():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from memform.validation import frameworks
    from memform.validation.frameworks import hf_linear

    for case in hf_linear.quick_sweep():
        row = frameworks.compare(case, hf_linear)
        errors = ", ".join(f"{c} {row.error(c):+.2%}" for c in frameworks.CATEGORIES)
        assert not row.failures(), f"{case.label()}: {errors}; at the peak: {row.peak_by_op}"
        # parameters and gradients to the byte; AdamW's states within its 4-byte step scalar per parameter
        for cat in ("params", "grads"):
            assert row.measured[cat] == row.estimated[cat], (case.label(), cat)
        assert 0 <= row.measured["optimizer"] - row.estimated["optimizer"] <= 4 * 128, case.label()


# Whole models: transformers' own count (numel over the model built from the config on the meta device)
# against the import of the same config.json -- dense and MoE layers mixed with the two mixers (mlp_only_layers,
# decoder_sparse_step), an explicit layer_types list, GVA and not, and Qwen3.5's text models (split in_proj).
WHOLE = [
    ("qwen3_next", {"num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": [0, 5]}),
    ("qwen3_next", {"num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 2,
                    "layer_types": ["linear_attention", "full_attention"] * 3}),
    ("qwen3_next", {"num_experts": 0, "linear_num_value_heads": 2, "full_attention_interval": 3}),
    ("qwen3_5_text", {}),
    ("qwen3_5_moe_text", {"num_experts": 4, "num_experts_per_tok": 2}),
]


@pytest.mark.parametrize("model_type, extra", WHOLE, ids=[f"{m}-{i}" for i, (m, _) in enumerate(WHOLE)])
def test_whole_model_count_matches_transformers(tmp_path, model_type, extra):
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = {**dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=6,
              intermediate_size=96, vocab_size=300, max_position_embeddings=128, linear_num_key_heads=2,
              linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=3,
              moe_intermediate_size=32, shared_expert_intermediate_size=48, tie_word_embeddings=False), **extra}
    hf = AutoConfig.for_model(model_type, **kw)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    expected = sum(p.numel() for p in model.parameters())
    hf.save_pretrained(tmp_path)
    draft = import_hf(tmp_path / "config.json")
    assert draft.load_error is None, draft.load_error
    assert total(draft.config()) == expected


# One Gated DeltaNet layer, measured: a transformers step with layer_types [G, G, *] minus one with [G, *] is
# one Gated DeltaNet layer with its MLP and norms (validation/frameworks/hf_linear.py); memform's difference
# the same. Held to 0.1 % (measured: to a few bytes per token) across the fallback's regimes: fp32 with GVA
# (Hv > Hk), fp32 without (views keep silu's output), bf16 (real casts), autocast (16-bit matmuls), s padded
# to whole chunks or not (100, 200), b = 1, two and four chunks. The last case (stop 47): fp32 with GVA, s a
# whole number of chunks and b = 1, where the fallback keeps one more fp32 q/k copy per token (deltanet.mf
# torch_qk's b = 1 term; it kills seed 606's surviving mutant `b == 1` -> `b == 0`).
ONE_LAYER = [dict(), dict(lin_v_heads=2, lin_v_dim=24, s=256), dict(dtype="bf16", lin_k_dim=24), dict(s=100),
             dict(s=200, dtype="amp-bf16"), dict(s=100, lin_v_heads=2, b=1),
             dict(lin_k_heads=4, lin_v_heads=8, conv=3), dict(dtype="amp-bf16", s=256), dict(b=1)]


@pytest.mark.parametrize("shape", ONE_LAYER, ids=[str(i) for i in range(len(ONE_LAYER))])
def test_one_gated_deltanet_layer_to_the_byte(shape):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from dataclasses import replace

    from memform.validation import frameworks
    from memform.validation.frameworks import hf_linear

    g, a = "linear_attention", "full_attention"
    base = replace(hf_linear.BASE, **shape)
    one = frameworks.compare(replace(base, L=2, layer_types=(g, a)), hf_linear)
    two = frameworks.compare(replace(base, L=3, layer_types=(g, g, a)), hf_linear)
    measured = two.measured["activations"] - one.measured["activations"]
    estimated = two.estimated["activations"] - one.estimated["activations"]
    assert abs(estimated - measured) <= 0.001 * measured, (measured, estimated)


# Megatron-LM arguments of the same model (megatron/training/arguments.py names; Megatron-Core builds the
# Gated DeltaNet layers with --experimental-attention-variant gated_delta_net): the import counts what
# transformers' Qwen3NextForCausalLM holds, 79,674,391,296 (NullTokenizer: 151,935 + 1 = 151,936 entries).
MEGATRON_Q3N = """torchrun --nproc_per_node 8 pretrain_gpt.py \\
  --num-layers 48 --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 2 \\
  --kv-channels 256 --ffn-hidden-size 5120 --seq-length 4096 --max-position-embeddings 262144 \\
  --normalization RMSNorm --apply-layernorm-1p --swiglu --disable-bias-linear --untie-embeddings-and-output-weights \\
  --position-embedding-type rope --rotary-percent 0.25 --qk-layernorm --attention-output-gate \\
  --attention-dropout 0.0 --hidden-dropout 0.0 \\
  --experimental-attention-variant gated_delta_net --linear-attention-freq {freq} --linear-conv-kernel-dim 4 \\
  --linear-key-head-dim 128 --linear-value-head-dim 128 --linear-num-key-heads 16 --linear-num-value-heads 32 \\
  --num-experts 512 --moe-router-topk 10 --moe-ffn-hidden-size 512 --moe-shared-expert-intermediate-size 512 \\
  --moe-shared-expert-gate --moe-grouped-gemm --expert-model-parallel-size 8 \\
  --tokenizer-type NullTokenizer --vocab-size 151935 --make-vocab-size-divisible-by 128 \\
  --micro-batch-size 1 --global-batch-size 64 --bf16 --use-distributed-optimizer
"""


@pytest.mark.parametrize("freq, key, value", [
    ("4", "model.full_attention_interval", 4),
    ("'([1]*3+[0])*12'", "model.full_attention_interval", 4),
    ("'[1]*46+[0]*2'", "model.linear_attention_pattern", "G" * 46 + "**"),
])
def test_megatron_script_reads_gated_deltanet(tmp_path, freq, key, value):
    script = tmp_path / "run.sh"
    script.write_text(MEGATRON_Q3N.format(freq=freq))
    draft = import_config("megatron", script, Options())
    assert draft.load_error is None, draft.load_error
    assert draft.get(key) == value
    if key == "model.full_attention_interval":
        assert total(draft.config(), {"parallel.dp": 1, "parallel.ep": 1, "parallel.devices": 1}) == 79_674_391_296


@pytest.mark.parametrize("edit, words", [
    (("gated_delta_net", "kimi_delta_attention"), "experimental-attention-variant"),
    (("--linear-key-head-dim 128 ", ""), "linear-key-head-dim"),
    (("--linear-attention-freq {freq}", "--linear-attention-freq '[1]*5'"), "linear-attention-freq"),
])
def test_megatron_gated_deltanet_mistakes_name_the_argument(tmp_path, edit, words):
    script = tmp_path / "run.sh"
    script.write_text(MEGATRON_Q3N.replace(*edit).format(freq=4))
    with pytest.raises(memform.MemformError, match=words):
        import_config("megatron", script, Options())


def test_all_full_attention_qwen3_next_keeps_the_gate(tmp_path):
    # layer_types all full_attention: no Gated DeltaNet keys, the gated attention still counted (transformers
    # builds Qwen3NextAttention with q_proj 2·a·d_h whatever the layer pattern)
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = AutoConfig.for_model("qwen3_next", hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              num_hidden_layers=2, intermediate_size=96, vocab_size=300, num_experts=0,
                              layer_types=["full_attention"] * 2, tie_word_embeddings=False)
    with torch.device("meta"):
        expected = sum(p.numel() for p in AutoModelForCausalLM.from_config(hf).parameters())
    hf.save_pretrained(tmp_path)
    draft = import_hf(tmp_path / "config.json")
    assert draft.get("model.attention_output_gate") is True and "model.full_attention_interval" not in draft
    assert total(draft.config()) == expected


@pytest.mark.parametrize("extra, mtp, error", [
    ({"mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False}, 1, None),
    ({"mtp_num_hidden_layers": 0}, None, None),
    ({"mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": True}, None, "mtp_use_dedicated_embeddings"),
])
def test_qwen3_5_mtp_fields(tmp_path, extra, mtp, error):
    # Qwen3.5's released text configs (e.g. the text_config quoted in public deployment tests: mtp_num_hidden_layers
    # 1, mtp_use_dedicated_embeddings false): the checkpoint's MTP module, counted as moe.mf's mtp block
    cfg = {"model_type": "qwen3_5_text", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "num_hidden_layers": 4, "intermediate_size": 128, "vocab_size": 100,
           "max_position_embeddings": 64, "full_attention_interval": 4, "mamba_ssm_dtype": "float32", **extra}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    if error:
        with pytest.raises(memform.MemformError, match=error):
            import_hf(path)
        return
    draft = import_hf(path)
    assert draft.get("model.mtp_layers") == mtp and draft.load_error is None


# The HF Trainer has no selective recompute (gradient_checkpointing is whole layers); memform's "selective"
# re-runs the attention core (Korthikanti et al. 2022 §5), and a flash kernel's core keeps only its output and
# the log-sum-exp, which the recompute keeps too (Dao et al. 2022 §3.1): under hf-trainer with flash
# attention, selective keeps exactly what none keeps in every layer -- the gated attention's gate and, in an
# fp32 model, the q_proj output q_norm's view holds (frameworks/hf-trainer/deltanet.mf) included.
# (issue 35: seed 101's survivor hf-trainer/deltanet.mf attention act[selective] `drop super`)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_hf_trainer_selective_keeps_what_none_keeps_with_flash_attention(dtype):
    from estimate_helpers import numbers
    over = {"training.framework": "hf-trainer", "parallel.tp": 1, "parallel.sequence_parallel": False,
            "parallel.zero": 0, "parallel.dp": 1, "parallel.pp": 1, "parallel.ep": 1, "model.num_layers": 4,
            "model.mtp_layers": 0, "model.seq_length": 1024, "training.precision.params": dtype,
            "training.precision.activations": dtype, "training.precision.grads": dtype,
            "training.precision.optimizer": dtype, "training.precision.master_weights": False}
    per = {rc: [(g.block, g.per_layer_values["activations"]) for g in numbers(
        ROOT / "configs" / "qwen3-next-80b-a3b.yaml", {**over, "training.recompute": rc}).stages[0].layers]
        for rc in ("none", "selective")}
    assert {b for b, _ in per["none"]} >= {"gdn_moe_decoder", "moe_decoder"}
    assert per["selective"] == per["none"]


# A config that leaves out the Gated DeltaNet shape keys reads deltanet.mf's defaults, which are transformers'
# Qwen3NextConfig defaults (configuration_qwen3_next.py, transformers 5.25: linear_num_key_heads 16,
# linear_num_value_heads 32, linear_key_head_dim 128, linear_value_head_dim 128, linear_conv_kernel_dim 4) --
# the released Qwen3-Next-80B-A3B config.json's values, so the bundled config without them is the same model.
# Both kernels (fla and the torch fallback read the heads differently). (issue 35: seed 606's survivor
# `deltanet.mf:17:60 32 -> 64`, the value-head default, told apart only by a draw that dropped the key)
@pytest.mark.parametrize("kernel", ["fla", "torch"])
def test_omitted_linear_shape_keys_take_transformers_defaults(kernel):
    import yaml

    from estimate_helpers import numbers
    raw = yaml.safe_load((ROOT / "configs" / "qwen3-next-80b-a3b.yaml").read_text())
    defaults = {"linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
                "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}
    assert {k: raw["model"].pop(k) for k in defaults} == defaults
    over = {"model.num_layers": 4, "model.mtp_layers": 0, "model.gdn_kernel": kernel}
    bare, spelled = numbers(raw, over), numbers(ROOT / "configs" / "qwen3-next-80b-a3b.yaml", over)
    assert [(s.param_count, s.exprs) for s in bare.stages] == [(s.param_count, s.exprs) for s in spelled.stages]


# The fla kernel's causal conv (deltanet.mf gdn fla_conv): causal_conv1d_fn keeps its input x, conv_dim =
# 2·key_dim + v_dim wide (causal-conv1d causal_conv1d_interface.py CausalConv1dFn.forward: ctx.save_for_backward(x,
# weight, bias, ...); the fused silu's output is not kept), in the activation dtype -- Qwen3-Next's released shapes
# (16 key heads and 32 value heads of 128): 2·2048 + 4096 = 8192 channels, bf16, 16,384 B per token (per_token is
# the whole layer's; act divides it over t, the conv splitting with its channels). The kernel is CUDA-only (no CPU build; transformers
# falls back to F.conv1d, the torch kernel measured above), so the source is the check here; a CUDA run of
# Qwen3NextGatedDeltaNet with causal-conv1d and fla installed, saved_tensors_hooks per layer as the torch kernel's
# cases do, would measure it. (issue 35: seed 808's survivor deltanet.mf:139:27, fla_conv dropped from fla's
# per-token figure)
def test_fla_per_token_figure_keeps_the_causal_conv_input():
    from estimate_helpers import numeric_model

    model = numeric_model(ROOT / "configs" / "qwen3-next-80b-a3b.yaml", {
        "model.num_layers": 4, "model.mtp_layers": 0, "model.gdn_kernel": "fla", "parallel.tp": 1,
        "parallel.sequence_parallel": False, "parallel.ep": 1, "parallel.pp": 1, "parallel.dp": 1})
    ev = model.evaluator()
    others = sum(int(ev.quantity("gdn", q)) for q in ("fla_gates", "fla_kernel", "fla_norm", "proj_in"))
    assert int(ev.quantity("gdn", "per_token")) - others == 2 * (2 * 16 * 128 + 32 * 128)
