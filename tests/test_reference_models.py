"""Hand-derived references for the bundled configs' less-travelled formulas: the Qwen2-VL vision encoder,
BERT's embedding, the sequence-parallel all-gather buffer and MindSpore's parallel-optimizer threshold.

Every expected number is derived in a comment from tensor shapes and the cited source, not read from
the formula files (bench/mutate.py found these terms pinned by no test).
"""

from __future__ import annotations

from pathlib import Path

import pytest

# the numbers of an estimate, from the numeric path (tests/estimate_helpers.py: equal to the symbolic
# interpreter's by tests/test_numeric.py; memform.estimate would build the symbolic estimate on .layers)
from estimate_helpers import numbers

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
VISION = ("vision_patch_embed", "vision_layer", "vision_merger")


def _layers(est, stage: int = 0) -> dict[str, object]:
    return {layer.block: layer for layer in est.stages[stage].layers}


def test_qwen2_vl_vision_encoder_parameters():
    """Qwen2-VL-7B's ViT (Wang et al. 2024, arXiv:2409.12191, Table 1: 675M), counted from the released
    vision_config shapes (transformers Qwen2VisionTransformerPretrainedModel; embed 1280, MLP 5120,
    32 blocks, 14-pixel patches over 2 frames of 3 channels, 2×2 merge into the 3584-wide LM):
      patch_embed Conv3d 3·2·14·14 -> 1280, no bias:      3·2·196·1280            =   1,505,280
      one block: norm1 + norm2 LayerNorms 2·2·1280         =  5,120
                 qkv 1280 -> 3·1280 + bias                 =  4,915,200 + 3,840
                 proj 1280 -> 1280 + bias                  =  1,638,400 + 1,280
                 fc1 1280 -> 5120 + bias, fc2 back + bias  = 13,107,200 + 5,120 + 1,280
                 = 19,677,440, × 32                                                 = 629,678,080
      merger: ln_q LayerNorm(1280) 2,560; mlp 5120 -> 5120 + bias 26,219,520; 5120 -> 3584 + bias
              18,353,664                                                           =  44,575,744
    total 675,759,104 (the paper's 675M)."""
    est = numbers(CONFIGS / "qwen2-vl-7b.yaml", overrides={"parallel.tp": 1,
                                                                   "parallel.sequence_parallel": False})
    layers = _layers(est)
    assert layers["vision_patch_embed"].per_layer_values["param_count"] == 1_505_280
    assert layers["vision_layer"].per_layer_values["param_count"] == 19_677_440
    assert layers["vision_layer"].count_value == 32
    assert layers["vision_merger"].per_layer_values["param_count"] == 44_575_744
    assert sum(layers[b].per_layer_values["param_count"] * layers[b].count_value for b in VISION) == 675_759_104


def test_qwen2_vl_vision_activations():
    """The bundled config's workload: 4 images of 448² per sample -> (448/14)² = 1024 patches each,
    sv = 4096 patches; b = 1; bf16 (2 bytes); TP 2 with sequence parallelism; flash attention; selective
    recompute (what configs/qwen2-vl-7b.yaml runs).
      patch_embed keeps its input pixels for the weight gradient: 2 · 4096 · (3·2·14·14)    =  9,633,792
      one block (Korthikanti et al. 2022 §4.1 with the ViT's widths, SP splitting the norm and
      GEMM-input regions over t = 2, no dropout): two norm inputs and the QKV and fc1 inputs
      4·1280/2, Q K V and the projection input 4·1280/2, fc1 and GeLU outputs 2·5120/2 -> 10,240
      elements per patch · 2 bytes · 4096                                                 = 83,886,080
      + flash attention's fp32 log-sum-exp, 4 bytes · 16 heads / 2 · 4096 (Dao et al. 2022 §3.1)
                                                                                          =    131,072
      merger (replicated): norm input, fc1 input, fc1 and GeLU outputs, 1280 each per patch:
      4 · 2 · 4096 · 1280                                                                 = 41,943,040"""
    layers = _layers(numbers(CONFIGS / "qwen2-vl-7b.yaml"))
    assert layers["vision_patch_embed"].per_layer_values["activations"] == 9_633_792
    assert layers["vision_layer"].per_layer_values["activations"] == 83_886_080 + 131_072
    assert layers["vision_merger"].per_layer_values["activations"] == 41_943_040


