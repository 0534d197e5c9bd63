"""Framework profiles and the runtime category: the mechanisms every profile builds on.

Expected numbers here are derived by hand from the definitions they test (a profile file that
changes one function, a flat context size, a reserve fraction), not from memform's own output.
"""

from __future__ import annotations

import json

import memform
from memform.api import CATEGORIES, rebind
from memform.engine.config import frameworks

from cli_helpers import ROOT, run_memform

LLAMA = ROOT / "configs" / "llama2-7b.yaml"
MIB, GIB = 2 ** 20, 2 ** 30


def test_bundled_profiles_are_listed_and_megatron_is_the_default():
    assert "megatron" in frameworks()
    est = memform.estimate(LLAMA)
    assert est.model.structure.framework == "megatron"
    assert est.model.program.files[-1].endswith("frameworks/megatron.mf")
    # the default profile changes nothing: the same numbers as naming it explicitly
    explicit = memform.estimate(LLAMA, {"training.framework": "megatron"})
    assert [s.values for s in explicit.stages] == [s.values for s in est.stages]


# every bundled config under every profile: tests/test_bundled_configs.py


def test_runtime_context_and_safety_add_flat_bytes_to_every_stage():
    base = memform.estimate(LLAMA)
    est = memform.estimate(LLAMA, {"device.context_mib": 600, "device.safety_gib": 1})
    for a, b in zip(base.stages, est.stages):
        assert b.values["runtime"] == 600 * MIB + GIB
        assert b.runtime == {"context": 600 * MIB, "allocator": 0, "safety": GIB}
        assert b.peak_bytes == a.peak_bytes + 600 * MIB + GIB
        assert {c: b.values[c] for c in CATEGORIES if c != "runtime"} == \
            {c: a.values[c] for c in CATEGORIES if c != "runtime"}


