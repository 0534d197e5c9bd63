"""torchtitan job config (``train_configs/*.toml``) → a memform config for the ``fsdp2`` profile.

torchtitan (pytorch/torchtitan) trains with FSDP2 (``fully_shard``), tensor, pipeline, context and
expert parallelism configured in one TOML file: ``[model]`` names a model and a flavor (its
hyper-parameters live in torchtitan's source, restated below), ``[training]`` the batch, sequence
length and mixed precision, ``[parallelism]`` the degrees (older releases: ``[training]`` /
``[experimental]``), and ``[activation_checkpoint]`` the recompute mode. Field names and defaults
follow ``torchtitan/config/job_config.py`` (JobConfig) of release v0.2.2 (73a0e69, February 2026),
the last release with TOML job configs: from #2386 (9810191) on, torchtitan's recipes are Python
(``config_registry.py``), which memform does not read. The FSDP settings follow
``torchtitan/models/llama3/infra/parallelize.py`` (``apply_fsdp``), the activation checkpointing
``torchtitan/distributed/activation_checkpoint.py``, the pipeline split
``torchtitan/distributed/pipeline_parallel.py`` (``pipeline_llm``, ``generate_llm_fqn_per_model_part``).

Every field of the file is read, listed in :data:`NEUTRAL` with the reason it cannot change device
memory, or refused (exit 2): features that change memory in a way the fsdp2 profile does not model
(float8 / MX converters, DiLoCo, DeepEP, optimizer-in-backward, validation passes, the models with
per-module dtypes or another architecture) are refused with their reason; fields memform does not know
at all are refused by :meth:`Draft.check_unread` unless ``--accept`` names them. ``--model FILE`` (a
memform config's ``model:`` section or a Hugging Face config.json) replaces the flavor table for a
custom model. ``data_parallel_shard_degree = -1`` (torchtitan: the ranks left over) needs the world
size: ``--devices N`` (or ``--set parallel.dp=N``), else the import stops and says so.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


from ..errors import MemformError, did_you_mean, read_text
from .draft import Draft, Fields, describe, dtype_name, gated_ffn_size
from ..engine.values import dotted
from .modelfile import read_model_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

TITLE = "torchtitan job config"
#: ``memform import torchtitan --model FILE``: a custom model's shape instead of the flavor table
TAKES_MODEL = True
#: the release the tables below restate (its commit)
RELEASE = "torchtitan v0.2.2 (73a0e69)"


# ---- the models torchtitan ships: their flavor tables, restated ---------------------------------------
# Each flavor is the keyword arguments of its ModelArgs in torchtitan/models/<name>/__init__.py at
# v0.2.2; fields left out take the ModelArgs dataclass defaults (models/<name>/model/args.py), which
# `defaults` restates. MoE fields are MoEArgs' (models/moe/moe.py: num_experts 8, num_shared_experts 1,
# top_k 1, use_grouped_mm true, gate_bias false).
MOE_DEFAULTS = {"num_experts": 8, "num_shared_experts": 1, "top_k": 1}


@dataclass(frozen=True)
class Family:
    """One torchtitan model (``model.name``): its flavors and how they map onto memform's keys."""

    source: str
    defaults: dict[str, Any]
    flavors: dict[str, dict[str, Any]]
    keys: Callable[[dict[str, Any]], list[tuple[str, Any, str]]]


def _common(a: dict[str, Any], name: str) -> list[tuple[str, Any, str]]:
    """What every torchtitan decoder shares: RMSNorm, RoPE, no biases or dropout, its fp32 loss."""
    flash = {"sdpa": "scaled_dot_product_attention (flash / cuDNN / efficient kernels: O(s) saved)",
             "flex": "FlexAttention (a fused kernel: O(s) saved, block masks)",
             "varlen": "varlen flash attention (O(s) saved)"}[a.get("attn_type", "sdpa")]
    return [("model.activation", "swiglu", f"{name} FeedForward w2(silu(w1(x)) * w3(x))"),
            ("model.swiglu_impl", "eager", "F.silu(w1(x)) * w3(x): eager PyTorch"),
            ("model.norm", "rmsnorm", "nn.RMSNorm"), ("model.bias", False, "nn.Linear(bias=False)"),
            ("model.dropout", False, "no dropout"), ("model.position_embedding", "rope", "rotary embeddings"),
            ("model.flash_attention", True, f"attn_type {a.get('attn_type', 'sdpa')}: {flash}"),
            ("model.cross_entropy", "eager", "components/loss.py cross_entropy_loss: F.cross_entropy on fp32 "
                                             "logits")]


def _llama3(a: dict[str, Any]) -> list[tuple[str, Any, str]]:
    # models/llama3/model/model.py: FeedForward hidden_dim = compute from 4·dim, multiple_of,
    # ffn_dim_multiplier (Llama's 8h/3 rule); separate output Linear (no tying)
    ffn = gated_ffn_size(a["dim"], a["multiple_of"], a["ffn_dim_multiplier"])
    return _llama_shape(a, ffn, "FeedForward") + _common(a, "llama3")


def _llama_shape(a: dict[str, Any], ffn: int, ffn_name: str) -> list[tuple[str, Any, str]]:
    """The shape keys llama3 and llama4 read alike (models/llama3, models/llama4 TransformerModelArgs):
    heads (multi-head attention without n_kv_heads), the dense FFN width ``ffn``, a separate output."""
    return [("model.hidden_size", a["dim"], "dim"), ("model.num_heads", a["n_heads"], "n_heads"),
            ("model.num_kv_heads", a["n_kv_heads"] or a["n_heads"],
             "n_kv_heads" if a["n_kv_heads"] else "no n_kv_heads: multi-head attention"),
            ("model.num_layers", a["n_layers"], "n_layers"),
            ("model.ffn_hidden_size", ffn, f"{ffn_name}(4·dim, multiple_of {a['multiple_of']}, "
                                           f"ffn_dim_multiplier {a['ffn_dim_multiplier']})"),
            ("model.vocab_size", a["vocab_size"], "vocab_size"),
            ("model.tied_embeddings", False, "separate output Linear")]


def _qwen3(a: dict[str, Any]) -> list[tuple[str, Any, str]]:
    # models/qwen3/model/model.py: wq (dim → n_heads·head_dim), q_norm / k_norm = RMSNorm(head_dim) with
    # weights (qk_norm), FeedForward(dim, hidden_dim); with moe_enabled every block's FFN is an MoE of
    # moe_inter_dim-wide experts; enable_weight_tying: output.weight = tok_embeddings.weight
    out = [("model.hidden_size", a["dim"], "dim"), ("model.num_heads", a["n_heads"], "n_heads"),
           ("model.num_kv_heads", a["n_kv_heads"], "n_kv_heads"), ("model.num_layers", a["n_layers"], "n_layers"),
           ("model.ffn_hidden_size", a["hidden_dim"], "hidden_dim"),
           ("model.vocab_size", a["vocab_size"], "vocab_size"),
           ("model.tied_embeddings", a["enable_weight_tying"], f"enable_weight_tying {a['enable_weight_tying']}")]
    if a["head_dim"] * a["n_heads"] != a["dim"]:
        out.append(("model.head_dim", a["head_dim"], f"head_dim (× {a['n_heads']} heads ≠ dim {a['dim']})"))
    out.append(("model.qk_norm", a["qk_norm"], "q_norm / k_norm = RMSNorm(head_dim)"))
    if a.get("moe"):
        out += _moe(a["moe"], a["moe_inter_dim"], "moe_inter_dim")
    return out + _common(a, "qwen3")


def _moe(m: dict[str, Any], width: int, what: str) -> list[tuple[str, Any, str]]:
    """MoEArgs → moe.mf: routed experts (GroupedExperts w1/w2/w3), the router's gate Linear(dim, E,
    bias=False), shared experts = one FeedForward(dim, width × num_shared_experts); the load-balancing
    expert_bias and tokens_per_expert are buffers (no gradient, no optimizer state)."""
    m = {**MOE_DEFAULTS, **m}
    return [("model.num_experts", m["num_experts"], "MoEArgs num_experts"),
            ("model.moe_top_k", m["top_k"], "MoEArgs top_k"),
            ("model.moe_ffn_hidden_size", width, what),
            ("model.num_shared_experts", m["num_shared_experts"], "MoEArgs num_shared_experts (one FeedForward "
                                                                  "of width × num_shared_experts)"),
            ("model.moe_grouped_gemm", True, "MoEArgs use_grouped_mm (torch._grouped_mm)"),
            ("fsdp2.grouped_experts", True, "torchtitan's GroupedExperts and token dispatcher "
                                            "(frameworks/fsdp2/moe.mf)")]