def test_bert_embedding_activations():
    """BERT-large (Devlin et al. 2019: h 1024, s 512) under the HF Trainer's AMP (fp32 model, bf16
    autocast; the bundled config): transformers BertEmbeddings.forward sums the word, position and
    token-type embeddings (fp32), then LayerNorm -- on autocast's fp32 list, so it saves its fp32 input,
    4 · s · b · h bytes -- then dropout, which saves its 1-byte mask, s · b · h (Korthikanti §4.3). b = 4:
      4 · 512 · 4 · 1024 + 512 · 4 · 1024 = 8,388,608 + 2,097,152 = 10,485,760 bytes."""
    layers = _layers(numbers(CONFIGS / "bert-large-uncased.yaml"))
    assert layers["embedding"].per_layer_values["activations"] == 10_485_760


def test_sequence_parallel_all_gather_buffer():
    """Korthikanti et al. 2022 §4.2.2 (Fig. 5): with sequence parallelism each TP rank all-gathers the
    sequence-sharded layer input to the full s · b · h before the QKV and fc1 GEMMs, one such buffer
    live at a time. Llama-3-8B (Dubey et al. 2024 Table 3: h 4096), s 8192, b 1, bf16, TP 4 + SP, DP 2,
    no bucket memory, no CP: 2 · 8192 · 1 · 4096 = 67,108,864 bytes of comm, on every stage."""
    est = numbers(CONFIGS / "llama3-8b.yaml")
    assert [s.values["comm"] for s in est.stages] == [67_108_864] * len(est.stages)
    # without SP nothing is gathered (the TP all-reduce works in place)
    off = numbers(CONFIGS / "llama3-8b.yaml", overrides={"parallel.sequence_parallel": False})
    assert [s.values["comm"] for s in off.stages] == [0] * len(off.stages)


def test_mindspore_parallel_optimizer_threshold_default():
    """MindSpore's parallel_optimizer_config.parallel_optimizer_threshold defaults to 64 (KB): parameters
    smaller than that are not sharded by the parallel optimizer (MindSpore docs, "Optimizer Parallel",
    parallel_optimizer_threshold; opt_param_mgr.cc). With h = 192 the attention's output projection is a
    192 × 192 bf16 weight, 73,728 bytes = 72 KB: sharded under a 64 KB threshold, not under 100 KB -- and
    the profile's default must behave as 64 KB."""
    base = {"training.framework": "mindspore", "model.hidden_size": 192, "model.num_heads": 4,
            "model.num_kv_heads": 4}

    def optimizer(**extra):
        est = numbers(CONFIGS / "llama3-8b.yaml", overrides={**base, **extra})
        return [s.values["optimizer"] for s in est.stages]

    default = optimizer()
    assert default == optimizer(**{"mindspore.parallel_optimizer_threshold": 64})
    # not vacuous: above the 72 KB weight it is kept whole, which costs optimizer bytes
    assert optimizer(**{"mindspore.parallel_optimizer_threshold": 100}) > default


def test_deepseek_v2_lite_first_layer_mla_activations():
    """DeepSeek-V2-Lite (DeepSeek-AI 2024, arXiv:2405.04434, Appendix B; released config.json: h 2048,
    16 heads, no query compression, d_c = kv_lora_rank 512, d_h^R 64, d_h 128, d_v 128, first layer dense
    with FFN 10944, SwiGLU, RMSNorm) as bundled: s 4096, b 1, bf16, flash, selective recompute, t = 1.
    Saved per token by the first (dense) layer, from the tensor shapes of eqs. (9)-(19):
      MLA: layer input 2h = 4096; K/V latent before and after its RMSNorm plus the rope key
           2·(2·512 + 64) = 2176; Q and K at n_h(d_h + d_h^R) = 16·192 each, V and the attention
           output at n_h·d_v = 16·128 each: 2·(2·3072 + 2·2048) = 20480; flash's fp32 log-sum-exp per
           head 4·16 = 64 (Dao et al. 2022 §3.1)                                       -> 26816
      SwiGLU MLP (Korthikanti §4.1 with the gated MLP): input 2h = 4096, [gate|up] 2·2f = 43776, output
           2f = 21888                                                                   -> 69760
      two RMSNorm inputs 2·2h                                                           ->  8192
    104768 bytes · 4096 tokens = 429,129,728."""
    layers = _layers(numbers(CONFIGS / "deepseek-v2-lite.yaml"))
    assert layers["decoder"].per_layer_values["activations"] == 104_768 * 4096


