"""The fsdp2 profile (formulas/frameworks/fsdp2.mf), `memform import torchtitan` and the FSDP2 validation.

Expected numbers come from the sources, computed here independently of the formula files: parameter
counts enumerated tensor by tensor from the model definitions (Llama-2: Touvron et al. 2023 Table 1 /
meta-llama/Llama-2-7b-hf, 6,738,415,616 parameters; Llama 3: Dubey et al. 2024 Table 3), bytes per
parameter from torch's fully_shard (torch/distributed/fsdp/_fully_shard/: _fsdp_param.py FSDPParam,
_fsdp_collectives.py foreach_reduce, _fsdp_api.py MixedPrecisionPolicy / CPUOffloadPolicy), the tensors
torchtitan's op-level SAC saves (torchtitan/distributed/activation_checkpoint.py), torchtitan's published
memory (benchmarks/llama3_h100_202412_torchtitan.md) and real FSDP2 steps on CPU ranks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memform.engine.binding import coerce
from memform.errors import MemformError
from memform.importers import Options, import_config
from memform.lang.parser import parse_text
from memform.lang.printer import print_file

from cli_helpers import ROOT, run_memform
from cli_inprocess import memform_in_process  # memform.cli.main in this process (same output)
from estimate_helpers import numbers  # numbers only: the numeric path (tests/test_numeric.py ties it to sympy's)

LLAMA2 = ROOT / "configs" / "llama2-7b.yaml"
FIXTURES = ROOT / "tests" / "fixtures" / "torchtitan"
GIB = 2 ** 30

# ---- Llama-2-7B, tensor by tensor (HF meta-llama/Llama-2-7b-hf: 6,738,415,616 parameters) ----------------
H, F, V, L = 4096, 11008, 32000, 32
LAYER = 4 * H * H + 3 * H * F + 2 * H          # q, k, v, o; gate, up, down; two RMSNorm weights
EMBED = V * H
HEAD = V * H + H                               # lm_head + final RMSNorm (torchtitan's [norm, output] unit)
PSI = EMBED + L * LAYER + HEAD
assert PSI == 6_738_415_616


def llama2(n: int, **extra) -> dict:
    """llama2-7b.yaml on n data-parallel ranks, one stage, no TP: every parameter on every rank."""
    return {"parallel.pp": 1, "parallel.tp": 1, "parallel.sequence_parallel": False, "parallel.dp": n,
            "training.global_batch_size": n, **extra}


def static(stage) -> int:
    return stage.values["params"] + stage.values["grads"] + stage.values["optimizer"]


# ---- 1. static bytes per parameter: FSDP2 16Ψ/N vs memform's (Megatron) ZeRO-3 18Ψ/N ---------------------
# FSDP2 keeps the fp32 shard (4 B, no separate master: MixedPrecisionPolicy docstring), the fp32 sharded
# gradient (4 B: foreach_reduce casts the reduce-scatter output to orig_dtype) and AdamW's two fp32
# moments (8 B); Megatron with ZeRO-3: bf16 shard 2 + fp32 main grad 4 + fp32 master and moments 12
# (megatron/training/theoretical_memory_usage.py: 18 bytes per parameter, all sharded with ZeRO-3).
@pytest.mark.parametrize("n", [8, 64])
@pytest.mark.parametrize("framework, bytes_per_param", [("fsdp2", 16), ("megatron", 18)])
def test_static_bytes_per_parameter_at_full_sharding(n, framework, bytes_per_param):
    # the head resharded too, so that nothing unsharded is kept (tested below)
    est = numbers(LLAMA2, llama2(n, **{"training.framework": framework, "parallel.zero": 3,
                                                "fsdp2.reshard_head_after_forward": True}
                                          if framework == "fsdp2" else {"parallel.zero": 3}))
    assert static(est.stages[0]) == bytes_per_param * PSI // n


def test_fsdp2_against_the_default_profile_in_compare():
    # `memform compare`: B (fsdp2) - A (megatron, ZeRO-3) = (16 - 18) Ψ/N of static bytes, by category
    # params +2Ψ/N (fp32 shard vs bf16), grads 0, optimizer -4Ψ/N (no separate fp32 master)
    n = 8
    sets = [f"{k}={json.dumps(v)}" for k, v in llama2(n, **{"parallel.zero": 3}).items()]
    args = [a for s in sets for a in ("--set", s)]
    r = memform_in_process("compare", LLAMA2, *args, "--set-b", "training.framework=fsdp2",
                    "--set-b", "fsdp2.reshard_head_after_forward=true", "--json")
    assert r.returncode == 0, r.stderr
    delta = json.loads(r.stdout)["stages"][0]["delta"]
    assert (delta["params"], delta["grads"], delta["optimizer"]) == (2 * PSI // n, 0, -4 * PSI // n)


def test_the_head_unit_stays_gathered_from_forward_to_backward():
    # torchtitan apply_fsdp: fully_shard([norm, output], reshard_after_forward=(policy == "always")):
    # by default the head's unsharded bf16 parameters (2 B each) are kept next to their shards
    base = numbers(LLAMA2, llama2(8, **{"training.framework": "fsdp2",
                                                 "fsdp2.reshard_head_after_forward": True}))
    kept = numbers(LLAMA2, llama2(8, **{"training.framework": "fsdp2"}))
    assert kept.stages[0].values["params"] - base.stages[0].values["params"] == 2 * HEAD


# ---- 2. reshard_after_forward: true, false or the world size to reshard to ------------------------------
# _fsdp_init.py _get_post_forward_mesh_info: an int k reshards to a k-rank mesh (k == shard size is
# true); FSDPParam.to_sharded_post_forward keeps numel / k of the bf16 all-gather output; false keeps it all.
# Blocks and the embedding follow it; the head unit has its own setting (resharded here).
@pytest.mark.parametrize("raf, kept_fraction", [(True, 0), (False, 1), (2, 1 / 2), (4, 1 / 4), (8, 0)])
def test_reshard_after_forward_keeps_a_fraction_of_the_unsharded_parameters(raf, kept_fraction):
    n = 8
    over = {"training.framework": "fsdp2", "fsdp2.reshard_head_after_forward": True}
    ref = numbers(LLAMA2, llama2(n, **over, **{"fsdp2.reshard_after_forward": True})).stages[0]
    est = numbers(LLAMA2, llama2(n, **over, **{"fsdp2.reshard_after_forward": raf})).stages[0]
    assert est.values["params"] - ref.values["params"] == int(kept_fraction * 2 * (EMBED + L * LAYER))


@pytest.mark.parametrize("value, needle", [
    (3, "an integer must divide the FSDP shard group size"),     # 8 % 3 != 0: ValueError in torch
    (16, "an integer must divide the FSDP shard group size"),    # larger than the 8-rank shard group
    (1, "must be true, false or an integer in 2..1048576"),      # torch's 1 means false: write false
    ("yes please", "must be true, false or an integer"),
])
def test_bad_reshard_after_forward_is_an_error_naming_the_key(value, needle):
    sets = [f"{k}={json.dumps(v)}" for k, v in llama2(8, **{"training.framework": "fsdp2"}).items()]
    r = memform_in_process("estimate", LLAMA2, *[a for s in sets for a in ("--set", s)],
                    "--set", f"fsdp2.reshard_after_forward={value}")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "fsdp2.reshard_after_forward" in r.stderr and needle in r.stderr


@pytest.mark.parametrize("extra, key, needle", [
    # FSDPParam.to_sharded_post_forward: NotImplementedError for DTensor (tensor-parallel) parameters
    ({"parallel.tp": 2, "fsdp2.reshard_after_forward": 2}, "fsdp2.reshard_after_forward", "tensor parallelism"),
    # HSDP's 2-D mesh: dp_replicate × dp_shard = the data-parallel ranks
    ({"parallel.zero_shard_max": 3}, "parallel.zero_shard_max", "must divide dp × cp"),
    # torch.optim.AdamW keeps exp_avg / exp_avg_sq in the (fp32) sharded parameters' dtype
    ({"training.precision.optimizer": "bf16"}, "training.precision.optimizer", "AdamW keeps its moments"),
    ({"fsdp2.selective_ac": "layer"}, "fsdp2.selective_ac", "must be one of 'op', 'core'"),
    ({"fsdp2.param_dtype": "int4"}, "fsdp2.param_dtype", "must be a dtype name"),
])
def test_inconsistent_settings_are_errors_naming_the_key(extra, key, needle):
    sets = [f"{k}={json.dumps(v)}" for k, v in llama2(8, **{"training.framework": "fsdp2", **extra}).items()]
    r = memform_in_process("estimate", LLAMA2, *[a for s in sets for a in ("--set", s)])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert key in r.stderr and needle in r.stderr


def test_parallel_zero_is_superseded_full_sharding_is_implied():
    # fully_shard has no ZeRO-1/2: whatever parallel.zero / distributed_optimizer say, all three are sharded
    over = llama2(8, **{"training.framework": "fsdp2", "fsdp2.reshard_head_after_forward": True})
    values = {static(numbers(LLAMA2, {**over, "parallel.zero": z}).stages[0]) for z in (0, 1, 2, 3)}
    assert values == {16 * PSI // 8}


# ---- 3. CPU offload and HSDP -----------------------------------------------------------------------------
def test_cpu_offload_moves_shards_gradients_and_optimizer_states_to_the_host():
    # CPUOffloadPolicy: sharded parameters, gradients (copied device-to-host in foreach_reduce) and the
    # optimizer step on the CPU; the device keeps the unsharded working set (the kept head, 2 B/param)
    est = numbers(LLAMA2, llama2(8, **{"training.framework": "fsdp2", "fsdp2.cpu_offload": True}))
    s = est.stages[0]
    assert (s.values["params"], s.values["grads"], s.values["optimizer"]) == (2 * HEAD, 0, 0)
    assert s.host_bytes == 16 * PSI // 8


def test_hsdp_shards_within_the_group_and_replicates_across():
    # fully_shard on a 2-D mesh (dp_replicate, dp_shard): parameters sharded over dp_shard = 8 of 16 ranks
    over = {"training.framework": "fsdp2", "fsdp2.reshard_head_after_forward": True, "parallel.zero_shard_max": 8}
    assert static(numbers(LLAMA2, llama2(16, **over)).stages[0]) == 16 * PSI // 8


# ---- 4. torchtitan's activation checkpointing -----------------------------------------------------------
def _bytes(*tensors) -> int:
    total = 0
    for shape, itemsize in tensors:
        n = itemsize
        for d in shape:
            n *= d
        total += n
    return total


def _op_sac_saved(b, s, t, sp):
    """The tensors torchtitan's op-level SAC keeps per Llama-3-8B block (activation_checkpoint.py: every
    other mm -- wq, wv, w1, w2 in forward order wq wk wv wo w1 w3 w2 (llama3/model.py) -- and the SDPA
    outputs), with TP: colwise wq/wv/w1 outputs split t ways, the row-parallel w2's partial sums full
    width, and with SP the saved reduce_scatter_tensor outputs of wo and w2 (parallelize.py apply_tp)."""
    h, kv, f, a, dh = 4096, 1024, 14336, 32, 128
    seq_split = s // t if sp else s
    tensors = [((b, seq_split, h), 2),                  # the checkpoint's input: the block input
               ((b * s, h // t), 2), ((b * s, kv // t), 2),  # wq, wv outputs
               ((b, a // t, s, dh), 2), ((b, a // t, s), 4),  # SDPA output, fp32 log-sum-exp
               ((b * s, f // t), 2), ((b * s, h), 2)]        # w1 output, w2 output (partial sums with TP)
    if sp and t > 1:
        tensors += [((b, s // t, h), 2), ((b, s // t, h), 2)]  # reduce-scatter outputs of wo and w2
    return _bytes(*tensors)


@pytest.mark.parametrize("b, s, t", [(1, 8192, 1), (2, 8192, 1), (1, 8192, 2), (1, 4096, 8)])
def test_op_level_sac_keeps_what_the_policy_saves(b, s, t):
    draft = import_config("torchtitan", FIXTURES / "llama3_8b.toml", Options(devices=8))
    # the import's global batch is local_batch_size × dp (torchtitan's global_batch_size -1): b × 8
    est = numbers(draft.config(), {"training.micro_batch_size": b, "model.seq_length": s, "parallel.tp": t,
                                   "parallel.sequence_parallel": t > 1, "parallel.devices": 8 * t,
                                   "training.global_batch_size": 8 * b})
    layer = next(g for g in est.stages[0].layers if g.block == "decoder")
    assert layer.mode == "selective"
    assert layer.per_layer_values["activations"] == _op_sac_saved(b, s, t, sp=t > 1)


def test_selective_every_n_layers_checkpoints_every_nth_block_fully():
    # _apply_layer_sac: a counter from 1 over the blocks; block k is wrapped in full AC when k % N == 0
    text = (FIXTURES / "llama3_8b.toml").read_text().replace("selective_ac_option = \"op\"", "selective_ac_option = \"3\"")
    draft = import_config("torchtitan", _write(text), Options(devices=8))
    modes = draft.get("training.recompute_layers")
    assert [i for i, m in enumerate(modes) if m == "full"] == [2, 5, 8, 11, 14, 17, 20, 23, 26, 29]
    assert set(modes) == {"none", "full"}


def _write(text: str, name: str = "train.toml") -> Path:
    import tempfile
    folder = Path(tempfile.mkdtemp(prefix="memform-titan-"))
    path = folder / name
    path.write_text(text)
    return path


# ---- 5. torchtitan's published Llama-3.1-8B memory ------------------------------------------------------
# benchmarks/llama3_h100_202412_torchtitan.md (torchtitan 9dec370, torch 1963fc8, Dec 2024), H100 96 GB,
# train_configs/llama3_8b.toml: seq_len 8192, selective op AC, bf16 params / fp32 reduce, no compile, no
# float8 ("FSDP" rows). "Memory(GiB)" is torchtitan's max_reserved_gib (components/metrics.py
# DeviceMemoryMonitor: the caching allocator's reserved_bytes.all.peak -- reserved, not allocated, and
# without the CUDA context). memform's runtime category is left at 0 (device.context_mib 0: reserved
# excludes the context; device.fragmentation 0: the allocator's reserve is what this comparison shows).
# Tolerance: memform counts allocated tensors; reserved >= allocated, so the estimate must not exceed the
# figure (err <= 0); the allocator's reserve (FSDP2's all-gather / reduce-scatter streams keep freed blocks
# per stream), kernel workspaces allocated through it, padding and the 4-byte AdamW step tensors are not
# modelled: at most 20 % below.
PUBLISHED = [
    # (table, GPUs, local batch, reported GiB)
    ("Table 1: FSDP, 8 GPUs", 8, 2, 82.4),
    ("Table 3: FSDP, 128 GPUs", 128, 2, 67.0),
]


@pytest.mark.parametrize("table, gpus, batch, reported", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_torchtitan_published_llama31_8b_memory(table, gpus, batch, reported):
    draft = import_config("torchtitan", FIXTURES / "llama3_8b_2024.toml",
                          Options(overrides={"parallel.dp": gpus, "training.micro_batch_size": batch}))
    est = numbers(draft.config(), {"device.context_mib": 0, "device.fragmentation": 0})
    error = est.peak_bytes / GIB / reported - 1
    assert -0.20 <= error <= 0.0, f"{table}: memform {est.peak_bytes / GIB:.2f} GiB vs {reported} GiB ({error:+.1%})"


# The same published figures against what memform says the caching allocator *reserves* (memform.allocator:
# the step's allocations, built from the estimate's per-layer figures, replayed over two steps through a
# model of c10/cuda/CUDACachingAllocator.cpp with PyTorch's defaults). Nothing in that model was fitted to
# these rows. Measured: 8 GPUs +3.4 %, 128 GPUs +5.5 % (-0.1 % and +7.0 % before the layers listed their real
# tensor sizes, formulas/dense.mf weight_tensors / act_tensor). Tolerance: 10 % either way (the reserve is the
# outcome of a replay whose tensors memform only knows per layer: docs in memform/allocator/sequence.py).
@pytest.mark.parametrize("table, gpus, batch, reported", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_torchtitan_published_llama31_8b_reserved_memory(table, gpus, batch, reported):
    draft = import_config("torchtitan", FIXTURES / "llama3_8b_2024.toml",
                          Options(overrides={"parallel.dp": gpus, "training.micro_batch_size": batch}))
    est = numbers(draft.config(), {"device.context_mib": 0, "device.fragmentation": 0})
    stage = est.stages[0]
    assert stage.reserve is not None and stage.reserved_bytes > stage.peak_bytes
    error = stage.reserved_bytes / GIB / reported - 1
    assert abs(error) <= 0.10, f"{table}: memform reserves {stage.reserved_bytes / GIB:.2f} GiB vs {reported} GiB ({error:+.1%})"


# ---- 6. memform import torchtitan ----------------------------------------------------------------------
# Llama 3 shapes: Dubey et al. 2024 Table 3 (8B: 4096 / 32 layers / 32 heads / 8 KV heads / FFN 14,336;
# 70B: 8192 / 80 / 64 / 8 / 28,672; 405B: 16384 / 126 / 128 / 8 / 53,248; vocabulary 128,256)
IMPORTS = [
    ("llama3_8b.toml", 64, {"model.hidden_size": 4096, "model.num_layers": 32, "model.num_heads": 32,
                            "model.num_kv_heads": 8, "model.ffn_hidden_size": 14336, "model.vocab_size": 128256,
                            "model.seq_length": 8192, "parallel.dp": 64, "parallel.tp": 1,
                            "training.micro_batch_size": 1, "training.recompute": "selective",
                            "fsdp2.selective_ac": "op", "fsdp2.reshard_after_forward": True,
                            "fsdp2.reshard_head_after_forward": False, "training.framework": "fsdp2",
                            "model.swiglu_impl": "eager", "model.cross_entropy": "eager"}),
    ("llama3_70b.toml", 64, {"model.hidden_size": 8192, "model.num_layers": 80, "model.ffn_hidden_size": 28672,
                             "parallel.tp": 8, "parallel.dp": 8, "parallel.sequence_parallel": True,
                             "training.micro_batch_size": 8, "training.recompute": "full"}),
    # the December 2024 shape: degrees under [training], [experimental] pipeline degree, `batch_size`
    ("llama3_8b_2024.toml", None, {"parallel.dp": 8, "parallel.pp": 1, "training.micro_batch_size": 2,
                                   "training.recompute": "selective", "fsdp2.selective_ac": "op"}),
    # HSDP 2 × 16 over 32 data-parallel ranks (64 GPUs / pp 2), looped pipeline, every-2nd-block AC,
    # fsdp_reshard_after_forward never, CPU offload; gradient accumulation 64 / (2 × 16) = 2 micro-batches
    ("hsdp_pp.toml", 64, {"parallel.dp": 32, "parallel.zero_shard_max": 16, "parallel.pp": 2,
                          "parallel.pp_schedule": "interleaved", "parallel.vpp": 2, "training.micro_batch_size": 2,
                          "training.global_batch_size": 64, "model.seq_length": 4096,
                          "fsdp2.reshard_after_forward": False, "fsdp2.cpu_offload": True,
                          "training.recompute": "none"}),
]


@pytest.mark.parametrize("fixture, devices, expected", IMPORTS, ids=[i[0] for i in IMPORTS])
def test_import_torchtitan(fixture, devices, expected):
    draft = import_config("torchtitan", FIXTURES / fixture, Options(devices=devices))
    got = {k: draft.get(k) for k in expected}
    assert got == expected
    est = numbers(draft.config())   # the imported config loads and estimates
    assert est.model.structure.framework == "fsdp2" and est.peak_bytes > 0


def test_import_hsdp_pipeline_recompute_pattern():
    draft = import_config("torchtitan", FIXTURES / "hsdp_pp.toml", Options(devices=64))
    # 32 blocks, 2 ranks × 2 stages of 8 blocks; each rank counts its own blocks, chunk after chunk:
    # rank 0 holds blocks 0-7 and 16-23 (counts 1-16), rank 1 blocks 8-15 and 24-31
    modes = draft.get("training.recompute_layers")
    assert [i for i, m in enumerate(modes) if m == "full"] == [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27,
                                                              29, 31]


def test_import_cli_maps_float8_training(tmp_path):
    # the 405B recipe's converters = "float8" with [float8] enable_fsdp_float8_all_gather, filter_fqns "output"
    # (torchao Float8Linear, tensorwise by default): fsdp2.float8 / fsdp2.float8_all_gather, and it estimates
    out = tmp_path / "titan.yaml"
    r = run_memform("import", "torchtitan", FIXTURES / "llama3_405b.toml", "--devices", "128", "-o", out)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    text = out.read_text()
    assert "float8: tensorwise" in text and "float8_all_gather: true" in text
    assert run_memform("estimate", out).returncode == 0


def test_import_cli_writes_a_config_that_estimates(tmp_path):
    out = tmp_path / "titan.yaml"
    r = run_memform("import", "torchtitan", FIXTURES / "llama3_70b.toml", "--devices", "64", "-o", out)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "framework: fsdp2" in text and "# default:" in text
    e = run_memform("estimate", out)
    assert e.returncode == 0, e.stderr


@pytest.mark.parametrize("text, needle", [
    ("[model]\nname = \"llama3\"\nflavor = \"9B\"\n", "field 'model.flavor' is '9B'"),
    ("[model]\nname = \"gpt5\"\n", "field 'model.name' is 'gpt5'"),
    ("[model\nname = 1\n", "TOML syntax error"),
    ("[model]\nflavor = \"8B\"\n[activation_checkpoint]\nmode = \"memory_budget\"\n",
     "field 'activation_checkpoint.mode'"),
    ("[model]\nflavor = \"8B\"\n[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"x\"\n",
     "field 'activation_checkpoint.selective_ac_option'"),
    ("[model]\nflavor = \"8B\"\n[parallelism]\ndata_parallel_shard_degree = 0\n",
     "field 'parallelism.data_parallel_shard_degree'"),
    ("[model]\nflavor = \"8B\"\n[parallelism]\nfsdp_reshard_after_forward = \"sometimes\"\n",
     "field 'parallelism.fsdp_reshard_after_forward'"),
    ("[model]\nflavor = \"8B\"\n[training]\nmixed_precision_param = \"float64x\"\n",
     "field 'training.mixed_precision_param'"),
    ("model = 3\n", "field 'model' must be a [section] table"),
])
def test_import_errors_name_the_file_and_field(tmp_path, text, needle):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    r = run_memform("import", "torchtitan", path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert needle in r.stderr and str(path.name) in r.stderr


def test_import_hsdp_with_leftover_shard_degree_needs_the_world_size():
    # data_parallel_shard_degree -1 is "the ranks left over": without the world size the import stops
    r = run_memform("import", "torchtitan", FIXTURES / "hsdp_pp.toml")
    assert r.returncode == 2 and "data_parallel_shard_degree is -1" in r.stderr and "--devices N" in r.stderr
    # a world size the replicate degree does not divide: 50 devices / pp 2 = 25 data-parallel ranks, not 2 × N
    r = run_memform("import", "torchtitan", FIXTURES / "hsdp_pp.toml", "--devices", "50")
    assert r.returncode == 2 and "data_parallel_replicate_degree 2 does not divide" in r.stderr


# ---- 7. the profile loads after every model file; the `bool | int` option type --------------------------
@pytest.mark.parametrize("files", [["dense.mf"], ["moe.mf"], ["moe.mf", "mla.mf"], ["vision.mf"], ["bert.mf"]])
def test_profile_checks_after_every_model_file(files):
    present = [f for f in files if (ROOT / "formulas" / f).exists()]
    if len(present) != len(files):
        pytest.skip(f"{files} not bundled")
    r = run_memform("check", *[ROOT / "formulas" / f for f in files], ROOT / "formulas" / "frameworks" / "fsdp2.mf")
    assert r.returncode == 0, r.stderr


def test_bool_or_int_option_type_parses_prints_and_checks():
    # the language type behind fsdp2.reshard_after_forward (torch: Optional[Union[bool, int]])
    src = 'option k : bool | int[2..8] = a.k default true "doc"\n'
    spec = parse_text(src, "t.mf").decls[0].type
    assert (spec.kind, spec.lo, spec.hi, spec.or_bool) == ("int", 2, 8, True)
    printed = print_file(parse_text(src, "t.mf"))
    assert "bool | int[2..8]" in printed and parse_text(printed, "again.mf").decls[0].type == spec
    assert coerce(True, spec, "a.k") is True and coerce(False, spec, "a.k") is False
    assert coerce(4, spec, "a.k") == 4
    for bad in (1, 9, 2.5, "two"):
        with pytest.raises(MemformError, match="config key 'a.k' must be true, false or an integer in 2..8"):
            coerce(bad, spec, "a.k")


# ---- 8. against real FSDP2 steps (CPU ranks over gloo) ---------------------------------------------------
torch = pytest.importorskip("torch", reason="PyTorch (the 'validate' extra) is not installed")


def _check(rows):
    from memform.validation.fsdp2 import Row

    for r in rows:
        for rank, measured in enumerate(r.ranks):   # every rank within the thresholds, not only rank 0
            row = Row(r.case, measured, r.estimated)
            assert not row.failures(), (r.case.label(), rank, {c: f"{row.error(c):+.2%}" for c in row.failures()})
            # the static categories are counted byte for byte (padding-free shapes); activations ≤ 1 %
            assert measured["params"] == r.estimated["params"] and measured["grads"] == r.estimated["grads"]
            assert abs(row.error("activations")) < 0.01


def test_fsdp2_steps_on_two_cpu_ranks():
    from memform.validation.fsdp2 import BASE, Case, run
    # op SAC with the blocks resharded; full AC with reshard_after_forward false (everything kept)
    _check(run([Case(BASE, ac="op"), Case(BASE, ac="full", reshard=False)]))


@pytest.mark.slow
def test_fsdp2_validation_sweep():
    from memform.validation.fsdp2 import run, sweep
    _check(run(sweep()))


# ---- two transients, each by hand from torchtitan / torch source (issue 35: their mutants survived) ------
# A profile that keeps only the term under test: every other stored activation and transient is 0, so the
# stage's backward moment reads it (the schedule's backward moment: warm-up + the last layer's backward).
_ONLY_RERUN = """include "frameworks/fsdp2.mf"
block decoder { act[none, selective, full] = 0  bwd_extra[none] = 0  bwd_extra[selective] = 0  bwd_extra[full] = tp_rerun }
block embedding { act = 0  bwd_extra = 0 }
block output { act = 0  bwd_extra = 0 }
"""
_ONLY_LOSS = """include "frameworks/fsdp2.mf"
block decoder { act[none, selective, full] = 0  bwd_extra = 0 }
block embedding { act = 0  bwd_extra = 0 }
"""
TITAN_8B = {"parallel.dp": 8, "parallel.pp": 1, "model.num_layers": 2, "model.seq_length": 4096,
            "training.precision.params": "bf16", "training.precision.activations": "bf16",
            "training.precision.grads": "fp32", "training.precision.optimizer": "fp32",
            "training.precision.master_weights": True, "fsdp2.param_dtype": "bf16", "fsdp2.reduce_dtype": "fp32"}
S8, H8, V8 = 4096, 4096, 128256      # configs/llama3-8b.yaml at s 4096


def _moments(tmp_path, text: str, **over) -> dict:
    prof = tmp_path / "only.mf"
    prof.write_text(text)
    return numbers(ROOT / "configs" / "llama3-8b.yaml",
                   overrides={**TITAN_8B, "training.framework": str(prof), **over}).stages[0].moments


# A fully checkpointed block's forward re-run in backward ends holding, in s·b·h units (bf16): the block's
# output gradient (1/t with SP, its shard), w2's output and the collective's copy of it (2: with TP
# reduce_scatter_single's chunk-cat input or the all-reduce's output, t = 1 the residual add's output), and
# with SP the output gradient's all-gather (1), the reduce-scatter's output shard and the FFN norm's output
# shard that FeedForward's call still holds (1/t each) (torchtitan models/common/decoder_sharding.py,
# torch/distributed/_functional_collectives.py reduce_scatter_tensor / all_gather_tensor)
@pytest.mark.parametrize("t, sp, units", [(1, False, 1 + 2), (2, False, 1 + 2), (2, True, 1 / 2 + 2 + 1 + 2 / 2),
                                          (4, True, 1 / 4 + 2 + 1 + 2 / 4)])
def test_full_ac_rerun_holds_the_gradients_and_collective_outputs(tmp_path, t, sp, units):
    m = _moments(tmp_path, _ONLY_RERUN, **{"parallel.tp": t, "parallel.sequence_parallel": sp,
                                          "training.recompute": "full", "training.micro_batch_size": 1})
    assert m["backward"] - m["warmup"] == 2 * S8 * 1 * H8 * units


# torchtitan's ChunkedLossWrapper (components/loss.py): the loop's peak beyond what the forward keeps is one
# chunk's loss backward -- its bf16 logits and F.cross_entropy's three fp32 tensors of them (12 B; four with
# TP's _LossParallelCrossEntropy: 16 B), or the bf16 hidden-state chunk if larger --, plus the fp32
# GradAccumulator buffer (zeros_like of the hidden states: 4·s·b·h) and, unless b = 1, the chunks'
# contiguous copies (_chunk_local: torch.split along the sequence, .contiguous(): 2·s·b·h)
@pytest.mark.parametrize("t, b, chunks", [(1, 1, 8), (1, 2, 8), (2, 2, 8), (1, 2, 2), (2, 1, 4)])
def test_chunked_loss_loop_holds_one_chunk_and_the_accumulator(tmp_path, t, b, chunks):
    m = _moments(tmp_path, _ONLY_LOSS, **{"parallel.tp": t, "parallel.sequence_parallel": t > 1,
                                         "training.loss_chunks": chunks, "training.micro_batch_size": b})
    one_chunk = max((2 + (16 if t > 1 else 12)) * S8 * b * V8 / t / chunks, 2 * S8 * b * H8)
    assert m["backward"] - m["warmup"] == one_chunk + (4 + (2 if b > 1 else 0)) * S8 * b * H8


# The embedding unit's FSDP buffers (fsdp2.mf embedding.zero_buffers) where the first block's backward is the
# largest of its three moments: a Llama-3-70B block (h 8192, 64 heads / 8 KV heads of 128, f 28672: Dubey et
# al. 2024 Table 3) is larger than half the embedding (V 128256). During that block's backward FSDP2 holds its
# unsharded bf16 parameters (foreach_all_gather_copy_out), the embedding unit all-gathered ahead by the
# implicit backward prefetch (FSDPParamGroup._backward_prefetch), the block's unsharded bf16 gradients and the
# second block's fp32 reduce-scatter input (foreach_reduce, kept in comm_ctx.reduce_scatter_states):
# 2·B + 2·E + 2·B + 4·B bytes, which is more than the embedding's own backward (2E + 2E + 4B) or its copy-in
# (2E + 4E). (issue 35: seed 101's survivor fsdp2.mf embedding.zero_buffers `+ -> -`)
H70, KV70, F70, V70 = 8192, 1024, 28672, 128256
BLOCK70 = 2 * H70 * H70 + 2 * H70 * KV70 + 3 * H70 * F70 + 2 * H70    # q, o; k, v; gate, up, down; two norms
EMBED70 = V70 * H70


def test_embedding_unit_holds_the_first_blocks_backward_with_the_embedding_prefetched():
    est = numbers(ROOT / "configs" / "llama3-70b.yaml",
                  overrides={**TITAN_8B, "training.framework": "fsdp2", "parallel.tp": 1,
                             "parallel.sequence_parallel": False})
    by_block = {g.block: g.per_layer_values for g in est.stages[0].layers}
    assert by_block["decoder"]["param_count"] == BLOCK70 and by_block["embedding"]["param_count"] == EMBED70
    expected = 2 * BLOCK70 + 2 * EMBED70 + 2 * BLOCK70 + 4 * BLOCK70
    assert expected > max(4 * EMBED70 + 4 * BLOCK70, 6 * EMBED70)
    assert by_block["embedding"]["comm"] == expected


# The chunked loss under no_sync accumulation (fsdp2.mf output grad_bytes): from the second micro-batch on, the
# final norm's accumulated gradient joins the head unit's reduce-scatter, and its sharded gradient is a view into
# the unit-sized reduce output (FSDPParamGroup.post_backward, _fsdp_collectives.py foreach_reduce as_strided),
# which keeps one more shard of the head unit alive: 4 B (fp32) per head/norm parameter over the 8 ranks, with 2 or
# 8 chunks and 4 micro-batches, none with the whole loss (measured: bench/validate.py --frameworks --only pp2, a
# (1024,) gradient on a 501 MiB storage). Llama-3-8B, FSDP over 8 ranks, grad_accumulation_shard false.
# (issue 35: fsdp2.mf:156:57, `loss_chunks > 1` -> `> 0` / `> 2`, live once the space reached this corner)
def test_chunked_loss_under_no_sync_keeps_one_more_head_shard():
    from estimate_helpers import numbers

    base = {"training.framework": "fsdp2", "parallel.tp": 1, "parallel.sequence_parallel": False, "parallel.zero": 3,
            "parallel.pp": 1, "parallel.dp": 8, "parallel.grad_accumulation_shard": False,
            "training.num_micro_batches": 4}
    head = {}
    for chunks in (1, 2, 8):
        est = numbers(ROOT / "configs" / "llama3-8b.yaml", {**base, "training.loss_chunks": chunks})
        (g,) = [g for g in est.stages[0].layers if g.block == "output"]
        head[chunks] = g.per_layer_values["grads"]
    shard = 4 * (128256 * 4096 + 4096) // 8
    assert head[2] - head[1] == head[8] - head[1] == shard
