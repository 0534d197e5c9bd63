"""megatron-core's own training code as the ground truth of the megatron profile (issue 29).

Real megatron-core 0.19.2 steps on 2 gloo ranks (memform.validation.frameworks.mcore): GPTModel with the
local spec, megatron's DistributedDataParallel, get_megatron_optimizer and its forward-backward schedules,
under TP 2 and PP 2 (1F1B, m = 4, both stages); memform's config read from the same Megatron-LM command
line by ``memform import megatron``. Every row, every category within the thresholds of
memform.validation.frameworks. ``python bench/validate.py --frameworks --only mcore`` runs the whole
megatron-core sweep. megatron-core is not in an extra (it installs only with --no-deps
--ignore-requires-python on Python 3.11): without it the module is skipped, with the install command.

Published sizes (issue 29 (b)): GPT-3 175B (TP 8 × PP 8, SP, selective recompute), Llama-2-70B (TP 8 ×
PP 4, SP, DP 2 with the distributed optimizer) and Mixtral 8x7B (TP 2 × PP 4 × EP 8, SP, DP 8), rank 0 of every pipeline stage traced under FakeTensorMode
on a ``fake`` process group of 64 ranks; the slow test runs them cut to one layer per stage, each row held
to its own recorded agreement (memform/validation/bounds.yaml).
"""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
    pytest.skip("megatron-core not installed: pip install numpy packaging triton && pip install --no-deps "
                "--ignore-requires-python megatron-core==0.19.2", allow_module_level=True)

from memform.validation import bounds, frameworks  # noqa: E402
from memform.validation.frameworks import mcore  # noqa: E402

#: the categories issue 29's acceptance names (static, activations, their peak, communication buffers)
COMPARED = ("params", "grads", "optimizer", "activations", "activations_peak", "comm")


@pytest.fixture(scope="module")
def ran():
    # the quick sweep's jobs and the mechanism rows' (test_mechanism_rows_within_their_bounds) in one spawned
    # group of 2 ranks (one megatron import per rank, not two; issue 35)
    mcore.run(mcore.quick_sweep() + _mechanism_cases())


@pytest.fixture(scope="module")
def rows(ran):
    return [frameworks.compare(c, mcore) for c in mcore.quick_sweep()]


def test_quick_sweep_is_tp2_and_both_pipeline_stages():
    cases = mcore.quick_sweep()
    assert [(c.tp, c.pp, c.stage) for c in cases] == [(2, 1, 0), (1, 2, 0), (1, 2, 1)]
    assert all(c.world == 2 for c in cases)


#: this sweep's own bounds, from its recorded agreement (README "megatron-core" table: static and comm
#: exact, activations -0.2 %, their peak -0.1 % / -1.2 % on the last stage), well inside issue 29's
#: thresholds (frameworks.THRESHOLDS), so that a change of a few per cent fails here
BOUNDS = {"params": 0.001, "grads": 0.001, "optimizer": 0.001, "activations": 0.01, "activations_peak": 0.02,
          "comm": 0.001}


def test_every_row_and_category_within_its_bound(rows):
    over = [f"{r.case.label()}: {c} {r.error(c):+.2%} (measured {r.measured[c]}, memform {r.estimated[c]})"
            for r in rows for c in COMPARED if abs(r.error(c)) > BOUNDS[c]]
    assert not over, "\n" + "\n".join(over) + "\n" + frameworks.format_table(rows)


def test_the_measured_categories_are_there(rows):
    # nothing is compared against an empty measurement; megatron's grad buffers are fp32 main grads,
    # the Adam states twice the fp32 parameters (no master copy in fp32)
    for r in rows:
        assert all(r.measured[c] > 0 for c in COMPARED), r.case.label()
        assert r.measured["grads"] == r.measured["params"]
        assert abs(r.measured["optimizer"] - 2 * r.measured["params"]) < 1024
    stage0, stage1 = (r for r in rows if r.case.pp == 2)
    # 1F1B: stage 0 holds two micro-batches at the end of its warm-up, the last stage one
    assert stage0.measured["activations"] > 1.5 * stage1.measured["activations"]


def test_the_importer_reads_the_unfused_kernels():
    # the command line's --no-* fusions and --transformer-impl local reach the profile's keys
    cfg = mcore.BASE.memform_config()
    assert cfg["training"]["framework"] == "megatron"
    assert cfg["model"]["swiglu_impl"] == "eager"
    assert cfg["megatron"]["transformer_impl"] == "local"
    assert cfg["megatron"]["eager_glu"] == "mcore"
    assert cfg["megatron"]["rope_fusion"] is False
    assert cfg["megatron"]["masked_softmax_fusion"] is False
    assert cfg["megatron"]["gradient_accumulation_fusion"] is False


