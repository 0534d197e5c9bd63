#!/bin/bash
# GPT-3 175B (Brown et al. 2020, Table 2.1: 96 layers, d_model 12288, 96 heads, context 2048) with
# the strategy of Korthikanti et al. 2022, Table 3 (t = 8, p = 8, sequence parallelism + selective
# recomputation, global batch 1536) on 64 nodes x 8 GPUs, written in the shape of Megatron-LM's
# examples/gpt3/train_gpt3_175b_distributed.sh: arguments in bash arrays, paths as positional
# arguments, the world size by $((...)). Megatron defaults otherwise (GeLU, LayerNorm, biases,
# dropout 0.1, tied embeddings, learned positions); GPT-2 BPE vocabulary.

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=8
# Change for multinode config
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=6000
NUM_NODES=${NUM_NODES:-64}
NODE_RANK=${NODE_RANK:-0}
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))

CHECKPOINT_PATH=$1 # where checkpoints go
TENSORBOARD_LOGS_PATH=$2
VOCAB_FILE=$3 # .../gpt2-vocab.json
MERGE_FILE=$4 # .../gpt2-merges.txt
DATA_PATH=$5

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --node_rank $NODE_RANK
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)

GPT_MODEL_ARGS=(
    --num-layers 96
    --hidden-size 12288
    --num-attention-heads 96
    --seq-length 2048
    --max-position-embeddings 2048
    --attention-backend unfused # Korthikanti et al. predate fused kernels (flash/fused/unfused/local)
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 1536
    --train-iters 500000
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --init-method-std 0.006
    --clip-grad 1.0
    --fp16
    --lr 6.0e-5
    --lr-decay-style cosine
    --min-lr 6.0e-6
    --recompute-activations
)

MODEL_PARALLEL_ARGS=(
	--tensor-model-parallel-size 8
	--pipeline-model-parallel-size 8
	--sequence-parallel
)

DATA_ARGS=(
    --data-path $DATA_PATH
    --tokenizer-type GPT2BPETokenizer
    --vocab-file $VOCAB_FILE
    --merge-file $MERGE_FILE
    --split 949,50,1
)

EVAL_AND_LOGGING_ARGS=(
    --log-interval 100
    --save-interval 10000
    --eval-interval 1000
    --save $CHECKPOINT_PATH
    --load $CHECKPOINT_PATH
    --eval-iters 10
    --tensorboard-dir $TENSORBOARD_LOGS_PATH
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${GPT_MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${DATA_ARGS[@]} \
    ${EVAL_AND_LOGGING_ARGS[@]}
