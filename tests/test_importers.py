"""Importers: Hugging Face config.json, Megatron-LM arguments and MindFormers YAML → memform YAML.

Expected values are the public facts of the model each test file describes (cited per case),
Megatron-LM's documented argument semantics, and MemEst's normalised fields for its MindFormers
test case (reference notes ``memest-formulas.md`` §3.2). Round-trip tests import a file, write
the YAML, and estimate it, so the importers and the formula files must agree on every key.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_helpers import run_memform as run
from hypothesis import given, settings
from hypothesis import strategies as st

import memform
from memform.engine.config import STRUCTURAL, formula_files, normalize
from memform.errors import MemformError
from memform.importers import Options, formulas, import_config
from memform.importers.draft import Draft, gated_ffn_size, pad_vocab
from memform.lang.loader import load_program
from memform.resources import formulas_dir

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "importers"
CONFIGS = ROOT / "configs"


def imported(fmt: str, source: str | Path, **options) -> Draft:
    path = source if isinstance(source, Path) else DATA / source
    return import_config(fmt, path, Options(**options))


def model_of(draft: Draft) -> dict:
    return draft.config()["model"]


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path



# ---- Hugging Face config.json ---------------------------------------------------------------

HF_CASES = [
    # meta-llama/Meta-Llama-3-8B config.json; Dubey et al. 2024, Table 3
    ("llama3-8b.config.json", {"hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8, "num_layers": 32,
                               "ffn_hidden_size": 14336, "vocab_size": 128256,
                               "seq_length": 4096,  # hf's training default (max_position_embeddings 8192 caps it)
                               "activation": "swiglu", "norm": "rmsnorm", "bias": False, "dropout": False,
                               "tied_embeddings": False, "position_embedding": "rope"}),
    # mistralai/Mixtral-8x7B-v0.1 config.json; Jiang et al. 2024, Table 1 (8 experts, top-2)
    ("mixtral-8x7b.config.json", {"hidden_size": 4096, "num_kv_heads": 8, "num_experts": 8, "moe_top_k": 2,
                                  "moe_ffn_hidden_size": 14336, "num_shared_experts": 0,
                                  "seq_length": 4096}),  # hf's training default, not max_position 32768
    # deepseek-ai/DeepSeek-V3 config.json; arXiv:2412.19437 §2.1.1, §4.2 (MLA ranks, 256 experts, MTP 1)
    ("deepseek-v3.config.json", {"attention": "mla", "q_lora_rank": 1536, "kv_lora_rank": 512,
                                 "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
                                 "num_experts": 256, "moe_top_k": 8, "moe_ffn_hidden_size": 2048,
                                 "num_shared_experts": 1, "first_k_dense": 3, "mtp_layers": 1,
                                 "ffn_hidden_size": 18432, "vocab_size": 129280, "num_layers": 61}),
    # deepseek-ai/DeepSeek-V2-Lite config.json; arXiv:2405.04434 Appendix B (no query compression)
    ("deepseek-v2-lite.config.json", {"attention": "mla", "q_lora_rank": 0, "num_experts": 64, "moe_top_k": 6,
                                      "num_shared_experts": 2, "moe_ffn_hidden_size": 1408,
                                      "first_k_dense": 1, "num_layers": 27}),
    # Qwen/Qwen2-VL-7B-Instruct config.json; arXiv:2409.12191 §2.1 (675M ViT: 32 × 1280, 14 px patches,
    # 2 × 2 merging) in front of the Qwen2-7B language model
    ("qwen2-vl-7b.config.json", {"hidden_size": 3584, "num_kv_heads": 4, "ffn_hidden_size": 18944,
                                 "vision": {"hidden_size": 1280, "num_heads": 16, "num_layers": 32,
                                            "ffn_hidden_size": 5120, "patch_size": 14, "temporal_patch_size": 2,
                                            "spatial_merge_size": 2, "in_channels": 3, "image_size": 448,
                                            "images_per_sample": 1}}),
    # openai-community/gpt2 config.json; Radford et al. 2019 (GPT-2 small: 12 × 768, learned positions)
    ("gpt2.config.json", {"hidden_size": 768, "num_heads": 12, "num_kv_heads": 12, "num_layers": 12,
                          "ffn_hidden_size": 3072, "vocab_size": 50257, "seq_length": 1024,
                          "activation": "gelu", "norm": "layernorm", "bias": True, "dropout": True,
                          "tied_embeddings": True, "position_embedding": "learned"}),
]


@pytest.mark.parametrize("name, expected", HF_CASES, ids=[c[0] for c in HF_CASES])
def test_hf_model_section(name: str, expected: dict) -> None:
    model = model_of(imported("hf", name))
    assert {k: model.get(k) for k in expected} == expected


def flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


#: workload, not architecture: config.json gives the longest context and no image sizes
WORKLOAD = {"seq_length", "vision.image_size", "vision.images_per_sample"}


@pytest.mark.parametrize("name, bundled", [
    ("llama3-8b.config.json", "llama3-8b.yaml"),
    ("mixtral-8x7b.config.json", "mixtral-8x7b.yaml"),
    ("deepseek-v3.config.json", "deepseek-v3.yaml"),
    ("deepseek-v2-lite.config.json", "deepseek-v2-lite.yaml"),
    ("qwen2-vl-7b.config.json", "qwen2-vl-7b.yaml"),
])
def test_hf_agrees_with_the_bundled_config(name: str, bundled: str) -> None:
    """The bundled configs were written from the papers; the imports read the released config.json.
    Every model key both set must agree (workload keys aside)."""
    draft = imported("hf", name)
    mine = flat(model_of(draft))
    theirs = yaml.safe_load((CONFIGS / bundled).read_text())
    shared = (set(mine) & set(flat(theirs["model"]))) - WORKLOAD
    assert len(shared) >= 12
    assert {k: mine[k] for k in shared} == {k: flat(theirs["model"])[k] for k in shared}
    assert set(draft.get("formulas")) == set(theirs.get("formulas", ["dense.mf"]))


def test_hf_shared_expert_width_and_nested_text_config(tmp_path: Path) -> None:
    # Qwen/Qwen1.5-MoE-A2.7B config.json: 60 experts of 1408, top-4, one shared expert 5632 = 4 × 1408 wide
    qwen = {"model_type": "qwen2_moe", "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 16,
            "num_hidden_layers": 24, "intermediate_size": 5632, "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
            "vocab_size": 151936, "max_position_embeddings": 8192, "hidden_act": "silu", "rms_norm_eps": 1e-6,
            "decoder_sparse_step": 1, "mlp_only_layers": []}
    model = model_of(imported("hf", write(tmp_path, "config.json", json.dumps(qwen))))
    assert (model["num_experts"], model["moe_top_k"], model["num_shared_experts"]) == (60, 4, 4)
    # llava-hf/llava-1.5-7b-hf: CLIP ViT-L/14 at 336 px (24 × 1024, 16 heads, MLP 4096) + a text_config
    clip = {"model_type": "clip_vision_model", "hidden_size": 1024, "intermediate_size": 4096,
            "num_attention_heads": 16, "num_hidden_layers": 24, "image_size": 336, "patch_size": 14,
            "projection_dim": 768}
    nested = {"model_type": "llava", "vision_config": clip,
              "text_config": {**json.loads((DATA / "llama3-8b.config.json").read_text())}}
    draft = imported("hf", write(tmp_path, "llava.json", json.dumps(nested)))
    model = model_of(draft)
    assert model["hidden_size"] == 4096
    assert model["vision"] == {"hidden_size": 1024, "num_heads": 16, "num_layers": 24, "ffn_hidden_size": 4096,
                               "patch_size": 14, "image_size": 336, "images_per_sample": 1}
    assert [w for w in draft.warnings if not w.startswith("model.seq_length = ")] == \
        ["a multimodal config: the language model comes from 'text_config'"]
    del clip["num_attention_heads"]
    with pytest.raises(MemformError, match="'vision_config.num_attention_heads' is missing"):
        imported("hf", write(tmp_path, "llava.json", json.dumps(nested)))


def test_set_replaces_a_whole_section_or_a_scalar_above_it() -> None:
    draft = imported("megatron", "llama3-8b.args.txt", overrides={"training.precision": {"params": "fp32"}},
                     check=False)
    assert draft.config()["training"]["precision"] == {"params": "fp32"}
    draft = imported("megatron", "llama3-8b.args.txt", check=False,
                     overrides={"training.precision": "x", "training.precision.grads": "bf16"})
    assert draft.config()["training"]["precision"] == {"grads": "bf16"}
    assert yaml.safe_load(draft.to_yaml()) == draft.config()


def test_a_strategy_that_cannot_load_is_reported_at_import_time() -> None:
    # Llama-3-8B has 32 heads (Dubey et al. 2024, Table 3): tp 3 cannot split them
    draft = imported("hf", "llama3-8b.config.json", overrides={"parallel.tp": 3})
    assert draft.load_error is not None and "parallel.tp must divide" in draft.load_error
    assert not [w for w in draft.warnings if "does not load" in w]  # an error, not a warning
    assert imported("hf", "llama3-8b.config.json").load_error is None


def test_hf_name_comes_from_the_checkpoint_folder(tmp_path: Path) -> None:
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    path = write(folder, "config.json", (DATA / "llama3-8b.config.json").read_text())
    assert imported("hf", path).get("name") == "Meta-Llama-3-8B"
    assert imported("hf", path, name="mine").get("name") == "mine"


def test_hf_unknown_fields_are_refused_and_known_irrelevant_ones_are_not(tmp_path: Path) -> None:
    # issue 31: a field hf.NEUTRAL does not list stops the import (exit 2) unless --accept names it
    data = json.loads((DATA / "llama3-8b.config.json").read_text())
    with pytest.raises(MemformError, match="'my_new_field'"):
        imported("hf", write(tmp_path, "c.json", json.dumps({**data, "my_new_field": 3})))
    assert imported("hf", "llama3-8b.config.json", overrides={"model.seq_length": 8192}).warnings == []


@pytest.mark.parametrize("text, needle", [
    ('{"hidden_size": 4096}', "'num_attention_heads' is missing"),
    ('{"hidden_size": "big", "num_attention_heads": 32}', "field 'hidden_size' must be a positive integer"),
    ('{"hidden_size": 4096,', "JSON syntax error"),
    ('[1, 2]', "must hold a JSON object"),
    ('{"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 10, '
     '"max_position_embeddings": 8, "num_local_experts": 8}', "'num_experts_per_tok' is missing"),
    ('{"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 10, '
     '"max_position_embeddings": 8, "kv_lora_rank": 16}', "'qk_rope_head_dim' is missing"),
])
def test_hf_errors_name_file_and_field(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path, "bad.json", text)
    with pytest.raises(MemformError) as err:
        imported("hf", path)
    assert needle in str(err.value) and str(path) in str(err.value)


# ---- Megatron-LM arguments -------------------------------------------------------------------

def test_megatron_vocab_padding() -> None:
    # Megatron pads GPT-2's 50257 tokens to 50304 at tp 1 ("with 47 dummy tokens") and to 51200 at tp 8
    # (multiple of make_vocab_size_divisible_by 128 × tp; tokenizer.py _vocab_size_with_padding)
    assert pad_vocab(50257, 128, 1) == 50304
    assert pad_vocab(50257, 128, 8) == 51200
    assert pad_vocab(128256, 128, 2) == 128256


def test_megatron_llama3_one_per_line() -> None:
    draft = imported("megatron", "llama3-8b.args.txt")
    cfg = draft.config()
    assert cfg["model"]["num_kv_heads"] == 8 and cfg["model"]["vocab_size"] == 128256
    # --world-size 16 over TP 2 × PP 2 leaves DP 4
    assert cfg["parallel"] == {"tp": 2, "pp": 2, "sequence_parallel": True, "distributed_optimizer": True,
                               "dp": 4, "devices": 16}
    assert cfg["training"]["precision"] == {"params": "bf16", "activations": "bf16"}
    assert draft.warnings == []  # --lr, --rotary-base, ... are known to move no memory


def test_megatron_shell_style_with_launcher_equals_one_per_line(tmp_path: Path) -> None:
    draft = imported("megatron", "mixtral-8x7b.sh")
    cfg = draft.config()
    # torchrun --nproc_per_node 8 --nnodes 8 = 64 devices over TP 2 × PP 4 → DP 8
    assert (cfg["parallel"]["dp"], cfg["parallel"]["ep"], cfg["parallel"]["expert_tp"]) == (8, 8, 2)
    assert cfg["model"]["num_experts"] == 8 and cfg["model"]["moe_grouped_gemm"] is True
    assert cfg["training"]["recompute"] == "full"
    assert not [w for w in draft.warnings if "stray" in w]  # the quoted path with a space is one token
    from memform.importers.megatron import read_arguments
    args, _, _ = read_arguments(DATA / "mixtral-8x7b.sh")
    lines = "\n".join(f"--{k}" if v is True else f"--{k} {shlex_join(v)}" for k, v in args.items())
    again = imported("megatron", write(tmp_path, "mixtral-8x7b.txt", lines), devices=64)
    assert again.config()["model"] == cfg["model"]
    assert {k: v for k, v in again.config()["parallel"].items()} == cfg["parallel"]


def shlex_join(value) -> str:
    import shlex
    return " ".join(shlex.quote(v) for v in (value if isinstance(value, list) else [value]))


def test_megatron_gpt3_matches_the_bundled_korthikanti_config() -> None:
    """configs/gpt3-175b.yaml and these Megatron arguments both describe Korthikanti et al. 2022,
    Table 3 (GPT-3 175B, t 8, p 8, SP, selective recompute, 1536 global batch); on 512 devices
    (dp 8) the two must give the same per-stage peaks."""
    draft = imported("megatron", "gpt3-175b.args.txt", devices=512)
    assert draft.get("model.vocab_size") == 51200 and draft.get("parallel.dp") == 8
    mine = memform.estimate(draft.config())
    theirs = memform.estimate(CONFIGS / "gpt3-175b.yaml")
    assert [s.peak_bytes for s in mine.stages] == [s.peak_bytes for s in theirs.stages]


@pytest.mark.parametrize("extra, flash, refused", [
    # no attention flag: with context parallelism Transformer Engine runs its flash / fused kernel only
    ("--context-parallel-size 2", True, False),
    ("", False, False),
    # Megatron-Core's local DotProductAttention asserts context_parallel_size == 1: refused, the key named
    ("--context-parallel-size 2 --transformer-impl local", False, True),
    # all-to-all CP (Ulysses) runs any kernel on whole sequences
    ("--context-parallel-size 2 --transformer-impl local --cp-comm-type a2a", False, False),
])
def test_megatron_context_parallelism_runs_fused_attention(tmp_path: Path, extra, flash, refused) -> None:
    script = tmp_path / "args.txt"
    script.write_text("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 4096 "
                      "--vocab-size 32000 --micro-batch-size 1 --bf16 " + extra + "\n")
    draft = imported("megatron", script)
    assert draft.get("model.flash_attention") is flash
    assert (draft.load_error is not None and "needs fused attention (model.flash_attention: true)"
            in draft.load_error) is refused, draft.load_error


def test_megatron_defaults_mla_moe_layer_freq_and_pipeline_split(tmp_path: Path) -> None:
    args = ("--num-layers 61 --hidden-size 7168 --num-attention-heads 128 --seq-length 4096 "
            "--swiglu --vocab-size 129280 --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 "
            "--qk-pos-emb-head-dim 64 --num-experts 256 --moe-router-topk 8 --moe-ffn-hidden-size 2048 "
            "--moe-shared-expert-intermediate-size 2048 --moe-layer-freq '([0]*3+[1]*58)' --mtp-num-layers 1 "
            "--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 13 "
            "--decoder-last-pipeline-num-layers 14 --context-parallel-size 2 --cp-comm-type a2a")
    cfg = imported("megatron", write(tmp_path, "dsv3.txt", args)).config()
    model = cfg["model"]
    # Megatron's SwiGLU default: int(4h · 2/3 / 64) · 64 (arguments.py)
    assert model["ffn_hidden_size"] == int(4 * 7168 * 2 / 3 / 64) * 64
    assert (model["attention"], model["q_lora_rank"], model["qk_nope_head_dim"], model["v_head_dim"]) == \
        ("mla", 1536, 128, 128)
    assert (model["first_k_dense"], model["num_shared_experts"], model["mtp_layers"]) == (3, 1, 1)
    assert cfg["parallel"]["stage_layers"] == [13, 17, 17, 14]
    assert (cfg["parallel"]["cp"], cfg["parallel"]["cp_algo"]) == (2, "ulysses")
    assert cfg["training"]["precision"]["params"] == "fp32"  # no --bf16/--fp16: Megatron trains in fp32
    assert cfg["model"]["tied_embeddings"] is True and cfg["model"]["dropout"] is True  # Megatron defaults


def test_megatron_virtual_pipeline_and_unknown_argument(tmp_path: Path) -> None:
    base = "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --vocab-size 32000 "
    draft = imported("megatron", write(tmp_path, "a.txt", base + "--pipeline-model-parallel-size 4 "
                                       "--num-layers-per-virtual-pipeline-stage 2 --my-new-flag 3 "
                                       "--recompute-granularity full --recompute-method block "
                                       "--recompute-num-layers 1"), accept=("my-new-flag",))
    assert draft.get("parallel.vpp") == 4  # 32 layers / (4 stages × 2 layers per chunk)
    # block method: only the first n layers of each chunk are recomputed (arguments.py help text)
    assert (draft.get("training.recompute"), draft.get("training.recompute_num_layers")) == ("full", 1)
    est = memform.estimate(draft.config())
    assert [[g.mode for g in c.groups if g.block == "decoder"] for c in est.partition.chunks[1]] == \
        [["full", "none"]] * 4
    # an argument memform does not know is refused unless --accept vouches for it (issue 31)
    assert draft.warnings == ["field '--my-new-flag' is not read by memform; taken as memory-neutral (--accept)"]


def test_megatron_vocab_from_the_command_line_when_the_tokenizer_is_a_file(tmp_path: Path) -> None:
    path = write(tmp_path, "a.txt", "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 8 "
                                    "--tokenizer-type HuggingFaceTokenizer --tokenizer-model my/tokenizer")
    draft = imported("megatron", path, overrides={"model.vocab_size": 1024})
    assert draft.get("model.vocab_size") == 1024 and draft.warnings == []


@pytest.mark.parametrize("text, options, needle", [
    ("--hidden-size 4096 --num-attention-heads 32", {}, "'--num-layers' is missing"),
    ("--num-layers x --hidden-size 4096", {}, "field '--num-layers' must be a positive integer"),
    ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 8", {}, "'--vocab-size' is missing"),
    ("--num-layers 2 --data-path 'unclosed", {}, "cannot split the arguments"),
    ("python pretrain_gpt.py", {}, "no --arguments found"),
    ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 8 --vocab-size 10 "
     "--tensor-model-parallel-size 4", {"devices": 6}, "6 devices cannot hold tp × pp × cp = 4"),
    ("--num-layers 30 --hidden-size 64 --num-attention-heads 4 --seq-length 8 --vocab-size 10 "
     "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 2", {}, "not divisible"),
])
def test_megatron_errors(tmp_path: Path, text: str, options: dict, needle: str) -> None:
    path = write(tmp_path, "args.txt", text)
    with pytest.raises(MemformError) as err:
        imported("megatron", path, **options)
    assert needle in str(err.value)


MEGATRON_BASE = ("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 8 --vocab-size 128 "
                 "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --use-distributed-optimizer ")


# Megatron-LM's argument semantics (megatron/training/arguments.py, megatron/core/optimizer/
# optimizer_config.py), as frameworks/megatron.mf keys
@pytest.mark.parametrize("extra, expected", [
    ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 2",
     {"training.recompute": "full", "megatron.recompute_uniform_layers": 2}),
    ("--recompute-granularity full --recompute-method block --recompute-num-layers 1",
     {"training.recompute_num_layers": 1, "megatron.recompute_uniform_layers": None}),
    ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
     "--distribute-saved-activations", {"megatron.distribute_saved_activations": True}),
    ("--fp8-format e4m3 --fp8-recipe mxfp8 --bf16",
     {"megatron.fp8": "e4m3", "megatron.fp8_recipe": "mxfp8", "megatron.fp8_param_gather": None}),
    ("--fp8-hybrid --fp8-param-gather --bf16",
     {"megatron.fp8": "hybrid", "megatron.fp8_recipe": "delayed", "megatron.fp8_param_gather": True}),
    ("--overlap-grad-reduce --ddp-bucket-size 1000",
     {"parallel.overlap_grad_reduce": True, "parallel.dp_bucket_mib": 0, "megatron.ddp_bucket_size": 1000}),
    ("--bf16 --grad-reduce-in-bf16", {"training.precision.grads": "bf16"}),
    ("--bf16 --use-precision-aware-optimizer --main-grads-dtype bf16 --exp-avg-dtype fp8",
     {"training.precision.grads": "bf16", "megatron.exp_avg_dtype": "fp8", "megatron.exp_avg_sq_dtype": "fp32",
      "megatron.store_param_remainders": None}),
    # TE FusedAdam keeps 16-bit remainders only of bf16 parameters' fp32 masters
    ("--fp16 --use-precision-aware-optimizer", {"megatron.store_param_remainders": False}),
    ("--bf16", {"training.framework": "megatron", "megatron.fp8": None, "training.precision.grads": None}),
])
def test_megatron_profile_flags(tmp_path: Path, extra: str, expected: dict) -> None:
    draft = imported("megatron", write(tmp_path, "a.txt", MEGATRON_BASE + extra))
    assert {k: draft.get(k) for k in expected} == expected
    assert draft.warnings == []
    assert memform.estimate(draft.config()).peak_bytes > 0


@pytest.mark.parametrize("extra, needle", [
    ("--recompute-granularity full --recompute-method every", "'--recompute-method' must be uniform or block"),
    ("--recompute-granularity full --recompute-method block", "'--recompute-num-layers' is missing"),
    ("--fp8-format e5m2", "'--fp8-format' must be e4m3 or hybrid"),
    ("--use-precision-aware-optimizer --exp-avg-dtype int4", "'--exp-avg-dtype' must be one of"),
])
def test_megatron_profile_flag_errors(tmp_path: Path, extra: str, needle: str) -> None:
    with pytest.raises(MemformError) as err:
        imported("megatron", write(tmp_path, "a.txt", MEGATRON_BASE + extra))
    assert needle in str(err.value)


def test_megatron_profile_flag_warnings(tmp_path: Path) -> None:
    draft = imported("megatron", write(tmp_path, "a.txt", MEGATRON_BASE + "--recompute-granularity full "
                                       "--fp8-param-gather --fp8-format hybrid --fp8-recipe custom"))
    assert draft.get("megatron.recompute_uniform_layers") == 1 and draft.get("megatron.fp8_recipe") == "tensorwise"
    assert any("needs --recompute-method" in w for w in draft.warnings)
    assert any("--fp8-recipe custom is not modelled" in w for w in draft.warnings)
    alone = imported("megatron", write(tmp_path, "b.txt", MEGATRON_BASE + "--fp8-param-gather"))
    assert alone.get("megatron.fp8_param_gather") is None
    assert alone.warnings == ["--fp8-param-gather has no effect without --fp8-format (ignored)"]


# ---- MindFormers YAML ------------------------------------------------------------------------

def test_mindformers_deepseek3_matches_memest_normalisation() -> None:
    """MemEst's normalised fields for its deepseek3 test case (memest-formulas.md §3.2)."""
    draft = imported("mindformers", "deepseek3-mindformers.yaml")
    cfg = draft.config()
    m, p, t = cfg["model"], cfg["parallel"], cfg["training"]
    assert (m["hidden_size"], m["ffn_hidden_size"], m["moe_ffn_hidden_size"], m["vocab_size"]) == \
        (7168, 18432, 2048, 159744)
    assert (m["num_layers"], m["mtp_layers"], m["first_k_dense"], m["num_heads"], m["num_kv_heads"]) == \
        (61, 1, 3, 128, 128)
    assert (m["kv_lora_rank"], m["q_lora_rank"], m["qk_rope_head_dim"], m["seq_length"]) == (512, 1536, 64, 8192)
    assert (m["num_experts"], m["moe_top_k"], m["num_shared_experts"], m["capacity_factor"]) == (256, 8, 1, 1.5)
    assert (p["dp"], p["tp"], p["pp"], p["ep"], p["sequence_parallel"]) == (16, 4, 16, 8, True)
    assert (t["num_micro_batches"], t["micro_batch_size"], t["precision"]["params"]) == (32, 1, "fp32")
    assert cfg["device"]["capacity_gib"] == 58
    # MemEst's offset partition [3,3,4,...,4,5,3] counts the MTP layer on the last stage
    assert p["stage_layers"] == [3, 3] + [4] * 12 + [5, 2]
    theirs = yaml.safe_load((CONFIGS / "deepseek-v3.yaml").read_text())
    assert p["stage_layers"] == theirs["parallel"]["stage_layers"]
    # recompute [1, 2, ..., 1, 1]: that many layers fully recomputed per stage, the rest keep everything
    assert (t["recompute"], t["recompute_num_layers"]) == ("none", [1] + [2] * 13 + [1, 1])
    # MindSpore's parallel optimizer over optimizer_weight_shard_size 8 ranks, gradients unsharded
    # (gradient_accumulation_shard False), threshold 64 KB; vocab_emb_dp; expert TP from
    # moe_config.expert_model_parallel 1 (MemEst §3.2-3.3); run under the MindSpore profile
    ms = cfg["mindspore"]
    assert t["framework"] == "mindspore" and "zero" not in p
    assert (ms["parallel_optimizer"], p["zero_shard_max"], p["grad_accumulation_shard"],
            ms["parallel_optimizer_threshold"]) == (True, 8, False, 64)
    assert (ms["vocab_emb_dp"], p["expert_tp"], ms["layernorm_compute_type"], ms["softmax_compute_type"]) == \
        (True, 1, "fp32", "fp32")
    assert (ms["mp_comm_recompute"], ms["parallel_optimizer_comm_recompute"]) == (True, False)
    # recompute_slice_activation is applied by MindFormers' LayerSetting only with recompute: true
    assert ms["recompute_slice_activation"] is False
    assert not [w for w in draft.warnings if "ZeRO" in w or "vocab_emb_dp" in w or "shard_size" in w]