def test_deepseek_v3_dense_layer_mla_shapes():
    """DeepSeek-V3 (arXiv:2412.19437 §2.1.1, §4.2; config.json: h 7168, 128 heads, d_c' = q_lora_rank
    1536, d_c 512, d_h^R 64, d_h 128, d_v 128, dense FFN 18432) on the bundled strategy's TP 4 with SP,
    s 8192, b 1, bf16, flash -- with selective recompute, so that MLA's saved tensors show (the bundled
    config recomputes fully). Parameters of one dense layer (per TP rank):
      W^DQ h×d_c' + its RMSNorm d_c': 7168·1536 + 1536                           =  11,011,584
      W^DKV+KR h×(d_c + d_h^R) + the latent's RMSNorm d_c: 7168·576 + 512           =   4,129,280
      W^UQ+QR d_c'×n_h(d_h + d_h^R), W^UKV d_c×n_h(d_h + d_v), W^O n_h·d_v×h, over t = 4:
        (1536·128·192 + 512·128·256 + 128·128·7168) / 4                          =  42,991,616
      SwiGLU 3·h·f / 4 = 3·7168·18432 / 4                                         =  99,090,432
      two RMSNorms 2h                                                             =      14,336
    total 157,237,248. Saved per token (SP splits the layer input over t = 4):
      MLA: input 2h/4 = 3584; query latent before and after its norm 2·2·1536 = 6144; K/V latent
           before and after plus the rope key 2·(2·512 + 64) = 2176; Q, K (128·192 each), V and the
           output (128·128 each) over t: 2·(2·24576 + 2·16384)/4 = 40960; flash LSE 4·128/4 = 128
      MLP: input 2h/4 = 3584; [gate|up] and output 2·3·18432/4 = 27648; two norm inputs 2·2h/4 = 7168
    91392 bytes · 8192 tokens = 748,683,264."""
    est = numbers(CONFIGS / "deepseek-v3.yaml", overrides={"training.recompute": "selective"})
    dense = _layers(est)["decoder"]
    assert dense.count_value == 3
    assert dense.per_layer_values["param_count"] == 11_011_584 + 4_129_280 + 42_991_616 + 99_090_432 + 14_336
    assert dense.per_layer_values["activations"] == 91_392 * 8192
    # no recompute keeps the same: with flash attention selective recompute has nothing to drop (the
    # a·s² core is never stored; Korthikanti §5, Dao et al. 2022 §3.1)
    none = numbers(CONFIGS / "deepseek-v3.yaml", overrides={"training.recompute": "none"})
    assert _layers(none)["decoder"].per_layer_values["activations"] == 91_392 * 8192


def test_deepseek_v3_mtp_embedding_copy_on_the_last_stage():
    """DeepSeek-V3 §2.2: the MTP module shares the embedding with the main model; with PP 16 it sits on the
    last stage, which needs its own copy of the vocabulary-parallel word embedding (as Megatron keeps
    word_embeddings there for a tied head): v · h / t = 129280 · 7168 / 4 = 231,669,760 parameters."""
    last = _layers(numbers(CONFIGS / "deepseek-v3.yaml"), stage=-1)
    assert last["mtp_embedding"].per_layer_values["param_count"] == 231_669_760
    # the MTP module's own weights (§2.2, Fig. 3): RMSNorms of the hidden state, of the next token's
    # embedding and before the shared head, 3 · 7168, and the projection M from the 2h-wide
    # concatenation to h, column-parallel: 2 · 7168² / 4 -- 21,504 + 25,690,112
    assert last["mtp"].per_layer_values["param_count"] == 3 * 7168 + 2 * 7168 * 7168 // 4


