"""Real MindFormers training YAMLs → memform (issue 31): each imports right or is refused with its reason.

The fixtures are in tests/data/importers/mindformers/, verbatim from mindspore-lab/mindformers at the
commits its README.md lists: the current layout (``use_legacy: False``: configs/qwen3, qwen3_moe,
telechat3) and the legacy one (research/llama3_1, qwen2_5, telechat2, telechat3, deepseek3, mixtral,
configs/glm4). Parameter totals are checked against the released models' published counts (the same
sources as tests/test_import_hf_models.py cites for the Hugging Face configs of these models); the
other expected values are the YAML's own fields as MindFormers reads them (file / class named per row).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import run_memform

import memform
from memform.errors import MemformError
from memform.importers import Options, import_config
from memform.importers.mindformers import llama_ffn_width

DATA = Path(__file__).resolve().parent / "data" / "importers" / "mindformers"


def imported(name: str, **options):
    return import_config("mindformers", DATA / name, Options(**options))


def total_params(draft, **overrides) -> int:
    """memform's parameter count of the whole model: the imported config at tp = pp = ep = 1."""
    cfg = draft.config()
    cfg["parallel"] = {}
    training = cfg["training"]
    for key in ("recompute_num_layers", "selective_recompute_num_layers", "recompute_layers"):
        training.pop(key, None)
    training["recompute"] = "none"
    for path, value in overrides.items():
        section, key = path.split(".")
        cfg[section][key] = value
    est = memform.estimate(cfg)
    assert len(est.stages) == 1
    return sum(stage.param_count for stage in est.stages)


# fixture, published total, source, overrides (memform keys changed before counting)
PARAMS = [
    # current layout (use_legacy: False)
    ("pretrain_qwen3_30b_a3b_4k.yaml", 30_532_122_624, "safetensors, Qwen/Qwen3-30B-A3B (kvfit)", {}),
    ("pretrain_qwen3_32b_4k.yaml", 32_762_123_264, "safetensors, Qwen/Qwen3-32B (kvfit; keras-hub qwen3_32b_en)", {}),
    # legacy layout
    ("finetune_glm4_9b.yaml", 9_399_951_360, "chatllm.cpp load banner of GLM-4-9B", {}),
    ("finetune_llama3_1_8b.yaml", 8_030_261_248, "safetensors, meta-llama/Llama-3.1-8B-Instruct (kvfit)", {}),
    # ffn_dim_multiplier 1.3, multiple_of 256 → 28672 by LlamaFeedForward's rule (llama_layer.py)
    ("finetune_llama3_1_70b.yaml", 70_553_706_496, "safetensors, Llama-3.3-70B (kvfit): the 3.1 shape", {}),
    ("finetune_qwen2_5_7b_8k.yaml", 7_615_616_512, "safetensors, Qwen/Qwen2.5-7B-Instruct (kvfit)", {}),
    ("finetune_qwen25_14b_128k.yaml", 14_770_033_664, "llama.cpp general.parameter_count of Qwen2.5-14B", {}),
    ("finetune_qwen2.5_72B_32K.yaml", 72_706_203_648, "safetensors, Qwen2.5-72B-Instruct (kvfit)", {}),
    ("pretrain_mixtral-8x7b.yaml", 46_702_792_704, "keras-hub mixtral_8_7b_en preset params", {}),
    # DeepSeek-V3: 671B for the main model, the MTP module excluded (arXiv:2412.19437 abstract; 3 figures)
    ("pretrain_deepseek3_671b.yaml", 671e9, "arXiv:2412.19437: 671B", {"model.mtp_layers": 0}),
    # TeleChat3-105B-A4B: only the name's 105B (MTP layer included) is public: a 1 % check
    ("pretrain_telechat3_105b_a4b_4k.yaml", 105e9 * 1.0, "the model's name: 105B", {}),
]


@pytest.mark.parametrize("fixture, published, source, overrides", PARAMS, ids=[p[0] for p in PARAMS])
def test_total_parameters_match_the_published_count(fixture, published, source, overrides):
    draft = imported(fixture)
    assert draft.load_error is None, draft.load_error
    ours = total_params(draft, **overrides)
    tolerance = 1e-2 if "name" in source else 1e-3
    assert abs(ours - published) <= tolerance * published, f"{fixture}: {ours:,} vs {published:,.0f} ({source})"
    if isinstance(published, int):
        assert ours == published  # an exact checkpoint count is matched exactly


