"""``memform import megatron`` on real public launch scripts, kept verbatim (issue 31).

Each fixture under tests/data/importers/megatron/ named ``megatron-lm_*``, ``mindspeed-llm_*`` or
``pai-megatron-patch_*`` is a file of NVIDIA/Megatron-LM, Ascend/MindSpeed-LLM or
alibaba/Pai-Megatron-Patch at the commit the folder's README.md names. Every one either imports
right -- the model's parameter total within a tolerance of its published one, the source cited in
its row -- or is refused with the reason its row names. Then the mechanisms behind them, one per
table: the bash those scripts use, Megatron-FSDP's sharding strategies, MindSpeed-LLM's model
arguments, the vocabulary, and the arguments memform does not read (neutral, refused, or unknown).
"""

from __future__ import annotations

import shlex

import shutil
import subprocess
from pathlib import Path

import pytest
from cli_helpers import ROOT, run_memform
from cli_inprocess import memform_in_process  # memform.cli.main in this process (same output)

import memform
from memform.errors import MemformError
from memform.importers import Options, import_config, megatron
from memform.importers.draft import Draft
from memform.importers.shell import Shell, arithmetic

DATA = ROOT / "tests" / "data" / "importers" / "megatron"

#: Pai-Megatron-Patch examples/qwen2_5/README.md's pre-training call of run_mcore_qwen.sh (its 25
#: positional arguments), with MODEL_SIZE 7B, sequence length 4096 and TP 1 (TP 2 adds --tp-comm-overlap)
PAI_QWEN25_7B = ("dsw 7B 1 8 1e-5 1e-6 4096 4096 bf16 1 1 1 true true true false sel false 100000 "
                 "/mnt/data /mnt/data /mnt/ckpt 10000 100 /workspace/output")


def imported(name: str, **options) -> Draft:
    return import_config("megatron", DATA / name, Options(**options))


def total_params(draft: Draft) -> int:
    """The model's parameter count: the imported config on one device (no tp, pp, ep or cp sharding)."""
    config = draft.config()
    config["parallel"] = {"tp": 1, "pp": 1, "dp": 1, "distributed_optimizer": True}
    return sum(stage.param_count for stage in memform.estimate(config).stages)