def _deepseek_v3(a: dict[str, Any]) -> list[tuple[str, Any, str]]:
    # models/deepseek_v3/model/model.py: MLA (wq or wq_a/q_norm/wq_b when q_lora_rank > 0, wkv_a,
    # kv_norm, wkv_b, wo); blocks with layer_id < n_dense_layers have a dense FeedForward(dim, inter_dim),
    # the rest an MoE; no multi-token prediction module; separate output Linear
    return [("model.hidden_size", a["dim"], "dim"), ("model.num_heads", a["n_heads"], "n_heads"),
            ("model.num_kv_heads", a["n_heads"], "MLA: per-head keys and values"),
            ("model.num_layers", a["n_layers"], "n_layers"),
            ("model.ffn_hidden_size", a["inter_dim"], "inter_dim (dense blocks)"),
            ("model.vocab_size", a["vocab_size"], "vocab_size"),
            ("model.tied_embeddings", False, "separate output Linear"),
            ("model.attention", "mla", "multi-head latent attention"),
            ("model.q_lora_rank", a["q_lora_rank"], "q_lora_rank (0: wq without compression)"),
            ("model.kv_lora_rank", a["kv_lora_rank"], "kv_lora_rank"),
            ("model.qk_rope_head_dim", a["qk_rope_head_dim"], "qk_rope_head_dim"),
            ("model.qk_nope_head_dim", a["qk_nope_head_dim"], "qk_nope_head_dim"),
            ("model.v_head_dim", a["v_head_dim"], "v_head_dim"),
            ("model.first_k_dense", a["n_dense_layers"], "n_dense_layers"),
            ("model.mtp_layers", 0, "torchtitan's DeepSeekV3Model has no multi-token prediction module")] + \
        _moe(a["moe"], a["moe_inter_dim"], "moe_inter_dim") + _common(a, "deepseek_v3")


def _llama4_widths(a: dict[str, Any]) -> tuple[int, int]:
    """models/llama4/model/model.py TransformerBlock: the dense FeedForward(4·dim, multiple_of,
    ffn_dim_multiplier) and the MoE expert width int(int(ffn_dim_multiplier · int(2·4·dim/3)) /
    (top_k + num_shared_experts)) (auto_scale_hidden_dim) rounded up to multiple_of."""
    dense = gated_ffn_size(a["dim"], a["multiple_of"], a["ffn_dim_multiplier"])
    hidden = int(2 * 4 * a["dim"] / 3)
    if a["ffn_dim_multiplier"] is not None:
        hidden = int(a["ffn_dim_multiplier"] * hidden)
    m = {**MOE_DEFAULTS, **a["moe"]}
    if a["auto_scale_hidden_dim"]:
        hidden = int(hidden / (m["top_k"] + m["num_shared_experts"]))
    hidden += -hidden % a["multiple_of"]
    return dense, hidden


def _llama4(a: dict[str, Any]) -> list[tuple[str, Any, str]]:
    # a block is MoE when (layer_id + 1) % interleave_moe_layer_step == 0; NoPE layers
    # (every_n_layers_nope) drop the rotary embedding, which has no weights
    dense, expert = _llama4_widths(a)
    step = a["interleave_moe_layer_step"]
    out = _llama_shape(a, dense, "dense FeedForward")
    out += _moe(a["moe"], expert, "MoE hidden_dim (auto_scale_hidden_dim: the dense width / (top_k + "
                                  "num_shared_experts), rounded up to multiple_of)")
    if step == 1:
        out.append(("model.moe_layer_freq", 1, "interleave_moe_layer_step 1: every block MoE"))
    else:
        out.append(("model.moe_layer_freq", [1 if (i + 1) % step == 0 else 0 for i in range(a["n_layers"])],
                    f"interleave_moe_layer_step {step}: block i is MoE when (i + 1) % {step} == 0"))
    return out + _common(a, "llama4")


_LLAMA3_DEBUG = {"dim": 256, "n_layers": 6, "n_heads": 16, "vocab_size": 2048}
_LLAMA3_8B = {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "ffn_dim_multiplier": 1.3,
              "multiple_of": 1024}
#: models/llama3/__init__.py llama3_args (TransformerModelArgs defaults: models/llama3/model/args.py)
LLAMA3 = Family(
    "torchtitan/models/llama3/__init__.py llama3_args",
    {"n_kv_heads": None, "vocab_size": 128256, "multiple_of": 256, "ffn_dim_multiplier": None, "attn_type": "sdpa"},
    {"debugmodel": _LLAMA3_DEBUG,
     "debugmodel_flex_attn": {**_LLAMA3_DEBUG, "attn_type": "flex"},
     "debugmodel_varlen_attn": {**_LLAMA3_DEBUG, "attn_type": "varlen"},
     "8B": _LLAMA3_8B, "8B_flex": {**_LLAMA3_8B, "attn_type": "flex"},
     "8B_varlen": {**_LLAMA3_8B, "attn_type": "varlen"},
     "70B": {"dim": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8, "ffn_dim_multiplier": 1.3,
             "multiple_of": 4096},
     "405B": {"dim": 16384, "n_layers": 126, "n_heads": 128, "n_kv_heads": 8, "ffn_dim_multiplier": 1.2,
              "multiple_of": 4096}},
    _llama3)

# torchtitan before v0.1 (2024): model.name "llama" (torchtitan/models/llama/__init__.py llama_configs at
# c22d1a8, April 2024), then "llama2" (llama2_configs, at 4871358, August 2024, until the Llama 2 models
# were removed in #712); ModelArgs.vocab_size was -1, "defined later by tokenizer": the Llama 2
# SentencePiece tokenizer.model of their train_configs, 32000 words
_LLAMA2 = {"271M": {"dim": 1024, "n_layers": 16, "n_heads": 8}, "1B": {"dim": 2048, "n_layers": 18, "n_heads": 16},
           "7B": {"dim": 4096, "n_layers": 32, "n_heads": 32}, "13B": {"dim": 5120, "n_layers": 40, "n_heads": 40},
           "26B": {"dim": 5120, "n_layers": 80, "n_heads": 40},
           "70B": {"dim": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8, "ffn_dim_multiplier": 1.3,
                   "multiple_of": 4096}}
_LLAMA2_DEFAULTS = {**LLAMA3.defaults, "vocab_size": 32000}
LLAMA2 = Family("torchtitan/models/llama/__init__.py llama2_configs (4871358, 2024)", _LLAMA2_DEFAULTS,
                {"debugmodel": {"dim": 256, "n_layers": 8, "n_heads": 16}, **_LLAMA2}, _llama3)
LLAMA = Family("torchtitan/models/llama/__init__.py llama_configs (c22d1a8, April 2024)", _LLAMA2_DEFAULTS,
               {"debugmodel": {"dim": 256, "n_layers": 2, "n_heads": 16}, **_LLAMA2}, _llama3)

_QWEN3_MOE = {"num_shared_experts": 0, "top_k": 8}
#: models/qwen3/__init__.py qwen3_args (Qwen3ModelArgs defaults: models/qwen3/model/args.py)
QWEN3 = Family(
    "torchtitan/models/qwen3/__init__.py qwen3_args",
    {"vocab_size": 151936, "head_dim": 128, "qk_norm": True, "enable_weight_tying": False, "moe": None,
     "moe_inter_dim": 768, "attn_type": "sdpa"},
    {"debugmodel": {"vocab_size": 2048, "dim": 256, "n_layers": 8, "n_heads": 16, "n_kv_heads": 8,
                    "hidden_dim": 3072, "enable_weight_tying": True},
     "0.6B": {"dim": 1024, "n_layers": 28, "n_heads": 16, "n_kv_heads": 8, "hidden_dim": 3072,
              "enable_weight_tying": True},
     "1.7B": {"dim": 2048, "n_layers": 28, "n_heads": 16, "n_kv_heads": 8, "hidden_dim": 6144,
              "enable_weight_tying": True},
     "4B": {"dim": 2560, "n_layers": 36, "n_heads": 32, "n_kv_heads": 8, "hidden_dim": 9728,
            "enable_weight_tying": True},
     "8B": {"dim": 4096, "n_layers": 36, "n_heads": 32, "n_kv_heads": 8, "hidden_dim": 12288},
     "14B": {"dim": 5120, "n_layers": 40, "n_heads": 40, "n_kv_heads": 8, "hidden_dim": 17408},
     "32B": {"dim": 5120, "n_layers": 64, "n_heads": 64, "n_kv_heads": 8, "hidden_dim": 25600},
     "debugmodel_moe": {"vocab_size": 2048, "dim": 256, "n_layers": 8, "n_heads": 16, "n_kv_heads": 8,
                        "hidden_dim": 3072, "moe_inter_dim": 768, "moe": {**_QWEN3_MOE, "num_experts": 64}},
     "30B-A3B": {"dim": 2048, "n_layers": 48, "n_heads": 32, "n_kv_heads": 4, "hidden_dim": 6144,
                 "moe_inter_dim": 768, "moe": {**_QWEN3_MOE, "num_experts": 128}},
     "235B-A22B": {"dim": 4096, "n_layers": 94, "n_heads": 64, "n_kv_heads": 4, "hidden_dim": 12288,
                   "moe_inter_dim": 1536, "moe": {**_QWEN3_MOE, "num_experts": 128}}},
    _qwen3)

_DSV3_SMALL_MLA = {"q_lora_rank": 0, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                   "v_head_dim": 128}
_DSV3_DEBUG = {"vocab_size": 2048, "dim": 256, "inter_dim": 1024, "moe_inter_dim": 256, "n_layers": 6,
               "n_dense_layers": 1, "n_heads": 16, "moe": {"num_experts": 8, "num_shared_experts": 2, "top_k": 3},
               **_DSV3_SMALL_MLA}
