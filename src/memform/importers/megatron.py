"""Megatron-LM command-line arguments → a memform config (model and parallel strategy).

The source is one or more files, read in order as one shell session (:mod:`.shell`, which follows
bash without running it): a launch script in the shape of Megatron-LM's ``examples/*/train_*.sh``
(arguments in bash arrays, values in variables, ``${VAR:-default}``, ``$((a*b))``, ``$1``, ``if``
blocks, ``export``) whose ``torchrun ... pretrain_gpt.py ...`` command gives the arguments and,
from ``--nproc_per_node`` × ``--nnodes``, the device count; a plain arguments file (one per line, or
shell-style); or a file of variable assignments for the scripts after it. An argument given again in
a later file overrides the earlier one. The script's own positional arguments come from
``--args "a b c"`` (``$1``.., ``$#``, ``$@``, ``shift``; Pai-Megatron-Patch's run scripts take 25); a
value the script does not determine (an environment variable, ``$1`` without a default) is an error
naming file, line and variable when memform needs it. Defaults are Megatron-LM's own
(``megatron/training/arguments.py``) so that an omitted flag means what it means to Megatron.

Every argument is read (mapped onto the config keys the formula files read), or memory-neutral
(:data:`NEUTRAL`, each with its reason), or refused: outright with file, line and why when it
changes memory in a way memform does not model (:data:`REFUSED`, some only at some values), else at
the end of the import unless ``--accept`` vouches for it (an argument memform does not know).
MindSpeed-LLM's and Pai-Megatron-Patch's additions to Megatron's parser are read the same way.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..errors import MemformError, read_text
from . import megatron_hybrid, megatron_linear
from .draft import Draft, Fields, divide, pad_vocab
from .shell import Command, Ref, Shell, ShellParseError, Word, list_expression

TITLE = "Megatron-LM arguments"

def _names(reason: str, names: str) -> dict[str, str]:
    return {name: reason for name in names.split()}


#: arguments memform does not read because they cannot change what a device holds, each with the reason
#: (Megatron-LM megatron/training/arguments.py and the config dataclasses its groups are built from,
#: megatron/training/config/*.py; MindSpeed-LLM and Pai-Megatron-Patch add their own to the same parser).
#: An argument in neither this table nor REFUSED, and not read, is refused at the end of the import
#: (Draft.refuse_unread) unless ``--accept`` names it.
NEUTRAL: dict[str, str] = {
    **_names("Megatron-DeepSpeed's run control: abort, stop and data-path switches that hold no tensors "
             "(bigscience-workshop/Megatron-DeepSpeed megatron/arguments.py)",
             "abort-on-unmet-fused-kernel-constraints kill-switch-path train-weighted-split-paths-path "
             "valid-weighted-split-paths-path test-weighted-split-paths-path valid-num-workers "
             "tokenizer-name-or-path universal-checkpoint"),
    **_names("logging and monitoring: reads values training already holds (training_config.py LoggerConfig)",
             "log-interval log-params-norm log-throughput log-throughput-to-tensorboard throughput-window-size "
             "log-progress timing-log-level timing-log-option tensorboard-dir tensorboard-log-interval "
             "tensorboard-queue-size log-timers-to-tensorboard log-loss-scale-to-tensorboard "
             "no-log-loss-scale-to-tensorboard log-validation-ppl-to-tensorboard log-memory-to-tensorboard "
             "memory-keys log-memory-interval log-device-memory-used log-l2-norm-grad-to-tensorboard "
             "log-num-zeros-in-grad log-max-attention-logit log-runtime-to-tensorboard runtime-time-unit "
             "barrier-with-L1-time barrier-with-l1-time log-world-size-to-tensorboard wandb-project "
             "wandb-exp-name wandb-save-dir wandb-entity logging-level filter-warnings modules-to-filter "
             "set-level-for-all-loggers log-energy save-config-filepath moe-per-layer-logging log-straggler "
             "straggler-ctrlr-port straggler-minmax-count disable-straggler-on-startup log-batch-size-to-tensorboard "
             "log-learning-rate-to-tensorboard log-optimizer-states-to-tensorboard one-logger-project "
             "one-logger-run-name one-logger-async enable-one-logger no-one-logger app-tag-run-name "
             "app-tag-run-version"),
    **_names("profiling switches (common_config.py ProfilingConfig): memform estimates the training itself",
             "profile use-nsys-profiler profile-step-start profile-step-end use-pytorch-profiler "
             "pytorch-profiler-collect-shapes pytorch-profiler-collect-callstack pytorch-profiler-collect-chakra "
             "profile-ranks record-shapes nvtx-ranges timing"),
    **_names("checkpoint saving and loading (training_config.py CheckpointConfig): outside the training step",
             "save save-interval save-params-interval save-retain-interval most-recent-k no-save-optim "
             "no-save-rng load no-load-optim no-load-rng load-main-params-from-ckpt non-persistent-save-interval "
             "non-persistent-ckpt-type non-persistent-global-ckpt-dir non-persistent-local-ckpt-dir "
             "non-persistent-local-ckpt-algo finetune pretrained-checkpoint ckpt-step use-checkpoint-args "
             "use-mp-args-from-checkpoint-args use-tokenizer-model-from-checkpoint-args "
             "no-use-tokenizer-model-from-checkpoint-args exit-on-missing-checkpoint ckpt-format "
             "auto-detect-ckpt-format ckpt-convert-format ckpt-convert-save ckpt-convert-update-legacy-dist-opt-format "
             "fully-parallel-save no-fully-parallel-save async-save async-strategy use-persistent-ckpt-worker "
             "async-ckpt-cpu-priority async-ckpt-io-priority async-ckpt-use-cpu-shm fully-parallel-load "
             "ckpt-fully-parallel-load-exchange-algo ckpt-assume-constant-structure dist-ckpt-strictness "
             "dist-ckpt-optim-fully-reshardable save-tokenizer-assets use-dist-ckpt dist-ckpt-format "
             "no-initialization use-checkpoint-opt-param-scheduler override-opt-param-scheduler "
             "enable-hf2mg-convert enable-mg2hf-convert model-type-hf mg-cache-dir hf-cfg-dir "
             "load-checkpoint-with-weights-only"),
    **_names("data, dataset and tokenizer files: which tokens are read, not how many per micro-batch "
             "(arguments.py _add_data_args, training_config.py TokenizerConfig)",
             "data-path split train-data-path valid-data-path test-data-path data-args-path per-split-data-args-path "
             "per-dataset-sequences-path dataloader-fast-cache-load dataloader-defer-npy-index-mmap data-cache-path "
             "no-mmap-bin-files mmap-bin-files mock-data num-workers dataloader-type num-dataset-builder-threads "
             "object-storage-cache-path mid-level-dataset-surplus reset-position-ids reset-attention-mask "
             "eod-mask-loss no-create-attention-mask-in-dataloader create-attention-mask-in-dataloader "
             "short-seq-prob phase-transition-iterations vocab-file merge-file tokenizer-model metadata-path "
             "special-tokens tiktoken-pattern tiktoken-num-special-tokens tiktoken-special-tokens "
             "tokenizer-sentencepiece-legacy tokenizer-hf-no-use-fast tokenizer-hf-no-include-special-tokens "
             "tokenizer-hf-use-fast tokenizer-hf-include-special-tokens trust-remote-code null-tokenizer-eod-id "
             "null-tokenizer-pad-id chat-template use-gigatoken "
             # MindSpeed-LLM (mindspeed_llm/training/arguments.py) and Pai-Megatron-Patch data options
             "tokenizer-name-or-path tokenizer-not-use-fast handler-name prompt-type prompt-type-path "
             "is-instruction-dataset variable-seq-lengths no-shuffle full-shuffle-instruction-dataset "
             "tokenizer-padding-side dataset train-mode patch-tokenizer-type neat-pack padded-samples "
             "data-impl reset-position-ids-in-dataloader workers"),
    **_names("a scalar hyper-parameter of the optimizer, the loss scaler or the learning-rate schedule: no "
             "tensor's size depends on it (training_config.py SchedulerConfig, arguments.py "
             "_add_regularization_args, _add_mixed_precision_args)",
             "lr min-lr lr-decay-style lr-wsd-decay-style lr-decay-iters lr-decay-samples lr-wsd-decay-iters "
             "lr-wsd-decay-samples lr-warmup-fraction lr-warmup-iters lr-warmup-samples lr-warmup-init "
             "lr-decay-steps lr-warmup-steps start-weight-decay end-weight-decay weight-decay-incr-style "
             "weight-decay clip-grad adam-beta1 adam-beta2 adam-eps decoupled-lr decoupled-min-lr "
             "loss-scale initial-loss-scale min-loss-scale loss-scale-window hysteresis fp16-lr "
             "head-lr-mult muon-momentum muon-split-qkv muon-use-nesterov muon-scale-mode muon-fp32-matmul-prec "
             "muon-num-ns-steps muon-tp-mode muon-extra-scale-factor lr-wsd-decay-steps wsd-decay-steps "
             "wd-incr-steps"),
    **_names("initialisation and random seeds: the values of tensors, not their sizes (common_config.py RNGConfig)",
             "seed init-method-std init-method-xavier-uniform data-parallel-random-init te-rng-tracker "
             "inference-rng-tracker use-cpu-initialization init-model-with-meta-device perform-initialization "
             "embedding-init-method-std"),
    **_names("the length of the run, evaluation and exit conditions (training_config.py TrainingConfig, "
             "ValidationConfig): the peak of one training step is the same",
             "train-iters train-samples exit-interval exit-duration-in-mins exit-signal-handler exit-signal "
             "exit-signal-handler-for-dataloader exit-signal-handler-for-training manual-gc manual-gc-interval "
             "manual-gc-eval no-manual-gc-eval iterations-to-skip check-weight-hash-across-dp-replicas-interval "
             "gpu-sniff-test-interval train-sync-interval eval-iters eval-interval start-eval-at-iter skip-train "
             "test-mode full-validation multiple-validation-sets validation-set-names rampup-batch-size "
             "step-batch-size-schedule "
             "decrease-batch-size-if-needed empty-unused-memory-level rerun-mode check-for-nan-in-loss-and-grad "
             "no-check-for-nan-in-loss-and-grad check-for-spiky-loss check-for-large-grads error-injection-rate "
             "error-injection-type calculate-per-token-loss deterministic-mode record-memory-history "
             "memory-snapshot-path epochs"),
    **_names("process-group and launcher set-up (common_config.py DistributedInitConfig): no tensor of the model "
             "or the optimizer",
             "distributed-backend distributed-timeout-minutes local-rank lazy-mpu-init nccl-communicator-config-path "
             "use-tp-pp-dp-mapping use-gloo-process-groups no-use-gloo-process-groups disable-gloo-group "
             "use-sharp sharp-enabled-group high-priority-stream-groups distributed-timeout-seconds-after-init "
             "flight-recorder-dump-path flight-recorder-trace-buffer-size disable-jit-fuser no-shared-storage "
             "nproc-per-node nproc nnodes node-rank master-addr master-port rdzv-backend rdzv-endpoint rdzv-id "
             "ai-framework world-size"),
    **_names("how a step is scheduled or communicated, with the same tensors alive (arguments.py "
             "_add_distributed_args, distributed_data_parallel_config.py): in-place collectives on buffers "
             "memform counts",
             "align-grad-reduce no-align-grad-reduce no-align-param-gather align-param-gather "
             "overlap-param-gather-with-optimizer-step create-all-gather-group use-nccl-ub "
             "disable-symmetric-registration fsdp-manual-registration ddp-average-in-collective "
             "ddp-num-buckets ddp-pad-buckets-for-high-nccl-busbw ddp-reduce-scatter-with-fp32-accumulation "
             "no-gradient-reduce-div-fusion gradient-reduce-div-fusion async-tensor-model-parallel-allreduce "
             "no-async-tensor-model-parallel-allreduce distributed-optimizer-no-overlap "
             "overlap-p2p-communication overlap-p2p-communication-warmup-flush "
             "no-delay-grad-reduce delay-grad-reduce no-scatter-gather-tensors-in-pipeline "
             "scatter-gather-tensors-in-pipeline use-ring-exchange-p2p batch-p2p-comm no-batch-p2p-comm "
             "use-cp-send-recv-overlap "
             "moe-permutation-async-comm moe-alltoall-overlap-comm use-ascend-coc coc-fused-kernel "
             "coc-parallel-num coc-mode use-ascend-mc2"),
    **_names("a fused kernel computing the same result from the same saved tensors",
             "bias-gelu-fusion no-bias-gelu-fusion bias-swiglu-fusion bias-dropout-fusion no-bias-dropout-fusion "
             "masked-softmax-fusion apply-rope-fusion rope-fusion cross-entropy-loss-fusion "
             "cross-entropy-fusion-impl gradient-accumulation-fusion moe-permute-fusion moe-router-fusion "
             "persist-layer-norm no-persist-layer-norm use-fused-swiglu use-fused-rmsnorm use-fused-rotary-pos-emb "
             "use-fused-ring-attention-update use-fused-moe-token-permute-and-unpermute "
             "gemm-gradient-accumulation-fusion use-fast-cross-entropy use-fused-gating shape-order "
             "attention-softmax-in-fp32 accumulate-allreduce-grads-in-fp32"),
    **_names("chooses the classes that build the layers the other arguments describe (Megatron-Core or legacy "
             "models, MindSpeed-LLM's --spec module, Transformer Engine): the same weights and activations",
             "use-legacy-models use-mcore-models spec use-te model-provider"),
    **_names("a scalar of the model's numerics (norm epsilon, position scaling, logit scales, router "
             "coefficients): the same tensors",
             "norm-epsilon layernorm-epsilon rotary-base rotary-percent rotary-seq-len-interpolation-factor "
             "rotary-scaling-factor use-rope-scaling rope-scaling-factor rope-scaling-type rope-scaling-mscale "
             "rope-scaling-mscale-all-dim rope-scaling-original-max-position-embeddings rope-scaling-beta-fast "
             "rope-scaling-beta-slow beta-fast beta-slow mscale mscale-all-dim original-max-position-embeddings "
             "low-freq-factor high-freq-factor use-rotary-position-embeddings apply-layernorm-1p "
             "apply-query-key-layer-scaling no-query-key-layer-scaling apply-residual-connection-post-layernorm "
             "openai-gelu moe-router-load-balancing-type moe-router-score-function moe-router-topk-scaling-factor "
             "moe-router-num-groups moe-router-group-topk moe-router-enable-expert-bias moe-router-bias-update-rate "
             "moe-router-pre-softmax moe-router-dtype moe-router-force-load-balancing moe-aux-loss-coeff "
             "moe-z-loss-coeff moe-input-jitter-eps moe-token-drop-policy "
             "moe-shared-expert-overlap moe-router-topk-limited-devices "
             "moe-router-padding-for-fp8 moe-router-padding-for-quantization norm-topk-prob seq-aux "
             "router-gating-in-fp32 topk-softmax-in-fp32 moe-device-level-aux-loss-coeff moe-comm-aux-loss-coeff "
             "mtp-loss-scaling-factor qk-clip qk-clip-alpha qk-clip-threshold embedding-multiplier-scale "
             "output-multiplier-scale rotary-interleaved query-pre-attn-scalar partial-rotary-factor "
             "disable-bf16-reduced-precision-matmul "
             "input-embeds-norm add-rmsnorm-offset short-factor long-factor longrope-freqs-type short-mscale "
             "long-mscale original-max-position-embeddings rope-scaling-original-max-position-embeddings "
             "gelu-tanh"),
    **_names("Transformer Engine's fp8 scaling-history settings: a few fp32 scalars per GEMM",
             "fp8-margin fp8-interval fp8-amax-history-len fp8-amax-compute-algo fp8-wgrad no-fp8-wgrad"),
    # Megatron's FSDP options whose buffers the ZeRO-3 formulas (common.mf gathered_params) already count
    "mla-fa-without-pad": "MindSpeed's flash attention on the value heads at v_head_dim, unpadded: what mla.mf counts",
    "no-enable-linear-qkv": "MindSpeed's separate q, k and v projections: the same weights as the fused one",
    "fsdp-double-buffer": "Megatron-FSDP's two all-gather buffers, which the ZeRO-3 formulas' (1 + prefetch) "
                          "gathered parameters already count",
    "megatron-fsdp-version": "which Megatron-FSDP implementation shards them, not what is sharded",
    "cpu-offloading-retain-pinned-cpu-buffers": "keeps the offloaded activations' pinned host buffers for the next "
                                                "step (model_parallel_config.py): host memory, the same bytes",
}

#: arguments that change memory in a way memform does not model: the import stops naming file, line,
#: argument and why, unless the value is one of the neutral values listed (None: any value is refused)
REFUSED: dict[str, tuple[str, tuple[str, ...]]] = {
    "tp-comm-overlap": ("allocates Transformer Engine's userbuffers for the tensor-parallel GEMM overlap "
                        "(megatron/training/initialize.py _initialize_tp_communicators), not modelled", ()),
    "cpu-offloading-double-buffering": ("keeps two persistent device buffers of an offloaded layer's activations "
                                        "for the reloads (Transformer Engine cpu_offload_v1.py "
                                        "reload_double_buffer), not modelled", ("false",)),
    "delta-offload-bytes-across-pp-ranks": ("keeps stage i's first i x N offloaded bytes of fine-grained activation "
                                            "offloading on the device (fine_grained_activation_offload.py "
                                            "post_warmup_callback), not modelled", ("0",)),
    "activation-offload-fraction": ("keeps the last forward groups of each chunk of fine-grained activation "
                                    "offloading on the device (fine_grained_activation_offload.py "
                                    "post_warmup_callback), not modelled", ("1", "1.0")),
    "delay-offload-until-cuda-graph": ("defers fine-grained activation offloading to CUDA graph replay, "
                                       "not modelled", ("false",)),
    "fine-grained-offloading-max-inflight-offloads": ("caps fine-grained activation offloading's pending "
                                                      "copies under full-iteration CUDA graphs, not modelled", ()),
    "overlap-moe-expert-parallel-comm": ("runs two micro-batches at once to hide the expert all-to-all "
                                         "(EP A2A overlap), holding both of their activations; not modelled", ()),
    "delay-wgrad-compute": ("keeps activations until the delayed weight-gradient GEMM, not modelled", ()),
    "defer-embedding-wgrad-compute": ("keeps the output layer's inputs of several micro-batches for a deferred "
                                      "weight gradient, not modelled", ()),
    "enable-cuda-graph": ("CUDA graphs keep static input, output and workspace buffers per graph, not modelled", ()),
    "external-cuda-graph": ("CUDA graphs keep static buffers per graph, not modelled", ()),
    "cuda-graph-impl": ("CUDA graphs keep static buffers per graph, not modelled", ("none",)),
    "cuda-graph-scope": ("CUDA graphs keep static buffers per graph, not modelled", ()),
    "moe-enable-deepep": ("DeepEP allocates its own NVLink / RDMA dispatch buffers, not modelled", ()),
    "moe-flex-dispatcher-backend": ("the flex dispatcher's DeepEP / HybridEP buffers are not modelled", ()),
    "num-distributed-optimizer-instances": ("shards the optimizer within dp / N ranks only (partial "
                                            "distributed optimizer), not read by this importer", ("1",)),
    "outer-dp-sharding-strategy": ("hybrid FSDP's outer sharding is not read by this importer", ("no_shard",)),
    "megatron-fsdp-main-params-dtype": ("Megatron-FSDP master-weight dtype, not modelled", ("fp32", "auto")),
    "megatron-fsdp-main-grads-dtype": ("Megatron-FSDP main-gradient dtype, not modelled", ("auto", "fp32")),
    "megatron-fsdp-grad-comm-dtype": ("Megatron-FSDP gradient-communication dtype, not modelled", ("auto", "fp32")),
    "megatron-fsdp-max-pool-double-buffer": ("sizes Megatron-FSDP's double buffers by the largest layer, "
                                             "not modelled", ()),
    "fsdp-db-use-persist-buf-on-alloc-fail": ("falls back to persistent FSDP buffers, not modelled", ()),
    "moe-layer-recompute": ("recomputes MoE layers, which memform's recompute modes do not express", ()),
    "freeze-llm": ("frozen weights keep no gradients or optimizer states, not modelled", ()),
    "freeze-vit": ("frozen weights keep no gradients or optimizer states, not modelled", ()),
    "freeze-lm": ("frozen weights keep no gradients or optimizer states, not modelled", ()),
    "loss-compute-mode": ("MindSpeed's chunked loss keeps part of the logits only, not modelled", ("default",)),
    "interleave-sliding-window": ("sliding-window attention is not read by this importer", ()),
    "full-attention-interval": ("linear (gated delta net) attention layers are not read by this importer", ()),
    "use-triton-gdn": ("linear (gated delta net) attention layers are not read by this importer", ()),
    "linear-attention-type": ("linear attention layers are not read by this importer", ()),
    "post-norm": ("post-norm layers (Gemma-2's extra norms) are not read by this importer", ()),
    "heterogeneous-layers-config-path": ("per-layer block configs are not read by this importer", ()),
    "heterogeneous-layers-config-encoded-json": ("per-layer block configs are not read by this importer", ()),
    "pipeline-model-parallel-layout": ("a custom pipeline layout is not read by this importer", ()),
    "sliding-window-size": ("sliding-window attention is not read by this importer", ()),
    "window-size": ("sliding-window attention is not read by this importer", ()),
    "moe-router-topk-limited-devices-deprecated": ("not modelled", ()),
    "extra-vocab-size": ("Pai-Megatron-Patch's vocabulary is the tokenizer's size + --extra-vocab-size "
                         "(megatron_patch/tokenizer/__init__.py build_tokenizer), and memform does not open the "
                         "tokenizer: pass --set model.vocab_size=N with the model's vocabulary", ("0",)),
    # MindSpeed (Ascend/MindSpeed, MindSpeed-LLM) memory features
    "swap-attention": ("MindSpeed swaps attention activations to the host, not modelled", ()),
    "swap-optimizer": ("MindSpeed swaps optimizer states to the host, not modelled", ()),
    "optimizer-offload-policy": ("Pai-Megatron-Patch's hybrid-Adam optimizer offload is not modelled", ()),
    "recompute-activation-function": ("MindSpeed recomputes the MLP activation, not modelled", ()),
    "recompute-norm": ("MindSpeed recomputes the norms, not modelled", ()),
    "recompute-in-advance": ("MindSpeed's recompute scheduling is not modelled", ()),
    "recompute-in-bubble": ("MindSpeed's recompute scheduling is not modelled", ()),
    "enable-recompute-layers-per-pp-rank": ("changes which layers recompute, not modelled", ()),
    "adaptive-recompute-device-swap": ("MindSpeed's adaptive recompute is not modelled", ()),
    "adaptive-recompute-device-size": ("MindSpeed's adaptive recompute is not modelled", ()),
    "adaptive-memory-optimization": ("MindSpeed's adaptive memory optimisation is not modelled", ()),
    "moe-zero-memory": ("MindSpeed's MoE activation recompute is not modelled", ("disable",)),
    "moe-fb-overlap": ("MindSpeed's forward/backward overlap holds two micro-batches, not modelled", ()),
    "moe-tp-extend-ep": ("MindSpeed shards experts over tp × ep without tensor-splitting them, not modelled", ()),
    "mtp-mem-efficient-logits": ("MindSpeed's memory-efficient MTP logits are not modelled", ()),
    "o2-optimizer": ("MindSpeed's O2 keeps bf16 optimizer states, not modelled", ()),
    "o2-gradient": ("MindSpeed's O2 keeps bf16 main gradients, not modelled", ()),
    "use-ascend-mc2-deprecated": ("not modelled", ()),
    "kv-head-repeat-before-uly-alltoall": ("repeats KV heads before the Ulysses all-to-all, not modelled", ()),
    "mla-mm-split": ("MindSpeed's split MLA matmuls are not modelled", ()),
    "enable-mla-absorb": ("MLA weight absorption is not modelled", ()),
}

#: families of neutral arguments, by prefix (the same reasons as NEUTRAL's groups)
NEUTRAL_PREFIXES = ("log-", "tensorboard-", "wandb-", "ckpt-", "dist-ckpt-", "non-persistent-", "async-ckpt-",
                    "flight-recorder-", "one-logger-", "straggler-", "pytorch-profiler-", "inprocess-", "ft-",
                    "msc-", "eval-", "tiktoken-", "lr-", "adam-", "rope-scaling-", "fp8-amax-", "exit-",
                    "no-load-", "no-save-", "save-", "wsd-", "profile-", "nsys-", "rerun-", "error-injection-",
                    "muon-", "workload-inspector-", "data-cache-", "mock-", "ddp-", "reset-",
                    # the userbuffer settings of --tp-comm-overlap, which is refused itself (REFUSED)
                    "tp-comm-")

#: Megatron-LM launchers of other model families, whose layers the GPT arguments here do not describe
OTHER_MODELS = {"pretrain_bert.py": "BERT (encoder with a pooler and a binary head)",
                "pretrain_t5.py": "T5 (encoder-decoder)", "pretrain_retro.py": "RETRO",
                "pretrain_ict.py": "ICT retriever", "pretrain_vlm.py": "vision-language models",
                "pretrain_vision_classify.py": "vision models", "pretrain_vision_dino.py": "vision models",
                "pretrain_vision_inpaint.py": "vision models"}

#: Megatron-LM's multi-latent-attention defaults (arguments.py, "_add_mla_args" group)
MLA_DEFAULTS = {"kv-lora-rank": 32, "qk-head-dim": 128, "qk-pos-emb-head-dim": 64, "v-head-dim": 128}
#: vocabulary sizes of Megatron's built-in tokenizers that need no vocabulary file to know:
#: _GPT2BPETokenizer.vocab_size = len(encoder) of GPT-2's vocabulary, 50257 (Radford et al. 2019;
#: openai-community/gpt2 config.json vocab_size, tests/data/importers/gpt2.config.json)
TOKENIZER_VOCAB = {"GPT2BPETokenizer": 50257}
CP_ALGOS = {"p2p": "ring", "all_gather": "allgather", "a2a": "ulysses"}


#: flags memform reads as booleans (store_true in arguments.py): a word after one is not its value
FLAGS = {"bf16", "fp16", "swiglu", "group-query-attention", "disable-bias-linear", "sequence-parallel",
         "use-distributed-optimizer", "use-flash-attn", "untie-embeddings-and-output-weights",
         "moe-grouped-gemm", "multi-latent-attention", "recompute-activations", "distribute-saved-activations",
         "fp8-param-gather", "fp8-dot-product-attention", "grad-reduce-in-bf16", "overlap-grad-reduce",
         "overlap-param-gather", "use-precision-aware-optimizer", "use-rotary-position-embeddings",
         "fp8-e4m3", "fp8-hybrid", "use-mcore-models", "moe-shared-expert-gate", "mock-data",
         "no-bias-swiglu-fusion", "no-rope-fusion", "no-masked-softmax-fusion", "use-legacy-models",
         "no-gradient-accumulation-fusion", "optimizer-cpu-offload", "fine-grained-activation-offloading",
         "activation-func-fp8-input-store", "account-for-embedding-in-pipeline-split",
         "account-for-loss-in-pipeline-split", "use-megatron-fsdp", "use-custom-fsdp", "use-torch-fsdp2",
         "reuse-fp32-param", "shared-expert-gate", "no-position-embedding", "tp-comm-overlap",
         "no-overlap-p2p-communication"}

#: the memform key an argument decides, for the ``--set`` a message suggests
ARG_KEYS = {
    "num-layers": "model.num_layers", "hidden-size": "model.hidden_size",
    "num-attention-heads": "model.num_heads", "num-query-groups": "model.num_kv_heads",
    "ffn-hidden-size": "model.ffn_hidden_size", "seq-length": "model.seq_length",
    "encoder-seq-length": "model.seq_length", "vocab-size": "model.vocab_size",
    "padded-vocab-size": "model.vocab_size", "tokenizer-type": "model.vocab_size",
    "make-vocab-size-divisible-by": "model.vocab_size", "num-experts": "model.num_experts",
    "moe-router-topk": "model.moe_top_k", "moe-ffn-hidden-size": "model.moe_ffn_hidden_size",
    "moe-token-dispatcher-type": "megatron.moe_token_dispatcher_type",
    "moe-layer-freq": "model.moe_layer_freq", "tensor-model-parallel-size": "parallel.tp",
    "pipeline-model-parallel-size": "parallel.pp", "context-parallel-size": "parallel.cp",
    "expert-model-parallel-size": "parallel.ep", "expert-tensor-parallel-size": "parallel.expert_tp",
    "micro-batch-size": "training.micro_batch_size", "global-batch-size": "training.global_batch_size",
    "world-size": "parallel.devices",
    "kv-lora-rank": "model.kv_lora_rank", "q-lora-rank": "model.q_lora_rank",
    "qk-head-dim": "model.qk_nope_head_dim", "qk-pos-emb-head-dim": "model.qk_rope_head_dim",
    "v-head-dim": "model.v_head_dim", "mtp-num-layers": "model.mtp_layers",
}


class Unknown(str):
    """An argument value the script does not determine (its text is the source, e.g. ``$NUM_LAYERS``)."""

    refs: tuple[Ref, ...] = ()

    @classmethod
    def of(cls, word: Word) -> "Unknown":
        value = cls(word.text)
        value.refs = word.refs
        return value


def _is_unknown(value: Any) -> bool:
    return isinstance(value, Unknown) or isinstance(value, list) and any(isinstance(v, Unknown) for v in value)


@dataclass
class Source:
    """The arguments one or more files give (later files override earlier ones, argument by argument)."""

    args: dict[str, Any] = field(default_factory=dict)
    devices: int | None = None
    warnings: list[str] = field(default_factory=list)
    #: argument -> the file it came from (the last file that gave it), and the line there (0: not known)
    origin: dict[str, Path] = field(default_factory=dict)
    line: dict[str, int] = field(default_factory=dict)

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)


def read_arguments(path: Path) -> tuple[dict[str, Any], int | None, list[str]]:
    """(arguments by dashed name, devices from a torchrun launcher line, warnings) of one file."""
    source = read_sources([path])
    return source.args, source.devices, source.warnings


def read_sources(paths: list[Path], positional: list[str] | None = None) -> Source:
    """Follow the files in order, as one shell session (variables set in one are seen by the next):
    each gives the arguments of its ``*.py`` launcher command, or, without one, its own words
    (an arguments file: one per line, or shell-style). ``positional``: the scripts' own arguments
    (``--args``), None when none were given (``$1`` without a default is then unknown)."""
    shell = Shell(positional)
    source = Source()
    for path in paths:
        args, devices, warnings, lines = _read_one(Path(path), shell)
        for w in warnings:
            source.warn(w)
        for key, value in args.items():
            source.args[key] = value
            source.origin[key] = Path(path)
            source.line[key] = lines.get(key, 0)
        if devices is not None:
            source.devices = devices
    if not source.args:
        # no launcher and no plain arguments anywhere: files that only define the arguments, in arrays
        # (GPT_ARGS=( --num-layers 96 ... )) or in strings (ARGS="--num-layers 96 ...") that another
        # script passes on -- taken in the order they were defined
        def holds_arguments(value: Word | list[Word]) -> bool:
            first = value[0] if isinstance(value, list) and value else value
            return isinstance(first, Word) and first.text.lstrip().startswith("--")
        arrays = [(name, value if isinstance(value, list) else [value]) for name, value in shell.vars.items()
                  if holds_arguments(value)]
        if arrays:
            source.warn(f"no command runs a *.py script; took the arguments of the variables "
                        f"{', '.join(name for name, _ in arrays)}")
            words = [w for _, value in arrays for piece in value for w in _resplit(piece)]
            source.args, _, lines = _options(words)
            source.origin = {key: Path(paths[-1]) for key in source.args}
            source.line = lines
    if not source.args:
        names = ", ".join(str(p) for p in paths)
        raise MemformError(f"{names}: no --arguments found (expected Megatron-LM arguments such as "
                           f"--num-layers 32, or a launch script that runs pretrain_gpt.py with them)")
    return source


def _read_one(path: Path, shell: Shell) -> tuple[dict[str, Any], int | None, list[str], dict[str, int]]:
    """One file's (arguments, launcher devices, warnings, the line each argument was written on)."""
    text = read_text(path).replace("\r\n", "\n")
    try:
        script = shell.run(path, text)
    except ShellParseError:
        if re.search(r"\$|\b[A-Za-z_]\w*\+?=\(|\.py\b", text):
            raise
        return _read_plain(path, text)
    warnings = list(script.warnings)
    launcher = _launcher([_inner_command(c) for c in script.commands])
    devices = None
    if launcher is not None:
        command, at = launcher
        name = Path(command.words[at].text).name
        if name in OTHER_MODELS:
            raise MemformError(f"{path}:{command.line}: runs {name}, Megatron-LM's {OTHER_MODELS[name]}: this "
                               f"importer reads the arguments of GPT-style decoders (pretrain_gpt.py and the "
                               f"MindSpeed-LLM / Pai-Megatron-Patch launchers built on it) only")
        words = command.words[at + 1:]
        devices = _devices(path, command.words[:at], warnings)
    else:
        words = [w for c in script.commands if c.words[0].known and c.words[0].text.startswith("-")
                 for w in c.words]
    args, strays, lines = _options(words)
    if launcher is not None and name in megatron_hybrid.LAUNCHERS:
        args.setdefault("is-hybrid-model", True)   # pretrain_mamba.py builds a MambaModel (issue 34)
    for w in strays:
        if w.known:
            warnings.append(f"stray token {w.text!r} ignored (not after an --option)")
        else:
            warnings.append(f"{path}:{w.line}: {w.text} is not known ({w.refs[0].describe()}) and stands where "
                            f"no value is expected: whatever arguments it holds are not imported")
    return args, devices, warnings, lines


