"""Megatron-Core's fine-grained activation offloading (training.activation_offload: modules; formulas/offload-decoder.mf,
offload-megatron.mf; issue 30): each named module's saved tensors of at least --min-offloaded-tensor-size elements go
to host memory, once per micro-batch in flight; what Megatron refuses (and what memform does not model) is refused,
in the config and in `memform import megatron`. Every figure below is the module's saved tensors as
megatron-core 0.19.2 saves them (attention.py get_query_key_value_tensors / core_attention / linear_proj under the
Transformer Engine spec), at Llama-3-8B's sizes: s = 8192, b = 1, h = 4096, a = 32, g = 8, TP 4 with SP, bf16."""

from __future__ import annotations

import pytest
import yaml

from cli_helpers import ROOT
from cli_inprocess import memform_in_process
from estimate_helpers import numbers

LLAMA3_8B = ROOT / "configs" / "llama3-8b.yaml"   # TP4 + SP, DP2, pp 1, 8K tokens, no recompute, flash attention
MiB = 2 ** 20
L, s, b, h, t, qw, kv = 32, 8192, 1, 4096, 4, 4096, 1024
X = 2 * s * b * h // t            # one s·b·h bf16 tensor split over TP by SP: 16 MiB
Q = 2 * s * b * qw // t           # the queries (and the core's output) on a TP rank: 16 MiB
KV = 2 * s * b * kv // t          # K or V at GQA width: 4 MiB, 2 Mi elements


def config(**training):
    cfg = yaml.safe_load(LLAMA3_8B.read_text())
    cfg["training"].update(training)
    return cfg


def modules(*names, **training):
    return config(activation_offload="modules", activation_offload_modules=list(names), **training)


BASE = None


def base():
    global BASE
    BASE = BASE or numbers(config()).stages[0]
    return BASE


def freed(st):
    """What the end of warm-up no longer holds on the device."""
    return base().moments["warmup"] - st.moments["warmup"]


# After the first step Megatron keeps the groups of the last layer of the first chunk to run backward on the
# device (post_warmup_callback): the end of warm-up frees L - 1 decoders' groups; the host holds all L (the
# pinned pool, sized by the first step, never shrinks)
def test_qkv_linear_moves_the_layer_input_and_the_norm_output():
    """TE LayerNormLinear keeps the block input and its norm's output; both leave the device."""
    st = numbers(modules("qkv_linear")).stages[0]
    assert st.host_bytes == L * 2 * X
    assert freed(st) == (L - 1) * 2 * X
    assert st.values["params"] == base().values["params"]


def test_core_attn_moves_q_k_v_and_copies_the_output():
    """The core's Q, K, V are freed; flash attention's output goes to the host too but linear_proj keeps it on the
    device; its fp32 log-sum-exp (a·s·b/t = 65,536 elements) is below the 1 Mi-element threshold and stays."""
    st = numbers(modules("core_attn")).stages[0]
    assert freed(st) == (L - 1) * (Q + 2 * KV)
    assert st.host_bytes == L * (Q + 2 * KV + Q)
    # with no threshold the log-sum-exp (4 bytes per row) goes too
    st0 = numbers(modules("core_attn", activation_offload_min_elements=0)).stages[0]
    lse = 4 * 32 * s * b // t
    assert freed(st0) - freed(st) == (L - 1) * lse and st0.host_bytes - st.host_bytes == L * lse


def test_attn_proj_frees_the_output_and_keeps_two_host_copies():
    st = numbers(modules("core_attn", "attn_proj")).stages[0]
    assert freed(st) == (L - 1) * (Q + 2 * KV + Q)
    assert st.host_bytes == L * (Q + 2 * KV + 2 * Q)


def test_the_norm_groups_and_the_expert_groups_hold_nothing_on_a_dense_te_layer():
    """Under the Transformer Engine spec a dense layer's norms are fused into the QKV and fc1 GEMMs (IdentityOp
    input_layernorm / pre_mlp_layernorm: no group) and it has no experts."""
    st = numbers(modules("attn_norm", "mlp_norm", "expert_fc1", "moe_act")).stages[0]
    assert st.host_bytes == 0 and freed(st) == 0