# ---- fixtures that import: (file, options, keys the import sets, published total, its source) ----------------
IMPORTS = [
    ("megatron-lm_train_gpt3_175b_distributed.sh", {"devices": 128},
     # no --tokenizer-type, a vocab and a merge file: GPT-2 BPE, 50257 padded to 128 × tp 8
     {"model.num_layers": 96, "model.hidden_size": 12288, "model.vocab_size": 51200, "parallel.tp": 8,
      "parallel.pp": 16, "parallel.dp": 1},
     175e9, "GPT-3 175B: Brown et al. 2020, Table 2.1"),
    ("megatron-lm_train_llama3_8b_h100_fp8.sh", {},
     {"model.num_kv_heads": 8, "megatron.fp8": "hybrid", "model.vocab_size": 128384, "parallel.devices": 8},
     8.03e9, "Llama 3 8B: Meta-Llama-3-8B model card, 8.03B parameters"),
    ("megatron-lm_train_mixtral_8x7b_distributed.sh", {"overrides": {"model.vocab_size": 32000}, "devices": 64},
     {"model.num_experts": 8, "model.moe_top_k": 2, "parallel.ep": 8, "parallel.pp": 4,
      "megatron.moe_token_dispatcher_type": "alltoall"},
     46.7e9, "Mixtral 8x7B: Jiang et al. 2024 (arXiv:2401.04088), 47B parameters; 46.7B on its model card"),
    ("mindspeed-llm_pretrain_deepseek2_lite_16b_ptd_8p.sh", {},
     # --n-shared-experts 2, --first-k-dense-replace 1 (were dropped before issue 31), MindSpeed's flash attention
     {"model.num_shared_experts": 2, "model.first_k_dense": 1, "model.num_experts": 64, "model.attention": "mla",
      "model.flash_attention": True, "megatron.precision_aware_optimizer": True, "model.qk_norm": None},
     15.7e9, "DeepSeek-V2-Lite: DeepSeek-AI 2024 (arXiv:2405.04434), 15.7B total parameters"),
    ("mindspeed-llm_pretrain_qwen3_8b_4K_ptd.sh", {},
     {"model.qk_norm": True, "model.vocab_size": 151936, "parallel.tp": 1},
     8.2e9, "Qwen3-8B: Qwen3 model card, 8.2B parameters"),
    ("mindspeed-llm_pretrain_llama2_13b_ptd.sh", {"overrides": {"model.vocab_size": 32000}},
     {"model.num_layers": 40, "model.vocab_size": 32000, "parallel.tp": 8},
     13.0e9, "Llama 2 13B: Touvron et al. 2023, Table 1"),
    ("mindspeed-llm_pretrain_qwen25_72b_32k_ptd.sh", {},
     # --num-layer-list 17,20,22,21 and --context-parallel-algo megatron_cp_algo
     {"parallel.stage_layers": [17, 20, 22, 21], "parallel.cp": 4, "parallel.cp_algo": "ring",
      "parallel.devices": 128},
     72.7e9, "Qwen2.5-72B: Qwen2.5 model card, 72.7B parameters"),
    ("mindspeed-llm_pretrain_qwen3_30b_a3b_4K_ptd.sh", {},
     # --moe-layer-freq -1 --first-k-dense-replace -1: every layer MoE (i % -1 == 0 and i >= -1 for every i)
     {"model.num_experts": 128, "model.moe_layer_freq": None, "model.first_k_dense": None, "parallel.ep": 8},
     30.5e9, "Qwen3-30B-A3B: Qwen3 model card, 30.5B parameters"),
    ("mindspeed-llm_pretrain_qwen3_235b_a22b_4k_A3_ptd.sh", {},
     # --noop-layers 94,95 over --num-layers 96: the model's 94 layers, the last stage two short
     {"model.num_layers": 94, "parallel.vpp": 3, "parallel.stage_layers": [24, 24, 24, 22]},
     235e9, "Qwen3-235B-A22B: Qwen3 model card, 235B parameters"),
    ("pai-megatron-patch_qwen2_5_run_mcore_qwen.sh",
     {"script_args": tuple(PAI_QWEN25_7B.split()), "overrides": {"model.vocab_size": 152064}, "devices": 8},
     {"model.num_layers": 28, "model.hidden_size": 3584, "model.qkv_bias": True, "training.recompute": "selective",
      "parallel.distributed_optimizer": True, "parallel.dp": 8},
     7.61e9, "Qwen2.5-7B: Qwen2.5 model card, 7.61B parameters"),
]


@pytest.mark.parametrize("name, options, keys, published, source", IMPORTS, ids=[r[0] for r in IMPORTS])
def test_real_script_imports_right(name: str, options: dict, keys: dict, published: float, source: str) -> None:
    draft = imported(name, **options)
    assert draft.load_error is None, draft.load_error
    assert {k: draft.get(k) for k in keys} == keys
    assert total_params(draft) == pytest.approx(published, rel=0.01), source


