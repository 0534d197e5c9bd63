"""Real jobs as their authors ran them (issue 30): the mechanisms their reports name, each in the formula
files, and the published runs that must fit on the devices they trained on.

- Selective recompute of named modules (Megatron-Core --recompute-modules, transformer_config.py
  recompute_modules): what each drops is read off the layer's closed form, one term per saved tensor
  (Korthikanti et al. 2022 §4.1 accounting; what Megatron discards: transformer_layer.py,
  multi_latent_attention.py, moe/experts.py). Measured against megatron-core itself in
  bench/validate.py --frameworks (the rc=selective[...] rows).
- DualPipe (DeepSeek-AI 2024 §3.2.1): every piece held twice ("two copies of the model parameters"), PP + 1
  micro-batches of activations in flight (deepseek-ai/DualPipe README, memory table).
- configs/published/deepseek-v3-report.yaml (2048 H800, PP16 DualPipe, EP64, ZeRO-1, no TP) fits on 80 GB, and does
  not without each mechanism its report states; configs/llama3-405b.yaml (128K) fits, and so does the 8K row
  of the Llama 3 paper with its pipeline layout (one layer per chunk, the embedding and the output alone).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import sympy
from cli_helpers import run_memform as run

from memform.api import load_model, partition_of
from memform.errors import MemformError
from estimate_helpers import numbers  # numbers only: the numeric path (tests/test_numeric.py ties it to sympy's)

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
GIB = 2 ** 30


def dropped_bytes(config: str, block: str, overrides: dict, modules: list[str], expected: str) -> sympy.Expr:
    """The closed form of what ``modules`` take off one layer's stored activations, less ``expected``
    (written with the formula files' symbol names): 0 when they drop exactly the expected tensors."""
    base = {**overrides, "training.recompute": "selective"}
    model = load_model(CONFIGS / config, base)
    plain = model.evaluator().quantity(block, "act", "none")
    recomputed = load_model(CONFIGS / config, {**base, "training.recompute_modules": modules})
    less = recomputed.evaluator().quantity(block, "act", "selective")
    return sympy.simplify(plain - less - sympy.sympify(expected, locals=model.bound.symbols))


# ---- recompute modules ----------------------------------------------------------------------------
@pytest.mark.parametrize("modules, dropped", [
    # core_attn is Megatron's default: with flash attention nothing else is dropped (dense.mf act[selective])
    (["core_attn"], "0"),
    # layernorm: the outputs of the two norms, the QKV and fc1 inputs, 2·s·b·h/t bytes each with SP
    # (Korthikanti §4.1: "input to the QKV ... 2sbh", "MLP: input 2sbh"; split over t by SP, §4.2.2)
    (["core_attn", "layernorm"], "4*b*s*h/(t*cp)"),
    # mlp: fc1's 2f-wide output and the SwiGLU's f-wide output, 2 bytes each over t (dense.mf mlp); the
    # checkpoint keeps its input, the norm's output, which it shares with fc1
    (["mlp"], "6*b*s*f/(t*cp)"),
    # both: the MLP's input goes too (the norm's checkpoint discards the storage the MLP checkpoint holds)
    (["layernorm", "mlp"], "6*b*s*f/(t*cp) + 4*b*s*h/(t*cp)"),
])
def test_recompute_modules_drop_the_tensors_they_name(modules, dropped):
    assert dropped_bytes("llama3-8b.yaml", "decoder", {}, modules, dropped) == 0


def test_mla_up_projection_recompute_drops_q_k_and_v():
    # DeepSeek-V3 §3.2.3 / Megatron multi_latent_attention.py qkv_up_checkpoint: the up-projected
    # Q and K (n_h(d_h + d_h^R) each) and V (n_h·d_v), bf16, per token on this TP rank, besides the first
    # norm's output with layernorm; the core's output (n_h·d_v, the input of W^O) stays
    assert dropped_bytes("deepseek-v3.yaml", "attention", {}, ["mla_up_proj"],
                         "2*b*s*a*(2*(d_nope + d_rope) + d_v)/(t*cp)") == 0
    assert dropped_bytes("deepseek-v3.yaml", "attention", {}, ["layernorm", "mla_up_proj"],
                         "2*b*s*a*(2*(d_nope + d_rope) + d_v)/(t*cp) + 2*b*s*h/(t*cp)") == 0


def test_moe_act_recompute_drops_the_activation_output():
    # Megatron-Core moe/experts.py: the weighted SwiGLU's output (fc2's input, f_exp/etp wide, bf16) of each
    # routed token is rebuilt; expert_tokens = top-k · s·b·etp/(cp·t) (moe.mf)
    assert dropped_bytes("deepseek-v3.yaml", "experts", {}, ["moe_act"],
                         "2*topk*s*b*etp/(cp*t) * f_exp/etp") == 0


def test_recompute_modules_are_checked():
    with pytest.raises(MemformError, match="recompute_modules.*'atn' is not one of them"):
        numbers(CONFIGS / "llama3-8b.yaml", overrides={"training.recompute_modules": ["atn"]})
    with pytest.raises(MemformError, match="mla_up_proj needs MLA"):
        numbers(CONFIGS / "llama3-8b.yaml", overrides={"training.recompute_modules": ["mla_up_proj"]})


def test_recompute_modules_from_a_megatron_command_line(tmp_path):
    args = tmp_path / "args.txt"
    args.write_text("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 512 "
                    "--max-position-embeddings 512 --micro-batch-size 1 --global-batch-size 8 --swiglu --bf16 "
                    "--vocab-size 1024 --recompute-granularity selective --recompute-modules core_attn layernorm mlp "
                    "--activation-func-fp8-input-store --fp8-format e4m3 --fp8-recipe blockwise\n")
    out = tmp_path / "out.yaml"
    r = run("import", "megatron", str(args), "-o", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "recompute_modules: [core_attn, layernorm, mlp]" in text
    assert "fp8_recipe: blockwise" in text and "activation_func_fp8_input_store: true" in text
    args.write_text(args.read_text().replace("core_attn layernorm mlp", "core_attn attn_out"))
    r = run("import", "megatron", str(args), "-o", str(out))
    assert r.returncode == 2 and "recompute-modules" in r.stderr and "attn_out" in r.stderr


# ---- DualPipe -------------------------------------------------------------------------------------
def test_dualpipe_holds_every_piece_twice():
    model = load_model(CONFIGS / "published" / "deepseek-v3-report.yaml")
    part = partition_of(model, model.evaluator())
    p = part.pp
    for k in range(p):
        # piece k: stage k's chunk 0 and stage p-1-k's chunk 1 (DeepSeek-V3 Figure 5: both directions)
        assert [g.first_layer for g in part.chunks[k][0].groups] == [g.first_layer for g in part.chunks[p - 1 - k][1].groups]
    # the embedding (first piece) and the head with the MTP module (last piece) on rank 0 and rank p-1
    blocks0 = {g.block for c in part.chunks[0] for g in c.groups}
    assert {"embedding", "output", "mtp"} <= blocks0 and "mtp_embedding" not in blocks0


def test_dualpipe_keeps_pp_plus_one_micro_batches():
    # deepseek-ai/DualPipe README memory table: activations PP + 1 (in micro-batches of one piece), on
    # every rank: chunk inflight counts sum to PP at the end of warm-up, + 1 forward in the main step
    model = load_model(CONFIGS / "published" / "deepseek-v3-report.yaml")
    ev = model.evaluator()
    p = 16
    for stage in range(p):
        held = sum(ev.quantity("dualpipe", "inflight", None, extra=(("stage", sympy.Integer(stage)),
                                                                  ("chunk", sympy.Integer(c)))) for c in (0, 1))
        assert held.subs(model.bound.values) == p


# ---- the published runs ---------------------------------------------------------------------------
def test_deepseek_v3_as_its_report_states_fits_on_h800():
    est = numbers(CONFIGS / "published" / "deepseek-v3-report.yaml")
    assert est.fits and all(st.fits for st in est.stages)
    assert est.peak_bytes < 80 * GIB and max(st.reserved_bytes for st in est.stages) < 80 * GIB


@pytest.mark.parametrize("without, overrides", [
    # each mechanism of the report, taken away alone, and the device no longer holds the job
    ("RMSNorm and MLA up-projection recompute (§3.2.3)", {"training.recompute_modules": ["moe_act"]}),
    ("MLA up-projection recompute (§3.2.3)", {"training.recompute_modules": ["layernorm", "moe_act"]}),
    ("RMSNorm recompute (§3.2.3)", {"training.recompute_modules": ["mla_up_proj", "moe_act"]}),
    ("SwiGLU output recompute (§3.3.2)", {"training.recompute_modules": ["layernorm", "mla_up_proj"]}),
    ("FP8 GEMMs and cached inputs (§3.3)", {"megatron.fp8": "none", "megatron.activation_func_fp8_input_store": False}),
])
def test_deepseek_v3_needs_each_mechanism_of_its_report(without, overrides):
    est = numbers(CONFIGS / "published" / "deepseek-v3-report.yaml", overrides=overrides)
    assert not est.fits, f"fits without {without}"


def test_deepseek_v3_bf16_moments_and_shared_mtp_embedding_are_margin():
    # BF16 AdamW moments (§3.3.3) and the MTP module's shared embedding (§3.2.1) are not what makes the job
    # fit: fp32 moments add 2.7 GiB to the peak stage (79.0 GiB allocated, 79.5 GiB reserved with Megatron's
    # gradient buffers kept across steps: still fits; 84.6 GiB and three cache releases while the replay freed
    # them), a private MTP embedding copy adds to stage 0 only
    base = numbers(CONFIGS / "published" / "deepseek-v3-report.yaml")
    fp32 = numbers(CONFIGS / "published" / "deepseek-v3-report.yaml", overrides={"training.precision.optimizer": "fp32"})
    assert fp32.peak_bytes > base.peak_bytes and fp32.fits
    assert max(st.reserved_bytes for st in fp32.stages) > max(st.reserved_bytes for st in base.stages)
    copy = numbers(CONFIGS / "published" / "deepseek-v3-report.yaml", overrides={"parallel.mtp_embedding_shared": False})
    assert copy.stages[0].peak_bytes > base.stages[0].peak_bytes and copy.peak_bytes == base.peak_bytes


def test_llama3_405b_long_context_fits_on_h100():
    est = numbers(CONFIGS / "llama3-405b.yaml")
    assert est.fits and all(st.fits for st in est.stages)


# configs/published/llama3-405b-8k.yaml lays the pipeline out as Llama 3 §3.3.2 states it: "the first model chunk on the
# first stage has only the embedding, and the last model chunk on the last stage has only output projection and
# loss calculation", V chunks per rank. 126 layers over the 16·V - 2 other chunks split evenly only at V = 8 (one
# layer each; V = 1 is no interleave): Megatron-Core's --account-for-embedding/loss-in-pipeline-split at V = 8
# ((126 + 2) / (16 · 8) = 1 per chunk, the embedding's and the loss's slots empty; get_num_layers_to_build)
V2_LAYOUT = {"parallel.vpp": 2, "parallel.stage_layers": [7] + [8] * 14 + [7]}


def test_llama3_405b_8k_as_its_paper_states_fits_on_h100():
    # §3.3.2's N, the micro-batches a chunk runs back to back, at N = PP = 16: Megatron-Core's default and the
    # smallest it accepts (schedules.py: p <= N <= m), depth-first; the paper tunes N "between DFS and BFS"
    # (N = PP is DFS), and 32 micro-batches per DP rank (2,048 sequences / DP 64) leave no N < PP to run
    # ("fewer micro-batches than the number of stages" is a batch below 16). Stage 1 holds 141 one-layer
    # chunk passes (2(p - 2) + (V - 1)N + 1) against 1F1B's 15 x 8 = 120: 78.6 GiB of 80
    paper = numbers(CONFIGS / "published" / "llama3-405b-8k.yaml")
    assert paper.fits and all(st.fits for st in paper.stages)
    assert paper.peak_stage == 1 and sum(int(l.inflight_value) for l in paper.stages[1].layers) == 141
    # the embedding-only first chunk holds 2p - 1 = 31 passes of no decoder: stage 0 is not the peak
    assert [l.block for l in paper.stages[0].layers if l.chunk == 0] == ["embedding"]
    assert numbers(CONFIGS / "published" / "llama3-405b-8k.yaml", {"parallel.vpp_microbatch_group": 16}).peak_bytes == paper.peak_bytes
    # at V = 2 (the smallest interleave, 7 + 14 x 8 + 7: 98.0 GiB) it does not fit -- stage 1's chunk 0 holds
    # 2p - 3 = 29 passes of 4 layers --, nor breadth-first (N = m = 32: every micro-batch of every chunk)
    assert not numbers(CONFIGS / "published" / "llama3-405b-8k.yaml", V2_LAYOUT).fits
    assert not numbers(CONFIGS / "published" / "llama3-405b-8k.yaml", {"parallel.vpp_microbatch_group": 32}).fits


@pytest.mark.parametrize("flags, split", [
    # Megatron-Core transformer_block.py get_num_layers_to_build: (L + 1 + 1) / pp = 8 per stage, the
    # embedding's slot taken from the first stage and the loss's from the last
    ("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split", [7, 8, 8, 7]),
    ("--account-for-embedding-in-pipeline-split", None),   # 31 layers do not split over 4 stages: refused
    # with a virtual pipeline (4 layers per virtual stage: 32 / (4 · 4) = 2 chunks) each chunk builds 4, the
    # first stage's first chunk (vp_stage 0: is_vp_first_stage) and the last stage's last one 3
    ("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
     "--num-layers-per-virtual-pipeline-stage 4", [[3, 4], [4, 4], [4, 4], [4, 3]]),
])
def test_megatron_account_for_embedding_and_loss_in_the_split(tmp_path, flags, split):
    args = tmp_path / "args.txt"
    args.write_text("--num-layers 30 --hidden-size 256 --num-attention-heads 4 --seq-length 512 "
                    "--max-position-embeddings 512 --micro-batch-size 1 --global-batch-size 64 --swiglu --bf16 "
                    f"--vocab-size 1024 --pipeline-model-parallel-size 4 {flags}\n")
    out = tmp_path / "out.yaml"
    r = run("import", "megatron", str(args), "-o", str(out))
    if split is None:
        assert r.returncode == 2 and "pipeline chunks" in r.stderr
        return
    assert r.returncode == 0, r.stderr
    assert f"stage_layers: {split}".replace("'", "") in out.read_text()


# ---- published runs not named in issue 30 (tried as they were reported) ----------------------------
# Each config cites its report / launch script; what the source leaves open is chosen in the config's
# comment and varied here where it could matter.
HELDOUT_RUNS = [
    # BLOOM 176B: BigScience's tr11-176B-ml.slurm (384 A100 80GB, TP 4 PP 12 DP 8, BF16_Optimizer, full recompute)
    ("published/bloom-176b.yaml", {}),
    # OPT-175B: 992 A100 80GB, FSDP (no reshard after forward) + TP 8, memory-efficient fp16 (§2.4)
    ("published/opt-175b.yaml", {}),
    # Nemotron-4 340B, Table 2's three data-parallel rows (16 / 32 / 64 with batch 768 / 1536 / 2304)
    ("published/nemotron-4-340b.yaml", {}),
    ("published/nemotron-4-340b.yaml", {"parallel.dp": 32, "parallel.devices": 3072, "training.global_batch_size": 1536}),
    ("published/nemotron-4-340b.yaml", {"parallel.dp": 16, "parallel.devices": 1536, "training.global_batch_size": 768}),
    # ... and the virtual-pipeline sizes the report leaves open (8 layers per stage: 2, 4 or 8 chunks)
    ("published/nemotron-4-340b.yaml", {"parallel.vpp": 4}),
    ("published/nemotron-4-340b.yaml", {"parallel.vpp": 8}),
    # Falcon-180B: 4096 A100 40GB, TP 8 PP 8 DP 64 with ZeRO (model card); no recompute needed
    ("published/falcon-180b.yaml", {}),
    # DeepSeek-V2: PP 16, EP 8, ZeRO-1, no TP (§3.1.3), at the fewest GPUs the layout allows and at 1,024
    ("published/deepseek-v2-report.yaml", {}),
    ("published/deepseek-v2-report.yaml", {"parallel.dp": 64, "parallel.devices": 1024}),
    # MT-NLG 530B in Korthikanti et al. 2022 Table 3 / 5 (280 A100 80GB), and §6.3's 2,240 GPUs (DP 8)
    ("published/mt-nlg-530b.yaml", {}),
    ("published/mt-nlg-530b.yaml", {"parallel.dp": 8, "parallel.devices": 2240, "training.global_batch_size": 2240}),
    # GPT-NeoX-20B: 96 A100 40GB, TP 2 PP 4 DP 12, ZeRO-1, fp16, micro-batch 4, every layer checkpointed (configs/20B.yml)
    ("published/gpt-neox-20b.yaml", {}),
    # StarCoder 15.5B: 512 A100 80GB, TP 4 PP 4 DP 32, micro-batch 1 at 8K, multi-query attention (paper §5.6); the
    # recompute the paper leaves open: BigCode's selective one, and none
    ("published/starcoder-15b.yaml", {}),
    ("published/starcoder-15b.yaml", {"training.recompute": "none"}),
    # OLMo-7B: FSDP (FULL_SHARD, bf16 compute, fp32 reduce) over MosaicML's 216 A100 40GB, micro-batch 2 x 2048,
    # no activation checkpointing (configs/official/OLMo-7B.yaml)
    ("published/olmo-7b.yaml", {}),
    # OLMoE-1B-7B: 64 experts top-8 under FSDP FULL_SHARD (no EP) on 256 H100, micro-batch 4 x 4096 (OLMoE-1B-7B-0824.yml)
    ("published/olmoe-1b-7b.yaml", {}),
    # Megatron-Core MoE team's H100 recipes (Megatron-MoE-ModelZoo): Mixtral 8x22B on 128 GPUs (TP 2 PP 8 EP 8,
    # dropless) and DeepSeek-V3 on 1,024 (TP 2 PP 8 VPP 4 EP 64, fp8 blockwise, bf16 moments, layout "Et|(tt|)*30mL")
    ("published/mixtral-8x22b-mcore.yaml", {}),
    ("published/deepseek-v3-mcore-h100.yaml", {}),
]


def _run_id(config: str, overrides: dict) -> str:
    return "-".join([Path(config).stem] + [f"{k.split('.')[-1]}{v}" for k, v in overrides.items() if k != "parallel.devices"])


@pytest.mark.parametrize("config, overrides", HELDOUT_RUNS, ids=[_run_id(c, o) for c, o in HELDOUT_RUNS])
def test_published_run_fits_on_its_device(config, overrides):
    est = numbers(CONFIGS / config, overrides=overrides)
    assert est.fits
    for st in est.stages:
        # every stage inside the device, without the allocator having to release its cache
        assert st.fits and st.device_bytes <= st.capacity_bytes and st.reserve_releases == 0, st.stage


def test_multi_query_attention_under_wider_tp_needs_replicated_kv():
    # StarCoder's one key/value head under TP 4: Megatron-Core refuses (num_query_groups % tp), BigCode's
    # Megatron-LM keeps the key_value Linear whole on every TP rank (parallel.kv_replicate): each rank then holds
    # and saves one head's K/V, as four KV heads split four ways would
    with pytest.raises(MemformError, match="num_kv_heads"):
        numbers(CONFIGS / "published" / "starcoder-15b.yaml", overrides={"parallel.kv_replicate": False})
    one = numbers(CONFIGS / "published" / "starcoder-15b.yaml")
    four = numbers(CONFIGS / "published" / "starcoder-15b.yaml",
                   overrides={"parallel.kv_replicate": False, "model.num_kv_heads": 4})
    assert [st.peak_bytes for st in one.stages] == [st.peak_bytes for st in four.stages]
    # the model's own count keeps one head: 15,517,456,384 at PP 1, the released GPTBigCode config's tensors added up
    # by hand (40 x (h(h + 2 d_h) + h^2 + 2hf + biases and norms) + (49152 + 8192) h + 2h; the model card: 15.5B)
    assert numbers(CONFIGS / "published" / "starcoder-15b.yaml",
                   overrides={"parallel.pp": 1, "parallel.dp": 128}).parameters["total"] == 15_517_456_384


def test_modelzoo_mixtral_args_import_as_the_config():
    # the ModelZoo's Mixtral-8x22B arguments (tests/data/importers/megatron/modelzoo_mixtral_8x22b.args) give the job
    # configs/published/mixtral-8x22b-mcore.yaml writes: 140.6 B parameters (Mixtral 8x22B's 141 B)
    from memform.importers import Options, import_config
    draft = import_config("megatron", ROOT / "tests" / "data" / "importers" / "megatron" / "modelzoo_mixtral_8x22b.args",
                          Options(devices=128))
    imported = numbers(draft.config(), {"device.preset": "h100-sxm"})
    bundled = numbers(CONFIGS / "published" / "mixtral-8x22b-mcore.yaml")
    assert [st.peak_bytes for st in imported.stages] == [st.peak_bytes for st in bundled.stages]
    assert bundled.parameters["total"] == 140_620_634_112


def test_deepseek_v3_modelzoo_layout_and_what_it_leaves_out():
    # "Et|(tt|)*30mL": rank s holds virtual stages s, s + 8, s + 16, s + 24; the first is the embedding and one layer,
    # the last (rank 7's fourth) the MTP module and the loss, every other two layers
    est = numbers(CONFIGS / "published" / "deepseek-v3-mcore-h100.yaml")
    assert [l.block for l in est.stages[0].layers if l.chunk == 0] == ["embedding", "decoder"]
    last = [(l.block, l.first_layer) for l in est.stages[7].layers if l.chunk == 3]
    # the MTP module (its embedding copy, projection and own MoE block) and the output; none of the 61 body layers
    assert last == [("mtp_embedding", 62), ("mtp", 63), ("moe_decoder", 64), ("output", 65)]
    # the peak stage keeps 57.1 GiB reserved: 22.9 GiB of the 80 for what is not modelled (the EP all-to-all overlap's
    # second micro-batch in flight, DeepEP's buffers); without the recompute of MLA's up-projections the peak stage
    # allocates 17.5 GiB more (73.9 GiB)
    assert max(st.reserved_bytes for st in est.stages) / GIB == pytest.approx(57.06, abs=0.01)
    more = numbers(CONFIGS / "published" / "deepseek-v3-mcore-h100.yaml", {"training.recompute_modules": ["mlp"]})
    assert (more.peak_bytes - est.peak_bytes) / GIB == pytest.approx(17.5, abs=0.05)


def test_deepseek_v2_fits_only_with_recomputed_operators():
    # §3.1.3: "a portion of the operators are recomputed to save activation memory", which is what lets it
    # train without tensor parallelism. With only the attention core (Megatron's default selective
    # recompute, nothing under FlashAttention) the deepest-loaded stage needs ~114 GiB.
    est = numbers(CONFIGS / "published" / "deepseek-v2-report.yaml", overrides={"training.recompute_modules": ["core_attn"]})
    assert not est.fits and est.peak_bytes > 100 * GIB


# BLOOM's own measurements before the run (bigscience-workshop/bigscience
# train/tr11-176B-ml/chronicles-prequel.md, "Rebalancing layers", 02-28: the BF16 optimizer with fp32
# gradient accumulation and --pp-partition-method 'type:transformer|embedding', the final code): nvidia-smi
# on the first node (pipeline stage 0, which holds the embedding), in GB as the table prints them, for the
# 176B shape (NHIDDEN=14336, NLAYERS=70) at GBS 2048. The CUDA context is outside the allocator: 1573 MiB
# (the same document, "40GB A100 takes 1573MiB for cuda kernels").
BLOOM_MEASURED = [
    # (dp, tp, micro-batch, heads, measured GiB)
    (8, 4, 2, 112, 59),   # the configuration BLOOM trained with
    (8, 4, 2, 64, 59),
    (8, 4, 2, 128, 60),
    (8, 4, 4, 64, 73),
    (4, 8, 2, 64, 40),
]


def bloom_device_gib(dp: int, tp: int, b: int, a: int) -> float:
    est = numbers(CONFIGS / "published" / "bloom-176b.yaml", overrides={
        "parallel.dp": dp, "parallel.tp": tp, "parallel.devices": dp * tp * 12, "training.micro_batch_size": b,
        "model.num_heads": a, "device.context_mib": 1573})
    return est.stages[0].device_bytes / GIB


def test_bloom_as_trained_matches_its_measured_memory():
    # 60.4 GiB against 59 (+2.3 %, with BF16_Optimizer's ReduceGrads copy and without the IPG bucket it never
    # allocates, deepspeed.mf after_bwd / ds_bf16o); 54.8 (-7.1 %) before those, 54.4 before BF16_Optimizer's fp32
    # copy of the embedding's gradient after each micro-batch's backward, deepspeed.mf moment hp_grads; 54.2 before the PipelineEngine's kept stage outputs);
    # before BF16_Optimizer's bf16 .grad was counted, 45.5 (-22.9 %). What the
    # allocator does not hold (NCCL's buffers, cuBLAS / cuDNN handles) is outside the 1573 MiB context too.
    dp, tp, b, a, measured = BLOOM_MEASURED[0]
    assert bloom_device_gib(dp, tp, b, a) == pytest.approx(measured, rel=0.10)


# All five rows within 10 % (+2.3, +1.1, +1.1, -2.8, -6.1 %) since BF16_Optimizer's ReduceGrads copy of its flat
# gradient buffer is replayed after the backward (deepspeed.mf after_bwd: on stage 0 one 7.4 GiB tensor the
# activations' cached segments cannot hold) and its IPG bucket, which it never allocates, is no longer counted
# (-1.86 GiB); they were -7.1 to -12.0 % (a strict xfail) before. What is left is per micro-batch (b 2 -> 4 adds
# 14 GB on nvidia-smi, 11.3 GiB in memform) and the TP 8 row (-6.1 %).
def test_bloom_measured_rows_within_ten_percent():
    for dp, tp, b, a, measured in BLOOM_MEASURED:
        assert bloom_device_gib(dp, tp, b, a) == pytest.approx(measured, rel=0.10), (dp, tp, b, a)


# torchtitan's published Llama 3.1 405B memory (pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md,
# torchtitan 9dec370, Dec 2024, H100 96 GB; "Memory(GiB)" is max_reserved, the maximum over all GPUs):
# Table 5 (FSDP 8, TP 8, PP 8, local batch 32, full AC, Float8, 1F1B / Interleaved 1F1B) and Table 6 (the same
# with local batch 8 and CP 1-8 at 32K-256K tokens, 1F1B). The job config of that time: the 405B TOML with
# float8 and its fp8 all-gather (tests/data/importers/torchtitan/01424cb_llama3_405b.toml); pipelining splits
# the local batch into as many micro-batches as there are stages ("The default value will be the number of
# pipeline stages", experimental.pipeline_parallel_microbatches); with PP, torchtitan keeps parameters
# unsharded after forward and torch.distributed.pipelining accumulates unsharded gradients over the
# micro-batches (stage.py backward_maybe_with_nosync: set_requires_gradient_sync(last)); FSDP shards over
# DP x CP (8 ranks in every row). The job's compiled blocks are modelled (fsdp2.mf compile_mode); AsyncTP's
# symmetric-memory workspaces are outside max_reserved (CUDASymmetricMemoryAllocator::alloc maps them with the
# driver's cuMemCreate, not the caching allocator). The fp8 all-gather is on only where dp_shard > 1
# (torchtitan 9dec370 float8.py:51-54): the CP 8 row (FSDP 1 x CP 8) gathers and keeps bf16 weights, as
# `memform import torchtitan` writes for it. 126 layers: 15 on the first and last stage, 16 elsewhere.
TITAN_405B = [
    # (table, dp, cp, seq, vpp, micro-batch, measured GiB)
    ("Table 5 1F1B", 8, 1, 8192, 1, 4, 82.5),
    ("Table 5 Interleaved 1F1B", 8, 1, 8192, 2, 4, 72.7),
    ("Table 6 CP 1", 8, 1, 32768, 1, 1, 75.3),
    ("Table 6 CP 2", 4, 2, 65536, 1, 1, 75.9),
    ("Table 6 CP 4", 2, 4, 131072, 1, 1, 77.1),
    ("Table 6 CP 8", 1, 8, 262144, 1, 1, 84.9),
]
# memform's recorded error per row: 1F1B -12.1 %, interleaved -13.0 %, CP 1/2/4/8 -3.7 / -1.5 / -3.0 / -5.4 %.
# torch's pipelining keeps one receive buffer per micro-batch for each stage's output gradient (and input),
# 8 x 128 MiB on stage 0, 16 on the interleaved peak rank (fsdp2.mf pp_recv_bufs; traced: bench/validate.py
# --frameworks --only pp2): +1.0 / +2.0 GiB on every row (before: -13.3, -15.7, -5.0, -2.8, -4.3, -6.6 %). CP 8
# read -13.1 % while its Float8 weights were counted gathered in fp8, which torchtitan turns off at dp_shard 1
# (the bf16 kept weights measured: bench/validate.py --frameworks --only "stage0 b4 float8-tensorwise fake");
# before the compiled blocks (model.compile blocks: a fully recomputed block's rebuild in backward without silu's
# output) and the fp8 kept weights at 1 byte -6.3 / -7.2 / +2.7 / +4.8 / +3.2 / -6.3 %. With the fp8 all-gather the
# blocks' weights kept unsharded from forward to backward (PP: reshard_after_forward false) are the gathered fp8
# buffers, 1 byte per weight (torchao 0.18 float8/fsdp_utils.py fsdp_post_all_gather; measured: bench/validate.py
# --frameworks --only fp8-ag, the PP 2 case), not bf16's 2: 5.4 GiB less on every row. Three rows agreed within
# 8 % only with that overcount.
TITAN_405B_RECORDED = {"Table 5 1F1B": -0.121, "Table 5 Interleaved 1F1B": -0.130, "Table 6 CP 1": -0.037,
                       "Table 6 CP 2": -0.015, "Table 6 CP 4": -0.030, "Table 6 CP 8": -0.054}


@functools.lru_cache(maxsize=None)
def titan_405b_reserved_gib(dp: int, cp: int, seq: int, vpp: int, b: int) -> float:
    """memform's largest stage reserve for one row of torchtitan's 405B benchmark, imported as it ran."""
    from memform.importers import Options, import_config
    fixture = ROOT / "tests" / "data" / "importers" / "torchtitan" / "01424cb_llama3_405b.toml"
    # imported at the row's degrees: with FSDP 1 x CP 8 torchtitan all-gathers the Float8 weights in bf16
    # (float8.py: enable_fsdp_float8_all_gather only with dp_shard > 1; importers/torchtitan.py finish)
    draft = import_config("torchtitan", fixture, Options(devices=512, overrides={
        "parallel.pp": 8, "parallel.dp": dp, "parallel.cp": cp}))
    est = numbers(draft.config(), {
        "model.seq_length": seq, "parallel.vpp": vpp, "training.micro_batch_size": b,
        # torchtitan's Interleaved1F1B is torch's ScheduleInterleaved1F1B (memform import torchtitan writes it so)
        "parallel.pp_schedule": "interleaved" if vpp > 1 else "1f1b",
        "training.num_micro_batches": 8, "training.global_batch_size": b * 8 * dp,  # the local batch b x 8, per DP rank
        "fsdp2.reshard_after_forward": False,
        "parallel.grad_accumulation_shard": False, "parallel.stage_layers": [15, 16, 16, 16, 16, 16, 16, 15],
        "device.capacity_gib": 96, "device.context_mib": 0})
    return max(st.reserved_bytes for st in est.stages) / GIB


_UNDER_REASON = ("Table 5 reads 12-13 % under the published reserve. Its micro-batch (4 x 8K) has the tokens of "
                 "Table 6 CP 1's (1 x 32K), the same 8 in flight and the same local tokens (32 x 8K = 8 x 32K), so "
                 "memform's 1F1B figure is byte-identical to CP 1's (-3.7 %) while the published reserve is 7.2 GiB "
                 "higher: what is missing depends on how a micro-batch splits into sequences under torch.compile "
                 "and AsyncTP (or on a setting the benchmark does not state), not on a per-token buffer (AsyncTP's symmetric-memory workspaces are outside "
                 "max_reserved: cuMemCreate, not the caching allocator). Neither compile's fused AsyncTP matmuls "
                 "nor the GPU's allocator runs on the CPU harness; not measured")


@pytest.mark.parametrize("table, dp, cp, seq, vpp, b, measured", TITAN_405B, ids=[r[0] for r in TITAN_405B])
def test_torchtitan_published_llama31_405b_recorded_error(table, dp, cp, seq, vpp, b, measured):
    error = titan_405b_reserved_gib(dp, cp, seq, vpp, b) / measured - 1
    assert error == pytest.approx(TITAN_405B_RECORDED[table], abs=0.005), f"{table}: {error:+.1%}"


@pytest.mark.parametrize("table, dp, cp, seq, vpp, b, measured", [
    pytest.param(*r, marks=pytest.mark.xfail(strict=True, reason=_UNDER_REASON))
    if abs(TITAN_405B_RECORDED[r[0]]) > 0.08 else r for r in TITAN_405B], ids=[r[0] for r in TITAN_405B])
def test_torchtitan_published_llama31_405b_reserved_memory(table, dp, cp, seq, vpp, b, measured):
    reserved = titan_405b_reserved_gib(dp, cp, seq, vpp, b)
    assert reserved == pytest.approx(measured, rel=0.08), f"{table}: memform {reserved:.1f} GiB"


def test_torchtitan_405b_interleaved_holds_less_than_1f1b_as_measured():
    # Table 5: interleaved 1F1B 9.8 GiB below 1F1B (82.5 -> 72.7). torch's ScheduleInterleaved1F1B with m = p = 8
    # runs all of a chunk's backwards before the next chunk's, so each chunk's unsharded fp32 gradient
    # accumulators live only through its own backwards (one chunk's of a rank's 15-16 layers at the peak,
    # 11.9 GiB less), while its fwd_cache keeps every chunk's outputs (+1 GiB) and each of its 2 chunks 8 receive
    # buffers for its output's gradient where 1F1B's stage 0 has 8 (+1 GiB): memform 9.2 GiB below
    (_, dp, cp, seq, _, b, one), (_, _, _, _, vpp, _, inter) = TITAN_405B[0], TITAN_405B[1]
    gap = titan_405b_reserved_gib(dp, cp, seq, 1, b) - titan_405b_reserved_gib(dp, cp, seq, vpp, b)
    assert gap == pytest.approx(one - inter, rel=0.10), f"memform {gap:.1f} GiB below"


def test_bloom_launch_script_imports_as_the_config():
    # BigScience's own Megatron-DeepSpeed launch script (bigscience-workshop/bigscience 003b250,
    # tests/data/importers/megatron/bigscience_tr11-176B-ml.slurm, verbatim): the command srun runs through
    # `bash -c`, Megatron-DeepSpeed's --checkpoint-activations, --pad-vocab-size-to, --pp-partition-method
    # 'type:transformer|embedding', --embed-layernorm and --deepspeed --zero-stage 0 under bf16 with pipeline
    # parallelism (DeepSpeed's BF16_Optimizer) give the job configs/published/bloom-176b.yaml writes by hand
    from memform.importers import Options, import_config
    script = ROOT / "tests" / "data" / "importers" / "megatron" / "bigscience_tr11-176B-ml.slurm"
    draft = import_config("megatron", script, Options(devices=384))
    expected = {"parallel.tp": 4, "parallel.pp": 12, "parallel.dp": 8, "parallel.zero": 1,
                "parallel.stage_layers": [5] + [6] * 10 + [5], "training.framework": "deepspeed",
                "training.precision.grads": "fp32", "training.recompute": "full", "training.micro_batch_size": 2,
                "model.vocab_size": 250880, "model.embedding_norm": True, "model.flash_attention": False}
    assert {k: draft.get(k) for k in expected} == expected
    imported = numbers(draft.config(), {"device.capacity_gib": 80})
    bundled = numbers(CONFIGS / "published" / "bloom-176b.yaml")
    assert [st.peak_bytes for st in imported.stages] == [st.peak_bytes for st in bundled.stages]