def test_mindformers_llama2_derives_the_ffn_width() -> None:
    cfg = imported("mindformers", "llama2-7b-mindformers.yaml").config()
    # Llama-2 7B's intermediate_size is 11008 (meta-llama/Llama-2-7b-hf config.json) = the 8h/3 rule
    # rounded up to multiple_of 256
    assert cfg["model"]["ffn_hidden_size"] == 11008 == gated_ffn_size(4096, 256, None)
    assert cfg["training"]["recompute"] == "full"
    assert cfg["training"]["precision"] == {"params": "fp16", "activations": "fp16"}
    assert cfg["parallel"]["dp"] == 8
    # enable_parallel_optimizer False: nothing sharded; vocab_emb_dp True as the file says
    assert (cfg["mindspore"]["parallel_optimizer"], cfg["mindspore"]["vocab_emb_dp"]) == (False, True)
    assert "zero_shard_max" not in cfg["parallel"]


MF_BASE = ("model: {model_config: {hidden_size: 64, num_heads: 4, num_layers: 4, vocab_size: 64, seq_length: 8}}\n"
           "parallel_config: {data_parallel: 2, model_parallel: 2, pipeline_stage: 2}\n")


# MindFormers' LayerSetting (mindformers/models/utils.py) and MindSpore's parallel-optimizer defaults
# (set_parallel_optimizer_config: gradient_accumulation_shard True; optimizer_weight_shard_size -1 = all)
@pytest.mark.parametrize("extra, expected", [
    ("recompute_config: {recompute: [1, 0], select_recompute: [2, 1]}",
     {"training.recompute": "none", "training.recompute_num_layers": [1, 0],
      "training.selective_recompute_num_layers": [2, 1]}),
    # true = every layer of the stage: 2 of the 4 (LayerSetting caps a count at the stage's layers)
    ("recompute_config: {recompute: [true, false]}", {"training.recompute_num_layers": [2, 0]}),
    ("recompute_config: {recompute: true, select_recompute: true, recompute_slice_activation: true}",
     {"training.recompute": "full", "mindspore.recompute_slice_activation": True}),
    ("recompute_config: {recompute: [1, 1], recompute_slice_activation: true, mp_comm_recompute: false}",
     {"mindspore.recompute_slice_activation": False, "mindspore.mp_comm_recompute": False}),
    ("recompute_config: {select_recompute: true}", {"training.recompute": "selective"}),
    ("parallel: {enable_parallel_optimizer: true}",
     {"mindspore.parallel_optimizer": True, "parallel.grad_accumulation_shard": True, "parallel.zero_shard_max": None}),
    ("parallel: {enable_parallel_optimizer: true, parallel_optimizer_config: {optimizer_weight_shard_size: 2, "
     "optimizer_level: level2}}", {"parallel.zero_shard_max": 2, "mindspore.optimizer_level": "level2"}),
    ("parallel: {enable_parallel_optimizer: false}", {"mindspore.parallel_optimizer": False}),
    ("", {"mindspore.vocab_emb_dp": True, "mindspore.parallel_optimizer": False, "training.framework": "mindspore"}),
])
def test_mindformers_recompute_and_parallel_optimizer_keys(tmp_path: Path, extra: str, expected: dict) -> None:
    draft = imported("mindformers", write(tmp_path, "m.yaml", MF_BASE + extra))
    for key, value in expected.items():
        assert draft.get(key) == value, key