# ---- fixtures that are refused: (file, options, what the message says) ---------------------------------------
REFUSALS = [
    # Megatron-FSDP with fp8: the sharding is read (ZeRO-3), but megatron-core.mf does not model fp8 under it
    ("megatron-lm_train_llama3_8b_fsdp_h100_fp8.sh", {}, ["megatron.fp8 with parallel.zero 3"]),
    # its argument loop (while ... case $1 in ... esac) now parses; sliding-window attention is refused
    ("megatron-lm_gptoss_02_train.sh", {}, ["field '--window-size' is 127,0", "sliding-window attention"]),
    ("megatron-lm_train_bert_340m_distributed.sh", {}, [":73: runs pretrain_bert.py", "GPT-style decoders"]),
    ("megatron-lm_sbatch_mfsdp_deepseek_v3.sh", {"overrides": {"model.vocab_size": 129280}},
     ["'--moe-flex-dispatcher-backend' is hybridep", "HybridEP buffers"]),
    # Pai's TP > 1 turns on --tp-comm-overlap (TE userbuffers)
    ("pai-megatron-patch_qwen2_5_run_mcore_qwen.sh",
     {"script_args": tuple(PAI_QWEN25_7B.replace(" bf16 1 1 1 ", " bf16 2 1 1 ").split()),
      "overrides": {"model.vocab_size": 152064}}, ["'--tp-comm-overlap' is set", "userbuffers"]),
    # without its arguments, the Pai script's model size is unknown: the message names the variable
    ("pai-megatron-patch_qwen2_5_run_mcore_qwen.sh", {}, ["--num-layers is ${NUM_LAYERS}", "$NUM_LAYERS"]),
    ("pai-megatron-patch_qwen2_5_run_mcore_qwen.sh", {"script_args": tuple(PAI_QWEN25_7B.split())},
     ["--extra-vocab-size 421", "--set model.vocab_size=N"]),
]


@pytest.mark.parametrize("name, options, needles", REFUSALS, ids=[f"{r[0]}-{i}" for i, r in enumerate(REFUSALS)])
def test_real_script_is_refused_with_its_reason(name: str, options: dict, needles: list[str]) -> None:
    with pytest.raises(MemformError) as err:
        draft = imported(name, **options)
        if draft.load_error:
            raise MemformError(draft.load_error)
    assert all(n in str(err.value) for n in needles), str(err.value)


def test_megatron_fsdp_example_is_sharded() -> None:
    """The sharding the issue found dropped: ZeRO-3 from --data-parallel-sharding-strategy optim_grads_params."""
    draft = imported("megatron-lm_train_llama3_8b_fsdp_h100_fp8.sh", overrides={"megatron.fp8": "none"})
    assert draft.load_error is None and draft.get("parallel.zero") == 3
    plain = imported("megatron-lm_train_llama3_8b_fsdp_h100_fp8.sh",
                     overrides={"megatron.fp8": "none", "parallel.zero": 0})
    sharded, unsharded = memform.estimate(draft.config()), memform.estimate(plain.config())
    assert sharded.peak_bytes < unsharded.peak_bytes


def test_cli_args_reach_the_script() -> None:
    path = DATA / "pai-megatron-patch_qwen2_5_run_mcore_qwen.sh"
    r = run_memform("import", "megatron", path, "--args", PAI_QWEN25_7B, "--set", "model.vocab_size=152064",
                    "--devices", "8")
    assert r.returncode == 0, r.stderr
    assert "num_layers: 28" in r.stdout and "Traceback" not in r.stderr
    r = run_memform("import", "hf", path, "--args", "a b")
    assert r.returncode == 2 and "--args is read by 'memform import megatron' only" in r.stderr


def test_cli_script_arguments_after_a_double_dash() -> None:
    # as a shell passes them to the script: `memform import megatron run.sh ... -- dsw 7B 1 8 ...`
    path = DATA / "pai-megatron-patch_qwen2_5_run_mcore_qwen.sh"
    via_args = run_memform("import", "megatron", path, "--args", PAI_QWEN25_7B, "--set",
                           "model.vocab_size=152064", "--devices", "8")
    r = run_memform("import", "megatron", path, "--set", "model.vocab_size=152064", "--devices", "8",
                    "--", *shlex.split(PAI_QWEN25_7B))
    assert r.returncode == 0, r.stderr
    assert r.stdout == via_args.stdout
    r = run_memform("import", "megatron", path, "--args", "a", "--", "b")
    assert r.returncode == 2 and "given twice" in r.stderr


# ---- bash the real scripts use (expected words: what bash passes) --------------------------------------------
def last(text: str, args: list[str] | None = None) -> list[str]:
    script = Shell(args).run(Path("t.sh"), text)
    return [w.text if w.known else "?" + w.text for w in script.commands[-1].words]