def test_the_local_spec_norm_groups_move_the_norm_input():
    """The local spec's norms are modules of their own: attn_norm and mlp_norm move each norm's saved input (with
    CUDA's fused RMSNorm: the input; rstd, one fp32 per token, stays below the threshold)."""
    st = numbers(modules("attn_norm", "mlp_norm"), {"megatron.transformer_impl": "local"}).stages[0]
    b0 = numbers(config(), {"megatron.transformer_impl": "local"}).stages[0]
    assert st.host_bytes == L * 2 * X
    assert b0.moments["warmup"] - st.moments["warmup"] == (L - 1) * 2 * X


def test_threshold_keeps_small_tensors():
    """--min-offloaded-tensor-size 4 Mi elements: K and V (2 Mi elements each) stay, Q (8 Mi) goes."""
    st = numbers(modules("core_attn", activation_offload_min_elements=4 * MiB)).stages[0]
    assert freed(st) == (L - 1) * Q


# The unfused core's a·s² tensors (scores, softmax output) are one tensor each of a·s²·b/(t·cp) elements on a
# rank: the threshold reads that count (Megatron's --min-offloaded-tensor-size, 1 Mi elements). At s 512 and 16
# sequences per micro-batch each is 33.5 Mi elements (TP 4): all of the core group leaves, as with no threshold;
# at s 256, b 1, TP 8 each is 256 Ki elements and Q/K/V at most 128 Ki: nothing leaves the device. (issue 35:
# stop 47's unargued offload-decoder.mf:123:96 `s * b` -> `s / b` and :124:136 `t` -> `cp` in those counts)
@pytest.mark.parametrize("sets, all_leave", [
    ({"model.seq_length": 512, "training.micro_batch_size": 16}, True),
    ({"model.seq_length": 256, "parallel.tp": 8, "model.dropout": False}, False),
])
def test_unfused_core_tensors_meet_the_threshold_per_rank(sets, all_leave):
    unfused = {"model.flash_attention": False, "parallel.pp": 1, **sets}
    st = numbers(modules("core_attn"), unfused).stages[0]
    none_kept = numbers(modules("core_attn", activation_offload_min_elements=0), unfused).stages[0]
    assert none_kept.host_bytes > 0
    assert st.host_bytes == (none_kept.host_bytes if all_leave else 0)


def test_recomputed_core_opens_no_group():
    """--recompute-modules core_attn: attention.py's checkpointed branch runs outside the core_attn group."""
    st = numbers(modules("core_attn", "attn_proj", recompute="selective")).stages[0]
    assert st.host_bytes == L * Q


def test_the_peak_drops_by_what_left_the_device():
    """With Llama-3's vocabulary the step's peak is the head's backward, before any decoder's reload: it drops by
    what the end of warm-up freed. With a small vocabulary a decoder's backward is the peak: its groups come back
    (each host copy a tensor of its own: the core's output twice), the kept layer's before it is freed."""
    layer = 2 * X + Q + 2 * KV + Q
    st = numbers(modules("qkv_linear", "core_attn", "attn_proj")).stages[0]
    assert base().values["activations"] - st.values["activations"] == freed(st) == (L - 1) * layer
    small = {"model.vocab_size": 1024}
    b0 = numbers(config(), small).stages[0]
    st = numbers(modules("qkv_linear", "core_attn", "attn_proj"), small).stages[0]
    assert st.peak_moment == b0.peak_moment == "backward"
    # the backward moment above the end of warm-up: the layer's groups back with the output's two host copies,
    # less the kept layer's groups, freed by then
    assert (st.moments["backward"] - st.moments["warmup"]) - (b0.moments["backward"] - b0.moments["warmup"]) \
        == (layer + Q) - layer


