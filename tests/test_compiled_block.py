"""torch.compile'd transformer blocks under the fsdp2 profile (formulas/frameworks/fsdp2.mf compile_mode, the key
model.compile: blocks). The measured bytes are what one compiled Llama block saves for its backward, read by
``PYTHONPATH=src python bench/compiled_block.py`` (torch 2.13 CPU, Inductor's partitioner; torchtitan 9dec370's
block with SDPA over the kv heads): storages saved through autograd, the block's parameters excluded."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from cli_helpers import ROOT
from estimate_helpers import numbers


def _layer(b, s, h, heads, kv, ffn, dtype, ac, compiled):  # noqa: ANN001, ANN202
    """memform's per-layer activations of the decoder (as bench/compiled_block.py memform_layer)."""
    precision = ({"params": "bf16", "grads": "fp32", "optimizer": "fp32", "activations": "bf16", "master_weights": True}
                 if dtype == "bf16" else {"params": "fp32", "grads": "fp32", "optimizer": "fp32", "activations": "fp32"})
    cfg = {"name": "compiled-block",
           "model": {"hidden_size": h, "num_heads": heads, "num_kv_heads": kv, "ffn_hidden_size": ffn, "num_layers": 2,
                     "vocab_size": 512, "seq_length": s, "activation": "swiglu", "norm": "rmsnorm", "bias": False,
                     "dropout": False, "flash_attention": True, "position_embedding": "rope", "swiglu_impl": "eager",
                     "cross_entropy": "eager", "compile": "blocks" if compiled else "none"},
           "parallel": {"dp": 1, "tp": 1, "pp": 1},
           "training": {"micro_batch_size": b, "num_micro_batches": 1, "recompute": {"op": "selective"}.get(ac, ac),
                        "precision": precision, "framework": "fsdp2"},
           "fsdp2": {"param_dtype": dtype, "reduce_dtype": "fp32", "selective_ac": "op"}}
    return next(int(g.per_layer_values["activations"]) for g in numbers(cfg).stages[0].layers if g.block == "decoder")


# (b, s, h, heads, kv heads, ffn, dtype, AC) and the bytes the compiled block saved (bench/compiled_block.py)
MEASURED = [
    ((2, 256, 256, 4, 2, 688, "bf16", "none"), 3_960_832),
    ((2, 256, 256, 4, 2, 688, "bf16", "op"), 1_630_208),
    ((2, 256, 512, 8, 2, 1376, "bf16", "none"), 7_655_424),
    ((2, 256, 512, 8, 2, 1376, "bf16", "op"), 3_129_344),
    ((2, 256, 256, 4, 1, 688, "bf16", "op"), 1_564_672),
    ((2, 256, 256, 4, 2, 1024, "bf16", "none"), 4_993_024),
    ((2, 256, 256, 4, 2, 688, "fp32", "none"), 7_909_376),
    ((2, 256, 256, 4, 2, 688, "fp32", "op"), 3_252_224),
]


@pytest.mark.parametrize("shape, measured", MEASURED, ids=[" ".join(map(str, m[0])) for m in MEASURED])
def test_compiled_block_saves_what_the_partitioner_saved(shape, measured):
    b, s, h, heads, kv, ffn, dtype, ac = shape
    got = _layer(*shape, compiled=True)
    if ac == "op":
        assert got == measured       # op SAC: the MUST_SAVE outputs the backward reads, and the block input
    else:
        # no AC: the two norms' fp32 rstd (4 bytes a token each) are saved and not counted, as for eager blocks
        assert measured - got == 2 * 4 * b * s
    # against the eager block: no silu output (an f-wide tensor); under op SAC no w2 output (h wide)
    width = {"none": ffn, "op": h}[ac]
    assert _layer(*shape, compiled=False) - got == b * s * width * {"bf16": 2, "fp32": 4}[dtype]


def test_compiled_full_ac_keeps_the_block_input():
    # full AC: the checkpoint's input (and on the CPU the RNG state, 5,056 bytes, which a CUDA philox seed is not)
    assert _layer(2, 256, 256, 4, 2, 688, "bf16", "full", compiled=True) == 2 * 256 * 256 * 2


def test_model_compile_is_refused_with_an_unknown_value(tmp_path):
    from memform.errors import MemformError
    with pytest.raises(MemformError, match="model.compile"):
        numbers({"name": "x", "model": {"hidden_size": 64, "num_heads": 4, "ffn_hidden_size": 176, "num_layers": 1,
                                        "vocab_size": 128, "seq_length": 32, "compile": "everything"},
                 "training": {"framework": "fsdp2", "micro_batch_size": 1}})


@pytest.mark.slow
def test_bench_compiled_block_measures_the_base_shape():
    # the measurement itself (two torch.compile runs of the block, ~20 s): the base shape's rows above
    spec = importlib.util.spec_from_file_location("compiled_block", ROOT / "bench" / "compiled_block.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules["compiled_block"] = bench     # its dataclasses look their module up
    spec.loader.exec_module(bench)
    from dataclasses import replace
    assert bench.saved_bytes(replace(bench.BASE, ac="none"), True) == MEASURED[0][1]
    assert bench.saved_bytes(replace(bench.BASE, ac="op"), True) == MEASURED[1][1]


def test_import_torchtitan_compiled_moe_blocks_warn(tmp_path):
    # an MoE / MLA model's compiled blocks: model.compile blocks (its dense blocks), the MoE and MLA ones counted eager
    from memform.importers import Options, import_config
    path = tmp_path / "job.toml"
    path.write_text("[model]\nname = \"deepseek_v3\"\nflavor = \"16B\"\n[compile]\nenable = true\n")
    draft = import_config("torchtitan", path, Options(devices=8))
    assert draft.get("model.compile") == "blocks"
    assert any("MoE and MLA blocks as eager ones" in w for w in draft.warnings)


def test_compiled_blocks_refused_under_the_trainers_fsdp2():
    # the Trainer's torch_compile compiles the whole model (accelerate's TorchDynamoPlugin), not block by block
    from memform.errors import MemformError
    with pytest.raises(MemformError, match="per-block torch.compile"):
        numbers({"name": "x", "model": {"hidden_size": 64, "num_heads": 4, "ffn_hidden_size": 176, "num_layers": 1,
                                        "vocab_size": 128, "seq_length": 32, "compile": "blocks"},
                 "parallel": {"dp": 2}, "training": {"framework": "hf-fsdp2", "micro_batch_size": 1}})