def _resplit(word: Word) -> list[Word]:
    """An array element (or a string variable) as the words an unquoted ``${ARR[@]}`` / ``$ARGS`` would
    make of it: known text splits on whitespace; an unknown piece stays one word with its references
    (``--config $ENV_CONFIG --seq-length 8192`` gives four words, the second unknown)."""
    if word.known:
        return [Word(t, word.line) for t in word.text.split()]
    fields: list[tuple[str, tuple]] = []
    current: tuple[str, tuple] | None = None
    for text, refs in word.pieces():
        if refs:  # an unexpanded reference: glued to the field it stands in
            current = (current[0] + text, current[1] + tuple(refs)) if current else (text, tuple(refs))
            continue
        chunks = re.split(r"(\s+)", text)
        for chunk in chunks:
            if not chunk:
                continue
            if chunk.isspace():
                if current is not None:
                    fields.append(current)
                current = None
            else:
                current = (current[0] + chunk, current[1]) if current else (chunk, ())
    if current is not None:
        fields.append(current)
    return [Word(t, word.line, refs) for t, refs in fields]


def _read_plain(path: Path, text: str) -> tuple[dict[str, Any], int | None, list[str], dict[str, int]]:
    """A file bash cannot parse but shlex can split (``--moe-layer-freq ([0]*3+[1]*58)`` unquoted)."""
    try:
        tokens = shlex.split(re.sub(r"\\\r?\n", " ", text), comments=True)
    except ValueError as exc:
        raise MemformError(f"{path}: cannot split the arguments shell-style: {exc}") from None
    args, strays, _ = _options([Word(t, 0) for t in tokens])
    return args, None, [f"stray token {w.text!r} ignored (not after an --option)" for w in strays], {}


