"""fsdp2 profile: torchtitan's Float8 training (fsdp2.float8, fsdp2.float8_all_gather) and torch.distributed
pipelining under FSDP2, held against the titan harness's traces (validation/frameworks/titan.py; measured
with torchtitan 0.3.0 + torchao 0.18 under FakeTensorMode, rank 0, `python bench/validate.py --frameworks
--only float8` / `--only pp2`). Each expected figure is the traced one, MiB; the tolerance is the recorded
agreement's order (bounds.yaml). Runs without torchtitan: the configs are the harness's memform_config()."""
from __future__ import annotations

import copy

import pytest

import memform
from memform.errors import MemformError

MiB = 2 ** 20

# TitanCase("llama3_8b", world=8, layers=2).memform_config(): torchtitan's Llama-3.1-8B recipe cut to 2 blocks
BASE = {
    "name": "titan-8b-l2",
    "model": {"hidden_size": 4096, "num_layers": 2, "num_heads": 32, "num_kv_heads": 8, "ffn_hidden_size": 14336,
              "vocab_size": 128256, "seq_length": 8192, "activation": "swiglu", "norm": "rmsnorm", "bias": False,
              "dropout": False, "flash_attention": True, "tied_embeddings": False, "position_embedding": "rope",
              "swiglu_impl": "eager", "cross_entropy": "eager"},
    "parallel": {"dp": 8, "tp": 1, "pp": 1, "sequence_parallel": False},
    "training": {"framework": "fsdp2", "micro_batch_size": 1, "num_micro_batches": 1, "loss_chunks": 8,
                 "recompute": "selective",
                 "precision": {"params": "bf16", "grads": "fp32", "optimizer": "fp32", "activations": "bf16",
                               "master_weights": True}},
    "fsdp2": {"param_dtype": "bf16", "reduce_dtype": "fp32", "selective_ac": "op", "fused_qkv": True},
}


def config(fsdp2=None, training=None, parallel=None, model=None):  # noqa: ANN001, ANN201
    cfg = copy.deepcopy(BASE)
    for key, extra in (("fsdp2", fsdp2), ("training", training), ("parallel", parallel), ("model", model)):
        cfg[key].update(extra or {})
    return cfg


def stage(cfg, i=0):  # noqa: ANN001, ANN201
    return memform.estimate(cfg).stages[i]


# (case, fsdp2 keys, training keys, traced activations, traced activation peak) -- bench/validate.py
# --frameworks --only float8, titan llama3_8b L2 fsdp8 [...] fake rows
FLOAT8 = [
    ("bf16 (op SAC)", {}, {}, 1154, 3036),                                      # the loss's moment
    ("tensorwise", {"float8": "tensorwise"}, {}, 1154, 3246),                   # w2's input cast in backward
    ("rowwise", {"float8": "rowwise"}, {}, 1154, 3246),
    ("rowwise_with_gw_hp", {"float8": "rowwise_with_gw_hp"}, {}, 1154, 3036),   # bf16 weight-gradient GEMM
    ("tensorwise fp8-ag", {"float8": "tensorwise", "float8_all_gather": True}, {}, 1154, 3190),
    ("full AC rowwise", {"float8": "rowwise"}, {"recompute": "full"}, 256, 2797),
]


@pytest.mark.parametrize("name, fsdp2, training, act, peak", FLOAT8, ids=[f[0] for f in FLOAT8])
def test_float8_activations_and_peak_match_the_trace(name, fsdp2, training, act, peak):
    st = stage(config(fsdp2, training))
    # Float8Linear saves its high-precision operands: the saved activations are bf16's
    assert st.values["activations"] / MiB == pytest.approx(peak, rel=0.04)
    assert st.moments.get("warmup", act * MiB) / MiB == pytest.approx(act, rel=0.001)


def test_float8_static_bytes_are_bf16_training_s():
    # torchao keeps the weights (and so FSDP's shards, gradients, AdamW moments) in their dtype
    a, b = stage(config()), stage(config({"float8": "rowwise"}))
    assert all(a.values[c] == b.values[c] for c in ("params", "grads", "optimizer"))


def test_fp8_all_gather_gathers_the_block_linears_in_one_byte():
    # 70B-like unit, 64 ranks: the blocks' FSDP buffers shrink by a block's linear weights (2 -> 1 byte)
    # beside the bf16 norms; the peak is set by the cast, which no longer copies the weight to fp8
    big = {"num_layers": 8}
    plain, ag = (memform.estimate(config({"float8": "tensorwise", "float8_all_gather": x}, model=big))
                 for x in (False, True))
    assert ag.stages[0].values["activations"] < plain.stages[0].values["activations"]