@pytest.mark.parametrize("pp, vpp", [(2, 1), (4, 2)])
def test_host_copies_once_per_micro_batch_in_flight(pp, vpp):
    """Pipelines are allowed: one chunk handler per micro-batch and model chunk, so each stage's host bytes are
    its in-flight layer passes times one layer's groups; the device keeps one decoder's per stage."""
    over = {"parallel.pp": pp, "parallel.vpp": vpp}
    est = numbers(modules("qkv_linear"), over)
    ref = numbers(config(), over)
    for st, st0 in zip(est.stages, ref.stages):
        assert st.host_bytes % (2 * X) == 0
        assert st.host_bytes - (st0.moments["warmup"] - st.moments["warmup"]) == 2 * X
    assert est.stages[0].host_bytes > est.stages[-1].host_bytes


@pytest.mark.parametrize("sets, fragment", [
    (["training.activation_offload=modules"], "at least one module"),
    (["training.activation_offload=modules", "training.activation_offload_modules=[attn_proj]"], "needs core_attn"),
    (["training.activation_offload_modules=[core_attn]"], "needs training.activation_offload: modules"),
    (["training.activation_offload=modules", "training.activation_offload_modules=[fused_group_mlp]"],
     "not modelled"),
    (["training.activation_offload=modules", "training.activation_offload_modules=[core_attn]",
      "training.framework=torch"], "training.framework: megatron"),
])
def test_what_megatron_refuses_is_refused(sets, fragment):
    r = memform_in_process("estimate", LLAMA3_8B, *[a for kv in sets for a in ("--set", kv)])
    assert r.returncode == 2 and fragment in r.stderr and "offload-decoder.mf" in r.stderr


def test_unknown_module_names_the_key():
    r = memform_in_process("estimate", LLAMA3_8B, "--set", "training.activation_offload=modules",
                           "--set", "training.activation_offload_modules=[core_atn]")
    assert r.returncode == 2 and "training.activation_offload_modules" in r.stderr and "core_atn" in r.stderr
    assert "Traceback" not in r.stderr


MIXTRAL = ROOT / "configs" / "mixtral-8x7b.yaml"   # pp 2, s 4096, top-2 of 8 experts of f 14336, tp 1


def test_moe_layers_offload_the_pre_mlp_norm_and_the_experts_groups():
    """A MoE layer's pre-MLP norm is a TENorm of its own (its input, s·h bf16), expert_fc1 moves the permuted
    tokens (k·s routed tokens, h each) and moe_act fc1's output (2·f_exp per routed token), with TEGroupedMLP;
    stage 0 of 2 holds 2 micro-batches of 16 layers, less one layer's groups kept on the device."""
    cfg = yaml.safe_load(MIXTRAL.read_text())
    cfg["training"]["recompute"] = "none"
    grouped = {"model.moe_grouped_gemm": True}
    b0 = numbers(cfg, grouped).stages[0]
    tok, h_, f_exp, passes = 2 * 4096, 4096, 14336, 2 * 16
    for mods, per in ((["mlp_norm"], 2 * 4096 * h_), (["expert_fc1"], tok * 2 * h_),
                      (["moe_act"], tok * 2 * 2 * f_exp)):
        cfg["training"].update(activation_offload="modules", activation_offload_modules=mods)
        st = numbers(cfg, grouped).stages[0]
        assert st.host_bytes == passes * per
        assert b0.moments["warmup"] - st.moments["warmup"] == (passes - 1) * per
    # SequentialMLP (no grouped GEMM) opens no expert group
    cfg["training"].update(activation_offload_modules=["expert_fc1", "moe_act"])
    assert numbers(cfg).stages[0].host_bytes == 0


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_moe_layers_offload_their_attention_as_a_dense_layer_does(recompute):
    """The attention of a MoE layer is the dense layer's module (Megatron's TransformerLayer, the same
    self_attention submodule): qkv_linear moves the block input and its norm's output (s·h bf16 each, tp 1), under
    selective recompute too (only core_attn is recomputed: its group closes, test_recomputed_core_opens_no_group);
    Mixtral's stage 0 of 2 holds 2 micro-batches of 16 layers, less one layer's groups kept on the device. (issue
    35: stop 47's unargued offload-moe.mf:26:40, the attention's groups dropped from a MoE layer's selective
    device share, reached by no draw of MoE x selective x attention modules: bench/mutate.py STOP48_PAIR_DRAWS)"""
    cfg = yaml.safe_load(MIXTRAL.read_text())
    cfg["training"]["recompute"] = recompute
    b0 = numbers(cfg).stages[0]
    per, passes = 2 * 2 * 4096 * 4096, 2 * 16
    cfg["training"].update(activation_offload="modules", activation_offload_modules=["qkv_linear"])
    st = numbers(cfg).stages[0]
    assert st.host_bytes == passes * per
    assert b0.moments["warmup"] - st.moments["warmup"] == (passes - 1) * per