#: shells whose ``-c STRING`` runs STRING as a command line (``srun ... bash -c "$LAUNCHER $CMD"``)
SHELLS = {"bash", "sh"}


def _inner_command(command: Command) -> Command:
    """``srun ARGS bash -c "STRING"`` (BigScience's Megatron-DeepSpeed scripts): the command STRING runs,
    its words split as bash would (the wrapper's own options -- srun's -- are not the training script's)."""
    words = command.words
    for i, w in enumerate(words[:-2]):
        if w.known and Path(w.text).name in SHELLS and words[i + 1].known and words[i + 1].text == "-c":
            # the inner shell parses STRING again: quotes that were literal in a variable now quote
            # (--pp-partition-method 'type:transformer|embedding' inside "$CMD")
            return Command([_unquote(x) for x in _resplit(words[i + 2])], command.line)
    return command


def _unquote(word: Word) -> Word:
    text = word.text
    if word.known and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return Word(text[1:-1], word.line)
    return word


def _launcher(commands: list[Command]) -> tuple[Command, int] | None:
    """The command that runs the training script: the last that runs ``pretrain_*.py``, else the last
    that runs any ``*.py`` (``torchrun ... pretrain_gpt.py``, ``python pretrain_gpt.py``, ``deepspeed``;
    its directory may be unknown: `` `pwd`/pretrain_gpt.py ``)."""
    found: list[tuple[Command, int]] = []
    for command in commands:
        for i, w in enumerate(command.words):
            if w.text.endswith(".py") and (w.known or re.fullmatch(r"[\w.-]+\.py", w.text.rsplit("/", 1)[-1])):
                found.append((command, i))
                break
    preferred = [c for c in found if Path(c[0].words[c[1]].text).name.startswith("pretrain")]
    return (preferred or found or [None])[-1]


def _devices(path: Path, words: list[Word], warnings: list[str]) -> int | None:
    """torchrun / torch.distributed.launch: --nproc_per_node × --nnodes; deepspeed: --num_gpus × --num_nodes."""
    launcher, _, _ = _options(words[1:])
    for per_node_key, nodes_key in (("nproc-per-node", "nnodes"), ("num-gpus", "num-nodes")):
        if per_node_key not in launcher:
            continue
        per_node, nodes = launcher[per_node_key], launcher.get(nodes_key, "1")
        for value, key in ((per_node, per_node_key), (nodes, nodes_key)):
            if isinstance(value, Unknown):
                warnings.append(f"{path}:{value.refs[0].line}: the device count is not known: --{key} is "
                                f"{value} ({value.refs[0].describe()}); pass --devices N")
                return None
        if str(per_node).isdigit() and str(nodes).isdigit():
            return int(per_node) * int(nodes)
        warnings.append(f"{path}: the device count is not known: --{per_node_key} {per_node} --{nodes_key} "
                        f"{nodes}; pass --devices N")
    return None


def _options(words: list[Word]) -> tuple[dict[str, Any], list[Word], dict[str, int]]:
    """``--a 1 --b --c x y --d=2`` → {a: "1", b: True, c: ["x", "y"], d: "2"}, the stray words
    (values the script does not determine are :class:`Unknown`) and the line each option was written on."""
    out: dict[str, Any] = {}
    lines: dict[str, int] = {}
    strays: list[Word] = []
    key = None
    for word in words:
        tok = word.text
        if word.known and tok.startswith("--") and len(tok) > 2:
            name, eq, value = tok[2:].partition("=")
            key = name.replace("_", "-")
            out[key] = value if eq else True
            lines[key] = word.line
            if eq:
                key = None
            continue
        if key is None or not word.known and key in FLAGS:
            strays.append(word)
            continue
        if not word.known and out[key] is not True and len(word.refs) == 1 and word.refs[0].kind == "environment" \
                and re.fullmatch(r"\$\{?\w+\}?", word.text):
            # an unset variable after an option that has its value (``--moe-layer-freq X ${offload_option}``):
            # a bundle of options the script did not set (bash expands it to nothing), not a second value
            strays.append(word)
            continue
        value = tok if word.known else Unknown.of(word)
        current = out[key]
        out[key] = value if current is True else (current + [value] if isinstance(current, list) else [current, value])
        if word.line:
            lines[key] = word.line  # the value's line: where a variable holding it was set, if it was
    return out, strays, lines


@dataclass
class ScriptFields(Fields):
    """Fields whose values may be :class:`Unknown`: reading one is an error naming the file, line and
    variable, unless the memform key it decides was given with ``--set`` (then that value is used)."""

    given: Any = None
    origin: Mapping[str, Path] = field(default_factory=dict)
    line: Mapping[str, int] = field(default_factory=dict)

    def error(self, key: str, what: str) -> MemformError:
        line = self.line.get(key, 0)
        where = f"{self.origin.get(key, self.file)}" + (f":{line}" if line else "")
        return MemformError(f"{where}: field '{self.name(key)}' {what}")

    def raw(self, key: str, default: Any = None) -> Any:
        value = super().raw(key, default)
        if not _is_unknown(value):
            return value
        memform_key = ARG_KEYS.get(key)
        if memform_key is not None and isinstance(self.given, Mapping) and memform_key in self.given:
            return self.given[memform_key]
        # ``--set`` can stand in only when the import passes the values it sets (a mapping)
        raise unknown_error(key, value, memform_key if isinstance(self.given, Mapping) else None)


