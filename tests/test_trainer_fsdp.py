"""``memform import hf config.json --trainer training_args.json --devices N`` of a Trainer job with FSDP
(TrainingArguments fsdp / fsdp_config) -> training.framework: hf-fsdp2 (formulas/frameworks/hf-fsdp2.mf), and
the profile against accelerate's own FSDP2 on 2 gloo ranks (memform.validation.frameworks.hf_fsdp; the whole
sweep: ``python bench/validate.py --frameworks --only hf-fsdp2``). Fixture: tests/data/importers/trainer/
README.md (``llama-3.1-8b-fsdp.training_args.json``, written by transformers 5.25's to_json_string)."""

from __future__ import annotations

import importlib.util
import json

import pytest

import memform
from cli_helpers import ROOT, run_memform
from cli_inprocess import memform_in_process
from framework_rows import quick_rows_within_bounds
from memform.importers import Options, import_config

DATA = ROOT / "tests" / "data" / "importers"
ARGS = DATA / "trainer" / "llama-3.1-8b-fsdp.training_args.json"
LLAMA31 = DATA / "hf" / "llama-3.1-8b.config.json"
MISTRAL = DATA / "hf" / "mistral-7b-v0.1.trimmed.config.json"


def imported(args=ARGS, config=LLAMA31, devices=8, **kw):
    draft = import_config("hf", config, Options(trainer=str(args), devices=devices, **kw))
    assert draft.load_error is None, draft.load_error
    return draft


def changed(tmp_path, **change):
    data = {**json.loads(ARGS.read_text()), **change}
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps(data))
    return path


def test_the_fsdp_job_maps_onto_hf_fsdp2():
    # transformers 5.25 _process_fsdp_args: fsdp "full_shard auto_wrap" -> reshard_after_forward true;
    # fsdp_config activation_checkpointing -> accelerate's checkpoint_wrapper per decoder layer; bf16 with
    # FSDP2 -> fp32 shards (fsdp2_prepare_model's upcast) gathered in bf16 (MixedPrecisionPolicy), no autocast cast
    draft = imported()
    got = {k: draft.get(k) for k in ("training.framework", "fsdp2.reshard_after_forward", "fsdp2.cpu_offload",
                                     "training.recompute", "training.precision.params",
                                     "training.precision.master_weights", "training.precision.optimizer",
                                     "hf_trainer.amp", "parallel.dp", "training.micro_batch_size",
                                     "training.num_micro_batches", "parallel.grad_accumulation_shard")}
    assert got == {"training.framework": "hf-fsdp2", "fsdp2.reshard_after_forward": True, "fsdp2.cpu_offload": False,
                   "training.recompute": "full", "training.precision.params": "bf16",
                   "training.precision.master_weights": True, "training.precision.optimizer": "fp32",
                   "hf_trainer.amp": "none", "parallel.dp": 8, "training.micro_batch_size": 2,
                   "training.num_micro_batches": 8, "parallel.grad_accumulation_shard": False}


