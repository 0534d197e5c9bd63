"""Activation offloading (formulas/offload-decoder.mf, which dense.mf includes after the profile; issue 30): what
leaves the device goes to the stage's host bytes, once per micro-batch in flight; the importers map the flags that name it and refuse what
Megatron-Core refuses; transformers' checkpoint offload measured on a real step (bench/validate.py
--frameworks --only offload)."""

from __future__ import annotations

import json

import pytest
import yaml

from cli_helpers import ROOT
from cli_inprocess import memform_in_process
from estimate_helpers import numbers

LLAMA3_8B = ROOT / "configs" / "llama3-8b.yaml"   # TP4 + SP, DP2, pp 1, 8K tokens, no recompute
GiB = 2 ** 30


def config(**training):
    cfg = yaml.safe_load(LLAMA3_8B.read_text())
    cfg["training"].update(training)
    return cfg


def stage(cfg, overrides=None):
    return numbers(cfg, overrides).stages[0]


def test_offloaded_layers_leave_the_device_and_go_to_the_host():
    """Megatron --cpu-offloading-num-layers N: the bytes the end of forward no longer holds on the device are the
    host bytes, N offloaded layers' worth, proportional to N."""
    base = stage(config())
    assert base.host_bytes == 0
    hosts = {}
    for n in (1, 16, 31):
        st = stage(config(activation_offload="layers", activation_offload_layers=n))
        hosts[n] = st.host_bytes
        assert base.moments["warmup"] - st.moments["warmup"] == st.host_bytes
        assert st.values["params"] == base.values["params"] and st.values["optimizer"] == base.values["optimizer"]
    assert hosts[16] == 16 * hosts[1] and hosts[31] == 31 * hosts[1]
    # the step's peak (the head's backward, before any decoder's reload) drops by at most what went to the host
    st = stage(config(activation_offload="layers", activation_offload_layers=16))
    assert 0 < base.values["activations"] - st.values["activations"] <= st.host_bytes


def test_checkpoint_offload_moves_each_kept_layer_input():
    """transformers' activation_checkpointing_kwargs offload: each fully recomputed decoder's kept input, 2sbh
    split over TP by SP (Korthikanti et al. 2022 Table 2: full recompute keeps 2sbh/t per layer), to the host."""
    s, b, h, t, L = 8192, 1, 4096, 4, 32
    base = stage(config(recompute="full"))
    st = stage(config(recompute="full", activation_offload="checkpoint"))
    assert st.host_bytes == L * 2 * s * b * h // t
    assert base.moments["warmup"] - st.moments["warmup"] == st.host_bytes
    # without recompute there is no checkpoint input to offload
    assert stage(config(activation_offload="checkpoint")).host_bytes == 0


def test_host_bytes_count_once_per_micro_batch_in_flight():
    """With a pipeline every in-flight micro-batch has its own host copies (1F1B: stage 0 holds min(p, m))."""
    one = stage(config(recompute="full", activation_offload="checkpoint"))
    piped = numbers(config(recompute="full", activation_offload="checkpoint"), {"parallel.pp": 2}).stages[0]
    # stage 0 of 2 holds 16 decoders' inputs for 2 micro-batches: as many bytes as 32 decoders for one
    assert piped.host_bytes == one.host_bytes


def test_trl_offloads_every_decoder_tensor():
    """TRL activation_offloading (all): the decoders' whole saved activations go to the host; what the device
    keeps at the end of forward is the embedding's and the head's."""
    base = stage(config())
    st = stage(config(activation_offload="all"))
    assert base.moments["warmup"] - st.moments["warmup"] == st.host_bytes
    assert st.host_bytes > stage(config(activation_offload="layers", activation_offload_layers=31)).host_bytes


@pytest.mark.parametrize("sets, fragment", [
    ({"training.activation_offload": "layers", "training.activation_offload_layers": 32}, "below model.num_layers"),
    ({"training.activation_offload": "layers", "training.activation_offload_layers": 8, "parallel.pp": 2},
     "pipeline parallelism"),
])
def test_what_megatron_refuses_is_refused(sets, fragment):
    r = memform_in_process("estimate", LLAMA3_8B, *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")])
    assert r.returncode == 2 and fragment in r.stderr and "offload-decoder.mf" in r.stderr


# ---- importers ---------------------------------------------------------------------------------------
MEGATRON = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
            "--group-query-attention --num-query-groups 8 --seq-length 8192 --max-position-embeddings 8192 "
            "--vocab-size 128256 --micro-batch-size 1 --global-batch-size 32 --swiglu --normalization RMSNorm "
            "--disable-bias-linear --position-embedding-type rope --untie-embeddings-and-output-weights "
            "--tensor-model-parallel-size 4 --sequence-parallel --use-distributed-optimizer --bf16 "
            "--attention-dropout 0 --hidden-dropout 0 --use-flash-attn")