def unknown_error(key: str, value: Any, memform_key: str | None) -> MemformError:
    """The error for an argument memform needs whose value the script does not determine."""
    unknown = value if isinstance(value, Unknown) else next(v for v in value if isinstance(v, Unknown))
    ref = unknown.refs[0]
    how = [f"set {ref.name} in the script" if ref.kind in ("environment", "positional") and not
           ref.name.isdigit() else "give it a value in the script",
           f"put --{key} VALUE in an arguments file named after the script"]
    if ref.kind == "environment":
        how.insert(1, f"name a file that sets {ref.name}=VALUE before the script")
    if memform_key is not None:
        how.append(f"pass --set {memform_key}=VALUE")
    return MemformError(f"{ref.file}:{ref.line}: --{key} is {value if isinstance(value, str) else ' '.join(value)}, "
                        f"and {ref.describe()}: memform does not run the script, so its value is unknown; "
                        f"{', '.join(how[:-1])} or {how[-1]}")


#: ``memform import megatron`` reads several files (importers.takes_several_files)
MULTI_FILE = True


#: ``memform import megatron --args "..."`` passes the script's positional arguments
TAKES_ARGS = True


def convert(path: Path | list[Path], draft: Draft, given: set[str] | Mapping[str, Any],
            args: list[str] | None = None) -> int | None:
    """Fill ``draft`` from Megatron-LM arguments; returns the device count a launcher line gives.

    ``path`` is one file or a list of them (launch scripts, arguments files, files of variable
    assignments), read in order as one shell session; an argument given again in a later file
    overrides the earlier one. ``given``: the memform keys set on the command line (a mapping of
    them to their values lets ``--set`` stand in for an argument whose value the script leaves unknown).
    """
    paths = [Path(path)] if isinstance(path, (str, Path)) else [Path(p) for p in path]
    source = read_sources(paths, args)
    for w in source.warnings:
        draft.warn(_local(w, paths))
    shown = paths[0] if len(paths) == 1 else Path(", ".join(str(p) for p in paths))
    f = ScriptFields(source.args, shown, "--", given=given, origin=source.origin, line=source.line)
    devices = source.devices
    if _is_unknown(source.args.get("world-size")):
        ref = source.args["world-size"].refs[0] if isinstance(source.args["world-size"], Unknown) else None
        draft.warn(_local(f"{ref.file}:{ref.line}: " if ref else "", paths) + f"--world-size is "
                   f"{source.args['world-size']}, not known without running the script: the device count "
                   f"comes from the launcher, or pass --devices N")
        f.used.add("world-size")
        source.args.pop("world-size")
    world = f.integer("world-size", None)
    devices = world or devices

    # the profile of what Megatron-LM allocates beyond the base formulas (formulas/frameworks/megatron.mf)
    draft.set("training.framework", "megatron", "Megatron-LM / Megatron-Core (formulas/frameworks/megatron.mf)")
    L = f.integer("num-layers")
    h = f.integer("hidden-size")
    a = f.integer("num-attention-heads")
    draft.set("model.hidden_size", h, "--hidden-size")
    draft.set("model.num_heads", a, "--num-attention-heads")
    if f.boolean("group-query-attention", False):
        draft.set("model.num_kv_heads", f.integer("num-query-groups", 1), "--num-query-groups")
    else:
        if f.has("num-query-groups"):
            draft.warn("--num-query-groups is ignored by Megatron without --group-query-attention")
        f.used.add("num-query-groups")
        draft.set("model.num_kv_heads", a, "no --group-query-attention: multi-head attention")
    draft.set("model.num_layers", L, "--num-layers")
    swiglu = f.boolean("swiglu", False)
    if f.has("ffn-hidden-size"):
        ffn = f.integer("ffn-hidden-size")
        draft.set("model.ffn_hidden_size", ffn, "--ffn-hidden-size")
    else:
        # Megatron's default: 4h, or for SwiGLU 2/3 of it rounded down to a multiple of 64
        ffn = int(4 * h * 2 / 3 / 64) * 64 if swiglu else 4 * h
        draft.set("model.ffn_hidden_size", ffn, "Megatron's default for " +
                  ("--swiglu: int(8h/3/64)*64" if swiglu else "GeLU: 4h"))
    tp = f.integer("tensor-model-parallel-size", 1)
    _vocab(f, draft, tp, given)
    seq_arg, seq = f.first(("seq-length", "encoder-seq-length"), f.integer)
    if seq is None:
        raise f.missing("seq-length")
    draft.set("model.seq_length", seq, f"--{seq_arg}")
    draft.set("model.activation", "swiglu" if swiglu else "gelu", "--swiglu" if swiglu else "no --swiglu")
    norm = f.string("normalization", "LayerNorm")
    if norm not in ("LayerNorm", "RMSNorm"):
        raise f.error("normalization", f"must be LayerNorm or RMSNorm, got {norm!r}")
    draft.set("model.norm", norm.lower(), "--normalization" if f.has("normalization") else "Megatron's default")
    draft.set("model.bias", not f.boolean("disable-bias-linear", False),
              "--disable-bias-linear" if f.has("disable-bias-linear") else "no --disable-bias-linear")
    rates = {k: f.number(k, 0.1) for k in ("attention-dropout", "hidden-dropout")}
    draft.set("model.dropout", any(r > 0 for r in rates.values()),
              ", ".join(f"--{k} {v}" for k, v in rates.items()))
    _attention_kernel(f, draft)
    _unfused_kernels(f, draft, swiglu)
    draft.set("model.tied_embeddings", not f.boolean("untie-embeddings-and-output-weights", False),
              "--untie-embeddings-and-output-weights" if f.has("untie-embeddings-and-output-weights")
              else "Megatron ties them unless --untie-embeddings-and-output-weights")
    _positions(f, draft)
    # Megatron-Core TransformerConfig: kv_channels (the head size, default hidden / heads) sizes the query
    # projection (kv_channels × heads) and K/V (kv_channels × query groups): model.head_dim
    kv_channels = f.integer("kv-channels", None)
    if kv_channels is not None and kv_channels * a != h and not f.boolean("multi-latent-attention", False):
        draft.set("model.head_dim", kv_channels, f"--kv-channels ({kv_channels} × {a} heads != hidden {h})")
    # add_qkv_bias: a bias on the QKV projection only (TransformerConfig; linear_qkv bias = add_bias_linear
    # or add_qkv_bias); qk_layernorm: q/k norms of the head size, per head (attention.py q_layernorm)
    if f.boolean("add-qkv-bias", False):
        draft.set("model.qkv_bias", True, "--add-qkv-bias")
    if f.boolean("qk-layernorm", False) and not f.boolean("multi-latent-attention", False):
        # (with MLA, --qk-layernorm norms the query and key/value latents -- multi_latent_attention.py
        # q_layernorm / kv_layernorm --, which mla.mf counts)
        draft.set("model.qk_norm", True, "--qk-layernorm (per head, Megatron-Core)")
    _moe(f, draft)
    _mla(f, draft)
    megatron_linear.convert(f, draft, L)   # Gated DeltaNet hybrids (deltanet.mf)
    if megatron_hybrid.is_hybrid(f):   # hybrid Mamba-2 stacks: mamba.mf (issue 34)
        megatron_hybrid.apply(f, draft, L, h)
    if f.boolean("embed-layernorm", False):
        # Megatron-DeepSpeed's LayerNorm on the word embeddings (BLOOM): dense.mf model.embedding_norm
        draft.set("model.embedding_norm", True, "--embed-layernorm (Megatron-DeepSpeed)")
    mtp = f.integer("mtp-num-layers", 0, minimum=0)
    if mtp:
        draft.set("model.mtp_layers", mtp, "--mtp-num-layers")

    _strategy(f, draft, L, tp)
    _training(f, draft)
    _megatron_deepspeed(f, draft, L)
    _activation_offload(f, draft, L)
    _mindspeed(f, draft)
    _unread(f, draft, source.args)
    return devices


#: Megatron-DeepSpeed (bigscience-workshop/Megatron-DeepSpeed 8387ae1, BLOOM's; microsoft/Megatron-DeepSpeed):
#: the activation-checkpointing arguments DeepSpeed's own checkpointing adds (megatron/arguments.py
#: _add_activation_checkpoint_args), each refused unless off: they change what a checkpoint keeps
DS_CHECKPOINTING = {"partition-activations": "splits each checkpointed input over the tensor-parallel ranks",
                    "contigious-checkpointing": "copies the checkpoints into one preallocated buffer",
                    "checkpoint-in-cpu": "keeps the checkpoints in host memory"}


def _megatron_deepspeed(f: "ScriptFields", draft: Draft, layers: int) -> None:
    """Megatron-DeepSpeed's own arguments: the legacy --checkpoint-activations, DeepSpeed's engine
    (--deepspeed, --zero-stage; the PipelineEngine with pp > 1) and --pp-partition-method."""
    # --checkpoint-activations / --checkpoint-num-layers (arguments.py:512-520; gpt_model.py GPTModelPipe:
    # activation_checkpoint_interval = checkpoint_num_layers): each group of N layers is checkpointed whole
    if f.boolean("checkpoint-activations", False) and not f.has("recompute-granularity"):
        draft.set("training.recompute", "full", "--checkpoint-activations")
        n = f.integer("checkpoint-num-layers", 1, minimum=1)
        if n > 1:
            draft.set("megatron.recompute_uniform_layers", n, "--checkpoint-num-layers")
    else:
        f.used.add("checkpoint-num-layers")
    if f.boolean("distribute-checkpointed-activations", False):
        draft.set("megatron.distribute_saved_activations", True, "--distribute-checkpointed-activations")
    for arg, why in DS_CHECKPOINTING.items():
        if f.boolean(arg, False):
            raise f.error(arg, f"{why} (DeepSpeed activation checkpointing), which memform does not model")
    f.used.update(("deepspeed-activation-checkpointing", "synchronize-each-layer", "profile-backward"))
    pp = int(draft.get("parallel.pp", 1))
    method = f.string("pp-partition-method", "type:transformer")
    if method == "type:transformer|embedding" and pp > 1:
        # DeepSpeed PipelineModule partition "type:REGEX" (runtime/pipe/module.py _partition_layers): the
        # layers whose class matches count one each, balanced over the stages -- here the transformer layers
        # and the two EmbeddingPipe (the tied input embedding and output head): (L + 2) / pp per stage, one
        # decoder fewer on the first and last (the BLOOM README's "pp rank 0: [embed | 5 transformer blocks]")
        each = divide(layers + 2, pp, "--num-layers + 2 embeddings over the pipeline stages", f.file)
        draft.set("parallel.stage_layers", [each - 1] + [each] * (pp - 2) + [each - 1],
                  "--pp-partition-method 'type:transformer|embedding': (L + 2) / pp per stage, the embedding "
                  "and the head each taking a layer's slot")
    elif method != "type:transformer":
        raise f.error("pp-partition-method", f"is {method!r}; memform reads DeepSpeed's type:transformer "
                                             f"(Megatron-DeepSpeed's default) and type:transformer|embedding only")
    if not f.boolean("deepspeed", False):
        f.used.update(("zero-stage", "deepspeed-config", "deepspeed_config"))
        return
    # --deepspeed: DeepSpeed's engine trains the model (its PipelineEngine with pp > 1): formulas/frameworks/
    # deepspeed.mf. The ZeRO stage is the ds_config's zero_optimization.stage; a launch script writes that file
    # when it runs, so the stage here is --zero-stage, which such scripts pass beside it
    draft.set("training.framework", "deepspeed", "--deepspeed: DeepSpeed's engine (formulas/frameworks/deepspeed.mf)")
    stage = f.integer("zero-stage", 1, minimum=0)
    f.used.update(("deepspeed-config", "deepspeed_config"))
    draft.warn("--deepspeed-config is not read (a launch script writes it when it runs): the ZeRO stage is "
               f"--zero-stage {stage}{'' if f.has('zero-stage') else ' (its default)'}; check that the "
               f"ds_config's zero_optimization.stage agrees")
    params = draft.get("training.precision.params")
    if stage == 0 and pp > 1 and params == "bf16":
        # engine.py _do_optimizer_sanity_check: bf16 without ZeRO under pipeline parallelism is BF16_Optimizer,
        # ZeRO-1's sharding with fp32 gradient accumulation (BigScience's "bf16 must use z0! it implements its
        # own zero stage 1 equivalent")
        draft.set("parallel.zero", 1, "--zero-stage 0 with bf16 and pipeline parallelism: DeepSpeed's "
                                      "BF16_Optimizer (ZeRO-1 sharding)")
        draft.set("training.precision.grads", "fp32", "BF16_Optimizer accumulates gradients in fp32")
    else:
        draft.set("parallel.zero", stage, "--zero-stage")
    if draft.get("training.recompute") == "full" and "megatron.recompute_uniform_layers" in draft:
        raise f.error("checkpoint-num-layers", "groups several layers per checkpoint; the deepspeed profile "
                                               "counts one layer per checkpoint")
    if draft.get("megatron.distribute_saved_activations", False):
        raise f.error("distribute-checkpointed-activations", "is not modelled under DeepSpeed's engine")


