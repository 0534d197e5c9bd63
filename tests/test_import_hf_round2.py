"""Hugging Face importer, second round (issue 31): every real config.json either imports right or is refused.

- the new released configs in tests/data/importers/hf/ (sources and totals in its README.md) against their
  published parameter totals, and the ones refused with the reason (hybrid Mamba; the DeciLM / Nemotron-NAS
  per-layer blocks once refused here are imported since issue 34: tests/test_arch_nas.py);
- every field memform does not read is either listed as memory-neutral with its reason (hf.NEUTRAL) or
  refused (exit 2): a new field stops the import unless --accept vouches for it;
- the training sequence is a default of 4096 tokens capped by max_position_embeddings, said once;
- q/k norms: Qwen3-Coder's and MiniMax-M2's are weighted (no Llama-4 warning), Llama-4's L2 norm warns,
  an unknown use_qk_norm is refused; Qwen3-VL's top-level tie_word_embeddings is read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import memform
from memform.importers import Options, hf, import_config, peft

DATA = Path(__file__).resolve().parent / "data" / "importers"
HF = DATA / "hf"
SEQ_WARNING = "model.seq_length = "


def import_hf(path: Path, **options):
    return import_config("hf", path, Options(**options))


def total_params(draft, overrides=None) -> int:
    """memform's parameter count at tp = pp = ep = 1 (the sum of the stages' param_count)."""
    est = memform.estimate(draft.config(), overrides=overrides or {})
    return sum(stage.param_count for stage in est.stages)


def write_json(tmp_path: Path, data: dict, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def besides_seq(draft) -> list[str]:
    return [w for w in draft.warnings if not w.startswith(SEQ_WARNING)]


# ---- published totals of the new fixtures ------------------------------------------------------------

# fixture, published total, its source, adjust (what the checkpoint stores that memform does not count)
NEW_MODELS = [
    # Qwen3MoeForCausalLM: 62 layers, 160 experts of 2560, head_dim 128 × 96 heads, q/k RMSNorm(head_dim);
    # "safetensors BF16 parameter count 480154875392" (Hub API, Qwen/Qwen3-Coder-480B-A35B-Instruct, quoted in
    # public model-selection notes)
    ("qwen3-coder-480b-a35b-instruct.config.json", 480_154_875_392, "Hub API safetensors, Qwen3-Coder-480B", 0),
    # keras-hub presets qwen2.5_instruct_32b_en and qwen3_14b_en ("params"), = the Hub safetensors totals
    ("qwen2.5-32b.config.json", 32_763_876_352, "keras-hub qwen2.5_instruct_32b_en preset", 0),
    ("qwen3-14b.config.json", 14_768_307_200, "keras-hub qwen3_14b_en preset", 0),
    # OlmoeForCausalLM (q_norm RMSNorm(h), k_norm RMSNorm(g·d_h)): the safetensors header parameterCount of
    # allenai/OLMoE-1B-7B-0924-Instruct, whose config has the same shape as this 0125 release
    ("olmoe-1b-7b-0125-instruct.config.json", 6_919_161_856, "safetensors parameterCount, OLMoE-1B-7B", 0),
    ("mistral-7b-instruct-v0.3.trimmed.config.json", 7_248_023_552, "safetensors (kvfit)", 0),
    # the Llama-2 checkpoints store each layer's rotary_emb.inv_freq buffer (head_dim / 2 = 64 floats): no
    # parameter (a buffer), counted by the Hub total
    ("llama-2-7b.trimmed.config.json", 6_738_417_664, "safetensors (kvfit)", 32 * 64),
    ("llama-2-13b.trimmed.config.json", 13_015_866_880, "safetensors (kvfit)", 40 * 64),
]


@pytest.mark.parametrize("fixture, published, source, adjust", NEW_MODELS, ids=[m[0].split(".config")[0]
                                                                               for m in NEW_MODELS])
def test_new_released_configs_match_their_published_totals(fixture, published, source, adjust):
    draft = import_hf(HF / fixture)
    assert draft.load_error is None
    assert total_params(draft) + adjust == published, f"{fixture} ({source})"
    assert besides_seq(draft) == []


def minimax_m2() -> dict:
    # MiniMaxAI/MiniMax-M2.5 config.json (= MiniMax-M2 / M2.1's shape), as quoted in public deployment notes
    # with its quantization_config removed
    return {"architectures": ["MiniMaxM2ForCausalLM"], "attn_type_list": [1] * 62,
            "auto_map": {"AutoConfig": "configuration_minimax_m2.MiniMaxM2Config",
                         "AutoModelForCausalLM": "modeling_minimax_m2.MiniMaxM2ForCausalLM"},
            "head_dim": 128, "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 1536,
            "max_position_embeddings": 196608, "model_type": "minimax_m2", "mtp_transformer_layers": 1,
            "num_attention_heads": 48, "num_experts_per_tok": 8, "num_hidden_layers": 62, "num_key_value_heads": 8,
            "num_local_experts": 256, "num_mtp_modules": 3, "qk_norm_type": "per_layer", "rms_norm_eps": 1e-06,
            "rope_theta": 5000000, "rotary_dim": 64, "scoring_func": "sigmoid", "shared_intermediate_size": 0,
            "tie_word_embeddings": False, "transformers_version": "4.46.1", "use_cache": True, "use_mtp": True,
            "use_qk_norm": True, "use_routing_bias": True, "vocab_size": 200064, "torch_dtype": "bfloat16"}


def test_minimax_m2_total(tmp_path):
    # transformers MiniMaxM2Attention: q_norm RMSNorm(48·128), k_norm RMSNorm(8·128) -- over the whole projection
    draft = import_hf(write_json(tmp_path, minimax_m2()))
    model = draft.config()["model"]
    assert (model["qk_norm"], model["qk_norm_scope"], model["num_experts"], model["moe_top_k"]) == \
        (True, "full", 256, 8)
    assert besides_seq(draft) == []  # no "Llama-4's q/k L2 norm" warning
    # Hub total of the FP8 checkpoint, 228,703,644,928 ("MINIMAX_SAFETENSORS_TRUTH ... from HF API" in a public
    # parameter-count test): memform's count + per layer the router's e_score_correction_bias buffer (256) and
    # the 128×128-block FP8 scales: q 48·24 + k 8·24 + v 8·24 + o 24·48 + 256 experts × 3 × 12·24 = 223,872
    scales = 48 * 24 + 8 * 24 + 8 * 24 + 24 * 48 + 256 * 3 * 12 * 24
    assert total_params(draft) + 62 * (256 + scales) == 228_703_644_928


# ---- every unread field is neutral (with its reason) or refused ----------------------------------------

@pytest.mark.parametrize("table", [hf.NEUTRAL, hf.NEUTRAL_VISION, peft.NEUTRAL])
def test_neutral_tables_give_a_reason_for_each_field(table):
    assert all(isinstance(why, str) and len(why) > 8 for why in table.values())


@pytest.mark.parametrize("fixture", sorted(p.name for p in HF.glob("*.json")))
def test_no_released_config_leaves_a_field_unaccounted(fixture):
    """Every field of every fixture is read, neutral (hf.NEUTRAL) or refused with the reason -- never
    the generic 'does not read' refusal a new field gets."""
    try:
        import_hf(HF / fixture)
    except memform.MemformError as err:
        assert "does not read" not in str(err), err


def test_an_unknown_field_is_refused_unless_accepted(tmp_path):
    data = json.loads((DATA / "llama3-8b.config.json").read_text())
    path = write_json(tmp_path, {**data, "my_new_field": 3})
    with pytest.raises(memform.MemformError, match="'my_new_field'.*--accept my_new_field"):
        import_hf(path)
    draft = import_hf(path, accept=("my_new_field",))
    assert any("'my_new_field'" in w and "--accept" in w for w in draft.warnings)


@pytest.mark.parametrize("extra, words", [
    # transformers' Qwen3MoeConfig does not read qkv_bias; true would be biases memform cannot place
    ({"qkv_bias": True}, "'qkv_bias' is true"),
    # Phi3 / PhiMoE lm_head = Linear(h, v, bias=config.lm_head_bias)
    ({"lm_head_bias": True}, "'lm_head_bias' is true"),
    ({"clip_qkv": 8.0}, "'clip_qkv' is set"),
    ({"attn_type_list": [0, 1]}, "lightning"),
    ({"model_type": "llama", "use_qk_norm": True}, "'use_qk_norm' is true for model_type 'llama'"),
    ({"model_type": "llama", "use_mtp": True}, "'use_mtp'"),
    ({"post_layer_norm": False}, "'post_layer_norm' is false"),
    ({"fp32_residual_connection": True}, "'fp32_residual_connection' is true"),
    # DeciLM variable GQA (importers/hf_nas.py): each per-layer K/V head count must divide the heads
    ({"num_key_value_heads_per_layer": [4, 8]}, "8 K/V heads, which does not divide num_attention_heads 4"),
])
def test_fields_that_change_memory_are_refused_with_the_reason(tmp_path, extra, words):
    base = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128,
            "vocab_size": 100, "max_position_embeddings": 64, "model_type": "qwen3_moe"}
    with pytest.raises(memform.MemformError, match=words):
        import_hf(write_json(tmp_path, {**base, **extra}))


# ---- the training sequence ---------------------------------------------------------------------------

@pytest.mark.parametrize("fixture, seq", [
    # Llama-4-Scout (kvfit copy): max_position_embeddings 10,485,760 -- a 10M-token default sized 104,528 GiB
    ("llama-4-scout-17b-16e-instruct.trimmed.config.json", 4096),
    ("qwen3-14b.config.json", 4096),                      # max 40960
    ("olmoe-1b-7b-0125-instruct.config.json", 4096),      # max 4096
    ("pythia-1b.config.json", 2048),                      # max 2048 caps the default
])
def test_seq_length_default_is_training_shaped(fixture, seq):
    draft = import_hf(HF / fixture)
    assert draft.get("model.seq_length") == seq
    assert draft.entries["model.seq_length"].default  # written with a "# default:" comment
    said = [w for w in draft.warnings if w.startswith(SEQ_WARNING)]
    assert len(said) == 1 and "--set model.seq_length=N" in said[0]
    assert f"# default: a training length of 4096 tokens" in draft.to_yaml()


def test_seq_length_given_on_the_command_line_is_not_warned():
    draft = import_hf(HF / "llama-4-scout-17b-16e-instruct.trimmed.config.json",
                      overrides={"model.seq_length": 8192})
    assert draft.get("model.seq_length") == 8192 and besides_seq(draft) == draft.warnings


def test_learned_positions_keep_the_table_length():
    # GPT-2's position table has n_positions rows, and dense.mf sizes it by model.seq_length
    draft = import_hf(DATA / "gpt2.config.json")
    assert draft.get("model.seq_length") == 1024 and draft.warnings == []


def test_llama4_scout_default_estimate_is_not_absurd():
    # the old default (10,485,760 tokens) gave 104,528 GiB per device; 4096 tokens is a trainable shape
    draft = import_hf(HF / "llama-4-scout-17b-16e-instruct.trimmed.config.json")
    new = memform.estimate(draft.config())
    old = memform.estimate(draft.config(), overrides={"model.seq_length": 10_485_760})
    assert old.peak_bytes > 50_000 * 2 ** 30          # the 10M-token sequence: tens of TiB
    assert new.peak_bytes < old.peak_bytes / 20       # 4096 tokens: the model states dominate


# ---- q/k norms and tied embeddings -------------------------------------------------------------------

def test_qwen3_coder_qk_norm_is_weighted_per_head():
    # Qwen3MoeAttention: q_norm / k_norm = RMSNorm(head_dim) whatever use_qk_norm says
    draft = import_hf(HF / "qwen3-coder-480b-a35b-instruct.config.json")
    model = draft.config()["model"]
    assert model["qk_norm"] is True and model.get("qk_norm_scope") is None
    assert not [w for w in draft.warnings if "L2" in w or "use_qk_norm" in w]


def test_llama4_use_qk_norm_true_warns_l2(tmp_path):
    data = json.loads((HF / "llama-4-scout-17b-16e-instruct.trimmed.config.json").read_text())
    draft = import_hf(write_json(tmp_path, {**data, "use_qk_norm": True}))
    assert [w for w in draft.warnings if "Llama4TextL2Norm" in w]


def qwen3_vl(**top) -> dict:
    # Qwen/Qwen3-VL-4B-Instruct config.json: tie_word_embeddings at the top level (Qwen3VLConfig), the language
    # model in text_config (qwen3_vl_text: Qwen3 attention with q/k RMSNorm(head_dim))
    text = {"model_type": "qwen3_vl_text", "hidden_size": 2560, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "num_hidden_layers": 36, "intermediate_size": 9728, "vocab_size": 151936,
            "max_position_embeddings": 262144, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 5000000,
            "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
            "dtype": "bfloat16", "initializer_range": 0.02, "use_cache": True,
            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"}}
    return {"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", "text_config": text,
            "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
            "vision_end_token_id": 151653, "tie_word_embeddings": True, **top}


def test_qwen3_vl_top_level_tie_word_embeddings_is_read(tmp_path):
    draft = import_hf(write_json(tmp_path, qwen3_vl()))
    assert draft.get("model.tied_embeddings") is True
    assert not [w for w in draft.warnings if "tie_word_embeddings" in w]


def test_qwen3_vl_deepstack_vision_tower_is_read(tmp_path):
    # transformers Qwen3VLVisionModel: a DeepStack patch merger per listed layer and a learned position table
    # (read since issue 34: tests/test_arch_vision.py checks the totals)
    vision = {"depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16, "patch_size": 16,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3, "out_hidden_size": 2560,
              "num_position_embeddings": 2304, "deepstack_visual_indexes": [5, 11, 17], "hidden_act":
              "gelu_pytorch_tanh", "model_type": "qwen3_vl"}
    draft = import_hf(write_json(tmp_path, qwen3_vl(vision_config=vision)))
    assert (draft.get("model.vision.deepstack_layers"), draft.get("model.vision.num_positions")) == (3, 2304)


# ---- PEFT adapter_config.json ------------------------------------------------------------------------

@pytest.mark.parametrize("extra, words", [
    ({"my_new_option": 1}, "'my_new_option'"),
    ({"exclude_modules": ["layers.0.self_attn.q_proj"]}, "'exclude_modules'"),
])
def test_peft_fields_are_neutral_or_refused(tmp_path, extra, words):
    data = json.loads((DATA / "peft" / "llama3-8b-qv.adapter_config.json").read_text())
    adapter = write_json(tmp_path, {**data, **extra}, "adapter_config.json")
    with pytest.raises(memform.MemformError, match=words):
        import_hf(DATA / "llama3-8b.config.json", adapter=str(adapter))


def test_peft_released_adapters_import():
    for name in ("llama3-8b-qv.adapter_config.json", "llama3-8b-all-linear.adapter_config.json"):
        draft = import_hf(DATA / "llama3-8b.config.json", adapter=str(DATA / "peft" / name))
        assert besides_seq(draft) == []