def test_torch_dtensor_tp_holds_two_sbh_gradients():
    """PyTorch DTensor tensor parallelism (torch.distributed.tensor.parallel; torchtitan's plan): the input
    gradients of the column-parallel q/k/v (or gate/up) projections are Partial and all-reduced out of
    place (_functional_collectives.all_reduce), so two s·b·h tensors are live at once, with or without SP
    (measured by bench/validate.py --distributed, tp and tp+sp). Llama-3-8B, s 8192, b 1, bf16, t = 4:
    2 · 2 · 8192 · 4096 = 268,435,456 bytes of comm."""
    est = numbers(CONFIGS / "llama3-8b.yaml", overrides={"training.framework": "torch", "parallel.zero": 0})
    assert [s.values["comm"] for s in est.stages] == [268_435_456] * len(est.stages)


def test_deepspeed_ipg_bucket():
    """DeepSpeed ZeRO-1/2 (runtime/zero/stage_1_and_2.py): with contiguous gradients backward allocates the
    ipg buffer, reduce_bucket_size elements of the model dtype -- the default 5e8 (DeepSpeed config docs,
    zero_optimization.reduce_bucket_size) in bf16: 1e9 bytes -- and a second one with overlap_comm; a full
    bucket is reduced through allreduce_bucket, whose self.flatten(bucket) copies its 5e8 elements once
    more (measured: bench/validate.py --frameworks). The embedding (no TP all-gather of its own) shows the
    buffers alone."""
    base = {"training.framework": "deepspeed", "parallel.zero": 1}
    for overlap, buffers in ((False, 1), (True, 2)):
        est = numbers(CONFIGS / "llama3-8b.yaml", overrides={**base, "deepspeed.overlap_comm": overlap})
        assert _layers(est)["embedding"].per_layer_values["comm"] == buffers * 500_000_000 * 2 + 500_000_000 * 2


def test_bert_classification_head_activations():
    """BERT-large for sequence classification (the bundled config: fp32, b = 4, h = 1024, dropout 0.1,
    2 labels; transformers BertPooler.forward and BertForSequenceClassification.forward): the head works
    on the first token of each sequence only, so it saves b × h tensors, not s·b·h -- the pooler dense's
    input hidden_states[:, 0] (F.linear saves its input), tanh's output (derivatives.yaml:
    tanh_backward(grad, result)), the classifier's input (the dropout output) at 4 bytes each, and the
    dropout's 1-byte mask (Korthikanti et al. 2022 §4.1 counts masks at 1 byte):
      (3 · 4 + 1) · 4 · 1024 = 53,248 bytes. The loss is over b × 2 logits: its backward adds nothing
    worth an s·b·v term."""
    layers = _layers(numbers(CONFIGS / "bert-large-uncased.yaml"))
    assert layers["output"].per_layer_values["activations"] == 53_248