# the YAML's fields as MindFormers reads them; file or class named per row
STRUCTURE = [
    # Qwen3-30B-A3B: head_dim 128 × 32 heads ≠ hidden 2048; q/k norms (modeling_qwen3_moe_train.py
    # qk_layernorm=True); no expert_model_parallel: expert TP 1 (batched_layers.py); vocab_emb_dp forced
    # off in the current layout (transformer_config.py); no seq_length: MFModelConfig's 4096
    ("pretrain_qwen3_30b_a3b_4k.yaml",
     {"model.head_dim": 128, "model.qk_norm": True, "model.num_experts": 128, "model.moe_top_k": 8,
      "model.moe_ffn_hidden_size": 768, "model.num_shared_experts": 0, "parallel.ep": 4, "parallel.expert_tp": 1,
      "mindspore.vocab_emb_dp": False, "model.seq_length": 4096, "parallel.sequence_parallel": True,
      "training.recompute": "full", "training.num_micro_batches": 16}),
    # Qwen3-32B: list offset [-1, -1, 1, 1] over 64 layers / 4 stages (LayerSetting: 16 + offset)
    ("pretrain_qwen3_32b_4k.yaml",
     {"parallel.stage_layers": [15, 15, 17, 17], "model.head_dim": 128, "model.tied_embeddings": False,
      "training.precision.params": "fp32", "training.precision.activations": "bf16",
      "mindspore.parallel_optimizer": False, "device.capacity_gib": 58}),
    # TeleChat3-105B-A4B: MLA, 192 routed + 1 shared expert (moe_shared_expert_intermediate_size 1536),
    # first layer dense, one MTP layer (num_nextn_predict_layers), pipeline_interleave with seqsmartvpp
    ("pretrain_telechat3_105b_a4b_4k.yaml",
     {"model.attention": "mla", "model.kv_lora_rank": 512, "model.q_lora_rank": 1536, "model.num_experts": 192,
      "model.moe_top_k": 4, "model.num_shared_experts": 1, "model.shared_expert_ffn_hidden_size": 1536,
      "model.first_k_dense": 1, "model.mtp_layers": 1, "model.qk_norm": None}),
    # GLM-4-9B (ChatGLM2Config): 2 K/V groups (multi_query_group_num), padded_vocab_size rows, q/k/v biases
    # only (add_qkv_bias, add_bias_linear false), offset [-1, 0, 2, -1], recompute [6, 3, 2, 3]
    ("finetune_glm4_9b.yaml",
     {"model.num_kv_heads": 2, "model.vocab_size": 151552, "model.qkv_bias": True, "model.bias": False,
      "model.ffn_hidden_size": 13696, "parallel.stage_layers": [9, 10, 12, 9],
      "training.recompute_num_layers": [6, 3, 2, 3], "mindspore.vocab_emb_dp": False}),
    ("finetune_llama3_1_70b.yaml", {"model.ffn_hidden_size": 28672, "parallel.tp": 8, "parallel.pp": 8,
                                    "device.capacity_gib": 52.5}),
    # Qwen2.5 in research/qwen2_5 runs as LlamaForCausalLM with qkv_has_bias
    ("finetune_qwen2_5_7b_8k.yaml", {"model.qkv_bias": True, "model.bias": False, "model.num_kv_heads": 4,
                                     "training.recompute": "selective"}),
    # 128K tokens over context_parallel 16, use_ring_attention (the colossalai_cp ring)
    ("finetune_qwen25_14b_128k.yaml", {"model.seq_length": 131072, "parallel.cp": 16, "parallel.cp_algo": "ring",
                                       "training.recompute": "full"}),
    # research/telechat3 (net_name telechat3_36b): no MLP biases, out_proj_has_bias false; seqpipe with
    # pipeline_interleave and pp_interleave_num 2
    ("finetune_telechat3_36b.yaml", {"model.bias": False, "model.qkv_bias": False, "parallel.vpp": 2,
                                     "parallel.pp_schedule": "seqpipe", "parallel.dp": 128}),
    # research/telechat2: wo and w2 biases (telechat_layer.py), counted as memform's model.bias
    ("finetune_telechat_7b.yaml", {"model.bias": True, "model.qkv_bias": False, "training.recompute": "full"}),
    # DeepSeek-V3 (r1.5.0): MLA + DeepSeekMoE in moe_config, experts' TP from expert_model_parallel 1
    ("pretrain_deepseek3_671b.yaml", {"model.attention": "mla", "model.num_experts": 256, "model.first_k_dense": 3,
                                      "model.num_shared_experts": 1, "model.mtp_layers": 1, "parallel.ep": 8,
                                      "parallel.expert_tp": 1}),
    # Mixtral (r1.7.0): LlamaConfig + moe_config expert_num 8, top-2; legacy experts split over model_parallel
    ("pretrain_mixtral-8x7b.yaml", {"model.num_experts": 8, "model.moe_top_k": 2, "model.moe_ffn_hidden_size": 14336,
                                    "parallel.expert_tp": 4, "parallel.ep": 2}),
]