BASH = [
    # Pai-Megatron-Patch run_mcore_*.sh line 4
    ("nested substitution in quotes", 'D="$( cd "$( dirname "$0" )" && pwd )"\ncmd "$D" x', None,
     ["cmd", '?$( cd "$( dirname "$0" )" && pwd )', "x"]),
    ("argument loop, no arguments", 'T=1\nwhile [[ $# -gt 0 ]]; do\n case $1 in\n  --tp) T="$2"; shift 2;;\n'
     '  *) shift;;\n esac\ndone\ncmd $T', None, ["cmd", "1"]),
    ("argument loop over --args", 'T=1\nwhile [[ $# -gt 0 ]]; do\n case $1 in\n  --tp) T="$2"; shift 2;;\n'
     '  -h|--help) exit 0;;\n  *) shift;;\n esac\ndone\ncmd $T', ["--x", "--tp", "4"], ["cmd", "4"]),
    ("case glob and alternatives", 'case $1 in\n a*|b) X=1;;\n *) X=2;;\nesac\ncmd $X', ["abc"], ["cmd", "1"]),
    ("case default arm", 'case "$1" in a) X=1 ;; *) X=2 ;; esac\ncmd $X', ["z"], ["cmd", "2"]),
    ("positional arguments", 'A=$1\nB=${2:-d}\nC=${10}\ncmd $A $B "$C" $# "$@"', ["x"],
     ["cmd", "x", "d", "", "1", "x"]),
    ("shift", 'shift\ncmd $1 $#', ["a", "b"], ["cmd", "b", "1"]),
    # bashlex nests a third `elif` with shifted positions (Pai's MODEL_SIZE chains have seven)
    ("long elif chain", 'X=0\nM=$1\nif [ $M = a ]; then X=1\nelif [ $M = b ]; then X=2\nelif [ $M = c ]; then X=3\n'
     'elif [ $M = d ]; then X="4 $M"\nfi\ncmd "$X"', ["d"], ["cmd", "4 d"]),
    # Pai-Megatron-Patch: run_cmd="torchrun ... ${moe_options} ${offload_option}"; eval ${run_cmd} -- the value is
    # read as bash again (its quotes count); an unset variable stays unknown (bash: nothing)
    ("eval of a command string", 'O="--a 1"\nR="cmd --x \'([1]*2)\' ${O} ${U}"\neval ${R}', None,
     ["cmd", "--x", "([1]*2)", "--a", "1", "?${U}"]),
    ("arithmetic ternary (Pai: TP_COMM_OVERLAP)", 'TP=2\ncmd $(( ($TP > 1) ? 1 : 0 )) $((TP == 1 ? 5 : 6))', None,
     ["cmd", "1", "6"]),
]


@pytest.mark.parametrize("text, args, expected", [r[1:] for r in BASH], ids=[r[0] for r in BASH])
def test_bash_of_real_scripts(text: str, args: list[str] | None, expected: list[str]) -> None:
    assert last(text, args) == expected


@pytest.mark.parametrize("expr, value", [("(2 > 1) ? 1 : 0", 1), ("1 ? 2 ? 3 : 4 : 5", 3), ("0 ? 2 : 1 ? 7 : 8", 7),
                                         ("3 && 0", 0), ("!0", 1), ("2*(1?3:4)", 6), ("1 != 2", 1)])
def test_arithmetic_as_bash(expr: str, value: int) -> None:
    # the values bash prints for $(( expr ))
    assert arithmetic(expr) == value


# ---- arguments on a minimal model ---------------------------------------------------------------------------
BASE = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --vocab-size 1024 "
        "--micro-batch-size 1 ")
MOE = BASE + "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 128 "


def args_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.args"
    path.write_text(text, encoding="utf-8")
    return path


def draft_of(tmp_path: Path, text: str, **options) -> Draft:
    return import_config("megatron", args_file(tmp_path, text), Options(**options))


