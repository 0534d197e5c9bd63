"""`memform import torchtitan` on real torchtitan job configs: every model torchtitan ships is sized as
its flavor table says (totals against the published parameter counts), or refused with the reason.

Fixtures: tests/data/importers/torchtitan/ -- every train_configs TOML of pytorch/torchtitan v0.2.2
(73a0e6979dd10b6b1904098eb3c8f62c18ab87ce, the last release with TOML job configs), kept verbatim; the
README there lists each one's path. Flavor tables: torchtitan/models/<name>/__init__.py at that commit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import memform
from memform.engine.config import STRUCTURAL, formula_files, normalize
from memform.errors import MemformError
from memform.importers import Options, import_config
from memform.lang.loader import load_program
from memform.resources import formulas_dir

from cli_helpers import ROOT, run_memform
from cli_inprocess import memform_in_process  # memform.cli.main in this process (same output)

DATA = ROOT / "tests" / "data" / "importers"
TITAN = DATA / "torchtitan"


def _toml(tmp_path: Path, text: str, name: str = "train.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def total_params(draft) -> int:
    est = memform.estimate(draft.config())
    return sum(stage.param_count for stage in est.stages)


# ---- 1. every flavor's total against its published count ------------------------------------------
# exact: the Hugging Face Hub safetensors total of the same architecture (tests/data/importers/hf/README.md
# lists the sources); "±" rows: a figure published rounded, compared within half its last digit.
# adjust: added to memform's count to compare like with like.
QWEN3_06B_HEAD = 151936 * 1024   # the Qwen3-0.6B checkpoint stores lm_head.weight although tied
TOTALS = [
    # model, flavor, published, tolerance, adjust, source
    ("llama3", "8B", 8_030_261_248, 0, 0, "safetensors, meta-llama/Llama-3.1-8B (kvfit)"),
    ("llama3", "70B", 70_553_706_496, 0, 0, "safetensors, Llama-3.3-70B = 3.1-70B shape (kvfit)"),
    # the paper's "405B" is the model's name-size, not a rounded count: compared within 0.25 %
    ("llama3", "405B", 405e9, 1e9, 0, "Dubey et al. 2024 Table 3: 405B"),
    # 2024's llama2 7B: meta-llama/Llama-2-7b-hf, counted tensor by tensor in test_framework_fsdp2.py
    ("llama2", "7B", 6_738_415_616, 0, 0, "meta-llama/Llama-2-7b-hf: 6,738,415,616 parameters"),
    ("llama", "7B", 6_738_415_616, 0, 0, "meta-llama/Llama-2-7b-hf: 6,738,415,616 parameters"),
    ("qwen3", "0.6B", 751_632_384, 0, QWEN3_06B_HEAD, "safetensors, Qwen/Qwen3-0.6B (KNOWN_MODELS), stored head"),
    ("qwen3", "1.7B", 1.7e9, 0.05e9, 0, "Qwen3-1.7B model card: 1.7B"),
    ("qwen3", "4B", 4_022_468_096, 0, 0, "safetensors, Qwen/Qwen3-4B (KNOWN_MODELS)"),
    ("qwen3", "8B", 8_190_735_360, 0, 0, "safetensors, Qwen/Qwen3-8B (kvfit)"),
    ("qwen3", "14B", 14.8e9, 0.05e9, 0, "Qwen3-14B model card: 14.8B"),
    ("qwen3", "32B", 32_762_123_264, 0, 0, "safetensors, Qwen/Qwen3-32B (kvfit)"),
    ("qwen3", "30B-A3B", 30_532_122_624, 0, 0, "safetensors, Qwen/Qwen3-30B-A3B (kvfit)"),
    ("qwen3", "235B-A22B", 235_093_634_560, 0, 0, "safetensors, Qwen/Qwen3-235B-A22B (kvfit)"),
    # torchtitan's 16B / 236B flavors are DeepSeek-V2-Lite / DeepSeek-V2 (same shapes as their config.json)
    ("deepseek_v3", "16B", 15_706_484_224, 0, 0, "deepseek-ai/DeepSeek-V2-Lite in a public model table"),
    ("deepseek_v3", "236B", 235_741_434_880, 0, 0, "deepseek-ai/DeepSeek-V2 in a public MoE table"),
    # no MTP module in torchtitan's DeepSeekV3Model: the paper's main-model total
    ("deepseek_v3", "671B", 671e9, 0.5e9, 0, "arXiv:2412.19437 abstract: 671B"),
    # Llama 4 model cards: "400B total" (Maverick, 17bx128e); 17bx16e is checked below (its 109B includes
    # the vision encoder torchtitan's text model lacks)
    ("llama4", "17bx128e", 400e9, 2e9, 0, "Llama-4-Maverick model card: 400B total (3 significant figures)"),
]


@pytest.mark.parametrize("name, flavor, published, tol, adjust, source", TOTALS,
                         ids=[f"{t[0]}-{t[1]}" for t in TOTALS])
def test_flavor_totals_match_the_published_counts(tmp_path, name, flavor, published, tol, adjust, source):
    path = _toml(tmp_path, f'[model]\nname = "{name}"\nflavor = "{flavor}"\n')
    draft = import_config("torchtitan", path, Options(devices=8))
    assert draft.load_error is None
    ours = total_params(draft) + adjust
    assert abs(ours - published) <= tol, f"{name} {flavor}: {ours:,} vs {published:,.0f} ({source})"


def test_llama2_70b_tensor_by_tensor(tmp_path):
    # llama2_configs 70B: dim 8192, 80 layers, 64 heads, 8 KV heads, FFN 1.3 × int(8·8192/3) → 28672
    # (multiple_of 4096), vocabulary 32000 (Llama 2 tokenizer): Touvron et al. 2023 Table 1's 70B
    path = _toml(tmp_path, '[model]\nname = "llama2"\nflavor = "70B"\n')
    ours = total_params(import_config("torchtitan", path, Options(devices=8)))
    h, kv, f, v, L = 8192, 1024, 28672, 32000, 80
    assert ours == L * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + 2 * v * h + h
    assert abs(ours - 70e9) < 0.015 * 70e9


def test_llama4_scout_text_model_is_just_below_the_multimodal_total(tmp_path):
    # Llama-4-Scout model card: 109B total, vision encoder included; torchtitan's llama4 is the text model:
    # 48 × (attention 62.9M + 16 experts and one shared expert of 3·5120·8192) + embedding and head
    path = _toml(tmp_path, '[model]\nname = "llama4"\nflavor = "17bx16e"\n')
    ours = total_params(import_config("torchtitan", path, Options(devices=8)))
    h, L, v, w = 5120, 48, 202048, 8192
    attention = 2 * h * 40 * 128 + 2 * h * 8 * 128
    layer = attention + 16 * 3 * h * w + 3 * h * w + h * 16 + 2 * h
    assert ours == L * layer + 2 * v * h + h
    assert 0.98 * 109e9 < ours < 109e9


@pytest.mark.parametrize("flavor, dense, expert, freq", [
    # models/llama4/model/model.py: dense int(1.2 · int(2·4·5120/3)) = 16383 → 16384 (multiple_of 2048);
    # experts 16383 / (top_k 1 + 1 shared) = 8191 → 8192 (as Llama-4's HF intermediate_size / _mlp)
    ("17bx16e", 16384, 8192, 1),
    ("17bx128e", 16384, 8192, [1 if (i + 1) % 2 == 0 else 0 for i in range(48)]),
    # debugmodel: int(2·1024/3) = 682 → 768; experts 682 / 2 = 341 → 512 (multiple_of 256), 8 experts
    ("debugmodel", 768, 512, [0, 1, 0, 1, 0, 1]),
])
def test_llama4_widths_and_interleaved_moe_layers(tmp_path, flavor, dense, expert, freq):
    draft = import_config("torchtitan", _toml(tmp_path, f'[model]\nname = "llama4"\nflavor = "{flavor}"\n'),
                          Options(devices=8))
    assert (draft.get("model.ffn_hidden_size"), draft.get("model.moe_ffn_hidden_size"),
            draft.get("model.moe_layer_freq"), draft.get("model.moe_top_k"),
            draft.get("model.num_shared_experts")) == (dense, expert, freq, 1, 1)


# ---- 2. the real job configs: what each import reads ----------------------------------------------
# expected values are the fixture's own fields (file: [section] key), at 64 devices
FIXTURES = [
    ("llama3_8b.toml", {"model.hidden_size": 4096, "model.seq_length": 8192, "parallel.dp": 64,
                        "training.micro_batch_size": 1, "fsdp2.selective_ac": "op"}),
    ("llama3_70b.toml", {"model.num_layers": 80, "parallel.tp": 8, "parallel.dp": 8,
                         "parallel.sequence_parallel": True, "training.micro_batch_size": 8,
                         "training.recompute": "full"}),
    # selective_ac_option "2": every second block in full (_apply_layer_sac)
    ("llama3_debug_model.toml", {"model.hidden_size": 256, "model.vocab_size": 2048,
                                 "training.recompute_layers": ["none", "full"] * 3}),
    ("integration_base_config.toml", {"model.num_layers": 6, "training.micro_batch_size": 8}),
    ("qwen3_0.6b.toml", {"model.tied_embeddings": True, "model.head_dim": 128, "model.qk_norm": True,
                         "model.seq_length": 4096, "training.micro_batch_size": 4}),
    ("qwen3_1.7b.toml", {"model.hidden_size": 2048, "model.tied_embeddings": True}),
    ("qwen3_32b.toml", {"model.num_layers": 64, "model.tied_embeddings": False, "training.recompute": "full",
                        "training.micro_batch_size": 2}),
    ("qwen3_moe_debug.toml", {"model.num_experts": 64, "model.moe_top_k": 8, "model.moe_ffn_hidden_size": 768,
                              "model.num_shared_experts": 0}),
    # expert_parallel_degree 8, expert_tensor_parallel_degree 1
    ("deepseek_v3_16b.toml", {"model.attention": "mla", "model.q_lora_rank": 0, "model.first_k_dense": 1,
                              "model.num_experts": 64, "parallel.ep": 8, "parallel.expert_tp": 1,
                              "model.seq_length": 4096, "training.micro_batch_size": 4}),
    ("deepseek_v3_671b.toml", {"model.q_lora_rank": 1536, "model.first_k_dense": 3, "model.num_experts": 256,
                               "model.mtp_layers": 0, "parallel.ep": 1}),
    ("deepseek_v3_debug_model.toml", {"model.num_shared_experts": 2, "model.moe_top_k": 3}),
    # tensor_parallel_degree 8, pipeline_parallel_degree 4, 1F1B: pipeline_llm splits 48 + 1 + 1 effective
    # layers 13/13/12/12, the first and last giving one to the embedding and output: 12/13/12/11
    ("llama4_17bx128e.toml", {"parallel.tp": 8, "parallel.pp": 4, "parallel.dp": 2, "parallel.expert_tp": 8,
                              "parallel.stage_layers": [12, 13, 12, 11], "training.recompute": "full"}),
    ("llama4_17bx16e.toml", {"model.num_experts": 16, "parallel.tp": 8, "parallel.expert_tp": 8,
                             "training.micro_batch_size": 8}),
    ("llama4_debug_model.toml", {"model.num_experts": 8, "model.vocab_size": 2048}),
    # older releases: v0.1.0 (June 2025; llama4 in experiments/), and 2024 (degrees in [training] /
    # [experimental], `batch_size`, [training] data_parallel_degree, fp8_linear = "" off)
    ("v0.1.0_llama3_70b.toml", {"model.ffn_hidden_size": 28672, "parallel.tp": 8, "parallel.dp": 8,
                                "training.micro_batch_size": 8}),
    ("v0.1.0_llama4_17bx16e.toml", {"model.num_experts": 16, "model.moe_ffn_hidden_size": 8192,
                                    "parallel.tp": 8, "training.micro_batch_size": 8}),
    # llama2 7B: Llama-2-7B's shape, vocabulary 32000 from the Llama 2 tokenizer.model
    ("2024_llama2_7b.toml", {"model.hidden_size": 4096, "model.ffn_hidden_size": 11008, "model.vocab_size": 32000,
                             "parallel.dp": 64, "training.micro_batch_size": 8, "fsdp2.selective_ac": "op"}),
    ("2024_llama3_8b.toml", {"model.ffn_hidden_size": 14336, "model.seq_length": 8192, "parallel.dp": 64,
                             "training.micro_batch_size": 2, "training.recompute": "full"}),
    # Float8 (torchao Float8Linear, the head filtered): v0.2.2's converters = ["float8"] with
    # [quantize.linear.float8], and an earlier 405B preset's converters = "float8" with [float8]; neither
    # names a recipe_name, which is torchao's default Float8LinearConfig (tensorwise)
    ("llama3_405b.toml", {"fsdp2.float8": "tensorwise", "fsdp2.float8_all_gather": True, "parallel.tp": 8,
                          "training.recompute": "full"}),
    ("01424cb_llama3_405b.toml", {"fsdp2.float8": "tensorwise", "fsdp2.float8_all_gather": True,
                                  "parallel.tp": 8, "training.micro_batch_size": 2}),
    # its 70B preset leaves the converter commented out: bf16, whatever [quantize.linear.float8] says
    ("llama3_70b.toml", {"fsdp2.float8": None}),
]


@pytest.mark.parametrize("fixture, expected", FIXTURES, ids=[f[0] for f in FIXTURES])
def test_real_job_configs_import_and_estimate(fixture, expected):
    draft = import_config("torchtitan", TITAN / fixture, Options(devices=64))
    assert {k: draft.get(k) for k in expected} == expected
    assert draft.load_error is None
    est = memform.estimate(draft.config())
    assert est.model.structure.framework == "fsdp2" and est.peak_bytes > 0


@pytest.mark.parametrize("fixture", [f[0] for f in FIXTURES])
def test_chosen_formula_files_bind_every_emitted_key(fixture):
    # no key the importer writes is left unread by the formula files it names and the fsdp2 profile
    draft = import_config("torchtitan", TITAN / fixture, Options(devices=64, check=False))
    data = normalize(draft.config(), None)   # (and what they include `when` the config sets a key)
    prog = load_program([formulas_dir() / f for f in formula_files(data)], config=data)
    bound = {b.path for b in prog.bindings.values()} | {k.path for k in STRUCTURAL}
    assert set(draft.entries) - bound == set()


# ---- 3. the real job configs memform refuses, and why ---------------------------------------------
REFUSED = [
    ("flux_debug_model.toml", "field 'model.name' is 'flux': FLUX is a diffusion model"),
    ("flux_dev_model.toml", "not a decoder LLM"),
    ("flux_schnell_model.toml", "not a decoder LLM"),
    ("gpt_oss_debug_model.toml", "TransformerBlock(...).to(torch.bfloat16)"),
    ("exp_vlm_debug_model.toml", "field 'model.name' is 'vlm'"),
    ("exp_transformers_modeling_backend_full.toml", "pass --model config.json"),
    ("exp_transformers_modeling_backend_debug_model.toml", "pass --model config.json"),
    ("llama3_ft_debug_model.toml", "field 'fault_tolerance.semi_sync_method' is 'diloco'"),
]


@pytest.mark.parametrize("fixture, needle", REFUSED, ids=[r[0] for r in REFUSED])
def test_real_job_configs_refused_with_the_reason(fixture, needle):
    r = memform_in_process("import", "torchtitan", TITAN / fixture, "--devices", "64")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert needle in r.stderr and fixture in r.stderr


# ---- 4. --model, --devices, unread fields ---------------------------------------------------------
def test_model_file_sizes_the_transformers_backend_job(tmp_path):
    # [hf_transformers] model = "Qwen/Qwen3-4B-Instruct-2507": its config.json shape (Qwen3-4B)
    draft = import_config("torchtitan", TITAN / "exp_transformers_modeling_backend_full.toml",
                          Options(devices=8, model=str(DATA / "hf" / "qwen3-4b.config.json")))
    assert draft.get("model.seq_length") == 2048          # [training] seq_len, not max_position_embeddings
    assert draft.get("parallel.dp") == 8 and draft.get("training.micro_batch_size") == 2
    assert total_params(draft) == 4_022_468_096


def test_model_yaml_gives_the_shape_only(tmp_path):
    # llama3-8b.yaml's own strategy (tp, pp, batch) is not carried into the torchtitan job
    draft = import_config("torchtitan", TITAN / "llama3_debug_model.toml",
                          Options(devices=8, model=str(ROOT / "configs" / "llama3-8b.yaml")))
    assert draft.get("model.hidden_size") == 4096 and draft.get("model.seq_length") == 2048
    assert draft.get("parallel.tp") == 1 and draft.get("parallel.dp") == 8
    assert draft.get("training.micro_batch_size") == 8


def test_leftover_shard_degree_needs_the_world_size():
    r = run_memform("import", "torchtitan", TITAN / "llama3_8b.toml")
    assert r.returncode == 2 and "data_parallel_shard_degree is -1" in r.stderr and "--devices N" in r.stderr
    r = run_memform("import", "torchtitan", TITAN / "llama3_8b.toml", "--set", "parallel.dp=16")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("fixture, devices, gbs, m", [
    # global_batch_size -1 (job_config.py default): local_batch_size × dp, one accumulation step
    # (torchtitan trainer.py); llama3_8b.toml: local_batch_size 1, dp 64 = the 64 devices
    ("llama3_8b.toml", 64, 64, 1),
    # llama3_70b.toml: local_batch_size 8, tp 8, so dp 8 on 64 devices
    ("llama3_70b.toml", 64, 64, 1),
    # llama4_17bx128e.toml: local_batch_size 1, tp 8 × pp 4, dp 2; micro-batch 1 (pipeline_parallel_microbatch_size)
    ("llama4_17bx128e.toml", 64, 2, 1),
])
def test_global_batch_is_the_local_batch_times_dp(fixture, devices, gbs, m):
    # issue 33: a search compares step times only at one global batch; the job states one, by default
    draft = import_config("torchtitan", TITAN / fixture, Options(devices=devices, check=False))
    assert draft.get("training.global_batch_size") == gbs and "training.num_micro_batches" not in draft
    # memform's m = global / (micro-batch × dp): torchtitan's pipeline micro-batches per step
    assert gbs // (draft.get("training.micro_batch_size") * draft.get("parallel.dp")) == m


def test_a_timed_search_runs_on_an_imported_job_and_refuses_a_config_json(tmp_path):
    # torchtitan writes its global batch: a search on a device with a time model ranks plans; a
    # config.json states none, the import says so in its header, and the search refuses naming the key
    r = memform_in_process("import", "torchtitan", TITAN / "llama3_debug_model.toml", "--devices", "8")
    assert r.returncode == 0 and "global_batch_size: 64  # [training] global_batch_size -1" in r.stdout, r.stdout
    r = memform_in_process("import", "hf", DATA / "hf" / "llama-3.2-3b.config.json")
    assert r.returncode == 0 and "# No training.global_batch_size: a config.json states no training batch" in r.stdout
    path = tmp_path / "llama3b.yaml"
    path.write_text(r.stdout)
    r = memform_in_process("search", path, "--devices", "8", "--set", "device.preset=h100-sxm", "--no-progress")
    assert r.returncode == 2 and "training.global_batch_size is not set" in r.stderr and "Traceback" not in r.stderr


def test_unknown_field_is_refused_unless_accepted(tmp_path):
    text = (TITAN / "llama3_debug_model.toml").read_text().replace("[training]\n", "[training]\nnew_knob = 3\n")
    path = _toml(tmp_path, text)
    r = run_memform("import", "torchtitan", path, "--devices", "8")
    assert r.returncode == 2 and "'training.new_knob'" in r.stderr
    r = run_memform("import", "torchtitan", path, "--devices", "8", "--accept", "training.new_knob")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("extra, needle", [
    ('[optimizer]\nname = "Muon"\n', "field 'optimizer.name' is 'Muon'"),
    ('[optimizer]\nimplementation = "foreach"\n', "field 'optimizer.implementation' is 'foreach'"),
    ('[optimizer]\nearly_step_in_backward = true\n', "field 'optimizer.early_step_in_backward'"),
    ('[validation]\nenable = true\n', "field 'validation.enable'"),
    ('[model]\nname = "simple_fsdp.llama3"\n', "SimpleFSDP"),
    ('[model]\nname = "llama3"\nconverters = ["quantize.linear.mx"]\n', "field 'model.converters'"),
    # Float8 with the head converted too, with other linears left bf16, the fp8 all-gather without
    # tensorwise scaling (torchao refuses it), an emulated GEMM, and 2024's [training] switch likewise
    ('[model]\nname = "llama3"\nconverters = ["float8"]\n', "field 'float8.filter_fqns' is []"),
    ('[model]\nname = "llama3"\nconverters = ["float8"]\n[float8]\nfilter_fqns = ["output", "attention.wk"]\n',
     "also filters ['attention.wk']"),
    ('[model]\nname = "llama3"\nconverters = ["quantize.linear.float8"]\n[quantize.linear.float8]\n'
     'recipe_name = "rowwise"\nenable_fsdp_float8_all_gather = true\nfilter_fqns = ["output"]\n',
     "field 'quantize.linear.float8.enable_fsdp_float8_all_gather' is true with recipe 'rowwise'"),
    ('[model]\nname = "llama3"\nconverters = ["float8"]\n[float8]\nemulate = true\nfilter_fqns = ["output"]\n',
     "field 'float8.emulate'"),
    # torchtitan's MoE Float8 converter (grouped GEMMs) is not modelled; Float8Linear with MoE blocks neither
    ('[model]\nname = "llama3"\nconverters = ["float8", "quantize.grouped_mm.float8"]\n[float8]\n'
     'filter_fqns = ["output"]\n', "field 'model.converters' is ['quantize.grouped_mm.float8']"),
    ('[model]\nname = "qwen3"\nflavor = "30B-A3B"\n[parallelism]\nexpert_parallel_degree = 8\n'
     'expert_parallel_comm_backend = "deepep"\n', "DeepEP"),
    ('[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = "1F1B"\n'
     'pipeline_parallel_layers_per_stage = 2\n', "stages per rank"),
    ('[wandb_extra]\nx = 1\n', "'wandb_extra'"),
    # pipeline_llm: 6 + 1 + 1 effective layers over 6 V-stages leaves the last one the norm and output only
    ('[parallelism]\npipeline_parallel_degree = 3\npipeline_parallel_schedule = "ZBVZeroBubble"\n',
     "a stage with none"),
])
def test_memory_changing_settings_are_refused(tmp_path, extra, needle):
    path = _toml(tmp_path, extra)
    r = run_memform("import", "torchtitan", path, "--devices", "8")
    assert r.returncode == 2 and "Traceback" not in r.stderr and needle in r.stderr, r.stderr


def test_python_recipe_is_named_as_such(tmp_path):
    path = _toml(tmp_path, "def llama3_8b():\n    return Trainer.Config()\n", "config_registry.py")
    with pytest.raises(MemformError, match="config_registry"):
        import_config("torchtitan", path, Options(devices=8))


def test_op_sac_keeps_the_query_width_of_qwen3(tmp_path):
    # torchtitan's op-level SAC (activation_checkpoint.py _apply_op_sac, llama3 parallelize.py _op_sac_save_list:
    # every other mm, the SDPA outputs): per block, the checkpoint's input (s·b·dim), the wq output
    # (n_heads · head_dim = 16 × 128 = 2048 wide, not dim 1024), the wv output (8 × 128), the SDPA output
    # (2048) and its fp32 log-sum-exp (b · n_heads · s), the w1 output (hidden_dim 3072), the w2 output (dim)
    draft = import_config("torchtitan", TITAN / "qwen3_0.6b.toml", Options(devices=64))
    est = memform.estimate(draft.config())
    layer = next(g for g in est.stages[0].layers if g.block == "decoder")
    b, s, h, qw, kv, f, a = 4, 4096, 1024, 2048, 1024, 3072, 16
    assert layer.mode == "selective"
    assert layer.per_layer_values["activations"] == 2 * b * s * (h + qw + kv + qw + f + h) + 4 * b * a * s


@pytest.mark.parametrize("text, recipe, all_gather", [
    # 2024: [training] enable_float8_linear (the head skipped by torchtitan: fqn != "output")
    ('[training]\nenable_float8_linear = true\nenable_fsdp_float8_all_gather = true\n', "tensorwise", True),
    # early 2025: [float8] enable_float8_linear
    ('[float8]\nenable_float8_linear = true\n', "tensorwise", False),
    # late 2025: converters + [quantize.linear.float8] with a recipe
    ('[model]\nname = "llama3"\nconverters = ["quantize.linear.float8"]\n[quantize.linear.float8]\n'
     'recipe_name = "rowwise"\nfilter_fqns = ["output"]\n', "rowwise", False),
])
def test_float8_settings_of_each_release_map_to_fsdp2_float8(tmp_path, text, recipe, all_gather):
    draft = import_config("torchtitan", _toml(tmp_path, text), Options(devices=8))
    assert draft.get("fsdp2.float8") == recipe and draft.get("fsdp2.float8_all_gather") == all_gather
    assert draft.load_error is None


def test_float8_with_moe_blocks_is_refused_by_the_profile(tmp_path):
    text = ('[model]\nname = "deepseek_v3"\nflavor = "16B"\nconverters = ["float8"]\n[float8]\n'
            'filter_fqns = ["output"]\n[parallelism]\nexpert_parallel_degree = 8\n')
    draft = import_config("torchtitan", _toml(tmp_path, text), Options(devices=8))
    assert draft.load_error is not None and "fsdp2.float8 with MoE layers" in draft.load_error


@pytest.mark.parametrize("text, all_gather", [
    # FSDP 1 x CP 8 (the Dec-2024 405B benchmark's Table 6 row): torchtitan 9dec370 float8.py:51-54 enables
    # the fp8 all-gather only with parallel_dims.dp_shard_enabled (dp_shard > 1), so the weights gather in bf16
    ('[training]\nenable_float8_linear = true\nenable_fsdp_float8_all_gather = true\ndata_parallel_shard_degree = 1\n'
     '[experimental]\ncontext_parallel_degree = 8\n', False),
    ('[training]\nenable_float8_linear = true\nenable_fsdp_float8_all_gather = true\ndata_parallel_shard_degree = 2\n'
     '[experimental]\ncontext_parallel_degree = 4\n', True),
])
def test_fp8_all_gather_needs_a_data_parallel_shard_dimension(tmp_path, text, all_gather):
    draft = import_config("torchtitan", _toml(tmp_path, text), Options(devices=8))
    assert draft.get("fsdp2.float8_all_gather") == all_gather, draft.entries["fsdp2.float8_all_gather"].note
    assert draft.get("parallel.cp") == 8 // draft.get("parallel.dp")
    if not all_gather:   # a value given with --set is kept
        kept = import_config("torchtitan", _toml(tmp_path, text),
                             Options(devices=8, overrides={"fsdp2.float8_all_gather": True}))
        assert kept.get("fsdp2.float8_all_gather") is True
