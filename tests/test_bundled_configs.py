"""Every bundled config under the framework profiles' main switches: one table.

This file merges loops over ``configs/*.yaml`` that lived in four files and estimated several of the same
(config, overrides) pairs each (issue 35): test_framework_deepspeed.py's "ZeRO-3 with offload",
test_framework_hf_trainer.py's "estimates under the profile" (four AMP / optimizer settings) and
test_framework_megatron.py's "knobs on". The fourth, test_frameworks.py's "loads under every profile" (each
profile takes the config or refuses it in its own words), is asserted by tests/test_numeric.py's
every-config x every-profile loop on the estimate it already makes of each pair. Each row asserts what its
old loop asserted; each (config, overrides) pair is estimated once per config (``_estimate``), and a config is
one test, so the table spreads over the workers. The rows read an estimate's numbers and its ``framework`` and
``pp`` (what the numeric path reports: ``model.structure``'s, without building the symbolic estimate that
``est.model`` would: 0.4-1 s an estimate, most of the old loops' time).

Expected facts are the profiles' own rules (which configs a profile takes, which strategies it refuses in its
own words), not numbers: the numbers of every config under every profile are pinned against sympy in
tests/test_numeric.py and against the compiled fast path in tests/test_fastpath.py.
"""

from __future__ import annotations

from functools import lru_cache

import pytest
import yaml

import memform
from cli_helpers import ROOT, sets_keys_of_another_profile
from estimate_helpers import numbers, numeric_model
from memform.engine.config import frameworks
from memform.errors import MemformError

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))

#: test_framework_hf_trainer.py's settings: fp16 AMP, with full recompute, bf16 AMP with Adafactor, 8-bit AdamW
#: over bf16 weights
FP16 = {"hf_trainer.amp": "fp16"}
HF_TRAINER = [FP16, {**FP16, "training.recompute": "full"},
              {"hf_trainer.amp": "bf16", "hf_trainer.optim": "adafactor"},
              {"hf_trainer.optim": "adamw_8bit", "training.precision.params": "bf16"}]

#: test_framework_megatron.py's knobs: fp8 params, the precision-aware optimizer with bf16 moments, full
#: recompute of uniform single layers, the distributed optimizer
KNOBS = {"training.framework": "megatron", "megatron.fp8": "hybrid", "megatron.fp8_param_gather": True,
         "megatron.precision_aware_optimizer": True, "megatron.exp_avg_dtype": "bf16", "training.recompute": "full",
         "megatron.recompute_uniform_layers": 1, "parallel.distributed_optimizer": True}


@lru_cache(maxsize=32)
def _estimate(cfg, overrides: tuple):
    """The numbers once per (config, overrides) in this process (the rows below share them), from the numeric
    path (tests/estimate_helpers.py): ``memform.estimate`` answers the same numbers but compiles a structure the
    second time this process asks for it (1-2 CPU-s each, most of this table's time), which the rows never
    reuse; the compiled path's numbers are tests/test_fastpath.py's."""
    return numbers(cfg, dict(overrides))


def estimate(cfg, overrides=None):
    return _estimate(cfg, tuple(sorted((overrides or {}).items())))


def deepspeed_zero3_offload(cfg) -> None:
    """A Megatron-style config runs under DeepSpeed: ZeRO-3 with both offloads without pipeline parallelism,
    ZeRO-1 with it."""
    try:
        own = estimate(cfg)
    except MemformError:
        return  # not loadable at all (every_profile reports that): nothing DeepSpeed-specific
    if own.framework != "megatron" or sets_keys_of_another_profile(cfg, "deepspeed"):
        return  # written for another profile, or with its own keys
    zero = {"parallel.zero": 3, "deepspeed.offload_optimizer": "cpu", "deepspeed.offload_param": "cpu"} \
        if own.pp == 1 else {"parallel.zero": 1}
    est = estimate(cfg, {"training.framework": "deepspeed", **zero})
    assert all(s.peak_bytes > 0 for s in est.stages), cfg.name


def hf_trainer_settings(cfg) -> None:
    """Every config estimates under the HF Trainer profile with each AMP / optimizer setting, except one
    written with another profile's own keys (configs/published/deepseek-v3-report.yaml)."""
    if sets_keys_of_another_profile(cfg, "hf-trainer"):
        return
    for overrides in HF_TRAINER:
        est = estimate(cfg, {"training.framework": "hf-trainer", **overrides})
        assert all(s.peak_bytes > 0 for s in est.stages), (cfg.name, overrides)


def megatron_knobs(cfg) -> None:
    """Megatron's knobs all on: fp8 params (2 bytes/GEMM element on Hopper) keep the params; full recompute
    and 10 instead of 12 optimizer bytes per parameter lower the peak (fp8 with Megatron FSDP, ZeRO-3, is not
    modelled: a ZeRO-3 config runs the other knobs); not on a config written with another profile's own keys
    (configs/published/bloom-176b.yaml's deepspeed: section)."""
    if sets_keys_of_another_profile(cfg, "megatron"):
        return
    plain = estimate(cfg, {"training.framework": "megatron"})
    zero3 = (yaml.safe_load(cfg.read_text()).get("parallel") or {}).get("zero", 0) >= 3
    est = estimate(cfg, {k: v for k, v in KNOBS.items() if not (zero3 and k.startswith("megatron.fp8"))})
    assert est.framework == "megatron"
    assert all(0 < e.peak_bytes <= p.peak_bytes for e, p in zip(est.stages, plain.stages))


ROWS = (deepspeed_zero3_offload, hf_trainer_settings, megatron_knobs)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda p: p.stem)
def test_every_bundled_config_under_the_profiles_and_their_switches(cfg):
    try:
        for row in ROWS:
            row(cfg)
    finally:
        _estimate.cache_clear()


def test_the_table_reaches_every_profile_and_setting():
    assert len(CONFIGS) >= 14 and len(frameworks()) >= 6
    # the configs the switches apply to: DeepSpeed's rows run on the Megatron-style configs, with and
    # without pipeline parallelism
    pps = {(yaml.safe_load(c.read_text()).get("parallel") or {}).get("pp", 1) for c in CONFIGS}
    assert 1 in pps and any(p > 1 for p in pps)


def test_the_numbers_report_the_structure_the_rows_read():
    """``framework`` and ``pp`` of an estimate's numbers are its model's (what the rows read instead of
    ``est.model.structure``)."""
    over = {"training.framework": "deepspeed", "parallel.zero": 1}
    est = memform.estimate(ROOT / "configs" / "llama3-405b.yaml", over)
    # the model's structure as load_model binds it (est.model would build the whole symbolic estimate first:
    # the same structure, 10-20 CPU-s later)
    structure = numeric_model(ROOT / "configs" / "llama3-405b.yaml", over).structure
    assert (est.framework, est.pp) == (structure.framework, structure.pp) == ("deepspeed", 16)
