"""``memform import hf config.json --trainer ARGS``: a Hugging Face Trainer job's TrainingArguments
(training_args.json) or a TRL YAML recipe -> the hf-trainer keys (src/memform/importers/hf_trainer.py), and the
Trainer's optimizers measured (src/memform/validation/frameworks/hf_optim.py). Fixtures:
tests/data/importers/trainer/README.md (sources and commits)."""

from __future__ import annotations

import json

import pytest

import memform
from cli_helpers import ROOT, run_memform
from memform.importers import Options, import_config

DATA = ROOT / "tests" / "data" / "importers"
TRAINER = DATA / "trainer"
LLAMA31 = DATA / "hf" / "llama-3.1-8b.config.json"            # torch_dtype bfloat16
MISTRAL = DATA / "hf" / "mistral-7b-v0.1.trimmed.config.json"  # no dtype field


def imported(config, trainer, **kw):
    draft = import_config("hf", config, Options(trainer=str(trainer), **kw))
    assert draft.load_error is None, draft.load_error
    return draft


# (fixture, config.json, expected keys, the source of each value)
ROWS = [
    # alignment-handbook recipes/zephyr-7b-beta/sft/config_qlora.yaml: per_device_train_batch_size 4,
    # gradient_accumulation_steps 2, torch_dtype bfloat16 + bf16 true, gradient_checkpointing true,
    # max_seq_length 2048, load_in_4bit + use_peft, lora_r 16, lora_dropout 0.05, seven target modules,
    # optim not set (TrainingArguments default adamw_torch), attn_implementation flash_attention_2
    ("zephyr-7b-sft-qlora.yaml", MISTRAL,
     {"training.framework": "hf-trainer", "training.micro_batch_size": 4, "training.num_micro_batches": 2,
      "training.precision.params": "bf16", "hf_trainer.amp": "none", "training.recompute": "full",
      "model.seq_length": 2048, "hf_trainer.optim": "adamw_torch", "model.flash_attention": True,
      "lora.rank": 16, "lora.dropout": 0.05, "lora.down_proj": True, "lora.base_quant": "nf4",
      "lora.double_quant": False, "lora.compute_dtype": "bf16"}),
    # the same recipe's full fine-tuning: batch 16, no accumulation, no PEFT
    ("zephyr-7b-sft-full.yaml", MISTRAL,
     {"training.micro_batch_size": 16, "training.num_micro_batches": 1, "training.recompute": "full",
      "model.seq_length": 2048, "training.precision.params": "bf16", "hf_trainer.optim": "adamw_torch"}),
    # transformers 5.25 TrainingArguments.to_json_string(): batch 4, accumulation 4, bf16, checkpointing (as
    # activation_checkpointing and its alias), paged_adamw_8bit, max_grad_norm 0.3; the model's dtype from
    # config.json's torch_dtype bfloat16 (from_pretrained dtype "auto")
    ("llama-3.1-8b-qlora.training_args.json", LLAMA31,
     {"training.micro_batch_size": 4, "training.num_micro_batches": 4, "training.recompute": "full",
      "hf_trainer.optim": "adamw_8bit", "training.grad_clip": True, "training.precision.params": "bf16",
      "hf_trainer.amp": "none"}),
]


@pytest.mark.parametrize("fixture, config, expected", ROWS, ids=[r[0] for r in ROWS])
def test_training_arguments_map_to_the_hf_trainer_keys(fixture, config, expected):
    draft = imported(config, TRAINER / fixture)
    got = {k: draft.get(k) for k in expected}
    assert got == expected


def test_the_global_batch_is_the_trainers_total_train_batch_size_once_the_devices_are_known():
    # transformers Trainer.get_total_train_batch_size: per-device batch × accumulation × dp; the zephyr
    # QLoRA recipe's 4 × 2 on 8 devices is 64 sequences per step. Without --devices the world size is
    # not known, and the file says so (a search refuses without a global batch, naming the key)
    draft = imported(MISTRAL, TRAINER / "zephyr-7b-sft-qlora.yaml", devices=8)
    assert draft.get("training.global_batch_size") == 64 and "training.num_micro_batches" not in draft
    assert memform.estimate(draft.config()).model.value_for_key("training.num_micro_batches") == 2
    draft = imported(MISTRAL, TRAINER / "zephyr-7b-sft-qlora.yaml")
    assert "training.global_batch_size" not in draft and draft.get("training.num_micro_batches") == 2
    assert any("No training.global_batch_size" in line and "--devices N" in line for line in draft.header)


