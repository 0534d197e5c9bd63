"""Megatron-LM command-line arguments → a memform config (model and parallel strategy).

The file holds the arguments of ``pretrain_gpt.py`` the way launch scripts write them: one per
line, or shell-style on one line with backslash continuations, possibly behind a ``torchrun``
launcher (whose ``--nproc_per_node`` × ``--nnodes`` gives the device count) and possibly wrapped
in bash arrays (``GPT_ARGS=( ... )``). Defaults are Megatron-LM's own
(``megatron/training/arguments.py``) so that an omitted flag means what it means to Megatron.
"""

from __future__ import annotations

import ast as pyast
import re
import shlex
from pathlib import Path
from typing import Any

from ..errors import MemformError, read_text
from .draft import Draft, Fields, divide, pad_vocab

TITLE = "Megatron-LM arguments"

#: arguments that do not change training memory (data, logging, checkpoints, learning rate,
#: initialisation, fusions and overlaps that keep the same tensors alive)
IGNORED_PREFIXES = (
    "lr", "min-lr", "weight-decay", "adam-", "sgd-", "clip-grad", "save", "load", "log", "tensorboard",
    "wandb", "eval-", "data-path", "data-cache", "train-data", "valid-data", "test-data", "split",
    "tokenizer-model", "vocab-file", "merge-file", "init-method", "seed", "train-iters", "train-samples",
    "exit-", "distributed-backend", "distributed-timeout", "num-workers", "no-", "overlap-",
    "use-mcore-models", "transformer-impl", "ckpt-", "dist-ckpt", "rotary-", "rope-", "norm-epsilon",
    "moe-router-", "moe-aux-loss", "moe-z-loss", "moe-token-dispatcher", "moe-permute-fusion",
    "moe-input-jitter", "moe-shared-expert-overlap", "moe-per-layer-logging", "moe-token-drop",
    "moe-pad-expert", "attention-softmax-in-fp32", "accumulate-allreduce-grads-in-fp32",
    "bias-gelu-fusion", "bias-swiglu-fusion", "bias-dropout-fusion", "masked-softmax-fusion",
    "apply-", "timing-", "mock-data", "use-checkpoint", "finetune", "pretrained-checkpoint",
    "cross-entropy", "gradient-accumulation-fusion", "async-", "manual-gc", "profile", "qk-layernorm",
    "init-", "override-", "tp-comm-", "ddp-", "check-weight-hash", "calculate-per-token-loss",
    "loss-scale", "initial-loss-scale", "min-loss-scale", "hysteresis", "fp16-lr", "use-cpu-initialization",
    "legacy-", "exp-avg", "rampup-batch-size", "dataloader-type", "reset-", "eod-mask-loss",
    "short-seq-prob", "mmap-", "object-storage", "num-dataset-builder-threads", "deterministic-mode",
    "empty-unused-memory", "use-dist-ckpt", "auto-detect-ckpt-format", "add-qkv-bias",
    "rotary-percent", "use-rope-scaling", "disable-bf16-reduced-precision-matmul", "add-position-embedding",
    "world-size", "multi-latent-attention", "nproc", "nnodes", "node-rank", "master-", "rdzv",
    "use-legacy-models", "mtp-loss-scaling-factor", "enable-experimental", "tokenizer-type",
    "fp8-margin", "fp8-amax-", "fp8-interval", "fp8-wgrad",
)

#: Megatron-LM's multi-latent-attention defaults (arguments.py, "_add_mla_args" group)
MLA_DEFAULTS = {"kv-lora-rank": 32, "qk-head-dim": 128, "qk-pos-emb-head-dim": 64, "v-head-dim": 128}
#: vocabulary sizes of Megatron's built-in tokenizers that need no vocabulary file to know
TOKENIZER_VOCAB = {"GPT2BPETokenizer": 50257}
CP_ALGOS = {"p2p": "ring", "all_gather": "allgather", "a2a": "ulysses"}


def read_arguments(path: Path) -> tuple[dict[str, Any], int | None, list[str]]:
    """(arguments by dashed name, devices from a torchrun launcher line, warnings)."""
    text = read_text(path)
    text = re.sub(r"\\\r?\n", " ", text)
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError as exc:
        raise MemformError(f"{path}: cannot split the arguments shell-style: {exc}") from None
    tokens = [t for t in tokens if not re.fullmatch(r"[A-Za-z_]\w*=\(|\)", t)]  # bash array wrappers
    script = max((i for i, t in enumerate(tokens) if t.endswith(".py")), default=-1)
    launcher, tokens = _options(tokens[:script]), tokens[script + 1:]
    args = _options(tokens)
    warnings = [f"stray token {t!r} ignored (not after an --option)" for t in args.pop("", [])]
    devices = None
    per_node = launcher.get("nproc-per-node")
    if per_node is not None:
        nodes = launcher.get("nnodes", "1")
        if str(per_node).isdigit() and str(nodes).isdigit():
            devices = int(per_node) * int(nodes)
    if not args:
        raise MemformError(f"{path}: no --arguments found (expected Megatron-LM arguments such as "
                           f"--num-layers 32)")
    return args, devices, warnings