@pytest.mark.parametrize("fsdp2, needle", [
    ({"float8": "rowwise", "float8_all_gather": True}, "fsdp2.float8_all_gather needs fsdp2.float8: tensorwise"),
    ({"float8": "fp8"}, "fsdp2.float8"),
])
def test_float8_refusals_name_the_key(fsdp2, needle):
    with pytest.raises(MemformError, match=needle.replace(".", r"\.")):
        memform.estimate(config(fsdp2))


# TitanCase("llama3_8b", world=8, layers=4, pp=2, batch=4, stage=0[, ac="full"]).memform_config(): PP 2 x FSDP 4,
# Schedule1F1B, 4 micro-batches of 1; traced rank 0 (stage 0: the embedding and 2 blocks), MiB
PP = {"parallel": {"dp": 4, "pp": 2, "grad_accumulation_shard": False, "stage_layers": [2, 2], "pp_schedule": "1f1b"},
      "training": {"num_micro_batches": 4}, "model": {"num_layers": 4}, "fsdp2": {"reshard_after_forward": False}}
PIPELINE = [
    # recompute, grads (sharded + the fp32 accumulator), activations (end of warm-up), peak, comm
    ("selective", 4585, 2436, 3796, 2004),
    ("full", 4585, 640, 2449, 2004),
]


@pytest.mark.parametrize("recompute, grads, act, peak, comm", PIPELINE, ids=[p[0] for p in PIPELINE])
def test_pipeline_stage0_matches_the_trace(recompute, grads, act, peak, comm):
    cfg = config(PP["fsdp2"], {**PP["training"], "recompute": recompute}, PP["parallel"], PP["model"])
    st = stage(cfg, 0)
    # FSDP's unsharded fp32 accumulation over the micro-batches (no gradient sync under pipelining) is gradient
    # memory; the stage output cached in fwd_cache per in-flight micro-batch is activation memory, and so are
    # pipelining's 4 receive buffers for the output's gradient (one per micro-batch, 64 MiB each, kept for the job)
    assert st.values["grads"] / MiB == pytest.approx(grads, rel=0.001)
    assert st.moments["warmup"] / MiB == pytest.approx(act, rel=0.001)
    assert st.values["activations"] / MiB == pytest.approx(peak, rel=0.06)
    # the embedding's copy-in without gradient sync: the reduce-scatter input only (fp32, 4 B per parameter)
    assert st.values["comm"] / MiB == pytest.approx(comm, rel=0.001)


def test_pipeline_last_stage_keeps_the_norm_gradient_s_head_sized_buffer():
    # stage 1 (2 blocks, the final norm and the head, chunked loss): the sharded gradients + the fp32
    # accumulator (3,668 MiB) + the head shard the final norm's gradient view keeps alive (501 MiB)
    cfg = config(PP["fsdp2"], {**PP["training"], "recompute": "selective"}, PP["parallel"], PP["model"])
    st = stage(cfg, 1)
    assert st.values["grads"] / MiB == pytest.approx(5086, rel=0.001)
    # (with its 4 receive buffers for the input, 64 MiB each, and its output, the final norm's hidden states,
    # kept in fwd_cache until the micro-batch's backward)
    assert st.values["activations"] / MiB == pytest.approx(3292, rel=0.001)
    assert st.moments["warmup"] / MiB == pytest.approx(1410, rel=0.001)
    one = config(PP["fsdp2"], {"num_micro_batches": 1, "recompute": "selective"}, {**PP["parallel"]}, PP["model"])
    # one micro-batch: no accumulation, no second reduce-scatter for the norm to share
    assert stage(one, 1).values["grads"] / MiB == pytest.approx(917, rel=0.001)


@pytest.mark.parametrize("fp8_all_gather, params", [(True, 2335), (False, 2751)])
def test_pipeline_stage0_keeps_its_float8_weights_as_all_gathered(fp8_all_gather, params):
    # stage 0 under PP keeps its blocks' gathered weights from forward to backward: the fp8 all-gather's 1-byte
    # buffers, or bf16 ones without it (torchtitan <= 2026-04 turns it off at dp_shard 1, the 405B benchmark's
    # FSDP 1 x CP 8 row). Traced: bench/validate.py --frameworks --only "stage0 b4 float8-tensorwise", MiB
    from estimate_helpers import numbers
    cfg = config({**PP["fsdp2"], "float8": "tensorwise", "float8_all_gather": fp8_all_gather},
                 {**PP["training"], "recompute": "selective"}, PP["parallel"], PP["model"])
    assert numbers(cfg).stages[0].values["params"] / MiB == pytest.approx(params, rel=0.001)