def test_mla_and_a_recomputed_moe_are_refused():
    r = memform_in_process("estimate", ROOT / "configs" / "deepseek-v2-lite.yaml", "--set",
                           "training.activation_offload=modules", "--set",
                           "training.activation_offload_modules=[core_attn]")
    assert r.returncode == 2 and "MLA" in r.stderr
    r = memform_in_process("estimate", MIXTRAL, "--set", "training.recompute=selective", "--set",
                           "training.recompute_modules=[moe]", "--set", "training.activation_offload=modules",
                           "--set", "training.activation_offload_modules=[expert_fc1]")
    assert r.returncode == 2 and "offload-moe.mf" in r.stderr


# ---- importer ------------------------------------------------------------------------------------------
MEGATRON = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
            "--group-query-attention --num-query-groups 8 --seq-length 8192 --max-position-embeddings 8192 "
            "--vocab-size 128256 --micro-batch-size 1 --global-batch-size 32 --swiglu --normalization RMSNorm "
            "--disable-bias-linear --position-embedding-type rope --untie-embeddings-and-output-weights "
            "--tensor-model-parallel-size 4 --sequence-parallel --use-distributed-optimizer --bf16 "
            "--attention-dropout 0 --hidden-dropout 0 --use-flash-attn")
# Megatron-LM docs/user-guide/features/fine_grained_activation_offloading.md, "Basic Usage": its two argument lines,
# continued as a launch script continues its arguments
DOC_FRAGMENT = ("    --fine-grained-activation-offloading \\\n"
                "    --offload-modules core_attn attn_proj expert_fc1 \\\n")


def test_megatron_fine_grained_offloading_is_imported(tmp_path):
    script = tmp_path / "pretrain_llama3_8b.sh"
    lines = ["--" + arg for arg in MEGATRON[2:].split(" --")] + ["--pipeline-model-parallel-size 2"]
    script.write_text("#!/bin/bash\npython pretrain_gpt.py \\\n" + "".join(f"    {ln} \\\n" for ln in lines)
                      + DOC_FRAGMENT + "    --min-offloaded-tensor-size 1048576\n")
    out = tmp_path / "job.yaml"
    r = memform_in_process("import", "megatron", script, "--devices", "16", "-o", out)
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load(out.read_text())
    assert cfg["training"]["activation_offload"] == "modules"
    assert cfg["training"]["activation_offload_modules"] == ["core_attn", "attn_proj", "expert_fc1"]
    assert cfg["training"]["activation_offload_min_elements"] == 1048576
    assert numbers(cfg).stages[0].host_bytes > 0


MIXTRAL_SCRIPT = ROOT / "tests" / "data" / "importers" / "megatron" / "megatron-lm_train_mixtral_8x7b_distributed.sh"