@pytest.mark.parametrize("text, needle", [
    ("model: {model_config: {hidden_size: 8}}", "'model.model_config.num_heads' is missing"),
    ("model: {}", "'model.model_config' is missing"),
    ("model:\n  model_config: [1\n", "YAML syntax error"),
    ("model: {model_config: {hidden_size: 64, num_heads: 4, num_layers: 2, vocab_size: 10, seq_length: 8}}\n"
     "context: {max_device_memory: lots}", "'context.max_device_memory' must look like"),
    ("model: {model_config: {hidden_size: 64, num_heads: 4, num_layers: 2, vocab_size: 10, seq_length: 8, "
     "compute_dtype: int3}}", "'model.model_config.compute_dtype' must be a dtype"),
    (MF_BASE + "parallel: {enable_parallel_optimizer: true, parallel_optimizer_config: "
     "{optimizer_weight_shard_size: 0}}", "optimizer_weight_shard_size"),
    (MF_BASE + "parallel: {enable_parallel_optimizer: true, parallel_optimizer_config: {optimizer_level: l9}}",
     "optimizer_level"),
    (MF_BASE + "parallel: {enable_parallel_optimizer: true, parallel_optimizer_config: "
     "{parallel_optimizer_threshold: -1}}", "parallel_optimizer_threshold"),
])
def test_mindformers_errors(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(MemformError) as err:
        imported("mindformers", write(tmp_path, "m.yaml", text))
    assert needle in str(err.value)


# ---- formula choice, YAML emission -----------------------------------------------------------

ALL_FILES = [("hf", c[0]) for c in HF_CASES] + [
    ("megatron", "llama3-8b.args.txt"), ("megatron", "mixtral-8x7b.sh"), ("megatron", "gpt3-175b.args.txt"),
    ("mindformers", "deepseek3-mindformers.yaml"), ("mindformers", "llama2-7b-mindformers.yaml"),
    ("hyperparallel", "mixtral-8x7b-hyperparallel.yaml")]


@pytest.mark.parametrize("fmt, name", ALL_FILES, ids=[n for _, n in ALL_FILES])
def test_chosen_formula_files_bind_every_emitted_key(fmt: str, name: str) -> None:
    draft = imported(fmt, name, check=False)
    # the files the config loads: its formulas, then its framework profile (training.framework)
    data = normalize(draft.config(), None)   # (and what they include `when` the config sets a key)
    prog = load_program([formulas_dir() / f for f in formula_files(data)], config=data)
    bound = {b.path for b in prog.bindings.values()} | {k.path for k in STRUCTURAL}
    assert set(draft.entries) - bound == set()


def test_unknown_keys_fall_back_to_the_agreed_file_names() -> None:
    files, missing = formulas.choose(["model.hidden_size", "model.no_such_key"])
    assert (files, missing) == (["dense.mf"], ["model.no_such_key"])


@pytest.mark.parametrize("fmt, name", ALL_FILES, ids=[n for _, n in ALL_FILES])
def test_round_trip_import_then_estimate(tmp_path: Path, fmt: str, name: str) -> None:
    draft = imported(fmt, name)
    assert draft.load_error is None
    path = write(tmp_path, "imported.yaml", draft.to_yaml())
    assert yaml.safe_load(path.read_text()) == draft.config()
    est = memform.estimate(path)
    assert est.peak_bytes > 0 and len(est.stages) == draft.get("parallel.pp")
    assert est.model.data["model"] == draft.config()["model"]


_paths = st.sampled_from(["model.a", "model.b", "parallel.c", "training.d.e", "training.d.f", "device.g", "name"])
_values = st.one_of(st.integers(-10**12, 10**12), st.booleans(), st.none(),
                    st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=12), st.lists(st.integers(0, 99), max_size=5))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(_paths, _values, st.text(max_size=10)), max_size=8))