@pytest.mark.parametrize("fixture, expected", STRUCTURE, ids=[s[0] for s in STRUCTURE])
def test_fields_as_mindformers_reads_them(fixture, expected):
    draft = imported(fixture)
    assert {k: draft.get(k) for k in expected} == expected
    assert draft.load_error is None, draft.load_error


# the warnings a real file gets, each stating the approximation it names
WARNINGS = [
    ("pretrain_qwen3_32b_4k.yaml", "fp32_residual_connection: every layer is fully recomputed"),
    ("pretrain_telechat3_105b_a4b_4k.yaml", "pipeline_scheduler seqsmartvpp is not modelled"),
    ("finetune_telechat_7b.yaml", "TeleChat's biases are on wo and w2 only"),
    ("finetune_llama3_1_70b.yaml", "select_comm_recompute [10, 8, 6, 4, 2, 0, 0, 0] is not modelled"),
    ("finetune_llama3_1_8b.yaml", "embedding_init_type bfloat16"),
]


@pytest.mark.parametrize("fixture, needle", WARNINGS, ids=[w[0] for w in WARNINGS])
def test_real_files_warn_about_what_is_approximated(fixture, needle):
    assert [w for w in imported(fixture).warnings if needle in w]


REFUSED = [
    # the current layout's fine-tuning configs take the model from pretrained_model_dir's config.json
    ("finetune_qwen3.yaml", "MindFormers reads them from the config.json in 'pretrained_model_dir'"),
    # research/telechat2 telechat.py: the embedding Parameter(parallel_optimizer=config.parallel_optimizer),
    # TelechatConfig's default False, while parallel.enable_parallel_optimizer is true
    ("finetune_telechat_35b.yaml", "'model.model_config.parallel_optimizer' is absent (TelechatConfig's default"),
]


@pytest.mark.parametrize("fixture, needle", REFUSED, ids=[r[0] for r in REFUSED])
def test_real_files_refused_with_the_reason(fixture, needle):
    with pytest.raises(MemformError) as err:
        imported(fixture)
    assert needle in str(err.value) and fixture in str(err.value)


def test_every_fixture_is_listed_with_its_source():
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    tested = {p[0] for p in PARAMS} | {s[0] for s in STRUCTURE} | {r[0] for r in REFUSED}
    for path in DATA.glob("*.yaml"):
        assert f"`{path.name}`" in readme, path.name
        assert path.name in tested, path.name
    assert len(list(DATA.glob("*.yaml"))) >= 10


def test_cli_imports_a_current_layout_file_and_estimates(tmp_path):
    out = tmp_path / "qwen3-moe.yaml"
    r = run_memform("import", "mindformers", DATA / "pretrain_qwen3_30b_a3b_4k.yaml", "-o", out)
    assert r.returncode == 0, r.stderr
    e = run_memform("estimate", out)
    assert e.returncode == 0, e.stderr


def test_cli_refusal_is_one_message_exit_2():
    r = run_memform("import", "mindformers", DATA / "finetune_telechat_35b.yaml")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("memform: error:") == 1


# ---- the two layouts' fields, one at a time ------------------------------------------------------

NEW = ("use_legacy: False\nmodel:\n  model_config:\n    model_type: qwen3\n    hidden_size: 64\n"
       "    num_attention_heads: 4\n    num_key_value_heads: 2\n    num_hidden_layers: 4\n"
       "    intermediate_size: 176\n    vocab_size: 128\n    seq_length: 32\n")
