#!/bin/bash
# DeepSeek-V3 (DeepSeek-AI 2024, arXiv:2412.19437, §4.2 "Hyper-Parameters": 61 layers, hidden 7168,
# 128 heads, MLA with KV compression 512, query compression 1536, per-head dimension 128 and
# decoupled RoPE dimension 64; all FFNs but the first three are MoE with 1 shared and 256 routed
# experts of intermediate size 2048, 8 routed per token; 1 MTP module; its released config.json:
# vocabulary 129280, dense intermediate size 18432) trained as §3.2 says, 16-way pipeline and 64-way
# expert parallelism with ZeRO-1 data parallelism, here on 256 nodes x 8 GPUs. Written in the shape
# of Megatron-LM's example launch scripts; the dense-then-MoE layout is a --moe-layer-freq list
# built with $((...)) inside a string, and the first/last pipeline stages are set by variables.

set -euo pipefail

NUM_LAYERS=61
FIRST_K_DENSE=3
MOE_LAYER_FREQ="([0]*${FIRST_K_DENSE}+[1]*$((NUM_LAYERS - FIRST_K_DENSE)))"
PP=16
FIRST_STAGE_LAYERS=4
LAST_STAGE_LAYERS=1
GPUS_PER_NODE=8
export NNODES=${NNODES:=256}
TOKENIZER=${TOKENIZER:-deepseek-ai/DeepSeek-V3}

DISTRIBUTED_ARGS="--nproc_per_node ${GPUS_PER_NODE} --nnodes ${NNODES} --node_rank ${NODE_RANK:-0}"

MODEL_ARGS=(
    --num-layers ${NUM_LAYERS}
    --hidden-size 7168
    --ffn-hidden-size 18432
    --num-attention-heads 128
    --kv-channels 128
    --seq-length 4096
    --max-position-embeddings 163840
    --position-embedding-type rope
    --rotary-scaling-factor 40
    --swiglu
    --normalization RMSNorm
    --disable-bias-linear
    --untie-embeddings-and-output-weights
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --tokenizer-type HuggingFaceTokenizer
    --tokenizer-model "${TOKENIZER}"
    --vocab-size 129280
)

MLA_ARGS=(
    --multi-latent-attention
    --q-lora-rank 1536
    --kv-lora-rank 512
    --qk-head-dim 128
    --qk-pos-emb-head-dim 64
    --v-head-dim 128
)

MOE_ARGS=(
    --num-experts 256
    --moe-router-topk 8
    --moe-ffn-hidden-size 2048
    --moe-shared-expert-intermediate-size $((1 * 2048))
    --moe-layer-freq "${MOE_LAYER_FREQ}"
    --moe-grouped-gemm
    --moe-router-score-function sigmoid
    --moe-router-enable-expert-bias
    --moe-router-topk-scaling-factor 2.5
    --moe-token-dispatcher-type alltoall
    --moe-aux-loss-coeff 1e-4
    --mtp-num-layers 1
)

PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size ${PP}
    --decoder-first-pipeline-num-layers ${FIRST_STAGE_LAYERS}
    --decoder-last-pipeline-num-layers ${LAST_STAGE_LAYERS}
    --expert-model-parallel-size 64
    --expert-tensor-parallel-size 1
    --use-distributed-optimizer
    --sequence-parallel
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 15360   # §4.2: the batch size grows to 15360
    --bf16
    --recompute-granularity full
    --recompute-method uniform
    --recompute-num-layers 1
    --lr 2.2e-4
)

torchrun $DISTRIBUTED_ARGS pretrain_gpt.py \
    "${MODEL_ARGS[@]}" \
    "${MLA_ARGS[@]}" \
    "${MOE_ARGS[@]}" \
    "${PARALLEL_ARGS[@]}" \
    "${TRAINING_ARGS[@]}" \
    "$@"