MAPPED = [
    # Megatron-FSDP strategies (arguments.py --data-parallel-sharding-strategy; default optim_grads_params)
    ("--use-megatron-fsdp", {"parallel.zero": 3}),
    ("--use-megatron-fsdp --data-parallel-sharding-strategy no_shard", {"parallel.zero": 0}),
    ("--use-megatron-fsdp --data-parallel-sharding-strategy optim", {"parallel.zero": 1}),
    ("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads", {"parallel.zero": 2}),
    ("--use-custom-fsdp --data-parallel-sharding-strategy optim_grads_params", {"parallel.zero": 3}),
    ("--use-torch-fsdp2", {"parallel.zero": 3}),
    # MindSpeed-LLM moe_layer.py / transformer_block.py; with --moe-layer-freq 2: MoE at even i >= k
    ("--n-shared-experts 2 --first-k-dense-replace 1 --moe-layer-freq 2",
     {"model.num_shared_experts": 2, "model.first_k_dense": 1, "model.moe_layer_freq": 2}),
    ("--shared-expert-gate --n-shared-experts 1", {"model.shared_expert_gate": True, "model.num_shared_experts": 1}),
    ("--pipeline-model-parallel-size 2 --num-layer-list 1,3", {"parallel.stage_layers": [1, 3]}),
    # MindSpeed-LLM --noop-layers: the last layers are identities (transformer_block.py NoopTransformerLayer)
    ("--pipeline-model-parallel-size 2 --noop-layers 3", {"model.num_layers": 3, "parallel.stage_layers": [2, 1]}),
    ("--moe-layer-freq -1 --first-k-dense-replace -1", {"model.moe_layer_freq": None, "model.first_k_dense": None}),
    ("--context-parallel-size 2 --context-parallel-algo ulysses_cp_algo", {"parallel.cp_algo": "ulysses"}),
    ("--bf16 --use-distributed-optimizer --reuse-fp32-param",
     {"megatron.precision_aware_optimizer": True, "megatron.store_param_remainders": True}),
    # memory-neutral values of refused switches
    ("--cpu-offloading false --cuda-graph-impl none --num-distributed-optimizer-instances 1", {"parallel.zero": None}),
]


@pytest.mark.parametrize("extra, expected", MAPPED, ids=[r[0] for r in MAPPED])
def test_arguments_map_onto_config_keys(tmp_path: Path, extra: str, expected: dict) -> None:
    draft = draft_of(tmp_path, MOE + extra)
    assert draft.load_error is None, draft.load_error
    assert {k: draft.get(k) for k in expected} == expected


def test_reuse_fp32_param_saves_two_bytes_per_master(tmp_path: Path) -> None:
    # MindSpeed reuse_fp32_param.py: fp32 master = bf16 parameter (high half) + 16-bit remainder, so the
    # sharded master costs 2 bytes instead of 4 per parameter
    base = BASE + "--bf16 --use-distributed-optimizer "
    reuse = memform.estimate(draft_of(tmp_path, base + "--reuse-fp32-param").config())
    plain = memform.estimate(draft_of(tmp_path, base).config())
    params = plain.stages[0].param_count
    assert plain.peak_bytes - reuse.peak_bytes == pytest.approx(2 * params, rel=0.02)


REFUSED = [
    ("--tp-comm-overlap", "'--tp-comm-overlap' is set: allocates Transformer Engine's userbuffers"),
    ("--fine-grained-activation-offloading --offload-modules expert_fc1 --recompute-granularity selective "
     "--recompute-modules moe", "recomputing the entire MoE layer"),
    ("--cpu-offloading --cpu-offloading-num-layers 2 --cpu-offloading-double-buffering",
     "keeps two persistent device buffers"),
    ("--num-distributed-optimizer-instances 2", "is 2: shards the optimizer within dp / N ranks"),
    ("--cuda-graph-impl local", "'--cuda-graph-impl' is local: CUDA graphs"),
    ("--noop-layers 0", "no-op layers other than the last ones"),
    ("--use-megatron-fsdp --data-parallel-sharding-strategy half", "must be one of no_shard"),
    ("--num-layer-list 1,3", "must give one layer count per pipeline stage (1)"),
    ("--context-parallel-size 2 --context-parallel-algo hybrid_cp_algo", "hybrid_cp_algo is not modelled"),
    ("--reuse-fp32-param", "needs --bf16 and --use-distributed-optimizer"),
    ("--no-position-embedding", "is refused by Megatron-LM"),
]


