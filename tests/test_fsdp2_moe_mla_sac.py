"""torchtitan's op-level SAC on MLA and MoE blocks (frameworks/fsdp2/mla.mf, frameworks/fsdp2/moe.mf) held
to what torchtitan 0.3.0's own DeepSeek-V3 recipes measured, traced by ``validation/frameworks/titan.py``
(its deepseek_v3 parallelize, FSDP2 + EP, SelectiveAC / FullAC, fake tensors on a fake process group).
These tests need no torchtitan: the configs are what ``TitanCase.memform_config()`` gives for each case
(asserted against torchtitan itself in tests/test_frameworks_ground_truth.py where it is installed), and
the expected bytes are the traced rank 0's.
"""

from __future__ import annotations

import copy

import pytest

import memform

MODEL_16B = {  # torchtitan models/deepseek_v3/__init__.py _16b, cut to its dense block and one MoE block
    "attention": "mla", "hidden_size": 2048, "num_layers": 2, "num_heads": 16, "ffn_hidden_size": 10944,
    "vocab_size": 102400, "seq_length": 4096, "activation": "swiglu", "norm": "rmsnorm", "bias": False,
    "dropout": False, "flash_attention": True, "tied_embeddings": False, "position_embedding": "rope",
    "swiglu_impl": "eager", "cross_entropy": "eager", "q_lora_rank": 0, "kv_lora_rank": 512,
    "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "num_experts": 64, "moe_top_k": 6,
    "moe_ffn_hidden_size": 1408, "num_shared_experts": 2, "first_k_dense": 1, "moe_grouped_gemm": True}
MODEL_671B = {**MODEL_16B,  # torchtitan _671b, cut to its 3 dense blocks and one MoE block
              "hidden_size": 7168, "num_layers": 4, "num_heads": 128, "ffn_hidden_size": 18432,
              "vocab_size": 129280, "q_lora_rank": 1536, "num_experts": 256, "moe_top_k": 8,
              "moe_ffn_hidden_size": 2048, "num_shared_experts": 1, "first_k_dense": 3}


def config(model: dict, dp: int, ep: int, recompute: str) -> dict:
    # torchtitan's deepseek_v3_16b / deepseek_v3_671b recipes (config_registry.py): local batch 4, seq 4096,
    # ChunkedLossWrapper (8 chunks), fp32 model under MixedPrecisionPolicy(bf16, fp32), EP as they set it
    return {"name": "titan-dsv3", "formulas": ["moe.mf", "mla.mf"], "model": copy.deepcopy(model),
            "parallel": {"dp": dp, "tp": 1, "pp": 1, "sequence_parallel": False, "ep": ep, "expert_tp": 1},
            "training": {"framework": "fsdp2", "micro_batch_size": 4, "num_micro_batches": 1, "loss_chunks": 8,
                         "recompute": recompute,
                         "precision": {"params": "bf16", "grads": "fp32", "optimizer": "fp32",
                                       "activations": "bf16", "master_weights": True}},
            "fsdp2": {"param_dtype": "bf16", "reduce_dtype": "fp32", "selective_ac": "op", "grouped_experts": True}}


# (case, config, traced rank 0 bytes: what the forward leaves saved, the activation peak). Source of every
# number: `bench/validate.py --frameworks --only titan` (torchtitan 0.3.0, torch 2.13 CPU), the case's row
CASES = [
    ("16B L2 fsdp8 ep8 op-SAC", config(MODEL_16B, 8, 8, "selective"), 2_266_169_860, 6_445_989_928),
    ("16B L2 fsdp8 ep8 full AC", config(MODEL_16B, 8, 8, "full"), 268_500_996, 5_717_229_608),
    ("671B L4 fsdp64 ep2 op-SAC", config(MODEL_671B, 64, 2, "selective"), 10_449_389_572, 29_453_222_408),
    ("671B L4 fsdp64 ep2 full AC", config(MODEL_671B, 64, 2, "full"), 1_409_351_684, 25_093_243_400),
]


@pytest.mark.parametrize("label,cfg,saved,peak", CASES, ids=[c[0] for c in CASES])
def test_op_sac_on_mla_and_moe_blocks_matches_torchtitan(label, cfg, saved, peak):
    stage = memform.estimate(cfg).stages[0]
    got_saved = stage.moments.get("warmup", stage.values["activations"])
    assert abs(got_saved - saved) / saved < 0.005, f"{label}: saved {got_saved:,.0f} vs traced {saved:,}"
    assert abs(stage.values["activations"] - peak) / peak < 0.06, f"{label}: peak {stage.values['activations']:,.0f} vs {peak:,}"


def test_op_sac_mm_parity_follows_the_attention():
    # SelectiveAC saves every odd-numbered mm of a block (activation_checkpoint.py _get_custom_policy): MLA
    # without query compression runs 4 mms (wq, wkv_a, wkv_b, wo), so the shared experts' w1 (f_sh wide)
    # and w2 (h wide) outputs are saved; with it 5 (wq_a, wq_b, wkv_a, wkv_b, wo), so only w3's (f_sh)
    tok, f_sh, h = 4 * 4096, 2 * 1408, 2048
    for q_rank, shared_saved in ((0, 2 * tok * (f_sh + h)), (1536, 2 * tok * f_sh)):
        with_shared, without = (config({**MODEL_16B, "q_lora_rank": q_rank, "num_shared_experts": n}, 8, 8, "selective")
                                for n in (2, 0))
        one, two = memform.estimate(without).stages[0], memform.estimate(with_shared).stages[0]
        grown = two.moments.get("warmup", two.values["activations"]) - one.moments.get("warmup", one.values["activations"])
        assert grown == pytest.approx(shared_saved, rel=1e-9), (q_rank, grown)
