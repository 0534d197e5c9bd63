"""Hugging Face transformers as the ground truth: its own model classes, one training step as the
Trainer runs it, measured per category and held against memform's ``hf-trainer`` profile.

The model is built by transformers itself (``AutoModelForCausalLM.from_config``, random weights, no
download) from a config of the model type's own class; memform reads *the same* ``config.json``
through ``memform import hf`` (so the importer is part of what is checked), with the training set-up
added as ``--set`` overrides. The step is ``Trainer.training_step`` as transformers 5 writes it
(trainer.py: ``compute_loss`` keeps only ``outputs.loss`` -- the logits and the KV cache the model
returns are dropped before backward --, ``loss.backward()``, the optimizer step, ``zero_grad``
with ``set_to_none``); ``TrainingArguments`` ``bf16=True`` is the forward under ``torch.autocast``
(here the CPU's, ``hf_trainer.autocast_device: cpu``), ``gradient_checkpointing=True`` is
``activation_checkpointing_enable()`` (non-reentrant ``torch.utils.checkpoint`` per decoder layer).

A case with ``fake=True`` runs the same code under ``FakeTensorMode``: nothing is allocated, so the
sizes of real fine-tuning jobs (Llama-3.1-8B at 8K tokens, Llama-3.1-70B) are traced in seconds.
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import imported_config
from .tracking import StepSamples, pinned_as_host, replay_reserved, replayed_figures

#: transformers' config class keywords of each model type the harness builds
MODEL_TYPES = ("llama", "qwen3", "mixtral")
#: the dtypes of a step: the model's dtype, and whether the forward is autocast to bf16 (AMP)
DTYPES = ("fp32", "bf16", "amp-bf16")


@dataclass(frozen=True)
class HFCase:
    """One transformers training step: model type and shape, batch, attention kernel, checkpointing,
    dtype set-up, and whether it is traced with fake tensors (``fake``: the size of a real job)."""

    model: str = "llama"
    h: int = 128
    L: int = 2
    heads: int = 8
    kv_heads: int = 4
    ffn: int = 352
    vocab: int = 1024
    b: int = 2
    s: int = 256
    attn: str = "sdpa"
    gc: bool = False
    dtype: str = "fp32"
    fake: bool = False
    head_dim: int = 0         # 0: h / heads (qwen3 sets its own)
    experts: int = 0          # mixtral: num_local_experts
    top_k: int = 2
    recipe: str = ""          # the published model this shape is (fake cases)
    device: str = "cpu"       # "cuda": a real GPU step (bench/gpu_truth.py), with the allocator's peaks
    lora_r: int = 0           # PEFT LoRA rank (0: full fine-tuning); the base model frozen, as PEFT does
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")   # PEFT's default for Llama
    lora_dropout: float = 0.0
    # PEFT's DoRA (LoraConfig use_dora, Liu et al. 2024): a trained magnitude per output of each adapted matrix
    dora: bool = False
    # tie_word_embeddings (Qwen2.5 up to 3B, Llama-3.2 1B / 3B, Gemma): the head is the embedding matrix
    tied: bool = False
    # with gc: activation_checkpointing_kwargs {"offload": true} (transformers 5.25 trainer.py): each
    # checkpoint's saved input in (pinned) host memory, torch save_on_cpu (formulas/offload-decoder.mf checkpoint)
    offload: bool = False

    def label(self) -> str:
        shape = self.recipe or f"L{self.L} h{self.h} a{self.heads}/{self.kv_heads}"
        moe = f" moe{self.experts}x{self.top_k}" if self.experts else ""
        if self.lora_r:
            moe += (f" lora{self.lora_r}[{'+'.join(t.split('_')[0] for t in self.lora_targets)}]"
                    f"{f' drop{self.lora_dropout:g}' if self.lora_dropout else ''}{' dora' if self.dora else ''}")
        return (f"hf {self.model} {shape}{' tied' if getattr(self, 'tied', False) else ''}{moe} b{self.b} s{self.s} {self.attn}"
                f"{' gc' if self.gc else ''}{'-offload' if getattr(self, 'offload', False) else ''} {self.dtype}{' fake' if self.fake else ''}"
                f"{'' if self.device == 'cpu' else ' ' + self.device}")

    # ---- the model, as transformers configures it ------------------------------------------------
    def hf_config(self) -> Any:
        from transformers import AutoConfig

        kw: dict[str, Any] = dict(hidden_size=self.h, intermediate_size=self.ffn, num_hidden_layers=self.L,
                                  num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
                                  vocab_size=self.vocab, max_position_embeddings=self.s,
                                  tie_word_embeddings=self.tied)
        if self.head_dim:
            kw["head_dim"] = self.head_dim
        if self.model == "mixtral":
            kw.update(num_local_experts=self.experts, num_experts_per_tok=self.top_k)
        return AutoConfig.for_model(self.model, **kw)

    def build_model(self, dtype: Any) -> Any:
        """transformers' own model of the case (random weights, no download)."""
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_config(self.hf_config(), attn_implementation=self.attn, dtype=dtype)

    # ---- memform's side: the same config.json through `memform import hf` -------------------------
    def overrides(self) -> dict[str, Any]:
        """The training set-up as ``memform import hf --set`` keys (the hf-trainer profile's)."""
        over: dict[str, Any] = {
            "training.framework": "hf-trainer",
            "model.seq_length": self.s,
            "training.micro_batch_size": self.b,
            "training.recompute": "full" if self.gc else "none",
            # transformers' sdpa on the CPU runs _scaled_dot_product_flash_attention_for_cpu (O(s) kept);
            # eager materialises the a·s² scores
            "model.flash_attention": self.attn == "sdpa",
            "training.precision.params": "bf16" if self.dtype == "bf16" else "fp32",
        }
        if self.dtype == "amp-bf16":
            over.update({"hf_trainer.amp": "bf16", "hf_trainer.autocast_device": self.device})
        if getattr(self, "offload", False):   # the hf_nas / hf_vision cases share these methods
            over["training.activation_offload"] = "checkpoint"
        return over

    def kept_tensors(self, model: Any) -> list[Any]:
        """Tensors the model keeps that are neither parameters nor buffers (hf_qlora: a 4-bit base's
        quant_state constants), measured with the parameters."""
        return []

    def optimizer(self, trained: list[Any]) -> Any:
        """The Trainer's optimizer over the trained parameters (hf_optim: other TrainingArguments optim)."""
        import torch

        return torch.optim.AdamW(trained, lr=1e-4)

    def lora_config(self) -> Any:
        """PEFT's ``LoraConfig`` of the case (what ``adapter_config.json`` holds)."""
        from peft import LoraConfig

        return LoraConfig(r=self.lora_r, lora_alpha=2 * self.lora_r, lora_dropout=self.lora_dropout,
                          target_modules=list(self.lora_targets), task_type="CAUSAL_LM", use_dora=self.dora)

    def memform_config(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            self.hf_config().save_pretrained(tmp)
            options: dict[str, Any] = {}
            if self.lora_r:
                self.lora_config().save_pretrained(tmp)       # adapter_config.json, as PEFT writes it
                options["adapter"] = str(Path(tmp) / "adapter_config.json")
            return imported_config("hf", Path(tmp) / "config.json", self.label(), overrides=self.overrides(),
                                   **options)


@dataclass
class Step:
    """What one traced step measured, per category (bytes), and the ops behind its peak."""

    measured: dict[str, int]
    peak_by_op: dict[str, int] = field(default_factory=dict)
    loss: float = 0.0
    #: on a GPU: the caching allocator's torch.cuda.max_memory_allocated / max_memory_reserved over the
    #: traced step (peaks reset after the warm-up step), bytes
    allocator: dict[str, int] = field(default_factory=dict)
    #: the traced step's allocations replayed through memform's allocator model (two steps, statics first)
    replay: Any = None


def measure(case: HFCase, seed: int = 0) -> Step:
    """Run ``case``'s warm-up step, then the traced one (see the module docstring)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # tiny tensors: threads only add contention; nothing allocated changes
    try:
        if case.fake:
            from torch._subclasses.fake_tensor import FakeTensorMode

            with FakeTensorMode(allow_non_fake_inputs=True):
                return _step(case, seed)
        return _step(case, seed)
    finally:
        torch.set_num_threads(threads)


def _step(case: HFCase, seed: int) -> Step:
    import torch

    torch.manual_seed(seed)
    dtype = torch.bfloat16 if case.dtype == "bf16" else torch.float32
    model = case.build_model(dtype)   # hf_nas.NASCase builds its heterogeneous layers here
    if case.device != "cpu":
        model = model.to(case.device)
    model.train()
    if case.gc:
        # what the Trainer calls with TrainingArguments' default kwargs (trainer.py): use_reentrant False;
        # activation_checkpointing_kwargs {"offload": true} passes offload=True
        model.activation_checkpointing_enable(offload=getattr(case, "offload", False))
    if case.lora_r:
        from peft import get_peft_model

        # PEFT freezes every base weight and adds the adapters (in fp32 over a 16-bit base:
        # get_peft_model's autocast_adapter_dtype default)
        model = get_peft_model(model, case.lora_config())
    params = list(model.parameters())
    # the NAS and vision cases are not HFCase subclasses: HFCase's defaults (nothing kept, AdamW) for them
    kept = case.kept_tensors(model) if hasattr(case, "kept_tensors") else HFCase.kept_tensors(case, model)
    # the Trainer's optimizer takes the parameters that require gradients (trainer.py
    # get_decay_parameter_names / create_optimizer)
    trained = [p for p in params if p.requires_grad]
    opt = case.optimizer(trained) if hasattr(case, "optimizer") else HFCase.optimizer(case, trained)
    ids = torch.randint(0, case.vocab, (case.b, case.s), device=case.device)
    autocast = (torch.autocast(case.device, dtype=torch.bfloat16) if case.dtype == "amp-bf16"
                else contextlib.nullcontext())
    # offloaded activations' host copies (pinned_as_host: what save_on_cpu allocates with pin_memory), by
    # serial in the traced step: counted as host memory, not as the device's activations
    host: set[int] = set()
    tracing: list[StepSamples] = []
    def offload() -> Any:
        if getattr(case, "offload", False) and case.device == "cpu":
            return pinned_as_host(lambda t: host.update(tracing[0].serials([t])) if tracing else None)
        return contextlib.nullcontext()

    # a loop that holds the previous micro-batch's output until the next forward returns (hf_qlora's
    # keep_last): LitGPT's fine-tuning loop (finetune/lora.py at 01fe959, the `while` loop: `logits =
    # model(input_ids, lm_head_chunk_size=128)`; `logits[-1] = logits[-1][..., :-1, :]`; `loss =
    # chunked_cross_entropy(logits, targets[..., 1:])`; `fabric.backward(loss / accum)`; `loss` rebound to a
    # float every log_interval = 1). Lightning Fabric's _FabricModule.forward passes the output through the
    # precision plugin's convert_output, which casts every floating tensor to the default dtype, fp32
    # (fabric/plugins/precision/half.py, bitsandbytes.py: _convert_fp_tensor(.., torch.get_default_dtype())):
    # the model's 128-token chunks of bf16 logits become fp32 chunks, held under the name `logits` -- with
    # their autograd graph, and what a custom Function stored on its ctx -- until the next forward returns
    held: list[Any] = []
    keep_last = getattr(case, "keep_last", False)

    def forward_loss() -> Any:
        if not keep_last:
            return model(input_ids=ids, labels=ids).loss   # Trainer.compute_loss: the loss only
        out = model(input_ids=ids).logits   # the same bytes as LitGPT's list of 128-token lm_head chunks
        logits = [c.float() for c in out.split(128, dim=1)]   # Fabric convert_output
        del out                                               # the wrapper's bf16 output, freed as it returns
        if trace_of[0] is not None and held:
            trace_of[0].mark("held")
        held.clear()                      # the loop's name `logits` now refers to this micro-batch's output
        if trace_of[0] is not None:
            trace_of[0].mark("released")
        held.append(logits)
        logits[-1] = logits[-1][..., :-1, :]
        return litgpt_chunked_cross_entropy(logits, ids[..., 1:])

    trace_of: list[StepSamples | None] = [None]

    def train_step(trace: StepSamples | None) -> float:
        trace_of[0] = trace
        with autocast, offload():
            loss = forward_loss()
        if trace is not None:
            trace.mark("forward")
        with offload():
            loss.backward()
        if trace is not None:
            trace.mark("backward")
        return float(loss.detach()) if not case.fake else 0.0

    train_step(None)                      # warm-up: the optimizer creates its states
    opt.step()
    opt.zero_grad(set_to_none=True)
    states = [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    static = [t.untyped_storage() for t in [*params, *kept, *model.buffers(), *states, ids]]
    cuda = case.device.startswith("cuda") and not case.fake
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    trace = StepSamples(ignore=static)
    tracing.append(trace)
    start = 0
    with trace.mode:
        if keep_last:
            # the previous micro-batch (gradient accumulation: no optimizer step between), traced so that
            # what its graph holds is seen; the measured step is the next one
            train_step(trace)
            start = len(trace.samples)
        loss = train_step(trace)
    allocator = {}
    if cuda:
        torch.cuda.synchronize()
        allocator = {"max_allocated": torch.cuda.max_memory_allocated(),
                     "max_reserved": torch.cuda.max_memory_reserved()}
    grads = trace.serials(p.grad for p in params)
    measured = {
        "params": _bytes([*params, *kept]),
        "grads": _bytes(p.grad for p in params),
        "optimizer": _bytes(states),
    }
    act = lambda serial: serial not in grads and serial not in host   # noqa: E731 - the device's activation side
    measured["activations"] = trace.at(trace.marks["forward"], act)
    if getattr(case, "offload", False):
        # the host copies live when the forward has returned (one per checkpointed layer)
        measured["host"] = trace.at(trace.marks["forward"], lambda serial: serial in host)
    if keep_last:
        # what the previous micro-batch's output and graph held when this forward returned: freed as the name
        # `logits` is rebound
        measured["held"] = trace.at(trace.marks["held"], act) - trace.at(trace.marks["released"], act)
    measured["comm"] = 0   # one process: no communication buffers
    replayed = replay_reserved(trace, [*params, *kept, *model.buffers(), ids], states, host=host)
    measured.update(replayed_figures(replayed))
    peak, where = trace.peak(act, start)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return Step({**measured, "activations_peak": peak}, trace.by_op(where, act, 10), loss, allocator, replayed)


def litgpt_chunked_cross_entropy(logits: list[Any], targets: Any, ignore_index: int = -1) -> Any:
    """LitGPT's ``chunked_cross_entropy`` for a chunked lm_head (litgpt/utils.py at 01db2ec, the ``list``
    branch, chunk_size 128): one ``cross_entropy(reduction="none")`` per logits chunk (each saves its fp32
    log-probs), the per-token losses concatenated, summed and divided by the unmasked count."""
    import torch

    logit_chunks = [c.reshape(-1, c.size(-1)) for c in logits]
    target_chunks = [c.reshape(-1) for c in targets.split(logits[0].size(1), dim=1)]
    losses = [torch.nn.functional.cross_entropy(lc, tc, ignore_index=ignore_index, reduction="none")
              for lc, tc in zip(logit_chunks, target_chunks)]
    return torch.cat(losses).sum() / max(1, int((targets != ignore_index).sum()))


def case_per_layer(case: Any, seed: int = 0, layers_of: Any = lambda model: model.model.layers) -> list[int]:
    """:func:`saved_per_layer` of a harness case's own model (``case.build_model``, seeded, in the case's
    dtype; ``layers_of`` finds its decoder layers) on random token ids of the case's batch, without
    checkpointing: the per-layer check of the architecture harnesses."""
    import torch

    torch.manual_seed(seed)
    model = case.build_model(torch.bfloat16 if case.dtype == "bf16" else torch.float32)
    model.train()
    ids = torch.randint(0, case.vocab, (case.b, case.s))
    return saved_per_layer(model, layers_of(model), ids, autocast=case.dtype == "amp-bf16")


def saved_per_layer(model: Any, layers: Any, ids: Any, autocast: bool = False) -> list[int]:
    """Bytes autograd saves for backward during each of ``layers``' forward (a transformers model's decoder
    layers; distinct storages first saved inside that layer, parameters left out; the layer's input, saved
    by its first norm, is the previous layer's output and counts here, as the formula files' ``act`` counts
    it), one training forward of ``model`` on ``ids`` (``autocast``: under CPU bf16 autocast). A layer-by-
    layer check points at one formula line where a step's total only says that something is off."""
    import contextlib

    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    current = [-1]
    seen: set[int] = set()
    saved = [0] * len(layers)

    def pack(t: Any) -> Any:
        st = t.untyped_storage()
        key = st.data_ptr() or id(st)
        if current[0] >= 0 and key not in seen and key not in params:
            seen.add(key)
            saved[current[0]] += st.nbytes()
        return t

    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda _m, _a, i=i: current.__setitem__(0, i))
        layer.register_forward_hook(lambda _m, _a, _o: current.__setitem__(0, -1))
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), cast:
        model(input_ids=ids, labels=ids).loss
    return saved