#: models/deepseek_v3/__init__.py deepseekv3_args (DeepSeekV3ModelArgs defaults: model/args.py)
DEEPSEEK_V3 = Family(
    "torchtitan/models/deepseek_v3/__init__.py deepseekv3_args",
    {"attn_type": "sdpa"},
    {"debugmodel": _DSV3_DEBUG, "debugmodel_flex_attn": {**_DSV3_DEBUG, "attn_type": "flex"},
     "16B": {"vocab_size": 102400, "dim": 2048, "inter_dim": 10944, "moe_inter_dim": 1408, "n_layers": 27,
             "n_dense_layers": 1, "n_heads": 16, "moe": {"num_experts": 64, "num_shared_experts": 2, "top_k": 6},
             **_DSV3_SMALL_MLA, "attn_type": "flex"},
     "236B": {"vocab_size": 102400, "dim": 5120, "inter_dim": 12288, "moe_inter_dim": 1536, "n_layers": 60,
              "n_dense_layers": 1, "n_heads": 128, "moe": {"num_experts": 160, "num_shared_experts": 2, "top_k": 6},
              **_DSV3_SMALL_MLA, "q_lora_rank": 1536, "attn_type": "flex"},
     "671B": {"vocab_size": 129280, "dim": 7168, "inter_dim": 18432, "moe_inter_dim": 2048, "n_layers": 61,
              "n_dense_layers": 3, "n_heads": 128, "moe": {"num_experts": 256, "num_shared_experts": 1, "top_k": 8},
              **_DSV3_SMALL_MLA, "q_lora_rank": 1536, "attn_type": "flex"}},
    _deepseek_v3)

_L4_DEBUG = {"dim": 256, "n_layers": 6, "n_heads": 16, "vocab_size": 2048}
_L4_17B = {"dim": 5120, "n_layers": 48, "n_heads": 40, "n_kv_heads": 8, "ffn_dim_multiplier": 1.2,
           "multiple_of": 2048}
#: models/llama4/__init__.py llama4_args (TransformerModelArgs defaults: models/llama4/model/args.py:
#: vocab_size 202048, multiple_of 256, interleave_moe_layer_step 2, auto_scale_hidden_dim true)
LLAMA4 = Family(
    "torchtitan/models/llama4/__init__.py llama4_args",
    {"n_kv_heads": None, "vocab_size": 202048, "multiple_of": 256, "ffn_dim_multiplier": None, "moe": {},
     "auto_scale_hidden_dim": True, "interleave_moe_layer_step": 2, "attn_type": "sdpa"},
    {"debugmodel": _L4_DEBUG,
     "17bx16e": {**_L4_17B, "moe": {"num_experts": 16}, "interleave_moe_layer_step": 1},
     "17bx128e": {**_L4_17B, "moe": {"num_experts": 128}},
     "debugmodel_irope": {**_L4_DEBUG, "attn_type": "flex"},
     "17bx16e_irope": {**_L4_17B, "moe": {"num_experts": 16}, "interleave_moe_layer_step": 1, "attn_type": "flex"},
     "17bx128e_irope": {**_L4_17B, "moe": {"num_experts": 128}, "attn_type": "flex"}},
    _llama4)

#: model.name → its family; llama3_ft (models/llama3_ft/__init__.py) trains llama3_args with torchft
FAMILIES: dict[str, Family] = {"llama3": LLAMA3, "llama3_ft": LLAMA3, "qwen3": QWEN3,
                               "deepseek_v3": DEEPSEEK_V3, "llama4": LLAMA4, "llama2": LLAMA2, "llama": LLAMA}
#: the other models and experiments torchtitan v0.2.2 registers (models/__init__.py _supported_models,
#: experiments/__init__.py _supported_experiments), refused with the reason
REFUSED_MODELS = {
    "flux": "FLUX is a diffusion model (an MM-DiT with T5 / CLIP encoders and an autoencoder), not a "
            "decoder LLM: memform's formulas do not describe it",
    "gpt_oss": "torchtitan builds gpt-oss's transformer blocks in bfloat16 (models/gpt_oss/model/model.py: "
               "TransformerBlock(...).to(torch.bfloat16)) but its embedding and output in float32: parameters, "
               "gradients and AdamW states of two dtypes, which the fsdp2 profile cannot express",
    "vlm": "the Llama 3 + SigLIP2 vision-language experiment: its image encoder and patch batches are not "
           "described by the job config memform reads",
    "transformers_modeling_backend": "the model is the Hugging Face model named in [hf_transformers] model: pass "
                                     "--model config.json (that model's config.json) to size it",
}
REFUSED_MODELS["llama3-siglip2"] = REFUSED_MODELS["vlm"]   # the vlm experiment's earlier name
REFUSED_MODELS["transformers_backend"] = REFUSED_MODELS["transformers_modeling_backend"]   # earlier name
#: experiments that replace torch's fully_shard with their own parallelization
EXPERIMENT_PREFIXES = {"simple_fsdp": "SimpleFSDP (a compiler-traced FSDP, experiments/simple_fsdp)",
                       "compiler_toolkit": "the compiler toolkit's graph-captured training (experiments/"
                                           "compiler_toolkit)",
                       "autoparallel": "AutoParallel's solver-chosen sharding (experiments/autoparallel)"}

# ---- fields that cannot change device memory, each with the reason (job_config.py, v0.2.2) ---------
#: whole sections: logging, profiling, schedules, checkpoints, timeouts
NEUTRAL_SECTIONS = {
    "job": "names, folders, printing the config (Job)",
    "profiling": "torch.profiler traces and memory snapshots record on the host (Profiling)",
    "metrics": "logging to stdout / TensorBoard / W&B (Metrics)",
    "lr_scheduler": "the learning-rate schedule is a scalar per step (LRScheduler)",
    "checkpoint": "DCP saves and loads between steps, when the step's activations are freed; async modes "
                  "stage on the host (Checkpoint)",
    "comm": "process-group timeouts and flight-recorder buffers on the host (Comm)",
    "memory_estimation": "torchtitan's own estimator run, not the training (MemoryEstimation)",
}
#: single fields of the sections memform reads
NEUTRAL = {
    "model": {"hf_assets_path": "tokenizer / checkpoint assets folder",
              "tokenizer_path": "tokenizer file (older releases)",
              "print_after_conversion": "prints the model",
              "use_flex_attn": "older releases: FlexAttention, O(s) saved as the fused SDPA kernels",
              "attn_mask_type": "older releases: causal or block-causal masks of the same attention"},
    "optimizer": {"lr": "a scalar", "eps": "a scalar", "beta1": "a scalar", "beta2": "a scalar",
                  "weight_decay": "applied in place by AdamW"},
    "training": {"dataset": "which data, not its shape", "dataset_path": "where the data is",
                 "max_norm": "clip_grad_norm_ reduces per-tensor norms in place", "steps": "how long to train",
                 "gc_freq": "Python garbage collection schedule", "gc_debug": "gc.collect() every step",
                 "dataloader": "host-side DataLoader workers and pinned host memory (DataLoader)",
                 "seed": "older releases: RNG seed", "deterministic": "older releases: deterministic kernels",
                 "warmup_steps": "older releases: the LR warm-up",
                 "checkpoint_interval": "early 2024: checkpoint settings (as [checkpoint])",
                 "checkpoint_interval_type": "early 2024: checkpoint settings (as [checkpoint])",
                 "checkpoint_folder": "early 2024: checkpoint settings (as [checkpoint])"},
    "parallelism": {"enable_async_tensor_parallel": "takes effect only under torch.compile (job_config.py), "
                                                    "which is estimated as eager",
                    "context_parallel_load_balancer": "reorders the sequence chunks, not their size",
                    "pipeline_parallel_expert_parallel_overlap": "overlaps DualPipeV's EP all-to-alls with "
                                                                 "compute; the buffers are the same"},
    "activation_checkpoint": {"preserve_rng_state": "an RNG state per checkpoint (bytes)",
                              "determinism_check": "compares recomputed metadata",
                              "debug": "checkpoint debug logging",
                              "early_stop": "stops recomputation early: recomputed tensors only, none kept"},
    "compile": {"backend": "the compiler backend (compile itself is warned)"},
    "debug": {"seed": "RNG seed", "deterministic": "deterministic kernels", "deterministic_warn_only": "a flag",
              "moe_force_load_balance": "round-robin routing; memform sizes experts for balanced routing"},
    "fault_tolerance": {"process_group": "torchft's replica process group",
                        "process_group_timeout_ms": "a timeout", "replica_id": "which replica this is",
                        "group_size": "number of replicas: each replica is one FSDP job memform sizes",
                        "min_replica_size": "a quorum size",
                        "sync_steps": "acts only with semi_sync_method (refused)",
                        "num_fragments": "acts only with semi_sync_method (refused)"},
    "validation": {"dataset": "validation data", "dataset_path": "validation data", "freq": "how often",
                   "steps": "how many batches"},
}
#: torch.distributed.pipelining schedule names → memform schedules (schedules.mf)
SCHEDULES = {"1F1B": "1f1b", "GPipe": "gpipe", "Interleaved1F1B": "interleaved",
             "ZBVZeroBubble": "zero-bubble-v", "DualPipeV": "dualpipev"}