def test_the_qlora_recipe_estimates_a_4bit_base_with_adapters():
    draft = imported(MISTRAL, TRAINER / "zephyr-7b-sft-qlora.yaml")
    est = memform.estimate(draft.config()).stages[0]
    # Mistral-7B: 32 layers of q 4096², k and v 1024×4096, o 4096², three 14336×4096 MLP matrices
    per_layer = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096
    # LoRA r 16 on all seven: r·(k + d) each (Hu et al. 2021 §4.1), fp32 (PEFT autocast_adapter_dtype)
    lora = 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336)) * 32
    # optimizer: torch AdamW's two fp32 moments of the adapters only
    assert est.values["optimizer"] == 2 * 4 * lora
    assert est.values["grads"] == 4 * lora
    # params: the 4-bit codes (1/2 byte) + one fp32 absmax per 64 (QLoRA §3, no double quantization),
    # 16 fp32 code values per matrix, the bf16 embedding and head (2·32000·4096) and norms, fp32 adapters
    base = per_layer * 32 * (0.5 + 4 / 64) + 7 * 32 * 16 * 4
    rest = 2 * 2 * 32000 * 4096 + 2 * (2 * 32 + 1) * 4096 + 4 * lora
    assert abs(est.values["params"] - (base + rest)) < 1e-6 * est.values["params"]


def test_the_console_script_imports_then_estimates(tmp_path):
    out = tmp_path / "job.yaml"
    proc = run_memform("import", "hf", LLAMA31, "--trainer", TRAINER / "llama-3.1-8b-qlora.training_args.json",
                       "--adapter", DATA / "peft" / "llama3-8b-all-linear.adapter_config.json",
                       "--set", "lora.base_quant=nf4", "--set", "lora.double_quant=true", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "paged bitsandbytes optimizer" in proc.stderr and "config.json's bfloat16" in proc.stderr
    proc = run_memform("estimate", out)
    assert proc.returncode == 0, proc.stderr
    assert "framework=hf-trainer" in proc.stdout and "micro-batch 4 x 4 micro-batches" in proc.stdout


# a one-paragraph error naming the field, exit 2, never a traceback
REFUSED = [
    # a real GRPO job (TRL GRPOConfig) with its adapter: not one supervised step
    ("grpo-llama-3.1-8b.training_args.json", {}, "field 'num_generations' is set: this is a TRL GRPO"),
    ("llama-3.1-8b-qlora.training_args.json", {"deepspeed": "ds_config.json"},
     "field 'deepspeed' is \"ds_config.json\": the Trainer hands the step to DeepSpeed, which memform sizes with "
     "the deepspeed profile: run `memform import deepspeed ds_config.json --model"),
    # FSDP is the hf-fsdp2 profile's (tests/test_trainer_fsdp.py), over torch AdamW only
    ("llama-3.1-8b-qlora.training_args.json", {"fsdp": "full_shard auto_wrap"},
     "field 'optim' is 'paged_adamw_8bit' with fsdp"),
    ("llama-3.1-8b-qlora.training_args.json", {"torch_compile": True}, "field 'torch_compile'"),
    ("llama-3.1-8b-qlora.training_args.json", {"optim": "galore_adamw"},
     "field 'optim' is 'galore_adamw': the hf-trainer profile sizes"),
    ("llama-3.1-8b-qlora.training_args.json", {"use_liger_kernel": True}, "field 'use_liger_kernel'"),
    ("llama-3.1-8b-qlora.training_args.json", {"bf16": True, "fp16": True}, "are both true"),
    ("llama-3.1-8b-qlora.training_args.json", {"activation_checkpointing": False},
     "activation_checkpointing and gradient_checkpointing are one setting"),
    ("llama-3.1-8b-qlora.training_args.json", {"per_device_train_batch_size": 0}, "must be a positive integer"),
    ("llama-3.1-8b-qlora.training_args.json", {"my_own_flag": 3}, "'my_own_flag'"),
]


@pytest.mark.parametrize("fixture, change, fragment", REFUSED, ids=[f"{r[0]}-{list(r[1])}" for r in REFUSED])
def test_fields_memform_cannot_size_are_refused(tmp_path, fixture, change, fragment):
    data = {**json.loads((TRAINER / fixture).read_text()), **change}
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps(data))
    extra = ["--adapter", TRAINER / "grpo-llama-3.1-8b.adapter_config.json"] if "grpo" in fixture else []
    proc = run_memform("import", "hf", LLAMA31, "--trainer", path, *extra)
    assert proc.returncode == 2, proc.stdout
    assert fragment in proc.stderr and "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1, proc.stderr


def test_trl_lora_and_an_adapter_file_are_not_both_read():
    with pytest.raises(memform.MemformError, match="use_peft' is true and --adapter"):
        import_config("hf", MISTRAL, Options(trainer=str(TRAINER / "zephyr-7b-sft-qlora.yaml"),
                                             adapter=str(DATA / "peft" / "llama3-8b-qv.adapter_config.json")))