@pytest.mark.parametrize("extra, needle", REFUSED, ids=[r[0] for r in REFUSED])
def test_memory_changing_arguments_are_refused(tmp_path: Path, extra: str, needle: str) -> None:
    path = args_file(tmp_path, MOE + extra)
    with pytest.raises(MemformError) as err:
        import_config("megatron", path, Options())
    assert needle in str(err.value) and str(path) in str(err.value)
    r = memform_in_process("import", "megatron", path)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_neutral_arguments_pass_silently(tmp_path: Path) -> None:
    neutral = ("--lr 3e-4 --min-lr 3e-5 --seed 7 --save /c --load /c --no-load-optim --log-interval 1 "
               "--tensorboard-dir /t --wandb-project p --data-path 1.0 /d --split 99,1,0 --train-iters 10 "
               "--eval-iters 1 --clip-grad 1.0 --adam-beta2 0.95 --init-method-std 0.02 --distributed-backend nccl "
               "--use-fused-rmsnorm --tokenizer-name-or-path /tok --handler-name GeneralPretrainHandler "
               "--use-mcore-models --ckpt-format torch_dist --step-batch-size-schedule 0:16")
    draft = draft_of(tmp_path, BASE + neutral)
    assert draft.load_error is None and draft.warnings == []
    for name in neutral.split():
        if name.startswith("--"):
            key = name[2:]
            assert key in megatron.NEUTRAL or key.startswith(megatron.NEUTRAL_PREFIXES) or key in (
                "data-path",), key


def test_unknown_arguments_need_accept(tmp_path: Path) -> None:
    path = args_file(tmp_path, BASE + "--my-flag 3 --other-flag")
    with pytest.raises(MemformError) as err:
        import_config("megatron", path, Options())
    assert "'--my-flag', '--other-flag'" in str(err.value) and "--accept my-flag,other-flag" in str(err.value)
    draft = import_config("megatron", path, Options(accept=("my-flag", "--other-flag")))
    assert draft.load_error is None
    assert sum("taken as memory-neutral (--accept)" in w for w in draft.warnings) == 2


def test_an_unknown_value_of_a_neutral_argument_is_no_matter(tmp_path: Path) -> None:
    path = tmp_path / "t.sh"
    path.write_text(f"torchrun --nproc_per_node 2 pretrain_gpt.py {BASE} --save $CKPT --data-path $DATA "
                    "--my-flag $X\n", encoding="utf-8")
    with pytest.raises(MemformError, match="'--my-flag'"):
        import_config("megatron", path, Options())
    draft = import_config("megatron", path, Options(accept=("my-flag",)))
    assert not [w for w in draft.warnings if "$CKPT" in w or "$DATA" in w]


# ---- vocabulary ------------------------------------------------------------------------------------------------
VOCAB = [
    # GPT2BPETokenizer: 50257 (openai-community/gpt2 config.json vocab_size) padded to 128 × tp
    ("--vocab-file v.json --merge-file m.txt", {}, 50304),
    ("--vocab-file v.json --merge-file m.txt --tensor-model-parallel-size 8", {}, 51200),
    ("--tokenizer-type GPT2BPETokenizer --vocab-file v.json --merge-file m.txt", {}, 50304),
    # --set model.vocab_size is the tokenizer's size, padded as Megatron pads it (vocab_utils.py)
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model x --tensor-model-parallel-size 8",
     {"model.vocab_size": 50257}, 51200),
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model x --make-vocab-size-divisible-by 1",
     {"model.vocab_size": 50257}, 50257),
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model x", {"model.vocab_size": 50257, "parallel.tp": 2}, 50432),
]


