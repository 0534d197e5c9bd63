"""Fine-tuning and offloading mechanisms (issue 30): LoRA adapters over a frozen base (their formulas and
`memform import hf --adapter`), a frozen vision tower, the optimizer step offloaded to the host.

Reference numbers: PEFT's trainable-parameter counts are r·(k + d) per adapted k -> d projection (Hu et al.
2021, §4.1; PEFT print_trainable_parameters), checked here against the shapes of Llama-2-7B and
Llama-3-8B (their released config.json). What the adapters' forward keeps is measured against PEFT
itself in tests/test_frameworks_ground_truth.py (the LoRA rows).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import run_memform as run

import memform
from memform.errors import MemformError
from memform.importers import Options, import_config
from estimate_helpers import numbers  # numbers only: the numeric path (tests/test_numeric.py ties it to sympy's)

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "importers"
LLAMA2 = {"parallel.tp": 1, "parallel.sequence_parallel": False, "parallel.pp": 1, "parallel.dp": 1}


def trainable(est: memform.Estimate, grad_bytes: int = 4) -> int:
    """Parameters with gradients: the stage's gradient bytes over their dtype (one stage, no sharding)."""
    return int(est.stages[0].values["grads"]) // grad_bytes


@pytest.mark.parametrize("targets, rank, expected", [
    # Llama-2-7B (h 4096, f 11008, MHA, 32 layers), r 8 on q_proj and v_proj: 2 · 8 · (4096 + 4096) · 32,
    # the 4,194,304 trainable parameters PEFT reports for this set-up
    ({}, 8, 4_194_304),
    # every projection, r 16: 16 · (4 · 8192 + 2 · (4096 + 11008) + (11008 + 4096)) · 32
    ({k: True for k in ("k_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}, 16, 39_976_960),
])
def test_adapter_parameters_are_r_times_k_plus_d(targets, rank, expected):
    over = {**LLAMA2, "lora.rank": rank, **{f"lora.{k}": v for k, v in targets.items()}}
    est = numbers(ROOT / "configs" / "llama2-7b.yaml", overrides=over)
    full = numbers(ROOT / "configs" / "llama2-7b.yaml", overrides=LLAMA2)
    decoder = [next(g for g in e.stages[0].layers if g.block == "decoder") for e in (est, full)]
    added = int(decoder[0].per_layer_values["param_count"] - decoder[1].per_layer_values["param_count"])
    assert added * decoder[0].count_value == expected
    # the base is frozen: gradients and optimizer states for the adapters only, parameters for both
    assert trainable(est) == expected
    s, f = est.stages[0].values, full.stages[0].values
    assert s["params"] > f["params"] and s["grads"] < f["grads"] / 100 and s["optimizer"] < f["optimizer"] / 100


def test_a_frozen_base_keeps_fewer_activations_and_adapters_on_every_projection_keep_more():
    base = {**LLAMA2, "training.framework": "hf-trainer", "training.precision.params": "bf16",
            "training.precision.activations": "bf16"}
    cfg = ROOT / "configs" / "llama2-7b.yaml"
    full = numbers(cfg, overrides=base).stages[0].values["activations"]
    qv = numbers(cfg, overrides={**base, "lora.rank": 8}).stages[0].values["activations"]
    every = numbers(cfg, overrides={**base, "lora.rank": 8, **{f"lora.{k}": True for k in (
        "k_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}}).stages[0].values["activations"]
    assert qv < every and qv < full


def test_lora_with_tensor_parallelism_is_refused():
    with pytest.raises(MemformError, match="LoRA .* without tensor parallelism"):
        numbers(ROOT / "configs" / "llama3-8b.yaml", overrides={"lora.rank": 8})


def test_import_hf_adapter_sets_the_lora_keys():
    draft = import_config("hf", DATA / "llama3-8b.config.json",
                          Options(adapter=str(DATA / "peft" / "llama3-8b-all-linear.adapter_config.json")))
    lora = draft.config()["lora"]
    assert lora["rank"] == 16 and lora["dropout"] == 0.05
    assert all(lora[k] for k in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    assert not draft.warnings or all("adapter_config" not in w for w in draft.warnings), draft.warnings


@pytest.mark.parametrize("field, value, fragment", [
    ("use_qalora", True, "field 'use_qalora' is true: it trains more than the LoRA adapters"),
    ("modules_to_save", ["lm_head"], "field 'modules_to_save'"),
    ("bias", "all", "field 'bias'"),
    ("target_modules", ["c_attn"], "'c_attn'"),
    ("peft_type", "IA3", "LoRA adapters only"),
])
def test_adapters_memform_would_size_wrongly_are_refused(tmp_path, field, value, fragment):
    import json

    data = json.loads((DATA / "peft" / "llama3-8b-qv.adapter_config.json").read_text())
    data[field] = value
    bad = tmp_path / "adapter_config.json"
    bad.write_text(json.dumps(data))
    proc = run("import", "hf", str(DATA / "llama3-8b.config.json"), "--adapter", str(bad))
    assert proc.returncode == 2, proc.stderr
    assert fragment in proc.stderr and "Traceback" not in proc.stderr


def test_cli_import_with_adapter_then_estimate(tmp_path):
    out = tmp_path / "lora.yaml"
    proc = run("import", "hf", str(DATA / "llama3-8b.config.json"), "--adapter",
               str(DATA / "peft" / "llama3-8b-qv.adapter_config.json"), "--set", "model.seq_length=2048",
               "--set", "training.framework=hf-trainer", "--set", "training.precision.params=bf16", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    est = numbers(out)
    # Llama-3-8B, r 8 on q (4096 -> 4096) and v (4096 -> 1024): 8 · (8192 + 5120) · 32 adapters, fp32
    assert trainable(est) == 3_407_872
    assert est.stages[0].values["grads"] == 3_407_872 * 4
    proc = run("import", "megatron", str(DATA / "llama3-8b.args.txt"), "--adapter", str(out))
    assert proc.returncode == 2 and "--adapter is read by 'memform import hf' only" in proc.stderr


def test_import_dora_adapter_and_its_magnitudes(tmp_path):
    # use_dora: lora.dora (formulas/finetune.mf dora). Llama-3-8B, r 8 on q (4096 outputs) and v (1024): each adapted
    # matrix gains a trained magnitude per output, 32 · (4096 + 1024) values in the adapters' fp32, with gradients and
    # two AdamW moments; each layer keeps, per token, the base GEMMs' outputs and the adapters' outputs (the
    # magnitude's gradient reads both; under lora_dropout 0.05 DoRA recomputes the base output in fp32 from an fp32
    # cast of the weight, which F.linear keeps: 4096·4096 + 1024·4096 values per layer), + three fp32 d-vectors
    # (measured: bench/validate.py --frameworks --only dora, every category within 0.2 % without dropout)
    import json

    data = json.loads((DATA / "peft" / "llama3-8b-qv.adapter_config.json").read_text())
    data["use_dora"] = True
    path = tmp_path / "adapter_config.json"
    path.write_text(json.dumps(data))
    draft = import_config("hf", DATA / "llama3-8b.config.json", Options(adapter=str(path)))
    cfg = draft.config()
    assert cfg["lora"]["dora"] is True
    cfg["model"]["seq_length"] = 2048
    cfg["training"].update({"framework": "hf-trainer", "precision": {"params": "bf16"}})
    dora = numbers(cfg).stages[0]
    cfg["lora"]["dora"] = False
    plain = numbers(cfg).stages[0]
    mags = 32 * (4096 + 1024)
    assert dora.values["grads"] - plain.values["grads"] == 4 * mags
    assert dora.values["optimizer"] - plain.values["optimizer"] == 2 * 4 * mags
    tokens = 2048 * cfg["training"]["micro_batch_size"]
    assert dora.moments["warmup"] - plain.moments["warmup"] == mags * (tokens * (4 + 4) + 3 * 4) + 4 * 32 * (4096 + 1024) * 4096
    with pytest.raises(MemformError, match="lora.dora"):
        numbers(ROOT / "configs" / "llama2-7b.yaml", overrides={"lora.dora": True})


def test_a_frozen_vision_tower_keeps_no_gradients_states_or_activations():
    cfg = ROOT / "configs" / "qwen2-vl-7b.yaml"
    stage = {v: numbers(cfg, overrides={"model.vision.frozen": v}).stages[0] for v in ("none", "encoder", "all")}
    by_block = {g.block: g for g in stage["none"].layers}
    enc = ("vision_patch_embed", "vision_layer")
    def per(blocks, cat):   # the stage's bytes of these blocks (activations: per micro-batch in flight)
        return sum(by_block[b].per_layer_values[cat] * by_block[b].count_value
                   * (by_block[b].inflight_value if cat == "activations" else 1) for b in blocks)
    # the batch's pixels stay on the device for the step, frozen tower or not (vision.mf vision_patch_embed)
    pixels = {g.block: g for g in stage["encoder"].layers}["vision_patch_embed"]
    kept = {"activations": pixels.per_layer_values["activations"] * pixels.inflight_value}
    for cat in ("grads", "optimizer", "activations"):
        assert stage["none"].values[cat] - stage["encoder"].values[cat] == per(enc, cat) - kept.get(cat, 0), cat
        assert stage["encoder"].values[cat] - stage["all"].values[cat] == per(("vision_merger",), cat), cat
    assert stage["all"].values["params"] == stage["none"].values["params"]   # frozen weights are still held


@pytest.mark.parametrize("share", [0.25, 1.0])
def test_optimizer_offload_moves_that_share_of_the_states_to_the_host(share):
    # MemEst's swap_os is share 1 (memest-formulas.md §1.2: "0 if swap_os"); MoE and MindSpore blocks too
    for cfg, over in ((ROOT / "configs" / "llama3-8b.yaml", {}), (ROOT / "configs" / "mixtral-8x7b.yaml", {}),
                      (ROOT / "configs" / "llama3-8b.yaml", {"training.framework": "mindspore"})):
        base = numbers(cfg, overrides=over).stages[0]
        off = numbers(cfg, overrides={**over, "training.optimizer_offload": share}).stages[0]
        states = base.values["optimizer"]
        assert off.values["optimizer"] == pytest.approx((1 - share) * states, rel=1e-9, abs=2)
        assert off.host_bytes - base.host_bytes == pytest.approx(share * states, rel=1e-9, abs=2)


def test_megatron_optimizer_cpu_offload_flags(tmp_path):
    args = (DATA / "llama3-8b.args.txt").read_text() + "\n--optimizer-cpu-offload --optimizer-offload-fraction 0.5\n"
    (tmp_path / "a.txt").write_text(args)
    draft = import_config("megatron", tmp_path / "a.txt", Options())
    assert draft.config()["training"]["optimizer_offload"] == 0.5
    (tmp_path / "b.txt").write_text((DATA / "llama3-8b.args.txt").read_text() + "\n--optimizer-cpu-offload\n")
    assert import_config("megatron", tmp_path / "b.txt", Options()).config()["training"]["optimizer_offload"] == 1.0
    with pytest.raises(MemformError, match="between 0 and 1"):
        numbers(ROOT / "configs" / "llama3-8b.yaml", overrides={"training.optimizer_offload": 1.5})


# What each MLP adapter's forward keeps (PEFT lora/layer.py Linear.forward: lora_B(lora_A(dropout(x)))): lora_B
# is an nn.Linear(r, d), whose backward needs its r-wide input -- lora_A's output -- for its weight gradient
# (PyTorch derivatives.yaml mm: self saved for mat2's gradient): s·b·r elements in the adapter's dtype. With
# the adapters in the activations' dtype and no dropout, lora_A reads x itself, which the up adapter already
# keeps (one storage), so a gate adapter next to it adds only its A output. Llama-2-7B at s 4096, b 1, r 8,
# bf16 adapters: 2 · 4096 · 8 bytes per layer. (issue 35: seed 101's survivor dense.mf mlp `drop n_lora_gu`)
@pytest.mark.parametrize("rank", [8, 64])
def test_each_mlp_adapter_keeps_its_a_output(rank):
    base = {**LLAMA2, "lora.rank": rank, "lora.adapter_dtype": "bf16", "lora.q_proj": False, "lora.v_proj": False,
            "training.precision.activations": "bf16"}
    cfg = ROOT / "configs" / "llama2-7b.yaml"

    def per_layer(**targets):
        est = numbers(cfg, overrides={**base, **{f"lora.{k}": True for k in targets}})
        return next(g for g in est.stages[0].layers if g.block == "decoder").per_layer_values["activations"]
    up = per_layer(up_proj=True)
    assert per_layer(up_proj=True, gate_proj=True) - up == 2 * 4096 * 1 * rank
    # a down adapter keeps its own input, the f-wide activation output that the frozen down_proj does not
    # keep, and its A output
    assert per_layer(gate_proj=True, up_proj=True, down_proj=True) - per_layer(gate_proj=True, up_proj=True) \
        == 2 * 4096 * 1 * (11008 + rank)


@pytest.mark.xfail(strict=True, reason="memform's LoRA decoder does not count the SDPA output the flash kernel keeps "
                   "(the o_proj input: counted only with an o_proj adapter or lora.bnb_keeps_input), and counts the "
                   "first layer's norm input that a frozen embedding leaves unsaved: the two cancel at L = 2, the "
                   "harness's LoRA cases; per layer they do not (needs a first-layer block, not yet in the stacks)")
def test_lora_decoder_layers_save_what_memform_counts_per_layer():
    # bench/lora_layer_saved.py --json: transformers + PEFT, bf16, SDPA, r 8 on q and v, L 4: saved bytes per layer;
    # memform's side is `memform import hf` of that case's config.json and adapter (written out: no transformers here)
    import json

    rec = {r["case"]: r for r in json.loads((ROOT / "bench" / "results" / "lora_layer_saved.json").read_text())}
    measured = rec["hf llama L4 h128 a8/4 lora8[q+v] b2 s256 sdpa bf16"]["measured_per_layer"]
    job = {"formulas": ["dense.mf"], "model": {
        "hidden_size": 128, "num_heads": 8, "num_kv_heads": 4, "num_layers": 4, "ffn_hidden_size": 352,
        "vocab_size": 1024,
        "activation": "swiglu", "norm": "rmsnorm", "bias": False, "dropout": False, "flash_attention": True,
        "tied_embeddings": False, "position_embedding": "rope", "seq_length": 256},
        "parallel": {"dp": 1, "tp": 1, "pp": 1}, "device": {"capacity_gib": 80},
        "training": {"framework": "hf-trainer", "micro_batch_size": 2, "recompute": "none",
                     "precision": {"params": "bf16"}},
        "lora": {"rank": 8, "q_proj": True, "v_proj": True}}
    stage = numbers(job).stages[0]
    per_layer = next(g for g in stage.layers if g.block == "decoder").per_layer_values["activations"]
    assert measured[1:] == [per_layer] * 3 and measured[0] == per_layer
