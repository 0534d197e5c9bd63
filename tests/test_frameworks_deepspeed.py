"""DeepSpeed's own training code as the ground truth of the deepspeed profile (issue 29).

Real DeepSpeed 0.19.8 steps on 2 gloo ranks (memform.validation.frameworks.deepspeed): ZeRO-2 and
ZeRO-3 (the HF Trainer's persistence threshold, so the decoder's matrices are fetched), a Llama built
by transformers, memform's config read from the same config.json and ds_config.json by ``memform import
deepspeed``. Every rank, every category within the thresholds of memform.validation.frameworks, and
ZeRO-3's parameter working set against the profile's runtime blocks; and both stages with bf16 master
weights, gradients and optimizer states (params, grads, optimizer), run in the same spawned group.
``python bench/validate.py --frameworks --only "ds "`` runs the whole DeepSpeed sweep.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace

import pytest

if importlib.util.find_spec("deepspeed") is None or importlib.util.find_spec("transformers") is None:
    pytest.skip("deepspeed (and transformers) not installed: pip install '.[frameworks]', or "
                "pip install deepspeed==0.19.8 torch==2.13.0", allow_module_level=True)

from memform.validation import frameworks  # noqa: E402
from memform.validation.frameworks import deepspeed as ds  # noqa: E402

#: the categories issue 29's acceptance names (static, activations, their peak, communication buffers)
COMPARED = ("params", "grads", "optimizer", "activations", "activations_peak", "comm")


#: bf16 master weights, gradients and optimizer states (ds_config bf16 + the master16 setting), ZeRO-2 and
#: ZeRO-3, both ranks (moved from tests/test_import_deepspeed.py, whose own spawned group cost a second
#: DeepSpeed import per rank)
BF16_MASTER = [replace(ds.BASE, zero=zero, bf16=True, master16=True, rank=rank) for zero in (2, 3) for rank in (0, 1)]


@pytest.fixture(scope="module")
def ran():
    # the quick sweep's two jobs and the bf16-master test's two in one spawned group (one DeepSpeed import per
    # rank, not two; issue 35)
    ds.run(ds.quick_sweep() + BF16_MASTER)


@pytest.fixture(scope="module")
def rows(ran):
    return [frameworks.compare(c, ds) for c in ds.quick_sweep()]


def test_quick_sweep_is_zero2_and_zero3_on_both_ranks():
    cases = ds.quick_sweep()
    assert sorted({(c.zero, c.rank) for c in cases}) == [(2, 0), (2, 1), (3, 0), (3, 1)]


def test_every_rank_and_category_within_the_thresholds(rows):
    over = [f"{r.case.label()}: {c} {r.error(c):+.2%} (measured {r.measured[c]}, memform {r.estimated[c]})"
            for r in rows for c in COMPARED if abs(r.error(c)) > r.limits()[c]]   # own recorded bound
    assert not over, "\n" + "\n".join(over) + "\n" + frameworks.format_table(rows)


def test_the_measured_buffers_are_there(rows):
    # nothing is compared against an empty measurement: every rank holds all six categories
    for r in rows:
        assert all(r.measured[c] > 0 for c in COMPARED), r.case.label()
        step = ds.measure(r.case)
        assert step.notes["optimizer_class"] == ("DeepSpeedZeroOptimizer" if r.case.zero == 2
                                                 else "DeepSpeedZeroOptimizer_Stage3")
    zero2 = [r for r in rows if r.case.zero == 2]
    # ZeRO-2: the IPG bucket (reduce_bucket_size fp32 elements) and the flat copy allreduce_bucket makes
    assert all(r.measured["comm"] > ds.BASE.bucket * 4 for r in zero2)


def test_zero3_working_set_matches_the_runtime_blocks(rows):
    # fetched parameters (all-gather flat buffer + the copies made of it), the tensors kept gathered below
    # the persistence threshold and the IPG bucket: memform's zero3_persistent + zero3_fetch + zero3_cache
    for r in rows:
        if r.case.zero != 3:
            continue
        measured, estimated = ds.zero3_working_set(r.case)
        assert measured > ds.BASE.bucket * 4      # the bucket alone is 2 MB
        assert abs(estimated / measured - 1) <= frameworks.THRESHOLDS["comm"], (r.case.label(), measured, estimated)


def test_memform_reads_the_same_files(tmp_path):
    # the ds_config the ranks run is what `memform import deepspeed` reads, over the HF config.json
    case = ds.quick_sweep()[-1]
    cfg = case.memform_config()
    assert cfg["training"]["framework"] == "deepspeed"
    assert cfg["parallel"]["zero"] == 3 and cfg["parallel"]["dp"] == case.world
    assert cfg["deepspeed"]["modeling"] == "transformers"
    assert cfg["deepspeed"]["stage3_param_persistence_threshold"] == 10 * case.h
    assert cfg["model"]["num_layers"] == case.L and cfg["model"]["hidden_size"] == case.h
    json.dumps(case.ds_config())          # a plain JSON document


def test_real_deepspeed_bf16_master_states_match(ran):
    """DeepSpeed 0.19.8 steps (memform.validation.frameworks.deepspeed's harness) with bf16 master weights,
    gradients and optimizer states: every rank's params, grads and optimizer within the thresholds (measured
    2026-12-06: optimizer 4.97 MiB = memform's at ZeRO-1/2/3, half the fp32 master's 9.95 MiB)."""
    rows = [frameworks.compare(c, ds) for c in BF16_MASTER]
    over = [f"{r.case.label()}: {c} {r.error(c):+.2%}" for r in rows for c in ("params", "grads", "optimizer")
            if abs(r.error(c)) > r.limits()[c]]   # each case's own recorded bound, within the suite's
    assert not over, "\n" + "\n".join(over) + "\n" + frameworks.format_table(rows)
    # 2 bytes master + 2 + 2 moments per partition element: the optimizer is half the fp32 master's 12 bytes
    cfg = rows[0].case.memform_config()
    assert cfg["deepspeed"]["master_weights_and_grads"] == "bf16" and cfg["training"]["precision"]["optimizer"] == "bf16"