def _options(tokens: list[str]) -> dict[str, Any]:
    """``--a 1 --b --c x y --d=2`` → {a: "1", b: True, c: ["x", "y"], d: "2"}; stray tokens under ''."""
    out: dict[str, Any] = {}
    key = None
    for tok in tokens:
        if tok.startswith("--") and len(tok) > 2:
            name, eq, value = tok[2:].partition("=")
            key = name.replace("_", "-")
            out[key] = value if eq else True
            if eq:
                key = None
            continue
        if key is None:
            out.setdefault("", []).append(tok)
            continue
        current = out[key]
        out[key] = tok if current is True else (current + [tok] if isinstance(current, list) else [current, tok])
    return out


def convert(path: Path, draft: Draft, given: set[str]) -> int | None:
    """Fill ``draft`` from the arguments file; returns the device count a launcher line gives."""
    args, devices, warnings = read_arguments(path)
    for w in warnings:
        draft.warn(w)
    f = Fields(args, path, "--")
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
    draft.set("model.tied_embeddings", not f.boolean("untie-embeddings-and-output-weights", False),
              "--untie-embeddings-and-output-weights" if f.has("untie-embeddings-and-output-weights")
              else "Megatron ties them unless --untie-embeddings-and-output-weights")
    _positions(f, draft)
    kv_channels = f.integer("kv-channels", None)
    if kv_channels is not None and kv_channels * a != h and not f.boolean("multi-latent-attention", False):
        draft.warn(f"--kv-channels {kv_channels} × heads {a} != hidden size {h}: memform's attention uses "
                   f"hidden_size / num_heads")
    _moe(f, draft)
    _mla(f, draft)
    mtp = f.integer("mtp-num-layers", 0, minimum=0)
    if mtp:
        draft.set("model.mtp_layers", mtp, "--mtp-num-layers")

    _strategy(f, draft, L, tp)
    _training(f, draft)
    for key in f.unused():
        if not key.startswith(IGNORED_PREFIXES):
            draft.warn(f"argument '--{key}' is not used by memform (ignored)")
    return devices


def _vocab(f: Fields, draft: Draft, tp: int, given: set[str]) -> None:
    divisible = f.integer("make-vocab-size-divisible-by", 128)
    if f.has("padded-vocab-size"):
        draft.set("model.vocab_size", f.integer("padded-vocab-size"), "--padded-vocab-size")
        return
    if f.has("vocab-size"):
        vocab, where = f.integer("vocab-size"), "--vocab-size"
    elif f.string("tokenizer-type", "") in TOKENIZER_VOCAB:
        vocab, where = TOKENIZER_VOCAB[f.string("tokenizer-type")], f"--tokenizer-type {f.string('tokenizer-type')}"
    elif "model.vocab_size" in given:
        return
    else:
        raise f.missing("vocab-size", " (Megatron reads it from the tokenizer files, which memform does not "
                                      "open: add --vocab-size N or pass --set model.vocab_size=N)")
    padded = pad_vocab(vocab, divisible, tp)
    draft.set("model.vocab_size", padded, f"{where} {vocab} padded to a multiple of "
              f"--make-vocab-size-divisible-by {divisible} × tp {tp}")


def _attention_kernel(f: Fields, draft: Draft) -> None:
    backend = f.string("attention-backend", None)
    if f.boolean("use-flash-attn", False):
        draft.set("model.flash_attention", True, "--use-flash-attn")
    elif backend is not None:
        draft.set("model.flash_attention", backend in ("flash", "fused", "auto"), f"--attention-backend {backend}")
    else:
        draft.set("model.flash_attention", False, "no --use-flash-attn / --attention-backend")