def _bytes(tensors) -> int:  # noqa: ANN001
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None:
            st = t.untyped_storage()
            seen[id(st)] = st.nbytes()
    return sum(seen.values())


# ---- the cases --------------------------------------------------------------------------------------
BASE = HFCase()
#: published shapes traced with fake tensors (config.json of each model: hidden, layers, heads, KV
#: heads, intermediate, vocabulary); one sequence per step at the model's training context
LLAMA31_8B = HFCase(h=4096, L=32, heads=32, kv_heads=8, ffn=14336, vocab=128256, b=1, s=8192,
                    dtype="bf16", fake=True, recipe="Llama-3.1-8B")
LLAMA31_70B = replace(LLAMA31_8B, h=8192, L=80, heads=64, ffn=28672, s=4096, recipe="Llama-3.1-70B")


#: PEFT's target_modules "all-linear" on a Llama: every projection of every decoder
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: LoRA fine-tuning (PEFT over a frozen base): its default targets (q, v), every projection, dropout,
#: the three dtype set-ups, checkpointing, eager attention. (Not traced at a published size: PEFT moves
#: each new adapter with Module.to, which under FakeTensorMode swaps tensors that carry weak references
#: and raises in torch 2.13.)
LORA = [replace(BASE, lora_r=8), replace(BASE, lora_r=8, lora_targets=ALL_LINEAR),
        replace(BASE, lora_r=8, lora_dropout=0.1), replace(BASE, lora_r=8, dtype="bf16"),
        replace(BASE, lora_r=8, dtype="amp-bf16"), replace(BASE, lora_r=8, gc=True),
        replace(BASE, lora_r=16, lora_targets=ALL_LINEAR, L=8, dtype="bf16"),
        replace(BASE, lora_r=8, attn="eager", lora_targets=ALL_LINEAR, dtype="amp-bf16"),
        # DoRA (PEFT use_dora; formulas/finetune.mf dora): PEFT's default targets and every projection, bf16
        replace(BASE, lora_r=8, dtype="bf16", dora=True),
        replace(BASE, lora_r=8, lora_targets=ALL_LINEAR, dtype="bf16", dora=True),
        replace(BASE, lora_r=8, dtype="bf16", dora=True, lora_dropout=0.1),
        # tied embeddings (the Trainer + PEFT on a small model with tie_word_embeddings), with and without checkpointing
        replace(BASE, lora_r=8, dtype="bf16", tied=True), replace(BASE, lora_r=8, dtype="bf16", tied=True, gc=True)]
