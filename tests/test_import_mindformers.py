"""``memform import mindformers`` (VPP offsets, per-chunk recompute, parallel optimizer, schedule) and
``memform import hyperparallel`` (HyperParallel's memory-estimation YAML).

Expected values: MemEst's normalised fields for its Mixtral HyperParallel fixture (reference notes
``memest-formulas.md`` §3.1; parser mindspore-ai/hyper-parallel
``nd/common/framework_parsers/cost_model_parser_hyper.py`` at 0ef883c, whose defaults the table of
defaults below cites), and MindFormers' own layer placement (mindformers/models/utils.py
``LayerSetting``: ``layer_list = L // (pp·vpp) + offset``, ``_alloc_recompute_layer``,
``_format_recompute_list``, ``pp_interleave_num`` used only with ``pipeline_interleave``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import run_memform

import memform
from memform.errors import MemformError
from memform.importers import IMPORTERS, Options, import_config
from memform.importers.draft import Draft

DATA = Path(__file__).resolve().parent / "data" / "importers"
MIXTRAL = DATA / "mixtral-8x7b-hyperparallel.yaml"


def imported(fmt: str, path: Path, **options) -> Draft:
    return import_config(fmt, path, Options(**options))


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---- HyperParallel: MemEst's Mixtral fixture ---------------------------------------------------

# memest-formulas.md §3.1 "Normalized" (MemEst symbol → the memform key that carries it)
MEMEST_MIXTRAL = [
    ("h", "model.hidden_size", 4096),
    ("hff", "model.ffn_hidden_size", 14336),
    ("hff_exp", "model.moe_ffn_hidden_size", 14336),
    ("v", "model.vocab_size", 32000),
    ("n_lay", "model.num_layers", 32),
    ("a", "model.num_heads", 32),
    ("n_kv", "model.num_kv_heads", 8),
    ("s", "model.seq_length", 4096),
    ("n_exp", "model.num_experts", 8),
    ("n_chosen_exp", "model.moe_top_k", 2),
    ("n_shared_exp", "model.num_shared_experts", 0),
    ("cap_fact", "model.capacity_factor", 1.1),
    ("d", "parallel.dp", 8),
    ("t", "parallel.tp", 1),
    ("p", "parallel.pp", 2),
    ("ep", "parallel.ep", 8),
    ("sp", "parallel.sequence_parallel", False),
    ("b", "training.micro_batch_size", 1),
    ("m", "training.num_micro_batches", 16),
    ("gbs", "training.global_batch_size", 128),
    ("has_op", "mindspore.parallel_optimizer", True),
    ("full_rec", "training.recompute", "full"),
    ("bytes_p", "training.precision.params", "fp16"),
    ("bytes_compute", "training.precision.activations", "fp16"),
    ("bytes_softmax", "mindspore.softmax_compute_type", "fp16"),
    ("bytes_grad", "training.precision.grads", "fp32"),
    ("device_capacity", "device.capacity_gib", 58),
]


@pytest.mark.parametrize("symbol, key, expected", MEMEST_MIXTRAL, ids=[c[0] for c in MEMEST_MIXTRAL])
def test_hyperparallel_mixtral_matches_memest_normalisation(symbol: str, key: str, expected) -> None:
    draft = imported("hyperparallel", MIXTRAL)
    assert draft.get(key) == expected, f"MemEst {symbol}"


def test_hyperparallel_mixtral_derived_and_absent_fields() -> None:
    draft = imported("hyperparallel", MIXTRAL)
    cfg = draft.config()
    # dh = h / a = 128 (memform derives it); cp = vp = 1 (absent keys keep the default 1)
    assert cfg["model"]["hidden_size"] // cfg["model"]["num_heads"] == 128
    assert "cp" not in cfg["parallel"] and "vpp" not in cfg["parallel"]
    # cost_model_parser_hyper.py: gmm = True (dropless grouped matmul), vocab_emb_dp, has_fa,
    # has_grad_shard from gradient_accumulation_shard (absent: false), model.name is the model id
    assert (cfg["model"]["moe_grouped_gemm"], cfg["mindspore"]["vocab_emb_dp"], cfg["model"]["flash_attention"],
            cfg["parallel"]["grad_accumulation_shard"], cfg["name"]) == (True, True, True, False, "mixtral-8x7b")
    assert cfg["training"]["framework"] == "mindspore" and "zero_shard_max" not in cfg["parallel"]
    # full_rec true / sel_rec false / offset 0 in config_overrides agree with the rest: no warning
    assert draft.warnings == []
    assert draft.load_error is None


def test_hyperparallel_mixtral_partition_is_memests() -> None:
    est = memform.estimate(imported("hyperparallel", MIXTRAL).config())
    # MemEst's partition for this fixture: stage 0 [1E, 16F], stage 1 [16F, 1O] (memest-formulas.md §2.1,
    # README output of estimate_v2 on test_cases/mixtral/default.yaml)
    layers = [[(g.block, g.count_value, g.mode) for g in s.layers] for s in est.stages]
    assert layers == [[("embedding", 1, "full"), ("moe_decoder", 16, "full")],
                      [("moe_decoder", 16, "full"), ("output", 1, "full")]]


def test_cli_import_hyperparallel_then_estimate(tmp_path: Path) -> None:
    out = tmp_path / "mixtral.yaml"
    r = run_memform("import", "hyperparallel", MIXTRAL, "-o", out)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    e = run_memform("estimate", out)
    assert e.returncode == 0, e.stderr
    assert e.stdout.startswith("mixtral-8x7b: 1f1b schedule, pp=2, recompute=full")


HP_BASE = ("model:\n  config_overrides: {hidden_size: 64, num_hidden_layers: 4, num_attention_heads: 4, "
           "vocab_size: 128, intermediate_size: 176}\n")


# cost_model_parser_hyper.py defaults (0ef883c): has_op true, m = p, b 1, bytes_p float32, bytes_compute
# bfloat16, bytes_softmax float32, device 64GB, s = max_position_embeddings when no data.max_seq_len,
# recompute none; the accelerator's degrees and switches as written
@pytest.mark.parametrize("extra, expected", [
    ("", {"mindspore.parallel_optimizer": True, "training.precision.params": "fp32",
          "training.precision.activations": "bf16", "mindspore.softmax_compute_type": "fp32",
          "device.capacity_gib": 64, "training.micro_batch_size": 1, "training.num_micro_batches": 1,
          "training.recompute": "none", "model.seq_length": 4096, "parallel.dp": 1, "name": "hp"}),
    ("train: {accelerator: {pipeline_parallel_degree: 2}}", {"training.num_micro_batches": 2}),
    ("train: {accelerator: {dp_replicate: 2, dp_shard: 4, tp_degree: 2, context_parallel_degree: 2, "
     "context_parallel_algo: ulysses_cp}}",
     {"parallel.dp": 8, "parallel.tp": 2, "parallel.cp": 2, "parallel.cp_algo": "ulysses"}),
    ("train: {accelerator: {optimizer_weight_shard_size: 4, gradient_accumulation_shard: true, dp_shard: 8}}",
     {"parallel.zero_shard_max": 4, "parallel.grad_accumulation_shard": True}),
    ("train: {accelerator: {enable_parallel_optimizer: false}}",
     {"mindspore.parallel_optimizer": False, "parallel.grad_accumulation_shard": None}),
    ("train: {accelerator: {pipeline_parallel_degree: 2, pp_interleave_num: 2, pipeline_scheduler: "
     "zero_bubble_v}, micro_batch_num: 4}",
     {"parallel.vpp": 2, "parallel.pp_schedule": "zero-bubble-v", "training.num_micro_batches": 4}),
    ("train: {gradient_checkpointing: {activation_checkpoint: selective}}", {"training.recompute": "selective"}),
    ("train: {global_batch_size: 16, micro_batch_size: 2}",
     {"training.global_batch_size": 16, "training.num_micro_batches": None, "training.micro_batch_size": 2}),
    ("data: {max_seq_len: 512}", {"model.seq_length": 512}),
    ("context: {max_device_memory: 32768MB}", {"device.capacity_gib": 32}),
])
def test_hyperparallel_defaults_and_keys(tmp_path: Path, extra: str, expected: dict) -> None:
    draft = imported("hyperparallel", write(tmp_path, "hp.yaml", HP_BASE + extra))
    assert {k: draft.get(k) for k in expected} == expected
    assert draft.load_error is None, draft.load_error


def test_hyperparallel_moe_mla_and_expert_tp(tmp_path: Path) -> None:
    # DeepSeek-V3's MLA and MoE fields (arXiv:2412.19437 §2.1, §4.2) under the override names
    # cost_model_parser_hyper.py reads
    text = ("model:\n  config_overrides: {hidden_size: 7168, num_hidden_layers: 61, num_attention_heads: 128, "
            "vocab_size: 129280, intermediate_size: 18432, num_experts: 256, num_experts_per_tok: 8, "
            "num_shared_experts: 1, moe_intermediate_size: 2048, first_k_dense_replace: 3, mtp_depth: 1, "
            "kv_lora_rank: 512, q_lora_rank: 1536, qk_rope_head_dim: 64, qk_nope_head_dim: 128, v_head_dim: 128}\n"
            "train: {accelerator: {dp_replicate: 2, tp_degree: 4, expert_parallel_degree: 16}}\n")
    draft = imported("hyperparallel", write(tmp_path, "ds.yaml", text))
    m = draft.config()["model"]
    assert (m["attention"], m["kv_lora_rank"], m["q_lora_rank"], m["num_shared_experts"], m["first_k_dense"],
            m["mtp_layers"], m["moe_ffn_hidden_size"]) == ("mla", 512, 1536, 1, 3, 1, 2048)
    # _cost_model_parser.py config_dp_tp_exp: t_exp = t, unless t_exp · ep > d · t (4 · 16 > 2 · 4): then 1
    assert draft.get("parallel.expert_tp") == 1


@pytest.mark.parametrize("extra, needle", [
    (HP_BASE.replace("}\n", ", full_rec: true}\n") + "train: {gradient_checkpointing: {activation_checkpoint: none}}\n",
     "config_overrides.full_rec True disagrees with recompute none"),
    (HP_BASE.replace("}\n", ", offset: [1, -1]}\n") + "train: {accelerator: {pipeline_parallel_degree: 2}}\n",
     "config_overrides.offset [1, -1] is not read by MemEst's HyperParallel parser (offset 0); an even split"),
    (HP_BASE + "train: {accelerator: {enable_parallel_optimizer: false, optimizer_weight_shard_size: 4}}\n",
     "train.accelerator.optimizer_weight_shard_size 4 is ignored"),
    (HP_BASE + "train: {accelerator: {pipeline_parallel_degree: 2, pipeline_scheduler: seqvpp}}\n",
     "train.accelerator.pipeline_scheduler seqvpp is not modelled; estimated as 1f1b"),
])
def test_hyperparallel_warnings_name_the_key_and_the_assumption(tmp_path: Path, extra: str, needle: str) -> None:
    draft = imported("hyperparallel", write(tmp_path, "hp.yaml", extra))
    assert [w for w in draft.warnings if needle in w], draft.warnings


@pytest.mark.parametrize("text, needle", [
    ("model: {config_overrides: {hidden_size: 64}}", "'model.config_overrides.num_attention_heads' is missing"),
    ("model: {model_config: {hidden_size: 64}}", "import it with 'memform import mindformers"),
    ("data: {max_seq_len: 8}", "'model.config_overrides' is missing"),
    (HP_BASE + "train: {gradient_checkpointing: {activation_checkpoint: most}}",
     "'train.gradient_checkpointing.activation_checkpoint' must be none, selective or full"),
    (HP_BASE + "train: {accelerator: {tp_degree: two}}", "'train.accelerator.tp_degree' must be a positive integer"),
    (HP_BASE.replace("model:\n", "model:\n  compute_dtype: int3\n"), "'model.compute_dtype' must be a dtype"),
    # a field neither read nor known to be memory-neutral is refused (issue 31), naming the --accept flag
    (HP_BASE + "train: {accelerator: {fancy_degree: 3}}\n", "--accept train.accelerator.fancy_degree"),
])
def test_hyperparallel_errors_name_file_and_field(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path, "hp.yaml", text)
    with pytest.raises(MemformError) as err:
        imported("hyperparallel", path)
    assert needle in str(err.value) and str(path) in str(err.value)


def test_mindformers_points_a_hyperparallel_file_to_its_importer() -> None:
    with pytest.raises(MemformError) as err:
        imported("mindformers", MIXTRAL)
    assert "'model.model_config' is missing" in str(err.value)
    assert f"memform import hyperparallel {MIXTRAL}" in str(err.value)
    r = run_memform("import", "mindformers", MIXTRAL)
    assert r.returncode == 2 and "memform import hyperparallel" in r.stderr and r.stdout == ""


def test_hyperparallel_is_registered() -> None:
    assert IMPORTERS["hyperparallel"].TITLE == "HyperParallel memory-estimation YAML"


# ---- MindFormers: interleaved pipeline, offsets, per-chunk recompute --------------------------

MF8 = ("model: {model_config: {hidden_size: 64, num_heads: 4, num_layers: 8, vocab_size: 64, seq_length: 8, "
       "pp_interleave_num: 2%s}}\n"
       "parallel_config: {data_parallel: 2, model_parallel: 1, pipeline_stage: 2, micro_batch_num: 4}\n"
       "parallel: {pipeline_config: {pipeline_interleave: true}}\n")


def mf8(tmp_path: Path, offset: str = "", extra: str = "") -> Draft:
    text = MF8 % (f", offset: {offset}" if offset else "") + extra
    return imported("mindformers", write(tmp_path, "m.yaml", text))


# LayerSetting: chunk v of stage i holds L // (pp·vpp) + offset[v][i] = 2 + offset layers (8 layers,
# pp 2, vpp 2); a flat offset is broadcast to every chunk (np.broadcast_to)
@pytest.mark.parametrize("offset, stage_layers, uneven_chunks", [
    ("[[1, 0], [0, -1]]", [5, 3], False),   # stage 0: 3 + 2, stage 1: 2 + 1 (memform's split too)
    ("[[0, 0], [1, -1]]", [5, 3], True),    # stage 0: 2 + 3, memform puts 3 + 2
    ("[1, -1]", [6, 2], False),             # broadcast: stage 0 chunks 3 + 3, stage 1 chunks 1 + 1
])
def test_mindformers_interleaved_offsets(tmp_path: Path, offset: str, stage_layers: list, uneven_chunks: bool) -> None:
    draft = mf8(tmp_path, offset)
    assert (draft.get("parallel.vpp"), draft.get("parallel.stage_layers")) == (2, stage_layers)
    assert bool([w for w in draft.warnings if "different layer counts" in w]) is uneven_chunks
    assert draft.load_error is None, draft.load_error


def test_mindformers_offset_that_does_not_add_up_is_not_imported(tmp_path: Path) -> None:
    draft = mf8(tmp_path, "[[1, 1], [0, 0]]")
    assert draft.get("parallel.stage_layers") is None
    assert [w for w in draft.warnings if "does not add up to num_layers 8 over 2 stages × 2 chunks" in w
            and "even split is assumed" in w]


def test_mindformers_pp_interleave_needs_pipeline_interleave(tmp_path: Path) -> None:
    text = (MF8 % "").replace("parallel: {pipeline_config: {pipeline_interleave: true}}\n", "")
    draft = imported("mindformers", write(tmp_path, "m.yaml", text))
    assert draft.get("parallel.vpp") is None
    assert [w for w in draft.warnings if "model_config.pp_interleave_num 2 without" in w
            and "one chunk per stage assumed" in w]


# _alloc_recompute_layer shares a stage's count out one layer per chunk, chunk 0 first; memform's
# training.recompute_num_layers with vpp > 1 is the first n layers of each chunk; anything else is
# written per layer (forward order: chunk 0 of stages 0, 1, then chunk 1 of stages 0, 1; 2 layers each)
@pytest.mark.parametrize("recompute, per_stage, per_layer", [
    ("[2, 4]", [1, 2], None),
    ("[true, 0]", [2, 0], None),
    ("[1, 2]", None, ["full", "none", "full", "none", "none", "none", "full", "none"]),
    ("[[1, 0], [0, 2]]", None, ["full", "none", "none", "none", "none", "none", "full", "full"]),
    ("[[2, 2], [2, 2]]", [2, 2], None),
])
def test_mindformers_recompute_per_chunk(tmp_path: Path, recompute: str, per_stage, per_layer) -> None:
    draft = mf8(tmp_path, extra=f"recompute_config: {{recompute: {recompute}}}\n")
    assert draft.get("training.recompute_num_layers") == per_stage
    assert draft.get("training.recompute_layers") == per_layer
    assert draft.get("training.recompute") == "none"
    assert draft.load_error is None, draft.load_error


def test_mindformers_full_and_selective_counts_per_layer(tmp_path: Path) -> None:
    # the first n layers of each chunk full, then selective, then the rest (LayerSetting.set: a fully
    # recomputed layer gets no selective patterns)
    draft = mf8(tmp_path, extra="recompute_config: {recompute: [1, 0], select_recompute: [2, 1]}\n")
    # stage 0: full [1, 0], selective [1, 1] per chunk; stage 1: full [0, 0], selective [1, 0]
    assert draft.get("training.recompute_layers") == ["full", "none", "selective", "none",
                                                      "selective", "none", "none", "none"]
    assert memform.estimate(draft.config()).peak_bytes > 0


MF_PO = ("model: {model_config: {hidden_size: 64, num_heads: 4, num_layers: 4, vocab_size: 64, seq_length: 8}}\n"
         "parallel_config: {data_parallel: 6, model_parallel: 2, pipeline_stage: 2, micro_batch_num: 2}\n")


@pytest.mark.parametrize("extra, key, value, needle", [
    # enable_parallel_optimizer false: the shard size means nothing
    ("parallel: {enable_parallel_optimizer: false, parallel_optimizer_config: {optimizer_weight_shard_size: 2}}",
     "parallel.zero_shard_max", None, "optimizer_weight_shard_size 2 is ignored"),
    # operator_info.cc CreateGroupForOptShard: 4 does not divide dp 6 -> no group for TP-split parameters
    ("parallel: {enable_parallel_optimizer: true, parallel_optimizer_config: {optimizer_weight_shard_size: 4}}",
     "parallel.zero_shard_max", 4, "does not divide data_parallel × context_parallel = 6"),
    ("parallel: {enable_parallel_optimizer: true, parallel_optimizer_config: {optimizer_weight_shard_size: 3}}",
     "parallel.zero_shard_max", 3, None),
    ("parallel: {pipeline_config: {pipeline_scheduler: gpipe}}", "parallel.pp_schedule", "gpipe", None),
    ("parallel: {pipeline_config: {pipeline_scheduler: seqpipe}}\nparallel_config: {data_parallel: 6, "
     "model_parallel: 2, pipeline_stage: 2, micro_batch_num: 2, seq_split_num: 2}",
     "parallel.seq_chunks", 2, None),
    ("parallel: {pipeline_config: {pipeline_scheduler: seqsmartvpp}}", "parallel.pp_schedule", "1f1b",
     "pipeline_scheduler seqsmartvpp is not modelled; estimated as 1f1b"),
    ("parallel_config: {data_parallel: 6, model_parallel: 2, pipeline_stage: 2, vocab_emb_dp: false}",
     "mindspore.vocab_emb_dp", False, None),
])
def test_mindformers_parallel_optimizer_schedule_and_vocab(tmp_path: Path, extra: str, key: str, value,
                                                           needle: str | None) -> None:
    text = MF_PO + extra + "\n"
    if "parallel_config:" in extra:
        text = text.replace("parallel_config: {data_parallel: 6, model_parallel: 2, pipeline_stage: 2, "
                            "micro_batch_num: 2}\n", "", 1)
    draft = imported("mindformers", write(tmp_path, "m.yaml", text))
    assert draft.get(key) == value
    if needle is None:
        assert not [w for w in draft.warnings if "optimizer_weight_shard_size" in w or "pipeline_scheduler" in w]
    else:
        assert [w for w in draft.warnings if needle in w], draft.warnings


MF_MOE = ("model: {model_config: {hidden_size: 64, num_heads: 4, num_layers: 4, vocab_size: 64, seq_length: 8}}\n"
          "parallel_config: {data_parallel: 4, model_parallel: 2, pipeline_stage: 2, micro_batch_num: 2, "
          "expert_parallel: 2, use_seq_parallel: true}\n")


@pytest.mark.parametrize("etp, expected", [(1, 1), (2, 2), (None, 2)])
def test_mindformers_expert_model_parallel(tmp_path: Path, etp, expected) -> None:
    # llama_layer.py LlamaFeedForwardWithMoE: experts split over model_parallel unless expert_model_parallel 1
    etp_field = f", expert_model_parallel: {etp}" if etp else ""
    moe = "moe_config: {expert_num: 4, num_experts_chosen: 2" + etp_field + "}\n"
    draft = imported("mindformers", write(tmp_path, "m.yaml", MF_MOE + moe))
    assert (draft.get("parallel.ep"), draft.get("parallel.expert_tp")) == (2, expected)
    assert draft.load_error is None, draft.load_error


def test_mindformers_expert_model_parallel_other_values_are_refused(tmp_path: Path) -> None:
    moe = "moe_config: {expert_num: 4, num_experts_chosen: 2, expert_model_parallel: 3}\n"
    with pytest.raises(MemformError, match="'moe_config.expert_model_parallel' must be 1 or model_parallel"):
        imported("mindformers", write(tmp_path, "m.yaml", MF_MOE + moe))