def _positions(f: Fields, draft: Draft) -> None:
    kind = f.string("position-embedding-type", None)
    if kind is None and f.boolean("use-rotary-position-embeddings", False):
        kind = "rope"
    kind = kind or "learned_absolute"
    if kind in ("rope", "mrope", "yarn"):
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
        count = -(-shared // expert_ffn)
        if shared % expert_ffn:
            draft.warn(f"--moe-shared-expert-intermediate-size {shared} is not a multiple of the expert size "
                       f"{expert_ffn}; counted as {count} shared experts (an overestimate)")
        draft.set("model.num_shared_experts", count, f"--moe-shared-expert-intermediate-size {shared} / {expert_ffn}")
    capacity = f.number("moe-expert-capacity-factor", None)
    if capacity is not None:
        draft.set("model.capacity_factor", capacity, "--moe-expert-capacity-factor")
    draft.set("model.moe_grouped_gemm", f.boolean("moe-grouped-gemm", False),
              "--moe-grouped-gemm" if f.has("moe-grouped-gemm") else "no --moe-grouped-gemm")
    if f.has("moe-layer-freq"):
        dense = _leading_dense(f, experts)
        if dense:
            draft.set("model.first_k_dense", dense, "leading 0s of --moe-layer-freq")


def _leading_dense(f: Fields, experts: int) -> int:
    """The first-k-dense count of ``--moe-layer-freq``: 1, or a pattern like ``([0]*3+[1]*58)``."""
    raw = f.raw("moe-layer-freq")
    text = str(raw).strip()
    if text.isdigit():
        if int(text) != 1:
            raise f.error("moe-layer-freq", f"{text}: MoE every {text} layers is not modelled (memform's "
                                            f"stack is k dense layers then MoE layers)")
        return 0
    match = re.fullmatch(r"\(?\s*\[0\]\s*\*\s*(\d+)\s*\+\s*\[1\]\s*\*\s*(\d+)\s*\)?", text)
    if match:
        return int(match.group(1))
    try:
        pattern = pyast.literal_eval(text)
    except (ValueError, SyntaxError):
        pattern = None
    if isinstance(pattern, list) and pattern and all(x in (0, 1) for x in pattern):
        dense = pattern.index(1) if 1 in pattern else len(pattern)
        if all(x == 1 for x in pattern[dense:]):
            return dense
    raise f.error("moe-layer-freq", f"must be 1, a list of 0/1 with the dense (0) layers first, or "
                                    f"([0]*k+[1]*n), got {text!r}")


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
        vpp = divide(layers, pp * per_chunk, "--num-layers / (--pipeline-model-parallel-size × "
                                             "--num-layers-per-virtual-pipeline-stage)", f.file)
        draft.set("parallel.vpp", vpp, f"--num-layers / (pp × {per_chunk} layers per virtual stage)")
    elif f.has("num-virtual-stages-per-pipeline-rank"):
        draft.set("parallel.vpp", f.integer("num-virtual-stages-per-pipeline-rank"),
                  "--num-virtual-stages-per-pipeline-rank")
    first = f.integer("decoder-first-pipeline-num-layers", None, minimum=0)
    last = f.integer("decoder-last-pipeline-num-layers", None, minimum=0)
    if (first is not None or last is not None) and pp > 1:
        draft.set("parallel.stage_layers", _uneven_split(f, layers, pp, first, last),
                  "--decoder-first/last-pipeline-num-layers")
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
    if f.raw("use-torch-fsdp2") or f.raw("use-custom-fsdp"):
        draft.warn("FSDP (--use-torch-fsdp2 / --use-custom-fsdp) is imported as the distributed optimizer "
                   "only; set parallel.zero: 3 for fully sharded parameters")


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
    _optimizer_precision(f, draft, dtype)
    optimizer = f.string("optimizer", "adam")
    if optimizer != "adam":
        draft.warn(f"--optimizer {optimizer}: memform counts Adam's two moments")


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
FP8_RECIPES = ("delayed", "tensorwise", "mxfp8")


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


def _overlap(f: Fields, draft: Draft) -> None:
    """--overlap-grad-reduce / --overlap-param-gather / --ddp-bucket-size: Megatron reduces and gathers in
    place in its grad / param buffers (param_and_grad_buffer.py), so none of them adds memory."""
    if f.boolean("overlap-grad-reduce", False):
        draft.set("parallel.overlap_grad_reduce", True, "--overlap-grad-reduce (in place in the grad buffer)")
    if f.boolean("overlap-param-gather", False):
        draft.set("megatron.overlap_param_gather", True, "--overlap-param-gather (in place in the param buffer)")
    bucket = f.integer("ddp-bucket-size", None)
    if bucket is not None:
        draft.set("megatron.ddp_bucket_size", bucket, "--ddp-bucket-size")
    if f.has("overlap-grad-reduce") or bucket is not None:
        draft.set("parallel.dp_bucket_mib", 0, "Megatron reduce-scatters / all-reduces in place: no bucket buffer")
