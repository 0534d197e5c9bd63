"""``memform import megatron`` on real launch-script shapes: bash arrays, variables, defaults, arithmetic.

The shell expansion (``memform.importers.shell``) is checked construct by construct against what
bash itself prints for the same text (the expected words are bash's, e.g. ``$((-7/2))`` is -3 in
bash, not Python's -4). The fixtures under tests/data/importers/megatron/ are written in the shape
of NVIDIA Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh,
examples/mixtral/train_mixtral_8x7b_distributed.sh and examples/llama/train_llama3_8b_h100_fp8.sh;
each expected value cites the paper or Megatron-LM source it comes from.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from cli_helpers import ROOT, run_memform

import memform
from memform.errors import MemformError
from memform.importers import Options, import_config, megatron, takes_several_files
from memform.importers.draft import Draft
from memform.importers.shell import Shell, arithmetic, list_expression, run_script

DATA = ROOT / "tests" / "data" / "importers" / "megatron"
GPT3 = DATA / "gpt3-175b_distributed.sh"
MIXTRAL = DATA / "mixtral-8x7b_distributed.sh"
LLAMA3 = DATA / "llama3-8b_h100_fp8.sh"
DSV3 = DATA / "deepseek-v3_mla_moe.sh"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def last_words(text: str) -> list[str]:
    """The words of the script's last command, as bash would pass them ('?' + source when unknown)."""
    script = run_script(Path("t.sh"), text)
    return [w.text if w.known else "?" + w.text for w in script.commands[-1].words]


def imported(source, **options) -> Draft:
    return import_config("megatron", source, Options(**options))


# ---- the shell expansion, one construct per row ------------------------------------------------

# expected = what bash passes to `cmd` (test_shell_expansion_agrees_with_bash runs bash on every row whose
# words are all known); "?" marks a word memform leaves unknown where bash would read the environment
SHELL_CASES = [
    ("scalar and braces", "A=1\ncmd $A ${A}x", ["cmd", "1", "1x"]),
    ("double quotes keep, single quotes stop expansion", "A='a b'\ncmd $A \"$A\" '$A'",
     ["cmd", "a", "b", "a b", "$A"]),
    ("escapes and mixed quoting", 'cmd a\\ b "x\\"y" p"q r"s', ["cmd", "a b", 'x"y', "pq rs"]),
    ("line continuation", "cmd a \\\n    b", ["cmd", "a", "b"]),
    ("comments", "cmd a # b c\n", ["cmd", "a"]),
    (":- and - defaults", "E=\ncmd ${U:-5} ${U-6} ${E:-7} ${E-8}", ["cmd", "5", "6", "7"]),
    (":= assigns", "cmd ${U:=3} $U", ["cmd", "3", "3"]),
    (":+ alternate", "A=1\ncmd ${A:+yes} ${U:+no}", ["cmd", "yes"]),
    ("quoted default", 'cmd ${U:-"a b"}', ["cmd", "a b"]),
    ("positional with default", "P=${1:-ckpt}\ncmd $P", ["cmd", "ckpt"]),
    ("array, quoted expansion", 'A=(\n  --a 1  # note (x/y)\n  --b "x y"\n)\ncmd "${A[@]}"',
     ["cmd", "--a", "1", "--b", "x y"]),
    ("array, unquoted expansion splits", 'A=( --b "x y" )\ncmd ${A[@]}', ["cmd", "--b", "x", "y"]),
    ("array +=, count, index", 'A=(1)\nA+=( 2 "3 4" )\ncmd "${A[@]}" ${#A[@]} ${A[1]} $A',
     ["cmd", "1", "2", "3 4", "3", "2", "1"]),
    ("array appended with another", 'B=( --x --y )\nA=()\nA+=("${B[@]}")\ncmd ${A[@]}', ["cmd", "--x", "--y"]),
    ("empty array", 'A=()\ncmd "${A[@]}" end', ["cmd", "end"]),
    ("element holding option and value", 'A=( "--fp8-format hybrid" )\ncmd ${A[@]} "${A[@]}"',
     ["cmd", "--fp8-format", "hybrid", "--fp8-format hybrid"]),
    ("scalar +=", "A=ab\nA+=cd\ncmd $A", ["cmd", "abcd"]),
    ("string length", "S=hello\ncmd ${#S}", ["cmd", "5"]),
    ("arithmetic", "G=8\nN=2\ncmd $(($G*$N)) $((G*N+1)) $(( (G+N)/3 )) $((7%3)) $((-7/2))",
     ["cmd", "16", "17", "3", "1", "-3"]),
    # bash reads an unset name as 0; memform keeps it unknown (the environment may set it)
    ("arithmetic on an unset name", "cmd $((U+1))", ["cmd", "?$((U+1))"]),
    ("arithmetic inside a string", 'L=61\nK=3\nF="([0]*${K}+[1]*$((L - K)))"\ncmd "$F"',
     ["cmd", "([0]*3+[1]*58)"]),
    ("export and declare", "export X=5 Y\ndeclare -a D=(1 2)\ncmd $X ${D[1]}", ["cmd", "5", "2"]),
    ("if / elif / else", 'M=b\nif [ "$M" == a ]; then X=1\nelif [[ $M == b ]]; then X=2\nelse X=3\nfi\ncmd $X',
     ["cmd", "2"]),
    ("[[ ]] || [[ ]] and -z", 'T=MOCK\nif [[ "$T" == x ]] || [[ -z "$T" ]]; then X=1; else X=2; fi\ncmd $X',
     ["cmd", "2"]),
    ("&& after a test", '[ -z "$U" ] && U=9\n[ -n "$V" ] && V=9\ncmd $U ${V:-none}', ["cmd", "9", "none"]),
    ("integer tests", 'N=4\nif [ "$N" -gt 2 -a "$N" -le 4 ]; then X=yes; fi\ncmd $X', ["cmd", "yes"]),
    ("for loop", "for n in 1 2 3; do L+=( $n ); done\ncmd \"${L[@]}\"", ["cmd", "1", "2", "3"]),
    ("function call", "f() { X=7; }\nf\ncmd $X", ["cmd", "7"]),
    ("unset", "A=1\nunset A\ncmd ${A:-gone}", ["cmd", "gone"]),
    ("positional without default is unknown", "P=$1\ncmd --save $P", ["cmd", "--save", "?$1"]),
    ("environment variable is unknown", 'cmd "$HOME_DIR/x"', ["cmd", "?$HOME_DIR/x"]),
    ("command substitution is never run", "D=$(date)\ncmd $D `hostname`", ["cmd", "?$(date)", "?`hostname`"]),
    ("the script's own arguments are empty", 'cmd a "$@"', ["cmd", "a"]),
]