def test_trainer_is_read_by_import_hf_and_deepspeed_only():
    proc = run_memform("import", "megatron", DATA / "llama3-8b.args.txt", "--trainer",
                       TRAINER / "llama-3.1-8b-qlora.training_args.json")
    assert proc.returncode == 2
    assert "--trainer is read by 'memform import hf' and 'memform import deepspeed' only" in proc.stderr


# ---- the optimizers the Trainer builds, as memform sizes them -------------------------------------------
def test_eight_bit_states_of_norms_reach_min_8bit_size_at_h_4096():
    """bitsandbytes Optimizer2State.init_state: a tensor of fewer than 4096 values keeps two fp32 states.
    At h 4096 a norm has 4096 values: 8-bit; at h 2048 it has 2048: fp32 (8 bytes a value)."""
    def optim(h):
        over = {"training.framework": "hf-trainer", "hf_trainer.optim": "adamw_8bit", "model.hidden_size": h,
                "model.num_heads": h // 128, "model.num_kv_heads": 8, "model.ffn_hidden_size": 4 * h,
                "model.num_layers": 2, "model.vocab_size": 32000, "model.seq_length": 512,
                "training.precision.params": "bf16", "parallel.dp": 1, "parallel.tp": 1, "parallel.pp": 1,
                "model.tied_embeddings": False, "hf_trainer.bnb_embedding_fp32": False}
        return memform.estimate(ROOT / "configs" / "llama3-8b.yaml", over).stages[0]
    for h, norm_bytes in ((4096, 2 * (1 + 4 / 256)), (2048, 8)):
        st = optim(h)
        n = st.param_count
        norms = (2 * 2 + 1) * h
        expected = (n - norms) * 2 * (1 + 4 / 256) + norms * norm_bytes
        assert abs(st.values["optimizer"] - expected) < 1e-9 * expected, h


@pytest.mark.parametrize("index", [0, 5], ids=["adamw_8bit fp32", "adamw_8bit lora8 bf16"])
def test_the_trainers_8bit_adamw_measured_on_cpu(index):
    pytest.importorskip("bitsandbytes", reason="bitsandbytes (the 'frameworks' extra) is not installed")
    pytest.importorskip("transformers", reason="transformers (the 'frameworks' extra) is not installed")
    from memform.validation import frameworks
    from memform.validation.frameworks import hf_optim

    case = hf_optim.CASES[index]
    row = frameworks.compare(case, hf_optim)
    # measured with bitsandbytes 0.50.2 (bench/validate.py --frameworks --only 'hf optim='): optimizer
    # within 0.1 % (the shared 256-value fp32 quantization maps, 2 KiB, are not counted), params and grads exact
    assert row.measured["params"] == row.estimated["params"] and row.measured["grads"] == row.estimated["grads"]
    assert abs(row.error("optimizer")) < 0.002, (row.measured, row.estimated)
    assert abs(row.error("activations")) < 0.02 and abs(row.error("activations_peak")) < 0.02


# (dtype in the arguments, bf16, fp16) -> (training.precision.params, hf_trainer.amp): autocast over an fp32
# model is hf-trainer.mf's AMP; over a 16-bit model it casts nothing
PRECISION = [("float32", True, False, "fp32", "bf16"), ("float32", False, True, "fp32", "fp16"),
             ("float32", False, False, "fp32", "none"), ("bfloat16", True, False, "bf16", "none"),
             ("float16", False, False, "fp16", "none")]


@pytest.mark.parametrize("dtype, bf16, fp16, params, amp", PRECISION, ids=[f"{r[0]}-{r[3]}-{r[4]}" for r in PRECISION])
def test_the_load_dtype_and_autocast(tmp_path, dtype, bf16, fp16, params, amp):
    data = {**json.loads((TRAINER / "llama-3.1-8b-qlora.training_args.json").read_text()),
            "dtype": dtype, "bf16": bf16, "fp16": fp16, "optim": "adamw_torch"}
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps(data))
    draft = imported(LLAMA31, path)
    assert (draft.get("training.precision.params"), draft.get("hf_trainer.amp")) == (params, amp)


@pytest.mark.parametrize("frozen", [["embedding"], ["output"]])
def test_adafactor_keeps_no_factors_for_a_frozen_matrix(frozen):
    # transformers Adafactor: a v×h matrix keeps a v-vector and an h-vector of fp32 second moments
    # (optimization.py Adafactor.step, exp_avg_sq_row / _col); a frozen one has no gradient and no state.
    # Llama-3-8B: v 128256, h 4096
    over = {"training.framework": "hf-trainer", "hf_trainer.optim": "adafactor", "parallel.tp": 1,
            "parallel.pp": 1, "parallel.dp": 1}
    cfg = ROOT / "configs" / "llama3-8b.yaml"
    full = memform.estimate(cfg, over).stages[0].values["optimizer"]
    part = memform.estimate(cfg, {**over, "training.frozen": frozen}).stages[0].values["optimizer"]
    assert full - part == (128256 + 4096) * 4