def test_the_shards_are_one_eighth_on_eight_ranks():
    # the mechanism, not a fitted number: fp32 shards, sharded gradients and AdamW moments over 8 ranks are the
    # single rank's bytes / 8, beside the [final norm, lm_head] unit accelerate keeps gathered in bf16 from
    # forward to backward (fsdp2_prepare_model's tail unit, reshard_after_forward=False) on every rank, and
    # beside the unsharded bf16 gradients the 8 accumulation steps keep under no_sync on every rank
    one, eight = (memform.estimate(imported(devices=n).config()).stages[0].values for n in (1, 8))
    n = 8_030_261_248                           # Llama-3.1-8B's parameters (tests/test_import_hf_models.py)
    head = 128256 * 4096 + 4096                 # lm_head + final norm (its config.json: vocab 128256, hidden 4096)
    assert (one["grads"], eight["grads"]) == (4 * n + 2 * n, 4 * n // 8 + 2 * n)
    assert (one["optimizer"], eight["optimizer"]) == (8 * n, 8 * n // 8)
    assert (one["params"], eight["params"]) == (4 * n + 2 * head, 4 * n // 8 + 2 * head)


def test_sync_each_batch_keeps_the_gradients_sharded(tmp_path):
    # accelerator_config gradient_accumulation_kwargs sync_each_batch: the Trainer reduce-scatters every
    # micro-batch (trainer.py _inner_training_loop: no no_sync context)
    accel = {**json.loads(ARGS.read_text())["accelerator_config"],
             "gradient_accumulation_kwargs": {"sync_each_batch": True}}
    draft = imported(changed(tmp_path, accelerator_config=accel))
    assert draft.get("parallel.grad_accumulation_shard") is True
    grads = memform.estimate(draft.config()).stages[0].values["grads"]
    assert grads == 4 * 8_030_261_248 // 8


@pytest.mark.parametrize("change, legacy, raf, offload", [
    ({"fsdp": "shard_grad_op auto_wrap"}, True, False, False),
    ({"fsdp": "full_shard offload auto_wrap"}, True, True, True),
    ({"fsdp": ["shard_grad_op"]}, True, False, False),
])
def test_legacy_fsdp_words(tmp_path, change, legacy, raf, offload):
    # _apply_legacy_fsdp_to_config: shard_grad_op -> reshard_after_forward false, offload -> cpu_offload; the
    # fixture's fsdp_config says reshard_after_forward true, which would win (setdefault): drop it
    data = json.loads(ARGS.read_text())
    conf = {k: v for k, v in data["fsdp_config"].items() if k != "reshard_after_forward"}
    draft = imported(changed(tmp_path, **change, fsdp_config=conf))
    assert (draft.get("fsdp2.reshard_after_forward"), draft.get("fsdp2.cpu_offload")) == (raf, offload)


def test_fsdp_config_as_a_file_with_accelerate_prefixes(tmp_path):
    (tmp_path / "fsdp.json").write_text(json.dumps({"fsdp_version": 2, "fsdp_reshard_after_forward": False,
                                                    "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
                                                    "fsdp_offload_params": True}))
    draft = imported(changed(tmp_path, fsdp_config="fsdp.json"))
    assert draft.get("fsdp2.reshard_after_forward") is False and draft.get("training.recompute") == "none"
    assert draft.get("fsdp2.cpu_offload") is False      # offload_params is accelerate's spelling: the Trainer drops it
    assert any("offload_params: not read by the Trainer" in w for w in draft.warnings)


REFUSED = [
    ({"fsdp_config": {"version": 3}}, "field 'fsdp_config.version' is 3"),
    ({"fsdp": "hybrid_shard auto_wrap"}, "hybrid_shard / no_shard are FSDP1's"),
    ({"fsdp_config": {"auto_wrap_policy": "SIZE_BASED_WRAP"}}, "'fsdp_config.auto_wrap_policy' is 'SIZE_BASED_WRAP'"),
    ({"fsdp_config": {"transformer_layer_cls_to_wrap": ["LlamaAttention"]}}, "transformer_layer_cls_to_wrap"),
    ({"optim": "adamw_8bit"}, "field 'optim' is 'adamw_8bit' with fsdp"),
    ({"activation_checkpointing": True, "gradient_checkpointing": True}, "are both true: the Trainer refuses"),
    ({"use_cache": True}, "field 'use_cache' is true with fsdp_config activation_checkpointing"),
    ({"fsdp_config": {"xla": True}}, "field 'fsdp_config.xla' is true"),
    ({"fsdp_config": {"my_knob": 1}}, "'fsdp_config.my_knob'"),
]


@pytest.mark.parametrize("change, fragment", REFUSED, ids=[str(r[0]) for r in REFUSED])
def test_what_fsdp2_does_otherwise_is_refused(tmp_path, change, fragment):
    data = json.loads(ARGS.read_text())
    if "fsdp_config" in change:
        change = {**change, "fsdp_config": {**data["fsdp_config"], **change["fsdp_config"]}}
    proc = memform_in_process("import", "hf", LLAMA31, "--trainer", changed(tmp_path, **change), "--devices", "8")
    assert proc.returncode == 2, proc.stdout
    assert fragment in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_fsdp_with_peft_or_a_tied_model_is_refused(tmp_path):
    with pytest.raises(memform.MemformError, match="LoRA adapters"):
        import_config("hf", LLAMA31, Options(trainer=str(ARGS), devices=8,
                                             adapter=str(DATA / "peft" / "llama3-8b-qv.adapter_config.json")))
    cfg = {**json.loads(MISTRAL.read_text()), "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(memform.MemformError, match="tied embeddings"):
        import_config("hf", tmp_path / "config.json", Options(trainer=str(ARGS), devices=8))


def test_the_console_script_imports_and_estimates_an_fsdp_job(tmp_path):
    out = tmp_path / "job.yaml"
    proc = run_memform("import", "hf", LLAMA31, "--trainer", ARGS, "--devices", "8", "-o", out)
    assert proc.returncode == 0, proc.stderr
    proc = run_memform("estimate", out)
    assert proc.returncode == 0, proc.stderr
    assert "framework=hf-fsdp2" in proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="accelerate not installed")
def test_accelerates_fsdp2_measured_on_two_ranks():
    # full_shard in fp32 on 2 gloo ranks: accelerate's fsdp2_prepare_model over transformers' Llama, every
    # category within its recorded bound (bench/validate.py --frameworks --only hf-fsdp2 --record)
    from memform.validation.frameworks import hf_fsdp

    quick_rows_within_bounds(hf_fsdp)