@pytest.mark.parametrize("text, expected", [c[1:] for c in SHELL_CASES], ids=[c[0] for c in SHELL_CASES])
def test_shell_expansion(text: str, expected: list[str]) -> None:
    assert last_words(text) == expected


KNOWN_CASES = [c for c in SHELL_CASES if not any(w.startswith("?") for w in c[2])]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash to compare with")
@pytest.mark.parametrize("text, expected", [c[1:] for c in KNOWN_CASES], ids=[c[0] for c in KNOWN_CASES])
def test_shell_expansion_agrees_with_bash(text: str, expected: list[str]) -> None:
    """The same text run by bash itself, in an empty environment with no arguments (these snippets
    are the table's own; no launch script is ever run)."""
    program = 'cmd() { printf "<%s>" cmd "$@"; }\n' + text
    out = subprocess.run(["env", "-i", shutil.which("bash"), "-c", program, "bash"], capture_output=True,
                         text=True, timeout=30).stdout
    assert out[1:-1].split("><") == expected


def test_unknown_words_name_their_variable_and_line() -> None:
    script = run_script(Path("t.sh"), "A=1\n\nARGS=(\n  --num-layers $NUM_LAYERS\n)\ncmd ${ARGS[@]} $1")
    words = script.commands[-1].words
    assert [(r.name, r.kind, r.line) for w in words for r in w.refs] == \
        [("NUM_LAYERS", "environment", 4), ("1", "positional", 6)]


def test_if_on_an_environment_variable_warns_and_takes_it_unset() -> None:
    script = run_script(Path("t.sh"), 'A=()\nif [ -n "${WANDB_API_KEY}" ]; then\n  A+=( --wandb )\nfi\ncmd "${A[@]}"')
    assert [w.text for w in script.commands[-1].words] == ["cmd"]
    assert len(script.warnings) == 1 and "t.sh:2" in script.warnings[0] and "$WANDB_API_KEY" in script.warnings[0]


def test_if_without_assignments_is_not_evaluated() -> None:
    # `[ ! -f x ]; then echo; exit` (Megatron-LM's llama example) changes nothing memform reads: no warning
    script = run_script(Path("t.sh"), 'if [ ! -f "$P" ]; then\n  echo missing\n  exit 1\nfi\ncmd a')
    assert script.warnings == [] and [w.text for w in script.commands[-1].words] == ["cmd", "a"]


def test_variables_carry_over_between_files() -> None:
    shell = Shell()
    shell.run(Path("vars.sh"), "NUM_LAYERS=32\n")
    script = shell.run(Path("train.sh"), "cmd --num-layers ${NUM_LAYERS:-2}")
    assert [w.text for w in script.commands[-1].words] == ["cmd", "--num-layers", "32"]


# bash $(( )): / truncates toward zero, % keeps the dividend's sign, ** is a power (bash manual,
# "Shell Arithmetic"); // is accepted as floor division
@pytest.mark.parametrize("expr, value", [
    ("1+2*3", 7), ("(1+2)*3", 9), ("7/2", 3), ("-7/2", -3), ("7%3", 1), ("-7%3", -1), ("2**10", 1024),
    ("10//4", 2), (" 8 * 64 ", 512), ("-(3)", -3),
])
def test_arithmetic(expr: str, value: int) -> None:
    assert arithmetic(expr) == value


@pytest.mark.parametrize("expr, needle", [
    ("1/0", "division by zero"), ("__import__('os').getcwd()", "not an integer expression"),
    ("1.5*2", "not an integer expression"), ("a+1", "not an integer expression"), ("1 +", "not an integer"),
    ("2**1000", "exponent"),
])
def test_arithmetic_rejects(expr: str, needle: str) -> None:
    with pytest.raises(ValueError) as err:
        arithmetic(expr)
    assert needle in str(err.value)