#: issue 30's mechanisms against megatron-core itself, each row with bounds from its own recorded agreement
#: (bench/validate.py --frameworks --only "moe4x2" / "rc=selective["): MoE with the router probabilities
#: applied inside the experts (SequentialMLP; activations -0.2 %, peak -0.5 %), and --recompute-modules
#: layernorm + mlp (activations -1.0 %, peak +4.6 %: the recomputed MLP's rebuilt tensors are counted whole)
MECHANISM_ROWS = {
    "mcore  L4 h128 a4/2 s256 b2 bf16 moe4x2": {"activations": 0.01, "activations_peak": 0.015},
    "mcore tp2 L4 h128 a4/2 s256 b2 bf16 rc=selective[core_attn+layernorm+mlp]":
        {"activations": 0.02, "activations_peak": 0.06},
}


def _mechanism_cases() -> list:
    return [c for c in mcore.sweep() if c.label() in MECHANISM_ROWS]


def test_mechanism_rows_within_their_bounds(ran):
    cases = _mechanism_cases()
    assert len(cases) == len(MECHANISM_ROWS)
    for case in cases:
        row = frameworks.compare(case, mcore)
        bounds = {**BOUNDS, **MECHANISM_ROWS[case.label()]}
        over = [f"{c} {row.error(c):+.2%}" for c in COMPARED if abs(row.error(c)) > bounds[c]]
        assert not over, f"{case.label()}: {', '.join(over)}\n" + frameworks.format_table([row])


def test_the_importer_reads_the_published_command_lines():
    # GPT-3 175B's Megatron-LM command line (no --swiglu, LayerNorm, biases, learned positions, SP) and
    # Llama-2-70B's (GQA 64/8, distributed optimizer over DP 2) reach memform as such
    gpt3 = mcore.GPT3_175B.memform_config()
    assert (gpt3["model"]["activation"], gpt3["model"]["norm"]) == ("gelu", "layernorm")
    assert gpt3["model"]["bias"] is True and gpt3["model"]["position_embedding"] == "learned"
    assert (gpt3["parallel"]["tp"], gpt3["parallel"]["pp"], gpt3["parallel"]["sequence_parallel"]) == (8, 8, True)
    assert gpt3["training"]["global_batch_size"] == 8 and gpt3["training"]["recompute"] == "selective"
    llama = mcore.LLAMA2_70B.memform_config()
    assert (llama["model"]["num_kv_heads"], llama["model"]["vocab_size"]) == (8, 32768)
    assert (llama["parallel"]["dp"], llama["parallel"]["distributed_optimizer"]) == (2, True)
    assert "norm_kernel" not in llama.get("megatron", {})   # the fake trace's RMSNorm is CUDA's fused one


def test_fake_traces_are_one_rank_per_stage_of_a_64_gpu_job():
    cases = mcore.fake_quick_sweep()
    assert [(c.recipe, c.stage) for c in cases] == ([("gpt3-175b", i) for i in range(8)]
                                                    + [("llama2-70b", i) for i in range(4)]
                                                    + [("mixtral-8x7b", i) for i in range(4)])
    assert all(c.world == 64 and c.fake for c in cases)
    assert [mcore._rank_of(c) for c in cases[8:12]] == [0, 16, 32, 48]   # tp-cp-ep-dp-pp: stage × tp × dp
    assert [mcore._rank_of(c) for c in cases[12:]] == [0, 16, 32, 48]    # Mixtral: TP 2 × DP 8 (EP 8 within DP)
    assert not any(c.reserve_checked for c in cases) and all(c.reserve_checked for c in mcore.fake_sweep())


@pytest.mark.slow
def test_published_sizes_cut_to_one_layer_per_stage_within_their_recorded_bounds():
    # about 2 min on two shared cores: 16 fake traces (GPT-3 175B's 8 stages, Llama-2-70B's 4, Mixtral 8x7B's 4)
    cases = mcore.fake_quick_sweep()
    mcore.run(cases)
    rows = [frameworks.compare(c, mcore) for c in cases]
    assert all(bounds.recorded("frameworks", r.case.label()) for r in rows)
    over = [f"{r.case.label()}: {r.failures()}" for r in rows if r.failures()]
    assert not over, "\n" + "\n".join(over) + "\n" + frameworks.format_table(rows)
    for r in rows:   # static bytes exact: the parameters, fp32 main grads, the Adam states (sharded over DP 2)
        assert all(r.error(c) == 0 for c in ("params", "grads")), r.case.label()