#: MindSpeed's --context-parallel-algo (mindspeed/arguments.py: ulysses_cp_algo, megatron_cp_algo,
#: hybrid_cp_algo, adaptive_cp_algo, hybrid_adaptive_cp_algo) -> memform's parallel.cp_algo; the ring of
#: Megatron (megatron_cp_algo) and DeepSpeed-Ulysses (ulysses_cp_algo) are the ones memform models
MINDSPEED_CP = {"megatron_cp_algo": "ring", "ulysses_cp_algo": "ulysses"}


def _mindspeed(f: "ScriptFields", draft: Draft) -> None:
    """Arguments MindSpeed-LLM (Ascend) and Pai-Megatron-Patch add to Megatron-LM's parser, where they
    change the model or the memory in ways memform's keys express."""
    # MindSpeed-LLM mindspeed_llm/core/transformer/moe/moe_layer.py: the shared experts are one MLP of
    # n_shared_experts × --moe-ffn-hidden-size; features_manager/moe/shared_expert.py --shared-expert-gate
    if "model.num_experts" in draft:
        shared = f.integer("n-shared-experts", None, minimum=0)
        if shared:
            draft.set("model.num_shared_experts", shared, "--n-shared-experts (MindSpeed-LLM: one shared MLP of "
                      "n × --moe-ffn-hidden-size)")
            draft.entries.pop("model.shared_expert_ffn_hidden_size", None)
        if f.boolean("shared-expert-gate", False):
            draft.set("model.shared_expert_gate", True, "--shared-expert-gate (MindSpeed-LLM)")
        # mindspeed_llm/core/transformer/transformer_block.py _transformer_block_build_layers: layer i (0-based)
        # is MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0, dense (--ffn-hidden-size) otherwise
        k = f.integer("first-k-dense-replace", None, minimum=-(2 ** 31))
        # a negative k (MindSpeed-LLM scripts pass -1) makes no layer dense: i >= k for every i
        if k is not None and k > 0:
            if "model.first_k_dense" in draft or isinstance(draft.get("model.moe_layer_freq"), list):
                raise f.error("first-k-dense-replace", "cannot be combined with a --moe-layer-freq list")
            if k >= draft.get("model.num_layers"):
                raise f.error("first-k-dense-replace", f"({k}) must be less than --num-layers "
                                                       f"(MindSpeed-LLM asserts the same)")
            draft.set("model.first_k_dense", k, "--first-k-dense-replace (MindSpeed-LLM)")
    else:
        f.used.update(("n-shared-experts", "shared-expert-gate", "first-k-dense-replace"))
    # mindspeed_llm/features_manager/pipeline_parallel/num_layer_list.py: --num-layer-list "4,4,5,3", the
    # layers of each pipeline stage (core/transformer/transformer_block.py: num_layer_list[pp_stage])
    if f.has("num-layer-list"):
        raw = f.raw("num-layer-list")
        text = raw if isinstance(raw, str) else ",".join(map(str, raw)) if isinstance(raw, list) else str(raw)
        try:
            split = [int(x) for x in text.replace(" ", "").split(",") if x]
        except ValueError:
            raise f.error("num-layer-list", f"must be comma-separated layer counts such as 4,4,4,4, got {text!r}") \
                from None
        pp, layers = draft.get("parallel.pp"), draft.get("model.num_layers")
        if len(split) != pp or sum(split) != layers or min(split) < 0:
            raise f.error("num-layer-list", f"{text} must give one layer count per pipeline stage ({pp}) adding up "
                                            f"to --num-layers {layers}")
        if draft.get("parallel.vpp", 1) > 1:
            raise f.error("num-layer-list", "with virtual pipeline stages is not read by memform")
        if pp > 1:
            draft.set("parallel.stage_layers", split, "--num-layer-list (MindSpeed-LLM)")
    _noop_layers(f, draft)
    # --reuse-fp32-param (MindSpeed mindspeed/features_manager/memory/reuse_fp32_param.py, "the distributed
    # optimizer frees up param copies of FP32"): each fp32 master is the bf16 parameter (its high 16 bits) and a
    # 16-bit remainder in one buffer -- what Transformer Engine's store_param_remainders does, so the profile's
    # precision-aware optimizer with fp32 masters and moments counts it (megatron-core.mf pao_master_bytes)
    if f.boolean("reuse-fp32-param", False):
        if draft.get("training.precision.params") != "bf16" or not draft.get("parallel.distributed_optimizer"):
            raise f.error("reuse-fp32-param", "needs --bf16 and --use-distributed-optimizer (MindSpeed asserts both)")
        if draft.get("megatron.precision_aware_optimizer"):
            raise f.error("reuse-fp32-param", "cannot be combined with --use-precision-aware-optimizer")
        draft.set("megatron.precision_aware_optimizer", True, "--reuse-fp32-param: fp32 masters as the bf16 "
                  "parameter + a 16-bit remainder (as TE's store_param_remainders)")
        for key in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
            draft.set(f"megatron.{key}", "fp32", "--reuse-fp32-param keeps fp32 masters and Adam moments")
        draft.set("megatron.store_param_remainders", True, "--reuse-fp32-param")
    algo = f.string("context-parallel-algo", None)
    if algo is not None and draft.get("parallel.cp", 1) > 1:
        if algo not in MINDSPEED_CP:
            raise f.error("context-parallel-algo", f"{algo} is not modelled (memform models megatron_cp_algo, "
                                                   f"the ring, and ulysses_cp_algo)")
        draft.set("parallel.cp_algo", MINDSPEED_CP[algo], f"--context-parallel-algo {algo} (MindSpeed)")
    # Pai-Megatron-Patch --max-padding-length: SFT samples are padded to it, then cut to --seq-length
    # (megatron_patch/data: the sequence the model sees is at most --seq-length, which sizes the activations)
    pad = f.integer("max-padding-length", None)
    if pad is not None and pad > draft.get("model.seq_length"):
        raise f.error("max-padding-length", f"{pad} exceeds --seq-length {draft.get('model.seq_length')}: "
                                            f"memform cannot tell which length the samples have")


#: arguments only MindSpeed / MindSpeed-LLM define: a script with one of them runs on MindSpeed
MINDSPEED_ONLY = ("use-fused-rmsnorm", "use-fused-swiglu", "use-fused-rotary-pos-emb", "shape-order",
                  "tokenizer-name-or-path", "handler-name", "use-ascend-coc", "reuse-fp32-param", "n-shared-experts",
                  "first-k-dense-replace", "num-layer-list", "context-parallel-algo", "model-type-hf",
                  "enable-hf2mg-convert", "moe-permutation-async-comm", "moe-alltoall-overlap-comm")


def _mindspeed_script(f: Fields) -> bool:
    return any(key in f.data for key in MINDSPEED_ONLY) or str(f.data.get("spec", "")).startswith("mindspeed")


def _noop_layers(f: "ScriptFields", draft: Draft) -> None:
    """MindSpeed-LLM's --noop-layers "61,62,63": those (0-based) layers are identities, without weights or
    activations (mindspeed_llm/core/transformer/transformer_block.py builds NoopTransformerLayer for them),
    there to pad --num-layers to an even pipeline split. When they are the last layers -- the use in
    MindSpeed-LLM's DeepSeek-V3 scripts -- the model is the first L - n layers and each pipeline stage holds
    its share less the no-op layers in its range; no-op layers elsewhere are refused."""
    if not f.has("noop-layers"):
        return
    raw = f.raw("noop-layers")
    text = raw if isinstance(raw, str) else ",".join(map(str, raw)) if isinstance(raw, list) else str(raw)
    try:
        noop = sorted({int(x) for x in text.replace(" ", "").split(",") if x})
    except ValueError:
        raise f.error("noop-layers", f"must be comma-separated layer numbers such as 61,62,63, got {text!r}") from None
    layers = draft.get("model.num_layers")
    if not noop or noop != list(range(layers - len(noop), layers)):
        raise f.error("noop-layers", f"is {text}: no-op layers other than the last ones of --num-layers {layers} "
                                     f"shift the model's layer pattern, which memform does not model")
    pp, vpp = draft.get("parallel.pp"), draft.get("parallel.vpp", 1)
    if vpp > 1:
        # virtual stages hold layers round-robin: the last ones are the last stage's last chunk, which memform
        # fills last (its chunks take a stage's layers first-come)
        per_chunk = divide(layers, pp * vpp, "--num-layers over pp × vpp pipeline chunks", f.file)
        if len(noop) > per_chunk or draft.get("parallel.stage_layers") is not None:
            raise f.error("noop-layers", f"is {text}: with virtual pipeline stages memform reads no-op layers "
                                         f"within the last chunk ({per_chunk} layers) only")
    split = draft.get("parallel.stage_layers") or [divide(layers, pp, "--num-layers over the pipeline stages",
                                                          f.file)] * pp
    starts = [sum(split[:i]) for i in range(pp)]
    real = [n - sum(1 for x in noop if start <= x < start + n) for start, n in zip(starts, split)]
    if isinstance(draft.get("model.moe_layer_freq"), list):
        raise f.error("noop-layers", "with a --moe-layer-freq list is not read by memform")
    draft.set("model.num_layers", layers - len(noop),
              f"--num-layers {layers} less --noop-layers {text} (MindSpeed-LLM)")
    if pp > 1:
        draft.set("parallel.stage_layers", real, f"the pipeline split of {layers} layers less the no-op ones "
                                                 f"(--noop-layers {text})")


def _neutral_value(value: Any, neutral: tuple[str, ...]) -> bool:
    """Whether a REFUSED argument's value is one at which it changes nothing (``--x false``, ``--x 0``)."""
    if _is_unknown(value):
        return False
    text = "true" if value is True else " ".join(value) if isinstance(value, list) else str(value)
    return text.strip().lower() in neutral


def _unread(f: "ScriptFields", draft: Draft, args: Mapping[str, Any]) -> None:
    """Every argument memform did not read: memory-neutral (NEUTRAL, with its reason), refused outright
    (REFUSED: it changes memory in a way memform does not model), or -- unknown to memform -- refused at the
    end of the import unless ``--accept`` vouches for it (Draft.refuse_unread). A value the script leaves
    unknown does not matter for a neutral argument; for the others it is treated as set."""
    for key in f.unused():
        if key in REFUSED:
            why, neutral = REFUSED[key]
            if _neutral_value(args[key], neutral):
                continue
            value = args[key]
            shown = "is set" if value is True else \
                f"is {value if isinstance(value, str) else ' '.join(map(str, value))}"
            if _is_unknown(value):
                unknown = value if isinstance(value, Unknown) else next(v for v in value if isinstance(v, Unknown))
                shown += f" ({unknown.refs[0].describe()}: memform cannot tell whether it is one of its neutral " \
                         f"values{', ' + ', '.join(neutral) if neutral else ''})"
            raise f.error(key, f"{shown}: {why}; memform refuses the import rather than give an "
                               f"estimate that leaves it out (remove it from the script to estimate the job "
                               f"without it)")
        if key in NEUTRAL or key.startswith(NEUTRAL_PREFIXES):
            continue
        draft.refuse_unread(f"--{key}")


def _local(message: str, paths: list[Path]) -> str:
    """A warning about the only source file says ``line N:`` (the command prints the file name first)."""
    prefix = f"{paths[0]}:"
    if len(paths) == 1 and message.startswith(prefix) and message[len(prefix):].split(":")[0].isdigit():
        return "line " + message[len(prefix):]
    return message