def test_torch_pipelining_buffers_hold_the_local_shard():
    """torch.distributed.pipelining sends and receives each stage's output as the local tensor of the
    rank (stage.py _create_act_recv_info / _create_grad_recv_info size the receive buffers from the
    stage's output metadata): with sequence parallelism the residual stream between layers is
    sequence-sharded over the t TP ranks (Korthikanti et al. 2022 §4.2.2; DTensor Shard(1), torchtitan's
    SequenceParallel plan), with context parallelism every rank holds s/cp tokens (torchtitan's
    context_parallel shards the sequence dimension). So at TP 4 the buffers with SP are a quarter of those
    without, and CP 2 halves them again; the counts of buffers do not change (tests/test_distributed.py
    measures the counts at t = cp = 1)."""
    base = {"training.framework": "torch", "parallel.zero": 0, "parallel.pp": 2, "parallel.pp_schedule": "torch-1f1b"}

    def p2p(**extra):
        est = numbers(CONFIGS / "llama3-8b.yaml", overrides={**base, **extra})
        return [s.runtime["torch_p2p"] for s in est.stages]

    sp = p2p()
    assert all(n > 0 for n in sp)
    assert p2p(**{"parallel.sequence_parallel": False}) == [4 * n for n in sp]
    assert p2p(**{"parallel.cp": 2}) == [n // 2 for n in sp]
    assert all(n % 2 == 0 for n in sp)


def test_qwen2_vl_vision_layer_splits_over_tensor_parallel_ranks():
    """The vision block under TP 2 (Megatron-style, as the LM: Shoeybi et al. 2019 §3): QKV and fc1 are
    column-parallel (weights and biases split), proj and fc2 row-parallel (weights split, biases
    replicated), the two LayerNorms replicated. From the shapes of test_qwen2_vl_vision_encoder_parameters:
      split: 4,915,200 + 3,840 (qkv) + 1,638,400 (proj) + 13,107,200 + 5,120 (fc1, fc2 weights + fc1 bias)
             = 19,669,760 / 2                                                  = 9,834,880
      replicated: proj and fc2 biases 2·1280, norms 4·1280                    =     7,680
    = 9,842,560 parameters per rank."""
    est = numbers(CONFIGS / "qwen2-vl-7b.yaml", overrides={"parallel.tp": 2})
    assert _layers(est)["vision_layer"].per_layer_values["param_count"] == 9_842_560


def test_deepseek_v2_lite_shared_experts_activations():
    """DeepSeek-V2-Lite's MoE layers (DeepSeek-AI 2024, arXiv:2405.04434 §2.2 and Appendix B: 2 shared
    experts of 1408, SwiGLU) as bundled: s 4096, b 1, bf16, t = 1. The shared experts are a dense MLP
    every token goes through, of width 2 · 1408 = 2816; their input is the normalised hidden state the
    router reads too (saved once). They add, per token, [gate | up] 2 · 2 · 2816 and the SwiGLU output
    2 · 2816 (Korthikanti et al. 2022 §4.1 with the gated MLP): 16,896 bytes · 4096 = 69,206,016 per layer."""
    def moe_act(**over):
        est = numbers(CONFIGS / "deepseek-v2-lite.yaml", overrides=over)
        return _layers(est)["moe_decoder"].per_layer_values["activations"]

    assert moe_act() - moe_act(**{"model.num_shared_experts": 0}) == 69_206_016


@pytest.mark.parametrize("t", [2, 4])
def test_torch_dtensor_embedding_gradient_is_the_whole_table(t):
    """torch.distributed.tensor.parallel RowwiseParallel on nn.Embedding (torchtitan's plan) shards the
    table over the vocabulary, but autograd's embedding_backward writes a Replicate gradient of the whole
    v × h table on every rank (measured, bench/validate.py --distributed: 64 KiB of .grad for a 32 KiB
    shard at t = 2). Llama-3-8B's table (v 128256, h 4096) under the torch profile (fp32 parameters and
    .grad), no data parallelism: 128256 · 4096 · 4 = 2,101,346,304 bytes of gradient for a shard of 1/t of
    that (t = 2: the measured degree; issue 35: seed 808's survivor frameworks/torch.mf:73:68, `t > 1` ->
    `t > 2`, left the shard's gradient alone at TP 2)."""
    est = numbers(CONFIGS / "llama3-8b.yaml", overrides={"training.framework": "torch", "parallel.zero": 0,
                                                                  "parallel.dp": 1, "parallel.tp": t})
    emb = _layers(est)["embedding"].per_layer_values
    assert emb["params"] == 128256 * 4096 // t * 4
    assert emb["grads"] == 128256 * 4096 * 4


def test_mindspore_full_recompute_keeps_the_whole_layer_input_without_sp():
    """MindSpore's Cell.recompute keeps each recomputed layer's input; it is sliced over model_parallel
    only with sequence parallelism or recompute_slice_activation (MindSpore docs, "Recomputation";
    MemEst rec_op, §1.4). Llama-3-8B (h 4096, s 8192, b 1, bf16) at TP 4 without SP: the whole
    2 · 8192 · 4096 = 67,108,864 bytes per layer."""
    est = numbers(CONFIGS / "llama3-8b.yaml", overrides={"training.framework": "mindspore",
                                                                  "parallel.sequence_parallel": False,
                                                                  "training.recompute": "full"})
    assert _layers(est)["decoder"].per_layer_values["activations"] == 67_108_864


def test_mindspore_parallel_optimizer_threshold_is_64_kb_not_more():
    """The default threshold is 64 KB exactly (test_mindspore_parallel_optimizer_threshold_default): at
    h = 182 (2 heads of 91, TP 1) the attention's 182 × 182 bf16 output projection is 66,248 bytes, 64.7 KB --
    above a 64 KB threshold (sharded), below a 65 KB one (kept whole)."""
    base = {"training.framework": "mindspore", "model.hidden_size": 182, "model.num_heads": 2,
            "model.num_kv_heads": 2, "parallel.tp": 1, "parallel.sequence_parallel": False}

    def optimizer(**extra):
        est = numbers(CONFIGS / "llama3-8b.yaml", overrides={**base, **extra})
        return [s.values["optimizer"] for s in est.stages]

    assert optimizer() == optimizer(**{"mindspore.parallel_optimizer_threshold": 64})
    assert optimizer(**{"mindspore.parallel_optimizer_threshold": 65}) > optimizer()


def test_deepspeed_keeps_nothing_in_host_memory_without_offload():
    """DeepSpeed ZeRO-3 without offload_optimizer / offload_param keeps parameters, gradients and optimizer
    states on the device (DeepSpeed config docs, zero_optimization.offload_*: "none" by default): no host
    bytes on any rank."""
    est = numbers(CONFIGS / "llama3-8b.yaml", overrides={
        "training.framework": "deepspeed", "parallel.zero": 3, "parallel.tp": 1,
        "parallel.sequence_parallel": False, "parallel.dp": 8})
    assert [s.host_bytes for s in est.stages] == [0] * len(est.stages)


def test_mindspore_keeps_the_gathered_copies_of_gqa_attention_weights():
    """MindSpore's parallel optimizer (optimizer_parallel.md) shards each weight of at least 64 KB over the
    data-parallel ranks and all-gathers it in forward; with optimizer_level level1 (the default) the
    gathered compute-dtype copy stays until backward, level3 re-gathers it "to release the memory used by
    the forward pass allgather". Llama-3-8B (h 4096, 8 KV heads of 128, f 14336), TP 4, DP 2, bf16: a
    decoder's TP slices are q and o 4096 · 4096 / 4, k and v 4096 · 1024 / 4 (GQA), gate, up and down
    4096 · 14336 / 4 -- all far above 64 KB -- while its two RMSNorms (8 KB each) stay whole:
      (2 · 16,777,216 + 2 · 4,194,304 + 3 · 58,720,256) / 4 = 54,525,952 elements · 2 bytes
    = 109,051,904 bytes per decoder more with level1 than with level3."""
    def params(**extra):
        est = numbers(CONFIGS / "llama3-8b.yaml", overrides={"training.framework": "mindspore", **extra})
        return _layers(est)["decoder"].per_layer_values["params"]

    assert params() - params(**{"mindspore.optimizer_level": "level3"}) == 109_051_904


def test_fsdp2_head_backward_buffers():
    """FSDP2 (torch.distributed.fsdp fully_shard, torchtitan's MixedPrecisionPolicy: param_dtype bf16,
    reduce_dtype fp32) on Llama-3-8B, ZeRO-3 over 8 ranks, TP 1. The head unit (final norm + lm_head:
    128256 · 4096 + 4096 = 525,340,672 parameters) runs first in backward; while it does, a rank holds
    autograd's unsharded gradient of its weights in param_dtype (2 bytes each), the reduce-scatter input
    foreach_reduce casts it into (reduce_dtype, 4 bytes each; _fsdp_collectives.py), and the last
    decoder's all-gathered bf16 weights, prefetched for the next backward (FSDPParamGroup backward
    prefetch): q and o 4096², k and v 4096 · 1024, gate, up and down 4096 · 14336, two norms 4096 --
    218,112,000 parameters. 525,340,672 · (2 + 4) + 218,112,000 · 2 = 3,588,268,032 bytes, the stage's
    largest buffers."""
    est = numbers(CONFIGS / "llama3-8b.yaml", overrides={
        "training.framework": "fsdp2", "parallel.zero": 3, "parallel.tp": 1,
        "parallel.sequence_parallel": False, "parallel.dp": 8})
    layers = _layers(est)
    assert layers["output"].per_layer_values["param_count"] == 525_340_672
    assert layers["decoder"].per_layer_values["param_count"] == 218_112_000
    assert layers["output"].per_layer_values["comm"] == 3_588_268_032
    assert est.stages[0].values["comm"] == 3_588_268_032


def test_deepseek_v3_mtp_activations_under_full_recompute():
    """DeepSeek-V3 as bundled (full recompute, TP 4 with SP, s 8192, b 1, bf16; h 7168, v 129280): full
    recompute checkpoints the transformer layers only, so the output head keeps what Korthikanti et al.
    2022 §4.3 counts for it, 4sbh/t · (1 + v/h) -- the final norm's and the head GEMM's inputs (2 bytes,
    h/t each with SP) and the fp32 vocabulary-parallel logits (4v/t) -- 4 · 8192 · 7168 / 4 ·
    (1 + 129280/7168) = 1,117,782,016 bytes. The MTP module (§2.2, Fig. 3) has its own head for the extra
    token with the same saved tensors, and keeps its two inputs, the hidden state and the next token's
    embedding (2 · 2 · 7168 / 4 bytes per token): 1,117,782,016 + 8192 · 7168 = 1,176,502,272."""
    last = _layers(numbers(CONFIGS / "deepseek-v3.yaml"), stage=-1)
    assert last["output"].per_layer_values["activations"] == 1_117_782_016
    assert last["mtp"].per_layer_values["activations"] == 1_117_782_016 + 8192 * 7168


def test_mindspore_mtp_fuser_holds_its_two_norms_and_its_dense():
    """MindFormers' MTPHiddenFuser (research/deepseek3 deepseek2_model.py): RMSNorm `norm` over the hidden state
    and `norm_emb` over the embedding (h each) and `dense`, a 2h -> h Linear without bias. DeepSeek-V3 (h 7168,
    one MTP module) under the mindspore profile without the parallel optimizer: the fuser's 2h + 2h² parameters
    whole on the last stage, in bf16 (2 B), their gradients alike and Adam's two fp32 moments (8 B). (issue 35:
    stop 47's unargued equivalent mindspore/moe.mf:44:13, the two norms dropped from ms_held, reached by no draw
    of DeepSeek-V3 under mindspore: bench/mutate.py STOP48_PAIR_DRAWS now has one)"""
    h = 7168
    est = numbers(CONFIGS / "deepseek-v3.yaml", overrides={"training.framework": "mindspore",
                                                            "mindspore.parallel_optimizer": False})
    mtp = _layers(est, len(est.stages) - 1)["mtp"].per_layer_values
    fuser = 2 * h + 2 * h * h
    assert mtp["param_count"] == fuser
    assert (mtp["params"], mtp["grads"], mtp["optimizer"]) == (2 * fuser, 2 * fuser, 8 * fuser)
    # and its embedding is stage 0's v x h table received whole (vocab_emb_dp: replicated over model_parallel) in
    # bf16, no gradient or moments on this stage (HandleSharedParameter / HandleReceiveParam; mindspore/moe.mf
    # mtp_embedding, its received table recorded within 1 %: tests/test_mindformers_recorded_memory.py). (stop
    # 47's unargued mindspore/moe.mf:64:16, the table's h -> f)
    emb = _layers(est, len(est.stages) - 1)["mtp_embedding"].per_layer_values
    assert (emb["param_count"], emb["params"], emb["grads"], emb["optimizer"]) == (129280 * h, 2 * 129280 * h, 0, 0)
