"""``memform import deepspeed`` on real ds_config.json files (issue 31): each imports right or is refused.

Fixtures: tests/data/importers/deepspeed/ (README.md names each file's repository, path and commit).
Every expected number below cites where it comes from: the ds_config itself, DeepSpeed's code
(deepspeed/runtime/config.py, zero/config.py, precision_config.py of DeepSpeed 0.19.8), or the
measurements published with DeepSpeedExamples training/bf16_master_weight (README.md, 4 × H100).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import memform
from memform.errors import MemformError
from memform.importers import Options, import_config
from cli_helpers import run_memform
from cli_inprocess import memform_in_process  # memform.cli.main in this process (same output)

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "importers" / "deepspeed"
GPT = ROOT / "tests" / "fixtures" / "deepspeed" / "gpt-7.5b.yaml"
BF16_MODEL = DATA / "dse-bf16-master-7b.model.yaml"
GIB = 2 ** 30


def draft_of(name: str, model: Path = GPT, **options) -> "memform.importers.draft.Draft":
    return import_config("deepspeed", DATA / name, Options(model=str(model), **options))


# ---- files that import: the values each one sets ------------------------------------------------------
IMPORTS = [
    # transformers tests/deepspeed/ds_config_zero2.json: the HF Trainer's ZeRO-2 + CPU optimizer offload,
    # everything the Trainer fills "auto" (precision assumed bf16, written as a default)
    ("hf-tests-ds_config_zero2.json", {}, {
        "parallel.zero": 2, "deepspeed.offload_optimizer": "cpu", "deepspeed.overlap_comm": True,
        "deepspeed.reduce_bucket_size": 200_000_000, "deepspeed.allgather_bucket_size": 200_000_000,
        "deepspeed.contiguous_gradients": True, "training.precision.params": "bf16"}),
    # transformers tests/deepspeed/ds_config_zero3.json: ZeRO-3 with both offloads (ZeRO-Infinity on CPU),
    # fp16, its explicit buckets (0 = none) and sub_group_size 1e14
    ("hf-tests-ds_config_zero3.json", {"devices": 8}, {
        "parallel.zero": 3, "parallel.dp": 8, "deepspeed.offload_optimizer": "cpu", "deepspeed.offload_param": "cpu",
        "deepspeed.sub_group_size": 10 ** 14, "deepspeed.reduce_bucket_size": 0,
        "deepspeed.stage3_prefetch_bucket_size": 0, "deepspeed.stage3_param_persistence_threshold": 0,
        "deepspeed.stage3_max_live_parameters": 10 ** 9, "deepspeed.stage3_max_reuse_distance": 10 ** 9,
        "training.precision.params": "fp16"}),
    # Megatron-DeepSpeed examples_deepspeed/rebase: train_batch_size 256, micro 8, no accumulation given:
    # on 8 devices DeepSpeed derives gradient_accumulation_steps = 256 // 8 // 8 = 4 (_set_batch_related_parameters)
    ("mds-rebase-gbs256_mbs8_zero1.json", {"devices": 8}, {
        "parallel.zero": 1, "parallel.dp": 8, "training.micro_batch_size": 8, "training.num_micro_batches": 4,
        "training.global_batch_size": 256, "training.precision.params": "fp16"}),
    # ... on 32 devices: 256 = 8 × 1 × 32
    ("mds-rebase-gbs256_mbs8_zero1.json", {"devices": 32}, {
        "parallel.dp": 32, "training.micro_batch_size": 8, "training.num_micro_batches": 1}),
    # Megatron-DeepSpeed examples_deepspeed/sequence_parallel: ZeRO-3 fp16, 16 = 1 × 2 × 8
    ("mds-sp-gbs16_mbs1_zero3.json", {"devices": 8}, {
        "parallel.zero": 3, "training.micro_batch_size": 1, "training.num_micro_batches": 2,
        "training.precision.params": "fp16"}),
    # Megatron-DeepSpeed examples/MoE (0.125B GPT-3 MoE): ZeRO-0 fp16, curriculum learning off; 256 = 4 × 8 × 8
    ("mds-moe-gpt3-0.125B.json", {"devices": 8}, {
        "parallel.zero": 0, "training.micro_batch_size": 4, "training.num_micro_batches": 8,
        "training.precision.params": "fp16"}),
    # Megatron-DeepSpeed ds_config.json: ZeRO-3 + CPU optimizer offload (NVMe/aio settings are host-side),
    # 16 = 16 × 1 × dp: one data-parallel rank
    ("mds-zero3-offload.json", {}, {
        "parallel.zero": 3, "parallel.dp": 1, "deepspeed.offload_optimizer": "cpu",
        "deepspeed.reduce_bucket_size": 90_000_000, "deepspeed.stage3_max_live_parameters": 3 * 10 ** 9,
        "deepspeed.stage3_max_reuse_distance": 3 * 10 ** 9, "training.micro_batch_size": 16}),
    # DeepSpeedExamples training/imagenet ds_fp16_z1_config.json: train_batch_size 256 with accumulation 1:
    # DeepSpeed's micro batch = 256 // 8 // 1 = 32; its "cuda_visible_devices" is no DeepSpeed key (vouched for)
    ("dse-imagenet-fp16-z1.json", {"devices": 8, "accept": ("cuda_visible_devices",)}, {
        "parallel.zero": 1, "training.micro_batch_size": 32, "training.num_micro_batches": 1,
        "training.precision.params": "fp16"}),
    # DeepSpeedExamples training/autotuning/hf/dsconfigs/ds_config_z3.json: ZeRO-3, no fp16/bf16 (fp32), micro "auto"
    ("dse-autotuning-z3.json", {}, {"parallel.zero": 3, "training.precision.params": "fp32"}),
    # DeepSpeedExamples training/bf16_master_weight configs: ZeRO-3, bf16, reduce_bucket_size 5e7, persistence 0
    ("dse-bf16-master-baseline.json", {"devices": 4}, {
        "parallel.zero": 3, "deepspeed.reduce_bucket_size": 50_000_000, "deepspeed.overlap_comm": True,
        "deepspeed.stage3_param_persistence_threshold": 0, "training.micro_batch_size": 4,
        "training.precision.params": "bf16"}),
    ("dse-bf16-master-bf16_full.json", {"devices": 4, "accept": ("torch_autocast.enabled",)}, {
        "parallel.zero": 3, "deepspeed.master_weights_and_grads": "bf16", "training.precision.optimizer": "bf16",
        "training.precision.params": "bf16"}),
]


@pytest.mark.parametrize("name, options, expected", IMPORTS, ids=[f"{c[0]}-{i}" for i, c in enumerate(IMPORTS)])
def test_real_ds_configs_import(name, options, expected):
    model = BF16_MODEL if name.startswith("dse-bf16") else GPT
    draft = draft_of(name, model, **options)
    assert {k: draft.get(k) for k in expected} == expected
    assert draft.load_error is None, draft.load_error
    est = memform.estimate(yaml.safe_load(draft.to_yaml()))
    assert est.model.structure.framework == "deepspeed" and est.stages[0].peak_bytes > 0


# ---- files that are refused: exit 2, the file and the key named, the reason given ----------------------
REFUSED = [
    # DeepSpeedExamples training/tensor_parallel/hf_integration: AutoTP over 4 ranks
    ("dse-autotp-hf.json", "tensor_parallel.autotp_size", "AutoTP is not modelled"),
    # DeepSpeedExamples training/DeepSpeed-ZenFlow: ZenFlow's device-side gradient columns
    ("dse-zenflow.json", "zero_optimization.zenflow", "ZenFlow"),
    # DeepSpeedExamples training/bing_bert: block-sparse attention
    ("dse-bing-bert-lamb-sparse.json", "sparse_attention", "block-sparse attention"),
    # DeepSpeedExamples training/BingBertSquad 1-bit Adam: error-feedback buffers
    ("dse-onebitadam.json", "optimizer.type", "OnebitAdam"),
    # DeepSpeedExamples compression/gpt2: weight / activation quantisation
    ("dse-compression-w8a8.json", "compression_training", "quantisation"),
    # Megatron-DeepSpeed ds_zero2_config_bf16.json: "bfp16" is no dtype DeepSpeed accepts (ValueError)
    ("mds-zero2-bf16.json", "communication_data_type", "get_communication_data_type"),
    # torch_autocast changes the activations' dtypes: refused unless --accept vouches for it
    ("dse-bf16-master-bf16_full.json", "torch_autocast.enabled", "--accept torch_autocast.enabled"),
    # Megatron-DeepSpeed examples/random_ltd: "dynamic_train" (random layer-token dropping) is not read
    ("mds-random-ltd-bert.json", "dynamic_train", "--accept dynamic_train"),
    # Megatron-DeepSpeed ds_config.json on 8 devices: 16 != 16 × 1 × 8
    ("mds-zero3-offload.json", "train_batch_size 16", "_batch_assertion"),
    # DeepSpeedExamples imagenet: "cuda_visible_devices" is no DeepSpeed key
    ("dse-imagenet-fp16-z1.json", "cuda_visible_devices", "--accept cuda_visible_devices"),
]


@pytest.mark.parametrize("name, key, reason", REFUSED)
def test_real_ds_configs_refused_with_a_reason(name, key, reason):
    model = BF16_MODEL if name.startswith("dse-bf16") else GPT
    r = run_memform("import", "deepspeed", DATA / name, "--model", model, "--devices", "8")
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and name in r.stderr and key in r.stderr and reason in r.stderr, r.stderr


# ---- bf16 master weights / optimizer states against DeepSpeedExamples' measurements --------------------
#: training/bf16_master_weight/README.md, 4 × H100, 6.86B model, ZeRO-3, batch 1, seq 512, checkpointing:
#: "Allocated Memory" (after the step: the model states) and "Peak Memory", in GB of 1024³ bytes
#: (train.py format_memory divides by 1024 ** 3)
MEASURED = {"dse-bf16-master-baseline.json": (25.74, 31.38), "dse-bf16-master-bf16_full.json": (16.17, 18.93)}
#: the allowed |error| of (allocated, peak): bf16_full's peak is 5.3 % low -- it runs under torch.autocast
#: (fp32 norms, softmax and loss), which memform does not model and --accept takes on trust
LIMITS = {"dse-bf16-master-baseline.json": (0.03, 0.03), "dse-bf16-master-bf16_full.json": (0.03, 0.06)}


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_bf16_master_example_matches_its_measured_memory(name):
    # the README's 7B command: --batch_size 1 --activation_checkpointing (the ds_config's micro batch 4 is
    # not what train.py feeds), on --num_gpus=4
    draft = draft_of(name, BF16_MODEL, devices=4, accept=("torch_autocast.enabled",) if "full" in name else (),
                     overrides={"training.micro_batch_size": 1, "training.recompute": "full"})
    stage = memform.estimate(yaml.safe_load(draft.to_yaml())).stages[0]
    allocated, peak = MEASURED[name]
    assert stage.param_count == pytest.approx(6.86e9, rel=0.001)   # README: "approximately 6.86 billion parameters"
    errors = (stage.static_bytes / GIB / allocated - 1, stage.peak_bytes / GIB / peak - 1)
    assert all(abs(e) <= limit for e, limit in zip(errors, LIMITS[name])), (name, errors)


def test_bf16_master_saves_what_the_readme_says():
    # README: "Memory reduction: 9.57 GB allocated (37%)": 16 → 10 bytes per parameter partition (bf16
    # params 2 + grads 2 + master 2 + moments 2 + 2, against fp32 master 4 + moments 4 + 4)
    static = {}
    for name in MEASURED:
        draft = draft_of(name, BF16_MODEL, devices=4, accept=("torch_autocast.enabled",) if "full" in name else ())
        static[name] = memform.estimate(yaml.safe_load(draft.to_yaml())).stages[0].static_bytes
    saved = 1 - static["dse-bf16-master-bf16_full.json"] / static["dse-bf16-master-baseline.json"]
    assert saved == pytest.approx(0.372, abs=0.01)   # README: 9.57 / 25.74 = 37.2 %


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_bf16_master_bytes_per_parameter(zero):
    # stage_1_and_2.py single_partition_of_fp32_groups / stage3.py fp32_partitioned_groups_flat in the
    # master dtype; Adam's moments follow it (bf16_optimizer_states): 2 + 2 + 2 = 6 bytes, against 12
    base = {"training.framework": "deepspeed", "parallel.zero": zero, "parallel.dp": 4,
            "training.precision.params": "bf16"}
    full = memform.estimate(GPT, base).stages[0]
    low = memform.estimate(GPT, {**base, "deepspeed.master_weights_and_grads": "bf16",
                                 "training.precision.optimizer": "bf16"}).stages[0]
    assert low.values["optimizer"] * 2 == full.values["optimizer"]
    assert low.values["params"] == full.values["params"] and low.values["grads"] == full.values["grads"]


@pytest.mark.parametrize("override, needle", [
    ({"parallel.zero": 0}, "needs parallel.zero 1, 2 or 3"),
    ({"training.precision.optimizer": "fp32"}, "keeps Adam's moments in bf16"),
])
def test_bf16_master_requires_what_deepspeed_requires(override, needle):
    cfg = {"training.framework": "deepspeed", "parallel.zero": 2, "parallel.dp": 4, "training.precision.params": "bf16",
           "deepspeed.master_weights_and_grads": "bf16", "training.precision.optimizer": "bf16", **override}
    with pytest.raises(MemformError, match=needle):
        memform.estimate(GPT, cfg)


def test_bf16_optimizer_states_needs_master_weights(tmp_path):
    src = tmp_path / "ds.json"
    src.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2},
                               "bf16": {"enabled": True, "bf16_optimizer_states": True}}))
    r = run_memform("import", "deepspeed", src, "--model", GPT)
    assert r.returncode == 2 and "bf16.bf16_optimizer_states" in r.stderr and "Traceback" not in r.stderr


# ---- the batch triangle (runtime/config.py _set_batch_related_parameters, _batch_assertion) -----------
TRIANGLE = [
    # (micro, accumulation, train batch) as given; --devices; expected (micro, accumulation, train batch)
    ((4, 2, None), 8, (4, 2, 64)),          # train_batch_size = 4 × 2 × 8
    ((None, 2, 64), 8, (4, 2, 64)),         # micro = 64 // 8 // 2
    ((4, None, 64), 8, (4, 2, 64)),         # accumulation = 64 // 4 // 8
    ((None, None, 64), 8, (8, 1, 64)),      # accumulation 1, micro = 64 // 8
    ((4, None, None), 8, (4, 1, 32)),       # accumulation 1, train batch = 4 × 8
    ((4, 2, 64), 8, (4, 2, 64)),            # consistent
]


@pytest.mark.parametrize("given, devices, expected", TRIANGLE)
def test_batch_triangle_follows_the_device_count(tmp_path, given, devices, expected):
    keys = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
    src = tmp_path / "ds.json"
    src.write_text(json.dumps({**{k: v for k, v in zip(keys, given) if v is not None},
                               "zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}))
    draft = import_config("deepspeed", src, Options(model=str(GPT), devices=devices))
    got = tuple(draft.get(k) for k in ("training.micro_batch_size", "training.num_micro_batches",
                                       "training.global_batch_size"))
    assert got == expected and draft.get("parallel.dp") == devices and draft.load_error is None


@pytest.mark.parametrize("given, devices", [((4, 2, 64), 4), ((None, 3, 64), 8), ((4, None, 60), 8)])
def test_an_inconsistent_batch_triangle_exits_2_naming_the_keys(tmp_path, given, devices):
    keys = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
    src = tmp_path / "ds.json"
    src.write_text(json.dumps({k: v for k, v in zip(keys, given) if v is not None}))
    r = run_memform("import", "deepspeed", src, "--model", GPT, "--devices", str(devices))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "_batch_assertion" in r.stderr and all(k in r.stderr for k, v in zip(keys, given) if v is not None)


def test_without_devices_the_three_sides_set_dp():
    # the older fixture's style: 512 = 4 × 16 × dp 8
    draft = import_config("deepspeed", ROOT / "tests" / "fixtures" / "deepspeed" / "megatron_ds_zero1.json",
                          Options(model=str(GPT)))
    assert (draft.get("parallel.dp"), draft.get("training.num_micro_batches")) == (8, 16)


# ---- --model X.yaml: only X's model ---------------------------------------------------------------------
def test_a_memform_model_file_gives_only_its_model():
    # gpt-7.5b.yaml sets dp 8, ZeRO-2, recompute full, micro batch 1: none of it is the ds_config's job
    draft = draft_of("dse-autotuning-z3.json", GPT)
    assert draft.get("model.hidden_size") == 4096 and draft.get("parallel.zero") == 3
    assert draft.entries["parallel.dp"].default and draft.entries["training.recompute"].default
    assert draft.get("training.recompute") == "none"
    assert draft.entries["model.seq_length"].default        # X's training length, marked for review
    assert any("not carried" in w and "training.recompute" in w for w in draft.warnings)


def test_a_model_file_without_a_sequence_length_needs_one(tmp_path):
    model = tmp_path / "m.yaml"
    data = yaml.safe_load(GPT.read_text())
    del data["model"]["seq_length"]
    model.write_text(yaml.safe_dump(data))
    r = run_memform("import", "deepspeed", DATA / "dse-autotuning-z3.json", "--model", model)
    assert r.returncode == 2 and "--set model.seq_length=N" in r.stderr
    r = run_memform("import", "deepspeed", DATA / "dse-autotuning-z3.json", "--model", model,
                    "--set", "model.seq_length=2048")
    assert r.returncode == 0, r.stderr


# ---- what is neutral, what is refused -------------------------------------------------------------------
@pytest.mark.parametrize("data, key", [
    ({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}}, "zero_optimization.zero_hpz_partition_size"),
    ({"zero_optimization": {"stage": 3, "zero_quantized_weights": True}}, "zero_optimization.zero_quantized_weights"),
    ({"zero_optimization": {"stage": 3, "zero_quantized_gradients": True}}, "zero_optimization.zero_quantized_gradients"),
    ({"zero_optimization": {"stage": 3, "mics_shard_size": 8}}, "zero_optimization.mics_shard_size"),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}},
     "zero_optimization.offload_optimizer.ratio"),
    ({"optimizer": {"type": "AdamW", "params": {"amsgrad": True}}}, "optimizer.params.amsgrad"),
    ({"optimizer": {"type": "Lion"}}, "optimizer.type"),
    ({"sequence_parallel_size": 4}, "sequence_parallel_size"),
    ({"tensor_parallel": {"autotp_size": 2}}, "tensor_parallel.autotp_size"),
    ({"hybrid_engine": {"enabled": True}}, "hybrid_engine"),
    ({"communication_data_type": "fp32", "bf16": {"enabled": True}}, "communication_data_type"),
])
def test_unmodelled_features_are_refused(tmp_path, data, key):
    src = tmp_path / "ds.json"
    src.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, **data}))
    r = memform_in_process("import", "deepspeed", src, "--model", GPT)
    assert r.returncode == 2 and key in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("data", [
    {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 1, "zero_quantized_weights": False}},
    {"tensor_parallel": {"autotp_size": 1}},
    {"hybrid_engine": {"enabled": False}},
    {"elasticity": {"enabled": False}},
    {"torch_autocast": {"enabled": False}},
    {"bf16": {"enabled": True, "check_grad_overflow": True}, "communication_data_type": "bf16"},
    {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/x", "buffer_count": 4,
                                                             "pin_memory": True, "ratio": 1.0}}},
    {"curriculum_learning": {"enabled": True}, "flops_profiler": {"enabled": True}, "checkpoint": {}},
])
def test_neutral_values_import(tmp_path, data):
    src = tmp_path / "ds.json"
    src.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, **data}))
    r = memform_in_process("import", "deepspeed", src, "--model", GPT)
    assert r.returncode == 0, r.stderr


def test_every_neutral_key_has_a_reason():
    from memform.importers import deepspeed

    for table in (deepspeed.NEUTRAL, deepspeed.ZERO_NEUTRAL, deepspeed.OFFLOAD_NEUTRAL, deepspeed.FP_NEUTRAL,
                  deepspeed.OPT_NEUTRAL):
        assert all(isinstance(why, str) and len(why) > 5 for why in table.values())
    # nothing is both neutral and refused
    assert not set(deepspeed.NEUTRAL) & set(deepspeed.REFUSED)
    assert not set(deepspeed.ZERO_NEUTRAL) & (set(deepspeed.ZERO_REFUSED) | set(deepspeed.ZERO_DEFAULTS))


@pytest.mark.parametrize("sets, refused", [
    ((), False),                                                       # no recompute: the section is unused
    (("training.recompute=full",), False),                             # tp 1: nothing to partition over
    (("training.recompute=full", "parallel.tp=2"), True),              # checkpoints split over 2 ranks
])
def test_partition_activations_matters_only_for_recompute_over_tp(tmp_path, sets, refused):
    src = tmp_path / "ds.json"
    src.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1},
                               "activation_checkpointing": {"partition_activations": True,
                                                            "contiguous_memory_optimization": False}}))
    args = [a for s in sets for a in ("--set", s)]
    r = memform_in_process("import", "deepspeed", src, "--model", GPT, "--devices", "8", *args)
    assert (r.returncode == 2) == refused, r.stderr
    assert ("activation_checkpointing.partition_activations" in r.stderr) == refused