def test_megatron_cpu_offloading_is_imported(tmp_path):
    args = tmp_path / "args.txt"
    args.write_text(MEGATRON + " --cpu-offloading --cpu-offloading-num-layers 16\n")
    out = tmp_path / "job.yaml"
    r = memform_in_process("import", "megatron", args, "--devices", "8", "-o", out)
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load(out.read_text())
    assert cfg["training"]["activation_offload"] == "layers"
    assert cfg["training"]["activation_offload_layers"] == 16


@pytest.mark.parametrize("extra, flag", [
    (" --cpu-offloading --cpu-offloading-num-layers 32", "--cpu-offloading-num-layers"),
    (" --cpu-offloading --cpu-offloading-num-layers 8 --recompute-granularity selective", "--cpu-offloading"),
    (" --cpu-offloading --cpu-offloading-num-layers 8 --pipeline-model-parallel-size 2", "--cpu-offloading"),
    (" --cpu-offloading --cpu-offloading-num-layers 8 --cpu-offloading-double-buffering",
     "--cpu-offloading-double-buffering"),
    (" --fine-grained-activation-offloading --offload-modules core_attn --cpu-offloading --cpu-offloading-num-layers 8",
     "--fine-grained-activation-offloading"),
])
def test_megatron_offloading_not_modelled_is_refused_naming_the_flag(tmp_path, extra, flag):
    args = tmp_path / "args.txt"
    args.write_text(MEGATRON + extra + "\n")
    r = memform_in_process("import", "megatron", args, "--devices", "8")
    assert r.returncode == 2
    assert f"'{flag}'" in r.stderr and "Traceback" not in r.stderr


TRAINER = ROOT / "tests" / "data" / "importers" / "trainer" / "llama-3.1-8b-qlora.training_args.json"
LLAMA31 = ROOT / "tests" / "data" / "importers" / "hf" / "llama-3.1-8b.config.json"


@pytest.mark.parametrize("extra, mode", [
    ({"activation_checkpointing_kwargs": {"offload": True}, "gradient_checkpointing_kwargs": {"offload": True}},
     "checkpoint"),
    ({"activation_offloading": True}, "all"),
])
def test_trainer_offload_arguments_are_imported(tmp_path, extra, mode):
    from memform.importers import Options, import_config

    args = json.loads(TRAINER.read_text())
    args.update(extra)
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps(args))
    draft = import_config("hf", LLAMA31, Options(trainer=str(path)))
    assert draft.load_error is None, draft.load_error
    assert draft.get("training.activation_offload") == mode


# ---- measured: transformers' checkpoint offload on a real CPU step -----------------------------------------
def test_checkpoint_offload_measured_on_a_transformers_step():
    """A real transformers step with activation_checkpointing_enable(offload=True): the host copies
    save_on_cpu makes are exactly memform's host bytes, and every category is within its recorded bound."""
    pytest.importorskip("transformers", reason="transformers (the 'frameworks' extra) is not installed")
    from dataclasses import replace

    from memform.validation import frameworks
    from memform.validation.frameworks import hf

    row = frameworks.compare(replace(hf.BASE, gc=True, offload=True), hf)
    # 2 layers' inputs, b·s·h fp32 each: 2 × 2 × 256 × 128 × 4 B
    assert row.measured["host"] == row.estimated["host"] == 2 * 2 * 256 * 128 * 4
    assert row.failures() == []


def test_torchtitan_graph_trainer_offload_policy_is_refused(tmp_path):
    """torchtitan 0.3.0 offloads activations only in experiments/graph_trainer ([compile] memory_policy
    sac_and_offload), which is not modelled: refused with the field named."""
    toml = tmp_path / "train.toml"
    toml.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nseq_len = 8192\n'
                    '[compile]\nenable = true\nmemory_policy = "sac_and_offload"\n')
    r = memform_in_process("import", "torchtitan", toml)
    assert r.returncode == 2 and "'compile.memory_policy'" in r.stderr and "Traceback" not in r.stderr