def test_allocator_reserve_is_a_fraction_of_the_model_bytes():
    base = memform.estimate(LLAMA)
    est = memform.estimate(LLAMA, {"device.fragmentation": 0.125})
    for a, b in zip(base.stages, est.stages):
        model = sum(a.exact[c] for c in CATEGORIES if c != "runtime")
        assert b.runtime["allocator"] == -(-model // 8)  # whole bytes, rounded up
        assert b.model_bytes == a.peak_bytes
    # the closed form carries the reserve too: runtime = model/8 as an expression in the symbols
    s0 = est.stages[0]
    model_expr = sum((s0.exprs[c] for c in CATEGORIES if c != "runtime"), 0)
    assert (s0.exprs["runtime"] - model_expr / 8).expand() == 0


def test_runtime_counts_in_the_fit_check():
    plain = {"allocator.model": "none"}       # allocated bytes only: the runtime's part of the verdict
    est = memform.estimate(LLAMA, plain)
    cap_gib = est.peak_bytes / GIB + 0.5  # fits by half a GiB ...
    assert memform.estimate(LLAMA, {**plain, "device.capacity_gib": cap_gib}).fits
    # ... and no longer once the runtime holds a GiB
    assert not memform.estimate(LLAMA, {**plain, "device.capacity_gib": cap_gib, "device.safety_gib": 1}).fits


def test_the_fit_check_uses_what_the_caching_allocator_reserves():
    est = memform.estimate(LLAMA)
    stage = est.stages[est.peak_stage]
    assert stage.reserve > 0 and est.reserved_bytes > est.peak_bytes
    # a device that holds the allocated peak but not the allocator's reserve: the replay at that capacity
    # releases the cache and retries, and still runs out of memory
    tight = memform.estimate(LLAMA, {"device.capacity_gib": est.peak_bytes / GIB + 0.01})
    assert not tight.fits
    assert memform.estimate(LLAMA, {"device.capacity_gib": est.reserved_bytes / GIB + 0.01}).fits


def test_a_user_profile_file_overrides_the_static_functions(tmp_path):
    # a profile that keeps gradients in 2 bytes and offloads the optimizer states to the host
    (tmp_path / "myfw.mf").write_text(
        '# test profile\n'
        'def grad_mem(n, sh_g, sh_acc) = n * 2 / sh_acc\n'
        'def optim_mem(n, sh_os) = 0\n'
        'def host_mem(n, sh_p, sh_g, sh_os) = n * 12 / sh_os\n')
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(LLAMA.read_text())
    base = memform.estimate(cfg)
    est = memform.estimate(cfg, {"training.framework": "myfw.mf"})
    assert est.model.program.files[-1].endswith("myfw.mf")
    for a, b in zip(base.stages, est.stages):
        # fp32 gradients (4 bytes) become 2 bytes; the 12 optimizer bytes move to the host
        assert b.values["grads"] * 2 == a.values["grads"]
        assert b.values["optimizer"] == 0 and b.host_bytes == a.values["optimizer"]
        assert b.values["params"] == a.values["params"]
    d = est.to_dict()
    assert d["framework"] == "myfw.mf"
    assert [s["host_bytes"] for s in d["stages"]] == [s.host_bytes for s in est.stages]
    # the table shows the host column, and says the host bytes are not in the peak
    r = run_memform("estimate", cfg, "--set", "training.framework=myfw.mf")
    assert r.returncode == 0, r.stderr
    header = next(line for line in r.stdout.splitlines() if line.startswith("stage  layers"))
    assert "host" in header.split() and "host memory is not counted" in r.stdout
    assert "framework=myfw.mf" in r.stdout.splitlines()[0]


def test_rebind_to_another_framework_reloads_the_program(tmp_path):
    (tmp_path / "nograds.mf").write_text("def grad_mem(n, sh_g, sh_acc) = 0\n")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(LLAMA.read_text())
    model = memform.load_model(cfg)
    other = rebind(model, {"training.framework": "nograds.mf"})
    assert other.program is not model.program
    assert all(s.values["grads"] == 0 for s in memform.estimate_model(other).stages)
    same = rebind(model, {"training.micro_batch_size": 2})
    assert same.program is model.program


def test_json_carries_runtime_and_host_fields():
    r = run_memform("estimate", LLAMA, "--json", "--set", "device.context_mib=512")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["framework"] == "megatron"
    for s in d["stages"]:
        assert s["breakdown"]["runtime"] == s["runtime_bytes"] == 512 * MIB
        assert s["runtime"] == {"context": 512 * MIB, "allocator": 0, "safety": 0}
        assert s["host_bytes"] == 0


def test_compare_under_two_frameworks_names_the_key_and_the_runtime(tmp_path):
    (tmp_path / "nograds.mf").write_text("def grad_mem(n, sh_g, sh_acc) = 0\n")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(LLAMA.read_text())
    r = run_memform("compare", cfg, "--set-b", "training.framework=nograds.mf", "--set-b",
                    "device.context_mib=100", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    a = memform.estimate(cfg)
    assert {"key": "training.framework", "a": "(unset)", "b": "nograds.mf"} in d["config_diff"]
    for stage, row in zip(a.stages, d["stages"]):
        delta = row["delta"]
        assert delta["grads"] == -stage.values["grads"]
        assert delta["runtime"] == 100 * MIB
    text = run_memform("compare", cfg, "--set-b", "training.framework=nograds.mf")
    assert text.returncode == 0, text.stderr
    assert "training.framework" in text.stdout and "runtime" in text.stdout


def test_explain_lists_each_runtime_block():
    r = run_memform("estimate", LLAMA, "--explain", "0", "--set", "device.context_mib=600")
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("runtime"))
    assert "context 600.00 MiB" in line and "allocator 0 B" in line


def test_runtime_block_sees_the_stage(tmp_path):
    # a workspace that only the first stage holds: `stage` is bound inside runtime blocks
    (tmp_path / "ws.mf").write_text("runtime workspace { bytes = if stage == 0 then 2^30 else 0 }\n")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(LLAMA.read_text())
    est = memform.estimate(cfg, {"training.framework": "ws.mf"})
    assert [s.runtime["workspace"] for s in est.stages] == [GIB] + [0] * (len(est.stages) - 1)