#: LoRA over a frozen MoE block (transformers 5's fused experts: adapters on the attention only;
#: formulas/finetune-moe.mf). fp32 with checkpointing (the experts' backward sets the peak) read -18.2 %
#: activation peak until finetune-moe.mf kept the product's place in the backward moment: -5.0 %
LORA_MOE = [replace(BASE, model="mixtral", experts=4, top_k=2, lora_r=8, lora_targets=ALL_LINEAR[:4], dtype=d, gc=gc)
            for d, gc in (("bf16", False), ("amp-bf16", False), ("bf16", True), ("fp32", False), ("fp32", True))]


#: activation offloading (formulas/offload-decoder.mf checkpoint): TrainingArguments activation_checkpointing_kwargs
#: {"offload": true}, each checkpoint's input in host memory (the host copies counted as host, tracking.pinned_as_host)
OFFLOAD = [replace(BASE, gc=True, offload=True), replace(BASE, gc=True, offload=True, dtype="amp-bf16"),
           replace(BASE, gc=True, offload=True, dtype="bf16", L=4), replace(LLAMA31_8B, gc=True, offload=True)]


def sweep() -> list[HFCase]:
    """Every transformers case of ``bench/validate.py --frameworks``."""
    cases = [replace(BASE, attn=attn, gc=gc, dtype=dtype)
             for attn in ("sdpa", "eager") for gc in (False, True) for dtype in DTYPES]
    cases += [replace(BASE, model="qwen3", head_dim=32),
              replace(BASE, model="mixtral", experts=4, top_k=2),
              # the experts under autocast run in fp32 (frameworks/hf-trainer/moe.mf): was -22.7 %
              replace(BASE, model="mixtral", experts=4, top_k=2, dtype="amp-bf16")]
    cases += [LLAMA31_8B, replace(LLAMA31_8B, gc=True), LLAMA31_70B, replace(LLAMA31_70B, gc=True)]
    return cases + LORA + LORA_MOE + OFFLOAD


def quick_sweep() -> list[HFCase]:
    """The subset the test suite runs: one real step per dtype set-up and one fake published size."""
    return [BASE, replace(BASE, gc=True, dtype="amp-bf16"), replace(BASE, attn="eager", dtype="bf16"),
            LLAMA31_8B]