def _vocab(f: Fields, draft: Draft, tp: int, given: Any) -> None:
    """The padded vocabulary Megatron-LM allocates (megatron/training/tokenizer/tokenizer.py:
    ``build_tokenizer`` takes the tokenizer's ``vocab_size`` and pads it with
    ``_vocab_size_with_padding`` to a multiple of --make-vocab-size-divisible-by (default 128) × tp)."""
    divisible = f.integer("make-vocab-size-divisible-by", 128)
    if "model.vocab_size" in given:
        # --set model.vocab_size=N is the tokenizer's size; adjust() pads it as Megatron would
        f.used.update(("vocab-size", "padded-vocab-size", "tokenizer-type", "extra-vocab-size"))
        draft.vocab_divisible = divisible  # type: ignore[attr-defined]
        return
    if f.has("pad-vocab-size-to"):
        # Megatron-DeepSpeed (bigscience-workshop/Megatron-DeepSpeed 8387ae1 megatron/tokenizer/tokenizer.py:72-82
        # _vocab_size_with_padding): the tokenizer's vocabulary padded to exactly --pad-vocab-size-to
        draft.set("model.vocab_size", f.integer("pad-vocab-size-to"), "--pad-vocab-size-to (Megatron-DeepSpeed)")
        f.used.update(("vocab-size", "tokenizer-type", "tokenizer-name-or-path"))
        return
    if f.has("padded-vocab-size"):
        # TokenizerConfig.padded_vocab_size: given, it replaces the padded size (no further padding)
        draft.set("model.vocab_size", f.integer("padded-vocab-size"), "--padded-vocab-size")
        f.used.update(("vocab-size", "tokenizer-type"))
        return
    kind = f.string("tokenizer-type", None)
    size = f.integer("vocab-size", None)
    if kind is None and f.has("vocab-file") and f.has("merge-file") and size is None:
        # a BPE merge file and no --tokenizer-type: GPT-2's BPE, the vocabulary Megatron-LM's examples/gpt3
        # script names (gpt2-vocab.json, gpt2-merges.txt) and GPT2BPETokenizer reads (tokenizer.py, MEGATRON_TOKENIZERS)
        kind = "GPT2BPETokenizer"
        f.used.update(("vocab-file", "merge-file"))
        draft.warn("--vocab-file and --merge-file without --tokenizer-type: read as GPT-2's BPE vocabulary "
                   "(GPT2BPETokenizer, 50257 tokens); pass --set model.vocab_size=N for another BPE vocabulary")
    if kind == "NullTokenizer":
        if size is None:
            raise f.missing("vocab-size", " (--tokenizer-type NullTokenizer takes its size from it)")
        # _NullTokenizer.vocab_size = --vocab-size + 1 (its end-of-document id is vocab_size)
        vocab, where = size + 1, f"--tokenizer-type NullTokenizer: --vocab-size {size} + 1 end-of-document token,"
    elif kind == "TikTokenizer":
        # CustomTikTokenizer: vocab_size = --vocab-size, or 2**17 when it is not given
        vocab, where = (size, "--tokenizer-type TikTokenizer --vocab-size") if size else \
            (2 ** 17, "--tokenizer-type TikTokenizer without --vocab-size: its fallback 2**17")
    elif kind in TOKENIZER_VOCAB:
        vocab, where = TOKENIZER_VOCAB[kind], f"--tokenizer-type {kind}"
        if size is not None and size != vocab:
            draft.warn(f"--vocab-size {size} is not read by Megatron's {kind} (its vocabulary has {vocab} "
                       f"entries); used {vocab}")
    elif size is not None:
        vocab, where = size, "--vocab-size"
        if kind is not None:
            draft.warn(f"--tokenizer-type {kind} takes its vocabulary size from the tokenizer files "
                       f"(--tokenizer-model / --vocab-file), which memform does not open; used --vocab-size "
                       f"{size} (Megatron ignores it for this tokenizer): check it, or pass "
                       f"--set model.vocab_size=N with the padded size")
    elif f.has("patch-tokenizer-type"):
        extra = f.raw("extra-vocab-size", 0)
        raise f.missing("vocab-size", f" (Pai-Megatron-Patch's --patch-tokenizer-type {f.raw('patch-tokenizer-type')} "
                                      f"makes it the tokenizer's size + --extra-vocab-size {extra} "
                                      f"(megatron_patch/tokenizer/__init__.py build_tokenizer), and memform does not "
                                      f"open the tokenizer: pass --set model.vocab_size=N with the model's "
                                      f"vocabulary, e.g. its Hugging Face config.json vocab_size)")
    else:
        what = f"--tokenizer-type {kind} reads" if kind else "Megatron reads"
        raise f.missing("vocab-size", f" ({what} the vocabulary size from the tokenizer files, which memform "
                                      f"does not open: add --vocab-size N or pass --set model.vocab_size=N)")
    padded = pad_vocab(vocab, divisible, tp)
    draft.set("model.vocab_size", padded, f"{where} {vocab} padded to a multiple of "
              f"--make-vocab-size-divisible-by {divisible} × tp {tp}")


def adjust(draft: Draft, overrides: Mapping[str, Any]) -> None:
    """After ``--set``: a ``model.vocab_size`` given on the command line is the tokenizer's size, padded as
    Megatron-LM pads it (megatron/training/vocab_utils.py ``_vocab_size_with_padding``: to a multiple of
    --make-vocab-size-divisible-by × tp, the tp the config ends with)."""
    if "model.vocab_size" not in overrides:
        return
    vocab = overrides["model.vocab_size"]
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise MemformError(f"--set model.vocab_size must be a positive integer, got {vocab!r}")
    divisible = getattr(draft, "vocab_divisible", 128)
    tp = draft.get("parallel.tp", 1)
    if not isinstance(tp, int) or tp < 1:
        return
    padded = pad_vocab(vocab, divisible, tp)
    draft.set("model.vocab_size", padded, f"--set model.vocab_size={vocab}, padded as Megatron pads it: to a "
              f"multiple of --make-vocab-size-divisible-by {divisible} × tp {tp}")


def _attention_kernel(f: Fields, draft: Draft) -> None:
    backend = f.string("attention-backend", None)
    if f.boolean("use-flash-attn", False):
        draft.set("model.flash_attention", True, "--use-flash-attn")
    elif backend is not None:
        draft.set("model.flash_attention", backend in ("flash", "fused", "auto"), f"--attention-backend {backend}")
    elif f.integer("context-parallel-size", 1) > 1:
        # Transformer Engine's get_attention_backend disables UnfusedDotProductAttention under context
        # parallelism: its flash or fused (cuDNN) kernel runs, no a·s² scores kept (--transformer-impl
        # local: Megatron-Core's DotProductAttention refuses cp > 1, formulas/dense.mf's require says so)
        draft.set("model.flash_attention", True, "--context-parallel-size > 1: Transformer Engine runs context "
                  "parallelism in its flash or fused attention only")
    else:
        draft.set("model.flash_attention", False, "no --use-flash-attn / --attention-backend")


def _unfused_kernels(f: Fields, draft: Draft, swiglu: bool) -> None:
    """Megatron-Core's own modules and the fusions switched off (their memory: formulas/frameworks/
    megatron/megatron-core.mf). Megatron-LM's --no-* flags store False into the TransformerConfig fields
    whose Megatron-LM defaults are on (arguments.py: bias_swiglu_fusion, apply_rope_fusion,
    masked_softmax_fusion, gradient_accumulation_fusion; "incompatible defaults in dataclass")."""
    impl = f.string("transformer-impl", "transformer_engine")
    if impl == "local":
        # models/gpt/gpt_layer_specs.py get_gpt_layer_local_spec: DotProductAttention, Megatron's own
        # linears, torch (or Apex) norms
        draft.set("megatron.transformer_impl", "local", "--transformer-impl local")
        if draft.get("model.flash_attention") and f.boolean("use-flash-attn", False) and _mindspeed_script(f):
            # MindSpeed replaces the local core attention with the NPU's fused attention under --use-flash-attn
            # (mindspeed/core/transformer/dot_product_attention.py, dot_product_attention_forward_wrapper)
            draft.set("model.flash_attention", True, "--use-flash-attn with --transformer-impl local: MindSpeed's "
                      "fused attention (npu_fusion_attention)")
        elif draft.get("model.flash_attention"):
            draft.set("model.flash_attention", False, "--transformer-impl local: the local spec's core is "
                      "DotProductAttention, unfused, whatever the attention backend")
    elif impl not in ("transformer_engine", "inference_optimized"):
        draft.warn(f"--transformer-impl {impl} is not modelled; counted as transformer_engine")
    if swiglu and f.boolean("no-bias-swiglu-fusion", False):
        # transformer/mlp.py MLP.forward without bias_activation_fusion: glu(), eager PyTorch ops
        draft.set("model.swiglu_impl", "eager", "--no-bias-swiglu-fusion: Megatron-Core's eager glu()")
        draft.set("megatron.eager_glu", "mcore", "transformer/mlp.py glu(): silu(x_glu) * (x_linear + offset)")
    if f.boolean("no-rope-fusion", False):
        draft.set("megatron.rope_fusion", False, "--no-rope-fusion: rope_utils.py _apply_rotary_pos_emb_bshd")
    if f.boolean("no-gradient-accumulation-fusion", False):
        draft.set("megatron.gradient_accumulation_fusion", False, "--no-gradient-accumulation-fusion: "
                  "tensor_parallel/layers.py makes each weight gradient, then adds it to main_grad")
    if f.boolean("no-masked-softmax-fusion", False):
        draft.set("megatron.masked_softmax_fusion", False, "--no-masked-softmax-fusion: fused_softmax.py "
                  "forward_torch_softmax")


def _positions(f: Fields, draft: Draft) -> None:
    kind = f.string("position-embedding-type", None)
    if kind is None and f.boolean("use-rotary-position-embeddings", False):
        kind = "rope"
    kind = kind or "learned_absolute"
    if f.boolean("no-position-embedding", False) and kind != "rope":
        # arguments.py validate_args: "--no-position-embedding is deprecated, use --position-embedding-type"
        # (a RuntimeError unless the type is rope, where the flag changes nothing)
        raise f.error("no-position-embedding", f"with --position-embedding-type {kind} is refused by Megatron-LM "
                                               f"(deprecated: use --position-embedding-type)")
    if kind == "absolute":   # Megatron-DeepSpeed's PositionEmbeddingType.absolute (megatron/enums.py)
        kind = "learned_absolute"
    if kind in ("rope", "mrope", "yarn", "rotary"):
        draft.set("model.position_embedding", "rope", f"--position-embedding-type {kind}")
    elif kind == "learned_absolute":
        draft.set("model.position_embedding", "learned", "learned_absolute (Megatron's default)")
        max_pos = f.integer("max-position-embeddings", None)
        seq = draft.get("model.seq_length")
        if max_pos is not None and max_pos != seq:
            draft.warn(f"--max-position-embeddings {max_pos} != --seq-length {seq}: memform sizes the learned "
                       f"position table by the sequence length")
    else:
        draft.set("model.position_embedding", "rope", f"--position-embedding-type {kind}: no position table")
    f.used.add("max-position-embeddings")


def _moe(f: Fields, draft: Draft) -> None:
    experts = f.integer("num-experts", None)
    if not experts or experts <= 1:
        return
    draft.set("model.num_experts", experts, "--num-experts")
    draft.set("model.moe_top_k", f.integer("moe-router-topk", 2),
              "--moe-router-topk" if f.has("moe-router-topk") else "Megatron's default top-2")
    expert_ffn = f.integer("moe-ffn-hidden-size", None)
    if expert_ffn is None:
        expert_ffn = draft.get("model.ffn_hidden_size")
        draft.set("model.moe_ffn_hidden_size", expert_ffn, "no --moe-ffn-hidden-size: --ffn-hidden-size")
    else:
        draft.set("model.moe_ffn_hidden_size", expert_ffn, "--moe-ffn-hidden-size")
    shared = f.integer("moe-shared-expert-intermediate-size", None)
    if shared is not None:
        if shared % expert_ffn == 0:
            draft.set("model.num_shared_experts", shared // expert_ffn,
                      f"--moe-shared-expert-intermediate-size {shared} / expert width {expert_ffn}")
        else:
            # one shared MLP of that total width (Megatron's SharedExpertMLP), not a whole number of experts
            draft.set("model.shared_expert_ffn_hidden_size", shared, "--moe-shared-expert-intermediate-size")
    if f.boolean("moe-shared-expert-gate", False):
        draft.set("model.shared_expert_gate", True, "--moe-shared-expert-gate")
    capacity = f.number("moe-expert-capacity-factor", None)
    if capacity is not None:
        draft.set("model.capacity_factor", capacity, "--moe-expert-capacity-factor")
    draft.set("model.moe_grouped_gemm", f.boolean("moe-grouped-gemm", False),
              "--moe-grouped-gemm" if f.has("moe-grouped-gemm") else "no --moe-grouped-gemm")
    # the dispatcher's per-layer host synchronisation is step time (frameworks/megatron/moe.mf dispatcher,
    # time.mf cost host); memory-neutral in memform's model
    dispatcher = f.string("moe-token-dispatcher-type", None)
    if dispatcher is not None:
        # alltoall_seq (MoEAlltoAllSEQTokenDispatcher of megatron-core <= 0.12, kept by MindSpeed) has the
        # alltoall dispatcher's preprocess, host synchronisation included
        draft.set("megatron.moe_token_dispatcher_type", {"alltoall_seq": "alltoall"}.get(dispatcher, dispatcher),
                  "--moe-token-dispatcher-type")
    if f.boolean("moe-pad-expert-input-to-capacity", False):
        draft.set("megatron.moe_pad_expert_input_to_capacity", True, "--moe-pad-expert-input-to-capacity")
    if f.has("moe-layer-freq"):
        _layer_freq(f, draft, draft.get("model.num_layers"))


def _layer_freq(f: Fields, draft: Draft, layers: int) -> None:
    """--moe-layer-freq (arguments.py ``moe_freq_type``): an int N, or a Python list expression of 0/1
    (``([0]*3+[1]*58)``, validated by ``_eval_pattern`` to digits , [ ] ( ) + *). Megatron-Core's
    ``get_gpt_decoder_block_spec`` (models/gpt/gpt_layer_specs.py) makes layer i MoE when
    ``i % N == 0``, or when the list's entry i is 1 (the list must have --num-layers entries).
    Written as ``model.first_k_dense`` when the list is k zeros then ones, else ``model.moe_layer_freq``."""
    raw = f.raw("moe-layer-freq")
    text = "".join(raw) if isinstance(raw, list) else str(raw).strip()
    if re.fullmatch(r"-?\d+", text):
        every = int(text)
        if every < 0:
            # MindSpeed-LLM scripts pass -1: Megatron's test i % N == 0 is Python's, true for every i when
            # N = -1, and the same as i % |N| == 0 for any negative N
            every = -every
        if every < 1:
            raise f.error("moe-layer-freq", f"must be a non-zero integer or a list of 0/1, got {text}")
        if every != 1:
            draft.set("model.moe_layer_freq", every, f"--moe-layer-freq {every}: layer i is MoE when i % {every} == 0")
        return
    try:
        pattern = list_expression(text)
    except ValueError:
        raise f.error("moe-layer-freq", f"must be an integer or a Python list expression of 0/1 such as "
                                        f"([0]*3+[1]*58), got {text!r}") from None
    if any(x not in (0, 1) for x in pattern):
        raise f.error("moe-layer-freq", f"{text} must hold only 0 (dense) and 1 (MoE), got {sorted(set(pattern))}")
    if len(pattern) != layers:
        raise f.error("moe-layer-freq", f"{text} has {len(pattern)} entries but --num-layers is {layers} "
                                        f"(Megatron requires one per layer)")
    dense = pattern.index(1) if 1 in pattern else len(pattern)
    if all(x == 1 for x in pattern[dense:]):
        if dense:
            draft.set("model.first_k_dense", dense, f"--moe-layer-freq {text}: {dense} dense layers, then MoE")
        return
    draft.set("model.moe_layer_freq", pattern, f"--moe-layer-freq {text}")