@pytest.mark.parametrize("extra, overrides, vocab", VOCAB, ids=[f"{r[0]} {r[1]}" for r in VOCAB])
def test_vocabulary_is_padded_as_megatron_pads_it(tmp_path: Path, extra: str, overrides: dict, vocab: int) -> None:
    text = BASE.replace("--vocab-size 1024 ", "") + extra
    draft = draft_of(tmp_path, text, overrides=overrides)
    assert draft.get("model.vocab_size") == vocab
    assert draft.load_error is None, draft.load_error


def test_an_unknown_value_of_a_refused_argument_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.sh"
    path.write_text(f"torchrun --nproc_per_node 2 pretrain_gpt.py {BASE} --cpu-offloading-double-buffering $N\n",
                    encoding="utf-8")
    with pytest.raises(MemformError) as err:
        import_config("megatron", path, Options())
    assert f"{path}:1: field '--cpu-offloading-double-buffering' is $N" in str(err.value)
    assert "cannot tell whether it is one of its neutral values, false" in str(err.value)


def test_an_unset_option_bundle_is_not_a_second_value(tmp_path: Path) -> None:
    """``--moe-layer-freq '([1]*4)' ${offload_option}`` (Pai-Megatron-Patch's run_mcore_qwen3.sh): the unset
    variable after a complete value is a bundle of options the script did not set, not part of the value."""
    path = tmp_path / "t.sh"
    path.write_text(f"run_cmd=\"torchrun pretrain_gpt.py {MOE} --moe-layer-freq '([1]*4)' ${{offload_option}}\"\n"
                    "eval ${run_cmd}\n", encoding="utf-8")
    draft = import_config("megatron", path, Options())
    assert draft.load_error is None and draft.get("model.moe_layer_freq") is None
    assert any("${offload_option} is not known" in w for w in draft.warnings)


KNOWN_BASH = [r for r in BASH if not any(w.startswith("?") for w in r[3])]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash to compare with")
@pytest.mark.parametrize("text, args, expected", [r[1:] for r in KNOWN_BASH], ids=[r[0] for r in KNOWN_BASH])
def test_bash_rows_agree_with_bash(text: str, args: list[str] | None, expected: list[str]) -> None:
    """The rows' own snippets run by bash in an empty environment, with the row's arguments."""
    program = 'cmd() { printf "<%s>" cmd "$@"; }\n' + text
    out = subprocess.run(["env", "-i", shutil.which("bash"), "-c", program, "bash", *(args or [])],
                         capture_output=True, text=True, timeout=30).stdout
    assert out[1:-1].split("><") == expected


@pytest.mark.parametrize("flags, dispatcher, padded", [
    # Megatron-Core transformer_config.py: moe_token_dispatcher_type alltoall | allgather | flex;
    # alltoall_seq (megatron-core <= 0.12, MindSpeed) has the alltoall preprocess
    ("--moe-token-dispatcher-type allgather", "allgather", False),
    ("--moe-token-dispatcher-type alltoall_seq", "alltoall", False),
    ("--moe-token-dispatcher-type flex --moe-pad-expert-input-to-capacity --moe-expert-capacity-factor 1.0",
     "flex", True),
])
def test_dispatcher_flags_reach_the_step_time_keys(tmp_path, flags, dispatcher, padded):
    # frameworks/megatron/moe.mf reads both (the dispatcher's per-layer host synchronisation, time.mf
    # cost host); the import must not warn that no bundled file reads them
    args = tmp_path / "args.txt"
    args.write_text("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 "
                    "--max-position-embeddings 512 --micro-batch-size 1 --global-batch-size 8 --swiglu --bf16 "
                    "--vocab-size 1024 --num-experts 4 --moe-router-topk 2 --expert-model-parallel-size 2 "
                    f"--moe-grouped-gemm {flags}\n")
    out = tmp_path / "out.yaml"
    r = run_memform("import", "megatron", str(args), "--devices", "2", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "no bundled formula file reads" not in r.stderr
    text = out.read_text()
    assert f"moe_token_dispatcher_type: {dispatcher}" in text
    assert ("moe_pad_expert_input_to_capacity: true" in text) == padded
    assert run_memform("estimate", str(out)).returncode == 0