def test_nvidias_mixtral_script_fits_with_the_expert_groups_offloaded(tmp_path):
    """NVIDIA's Megatron-LM Mixtral 8x7B example (tests/data/importers/megatron/README.md: PP 4, EP 8, grouped GEMM,
    no recompute) with the documented flags added in a second file: stage 0 holds 4 micro-batches of 8 MoE
    layers; each offloads its routed tokens' fc1 input (h) and fc1 output (2·f_exp), 2 × 4096 tokens each."""
    extra = tmp_path / "offload.args"
    extra.write_text("--fine-grained-activation-offloading --offload-modules expert_fc1 moe_act\n")
    out = tmp_path / "job.yaml"
    r = memform_in_process("import", "megatron", MIXTRAL_SCRIPT, extra, "--devices", "64",
                           "--set", "model.vocab_size=32000", "-o", out)
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load(out.read_text())
    assert cfg["training"]["activation_offload_modules"] == ["expert_fc1", "moe_act"]
    st = numbers(cfg).stages[0]
    assert st.host_bytes == 4 * 8 * (2 * 4096) * 2 * (4096 + 2 * 14336)
    assert st.fits and not numbers(cfg, {"training.activation_offload": "none",
                                         "training.activation_offload_modules": []}).stages[0].fits


@pytest.mark.parametrize("extra, flag", [
    (" --fine-grained-activation-offloading", "--fine-grained-activation-offloading"),
    (" --fine-grained-activation-offloading --offload-modules core_atn", "--offload-modules"),
    (" --fine-grained-activation-offloading --offload-modules attn_proj", "--offload-modules"),
    (" --fine-grained-activation-offloading --offload-modules core_attn --cpu-offloading",
     "--fine-grained-activation-offloading"),
    (" --fine-grained-activation-offloading --offload-modules core_attn --transformer-impl local",
     "--fine-grained-activation-offloading"),
    (" --fine-grained-activation-offloading --offload-modules core_attn --recompute-granularity full "
     "--recompute-method uniform --recompute-num-layers 1", "--fine-grained-activation-offloading"),
    (" --fine-grained-activation-offloading --offload-modules core_attn --activation-offload-fraction 0.5",
     "--activation-offload-fraction"),
    (" --fine-grained-activation-offloading --offload-modules core_attn --delta-offload-bytes-across-pp-ranks 1024",
     "--delta-offload-bytes-across-pp-ranks"),
    (" --fine-grained-activation-offloading --offload-modules core_attn --multi-latent-attention "
     "--kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128",
     "--fine-grained-activation-offloading"),
    (" --fine-grained-activation-offloading --offload-modules expert_fc1 --num-experts 8 --moe-router-topk 2 "
     "--recompute-granularity selective --recompute-modules moe", "--offload-modules"),
])
def test_megatron_fine_grained_not_modelled_is_refused_naming_the_flag(tmp_path, extra, flag):
    args = tmp_path / "args.txt"
    args.write_text(MEGATRON + extra + "\n")
    r = memform_in_process("import", "megatron", args, "--devices", "8")
    assert r.returncode == 2, r.stderr
    assert f"'{flag}'" in r.stderr and "Traceback" not in r.stderr


# ---- measured: megatron-core's own handler on the CPU (bench/validate.py --frameworks --only mcore) -------------
@pytest.mark.slow
def test_fine_grained_offload_measured_on_megatron_core_1f1b():
    """megatron-core 0.19.2's fine-grained offloading (local spec, 1F1B on 2 gloo ranks, core_attn + attn_proj):
    the host copies are memform's host bytes to the byte, and the offload moves the end of warm-up's activations
    (both stages) and stage 0's peak by exactly what memform says (each row's error is the same as without
    offloading)."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    from dataclasses import replace

    from memform.validation import frameworks
    from memform.validation.frameworks import mcore

    off = [c for c in mcore.offload_sweep() if c.pp == 2 and c.vpp == 1]
    plain = [replace(c, offload=()) for c in off]
    mcore.run(off + plain)
    for o, p in zip(off, plain):
        ro, rp = frameworks.compare(o, mcore), frameworks.compare(p, mcore)
        assert ro.measured["host"] == ro.estimated["host"] > 0
        assert ro.measured["activations"] - ro.estimated["activations"] == \
            rp.measured["activations"] - rp.estimated["activations"]
        if o.stage == 0:
            assert ro.measured["activations_peak"] - ro.estimated["activations_peak"] == \
                rp.measured["activations_peak"] - rp.estimated["activations_peak"]