def _mla(f: Fields, draft: Draft) -> None:
    if not f.boolean("multi-latent-attention", False):
        f.used.update(("q-lora-rank", *MLA_DEFAULTS))
        return
    draft.set("model.attention", "mla", "--multi-latent-attention")
    q_rank = f.integer("q-lora-rank", 0, minimum=0)
    draft.set("model.q_lora_rank", q_rank, "--q-lora-rank" if f.has("q-lora-rank") else
              "no --q-lora-rank: queries not compressed")
    names = {"kv-lora-rank": "kv_lora_rank", "qk-pos-emb-head-dim": "qk_rope_head_dim",
             "qk-head-dim": "qk_nope_head_dim", "v-head-dim": "v_head_dim"}
    for arg, key in names.items():
        if f.has(arg):
            draft.set(f"model.{key}", f.integer(arg), f"--{arg}")
        else:
            draft.default(f"model.{key}", MLA_DEFAULTS[arg], f"Megatron's --{arg} default")


def _strategy(f: Fields, draft: Draft, layers: int, tp: int) -> None:
    pp = f.integer("pipeline-model-parallel-size", 1)
    draft.set("parallel.tp", tp, "--tensor-model-parallel-size")
    draft.set("parallel.pp", pp, "--pipeline-model-parallel-size")
    if f.has("num-layers-per-virtual-pipeline-stage"):
        per_chunk = f.integer("num-layers-per-virtual-pipeline-stage")
        # megatron/training/arguments.py: the accounted embedding and loss count as layers here too
        accounted = (f.boolean("account-for-embedding-in-pipeline-split", False)
                     + f.boolean("account-for-loss-in-pipeline-split", False))
        vpp = divide(layers + accounted, pp * per_chunk, "--num-layers (+ the accounted embedding and loss) / "
                     "(--pipeline-model-parallel-size × --num-layers-per-virtual-pipeline-stage)", f.file)
        draft.set("parallel.vpp", vpp, f"--num-layers / (pp × {per_chunk} layers per virtual stage)")
    elif f.has("num-virtual-stages-per-pipeline-rank"):
        draft.set("parallel.vpp", f.integer("num-virtual-stages-per-pipeline-rank"),
                  "--num-virtual-stages-per-pipeline-rank")
    if f.has("microbatch-group-size-per-virtual-pipeline-stage"):
        # the micro-batches a chunk runs back to back: the interleaved warm-up depth (schedules.mf g_vp)
        draft.set("parallel.vpp_microbatch_group", f.integer("microbatch-group-size-per-virtual-pipeline-stage",
                                                             minimum=1),
                  "--microbatch-group-size-per-virtual-pipeline-stage")
    first = f.integer("decoder-first-pipeline-num-layers", None, minimum=0)
    last = f.integer("decoder-last-pipeline-num-layers", None, minimum=0)
    if (first is not None or last is not None) and pp > 1:
        draft.set("parallel.stage_layers", _uneven_split(f, layers, pp, first, last),
                  "--decoder-first/last-pipeline-num-layers")
    _account_for(f, draft, layers, pp, uneven=first is not None or last is not None)
    cp = f.integer("context-parallel-size", 1)
    if cp > 1:
        draft.set("parallel.cp", cp, "--context-parallel-size")
        comm = f.string("cp-comm-type", "p2p")
        if comm not in CP_ALGOS:
            draft.warn(f"--cp-comm-type {comm} is not modelled; counted as ring (p2p) attention")
        draft.set("parallel.cp_algo", CP_ALGOS.get(comm, "ring"), f"--cp-comm-type {comm}")
    if "model.num_experts" in draft:
        draft.set("parallel.ep", f.integer("expert-model-parallel-size", 1), "--expert-model-parallel-size")
        etp = f.integer("expert-tensor-parallel-size", None)
        draft.set("parallel.expert_tp", etp or tp, "--expert-tensor-parallel-size" if etp else
                  "Megatron's default: = --tensor-model-parallel-size")
    else:
        f.used.update(("expert-model-parallel-size", "expert-tensor-parallel-size"))
    for arg, key in (("sequence-parallel", "parallel.sequence_parallel"),
                     ("use-distributed-optimizer", "parallel.distributed_optimizer")):
        on = f.boolean(arg, False)
        draft.set(key, on, f"--{arg}" if on else f"no --{arg}")
    _overlap(f, draft)
    _optimizer_offload(f, draft)
    _fsdp(f, draft)


def _activation_offload(f: Fields, draft: Draft, layers: int) -> None:
    """--cpu-offloading --cpu-offloading-num-layers N (model_parallel_config.py cpu_offloading*; megatron-core
    0.19.2 hands them to Transformer Engine's get_cpu_offload_context, transformer_block.py:298-311): the
    activations of the first N layers in host memory (training.activation_offload: layers, offload-decoder.mf).
    Megatron-Core refuses it with a pipeline, with recompute and for N >= --num-layers
    (transformer_config.py:1707-1721); --cpu-offloading-weights is a no-op in Transformer Engine."""
    _fine_grained_offload(f, draft)
    if not f.boolean("cpu-offloading", False):
        for arg in ("cpu-offloading-num-layers", "cpu-offloading-activations", "cpu-offloading-weights"):
            if f.has(arg):
                f.raw(arg)
                draft.warn(f"--{arg} has no effect without --cpu-offloading")
        return
    n = f.integer("cpu-offloading-num-layers", 0, minimum=0)
    if f.has("cpu-offloading-weights"):
        f.raw("cpu-offloading-weights")
        draft.warn("--cpu-offloading-weights does nothing (Transformer Engine cpu_offload_v1.py "
                   "get_cpu_offload_context: offloading weights is deprecated)")
    if not f.boolean("cpu-offloading-activations", True):
        draft.warn("--cpu-offloading without --cpu-offloading-activations offloads nothing (Transformer Engine "
                   "returns a null context)")
        return
    if n >= layers:
        raise f.error("cpu-offloading-num-layers", f"is {n}, but Megatron-Core offloads fewer layers than "
                                                   f"--num-layers {layers} (transformer_config.py: 'CPU offloading "
                                                   f"can be done only for layers less than num_layers')")
    if draft.get("parallel.pp", 1) > 1:
        raise f.error("cpu-offloading", "is set with --pipeline-model-parallel-size "
                                        f"{draft.get('parallel.pp')}, which Megatron-Core refuses "
                                        "(transformer_config.py: 'no support for Pipeline parallelism with "
                                        "CPU offloading')")
    if draft.get("training.recompute", "none") != "none":
        raise f.error("cpu-offloading", "is set with --recompute-granularity, which Megatron-Core refuses "
                                        "(transformer_config.py: 'CPU offloading does not work when activation "
                                        "recomputation is enabled')")
    if n == 0:
        draft.warn("--cpu-offloading with --cpu-offloading-num-layers 0 offloads no layer")
    draft.set("training.activation_offload", "layers", "--cpu-offloading")
    draft.set("training.activation_offload_layers", n, "--cpu-offloading-num-layers")


#: --offload-modules choices (transformer_config.py:1853-1862 allowed_modules)
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act",
                   "fused_group_mlp")


def _fine_grained_offload(f: Fields, draft: Draft) -> None:
    """--fine-grained-activation-offloading --offload-modules ... [--min-offloaded-tensor-size N] (megatron-core
    0.19.2 transformer_config.py:1229-1265, pipeline_parallel/fine_grained_activation_offload.py): the named
    modules' saved tensors in host memory (training.activation_offload: modules, offload-decoder.mf). Refused
    where Megatron refuses it (with --cpu-offloading, transformer_config.py:1849-1851; without modules, :1852;
    with --transformer-impl local, training/arguments.py:1854-1856) and with full recompute (not modelled)."""
    if not f.boolean("fine-grained-activation-offloading", False):
        for arg in ("offload-modules", "min-offloaded-tensor-size"):
            if f.has(arg):
                f.raw(arg)
                draft.warn(f"--{arg} has no effect without --fine-grained-activation-offloading")
        return
    if f.boolean("cpu-offloading", False):
        raise f.error("fine-grained-activation-offloading", "is set with --cpu-offloading, which Megatron-Core "
                                                            "refuses (transformer_config.py: 'fine_grained_activation_"
                                                            "offloading cannot be enabled with cpu_offloading')")
    raw = f.raw("offload-modules") if f.has("offload-modules") else None
    names = [] if raw is None or raw is True else ([raw] if isinstance(raw, str) else list(raw))
    names = [n for name in names for n in str(name).replace(",", " ").split()]
    if not names:
        raise f.error("fine-grained-activation-offloading", "is set without --offload-modules, which Megatron-Core "
                                                            "refuses (transformer_config.py asserts offload_modules "
                                                            "is not empty)")
    unknown = [n for n in names if n not in OFFLOAD_MODULES]
    if unknown:
        raise f.error("offload-modules", f"names {unknown[0]!r}, which Megatron-Core does not offer "
                                         f"(transformer_config.py allowed_modules: {', '.join(OFFLOAD_MODULES)})")
    if "attn_proj" in names and "core_attn" not in names:
        raise f.error("offload-modules", "names attn_proj without core_attn, which Megatron-Core refuses "
                                         "(transformer_config.py: 'the input of attn_proj is the output of core_attn, "
                                         "which is needed in core_attn.backward()')")
    if "fused_group_mlp" in names:
        raise f.error("offload-modules", "names fused_group_mlp (the Transformer Engine op fuser's grouped expert MLP), "
                                         "which is not modelled")
    if draft.get("model.attention", "mha") == "mla":
        raise f.error("fine-grained-activation-offloading", "is modelled for standard attention only: MLA's "
                                                            "qkv_linear and core_attn groups are not described")
    expert_groups = [n for n in names if n in ("expert_fc1", "moe_act")]
    if expert_groups and "moe" in (draft.get("training.recompute_modules", []) or []):
        raise f.error("offload-modules", f"names {expert_groups[0]} with --recompute-modules moe, which Megatron-Core "
                                         "refuses (transformer_config.py: 'Cannot offload ... while recomputing the "
                                         "entire MoE layer')")
    if expert_groups and draft.get("model.num_experts", 0) and not draft.get("model.moe_grouped_gemm", False):
        draft.warn(f"--offload-modules {' '.join(expert_groups)}: only TEGroupedMLP (--moe-grouped-gemm) offloads the "
                   "experts' tensors (moe/experts.py); SequentialMLP opens no group")
    if draft.get("megatron.transformer_impl", "transformer_engine") != "transformer_engine":
        raise f.error("fine-grained-activation-offloading", "is set with --transformer-impl local, which Megatron-LM "
                                                            "refuses (training/arguments.py: 'only supported with "
                                                            "transformer_engine implementation')")
    if draft.get("training.recompute", "none") == "full":
        raise f.error("fine-grained-activation-offloading", "is set with --recompute-granularity full: the groups "
                                                            "then open inside the recompute in backward, which is "
                                                            "not modelled")
    draft.set("training.activation_offload", "modules", "--fine-grained-activation-offloading")
    draft.set("training.activation_offload_modules", names, "--offload-modules")
    if f.has("min-offloaded-tensor-size"):
        draft.set("training.activation_offload_min_elements", f.integer("min-offloaded-tensor-size", minimum=0),
                  "--min-offloaded-tensor-size")


#: --data-parallel-sharding-strategy (arguments.py _add_distributed_args, choices no_shard, optim, optim_grads,
#: optim_grads_params; default optim_grads_params) as the ZeRO stage whose sharding it is (Megatron-LM
#: megatron/core/distributed/fsdp/src/megatron_fsdp: "optim" shards the optimizer states, "optim_grads" also
#: the gradients, "optim_grads_params" also the parameters, as ZeRO-1/2/3 do, Rajbhandari et al. 2020)
FSDP_ZERO = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}


def _fsdp(f: Fields, draft: Draft) -> None:
    """--use-megatron-fsdp (--use-custom-fsdp before Megatron-Core 0.14) with its sharding strategy, and
    --use-torch-fsdp2 (torch fully_shard: parameters, gradients and optimizer states sharded, ZeRO-3), as
    parallel.zero, which common.mf shards over dp × cp."""
    megatron_fsdp = f.boolean("use-megatron-fsdp", False) or f.boolean("use-custom-fsdp", False)
    if megatron_fsdp:
        flag = "--use-megatron-fsdp" if f.boolean("use-megatron-fsdp", False) else "--use-custom-fsdp"
        strategy = f.string("data-parallel-sharding-strategy", "optim_grads_params")
        if strategy not in FSDP_ZERO:
            raise f.error("data-parallel-sharding-strategy", f"must be one of {', '.join(FSDP_ZERO)}, got {strategy!r}")
        zero = FSDP_ZERO[strategy]
        draft.set("parallel.zero", zero, f"{flag} --data-parallel-sharding-strategy {strategy}"
                  + ("" if f.has("data-parallel-sharding-strategy") else " (Megatron's default)")
                  + f": ZeRO-{zero} sharding over dp × cp")
        if f.boolean("use-torch-fsdp2", False):
            raise f.error("use-torch-fsdp2", f"cannot be combined with {flag} (Megatron asserts the same)")
    elif f.boolean("use-torch-fsdp2", False):
        draft.set("parallel.zero", 3, "--use-torch-fsdp2: torch fully_shard shards parameters, gradients and "
                                      "optimizer states over dp × cp (ZeRO-3)")
    elif f.has("data-parallel-sharding-strategy"):
        draft.warn("--data-parallel-sharding-strategy has no effect without --use-megatron-fsdp (ignored)")