def test_emitted_yaml_reads_back_as_the_config(entries) -> None:
    """Whatever values and notes (with '#', ':' or quotes) an importer writes, YAML reads them back."""
    draft = Draft(Path("x"), "test", header=["a header: # with marks"])
    for path, value, note in entries:
        draft.set(path, value, note)
    assert (yaml.safe_load(draft.to_yaml()) or {}) == draft.config()


# ---- the console script ----------------------------------------------------------------------

def test_cli_import_then_estimate(tmp_path: Path) -> None:
    out = tmp_path / "llama.yaml"
    r = run("import", "hf", str(DATA / "llama3-8b.config.json"), "--devices", "8", "--set", "parallel.tp=4",
            "--set", "model.seq_length=4096")
    assert r.returncode == 0, r.stderr
    out.write_text(r.stdout)
    cfg = yaml.safe_load(r.stdout)
    assert (cfg["parallel"]["tp"], cfg["parallel"]["dp"], cfg["model"]["seq_length"]) == (4, 2, 4096)
    e = run("estimate", str(out), "--json")
    assert e.returncode == 0, e.stderr
    assert json.loads(e.stdout)["model"] == "llama3-8b"


def test_cli_warnings_go_to_stderr_and_errors_exit_2(tmp_path: Path) -> None:
    cfg = json.loads((DATA / "llama3-8b.config.json").read_text())
    good = write(tmp_path, "good.json", json.dumps({**cfg, "fancy_new_thing": True}))
    out = tmp_path / "good.yaml"
    r = run("import", "hf", str(good), "-o", str(out), "--accept", "fancy_new_thing", "--set",
            "model.seq_length=8192")
    assert r.returncode == 0 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        f"memform: warning: {good}: field 'fancy_new_thing' is not read by memform; taken as memory-neutral "
        f"(--accept)"]
    assert yaml.safe_load(out.read_text())["model"]["hidden_size"] == 4096
    bad = write(tmp_path, "bad.json", json.dumps({k: v for k, v in cfg.items() if k != "vocab_size"}))
    r = run("import", "hf", str(bad))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("memform: error: ") and "'vocab_size' is missing" in r.stderr