#: schedules that place several stages on each rank (torch's PipelineScheduleMulti)
MULTI_STAGE = frozenset({"Interleaved1F1B", "ZBVZeroBubble", "DualPipeV", "InterleavedZeroBubble",
                         "LoopedBFS"})
#: every schedule name above, and torch's other ones, by their lower-case spelling without underscores
KNOWN_SCHEDULES = {name.lower(): name for name in (*SCHEDULES, *MULTI_STAGE)}
#: V-shaped placements: stage k < p on rank k, stage k >= p on rank 2p-1-k (pipeline_module_split)
V_SHAPED = frozenset({"ZBVZeroBubble", "DualPipeV"})

def read_toml(path: Path) -> dict[str, Any]:
    text = read_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        hint = (" (torchtitan >= 0.3 recipes are Python config_registry functions; memform reads the TOML job "
                "configs of torchtitan <= 0.2.2)") if path.suffix == ".py" else ""
        raise MemformError(f"{path}: TOML syntax error: {exc}{hint}") from None
    return data


class _Sections:
    """The job config's sections; a field is looked up in [parallelism], then the older places."""

    def __init__(self, data: dict[str, Any], path: Path):
        self.top = Fields(data, path)
        for name in data:
            if not isinstance(data[name], dict):
                raise self.top.error(name, f"must be a [section] table, got {describe(data[name])}")
        self.model = self.top.section("model")
        self.training = self.top.section("training")
        self.parallelism = self.top.section("parallelism")
        self.experimental = self.top.section("experimental")
        self.ac = self.top.section("activation_checkpoint")
        self.optimizer = self.top.section("optimizer")
        self.compile = self.top.section("compile")
        self.debug = self.top.section("debug")
        self.ft = self.top.section("fault_tolerance")
        self.validation = self.top.section("validation")

    def where(self, key: str) -> Fields:
        """The section that holds ``key`` ([parallelism] first, as current torchtitan has it)."""
        for sec in (self.parallelism, self.training, self.experimental):
            if sec.has(key):
                return sec
        return self.parallelism

    def shard(self) -> tuple[Fields, str]:
        """Where the FSDP degree is: data_parallel_shard_degree, or [training] data_parallel_degree (2024
        releases: FSDP over that many ranks, -1 for the rest)."""
        sec = self.where("data_parallel_shard_degree")
        if not sec.has("data_parallel_shard_degree") and self.training.has("data_parallel_degree"):
            return self.training, "data_parallel_degree"
        return sec, "data_parallel_shard_degree"


def _family(s: _Sections, custom: bool) -> tuple[str, str, Family | None]:
    name = s.model.string("name", "llama3")
    flavor = s.model.string("flavor", "debugmodel")
    if name in REFUSED_MODELS and not (custom and name.startswith("transformers_")):
        raise s.model.error("name", f"is {name!r}: {REFUSED_MODELS[name]}")
    prefix = name.split(".")[0]
    if prefix in EXPERIMENT_PREFIXES and "." in name:
        raise s.model.error("name", f"is {name!r}: {EXPERIMENT_PREFIXES[prefix]} replaces torch's fully_shard, "
                                    f"whose memory the fsdp2 profile models; estimate the plain "
                                    f"{name.split('.', 1)[1]!r} model instead")
    if custom:
        return name, flavor, FAMILIES.get(name)
    if name not in FAMILIES:
        raise s.model.error("name", f"is {name!r}: memform knows torchtitan's {', '.join(sorted(FAMILIES))} "
                                    f"flavors{did_you_mean(name, FAMILIES)} (pass --model FILE for another model)")
    family = FAMILIES[name]
    if flavor not in family.flavors:
        raise s.model.error("flavor", f"is {flavor!r}: torchtitan's {name} flavors are "
                                      f"{', '.join(family.flavors)}{did_you_mean(flavor, family.flavors)} "
                                      f"(pass --model FILE for a custom flavor)")
    return name, flavor, family


def _model_file(model: Path, draft: Draft, given: set[str]) -> None:
    """``--model``: a Hugging Face config.json (the hf importer) or the ``model:`` section of a memform
    YAML config; only the model's shape comes from it, the strategy is the job config's."""
    data = read_model_file(model, draft, given)
    if data is None:  # a Hugging Face config.json, read by the hf importer
        return
    # the formula files are chosen from these keys (importers._formulas)
    for path, value in dotted(data["model"], "model.").items():
        draft.set(path, value, f"from {model.name}")


def convert(path: Path, draft: Draft, given: set[str], model: Path | None = None) -> int | None:
    """Fill ``draft`` from the job config at ``path`` (and ``--model``); the world size is not in it (None)."""
    s = _Sections(read_toml(path), path)
    name, flavor, family = _family(s, model is not None)
    draft.set("training.framework", "fsdp2", "torchtitan shards with FSDP2 (fully_shard, parallelize.py apply_fsdp)")
    if model is not None:
        _model_file(model, draft, given)
        draft.header.append(f"model from {model.name}; strategy from {path.name} ([model] name {name!r}, flavor "
                            f"{flavor!r}: not used for the shape)")
        if name.startswith("transformers_"):
            s.top.used.add("hf_transformers")   # [hf_transformers] model: the Hub id --model stands for
            draft.warn("model.name transformers_modeling_backend: the Hugging Face model is built by transformers; "
                       "its activations are estimated as memform's formulas count them for this shape")
        if "model.num_layers" not in draft:
            raise MemformError(f"{model}: --model gives no model.num_layers")
        layers = draft.get("model.num_layers")
        if "model.swiglu_impl" not in draft:
            draft.set("model.swiglu_impl", "eager", "torchtitan's FeedForward: F.silu(w1(x)) * w3(x) in eager PyTorch")
    else:
        assert family is not None
        args = {**family.defaults, **family.flavors[flavor]}
        draft.header.append(f"torchtitan model {name} flavor {flavor} ({family.source}, {RELEASE})")
        for key, value, note in family.keys(args):
            draft.set(key, value, f"{name} {flavor}: {note}")
        layers = args["n_layers"]
    # 2024 releases: rmsnorm, its kernels (fused_rmsnorm, compiled_rmsnorm), layernorm, np_layernorm
    norm = s.model.string("norm_type", "rmsnorm")
    if norm not in ("rmsnorm", "fused_rmsnorm", "compiled_rmsnorm", "layernorm", "np_layernorm"):
        raise s.model.error("norm_type", f"must be rmsnorm, fused_rmsnorm, compiled_rmsnorm, layernorm or "
                                         f"np_layernorm, got {norm!r}")
    if norm.endswith("layernorm"):
        # models/norms.py: nn.LayerNorm (np_: without affine weights, 2h parameters fewer per block)
        draft.set("model.norm", "layernorm", f"[model] norm_type {norm}")
    # torchtitan's loss, whatever the model: F.cross_entropy over fp32 logits (components/loss.py)
    draft.set("model.cross_entropy", "eager", "torchtitan components/loss.py: F.cross_entropy on fp32 logits")
    seq = s.training.integer("seq_len", 2048)
    draft.set("model.seq_length", seq, "[training] seq_len" if s.training.has("seq_len")
              else "torchtitan's default seq_len 2048")
    pp, pieces, schedule = _parallel(s, draft, layers)
    _batch(s, draft, pp)
    _precision(s, draft)
    _recompute(s, draft, layers, pp, pieces, schedule)
    moe, mla = draft.get("model.num_experts", 1) > 1, draft.get("model.attention") == "mla"
    if draft.get("fsdp2.selective_ac") == "op" and (moe or mla):
        # fsdp2.mf's op-SAC term describes Llama-shaped blocks (wq, wv, SDPA, w1, w2); the MoE / MLA blocks
        # of moe.mf / mla.mf count selective recompute as Megatron's (the attention core only)
        draft.warn(f"op-level SAC (selective_ac_option op) is modelled for dense Llama-shaped blocks; this "
                   f"model's {' and '.join(w for w, on in (('MoE', moe), ('MLA', mla)) if on)} blocks are counted "
                   f"keeping every activation but the attention core's, more than torchtitan's op SAC (every "
                   f"other matmul) keeps: an upper bound")
    _refusals(s, draft)
    _unread(s, draft)
    return None


def _degree(s: _Sections, key: str, default: int, *, minimum: int = 1) -> tuple[int, str]:
    sec = s.where(key)
    value = sec.integer(key, default, minimum=minimum)
    return value, (f"[{sec.where.rstrip('.')}] {key}" if sec.has(key) else f"torchtitan's default {key} {default}")


