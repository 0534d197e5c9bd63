# Mixtral-8x7B (Jiang et al. 2024, "Mixtral of Experts", Table 1: 32 layers, h 4096, FFN 14336,
# 32 heads / 8 KV heads, 8 experts, top-2, vocabulary 32000) launched shell-style on 8 nodes x 8
# GPUs; strategy TP 2, PP 4, EP 8 with grouped GEMM, in the style of Megatron-LM's
# examples/mixtral launch script.
torchrun --nproc_per_node 8 --nnodes 8 --node_rank 0 --master_addr localhost --master_port 6000 \
    pretrain_gpt.py \
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \
    --group-query-attention --num-query-groups 8 \
    --seq-length 4096 --max-position-embeddings 32768 --position-embedding-type rope \
    --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear \
    --attention-dropout 0.0 --hidden-dropout 0.0 --vocab-size 32000 \
    --num-experts 8 --moe-router-topk 2 --moe-grouped-gemm --moe-token-dispatcher-type alltoall \
    --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2 \
    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --expert-model-parallel-size 8 \
    --sequence-parallel --use-distributed-optimizer --use-flash-attn \
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 \
    --micro-batch-size 1 --global-batch-size 256 --bf16 \
    --data-path "my data/mixtral_text_document" --tokenizer-type Llama2Tokenizer