# Megatron-LM arguments.py moe_freq_type docstring: "([1]*3+[0]*1)*3" evaluates to
# [1,1,1,0,1,1,1,0,1,1,1,0]; "([0]+[1]*23)": 1 dense layer followed by 23 expert layers
@pytest.mark.parametrize("expr, value", [
    ("([1]*3+[0]*1)*3", [1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0]), ("([0]+[1]*23)", [0] + [1] * 23),
    ("([0]*3+[1]*58)", [0] * 3 + [1] * 58), ("[1,0,1]", [1, 0, 1]), ("2*[1,0]", [1, 0, 1, 0]),
])
def test_list_expression(expr: str, value: list[int]) -> None:
    assert list_expression(expr) == value


@pytest.mark.parametrize("expr", ["__import__('os')", "[1.5]", "[0]*'a'", "[0]-[1]", "3", "[x]", "[0]*10**9"])
def test_list_expression_rejects(expr: str) -> None:
    with pytest.raises(ValueError):
        list_expression(expr)


# ---- the fixtures → memform keys --------------------------------------------------------------

# (fixture, options, expected keys). Sources, per value:
#   GPT-3 175B: Brown et al. 2020 Table 2.1 (96 layers, 12288, 96 heads, 2048 context); Korthikanti et
#     al. 2022 Table 3 (t 8, p 8, SP, selective recompute, batch 1536); 64 nodes × 8 GPUs / (8 × 8) = dp 8;
#     Megatron's FFN default 4h = 49152 (arguments.py); GPT-2 BPE 50257 padded to 128 × 8 → 51200
#     (tokenizer.py _vocab_size_with_padding).
#   Mixtral 8x7B: Jiang et al. 2024 Table 1 (32 layers, 4096, 14336, 32/8 heads, 8 experts, top-2);
#     its vocabulary 32000 comes from the SentencePiece model, so the test passes it with --set;
#     64 GPUs / pp 4 = dp 16; expert_tp defaults to tp (arguments.py).
#   Llama-3 8B fp8: Dubey et al. 2024 Table 3 (32 layers, 4096, 14336, 32/8 heads); NullTokenizer's
#     vocab_size is --vocab-size + 1 (tokenizer.py _NullTokenizer) → 128257, padded to a multiple of
#     128 → 128384; 8 GPUs / tp 1 = dp 8; --fp8-format hybrid, recipe default delayed.
#   DeepSeek-V3: arXiv:2412.19437 §4.2 (61 layers, 7168, 128 heads, MLA ranks 1536/512, head dims
#     128/64/128, 256 experts of 2048 + 1 shared, top-8, first 3 dense, 1 MTP module) and §3.2
#     (PP 16, EP 64); released config.json (vocabulary 129280, dense FFN 18432); 2048 GPUs / pp 16
#     = dp 128; first/last stage 4 and 1 layers leave 56 = 14 × 4 for the middle stages.
FIXTURES = [
    (GPT3, {}, {
        "model.num_layers": 96, "model.hidden_size": 12288, "model.num_heads": 96, "model.num_kv_heads": 96,
        "model.seq_length": 2048, "model.ffn_hidden_size": 49152, "model.vocab_size": 51200,
        "model.activation": "gelu", "model.norm": "layernorm", "model.bias": True, "model.dropout": True,
        "model.tied_embeddings": True, "model.position_embedding": "learned", "model.flash_attention": False,
        "parallel.tp": 8, "parallel.pp": 8, "parallel.dp": 8, "parallel.devices": 512,
        "parallel.sequence_parallel": True, "parallel.distributed_optimizer": False,
        "training.recompute": "selective", "training.micro_batch_size": 1, "training.global_batch_size": 1536,
        "training.precision.params": "fp16"}),
    (MIXTRAL, {"overrides": {"model.vocab_size": 32000}}, {
        "model.num_layers": 32, "model.hidden_size": 4096, "model.ffn_hidden_size": 14336, "model.num_heads": 32,
        "model.num_kv_heads": 8, "model.seq_length": 4096, "model.vocab_size": 32000, "model.activation": "swiglu",
        "model.norm": "rmsnorm", "model.bias": False, "model.dropout": False, "model.tied_embeddings": False,
        "model.position_embedding": "rope", "model.num_experts": 8, "model.moe_top_k": 2,
        "model.moe_ffn_hidden_size": 14336, "model.moe_grouped_gemm": True, "model.capacity_factor": None,
        "parallel.tp": 1, "parallel.pp": 4, "parallel.ep": 8, "parallel.expert_tp": 1, "parallel.dp": 16,
        "parallel.devices": 64, "parallel.distributed_optimizer": True, "parallel.overlap_grad_reduce": True,
        "training.recompute": "full", "megatron.recompute_uniform_layers": 1, "training.global_batch_size": 256,
        "training.precision.params": "bf16"}),
    (LLAMA3, {}, {
        "model.num_layers": 32, "model.hidden_size": 4096, "model.ffn_hidden_size": 14336, "model.num_heads": 32,
        "model.num_kv_heads": 8, "model.seq_length": 8192, "model.vocab_size": 128384,
        "model.activation": "swiglu", "model.norm": "rmsnorm", "model.flash_attention": True,
        "parallel.tp": 1, "parallel.pp": 1, "parallel.cp": None, "parallel.dp": 8, "parallel.devices": 8,
        "parallel.distributed_optimizer": True, "training.micro_batch_size": 1, "training.global_batch_size": 128,
        "training.precision.params": "bf16", "training.precision.grads": "bf16",
        "megatron.fp8": "hybrid", "megatron.fp8_recipe": "delayed", "megatron.fp8_param_gather": True,
        "training.recompute": "none"}),
    (DSV3, {}, {
        "model.num_layers": 61, "model.hidden_size": 7168, "model.num_heads": 128, "model.ffn_hidden_size": 18432,
        "model.vocab_size": 129280, "model.attention": "mla", "model.q_lora_rank": 1536, "model.kv_lora_rank": 512,
        "model.qk_nope_head_dim": 128, "model.qk_rope_head_dim": 64, "model.v_head_dim": 128,
        "model.num_experts": 256, "model.moe_top_k": 8, "model.moe_ffn_hidden_size": 2048,
        "model.num_shared_experts": 1, "model.shared_expert_ffn_hidden_size": None, "model.first_k_dense": 3,
        "model.moe_layer_freq": None, "model.mtp_layers": 1, "model.moe_grouped_gemm": True,
        "parallel.tp": 1, "parallel.pp": 16, "parallel.ep": 64, "parallel.expert_tp": 1, "parallel.dp": 128,
        "parallel.devices": 2048, "parallel.stage_layers": [4] + [4] * 14 + [1],
        "training.global_batch_size": 15360, "training.recompute": "full"}),
]


