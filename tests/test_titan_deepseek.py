"""torchtitan's DeepSeek-V3 recipes traced by validation/frameworks/titan.py (needs torchtitan 0.3.0: run
with its venv, PYTHONPATH=<checkout>/src /work/venv-titan/bin/python -m pytest tests/test_titan_deepseek.py)."""

from __future__ import annotations

import pytest

from memform.validation import frameworks

REASON = "torchtitan is not installed (pip install torchtitan==0.3.0 && pip install --no-deps triton)"


def test_memform_config_of_a_deepseek_case_reads_torchtitan_objects():
    pytest.importorskip("torchtitan", reason=REASON)
    from memform.validation.frameworks import titan

    cfg = titan.TitanCase("deepseek_v3_16b", world=8, layers=2).memform_config()
    m = cfg["model"]
    # torchtitan/models/deepseek_v3/__init__.py _16b and config_registry.py deepseek_v3_16b (EP 8)
    assert (m["hidden_size"], m["num_experts"], m["moe_top_k"], m["moe_ffn_hidden_size"]) == (2048, 64, 6, 1408)
    assert (m["q_lora_rank"], m["num_shared_experts"], m["first_k_dense"], m["ffn_hidden_size"]) == (0, 2, 1, 10944)
    assert cfg["parallel"]["ep"] == 8 and cfg["training"]["recompute"] == "selective"
    big = titan.TitanCase("deepseek_v3_671b", world=64, layers=4).memform_config()
    assert big["model"]["q_lora_rank"] == 1536 and big["parallel"]["ep"] == 2 and big["model"]["first_k_dense"] == 3


@pytest.mark.slow   # ~100 s with torchtitan's imports and the first trace on 2 shared cores
def test_torchtitan_deepseek_v3_16b_recipe_cut_within_thresholds():
    # issue 29/30: torchtitan's op-level SAC on an MLA + MoE block with EP 8 (the quick case, ~15 s)
    pytest.importorskip("torchtitan", reason=REASON)
    from memform.validation.frameworks import titan

    case = titan.quick_sweep()[2]
    assert case.recipe == "deepseek_v3_16b"
    row = frameworks.compare(case, titan)
    errors = ", ".join(f"{c} {row.error(c):+.2%}" for c in frameworks.CATEGORIES)
    assert not row.failures(), f"{case.label()}: {errors}; at the peak: {row.peak_by_op}"
    # what the trace measured, not the formulas: rank 0's fp32 shard of the dense parameters over FSDP 8 and
    # of its 8 local experts (ep 8, efsdp 1) -- MLA 16 heads, q_lora_rank 0: wq 2048x3072, wkv_a 2048x576,
    # kv_norm 512, wkv_b 512x4096, wo 2048x2048; dense FFN 3x2048x10944; shared experts 3x2048x2816;
    # router 2048x64; experts 8x3x2048x1408; norms 2x2 blocks + final; embedding and head 102400x2048
    attn = 2048 * 3072 + 2048 * 576 + 512 + 512 * 4096 + 2048 * 2048
    dense = 2 * (attn + 2 * 2048) + 3 * 2048 * 10944 + 3 * 2048 * 2816 + 2048 * 64 + 2 * 102400 * 2048 + 2048
    assert row.measured["params"] == (dense // 8 + 8 * 3 * 2048 * 1408) * 4
