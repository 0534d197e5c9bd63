"""``memform import deepspeed ds_config.json --model config.json --trainer ARGS``: a Hugging Face Trainer job
that hands its step to DeepSpeed. The ds_config's "auto" values are filled from the training arguments and the
others checked against them, as transformers' HfTrainerDeepSpeedConfig.trainer_config_process does
(src/memform/importers/hf_trainer.py fill_deepspeed_auto) -- held here against that transformers function itself
on the same real files: transformers' tests/deepspeed ds_config_zero2.json / ds_config_zero3.json
(tests/data/importers/deepspeed/README.md) under alignment-handbook's zephyr-7b SFT recipe
(tests/data/importers/trainer/README.md)."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import pytest

import memform
from cli_helpers import ROOT, run_memform
from cli_inprocess import memform_in_process
from memform.engine.config import load_yaml
from memform.importers import Options, import_config

DATA = ROOT / "tests" / "data" / "importers"
ZERO2 = DATA / "deepspeed" / "hf-tests-ds_config_zero2.json"     # every batch / precision value "auto"
ZERO3 = DATA / "deepspeed" / "hf-tests-ds_config_zero3.json"     # fp16.enabled true, no batch keys
RECIPE = DATA / "trainer" / "zephyr-7b-sft-full.yaml"             # bf16, batch 16, checkpointing, 2048 tokens
QLORA_ARGS = DATA / "trainer" / "llama-3.1-8b-qlora.training_args.json"
MISTRAL = DATA / "hf" / "mistral-7b-v0.1.trimmed.config.json"
LLAMA31 = DATA / "hf" / "llama-3.1-8b.config.json"


def imported(ds=ZERO2, trainer=RECIPE, model=MISTRAL, devices=8):
    draft = import_config("deepspeed", ds, Options(model=str(model), trainer=str(trainer), devices=devices))
    assert draft.load_error is None, draft.load_error
    return draft


def test_the_zephyr_recipe_fills_the_auto_values():
    draft = imported()
    got = {k: draft.get(k) for k in ("training.framework", "parallel.zero", "parallel.dp", "training.micro_batch_size",
                                     "training.num_micro_batches", "training.global_batch_size",
                                     "training.precision.params", "training.recompute", "model.seq_length",
                                     "model.flash_attention", "deepspeed.offload_optimizer")}
    # the recipe: per_device_train_batch_size 16, gradient_accumulation_steps 1, bf16 true, gradient_checkpointing
    # true, max_seq_length 2048, attn_implementation flash_attention_2; ds_config_zero2: stage 2, optimizer
    # offloaded to the CPU
    assert got == {"training.framework": "deepspeed", "parallel.zero": 2, "parallel.dp": 8,
                   "training.micro_batch_size": 16, "training.num_micro_batches": 1, "training.global_batch_size": 128,
                   "training.precision.params": "bf16", "training.recompute": "full", "model.seq_length": 2048,
                   "model.flash_attention": True, "deepspeed.offload_optimizer": "cpu"}
    # nothing left for the user to guess: no "auto" warning, no sequence-length default
    assert not [w for w in draft.warnings if '"auto"' in w or "model.seq_length" in w], draft.warnings


def _trainer_args(path, world):
    """The TrainingArguments values trainer_config_process reads, from a recipe (TrainingArguments' defaults
    for what it leaves out)."""
    data = load_yaml(path, "recipe") if path.suffix == ".yaml" else json.loads(path.read_text())
    defaults = dict(per_device_train_batch_size=8, gradient_accumulation_steps=1, max_grad_norm=1.0,
                    learning_rate=5e-5, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0,
                    save_on_each_node=False, fp16=False, fp16_full_eval=False, bf16=False, bf16_full_eval=False)
    return SimpleNamespace(world_size=world, **{k: data.get(k, v) for k, v in defaults.items()})


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="transformers' HfDeepSpeedConfig needs deepspeed")
@pytest.mark.parametrize("trainer", [RECIPE, QLORA_ARGS], ids=["zephyr-recipe", "training_args.json"])
def test_the_filled_ds_config_is_the_trainers(monkeypatch, trainer):
    # transformers' own HfTrainerDeepSpeedConfig.trainer_config_process on the same two files: what DeepSpeed is
    # handed is what memform read (train_batch_size: the batch triangle's, from --devices)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    from memform.importers import hf_trainer
    from memform.importers.draft import Draft, Fields

    theirs = HfTrainerDeepSpeedConfig(str(ZERO2))
    theirs.trainer_config_process(_trainer_args(trainer, 8))
    assert theirs.mismatches == []
    args = Fields(hf_trainer.read(trainer), trainer)
    ours = hf_trainer.fill_deepspeed_auto(args, json.loads(ZERO2.read_text()), ZERO2, Draft(ZERO2, "deepspeed"))
    expected = dict(theirs.config)
    total = expected.pop("train_batch_size")
    assert ours == expected
    draft = imported(trainer=trainer, model=LLAMA31 if trainer == QLORA_ARGS else MISTRAL)
    assert draft.get("training.global_batch_size") == total


def test_a_ds_config_that_disagrees_with_the_arguments_is_refused():
    # ds_config_zero3.json enables fp16; the recipe trains in bf16 (fp16 false): the Trainer raises ("Please
    # correct the following DeepSpeed config values that mismatch TrainingArguments values")
    proc = memform_in_process("import", "deepspeed", ZERO3, "--model", MISTRAL, "--trainer", RECIPE, "--devices", "8")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "ds fp16.enabled=true vs hf fp16|fp16_full_eval=false" in proc.stderr


REFUSED = [
    ({"optim": "adafactor"}, "field 'optim' is 'adafactor' and the ds_config has no optimizer section"),
    ({"use_peft": True}, "field 'use_peft' is true"),
    ({"torch_compile": True}, "field 'torch_compile'"),
    ({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 3}, None),   # fills, no refusal
    ({"fsdp": "full_shard"}, "field 'fsdp' is set with a ds_config"),
    ({"my_own_flag": 1}, "'my_own_flag'"),
]


@pytest.mark.parametrize("change, fragment", REFUSED, ids=[str(r[0]) for r in REFUSED])
def test_training_arguments_the_deepspeed_profile_cannot_size(tmp_path, change, fragment):
    data = {**load_yaml(RECIPE, "recipe"), **change}
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(data))
    ds = tmp_path / "ds.json"          # without its optimizer section: DeepSpeed wraps the Trainer's optimizer
    ds.write_text(json.dumps({k: v for k, v in json.loads(ZERO2.read_text()).items() if k != "optimizer"}))
    proc = memform_in_process("import", "deepspeed", ds, "--model", MISTRAL, "--trainer", path, "--devices", "8")
    if fragment is None:
        assert proc.returncode == 0, proc.stderr
        assert "micro_batch_size: 4" in proc.stdout and "num_micro_batches: 3" in proc.stdout
        return
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert fragment in proc.stderr, proc.stderr


def test_the_hf_import_names_the_chained_command(tmp_path):
    data = {**json.loads(QLORA_ARGS.read_text()), "deepspeed": str(ZERO2)}
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps(data))
    proc = memform_in_process("import", "hf", LLAMA31, "--trainer", path)
    assert proc.returncode == 2
    assert f"memform import deepspeed {ZERO2} --model {LLAMA31} --trainer {path} --devices N" in proc.stderr


def test_the_console_script_chains_and_estimates(tmp_path):
    out = tmp_path / "job.yaml"
    proc = run_memform("import", "deepspeed", ZERO2, "--model", MISTRAL, "--trainer", RECIPE, "--devices", "8",
                       "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert memform.estimate(str(out)).stages[0].values["activations"] > 0


# ---- an accelerate config file (accelerate launch --config_file), as the alignment-handbook recipes run --------
ACCELERATE_Z3 = DATA / "deepspeed" / "ah-accelerate-deepspeed_zero3.yaml"


def test_the_alignment_handbook_launcher_and_recipe():
    # recipes/accelerate_configs/deepspeed_zero3.yaml: ZeRO-3, optimizer and parameters offloaded to the CPU,
    # mixed_precision bf16, num_processes 1 (--devices gives the job's device count); the SFT recipe
    # config_full.yaml fills the "auto" batch
    draft = imported(ds=ACCELERATE_Z3)
    got = {k: draft.get(k) for k in ("parallel.zero", "deepspeed.offload_optimizer", "deepspeed.offload_param",
                                     "training.precision.params", "training.micro_batch_size", "parallel.dp",
                                     "training.recompute")}
    assert got == {"parallel.zero": 3, "deepspeed.offload_optimizer": "cpu", "deepspeed.offload_param": "cpu",
                   "training.precision.params": "bf16", "training.micro_batch_size": 16, "parallel.dp": 8,
                   "training.recompute": "full"}
    alone = import_config("deepspeed", ACCELERATE_Z3, Options(model=str(MISTRAL), trainer=str(RECIPE)))
    assert alone.get("parallel.dp") == 1            # num_processes, without --devices


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="accelerate's DeepSpeedPlugin needs deepspeed")
def test_the_ds_config_is_accelerates(monkeypatch):
    # accelerate's own DeepSpeedPlugin (what `accelerate launch` builds from the same file's deepspeed_config,
    # then set_mixed_precision) and memform's reading agree on every key that sizes the step
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from accelerate.utils import DeepSpeedPlugin

    from memform.importers import deepspeed
    from memform.importers.draft import Draft

    plugin = DeepSpeedPlugin(zero_stage=3, offload_optimizer_device="cpu", offload_param_device="cpu",
                             zero3_init_flag=True, zero3_save_16bit_model=True)
    plugin.set_mixed_precision("bf16")
    theirs = plugin.deepspeed_config
    ours, devices, _ = deepspeed.accelerate_ds_config(ACCELERATE_Z3, Draft(ACCELERATE_Z3, "deepspeed"))
    assert devices == 1
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                "gradient_clipping", "bf16", "fp16"):
        assert ours[key] == theirs[key], key
    zo, zt = ours["zero_optimization"], theirs["zero_optimization"]
    assert (zo["stage"], zo["offload_optimizer"]["device"], zo["offload_param"]["device"]) == \
        (zt["stage"], zt["offload_optimizer"]["device"], zt["offload_param"]["device"])


def test_an_fsdp_accelerate_config_is_not_deepspeeds(tmp_path):
    path = tmp_path / "fsdp.yaml"
    path.write_text(ACCELERATE_Z3.read_text().replace("distributed_type: DEEPSPEED", "distributed_type: FSDP"))
    proc = memform_in_process("import", "deepspeed", path, "--model", MISTRAL, "--trainer", RECIPE)
    assert proc.returncode == 2 and "field 'distributed_type' is 'FSDP'" in proc.stderr, proc.stderr