@pytest.mark.parametrize("path, options, expected", FIXTURES, ids=[f[0].stem for f in FIXTURES])
def test_fixture_keys(path: Path, options: dict, expected: dict) -> None:
    draft = imported(path, **options)
    assert {k: draft.get(k) for k in expected} == expected
    assert draft.load_error is None


def test_gpt3_script_equals_the_bundled_korthikanti_config() -> None:
    """configs/gpt3-175b.yaml describes the same model and strategy (Korthikanti et al. 2022 Table 3):
    the imported launch script must give the same per-stage peaks."""
    mine = memform.estimate(imported(GPT3).config())
    theirs = memform.estimate(ROOT / "configs" / "gpt3-175b.yaml")
    assert [s.peak_bytes for s in mine.stages] == [s.peak_bytes for s in theirs.stages]


def test_fixture_warnings_name_what_is_unknown() -> None:
    gpt3 = imported(GPT3)
    # $1..$5 are the example's paths: unknown, but memform does not need them (--save, --load and
    # --data-path are memory-neutral: megatron.NEUTRAL), so nothing is said about them
    assert not [w for w in gpt3.warnings if "--save" in w or "not used by memform" in w]
    mixtral = imported(MIXTRAL, overrides={"model.vocab_size": 32000})
    assert any("$WANDB_API_KEY" in w and "taken as false" in w for w in mixtral.warnings)
    dsv3 = imported(DSV3)
    assert any("HuggingFaceTokenizer takes its vocabulary size from the tokenizer files" in w for w in dsv3.warnings)


def test_mixtral_script_needs_the_vocabulary_size() -> None:
    # Llama2Tokenizer: the size is the SentencePiece model's (tokenizer.py _Llama2Tokenizer), not an argument
    with pytest.raises(MemformError) as err:
        imported(MIXTRAL)
    assert "Llama2Tokenizer" in str(err.value) and "--set model.vocab_size=N" in str(err.value)


@pytest.mark.parametrize("path, extra", [(GPT3, []), (MIXTRAL, ["--set", "model.vocab_size=32000"]),
                                         (LLAMA3, []), (DSV3, [])], ids=lambda p: getattr(p, "stem", ""))