OLD = ("model:\n  model_config:\n    type: LlamaConfig\n    hidden_size: 64\n    num_heads: 4\n    num_layers: 4\n"
       "    vocab_size: 128\n    seq_length: 32\n")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("base, extra, expected", [
    # COMMON_CONFIG_MAPPING spellings (transformer_config_utils.py)
    (OLD, "    n_kv_heads: 2\n    intermediate_size: 128\n", {"model.num_kv_heads": 2, "model.ffn_hidden_size": 128}),
    (NEW, "    head_dim: 32\n", {"model.head_dim": 32, "model.qk_norm": True}),
    (NEW, "    kv_channels: 16\n", {"model.head_dim": None}),  # 16 × 4 = 64: the default
    # moe in model_config (current layout); shared width from moe_shared_expert_intermediate_size
    # (transformer_config.py), else shared_expert_num × moe_ffn_hidden_size
    (NEW.replace("qwen3\n", "qwen3_moe\n"), "    num_experts: 8\n    num_experts_per_tok: 2\n"
     "    moe_intermediate_size: 32\n    n_shared_experts: 2\n    moe_shared_expert_intermediate_size: 96\n",
     {"model.num_experts": 8, "model.num_shared_experts": 2, "model.shared_expert_ffn_hidden_size": 96,
      "parallel.expert_tp": 1}),
    (NEW.replace("qwen3\n", "qwen3_moe\n"), "    num_experts: 8\n    moe_layer_freq: 2\n",
     {"model.moe_layer_freq": 2}),
    # first_k_dense_replace wins over moe_layer_freq (gpt_layer_specs.py)
    (NEW.replace("qwen3\n", "qwen3_moe\n"), "    num_experts: 8\n    moe_layer_freq: 2\n    first_k_dense_replace: 1\n",
     {"model.moe_layer_freq": None, "model.first_k_dense": 1}),
    # legacy: experts split over model_parallel without expert_model_parallel (LlamaFeedForward mp_moe)
    (OLD, "moe_config: {expert_num: 4, num_experts_chosen: 2}\nparallel_config: {model_parallel: 2, "
          "use_seq_parallel: true, data_parallel: 2, expert_parallel: 2}\n",
     {"model.num_experts": 4, "parallel.expert_tp": 2}),
    # the current layout splits the table over model_parallel when it divides the vocabulary
    (NEW, "parallel_config: {model_parallel: 2}\n", {"mindspore.vocab_emb_dp": False}),
    (NEW.replace("vocab_size: 128", "vocab_size: 127"), "parallel_config: {model_parallel: 2}\n",
     {"mindspore.vocab_emb_dp": True}),
    (OLD, "parallel_config: {model_parallel: 2}\n", {"mindspore.vocab_emb_dp": True}),
    # pipeline gradient accumulation: micro_batch_num; gradient_accumulation_steps is not used with pp
    # (base_trainer.py)
    (OLD, "parallel_config: {pipeline_stage: 2, micro_batch_num: 4}\nrunner_config: {gradient_accumulation_steps: 8}\n",
     {"training.num_micro_batches": 4}),
    # ring attention over the cp ranks is colossalai_cp's ring
    (OLD, "    use_ring_attention: true\nparallel_config: {context_parallel: 2}\n", {"parallel.cp_algo": "ring"}),
])
def test_layout_fields(tmp_path, base, extra, expected):
    draft = import_config("mindformers", write(tmp_path, base + extra), Options())
    assert {k: draft.get(k) for k in expected} == expected


@pytest.mark.parametrize("base, extra, needle", [
    (NEW, "    num_heads: 8\n", "two spellings of one MindFormers setting"),
    (OLD.replace("LlamaConfig", "BloomConfig"), "", "'model.model_config.type' is BloomConfig"),
    (NEW.replace("qwen3\n", "glm4_moe\n"), "", "give normalization, add_bias_linear, gated_linear_unit"),
    (NEW, "    fancy_switch: 1\n", "--accept model.model_config.fancy_switch"),
    (NEW, "    fp32_residual_connection: true\n", "not every layer is fully recomputed"),
    (NEW, "    gated_linear_unit: false\n", "memform models gated SiLU (SwiGLU) and ungated GeLU"),
    (NEW, "    position_embedding_type: alibi\n", "memform models rotary and learned absolute positions"),
    (NEW, "    pet_config: {pet_type: lora}\n", "parameter-efficient fine-tuning"),
    (OLD, "parallel: {parallel_mode: 2}\n", "auto parallel searches its own"),
    (OLD, "optimizer: {type: Came}\n", "'optimizer.type' is Came"),
    (OLD, "swap_config: {swap: true}\n", "'swap_config.swap' is boolean True"),
    (OLD, "micro_batch_interleave_num: 2\n", "'micro_batch_interleave_num' is integer 2"),
    (OLD, "parallel_config: {context_parallel: 2, context_parallel_algo: hybrid_cp}\n",
     "must be colossalai_cp or ulysses_cp"),
    (OLD, "recompute_config: {recompute: true, select_recompute_exclude: {'.*mul': true}}\n",
     "operators excluded from recompute"),
    (OLD, "    out_proj_has_bias: true\n", "differs from the other linear layers' biases"),
    (OLD.replace("    num_heads: 4\n", ""), "", "'model.model_config.num_heads' is missing"),
])
def test_layout_refusals_name_file_and_field(tmp_path, base, extra, needle):
    path = write(tmp_path, base + extra)
    with pytest.raises(MemformError) as err:
        import_config("mindformers", path, Options())
    assert needle in str(err.value) and str(path) in str(err.value)


