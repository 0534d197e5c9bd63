"""Naming tensors(...) entries (slots() places the forward temporaries by name) and letting lets read
`stage` (the schedules' stage-dependent facts written once) changed how formulas say things, not what
they say: each stage's peak and allocator reserve equal those of commit 795b61f, before the change, on
every bundled config under every profile and recompute mode, plus the schedules and knobs that reach the
rewritten lets (tests/data/reserves-795b61f.jsonl, made by `PYTHONPATH=CHECKOUT/src python
bench/reserves.py CHECKOUT` on a checkout of 795b61f).

Deliberate differences: MLA decoders (DeepSeek) under the hf-trainer profile. Its Llama-traced forward
temporaries were placed by the positions of a Llama layer's saved tensors, which on MLA's nine attention
tensors (formulas/mla.mf attn_tensors) pointed into the middle of the attention -- the "layer's end" at
the MLP's second tensor. By name they sit where the names say (Q, K, V of MLA, the layer's end). And every job under
the deepspeed profile (here and in the offload data below). Pipeline-parallel ones: DeepSpeed's PipelineEngine
keeps each in-flight micro-batch's received input and stage output and the last stage's logits
(frameworks/deepspeed.mf ds_pipe_kept, ds_pipe_stale, ds_ids, runtime ds_pipe_p2p), and a sending stage's first
backward adds act[none] - act. At any pp: the activation function's backward no longer counts fc2's input, which
autograd has released by then (deepspeed.mf block mlp bwd_grads), and the eager loss's backward takes back the
final norm's and the head's inputs with the plain modeling too (head_not_regrad) -- the peak, or the allocator
replay's reserve (its transients), of 18 of the 25 non-pipeline deepspeed cases moved; the other 7 (Nemotron-H
without full recompute, and offload cases whose peak is set elsewhere) did not. All measured with DeepSpeed's own
engine (bench/ds_pipe_buffers.py, tests/data/ds-pipe-buffers.json; the transformers Llama's checkpointed ZeRO-3
peak, bench/validate.py --frameworks --only "ds zero3 L8 h128 b2 s256 sdpa fp32 gc": +0.53 % -> -0.4 %). And every pipeline-parallel
job under the fsdp2 profile: torch's pipelining keeps one receive buffer per micro-batch for each stage's input
and output gradient (frameworks/fsdp2.mf pp_recv_bufs), traced with torchtitan's own pipeline (bench/validate.py
--frameworks --only pp2).

Issue 30 (eager accounting every profile shares) moved the peak, or the allocator replay's reserve, of the 114
cases listed in tests/data/reserves-moved-issue30.jsonl (every case whose figures differ from 795b61f's after it:
`figures(...) != stages` over the cases not excluded above; of the offload cases, the 48 in
tests/data/reserves-offload-moved-issue30.jsonl, likewise): dense.mf's mlp.bwd_grads releases fc2's saved input
before the activation's backward and counts the layer output's gradient there (mlp_dy) under every profile, where
only the deepspeed and torch profiles released it before; and MLA's V keeps kv_b_proj's / wkv_b's whole output
under the hf-trainer and fsdp2 profiles (dense.mf mla_v_view). Measured: bench/validate.py (default, --frameworks
--only " gc", "optim=muon", "titan deepseek_v3", ...), tests/test_reference_peak.py, tests/test_compiled_block.py.

Activation offloading (formulas/offload-decoder.mf) was loaded by Python (engine/config.py OFFLOAD_KEYS, last,
for a config setting one of its keys) until dense.mf said it itself (`include "offload-decoder.mf" after profile
when training.activation_offload or training.activation_offload_layers`): each stage's peak, reserve and host
bytes on bench/reserves.py's offload cases equal those of commit 8deb83c, before the change
(tests/data/reserves-offload-8deb83c.jsonl, made by `PYTHONPATH=CHECKOUT/src python bench/reserves.py
CHECKOUT --offload` with this bench/reserves.py on a checkout of 8deb83c), refusals included.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from reserves import figures, offload_cases  # noqa: E402

DATA = [json.loads(line) for line in (ROOT / "tests" / "data" / "reserves-795b61f.jsonl").read_text().splitlines()]
#: the MLA x hf-trainer cases, whose reserves moved (module docstring)
MOVED_MLA = {(c["config"], tuple(c["set"])) for c in DATA
             if c["config"] in ("deepseek-v2-lite.yaml", "deepseek-v3.yaml") and "training.framework=hf-trainer" in c["set"]}


def _deepspeed(c: dict) -> bool:
    """A case run under the deepspeed profile, not refused (module docstring: the PipelineEngine's buffers, the MLP's
    backward and the eager loss's moved them)."""
    return "training.framework=deepspeed" in c["set"] and not isinstance(c["stages"], str)


def _fsdp2_pipeline(c: dict) -> bool:
    """A case run under the fsdp2 profile with pipeline parallelism (torch pipelining's receive buffers moved it)."""
    if "training.framework=fsdp2" not in c["set"] or isinstance(c["stages"], str):
        return False
    pp = (yaml.safe_load((ROOT / "configs" / c["config"]).read_text()).get("parallel") or {}).get("pp", 1)
    for s in c["set"]:
        if s.startswith("parallel.pp="):
            pp = int(s.split("=", 1)[1])
    return pp > 1


MOVED_DS = {(c["config"], tuple(c["set"])) for c in DATA if _deepspeed(c)}
MOVED_FSDP2 = {(c["config"], tuple(c["set"])) for c in DATA if _fsdp2_pipeline(c)}
#: issue 30's moved cases (module docstring)
MOVED_ISSUE30 = {(c["config"], tuple(c["set"])) for c in
                 (json.loads(line) for line in
                  (ROOT / "tests" / "data" / "reserves-moved-issue30.jsonl").read_text().splitlines())}
MOVED = MOVED_MLA | MOVED_DS | MOVED_FSDP2 | MOVED_ISSUE30
#: the cheap ones run by default: the rewritten lets (Megatron's autograd regrad, fsdp2 and torch pipelining,
#: MemEst's interleaved factors) and the hf-trainer temporaries; the rest with -m slow
FAST = {("llama2-7b.yaml", ("training.framework=megatron", "megatron.backward_regrad=autograd", "parallel.pp=4", "parallel.vpp=2")),
        ("llama2-7b.yaml", ("training.framework=fsdp2", "parallel.pp=4")),
        ("llama2-7b.yaml", ("training.framework=torch", "parallel.pp_schedule=torch-dualpipev", "parallel.pp=4", "parallel.vpp=2")),
        ("llama2-7b.yaml", ("training.framework=torch", "parallel.pp_schedule=torch-zbv", "parallel.pp=4", "parallel.vpp=2")),
        ("llama2-7b.yaml", ("parallel.pp_schedule=interleaved-memest", "parallel.pp=4", "parallel.vpp=2")),
        ("llama3-8b.yaml", ("training.framework=hf-trainer", "hf_trainer.amp=bf16", "training.recompute=full")),
        ("llama2-7b.yaml", ("training.framework=hf-trainer", "hf_trainer.amp=bf16"))}


def _case(c: dict):
    key = (c["config"], tuple(c["set"]))
    marks = [] if key in FAST else [pytest.mark.slow]
    return pytest.param(c, marks=marks, id=f"{c['config']}:{' '.join(c['set'])}")


@pytest.mark.parametrize("case", [_case(c) for c in DATA if (c["config"], tuple(c["set"])) not in MOVED])
def test_peaks_and_reserves_as_before(case):
    assert figures(ROOT, case["config"], case["set"]) == case["stages"]


def test_the_fast_cases_are_in_the_data():
    assert FAST <= {(c["config"], tuple(c["set"])) for c in DATA}
    assert len(MOVED_MLA) == 6 and len(MOVED_DS) == 42 and len(MOVED_FSDP2) == 34
    assert len(MOVED_ISSUE30) == 114 and MOVED_ISSUE30 <= {(c["config"], tuple(c["set"])) for c in DATA}
    assert not MOVED_ISSUE30 & (MOVED_MLA | MOVED_DS | MOVED_FSDP2)


OFFLOAD = [json.loads(line) for line in
           (ROOT / "tests" / "data" / "reserves-offload-8deb83c.jsonl").read_text().splitlines()]
#: by default: Megatron's layers, TRL's all under hf-trainer (whose decoder act the offload subtracts from), the
#: checkpoint input of a hybrid under fsdp2, a MoE refusal, and `none` set (the file loaded, nothing offloaded; a
#: pp-1 config under fsdp2: the deepspeed cases moved, module docstring)
OFFLOAD_FAST = {("llama3-8b.yaml", "training.framework=megatron", "training.activation_offload=layers"),
                ("llama3-8b.yaml", "training.framework=hf-trainer", "training.activation_offload=all"),
                ("nemotron-h-8b.yaml", "training.framework=fsdp2", "training.activation_offload=checkpoint"),
                ("mixtral-8x7b.yaml", "training.framework=torch", "training.activation_offload=all"),
                ("llama3-8b.yaml", "training.framework=fsdp2", "training.activation_offload=none")}


def _offload_case(c: dict):
    fast = (c["config"], *c["set"][:2]) in OFFLOAD_FAST
    return pytest.param(c, marks=[] if fast else [pytest.mark.slow], id=f"{c['config']}:{' '.join(c['set'])}")


#: issue 30's moved offload cases (module docstring)
OFFLOAD_MOVED_ISSUE30 = [(c["config"], c["set"]) for c in
                         (json.loads(line) for line in
                          (ROOT / "tests" / "data" / "reserves-offload-moved-issue30.jsonl").read_text().splitlines())]


@pytest.mark.parametrize("case", [_offload_case(c) for c in OFFLOAD if not _deepspeed(c) and not _fsdp2_pipeline(c)
                                  and (c["config"], c["set"]) not in OFFLOAD_MOVED_ISSUE30])
def test_offload_peaks_reserves_and_host_bytes_as_before(case):
    assert figures(ROOT, case["config"], case["set"], host=True) == case["stages"]


def test_the_offload_data_is_the_bench_cases():
    assert [(c["config"], c["set"]) for c in OFFLOAD] == [(n, ov) for n, ov in offload_cases()]
    assert OFFLOAD_FAST <= {(c["config"], *c["set"][:2]) for c in OFFLOAD}
    assert len(OFFLOAD_MOVED_ISSUE30) == 48 and all([n, ov] in [[c["config"], c["set"]] for c in OFFLOAD]
                                                    for n, ov in OFFLOAD_MOVED_ISSUE30)
    assert any(isinstance(c["stages"], str) for c in OFFLOAD) and any(s[2] > 0 for c in OFFLOAD
                                                                      if isinstance(c["stages"], list)
                                                                      for s in c["stages"])