def test_console_script_imports_and_estimates(tmp_path: Path, path: Path, extra: list[str]) -> None:
    out = tmp_path / "imported.yaml"
    r = run_memform("import", "megatron", path, "-o", out, *extra)
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(out.read_text())["model"]["num_layers"] > 0
    r = run_memform("estimate", out, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert len(report["stages"]) == yaml.safe_load(out.read_text())["parallel"]["pp"]


# ---- derived values -----------------------------------------------------------------------------

BASE = "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 8 "


# megatron/training/tokenizer/tokenizer.py: build_tokenizer → _vocab_size_with_padding(tokenizer.vocab_size),
# a multiple of --make-vocab-size-divisible-by (default 128) × tp; _NullTokenizer.vocab_size = --vocab-size + 1;
# CustomTikTokenizer: --vocab-size, else 2**17; _GPT2BPETokenizer: len(encoder) = 50257
@pytest.mark.parametrize("args, vocab", [
    ("--tokenizer-type GPT2BPETokenizer", 50304),
    ("--tokenizer-type GPT2BPETokenizer --tensor-model-parallel-size 4 --sequence-parallel", 50688),
    ("--tokenizer-type GPT2BPETokenizer --make-vocab-size-divisible-by 64 --tensor-model-parallel-size 2 "
     "--sequence-parallel", 50304),
    ("--tokenizer-type NullTokenizer --vocab-size 128256", 128384),
    ("--tokenizer-type NullTokenizer --vocab-size 127", 128),
    ("--tokenizer-type TikTokenizer", 131072),
    ("--tokenizer-type TikTokenizer --vocab-size 100000 --tensor-model-parallel-size 2 --sequence-parallel", 100096),
    ("--vocab-size 32000", 32000),
    ("--padded-vocab-size 1000", 1000),
])
def test_vocabulary(tmp_path: Path, args: str, vocab: int) -> None:
    assert imported(write(tmp_path, "a.args", BASE + args)).get("model.vocab_size") == vocab


@pytest.mark.parametrize("args, needle", [
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/x", "--set model.vocab_size=N"),
    ("--tokenizer-type NullTokenizer", "NullTokenizer takes its size from it"),
    ("--tokenizer-type SentencePieceTokenizer --tokenizer-model t.model", "SentencePieceTokenizer reads"),
])
def test_vocabulary_unknown(tmp_path: Path, args: str, needle: str) -> None:
    with pytest.raises(MemformError) as err:
        imported(write(tmp_path, "a.args", BASE + args))
    assert needle in str(err.value)


def test_vocabulary_of_a_file_tokenizer_with_vocab_size_warns(tmp_path: Path) -> None:
    draft = imported(write(tmp_path, "a.args", BASE + "--tokenizer-type HuggingFaceTokenizer --vocab-size 256"))
    assert draft.get("model.vocab_size") == 256
    assert any("HuggingFaceTokenizer takes its vocabulary size" in w for w in draft.warnings)


MOE = BASE + "--vocab-size 128 --num-experts 4 --moe-ffn-hidden-size 32 "


# Megatron-Core gpt_layer_specs.py get_gpt_decoder_block_spec: an int N makes layer i MoE when
# i % N == 0; a list is the per-layer pattern (1 = MoE); a list of k zeros then ones is moe.mf's
# first_k_dense k; moe.mf reads model.moe_layer_freq with the same i % N rule.
@pytest.mark.parametrize("freq, expected", [
    ("1", {"model.moe_layer_freq": None, "model.first_k_dense": None}),
    ("2", {"model.moe_layer_freq": 2, "model.first_k_dense": None}),
    ("'([0]*1+[1]*3)'", {"model.moe_layer_freq": None, "model.first_k_dense": 1}),
    ("'[1,0,1,0]'", {"model.moe_layer_freq": [1, 0, 1, 0], "model.first_k_dense": None}),
    ("'([1]*2+[0]*2)'", {"model.moe_layer_freq": [1, 1, 0, 0], "model.first_k_dense": None}),
    ("'([0,1])*2'", {"model.moe_layer_freq": [0, 1, 0, 1], "model.first_k_dense": None}),
    ("'[0,0,0,0]'", {"model.moe_layer_freq": None, "model.first_k_dense": 4}),
])
def test_moe_layer_freq(tmp_path: Path, freq: str, expected: dict) -> None:
    draft = imported(write(tmp_path, "a.args", MOE + "--moe-layer-freq " + freq), check=False)
    assert {k: draft.get(k) for k in expected} == expected


def test_moe_layer_freq_loads_and_places_the_experts(tmp_path: Path) -> None:
    """With a dense FFN (32) narrower than the 4 experts (4 × 32), every other layer MoE (a list, or the
    int 2) needs less than all layers MoE, and the list and the int give the same model (moe.mf:
    i % N == 0 and the list's 1s agree)."""
    peaks = {}
    for name, freq in (("all", "1"), ("list", "'[1,0,1,0]'"), ("int", "2")):
        draft = imported(write(tmp_path, f"{name}.args", MOE + "--ffn-hidden-size 32 --moe-layer-freq " + freq))
        assert draft.load_error is None
        peaks[name] = memform.estimate(draft.config()).peak_bytes
    assert peaks["list"] == peaks["int"] < peaks["all"]


@pytest.mark.parametrize("freq, needle", [
    ("'[1,0,1]'", "has 3 entries but --num-layers is 4"),
    ("'[1,2,1,0]'", "must hold only 0 (dense) and 1 (MoE)"),
    ("'__import__(\"os\")'", "Python list expression of 0/1"),
    ("0", "must be a non-zero integer"),  # a negative N is |N| (MindSpeed-LLM scripts pass -1)
])
def test_moe_layer_freq_errors(tmp_path: Path, freq: str, needle: str) -> None:
    with pytest.raises(MemformError) as err:
        imported(write(tmp_path, "a.args", MOE + "--moe-layer-freq " + freq))
    assert needle in str(err.value) and "--moe-layer-freq" in str(err.value)


# --moe-shared-expert-intermediate-size is the shared experts' total width (arguments.py help);
# a multiple of the expert width is that many DeepSeekMoE shared experts (num_shared_experts),
# anything else one shared MLP of that width (moe.mf shared_expert_ffn_hidden_size)
@pytest.mark.parametrize("extra, expected", [
    ("--moe-shared-expert-intermediate-size 64", {"model.num_shared_experts": 2,
                                                   "model.shared_expert_ffn_hidden_size": None}),
    ("--moe-shared-expert-intermediate-size 48", {"model.num_shared_experts": None,
                                                   "model.shared_expert_ffn_hidden_size": 48}),
    ("--moe-shared-expert-intermediate-size 48 --moe-shared-expert-gate",
     {"model.shared_expert_ffn_hidden_size": 48, "model.shared_expert_gate": True}),
])
def test_shared_experts(tmp_path: Path, extra: str, expected: dict) -> None:
    draft = imported(write(tmp_path, "a.args", MOE + extra))
    assert {k: draft.get(k) for k in expected} == expected
    assert draft.load_error is None


# Megatron-LM arguments.py semantics, as megatron.py has long mapped them, now through variables and
# arithmetic: virtual stages = layers / (pp × layers per virtual stage); --decoder-first/last-pipeline-
# num-layers fix the end stages, the rest split evenly; --cp-comm-type a2a is Ulysses-style all-to-all;
# expert_tp defaults to tp; --recompute-method block recomputes the first N layers of each stage.
STRATEGY_CASES = [
    ("PP=4\nPER=2\nA=( --pipeline-model-parallel-size $PP --num-layers-per-virtual-pipeline-stage $PER )",
     {"parallel.pp": 4, "parallel.vpp": 2}),
    ("A=( --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank $((8/4)) )", {"parallel.vpp": 2}),
    # model_parallel_config.py microbatch_group_size_per_vp_stage: the interleaved warm-up's group (schedules.mf)
    ("A=( --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
     "--microbatch-group-size-per-virtual-pipeline-stage 4 )", {"parallel.vpp": 2, "parallel.vpp_microbatch_group": 4}),
    ("F=${FIRST:-3}\nA=( --pipeline-model-parallel-size 3 --decoder-first-pipeline-num-layers $F "
     "--decoder-last-pipeline-num-layers $((16 - F - 10)) )", {"parallel.stage_layers": [3, 10, 3]}),
    ("CP=2\nA=( --context-parallel-size $CP --cp-comm-type a2a )", {"parallel.cp": 2, "parallel.cp_algo": "ulysses"}),
    ("A=( --recompute-granularity full --recompute-method block --recompute-num-layers ${N:-2} )",
     {"training.recompute": "full", "training.recompute_num_layers": 2}),
    ("A=( \"--fp8-format e4m3\" \"--fp8-recipe tensorwise\" --bf16 )",
     {"megatron.fp8": "e4m3", "megatron.fp8_recipe": "tensorwise", "training.precision.params": "bf16"}),
    ("A=( --num-experts 4 --moe-ffn-hidden-size 32 --expert-model-parallel-size 2 --tensor-model-parallel-size 2 "
     "--sequence-parallel )", {"parallel.ep": 2, "parallel.expert_tp": 2}),
    ("A=( --num-experts 4 --moe-ffn-hidden-size 32 --expert-tensor-parallel-size 1 )", {"parallel.expert_tp": 1}),
]


@pytest.mark.parametrize("setup, expected", STRATEGY_CASES, ids=[str(i) for i in range(len(STRATEGY_CASES))])
def test_strategy_through_variables(tmp_path: Path, setup: str, expected: dict) -> None:
    path = write(tmp_path, "t.sh", setup + "\nB=( --num-layers 16 --hidden-size 64 --num-attention-heads 4 "
                 "--seq-length 8 --vocab-size 128 )\npython pretrain_gpt.py \"${B[@]}\" ${A[@]}\n")
    draft = imported(path, check=False)
    assert {k: draft.get(k) for k in expected} == expected


# ---- several files -----------------------------------------------------------------------------

def test_convert_takes_a_list_of_files() -> None:
    assert takes_several_files("megatron")


def test_later_files_override_and_variables_carry(tmp_path: Path) -> None:
    vars_ = write(tmp_path, "vars.sh", "NUM_LAYERS=16\nTP=2\n")
    script = write(tmp_path, "train.sh", "ARGS=( --num-layers $NUM_LAYERS --hidden-size 256 "
                                         "--num-attention-heads 8 --seq-length 128 --vocab-size 1000 "
                                         "--tensor-model-parallel-size ${TP:-1} --sequence-parallel )\n"
                                         "torchrun --nproc_per_node 8 pretrain_gpt.py ${ARGS[@]}\n")
    extra = write(tmp_path, "extra.args", "--hidden-size 512\n--micro-batch-size 2\n")
    draft = imported([vars_, script, extra])
    assert (draft.get("model.num_layers"), draft.get("parallel.tp")) == (16, 2)  # from vars.sh
    assert draft.get("model.hidden_size") == 512 and draft.get("training.micro_batch_size") == 2  # extra.args wins
    assert (draft.get("parallel.devices"), draft.get("parallel.dp")) == (8, 4)  # torchrun in train.sh
    assert draft.get("model.vocab_size") == 1024  # 1000 padded to 128 × tp 2 (tokenizer.py)


def test_console_script_reads_several_files(tmp_path: Path) -> None:
    script = write(tmp_path, "train.sh", "L=${L:-2}\ntorchrun --nproc_per_node 2 pretrain_gpt.py --num-layers $L "
                                         "--hidden-size 64 --num-attention-heads 4 --seq-length 8 --vocab-size 128\n")
    more = write(tmp_path, "more.args", "--num-layers 4\n")
    out = tmp_path / "c.yaml"
    r = run_memform("import", "megatron", script, more, "-o", out)
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load(out.read_text())
    assert cfg["model"]["num_layers"] == 4 and cfg["parallel"]["dp"] == 2


def test_set_stands_in_for_an_unknown_value_when_its_value_is_passed(tmp_path: Path) -> None:
    """The module-level hook: ``convert(paths, draft, given)`` with ``given`` a mapping of the --set
    values uses them for arguments the script leaves unknown."""
    script = write(tmp_path, "t.sh", "python pretrain_gpt.py --num-layers $NUM_LAYERS --hidden-size 64 "
                                     "--num-attention-heads 4 --seq-length 8 --vocab-size 128\n")
    draft = Draft(script, megatron.TITLE)
    megatron.convert([script], draft, {"model.num_layers": 6})
    assert draft.get("model.num_layers") == 6
    with pytest.raises(MemformError) as err:
        megatron.convert([script], Draft(script, megatron.TITLE), {})
    assert "--set model.num_layers=VALUE" in str(err.value)


# ---- errors: exit 2 with file:line and the variable ----------------------------------------------

ERROR_CASES = [
    ("environment variable", "ARGS=(\n  --num-layers $NUM_LAYERS\n  --hidden-size 64\n)\n"
     "torchrun --nproc_per_node 8 pretrain_gpt.py ${ARGS[@]} --num-attention-heads 4 --seq-length 8 --vocab-size 8\n",
     2, ["--num-layers is $NUM_LAYERS", "NUM_LAYERS (not set in the script", "set NUM_LAYERS in the script"]),
    ("positional argument", "H=$1\npython pretrain_gpt.py --num-layers 2 --hidden-size $H\n", 1,
     ["--hidden-size is $1", "$1 (a positional argument of the script"]),
    ("command substitution", "L=$(cat layers.txt)\npython pretrain_gpt.py --num-layers $L\n", 1,
     ["--num-layers is $(cat layers.txt)", "command substitution"]),
    ("unknown inside arithmetic", "python pretrain_gpt.py --num-layers $((N * 2))\n", 1, ["$N (not set"]),
    ("division by zero", "Z=0\nA=$((4 / Z))\n", 2, ["cannot evaluate $((4 / Z)): division by zero"]),
    ("array never closed", "A=(\n --num-layers 2\n", 1, ["never closed"]),
    ("unsupported construct", "select X in $L; do A=1; done\n", 1, ["cannot parse the script as bash"]),
]


@pytest.mark.parametrize("text, line, needles", [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_errors_exit_2_with_file_and_line(tmp_path: Path, text: str, line: int, needles: list[str]) -> None:
    path = write(tmp_path, "train.sh", text)
    r = run_memform("import", "megatron", path)
    assert r.returncode == 2, r.stderr
    assert f"{path}:{line}:" in r.stderr and "Traceback" not in r.stderr
    for needle in needles:
        assert needle in r.stderr


def test_devices_unknown_when_nnodes_is_unknown(tmp_path: Path) -> None:
    path = write(tmp_path, "t.sh", "torchrun --nproc_per_node 8 --nnodes $SLURM_NNODES pretrain_gpt.py " + BASE +
                 "--vocab-size 128\n")
    draft = imported(path)
    assert draft.get("parallel.devices") is None
    assert any("device count is not known" in w and "$SLURM_NNODES" in w for w in draft.warnings)


@pytest.mark.parametrize("launcher, devices", [
    ("torchrun --nproc-per-node=4 --nnodes=2", 8),
    ("python -m torch.distributed.launch --nproc_per_node 8", 8),
    ("deepspeed --num_gpus 4 --num_nodes 4", 16),
    ("python", None),
])
def test_devices_from_the_launcher(tmp_path: Path, launcher: str, devices: int | None) -> None:
    path = write(tmp_path, "t.sh", f"{launcher} pretrain_gpt.py {BASE} --vocab-size 128\n")
    assert imported(path).get("parallel.devices") == devices


def test_the_pretrain_command_is_chosen_over_other_python(tmp_path: Path) -> None:
    path = write(tmp_path, "t.sh", "python tools/preprocess_data.py --workers 8\n"
                                   f"torchrun --nproc_per_node 2 pretrain_gpt.py {BASE} --vocab-size 128\n"
                                   "python tools/report.py --out x\n")
    draft = imported(path)
    assert draft.get("parallel.devices") == 2 and draft.warnings == []


def test_an_unknown_word_after_a_flag_is_not_its_value(tmp_path: Path) -> None:
    path = write(tmp_path, "t.sh", f"python pretrain_gpt.py {BASE} --vocab-size 128 --bf16 $EXTRA_ARGS\n")
    draft = imported(path)
    assert draft.get("training.precision.params") == "bf16"
    assert any("$EXTRA_ARGS is not known" in w for w in draft.warnings)


def test_plain_arguments_file_that_bash_cannot_parse(tmp_path: Path) -> None:
    """One argument per line, unquoted Python list (bash would reject the parentheses): split like a
    command line (shlex), as memform always read arguments files."""
    path = write(tmp_path, "dsv3.args", MOE.replace(" --", "\n--") + "\n--moe-layer-freq ([0]*1+[1]*3)\n")
    assert imported(path).get("model.first_k_dense") == 1


def test_windows_line_endings(tmp_path: Path) -> None:
    path = write(tmp_path, "t.sh", "L=4\r\nARGS=(\r\n  --num-layers $L\r\n)\r\npython pretrain_gpt.py ${ARGS[@]} "
                 "--hidden-size 64 --num-attention-heads 4 --seq-length 8 --vocab-size 128\r\n")
    draft = imported(path)
    assert draft.get("model.num_layers") == 4 and draft.get("model.vocab_size") == 128


def test_a_file_of_argument_arrays_alone(tmp_path: Path) -> None:
    """No launcher line (a file other scripts source): the arrays' arguments, with a warning."""
    path = write(tmp_path, "args.sh", "L=2\nMODEL=( --num-layers $L --hidden-size 64 )\n"
                 "REST=( --num-attention-heads 4 --seq-length 8 --vocab-size 128 )\n")
    draft = imported(path)
    assert draft.get("model.num_layers") == 2
    assert draft.warnings == ["no command runs a *.py script; took the arguments of the variables MODEL, REST"]


def test_a_bad_value_names_the_line_it_was_written_on(tmp_path: Path) -> None:
    path = write(tmp_path, "t.sh", "A=1\nLAYERS=many\nARGS=(\n  --num-layers $LAYERS\n)\n"
                 "python pretrain_gpt.py ${ARGS[@]}\n")
    with pytest.raises(MemformError) as err:
        imported(path)
    assert f"{path}:2: field '--num-layers' must be a positive integer" in str(err.value)


def test_an_unknown_world_size_leaves_the_launcher_count(tmp_path: Path) -> None:
    path = write(tmp_path, "t.sh", f"torchrun --nproc_per_node 4 pretrain_gpt.py {BASE} --vocab-size 128 "
                                   "--world-size $WORLD_SIZE\n")
    draft = imported(path)
    assert draft.get("parallel.devices") == 4
    assert any(w.startswith("line 1: --world-size is $WORLD_SIZE") for w in draft.warnings)


# ---- attention shape flags (Megatron-Core TransformerConfig) -----------------------------------
# kv_channels is the head size (default hidden / heads) and sizes the query projection (kv_channels ×
# heads): Qwen3-30B-A3B's Megatron recipe has 32 heads × 128 over a 2048 hidden size; add_qkv_bias puts a
# bias on linear_qkv only (bias = add_bias_linear or add_qkv_bias); qk_layernorm adds per-head q/k norms
ATTENTION_BASE = ("--num-layers 2 --hidden-size 2048 --num-attention-heads 32 --seq-length 64 "
                  "--vocab-size 128 --disable-bias-linear ")


@pytest.mark.parametrize("extra, expected", [
    ("--kv-channels 128", {"model.head_dim": 128}),
    ("--kv-channels 64", {"model.head_dim": None}),        # = 2048 / 32: nothing to say
    ("--add-qkv-bias", {"model.qkv_bias": True, "model.bias": False}),
    ("--qk-layernorm", {"model.qk_norm": True}),
])
def test_attention_shape_flags(tmp_path: Path, extra: str, expected: dict) -> None:
    draft = imported(write(tmp_path, "a.args", ATTENTION_BASE + extra))
    assert {k: draft.get(k) for k in expected} == expected
    assert draft.load_error is None


def test_head_dim_sizes_the_attention_weights(tmp_path: Path) -> None:
    # per layer: q 2048×4096, k and v 2048×4096 (MHA: 32 query groups), o 4096×2048 = 4·2048·4096
    wide = memform.estimate(imported(write(tmp_path, "w.args", ATTENTION_BASE + "--kv-channels 128")).config())
    plain = memform.estimate(imported(write(tmp_path, "p.args", ATTENTION_BASE)).config())
    assert wide.stages[0].param_count - plain.stages[0].param_count == 2 * 4 * 2048 * (4096 - 2048)


# A script that only defines its arguments in a string variable, for another script to pass on
# (the shape of NVIDIA's RL example recipes: ENV_DEPENDENT="--micro-batch-size $MBS ..."), with an
# environment variable among the words that memform does not need
def test_arguments_in_a_string_variable(tmp_path: Path) -> None:
    path = write(tmp_path, "recipe.sh", 'TP=${TP:-2}\nMBS=${MBS:-1}\nARGS="\\\n--micro-batch-size $MBS \\\n'
                 '--langrl-env-config $ENV_CONFIG \\\n--tensor-model-parallel-size $TP \\\n'
                 + ATTENTION_BASE.replace(" --", " \\\n--") + '"\n')
    # --langrl-env-config is no argument memform knows: refused unless --accept vouches for it
    with pytest.raises(MemformError, match="--accept langrl-env-config"):
        imported(path)
    draft = imported(path, accept=("langrl-env-config",))
    assert draft.get("parallel.tp") == 2 and draft.get("model.num_layers") == 2
    assert any("variables ARGS" in w for w in draft.warnings)
    assert any("'--langrl-env-config' is not read by memform; taken as memory-neutral (--accept)" in w
               for w in draft.warnings)