def test_accept_vouches_for_an_unread_field(tmp_path):
    draft = import_config("mindformers", write(tmp_path, NEW + "    fancy_switch: 1\n"),
                          Options(accept=("model.model_config.fancy_switch",)))
    assert any("taken as memory-neutral (--accept)" in w for w in draft.warnings)


def test_null_fields_are_treated_as_unset_where_mindformers_defaults_them(tmp_path):
    # q_lora_rank: null is DeepSeek-V2-Lite's "no query compression" (q_lora_rank (null/0: none))
    text = OLD + "    kv_lora_rank: 64\n    q_lora_rank: null\n    qk_rope_head_dim: 8\n    qk_nope_head_dim: 8\n" \
                 "    v_head_dim: 16\n"
    draft = import_config("mindformers", write(tmp_path, text), Options())
    assert (draft.get("model.attention"), draft.get("model.q_lora_rank")) == ("mla", 0)


@pytest.mark.parametrize("hidden, multiple, fdm, width", [
    (4096, 256, None, 11008),   # Llama-2-7B (meta-llama/Llama-2-7b-hf config.json intermediate_size)
    (8192, 256, 1.3, 28672),    # Llama-3-70B (config.json intermediate_size 28672)
    (4096, 256, 1.3, 14336),    # Llama-3-8B (config.json intermediate_size 14336)
])
def test_llama_feedforward_width(hidden, multiple, fdm, width):
    assert llama_ffn_width(hidden, multiple, fdm) == width


def test_null_fields_count_as_unset(tmp_path):
    # MindFormers' config classes take None for their default: a null field is not an unread setting
    draft = import_config("mindformers", write(tmp_path, OLD + "    fancy_switch: null\nfancy_top: null\n"), Options())
    assert draft.load_error is None


def test_oldest_files_keep_recompute_in_parallel_config(tmp_path):
    text = OLD + "parallel_config: {recompute: {recompute: true, select_recompute: false}}\n"
    assert import_config("mindformers", write(tmp_path, text), Options()).get("training.recompute") == "full"


def test_moe_under_model_parallelism_without_sequence_parallelism_loads_under_mindspore():
    # MindFormers' DeepSeek-V2 236B configs run 160-expert MoE layers at model_parallel 8 with
    # use_seq_parallel False (research/deepseek2/deepseek2_236b/finetune_deepseek2_236B.yaml, 0c49711c):
    # Megatron-LM's "MoE with TP needs SP" rule (moe.mf) is not MindSpore's (frameworks/mindspore/moe.mf)
    sets = {"parallel.tp": 2, "parallel.expert_tp": 2, "parallel.sequence_parallel": False}
    draft = imported("pretrain_mixtral-8x7b.yaml", overrides=sets)
    assert draft.load_error is None and draft.get("training.framework") == "mindspore"
    est = memform.estimate(draft.config())
    sp = memform.estimate(draft.config(), {"parallel.sequence_parallel": True})
    # without SP each rank keeps the whole sequence's activations (the peak also holds SP's all-gather buffers)
    assert all(a.values["activations"] > b.values["activations"] for a, b in zip(est.stages, sp.stages))
    mixtral = Path(__file__).resolve().parents[1] / "configs" / "mixtral-8x7b.yaml"   # no MindSpore profile
    with pytest.raises(MemformError, match="needs parallel.sequence_parallel"):
        memform.estimate(mixtral, {"parallel.tp": 2, "parallel.sequence_parallel": False})