def _parallel(s: _Sections, draft: Draft, layers: int) -> tuple[int, list[int] | None, str]:
    """The degrees, HSDP, EP, the pipeline split and the reshard policy; returns pp, the layers of each
    pipeline stage (None without pipelining) and the schedule."""
    tp, tp_note = _degree(s, "tensor_parallel_degree", 1)
    pp, pp_note = _degree(s, "pipeline_parallel_degree", 1)
    cp, cp_note = _degree(s, "context_parallel_degree", 1)
    replicate, _ = _degree(s, "data_parallel_replicate_degree", 1)
    shard_sec, shard_key = s.shard()
    shard = shard_sec.integer(shard_key, -1, minimum=-1)
    if shard == 0:
        raise shard_sec.error(shard_key, "must be -1 (the leftover ranks) or a positive integer, got 0")
    draft.set("parallel.tp", tp, tp_note)
    draft.set("parallel.pp", pp, pp_note)
    if cp > 1:
        draft.set("parallel.cp", cp, cp_note)
        rotate = s.where("context_parallel_rotate_method").string("context_parallel_rotate_method", "allgather")
        # torch's context parallel SDPA: all-gather the K/V shards, or pass them round ("alltoall")
        draft.set("parallel.cp_algo", "allgather" if rotate == "allgather" else "ring",
                  f"context_parallel_rotate_method {rotate}")
    # torchtitan applies sequence parallelism with every TP plan (parallelize.py apply_tp)
    draft.set("parallel.sequence_parallel", tp > 1, "torchtitan's TP plan is sequence-parallel" if tp > 1
              else "no tensor parallelism")
    if shard > 0:
        draft.set("parallel.dp", replicate * shard, "data_parallel_replicate_degree × data_parallel_shard_degree")
        if replicate > 1:
            # HSDP (apply_fsdp on the ["dp_replicate", "fsdp"] mesh): shard over dp_shard × cp ranks
            draft.set("parallel.zero_shard_max", shard * cp, "HSDP: FSDP shards over data_parallel_shard_degree "
                      "× context_parallel_degree ranks, replicated data_parallel_replicate_degree times")
    if shard == 1 and cp == 1:
        draft.warn("data_parallel_shard_degree 1 and no context parallelism: torchtitan applies no FSDP "
                   "(DDP or one device, mixed precision by torch.autocast); estimated as fully_shard over 1 rank")
    _experts(s, draft, tp)
    _reshard(s, draft, pp)
    raw = s.where("pipeline_parallel_schedule").string("pipeline_parallel_schedule", "1F1B")
    # torch.distributed.pipelining get_schedule_class matches names case-insensitively; 2024 releases
    # spelled them in snake case (interleaved_1f1b)
    schedule = KNOWN_SCHEDULES.get(raw.lower().replace("_", ""), raw)
    csv = s.where("pipeline_parallel_schedule_csv").raw("pipeline_parallel_schedule_csv", "")
    if pp == 1:
        for key in ("pipeline_parallel_layers_per_stage", "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers", "module_fqns_per_model_part",
                    "pipeline_parallel_split_points", "pipeline_parallel_microbatch_size",
                    "pipeline_parallel_microbatches", "pipeline_parallel_schedule_csv"):
            s.where(key).used.add(key)   # pipeline_llm runs only with pipeline_parallel_degree > 1
        return pp, None, schedule
    if csv:
        raise s.where("pipeline_parallel_schedule_csv").error(
            "pipeline_parallel_schedule_csv", f"is {csv!r}: a schedule read from a CSV file is not modelled")
    if schedule not in SCHEDULES:
        fallback = "interleaved" if schedule in MULTI_STAGE else "1f1b"
        draft.warn(f"pipeline_parallel_schedule {schedule} is not modelled; estimated as {fallback}")
    draft.set("parallel.pp_schedule", SCHEDULES.get(schedule, "interleaved" if schedule in MULTI_STAGE else "1f1b"),
              f"pipeline_parallel_schedule {schedule}")
    pieces = _pieces(s, layers, pp, schedule)
    vpp = len(pieces) // pp
    if vpp > 1:
        draft.set("parallel.vpp", vpp, f"{len(pieces)} pipeline stages over pipeline_parallel_degree {pp}")
    per_rank = [0] * pp
    for k, size in enumerate(pieces):
        per_rank[_rank(k, pp, schedule)] += size
    if len(set(per_rank)) > 1 or len(set(pieces)) > 1:
        # memform splits each rank's layers evenly over its vpp chunks; torchtitan's chunks may differ by one
        draft.set("parallel.stage_layers", per_rank, f"pipeline_llm: stages of {pieces} layers "
                  f"(generate_llm_fqn_per_model_part: the first and last stages hold fewer, for the embedding "
                  f"and the output)" if not s.where("module_fqns_per_model_part").has("module_fqns_per_model_part")
                  else f"module_fqns_per_model_part: stages of {pieces} layers")
    return pp, pieces, schedule


def _rank(k: int, pp: int, schedule: str) -> int:
    """The rank that holds virtual stage k (torch.distributed.pipelining: looped, or V-shaped)."""
    if schedule in V_SHAPED:
        return k if k < pp else 2 * pp - 1 - k
    return k % pp


