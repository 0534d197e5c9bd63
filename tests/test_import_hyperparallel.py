"""Real HyperParallel memory-estimation YAMLs → memform (issue 31).

Fixtures: tests/data/importers/hyperparallel/ (README.md: mindspore-ai/hyper-parallel at d82cc09).
Expected values are MemEst's, as its parser reads these files: CostModelParserHyperV2
(``sapp_nd/nd/common/framework_parsers/cost_model_parser_hyper.py`` at 439df62): the
``config_overrides`` fallback (``_resolve_from_config_overrides``), ``_parse_parallelism`` (d =
dp_replicate × dp_shard, has_op default true, op_weight_shard from optimizer_weight_shard_size) and
``_resolve_device_capacity`` (context.max_device_memory).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import memform
from memform.errors import MemformError
from memform.importers import Options, import_config

DATA = Path(__file__).resolve().parent / "data" / "importers" / "hyperparallel"


def imported(path: Path, **options):
    return import_config("hyperparallel", path, Options(**options))


CASES = [
    ("hyper_deepseek_v3.yaml", {
        "model.hidden_size": 7168, "model.num_layers": 61, "model.num_heads": 128, "model.num_kv_heads": 128,
        "model.ffn_hidden_size": 18432, "model.vocab_size": 159744, "model.seq_length": 4096,
        "model.attention": "mla", "model.kv_lora_rank": 512, "model.q_lora_rank": 1536,
        "model.num_experts": 256, "model.moe_top_k": 8, "model.num_shared_experts": 1,
        "model.moe_ffn_hidden_size": 2048, "model.first_k_dense": 3, "model.mtp_layers": 1,
        "parallel.dp": 16, "parallel.tp": 4, "parallel.pp": 16, "parallel.ep": 8,
        "parallel.sequence_parallel": True, "mindspore.parallel_optimizer": True, "parallel.zero_shard_max": 4,
        "training.micro_batch_size": 1, "training.num_micro_batches": 32, "training.global_batch_size": 512,
        "training.recompute": "full", "mindspore.recompute_slice_activation": True,
        "training.precision.params": "fp32", "training.precision.activations": "bf16",
        "device.capacity_gib": 58}),
    ("hyper_qwen3_72b.yaml", {
        "model.hidden_size": 8192, "model.num_layers": 80, "model.num_heads": 64, "model.num_kv_heads": 8,
        "model.ffn_hidden_size": 29696, "model.vocab_size": 152064, "model.seq_length": 4096,
        "parallel.dp": 32, "parallel.tp": 4, "parallel.pp": 8, "parallel.sequence_parallel": True,
        "parallel.zero_shard_max": 8, "training.num_micro_batches": 144, "training.global_batch_size": 4608,
        "training.recompute": "full", "mindspore.recompute_slice_activation": False, "device.capacity_gib": 54}),
]


@pytest.mark.parametrize("fixture, expected", CASES, ids=[c[0] for c in CASES])
def test_real_files_match_memests_reading(fixture, expected):
    draft = imported(DATA / fixture)
    assert {k: draft.get(k) for k in expected} == expected
    assert draft.load_error is None, draft.load_error


@pytest.mark.parametrize("fixture, needle", [
    # cost_model_parser_hyper.py parse(): ccfg.offset = 0 whatever the file says
    ("hyper_deepseek_v3.yaml", "config_overrides.offset [1, 1, 1"),
    # the parser reads train.gradient_checkpointing, not config_overrides.full_rec
    ("hyper_qwen3_72b.yaml", "config_overrides.full_rec [8, 6, 6, 6, 4, 4, 2, 2] (per-stage recompute)"),
])
def test_real_files_warn_where_memest_ignores_a_field(fixture, needle):
    assert [w for w in imported(DATA / fixture).warnings if needle in w]


def test_deepseek_v3_total_at_the_released_vocabulary():
    # DeepSeek-V3: 671B without the MTP module (arXiv:2412.19437 abstract); its released vocabulary is
    # 129,280 (config.json), the file's 159,744 is MindFormers' padded one
    cfg = imported(DATA / "hyper_deepseek_v3.yaml").config()
    cfg["parallel"] = {}
    cfg["training"].pop("global_batch_size")  # 512 / (1 × 16): meaningful only at the file's dp
    cfg["model"].update(vocab_size=129280, mtp_layers=0)
    total = sum(s.param_count for s in memform.estimate(cfg).stages)
    assert abs(total - 671e9) <= 1e-3 * 671e9


def test_trainer_example_without_the_shape_is_refused():
    # examples/qwen3_5_0_8b_base/train.yaml: HyperParallel builds the model from model.name and weights_path;
    # config_overrides changes num_hidden_layers only
    path = DATA / "qwen3_5_0_8b_base-train.yaml"
    with pytest.raises(MemformError) as err:
        imported(path)
    assert "takes the shape from model 'qwen3_5'" in str(err.value) and str(path) in str(err.value)
    assert "changing only num_hidden_layers" in str(err.value)


def test_every_fixture_is_listed_with_its_source():
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    for path in DATA.glob("*.yaml"):
        assert f"`{path.name}`" in readme, path.name


BASE = ("model:\n  compute_dtype: bfloat16\n  config_overrides: {hidden_size: 64, num_hidden_layers: 4, "
        "num_attention_heads: 4, vocab_size: 128, intermediate_size: 176}\n")


@pytest.mark.parametrize("extra, needle", [
    # train.mixed_precision must agree with what MemEst prices (compute_dtype, fp32 gradients)
    ("train: {mixed_precision: {enabled: true, param_dtype: float16}}", "'train.mixed_precision.param_dtype'"),
    ("train: {mixed_precision: {reduce_dtype: bfloat16}}", "MemEst's fp32 gradients"),
    ("train: {mixed_precision: {enabled: false}}", "'train.mixed_precision.enabled' is false"),
    ("train: {optimizer: {type: sgd}}", "'train.optimizer.type' is sgd"),
    ("train: {fancy: 1}", "--accept train.fancy"),
    ("data: {max_seq_len: 8, packing: true}", "--accept data.packing"),
    ("context: {max_device_memory: 8GB, weird: 1}", "--accept context.weird"),
])
def test_refusals_name_file_and_field(tmp_path, extra, needle):
    path = tmp_path / "hp.yaml"
    path.write_text(BASE + extra + "\n", encoding="utf-8")
    with pytest.raises(MemformError) as err:
        imported(path)
    assert needle in str(err.value) and str(path) in str(err.value)


def test_neutral_fields_pass(tmp_path):
    path = tmp_path / "hp.yaml"
    path.write_text(BASE + "data: {type: preset_pt, shuffle: false, num_workers: 0, pin_memory: true}\n"
                    "train: {backend: torch, init_device: meta, checkpoint: {save_steps: 0}, logging: {log_steps: 1},"
                    " mixed_precision: {enabled: true, param_dtype: bfloat16, reduce_dtype: float32, "
                    "output_dtype: bfloat16}, optimizer: {type: adamw, lr_min: 0.0, loss_aggregation: rank_average}}\n"
                    "context: {mode: 0, device_target: Ascend}\n", encoding="utf-8")
    assert imported(path).warnings == []