def _account_for(f: Fields, draft: Draft, layers: int, pp: int, *, uneven: bool) -> None:
    """--account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split: the embedding
    (the loss) takes one layer's slot of the first (last) stage's split (megatron/core/transformer/
    transformer_block.py get_num_layers_to_build: num_layers += 1 each, the first virtual chunk of the first
    stage builds one decoder fewer, the last chunk of the last stage likewise). With vpp > 1 each stage's
    chunks are listed, the first stage's first chunk and the last stage's last chunk one decoder short (at
    one layer per chunk: the embedding alone, the output alone -- Llama 3's layout, Dubey et al. 2024 §3.3.2)."""
    emb = f.boolean("account-for-embedding-in-pipeline-split", False)
    loss = f.boolean("account-for-loss-in-pipeline-split", False)
    if not (emb or loss) or pp == 1:
        return
    if uneven:
        raise MemformError(f"{f.file}: --account-for-embedding/loss-in-pipeline-split cannot be combined with "
                           f"--decoder-first/last-pipeline-num-layers (Megatron asserts the same)")
    vpp = int(draft.get("parallel.vpp", 1))
    total = layers + emb + loss
    divide(total, pp * vpp, "--num-layers + the accounted embedding and loss over pp × vpp pipeline chunks", f.file)
    split: list = [total // pp] * pp
    split[0] -= emb
    split[-1] -= loss
    if vpp > 1:
        per = total // (pp * vpp)
        split = [[per - (emb if (s, c) == (0, 0) else 0) - (loss if (s, c) == (pp - 1, vpp - 1) else 0)
                  for c in range(vpp)] for s in range(pp)]
    names = " and ".join(n for n, on in (("embedding", emb), ("loss", loss)) if on)
    verb = "sits" if emb + loss == 1 else "sit"
    draft.set("parallel.stage_layers", split, f"--account-for-{names}-in-pipeline-split: (L + {emb + loss}) / pp "
                                              f"per stage, less one where the {names} {verb}")


def _uneven_split(f: Fields, layers: int, pp: int, first: int | None, last: int | None) -> list[int]:
    """Megatron's split with explicit first/last stage layer counts, the rest even."""
    middle_stages = pp - (first is not None) - (last is not None)
    rest = layers - (first or 0) - (last or 0)
    if middle_stages == 0:
        if rest:
            raise MemformError(f"{f.file}: --decoder-first/last-pipeline-num-layers must add up to "
                               f"--num-layers {layers}")
        middle: list[int] = []
    else:
        each = divide(rest, middle_stages, "layers left for the middle pipeline stages", f.file)
        middle = [each] * middle_stages
    return ([first] if first is not None else []) + middle + ([last] if last is not None else [])


def _training(f: Fields, draft: Draft) -> None:
    draft.set("training.micro_batch_size", f.integer("micro-batch-size", 1), "--micro-batch-size")
    if f.has("global-batch-size"):
        draft.set("training.global_batch_size", f.integer("global-batch-size"), "--global-batch-size")
    granularity = f.string("recompute-granularity", None)
    if granularity is None and f.boolean("recompute-activations", False):
        granularity = "selective"
    if granularity not in (None, "full", "selective"):
        raise f.error("recompute-granularity", f"must be full or selective, got {granularity!r}")
    draft.set("training.recompute", granularity or "none",
              f"--recompute-granularity {granularity}" if granularity else "no --recompute-granularity")
    _recompute_modules(f, draft, granularity)
    method = f.string("recompute-method", None)
    count = f.integer("recompute-num-layers", None, minimum=0)
    if granularity == "full":
        _full_recompute(f, draft, method, count)
    if f.boolean("distribute-saved-activations", False):
        draft.set("megatron.distribute_saved_activations", True, "--distribute-saved-activations")
    if f.boolean("fp16", False):
        dtype, note = "fp16", "--fp16"
    elif f.boolean("bf16", False):
        dtype, note = "bf16", "--bf16"
    else:
        dtype, note = "fp32", "no --bf16 / --fp16: Megatron trains in fp32"
    draft.set("training.precision.params", dtype, note)
    draft.set("training.precision.activations", dtype, note)
    _fp8(f, draft)
    if f.boolean("activation-func-fp8-input-store", False):
        draft.set("megatron.activation_func_fp8_input_store", True, "--activation-func-fp8-input-store")
    _optimizer_precision(f, draft, dtype)
    optimizer = f.string("optimizer", "adam")
    if optimizer not in ("adam", "sgd", "lion", "muon"):
        raise f.error("optimizer", f"is {optimizer!r}; memform models adam, sgd, lion and muon "
                                   f"(common.mf training.optimizer)")
    if f.has("optimizer"):
        draft.set("training.optimizer", optimizer, "--optimizer")
    if optimizer == "sgd":
        draft.set("training.sgd_momentum", f.number("sgd-momentum", 0.9),
                  "--sgd-momentum" if f.has("sgd-momentum") else "Megatron's default --sgd-momentum 0.9")


#: --recompute-modules choices (transformer_config.py allowed_modules) memform models
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "mla_up_proj", "moe_act", "shared_experts", "moe")


def _recompute_modules(f: Fields, draft: Draft, granularity: str | None) -> None:
    """--recompute-modules (nargs '*', default core_attn; read with --recompute-granularity selective)."""
    if not f.has("recompute-modules"):
        return
    raw = f.raw("recompute-modules")
    names = [raw] if isinstance(raw, str) else ([] if raw is True else list(raw))
    if granularity != "selective":
        draft.warn("--recompute-modules has no effect without --recompute-granularity selective (ignored)")
        return
    unknown = [n for n in names if n not in RECOMPUTE_MODULES]
    if unknown:
        raise f.error("recompute-modules", f"names {unknown[0]!r}, which memform does not model "
                                           f"(it models {', '.join(RECOMPUTE_MODULES)})")
    draft.set("training.recompute_modules", names, "--recompute-modules")


def _full_recompute(f: Fields, draft: Draft, method: str | None, count: int | None) -> None:
    """--recompute-granularity full: Megatron needs --recompute-method and --recompute-num-layers
    (transformer_config.py __post_init__); transformer_block.py _checkpointed_forward runs them."""
    if method == "block":
        if count is None:
            raise f.missing("recompute-num-layers", " (Megatron requires it with --recompute-method block)")
        # only the first `count` layers of each stage (chunk) are recomputed; the rest keep everything
        draft.set("training.recompute_num_layers", count, "--recompute-method block --recompute-num-layers")
        return
    if method not in (None, "uniform"):
        raise f.error("recompute-method", f"must be uniform or block, got {method!r}")
    if method is None or count is None:
        draft.warn("--recompute-granularity full needs --recompute-method and --recompute-num-layers in "
                   "Megatron-LM; imported as uniform with 1 layer per checkpoint")
        count = 1
    if count < 1:
        raise f.error("recompute-num-layers", f"must be at least 1 with --recompute-method uniform, got {count}")
    # groups of `count` layers, each checkpointed as one (its input kept, all recomputed in backward)
    draft.set("megatron.recompute_uniform_layers", count, "--recompute-method uniform --recompute-num-layers")


#: Transformer Engine fp8 recipes the profile models (Megatron's --fp8-recipe choices)
FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise")


def _fp8(f: Fields, draft: Draft) -> None:
    """--fp8-format e4m3|hybrid (arguments.py _add_transformer_engine_args, dest fp8), --fp8-recipe,
    --fp8-param-gather; the legacy --fp8-e4m3 / --fp8-hybrid flags mean the same formats."""
    fmt = f.string("fp8-format", None)
    for legacy, name in (("fp8-e4m3", "e4m3"), ("fp8-hybrid", "hybrid")):
        if f.boolean(legacy, False):
            fmt = fmt or name
    if fmt is None:
        for arg in ("fp8-recipe", "fp8-param-gather"):
            if f.raw(arg) is not None:
                draft.warn(f"--{arg} has no effect without --fp8-format (ignored)")
        return
    if fmt not in ("e4m3", "hybrid"):
        raise f.error("fp8-format", f"must be e4m3 or hybrid, got {fmt!r}")
    draft.set("megatron.fp8", fmt, "--fp8-format")
    recipe = f.string("fp8-recipe", "delayed")
    if recipe not in FP8_RECIPES:
        draft.warn(f"--fp8-recipe {recipe} is not modelled; counted as tensorwise (1-byte fp8 tensors)")
        recipe = "tensorwise"
    draft.set("megatron.fp8_recipe", recipe, "--fp8-recipe" if f.has("fp8-recipe") else "Megatron's default")
    if f.boolean("fp8-param-gather", False):
        draft.set("megatron.fp8_param_gather", True, "--fp8-param-gather")

    if f.boolean("fp8-dot-product-attention", False):
        draft.warn("--fp8-dot-product-attention is not modelled (attention tensors counted in bf16)")
    draft.default("megatron.fp8_weight_transpose", True, "Hopper: TE keeps transposed fp8 weights; "
                  "set false on Blackwell")


#: Megatron's precision-aware optimizer dtype names (arguments.py) -> memform dtypes
OPT_DTYPES = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "fp8": "fp8"}


def _optimizer_precision(f: Fields, draft: Draft, params: str) -> None:
    """--use-precision-aware-optimizer and its dtypes (optimizer_config.py); main grads in bf16 with
    --grad-reduce-in-bf16 or --main-grads-dtype bf16 (arguments.py: otherwise bf16 keeps fp32 main grads)."""
    aware = f.boolean("use-precision-aware-optimizer", False)
    dtypes = {}
    for arg in ("main-grads-dtype", "main-params-dtype", "exp-avg-dtype", "exp-avg-sq-dtype"):
        value = f.string(arg, "fp32")
        if value not in OPT_DTYPES:
            raise f.error(arg, f"must be one of {', '.join(OPT_DTYPES)}, got {value!r}")
        dtypes[arg] = value
        if f.has(arg) and not aware and value != "fp32":
            draft.warn(f"--{arg} {value} has no effect without --use-precision-aware-optimizer")
    if f.boolean("grad-reduce-in-bf16", False):
        draft.set("training.precision.grads", "bf16", "--grad-reduce-in-bf16")
    elif aware and dtypes["main-grads-dtype"] == "bf16":
        draft.set("training.precision.grads", "bf16", "--main-grads-dtype bf16")
    if not aware:
        return
    draft.set("megatron.precision_aware_optimizer", True, "--use-precision-aware-optimizer")
    for arg, key in (("main-params-dtype", "main_params_dtype"), ("exp-avg-dtype", "exp_avg_dtype"),
                     ("exp-avg-sq-dtype", "exp_avg_sq_dtype")):
        draft.set(f"megatron.{key}", OPT_DTYPES[dtypes[arg]], f"--{arg}" if f.has(arg) else "Megatron's default")
    if params != "bf16":
        # TE FusedAdam stores 16-bit remainders of fp32 masters only for bf16 parameters
        draft.set("megatron.store_param_remainders", False, f"{params} parameters: full fp32 master weights")


def _optimizer_offload(f: Fields, draft: Draft) -> None:
    """--optimizer-cpu-offload with --optimizer-offload-fraction (arguments.py: default 1.0): that share of the
    master weights and Adam states lives and steps on the host (training.optimizer_offload, common.mf)."""
    if not f.boolean("optimizer-cpu-offload", False):
        if f.has("optimizer-offload-fraction"):
            draft.warn("--optimizer-offload-fraction has no effect without --optimizer-cpu-offload")
        return
    share = f.raw("optimizer-offload-fraction", 1.0)
    try:
        share = float(share)
    except (TypeError, ValueError):
        raise f.error("optimizer-offload-fraction", f"must be a number between 0 and 1, got {share!r}") from None
    if not 0 <= share <= 1:
        raise f.error("optimizer-offload-fraction", f"must be between 0 and 1, got {share}")
    draft.set("training.optimizer_offload", share, "--optimizer-cpu-offload"
              + (" --optimizer-offload-fraction" if f.has("optimizer-offload-fraction") else " (fraction 1.0)"))


def _overlap(f: Fields, draft: Draft) -> None:
    """--overlap-grad-reduce / --overlap-param-gather / --ddp-bucket-size: Megatron reduces and gathers in
    place in its grad / param buffers (param_and_grad_buffer.py), so none of them adds memory."""
    if f.boolean("overlap-grad-reduce", False):
        draft.set("parallel.overlap_grad_reduce", True, "--overlap-grad-reduce (in place in the grad buffer)")
    if f.boolean("overlap-param-gather", False):
        draft.set("megatron.overlap_param_gather", True, "--overlap-param-gather (in place in the param buffer)")
    if f.boolean("no-overlap-p2p-communication", False):   # arguments.py store_false: on by default
        draft.set("megatron.overlap_p2p_comm", False, "--no-overlap-p2p-communication (the interleaved "
                  "schedule's pipeline sends block: time.mf cost pp)")
    bucket = f.integer("ddp-bucket-size", None)
    if bucket is not None:
        draft.set("megatron.ddp_bucket_size", bucket, "--ddp-bucket-size")
    if f.has("overlap-grad-reduce") or bucket is not None:
        draft.set("parallel.dp_bucket_mib", 0, "Megatron reduce-scatters / all-reduces in place: no bucket buffer")