def _pieces(s: _Sections, layers: int, pp: int, schedule: str) -> list[int]:
    """The transformer blocks of each pipeline stage, as torchtitan's pipeline_llm cuts them."""
    multi = schedule in MULTI_STAGE
    parts_sec = s.where("module_fqns_per_model_part")
    split_sec = s.where("pipeline_parallel_split_points")
    if parts_sec.has("module_fqns_per_model_part"):
        parts = parts_sec.raw("module_fqns_per_model_part")
        if not isinstance(parts, list) or not all(isinstance(p, list) and all(isinstance(m, str) for m in p)
                                                  for p in parts):
            raise parts_sec.error("module_fqns_per_model_part", f"must be a list of lists of module names, got "
                                                                f"{describe(parts)}")
        pieces = [sum(1 for m in part if m.startswith("layers.")) for part in parts]
        where, key = parts_sec, "module_fqns_per_model_part"
    elif split_sec.has("pipeline_parallel_split_points"):
        # older releases: the first module of each stage after the first ("layers.4", ...)
        points = split_sec.raw("pipeline_parallel_split_points")
        if isinstance(points, str):   # 2024 releases: one comma-separated string
            points = [p.strip() for p in points.split(",") if p.strip()]
        try:
            cuts = [int(str(p).rsplit(".", 1)[1]) for p in points]
        except (IndexError, ValueError, TypeError):
            raise split_sec.error("pipeline_parallel_split_points", f"must list 'layers.N' names, got "
                                                                   f"{describe(points)}") from None
        bounds = [0, *cuts, layers]
        pieces = [b - a for a, b in zip(bounds, bounds[1:])]
        where, key = split_sec, "pipeline_parallel_split_points"
    else:
        first = s.where("pipeline_parallel_first_stage_less_layers").integer(
            "pipeline_parallel_first_stage_less_layers", 1, minimum=0)
        last = s.where("pipeline_parallel_last_stage_less_layers").integer(
            "pipeline_parallel_last_stage_less_layers", 1, minimum=0)
        per_sec = s.where("pipeline_parallel_layers_per_stage")
        per_stage = per_sec.integer("pipeline_parallel_layers_per_stage", None)
        # pipeline_llm: ceil((n_layers + input_weight + output_weight) / layers_per_stage) stages, else
        # 1 stage per rank for single-stage schedules and 2 for looped ones
        stages = -(-(layers + first + last) // per_stage) if per_stage else pp * (2 if multi else 1)
        pieces = _llm_split(stages, layers, first, last)
        where, key = per_sec, "pipeline_parallel_layers_per_stage"
    if sum(pieces) != layers or min(pieces) < 0:
        raise where.error(key, f"gives stages of {pieces} blocks; the model has {layers}")
    if len(pieces) % pp:
        raise where.error(key, f"gives {len(pieces)} pipeline stages, not a multiple of pipeline_parallel_degree {pp}")
    if min(pieces) == 0:
        # memform's pipeline layout gives every chunk at least one block (engine/partition.py)
        raise where.error(key, f"gives pipeline stages of {pieces} transformer blocks: a stage with none (only the "
                               f"embedding or the norm and output) is not modelled; use fewer stages or "
                               f"pipeline_parallel_first/last_stage_less_layers 0")
    if (len(pieces) // pp > 1) != multi and schedule in KNOWN_SCHEDULES.values():
        raise where.error(key, f"gives {len(pieces) // pp} stages per rank, but pipeline_parallel_schedule "
                               f"{schedule} takes {'several' if multi else 'one'} (pipeline_llm)")
    return pieces


def _llm_split(stages: int, layers: int, first: int, last: int) -> list[int]:
    """pipeline_parallel.py generate_llm_fqn_per_model_part: (n_layers + input_weight + output_weight)
    effective layers spread evenly (the first stages one more), the first stage giving input_weight of its
    share to the embedding and the last output_weight to the norm and output."""
    if stages == 1:
        return [layers]
    effective = layers + first + last
    if stages > effective or effective // stages < max(first, last, 1):
        raise MemformError(f"torchtitan cannot split {layers} blocks into {stages} pipeline stages "
                           f"(pipeline_llm: each stage needs at least one layer and no more embedding weight)")
    base, extra = divmod(effective, stages)
    pieces, done = [], 0
    for k in range(stages):
        share = base + (1 if k < extra else 0) - (first if k == 0 else last if k == stages - 1 else 0)
        take = max(0, min(share, layers - done))
        pieces.append(take)
        done += take
    return pieces


def _experts(s: _Sections, draft: Draft, tp: int) -> None:
    """Expert parallelism (parallelize.py apply_moe_ep_tp): EP carved from dp_shard × cp (× tp when
    etp = 1); routed experts run with etp-way TP under EP, and with the dense TP plan without it."""
    ep_sec = s.where("expert_parallel_degree")
    ep = ep_sec.integer("expert_parallel_degree", 1)
    etp_sec = s.where("expert_tensor_parallel_degree")
    etp = etp_sec.integer("expert_tensor_parallel_degree", 1)
    backend = s.where("expert_parallel_comm_backend").string("expert_parallel_comm_backend", "standard")
    moe = draft.get("model.num_experts", 1) > 1
    if not moe:
        if ep > 1:
            draft.warn(f"expert_parallel_degree {ep} has no effect on a model without experts (job_config.py)")
        return
    if backend != "standard" and ep > 1:
        raise s.where("expert_parallel_comm_backend").error(
            "expert_parallel_comm_backend", f"is {backend!r}: DeepEP's dispatch / combine buffers are not modelled")
    draft.set("parallel.ep", ep, "[parallelism] expert_parallel_degree" if ep_sec.has("expert_parallel_degree")
              else "torchtitan's default expert_parallel_degree 1")
    if ep > 1:
        if etp not in (1, tp):
            raise etp_sec.error("expert_tensor_parallel_degree", f"must be 1 or tensor_parallel_degree {tp} "
                                                                 f"(job_config.py), got {etp}")
        draft.set("parallel.expert_tp", etp, f"expert_tensor_parallel_degree {etp}")
    else:
        draft.set("parallel.expert_tp", tp, "no EP: the routed experts take the TP plan (tensor_parallel_degree)")


def _reshard(s: _Sections, draft: Draft, pp: int) -> None:
    sec = s.where("fsdp_reshard_after_forward")
    policy = sec.string("fsdp_reshard_after_forward", "default")
    # apply_fsdp: "always" → True, "never" → False, "default" → not pp_enabled; the [norm, output] unit
    # reshards only with "always"
    if policy not in ("default", "always", "never"):
        raise sec.error("fsdp_reshard_after_forward", f"must be default, always or never, got {policy!r}")
    raf = {"always": True, "never": False}.get(policy, pp == 1)
    note = f"fsdp_reshard_after_forward {policy}" + (" (no pipeline parallelism)" if policy == "default" and pp == 1
                                                   else " with pipeline parallelism" if policy == "default" else "")
    draft.set("fsdp2.reshard_after_forward", raf, note)
    draft.set("fsdp2.reshard_head_after_forward", policy == "always",
              f"apply_fsdp: [norm, output] reshard_after_forward = (policy == always), policy {policy}")


def _batch(s: _Sections, draft: Draft, pp: int) -> None:
    key, local = s.training.first(("local_batch_size", "batch_size"), s.training.integer)
    if local is None:
        key, local = "local_batch_size", 8
    note = f"[training] {key}" if s.training.has(key) else "torchtitan's default local_batch_size 8"
    gbs = s.training.integer("global_batch_size", -1, minimum=-1)
    if pp > 1:
        n_sec = s.where("pipeline_parallel_microbatches")
        if n_sec.has("pipeline_parallel_microbatches") and not s.where("pipeline_parallel_microbatch_size").has(
                "pipeline_parallel_microbatch_size"):
            # 2024 releases: the local batch split into pipeline_parallel_microbatches pieces
            count = n_sec.integer("pipeline_parallel_microbatches")
            if local % count:
                raise n_sec.error("pipeline_parallel_microbatches", f"{count} must divide the local batch size {local}")
            micro, mb_key = local // count, "pipeline_parallel_microbatches"
        else:
            mb_sec = s.where("pipeline_parallel_microbatch_size")
            micro, mb_key = mb_sec.integer("pipeline_parallel_microbatch_size", 1), "pipeline_parallel_microbatch_size"
            if local % micro:
                raise mb_sec.error(mb_key, f"{micro} must divide the local batch size {local}")
        draft.set("training.micro_batch_size", micro, f"{note} {local} / {mb_key}" if mb_key.endswith("batches")
                  else mb_key)
        per_step = local // micro
        how = f"{note} {local} / micro-batch {micro}"
    else:
        draft.set("training.micro_batch_size", local, note)
        per_step = 1
        how = "one forward/backward per step"
    if gbs > 0:
        # gradient accumulation: global / (local × dp) steps of local batches (train.py forward_backward_step)
        # (× local / micro-batch pipeline micro-batches each): memform's m = global / (micro-batch × dp)
        draft.set("training.global_batch_size", gbs, "[training] global_batch_size")
    else:
        draft.set("training.num_micro_batches", per_step, how)


def _precision(s: _Sections, draft: Draft) -> None:
    param = dtype_name(s.training.string("mixed_precision_param", "bfloat16"), s.training, "mixed_precision_param")
    reduce = dtype_name(s.training.string("mixed_precision_reduce", "float32"), s.training, "mixed_precision_reduce")
    model = dtype_name(s.training.string("dtype", "float32"), s.training, "dtype")
    p_note = "[training] mixed_precision_param" if s.training.has("mixed_precision_param") else \
        "torchtitan's default mixed_precision_param bfloat16"
    draft.set("training.precision.params", param, p_note)
    draft.set("training.precision.activations", param, f"{p_note}: forward/backward compute dtype")
    draft.set("fsdp2.param_dtype", param, p_note)
    draft.set("fsdp2.reduce_dtype", reduce, "[training] mixed_precision_reduce" if s.training.has(
        "mixed_precision_reduce") else "torchtitan's default mixed_precision_reduce float32")
    if model == "fp32":
        # torchtitan builds the model in fp32: the sharded parameters and AdamW's states are fp32
        draft.set("training.precision.master_weights", True, "torchtitan's model is fp32 ([training] dtype float32); "
                  "FSDP2's sharded fp32 parameters are what the optimizer steps")
    else:
        # [training] dtype bfloat16: "all parameters, gradients, and optimizer states in bfloat16, without
        # an extra copy of fp32 weights" (job_config.py Training.dtype)
        draft.set("training.precision.master_weights", False, f"[training] dtype {model}: no fp32 copy")
        draft.set("training.precision.optimizer", model, f"[training] dtype {model}: AdamW states in the "
                                                         f"parameters' dtype")
    offload = s.training.boolean("enable_cpu_offload", False)
    if offload:
        draft.set("fsdp2.cpu_offload", True, "[training] enable_cpu_offload (CPUOffloadPolicy)")


def _recompute(s: _Sections, draft: Draft, layers: int, pp: int, pieces: list[int] | None, schedule: str) -> None:
    mode = s.ac.string("mode", "selective")
    s.ac.used.update(("selective_ac_option", "memory_budget", "visualize_memory_budget_pareto"))  # per mode
    if mode in ("none", "full"):
        draft.set("training.recompute", mode, f"[activation_checkpoint] mode {mode}")
        return
    if mode != "selective":
        raise s.ac.error("mode", f"must be none, selective or full, got {mode!r} (memory_budget needs "
                                 f"torch.compile's partitioner, which memform does not model)")
    option = str(s.ac.raw("selective_ac_option", "2"))
    if option == "op":
        draft.set("training.recompute", "selective", "[activation_checkpoint] selective, selective_ac_option op")
        draft.set("fsdp2.selective_ac", "op", "op-level SAC (activation_checkpoint.py _apply_op_sac)")
        return
    if not option.isdigit() or int(option) < 0:
        raise s.ac.error("selective_ac_option", f"must be 'op' or a positive integer, got {option!r}")
    every = int(option)
    # _apply_layer_sac: a process-wide counter over the blocks it wraps, from 1; block k is checkpointed
    # when k % every == 0 (every 0: all of them). Each pipeline rank counts its own blocks, its stages in
    # order (pipeline_llm parallelizes the model parts of a rank one after another).
    pieces = pieces or [layers]
    counts: list[int] = []
    seen = [0] * pp
    for k, size in enumerate(pieces):
        rank = _rank(k, pp, schedule) if pp > 1 else 0
        counts += [seen[rank] + j + 1 for j in range(size)]
        seen[rank] += size
    modes = ["full" if every == 0 or count % every == 0 else "none" for count in counts]
    draft.set("training.recompute", "none", "the blocks without a checkpoint keep everything")
    which = "every block" if every in (0, 1) else f"every {every}-th block on each rank"
    draft.set("training.recompute_layers", modes, f"selective_ac_option {every}: {which} checkpointed in full")


def _converters(s: _Sections) -> list[str]:
    raw = s.model.raw("converters", [])
    if isinstance(raw, str):
        raw = [c.strip() for c in raw.split(",") if c.strip()]
    if not isinstance(raw, list) or not all(isinstance(c, str) for c in raw):
        raise s.model.error("converters", f"must be a list of converter names, got {describe(raw)}")
    return raw


#: the converter names of torchtitan's dense Float8Linear (components/quantization/float8.py
#: Float8LinearConverter; "quantize.linear.float8" from late 2025 on)
FLOAT8_CONVERTERS = ("float8", "quantize.linear.float8")
#: module names whose filtering keeps the output head in bf16 ("output" until 2026, "lm_head" in 0.3)
HEAD_FQNS = ("output", "lm_head")


def _float8(s: _Sections, draft: Draft, sec, what: str, head_skipped: bool = False) -> None:  # noqa: ANN001
    """torchtitan's Float8 training of the dense linears (torchao Float8Linear) as fsdp2.float8 /
    fsdp2.float8_all_gather: its recipe (``recipe_name``; unset: torchao's default Float8LinearConfig,
    tensorwise), the fp8 all-gather, and the filter that keeps the head in bf16, which the profile assumes.
    ``head_skipped``: the releases before ``filter_fqns`` (2024's [training] switches, [float8]
    enable_float8_linear) skipped the head themselves (float8.py ``convert_to_float8_training(...,
    module_filter_fn=lambda mod, fqn: fqn != "output")``)."""
    recipe = sec.raw("recipe_name", None) if sec.has("recipe_name") else None
    recipe = "tensorwise" if recipe in (None, "") else recipe
    if recipe not in ("tensorwise", "rowwise", "rowwise_with_gw_hp"):
        raise sec.error("recipe_name", f"is {recipe!r}: torchao Float8LinearRecipeName is tensorwise, rowwise or "
                                       f"rowwise_with_gw_hp")
    if sec.boolean("emulate", False):
        raise sec.error("emulate", "is true: the emulated float8 GEMMs upcast their operands (torchao "
                                   "ScaledMMConfig emulate), whose temporaries memform does not model")
    _, ag = sec.first(("enable_fsdp_float8_all_gather", "enable_fsdp_fp8_all_gather"), sec.boolean)
    ag = bool(ag)
    if ag and recipe != "tensorwise":
        raise sec.error("enable_fsdp_float8_all_gather", f"is true with recipe {recipe!r}: torchao's fp8 all-gather "
                                                         f"supports tensorwise scaling only (Float8LinearConfig)")
    raw = sec.raw("filter_fqns", ["output"] if head_skipped else [])
    fqns = [f.strip() for f in raw.split(",") if f.strip()] if isinstance(raw, str) else raw
    if not isinstance(fqns, list) or not all(isinstance(f, str) for f in fqns):
        raise sec.error("filter_fqns", f"must be a list of module names, got {describe(raw)}")
    if not any(f in HEAD_FQNS for f in fqns):
        raise sec.error("filter_fqns", f"is {fqns!r}: the output head is converted to Float8Linear too, which "
                                       f"memform's fsdp2.float8 (the head in bf16, as torchtitan's recipes filter "
                                       f"it) does not model; add \"output\" to estimate")
    other = [f for f in fqns if f not in HEAD_FQNS]
    if other:
        raise sec.error("filter_fqns", f"also filters {other!r}: those linears stay bf16, which memform's "
                                       f"fsdp2.float8 (every block linear in float8) does not model")
    # the scale precompute (one amax per weight after the step), delayed scaling's amax histories (16 fp32 per
    # cast tensor, torchao Float8Linear buffers) and the fp8 weight recompute option: bytes, not megabytes
    sec.used.update(("precompute_float8_dynamic_scale_for_fsdp", "precompute_float8_amax", "enable_float8_linear",
                     "force_recompute_fp8_weight_in_bwd", "scaling_type_input", "scaling_type_weight",
                     "scaling_type_grad_output"))
    draft.set("fsdp2.float8", recipe, f"{what}: torchao Float8Linear on every block linear, the head filtered "
                                      f"(bf16); recipe {recipe}")
    draft.set("fsdp2.float8_all_gather", ag, "enable_fsdp_float8_all_gather: FSDP2 all-gathers the float8 weights"
              if ag else "weights all-gathered in bf16")


def _refusals(s: _Sections, draft: Draft) -> None:
    """Features that change device memory in ways the fsdp2 profile does not model: refused with the reason."""
    converters = _converters(s)
    float8 = s.top.section("float8")   # releases before [quantize]: [float8] enable_float8_linear
    if float8.boolean("enable_float8_linear", False):     # (the head skipped by torchtitan itself then)
        _float8(s, draft, float8, "float8.enable_float8_linear = true", head_skipped=True)
        converters = [c for c in converters if c not in FLOAT8_CONVERTERS]
    # 2024 releases: [training] fp8_linear ("" or a recipe name; false), enable_fp8_linear,
    # enable_float8_linear, with [training] enable_fsdp_fp8_all_gather / enable_fsdp_float8_all_gather
    for key in ("fp8_linear", "enable_fp8_linear", "enable_float8_linear"):
        value = s.training.raw(key, False)
        if value not in (False, "", None):
            _float8(s, draft, s.training, f"training.{key} = {value!r}", head_skipped=True)
            converters = [c for c in converters if c not in FLOAT8_CONVERTERS]
    s.training.used.update(("enable_fsdp_fp8_all_gather", "enable_fsdp_float8_all_gather", "precompute_float8_amax",
                            "precompute_float8_dynamic_scale_for_fsdp"))
    dense8 = [c for c in converters if c in FLOAT8_CONVERTERS]
    if dense8:
        # the converter's section: [quantize.linear.float8] (late 2025), [float8] before
        quant = s.top.section("quantize").section("linear").section("float8")
        _float8(s, draft, quant if quant.data else float8, f"model.converters {converters!r}")
        converters = [c for c in converters if c not in FLOAT8_CONVERTERS]
    if converters:
        low = [c for c in converters if "float8" in c or "mx" in c.split(".") or c in ("fp8", "mx")]
        why = ("MX training and float8 grouped GEMMs (torchao MXLinear, Float8GroupedExperts) keep "
               "low-precision casts and scales that memform's fsdp2 profile does not model (fsdp2.float8 covers "
               "Float8Linear only); remove the converters to estimate bf16 training") if low else \
            "a model converter rewrites the model's modules (LoRA adapters, quantization), which is not modelled"
        raise s.model.error("converters", f"is {converters!r}: {why}")
    name = s.optimizer.string("name", "AdamW")
    if name not in ("Adam", "AdamW"):
        raise s.optimizer.error("name", f"is {name!r}: torchtitan builds Adam or AdamW (components/optimizer.py)")
    impl = s.optimizer.string("implementation", "fused")
    if impl == "foreach":
        raise s.optimizer.error("implementation", "is 'foreach': torch's multi-tensor AdamW allocates temporaries "
                                                  "over all of a rank's parameter shards at once, which is not "
                                                  "modelled; 'fused' (the default) and 'for-loop' are")
    if impl not in ("fused", "for-loop"):
        raise s.optimizer.error("implementation", f"must be fused, foreach or for-loop, got {impl!r}")
    if s.optimizer.boolean("early_step_in_backward", False):
        raise s.optimizer.error("early_step_in_backward", "is true: stepping each parameter in backward frees its "
                                                          "gradient early, which is not modelled")
    # torchtitan 0.3.0 offloads activations only in experiments/graph_trainer (configs.py memory_policy
    # "sac_and_offload": a compiler pass moves saved activations to the host within cpu_offload_budget_gb,
    # cpu_offload.py); the eager trainer has none
    policy = s.compile.raw("memory_policy", "default")
    if policy not in ("default",):
        raise s.compile.error("memory_policy", f"is {policy!r}: graph_trainer's compiled memory policy "
                                               "(experiments/graph_trainer: SAC and activation offload to the host "
                                               "chosen on the traced graph) is not modelled")
    for key in ("cpu_offload_prefetch_n_layers", "cpu_offload_defer_n_layers", "cpu_offload_budget_gb"):
        s.compile.raw(key)   # graph_trainer's offload tuning: read with memory_policy sac_and_offload only
    # the loss is compiled with the model: [compile] enable with "loss" in components (08b8b24, 2025-08, default
    # ["model", "loss"]); before, [training] compile since bbb1b61 (2025-04: components/loss.py
    # build_cross_entropy_loss, loss_fn = torch.compile(loss_fn)), told apart from the 2024 releases (train.py
    # leaves it commented out) by [training] local_batch_size (8570415, 2025-06). Measured: bench/compiled_ce.py
    components = s.compile.raw("components", ["model", "loss"])
    if not isinstance(components, list) or not all(c in ("model", "loss") for c in components):
        raise s.compile.error("components", f"must be a list of \"model\" and \"loss\", got {components!r}")
    # the transformer blocks: apply_compile compiles each one (torch.compile(block, fullgraph=True):
    # models/llama3/parallelize.py at 9dec370, distributed/compile.py in 0.3) under [compile] enable with
    # "model" in components, and under [training] compile in every release before [compile]. What Inductor's
    # partitioner saves is fsdp2.mf's compile_mode (measured: bench/compiled_block.py)
    blocks = (s.compile.boolean("enable", False) and "model" in components) or s.training.boolean("compile", False)
    if blocks:
        draft.set("model.compile", "blocks", "torch.compile of each transformer block (apply_compile)")
        # MLA and MoE blocks (with and without EP) and TP'd dense blocks (SP: torchtitan's plan) are measured
        # compiled (bench/compiled_block.py --titan); a TP'd MoE block is not
        if draft.get("model.num_experts", 1) > 1 and draft.get("parallel.tp", 1) > 1:
            draft.warn("torch.compile with tensor parallelism on MoE blocks: memform counts what a compiled MoE block "
                       "saves without TP (measured), split as eager TP splits it (not measured compiled)")
        if draft.get("fsdp2.float8", "none") != "none":
            draft.warn("torch.compile with Float8: memform counts torchao's eager casts in backward (fsdp2.mf "
                       "f8_bwd), which Inductor fuses (an upper bound for that transient)")
    if s.where("enable_compiled_autograd").boolean("enable_compiled_autograd", False):
        draft.warn("enable_compiled_autograd: the compiled backward may free activations sooner than the eager one "
                   "memform counts (the estimate is an upper bound)")
    if s.compile.boolean("enable", False) and "loss" in components:
        draft.set("model.cross_entropy", "compiled", "[compile] enable with \"loss\" in components: "
                                                     "torch.compile(F.cross_entropy) (components/loss.py)")
    elif s.training.boolean("compile", False) and s.training.has("local_batch_size"):
        draft.set("model.cross_entropy", "compiled", "[training] compile (2025 releases compile the loss: "
                                                     "components/loss.py build_cross_entropy_loss)")
    if s.where("disable_loss_parallel").boolean("disable_loss_parallel", False) and draft.get("parallel.tp", 1) > 1:
        raise s.where("disable_loss_parallel").error(
            "disable_loss_parallel", "is true with tensor parallelism: the output's logits are gathered to every "
                                     "TP rank (not the vocabulary-parallel loss the fsdp2 profile counts)")
    forced = s.ac.raw("per_op_sac_force_recompute_mm_shapes_by_fqns", ["moe.router.gate"])
    if forced not in (["moe.router.gate"], []) and draft.get("fsdp2.selective_ac") == "op":
        # activation_checkpoint.py: these matmuls' outputs are recomputed rather than saved
        draft.warn(f"per_op_sac_force_recompute_mm_shapes_by_fqns {forced!r}: their matmul outputs are recomputed, "
                   f"which op-level SAC as memform counts it saves (the estimate is an upper bound)")
    if s.ft.boolean("enable", False):
        method = s.ft.raw("semi_sync_method", None)
        if method:
            raise s.ft.error("semi_sync_method", f"is {method!r}: torchft's semi-synchronous training keeps backup "
                                                 f"parameters and an outer optimizer that memform does not model")
        draft.warn("fault_tolerance.enable: torchft replicates the job; the estimate is for one replica group")
    else:
        s.ft.used.add("semi_sync_method")
    key, on = s.validation.first(("enable", "enabled"), s.validation.boolean)   # "enabled": mid-2025 releases
    if on:
        raise s.validation.error(key, "is true: validation runs forward passes of validation.local_batch_size "
                                           "× validation.seq_len (their fp32 logits included) that memform does not "
                                           "size; set it false to estimate the training step")
    for key in ("local_batch_size", "seq_len", "dataloader"):
        s.validation.used.add(key)   # read only when validation.enable
    for key in ("custom_import", "custom_args_module"):
        if s.experimental.string(key, ""):
            draft.refuse_unread(f"experimental.{key}")


#: top-level sections memform reads (the others: NEUTRAL_SECTIONS, or refused)
READ = ("model", "training", "parallelism", "activation_checkpoint", "optimizer", "compile", "debug",
        "fault_tolerance", "validation", "experimental")


def _unread(s: _Sections, draft: Draft) -> None:
    """Every field read, neutral (NEUTRAL, with its reason) or refused at the end of the import."""
    # [quantize] / [float8] / [mx] only configure converters, refused above when any is named
    s.top.used.update(READ + tuple(NEUTRAL_SECTIONS) + ("quantize", "float8", "mx"))
    draft.refuse_unused(s.top)
    degrees = set(NEUTRAL["parallelism"])
    for sec, name in ((s.model, "model"), (s.training, "training"), (s.parallelism, "parallelism"),
                      (s.ac, "activation_checkpoint"), (s.optimizer, "optimizer"), (s.compile, "compile"),
                      (s.debug, "debug"), (s.ft, "fault_tolerance"), (s.validation, "validation"),
                      (s.experimental, "experimental")):
        neutral = set(NEUTRAL.get(name, {})) | (degrees if name in ("training", "experimental") else set())
        draft.refuse_unused(sec, neutral)


def finish(draft: Draft) -> None:
    """After the shared strategy step: the world size behind a ``-1`` shard degree, the HSDP shard group,
    and the global batch that follows from the data-parallel size."""
    s = _Sections(read_toml(draft.source), draft.source)
    _world(s, draft)
    _global_batch(draft)
    _float8_all_gather_shard(draft)


def _float8_all_gather_shard(draft: Draft) -> None:
    """torchtitan turns torchao's fp8 all-gather on only where FSDP has a data-parallel shard dimension:
    ``enable_fsdp_float8_all_gather = parallel_dims.dp_shard_enabled and float8.enable_fsdp_float8_all_gather``
    (torchtitan/float8.py:51-54 at 9dec370, Dec 2024; components/float8.py:80-83 at 01424cb, Apr 2025; from
    2a25f4d, Sep 2024, until 6348d93, Apr 2026, which dropped the key). With data_parallel_shard_degree 1 --
    context parallelism alone, FSDP 1 × CP 8 in the Dec-2024 405B benchmark -- the Float8Linear weights are
    all-gathered in bf16 (and kept so from forward to backward under PP) although fully_shard still shards
    them over the CP ranks. A value given with --set is kept."""
    entry = draft.entries.get("fsdp2.float8_all_gather")
    if entry is None or entry.value is not True or entry.note == "set on the command line":
        return
    dp, cp = draft.get("parallel.dp", 1), draft.get("parallel.cp", 1)
    group = draft.get("parallel.zero_shard_max")          # HSDP: the shard group is dp_shard × cp
    shard = group // cp if isinstance(group, int) and isinstance(cp, int) and cp > 0 else dp
    if shard == 1:
        draft.set("fsdp2.float8_all_gather", False,
                  f"enable_fsdp_float8_all_gather is true, but data_parallel_shard_degree is 1 (cp {cp}): torchtitan "
                  f"all-gathers in fp8 only with dp_shard > 1 (float8.py: parallel_dims.dp_shard_enabled and ...), "
                  f"so the weights are gathered in bf16")


def _global_batch(draft: Draft) -> None:
    """``[training] global_batch_size = -1`` (the default): torchtitan trains local_batch_size × the
    data-parallel degree per step, one gradient accumulation step (trainer.py: ``global_batch_size =
    local_batch_size * batch_degree``, torchtitan 0.3.0 lines 416-419), so the import writes it: a
    search ranks plans at one global batch."""
    if "training.global_batch_size" in draft:
        return
    dp, micro = draft.get("parallel.dp", 1), draft.get("training.micro_batch_size", 1)
    steps = draft.entries.get("training.num_micro_batches")
    m = steps.value if steps is not None else 1
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (dp, micro, m)):
        return
    if steps is not None and steps.note != "set on the command line":
        del draft.entries["training.num_micro_batches"]   # follows from the global batch, at any dp
    draft.set("training.global_batch_size", micro * m * dp,
              f"[training] global_batch_size -1: local batch {micro * m} × data-parallel degree {dp} "
              f"(one gradient accumulation step)")


def _world(s: _Sections, draft: Draft) -> None:
    replicate = s.where("data_parallel_replicate_degree").integer("data_parallel_replicate_degree", 1)
    shard_sec, shard_key = s.shard()
    shard = shard_sec.integer(shard_key, -1, minimum=-1)
    if shard > 0:
        return
    entry = draft.entries.get("parallel.dp")
    if entry is None or entry.default:
        # data_parallel_shard_degree -1: "leftover ranks will be used" (job_config.py) -- the world size,
        # which torchtitan takes from torchrun (NGPU in run_train.sh), is not in the job config
        raise MemformError(f"{draft.source}: {shard_key} is -1 (the ranks left over), so the "
                           f"data-parallel size depends on the world size: pass --devices N (the number of GPUs "
                           f"torchrun starts) or --set parallel.dp=N")
    if replicate == 1 or "parallel.zero_shard_max" in draft:
        return
    dp = draft.get("parallel.dp", 1)
    if dp % replicate:
        raise MemformError(f"{draft.source}: data_parallel_replicate_degree {replicate} does not divide the data-"
                           f"parallel ranks ({dp}); pass --devices N (the world size) for "
                           f"data_parallel_shard_degree -1")
    cp = draft.get("parallel.cp", 1)
    draft.set("parallel.zero_shard_max", dp // replicate * cp, f"HSDP: data_parallel_shard_degree -1 = dp {dp} / "
              f"data_parallel_replicate_degree {replicate}, × cp {cp}")
