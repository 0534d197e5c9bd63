"""megatron-core as the ground truth: its own GPT model, DDP, optimizer and pipeline schedules, real
training steps on gloo ranks, measured per rank and held against memform's ``megatron`` profile.

A case is a small Llama-style job (SwiGLU, RMSNorm, GQA, RoPE, no biases, no dropout, untied head) that
Megatron-LM would run from a command line (:meth:`McoreCase.arguments`). memform reads *that command
line* through ``memform import megatron`` (:meth:`McoreCase.memform_config`), so the importer is
checked too. Each rank of a :func:`..ranks.spawn` gloo group runs what ``megatron/training`` runs for
it, with megatron-core 0.19.2's own objects:

- ``parallel_state.initialize_model_parallel(tp, pp, vpp)``, ``model_parallel_cuda_manual_seed``;
- ``TransformerConfig(use_cpu_initialization=True)`` as ``core_transformer_config_from_args`` fills it
  from these arguments (``deallocate_pipeline_outputs=True``, ``pipeline_dtype`` = the params dtype,
  ``attention_softmax_in_fp32`` false: the argument is store_true), with every fusion off
  (``gradient_accumulation_fusion``, ``bias_activation_fusion``, ``bias_dropout_fusion``,
  ``masked_softmax_fusion``, ``apply_rope_fusion``, ``persist_layer_norm``: their kernels need CUDA;
  the command line says so with the matching ``--no-*`` flags);
- ``GPTModel(get_gpt_layer_local_spec(normalization="RMSNorm"))``, one per virtual stage, with
  ``pre_process`` / ``post_process`` as ``training.get_model`` sets them; bf16: ``Float16Module``;
- megatron's ``DistributedDataParallel`` (``grad_reduce_in_fp32`` as ``--bf16`` implies, the
  distributed optimizer when asked; bucketing off for chunks after the first), then
  ``get_megatron_optimizer`` (torch ``AdamW``: neither Transformer Engine nor Apex is installed), with
  ``config.grad_scale_func`` / ``finalize_model_grads_func`` set as ``training.setup_model_and_optimizer``
  and ``train`` set them;
- the step of ``training.train_step``: ``zero_grad_buffer()``, ``optimizer.zero_grad()``,
  ``get_forward_backward_func()`` over m micro-batches (no pipelining, 1F1B, or interleaved 1F1B),
  with ``pretrain_gpt.forward_step`` / ``loss_func``'s per-token loss, then ``optimizer.step()``.

One warm-up step (the optimizer creates its states) is followed by the traced one
(:class:`.tracking.StepSamples`, started after the warm-up: megatron's persistent tensors are passed as
static), and each rank measures:

- params: the model's parameter storages (with the distributed optimizer, megatron's param buffer);
- grads: the ``main_grad`` buffers (``_ParamAndGradBuffer.grad_data``: fp32 with ``--bf16``);
- optimizer: what the optimizer holds beyond the model: fp32 master copies (bf16; the distributed
  optimizer's shards) and the AdamW states;
- activations: what the forward passes left saved when the rank's first ``backward_step`` starts (the
  end of warm-up: one micro-batch without a pipeline, the in-flight micro-batches with one), less the
  output gradient the stage has just received;
- activations_peak: the largest activation-side sum over ``get_forward_backward_func()`` (received
  tensors included: a received activation is the stage's input, a received gradient the gradient of its
  output; ``optimizer.step()`` is traced on its own, ``step_peak`` in the notes);
- comm: megatron's GlobalMemoryBuffer (``parallel_state.get_global_memory_buffer()``: the persistent
  scratch DotProductAttention takes its baddbmm input from) and the outputs of collectives. A storage
  first seen as a view op's output was allocated outside the dispatcher (gloo's reduce-scatter and
  all-gather copies; NCCL works in place) and is counted nowhere;
- reserved / reserve / step_peak: the traced step replayed through memform's allocator model
  (:func:`.tracking.replay_reserved`), as the other harnesses do.

Rows: one per pipeline stage (the stage's first rank), compared with memform's stage of that index.
Two things the command line does not say are ``--set`` for memform (:meth:`McoreCase.overrides`): the
CPU's RMSNorm kernel (``megatron.norm_kernel: composite``) and ``megatron.backward_regrad: autograd``
(the profile's default keeps MemEst's bound for the first layer differentiated; see
``formulas/frameworks/megatron/megatron-core.mf``).

The shims (megatron-core 0.19.2, torch 2.13 CPU; ``shared/reference/frameworks-on-cpu.md`` §3), each for
the megatron lines that assume a GPU -- see :func:`_shim`. Sequence parallelism cannot be shimmed: the
local spec's norm is ``WrappedTorchNorm`` when neither Apex nor Transformer Engine is importable (both
need CUDA), and ``transformer/torch_norm.py:50`` asserts "sequence parallel not supported by torch
LayerNorm"; so no case here uses it.

Fine-grained activation offloading (``offload``: TransformerConfig ``fine_grained_activation_offloading`` with
``offload_modules``, :func:`offload_sweep`) runs megatron-core's own handler with the CPU standing for the device
(:func:`_offload_shim`); its host copies are tracking.pinned_as_host's tensors, counted as ``host`` (the most
live at once in the warm-up step: the size of the handler's pinned pool) and left out of the device's
categories. Its keys are ``--set`` for memform (:meth:`McoreCase.overrides`): Megatron-LM's arguments refuse
it with the local spec, which `memform import megatron` follows.

Published sizes (``fake=True``, :data:`PUBLISHED`): the same :func:`_run_rank` under ``FakeTensorMode``
on a ``fake`` process group of the job's world size (:func:`_fake_job`: rank 0 of each pipeline stage in
turn, ``init_process_group("fake", store=FakeStore(), rank=stage·tp·dp)``), nothing allocated; megatron's
gloo groups are not made (``create_gloo_process_groups=False``, ``use_gloo_process_groups=False``), the
weights are not initialised (``perform_initialization=False``: values only) and the warm-up step runs one
micro-batch. The lines that need values or a kernel fake tensors lack are shimmed in :func:`_fake_shim`;
with them sequence parallelism runs too, and MoE with expert parallelism: ``moe/token_dispatcher.py:323``
(``tokens_per_expert.sum().item()``) and SequentialMLP's split by ``tokens_per_expert`` read the routed
token counts, which a fake tensor does not have, so the fake traces route in balance
(:func:`_shim_moe_dispatch`).

Needs megatron-core 0.19.2, which declares ``Requires-Python >=3.12`` but whose cp311 wheel runs on 3.11,
and which imports triton unconditionally (``transformer/moe/ops/paged_stash.py:4``, from
``import megatron.core``)::

    pip install numpy packaging triton
    pip install --no-deps --ignore-requires-python megatron-core==0.19.2

(``--no-deps`` keeps pip from resolving a CUDA torch or a 3.12-only numpy.)
"""

from __future__ import annotations

import gc
import os
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from . import ModelShape, RankJobs, RankStep, imported_config, rank_result

#: the megatron-core version the shims' line numbers and this harness were checked against
VERSION = "0.19.2"
INSTALL = ("pip install numpy packaging triton && "
           "pip install --no-deps --ignore-requires-python megatron-core==0.19.2")


@dataclass(frozen=True)
class McoreCase(ModelShape):
    """One megatron-core job on ``tp · pp · dp`` gloo ranks; ``stage``: which pipeline stage's rank the
    row shows (the job itself runs once for all its stages)."""

    tp: int = 1
    pp: int = 1
    vpp: int = 1
    dp: int = 1
    distopt: bool = False
    bf16: bool = False
    recompute: str = "none"     # none | selective | full (uniform, one layer per checkpoint)
    modules: tuple[str, ...] = ()  # --recompute-modules with selective (empty: Megatron's default, core_attn)
    experts: int = 1            # > 1: every layer a MoE layer of that many experts (local spec: SequentialMLP)
    topk: int = 2
    ep: int = 1                 # --expert-model-parallel-size (fake traces: see _fake_shim's MoE dispatch)
    m: int = 4                  # micro-batches per step
    ffn: int = 512              # (the other shape fields: ModelShape's)
    heads: int = 4
    groups: int = 2
    stage: int = 0
    # a published shape (:data:`PUBLISHED`): traced under FakeTensorMode on a ``fake`` process group
    fake: bool = False
    recipe: str = ""            # the published model the shape is
    gelu: bool = False          # GeLU MLP (no --swiglu) instead of SwiGLU
    norm: str = "RMSNorm"       # --normalization
    bias: bool = False          # linear biases (no --disable-bias-linear)
    positions: str = "rope"     # --position-embedding-type: rope | learned_absolute
    sp: bool = False            # --sequence-parallel (fake traces only: see _fake_shim)
    # fine-grained activation offloading (TransformerConfig fine_grained_activation_offloading, offload_modules,
    # min_offloaded_tensor_size; the handler made to run on the CPU by _offload_shim): the modules, and the
    # smallest tensor offloaded, in elements (the harness's tensors are far below Megatron's 1 Mi default)
    offload: tuple[str, ...] = ()
    offload_min: int = 1024

    @property
    def reserve_checked(self) -> bool:
        """The allocator's reserve is held to its threshold for whole published models only (as torchtitan's
        cuts): cut to one layer per stage, the embedding, head and s²-sized attention blocks dominate the
        step, which no real job's is (the cut's figure is still shown, marked ``~``)."""
        return not self.fake or self.L == self.full_layers()

    def full_layers(self) -> int:
        """The published model's layer count (the case's own where it is not a published shape)."""
        return next((c.L for c in PUBLISHED if c.recipe == self.recipe), self.L) if self.fake else self.L

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def job(self) -> "McoreCase":
        """The case without its row (the same job for every stage)."""
        return replace(self, stage=0)

    def label(self) -> str:
        par = [f"tp{self.tp}"] if self.tp > 1 else []
        if self.pp > 1:
            par.append(f"pp{self.pp}" + (f" vpp{self.vpp}" if self.vpp > 1 else "") + f" m{self.m}")
        if self.dp > 1:
            par.append(f"dp{self.dp}" + (" distopt" if self.distopt else ""))
        rc = f" rc={self.recompute}" if self.recompute != "none" else ""
        rc += f"[{'+'.join(self.modules)}]" if self.modules else ""
        st = f" stage{self.stage}" if self.pp > 1 else ""
        rc += f" moe{self.experts}x{self.topk}" if self.experts > 1 else ""
        rc += f" ep{self.ep}" if self.ep > 1 else ""
        rc += f" off[{'+'.join(self.offload)}]" if self.offload else ""
        if self.fake:
            sp = " sp" if self.sp else ""
            return f"mcore {self.recipe} {' '.join(par)}{sp} L{self.L} s{self.s} b{self.b}{rc} fake{st}"
        return (f"mcore {' '.join(par)} L{self.L} h{self.h} a{self.heads}/{self.groups} s{self.s} b{self.b}"
                f" {'bf16' if self.bf16 else 'fp32'}{rc}{st}")

    # ---- the Megatron-LM command line of this job, and memform's reading of it -------------------
    def arguments(self) -> list[str]:
        """``pretrain_gpt.py``'s arguments for this job (what :func:`_run_rank` builds by hand)."""
        args = ["--num-layers", self.L, "--hidden-size", self.h, "--ffn-hidden-size", self.ffn,
                "--num-attention-heads", self.heads, "--group-query-attention", "--num-query-groups", self.groups,
                "--seq-length", self.s, "--max-position-embeddings", self.s, "--vocab-size", self.vocab,
                "--micro-batch-size", self.b, "--global-batch-size", self.b * self.m * self.dp,
                *([] if self.gelu else ["--swiglu"]), "--normalization", self.norm,
                *([] if self.bias else ["--disable-bias-linear"]),
                "--attention-dropout", 0, "--hidden-dropout", 0, "--position-embedding-type", self.positions,
                "--untie-embeddings-and-output-weights", "--transformer-impl", "local",
                "--tensor-model-parallel-size", self.tp, "--pipeline-model-parallel-size", self.pp,
                # the fusions need CUDA kernels: off, as TransformerConfig below has them
                "--no-bias-gelu-fusion" if self.gelu else "--no-bias-swiglu-fusion",
                "--no-bias-dropout-fusion", "--no-masked-softmax-fusion",
                "--no-gradient-accumulation-fusion", "--no-rope-fusion", "--no-persist-layer-norm",
                "--use-cpu-initialization"]
        if self.vpp > 1:
            args += ["--num-layers-per-virtual-pipeline-stage", self.L // (self.pp * self.vpp)]
        if self.experts > 1:
            args += ["--num-experts", self.experts, "--moe-router-topk", self.topk, "--moe-ffn-hidden-size", self.ffn]
            if self.ep > 1:
                args += ["--expert-model-parallel-size", self.ep]
        if self.distopt:
            args.append("--use-distributed-optimizer")
        if self.sp:
            args.append("--sequence-parallel")
        if self.bf16:
            args.append("--bf16")
        if self.recompute != "none":
            args += ["--recompute-granularity", self.recompute]
            if self.recompute == "full":
                args += ["--recompute-method", "uniform", "--recompute-num-layers", 1]
            if self.modules:
                args += ["--recompute-modules", *self.modules]
        return [str(a) for a in args]

    def overrides(self) -> dict[str, Any]:
        """What the command line does not say: the run is on the CPU, where torch's F.rms_norm (the local
        spec's WrappedTorchNorm, Apex being absent) runs its composite rather than ``_fused_rms_norm``;
        and the backward is counted as autograd holds it (``megatron.backward_regrad: autograd``), not
        with the profile's default MemEst bound (megatron-core.mf: +26 % on pipeline stage 0 here)."""
        if self.fake:   # the traced RMSNorm saves what CUDA's _fused_rms_norm saves (_fake_shim)
            return {"megatron.backward_regrad": "autograd"}
        # fine-grained offloading: Megatron-LM's arguments refuse it with --transformer-impl local (which
        # `memform import megatron` follows), megatron-core's TransformerConfig does not: given as keys
        off = {} if not self.offload else {"training.activation_offload": "modules",
                                           "training.activation_offload_modules": list(self.offload),
                                           "training.activation_offload_min_elements": self.offload_min}
        return {"megatron.norm_kernel": "composite", "megatron.backward_regrad": "autograd", **off}

    def memform_config(self) -> dict[str, Any]:
        """The same job through ``memform import megatron`` of :meth:`arguments` (+ the device count);
        memform derives the micro-batches per step from --global-batch-size / (--micro-batch-size × dp)."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "args.txt"
            path.write_text(" ".join(self.arguments()) + "\n")
            return imported_config("megatron", path, self.label(), devices=self.world, overrides=self.overrides())


Step = RankStep


#: the jobs run so far in this process (a job runs once for all of its stage rows)
_JOBS = RankJobs(prefix="memform-mcore-")


def measure(case: McoreCase) -> Step:
    """The row of ``case``: its job's rank of pipeline stage ``case.stage`` (tp rank 0, dp rank 0)."""
    if case.fake:
        run([case])
        result = _FAKE[case.job()][case.stage]
        if "error" in result:
            raise RuntimeError(f"{case.label()}: {result['error']}\n{result.get('trace', '')}")
        return RankStep(result["measured"], result["notes"].get("peak_by_op", {}), result["notes"])
    # megatron's default order "tp-cp-ep-dp-pp": rank = tp_rank + tp·(dp_rank + dp·pp_rank)
    return _JOBS.step(case, _rank_of(case), _measure_item)


def _rank_of(case: McoreCase) -> int:
    return case.stage * case.tp * case.dp


def run(cases: list[McoreCase]) -> None:
    """Run every job of ``cases`` in one spawned group per world size (quicker than one per job); the
    fake traces in one spawned process (the shims stay out of the caller's process)."""
    _JOBS.run([c for c in cases if not c.fake], _measure_item)
    stages: dict[McoreCase, list[int]] = {}
    for c in cases:
        if c.fake and c.stage not in _FAKE.get(c.job(), {}) and c.stage not in stages.get(c.job(), []):
            stages.setdefault(c.job(), []).append(c.stage)
    if stages:
        import concurrent.futures
        import multiprocessing as mp

        jobs = list(stages)
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
            for job, per_stage in zip(jobs, pool.map(_fake_job, [asdict(j) for j in jobs], [stages[j] for j in jobs])):
                _FAKE.setdefault(job, {}).update(zip(stages[job], per_stage))


#: the fake traces run so far in this process: job -> {pipeline stage: its result}
_FAKE: dict[McoreCase, dict[int, dict[str, Any]]] = {}


def _fake_job(d: dict[str, Any], stages: list[int]) -> list[dict[str, Any]]:
    """Rank 0 of each pipeline stage in ``stages`` of a fake job (only the stages asked for: the trace of a
    whole published stage takes minutes), one after the other in this process, each on a fresh ``fake``
    process group of the job's world size with that rank (:func:`..ranks.fake_group`: collectives and the
    schedule's p2p return at once, nothing is sent)."""
    import torch

    from ..ranks import fake_group

    torch.set_num_threads(1)
    case = McoreCase(**d)
    out = []
    for stage in stages:
        rank = _rank_of(replace(case, stage=stage))
        with fake_group(case.world, rank):
            out.append(_measure_item(d, rank, case.world))
        gc.collect()
    return out


# ---- the shims -------------------------------------------------------------------------------------
_SHIMMED = False


def _shim() -> None:
    """Make megatron-core's CUDA calls run on the CPU (once per process, before megatron is imported).

    - **rng**: ``model_parallel_cuda_manual_seed`` (``tensor_parallel/random.py:490``) calls
      ``torch.cuda.manual_seed``, and ``CudaRNGStatesTracker.add`` (``random.py:303-308``) /
      ``fork`` (``random.py:318-345``) and ``CheckpointFunction`` (``random.py:528-538``) read and set
      the CUDA generator through ``torch.cuda.get_rng_state`` and megatron's own
      ``_get_cuda_rng_state`` / ``_set_cuda_rng_state`` (``random.py:104``, ``:135``): "Torch not
      compiled with CUDA enabled". They read and set the CPU generator instead (a 5,056-byte state
      tensor made outside the dispatcher, so not traced).
    - **device**: ``device=torch.cuda.current_device()`` in ``_ParamAndGradBuffer``
      (``distributed/param_and_grad_buffer.py:1162-1186``), megatron's ``GlobalMemoryBuffer``
      (``utils.py:715``), the pipeline's receive buffers
      (``pipeline_parallel/p2p_communication.py:211-223, 334, 342``) and the distributed optimizer
      (``optimizer/distrib_optimizer.py:998``); ``torch.cuda.synchronize`` (``p2p_communication.py:263,
      419``; ``distributed_data_parallel.py:649, 672``); ``Tensor.cuda`` (``grad_scaler.py:163``).
      ``torch.cuda.current_stream()`` in ``_ParamAndGradBucketGroup.start_grad_sync``
      (``param_and_grad_buffer.py:632``, waiting for CUDA-graph events: none here).
      ``current_device`` returns ``"cpu"``, ``synchronize`` / ``set_device`` do nothing, ``Tensor.cuda``
      returns the tensor, ``current_stream`` a stream with nothing to wait for.
    - **factory**: literal ``device='cuda'`` in ``optimizer/optimizer.py:690-702`` (``found_inf``,
      ``_dummy_overflow_buf``, ``_scale_one``: bf16 and the distributed optimizer), ``:1249``
      (``FP32Optimizer._scale``), ``optimizer/clip_grads.py:96-112, 180, 231`` and
      ``pipeline_parallel/schedules.py:749, 1121, 2292`` (``total_num_tokens``) and
      ``transformer/utils.py:39`` (``get_default_causal_mask``, the unfused softmax's mask): ``torch.tensor``,
      ``zeros``, ``ones``, ``empty``, ``full`` and ``arange`` make them on the CPU.
    - **type**: ``optimizer/clip_grads.py:174`` asserts ``param.grad.type() == 'torch.cuda.FloatTensor'``;
      ``optimizer/distrib_optimizer.py:401, 466`` and ``optimizer/optimizer.py:1009, 1028`` sort
      parameters by ``param.type()`` and raise ``TypeError`` for any other ("Wrapped parameters must be
      one of torch.cuda.FloatTensor, ..."). The argument-less ``Tensor.type()`` of a CPU tensor names
      the CUDA type (``torch.cuda.FloatTensor`` for ``torch.FloatTensor``); with an argument it converts
      as before.

    Nothing else is changed: these only route device placement and RNG bookkeeping, so every tensor
    megatron allocates is the one it allocates on a GPU, on the CPU.
    """
    global _SHIMMED
    if _SHIMMED:
        return
    import functools

    import torch

    # rng
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.set_rng_state = lambda state, device="cuda": torch.set_rng_state(state)
    torch.cuda.manual_seed = lambda seed: torch.random.default_generator.manual_seed(int(seed))
    torch.cuda.manual_seed_all = torch.cuda.manual_seed
    # device
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.set_device = lambda device: None
    torch.Tensor.cuda = lambda self, *a, **k: self

    class _Stream:  # what start_grad_sync asks of the current stream: nothing to wait for on the CPU
        def wait_event(self, event):  # noqa: ANN001, ANN202
            return None

        def wait_stream(self, stream):  # noqa: ANN001, ANN202
            return None

    torch.cuda.current_stream = lambda device=None: _Stream()
    # factory
    for name in ("tensor", "zeros", "ones", "empty", "full", "arange"):
        orig = getattr(torch, name)

        def on_cpu(*a, _orig=orig, **k):  # noqa: ANN001, ANN202
            dev = k.get("device")
            if dev is not None and str(dev).startswith("cuda"):
                k["device"] = "cpu"
            return _orig(*a, **k)

        setattr(torch, name, functools.wraps(orig)(on_cpu))
    # type
    cpu_type = torch.Tensor.type

    def cuda_type(self, *a, **k):  # noqa: ANN001, ANN202
        out = cpu_type(self, *a, **k)
        if not a and not k and isinstance(out, str) and out.startswith("torch.") and not out.startswith("torch.cuda."):
            return "torch.cuda." + out[len("torch."):]
        return out

    torch.Tensor.type = cuda_type
    import megatron.core.tensor_parallel.random as mrandom

    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    if not mrandom.HAVE_TE:
        # CheckpointWithoutOutput (--recompute-modules layernorm / moe_act / mla_up_proj) sets
        # ``self.fp8 = fp8 is not None`` (random.py:731), true for fp8=False, and then asks Transformer
        # Engine's FP8GlobalStateManager whether fp8 is on (random.py:693-696), a name bound only when TE
        # imports: without TE, fp8 is off and the forward context is empty
        import contextlib

        class _NoFP8:
            is_fp8_enabled = staticmethod(lambda: False)
            get_fp8_recipe = staticmethod(lambda: None)

        mrandom.FP8GlobalStateManager = _NoFP8
        mrandom.activation_recompute_forward = lambda **k: contextlib.nullcontext()
        mrandom.fp8_autocast = lambda **k: contextlib.nullcontext()
    _SHIMMED = True


_OFFLOAD_SHIMMED = False


def _offload_shim() -> None:
    """Make megatron-core's fine-grained activation offloading (pipeline_parallel/fine_grained_activation_offload.py)
    run on the CPU, the CPU standing for the device and tracking.pinned_as_host's tensors for host memory.
    What blocks it there, in the order hit:

    - ``PipelineOffloadManager.__init__`` (``:429-436``) makes ``torch.cuda.Stream()`` ("torch.cuda.Stream
      requires CUDA support") and an external ``torch.cuda.Event``; each ``OffloadTensorGroup`` (``:350-352``)
      two ``torch.cuda.Event()`` ("Tried to instantiate dummy base class Event"): streams and events that
      order nothing (one CPU stream), and ``torch.cuda.stream(s)`` an empty context;
    - the context's ``__enter__`` / ``__exit__`` (``:773-793``) need Transformer Engine's ``cpu_offload``
      module ("TE CPU offload is not available"): an object with its ``CPUOffloadEnabled`` flag, which
      only TE's own modules read;
    - ``_can_manage_tensor_for_offload`` (``:961-966``) manages only tensors with ``device.type == "cuda"``:
      the CPU's tensors are the device's here (nothing else changed: parameters and fake tensors stay out);
    - ``bulk_offload_group`` calls ``Tensor.record_stream`` (``:1039``) with the offload stream: nothing to
      record on one stream;
    - the host pool (``OffloadTensorPool``) allocates with ``pin_memory=True`` (tracking.pinned_as_host) and
      reuses its tensors from step to step: here every copy is allocated anew (the pool's ``free`` drops it),
      so the traced step's host copies are its own allocations, as many at once as the pool would hold."""
    global _OFFLOAD_SHIMMED
    if _OFFLOAD_SHIMMED:
        return
    import contextlib
    import types

    import torch
    import megatron.core.extensions.transformer_engine as te_ext
    from megatron.core.pipeline_parallel import fine_grained_activation_offload as fgo

    class _Stream:
        def __init__(self, *a, **k):  # noqa: ANN002, ANN003
            pass

        def wait_stream(self, stream):  # noqa: ANN001, ANN202
            return None

        def wait_event(self, event):  # noqa: ANN001, ANN202
            return None

        def record_event(self, event=None):  # noqa: ANN001, ANN202
            return event

    class _Event:
        def __init__(self, *a, **k):  # noqa: ANN002, ANN003
            pass

        def record(self, stream=None):  # noqa: ANN001, ANN202
            return None

        def wait(self, stream=None):  # noqa: ANN001, ANN202
            return None

    torch.cuda.Stream, torch.cuda.Event = _Stream, _Event
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()
    current = torch.cuda.current_stream
    torch.cuda.current_stream = lambda device=None: _Stream() if current is None else _CurrentStream(current())
    te_ext.cpu_offload = types.SimpleNamespace(CPUOffloadEnabled=False)

    def can_manage(tensor):  # noqa: ANN001, ANN202 - :961-966 with the CPU as the device
        stray = isinstance(tensor, (torch._subclasses.fake_tensor.FakeTensor,
                                    torch._subclasses.functional_tensor.FunctionalTensor))
        return not isinstance(tensor, torch.nn.Parameter) and not stray and tensor.device.type == "cpu"

    fgo.ChunkOffloadHandler._can_manage_tensor_for_offload = staticmethod(can_manage)
    torch.Tensor.record_stream = lambda self, stream: None
    pool_allocate = fgo.OffloadTensorPool.allocate

    def allocate(self, shape, dtype=torch.float32):  # noqa: ANN001, ANN202 - a new tensor every time
        self._pools.pop(self._get_pool_key(shape, dtype), None)
        return pool_allocate(self, shape, dtype)

    fgo.OffloadTensorPool.allocate = allocate
    fgo.OffloadTensorPool.free = lambda self, tensor: None
    _OFFLOAD_SHIMMED = True


class _CurrentStream:
    """_shim's current stream, with what the offload handler asks of it besides (record_event)."""

    def __init__(self, inner):  # noqa: ANN001
        self.inner = inner

    def wait_event(self, event):  # noqa: ANN001, ANN202
        return None

    def wait_stream(self, stream):  # noqa: ANN001, ANN202
        return None

    def record_event(self, event=None):  # noqa: ANN001, ANN202
        return event


_FAKE_SHIMMED = False


def _fake_shim() -> None:
    """What a fake trace needs beyond :func:`_shim` (only in the fake traces' own process): the lines of
    megatron-core 0.19.2 that read a tensor's value, which a fake tensor does not have
    (``DataDependentOutputException``), or run an op with no fake kernel, and the norm of the local spec.

    - **rng check**: ``CudaRNGStatesTracker.fork`` (``tensor_parallel/random.py:332``) compares the CPU
      generator's state before and after with ``torch.all(...).item()``; the fork only swaps generator
      states (no tensor of the step), and with dropout 0 nothing draws from them: a fork that only yields.
    - **param groups**: ``_get_param_groups`` (``optimizer/__init__.py:364``) aligns the parameter-group keys
      of all ranks with ``all_gather_object``, which pickles through tensors (``.item()``): every rank's keys
      are taken to be this rank's (the same model code on every rank).
    - **coalesced reduce-scatter**: ``start_grad_sync`` (``distributed/param_and_grad_buffer.py:702``) runs
      its buckets' collectives in ``torch.distributed._coalescing_manager``, whose
      ``reduce_scatter_tensor_coalesced_`` has no fake kernel: the collectives run one by one (the same
      buffers; on a fake group nothing is sent).
    - **grad norm**: ``get_grad_norm_fp32`` (``optimizer/clip_grads.py:116``; Apex-less
      ``local_multi_tensor_l2_norm``, ``utils.py:1331``, builds ``torch.tensor`` of per-tensor norms: values)
      returns 0.0: a scalar per parameter, no memory; clipping by 0 then scales nothing.
    - **norm**: ``WrappedTorchNorm`` (``transformer/torch_norm.py:50``) asserts "sequence parallel not
      supported by torch LayerNorm": the local spec's norm is built without the assertion, its parameters
      marked ``sequence_parallel`` as Megatron's own norms mark them (``fusions/fused_layer_norm.py``: their
      gradients are all-reduced over the TP group in ``finalize_model_grads``). An RMSNorm saves what CUDA's
      ``_fused_rms_norm`` saves (torchtitan's harness's autograd function: the input, the weight and an fp32
      rstd per row) -- on the CPU ``F.rms_norm`` runs its composite body, two fp32 copies of the input.
    """
    global _FAKE_SHIMMED
    if _FAKE_SHIMMED:
        return
    import contextlib

    import torch
    import torch.distributed as dist
    import megatron.core.distributed.param_and_grad_buffer as pgb
    import megatron.core.optimizer.optimizer as mopt
    import megatron.core.tensor_parallel.random as mrandom
    from megatron.core.transformer import torch_norm

    from .titan import _fused_rms_norm_class

    @contextlib.contextmanager
    def fork(self, name=mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):  # noqa: ANN001, ANN202
        if name not in self.states_:
            raise Exception(f"cuda rng state {name} is not added")
        yield

    mrandom.CudaRNGStatesTracker.fork = fork

    def all_gather_object(out, obj, group=None):  # noqa: ANN001, ANN202
        for i in range(len(out)):
            out[i] = obj

    dist.all_gather_object = all_gather_object

    class _Done:
        def wait(self):  # noqa: ANN202
            return None

    @contextlib.contextmanager
    def one_by_one(group=None, device=None, async_ops=False):  # noqa: ANN001, ANN202
        yield _Done()

    pgb._coalescing_manager = one_by_one
    mopt.get_grad_norm_fp32 = lambda *a, **k: 0.0
    fused = _fused_rms_norm_class()

    class FusedRMSNorm(torch.nn.RMSNorm):
        def forward(self, x):  # noqa: ANN001, ANN202
            return fused.apply(x, self.weight, self.eps)

    def norm(cls, config, hidden_size, eps=1e-5, **kwargs):  # noqa: ANN001, ANN202
        mod = (FusedRMSNorm(hidden_size, eps=eps) if config.normalization == "RMSNorm"
               else torch.nn.LayerNorm(hidden_size, eps=eps))
        for p in mod.parameters():
            p.sequence_parallel = config.sequence_parallel
        return mod

    torch_norm.WrappedTorchNorm.__new__ = norm
    _shim_moe_dispatch()
    _FAKE_SHIMMED = True


def _shim_moe_dispatch() -> None:
    """**MoE routing** under fake tensors: ``MoEAllGatherTokenDispatcher.dispatch_postprocess``
    (``transformer/moe/token_dispatcher.py:317-330``) counts the tokens routed to this rank's experts
    (``tokens_per_expert = self.local_map.sum(dim=0).long().cpu()``, then
    ``num_out_tokens=tokens_per_expert.sum().item()``, line 323) and selects their probabilities with
    ``masked_select`` (line 327); ``SequentialMLP.forward`` splits its input by ``tokens_per_expert.tolist()``
    (``moe/experts.py:1352``). A fake tensor has no values, so none of these has an answer. The shim routes
    in balance -- every expert gets tokens·topk/E of the gathered tokens, the count a load-balanced router
    (its auxiliary loss's aim) gives, and what memform's moe.mf assumes -- and runs the same ops with those
    sizes: ``tokens_per_expert`` a real CPU tensor of the balanced counts (made outside the fake mode, as
    ``.cpu()`` makes one on a GPU), megatron's own argsort-based ``permute`` with that ``num_out_tokens``, and
    the probabilities' selection as a slice of the same size in place of ``masked_select`` (whose output size
    is the count). Tensor shapes and the ops' allocations are those of a balanced step."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from megatron.core.transformer.moe import token_dispatcher as td

    def dispatch_postprocess(self, hidden_states, probs):  # noqa: ANN001, ANN202 - token_dispatcher.py:302
        self.hidden_shape_before_permute = hidden_states.shape
        lo, hi = self.local_expert_indices[0], self.local_expert_indices[-1] + 1
        self.local_map = self.routing_map[:, lo:hi].contiguous()
        self.local_probs = probs[:, lo:hi].contiguous()
        per_expert = hidden_states.shape[0] * self.config.moe_router_topk // self.config.num_moe_experts
        with unset_fake_temporarily():
            tokens_per_expert = torch.full((hi - lo,), per_expert, dtype=torch.long)
        num_out = per_expert * (hi - lo)
        permuted, _, self.reversed_local_input_permutation_mapping, _, _ = td.permute(
            hidden_states, self.local_map, num_out_tokens=num_out, fused=self.config.moe_permute_fusion)
        self.local_probs = self.local_probs.T.contiguous().reshape(-1)[:num_out].clone()
        self.routing_map = None
        return permuted, tokens_per_expert, self.local_probs

    td.MoEAllGatherTokenDispatcher.dispatch_postprocess = dispatch_postprocess


# ---- one rank ----------------------------------------------------------------------------------------
def _measure_item(d: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """One job on this rank (:func:`..ranks.spawn` runs it in each rank's process)."""
    return rank_result(_run_rank, McoreCase, d, rank, world)


def _run_rank(case: McoreCase, rank: int, world: int) -> tuple[dict[str, int], dict[str, Any]]:
    import contextlib
    import warnings

    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    warnings.filterwarnings("ignore")
    _shim()
    if case.fake:
        _fake_shim()
    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.pipeline_parallel import p2p_communication, schedules
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    from ..fsdp2 import VIEW_OPS
    from ..tracker import storages_of
    from .tracking import StepSamples, replay_reserved, replayed_figures

    vpp = case.vpp if case.pp > 1 and case.vpp > 1 else None
    # a fake world has no gloo groups (megatron's extra gloo groups would rendezvous for real)
    ps.initialize_model_parallel(tensor_model_parallel_size=case.tp, pipeline_model_parallel_size=case.pp,
                                 virtual_pipeline_model_parallel_size=vpp, expert_model_parallel_size=case.ep,
                                 create_gloo_process_groups=not case.fake)
    fake_mode = contextlib.ExitStack()
    try:
        model_parallel_cuda_manual_seed(1234)
        if case.fake:
            from torch._subclasses.fake_tensor import FakeTensorMode

            fake_mode.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        dtype = torch.bfloat16 if case.bf16 else torch.float32
        offload_config = {} if not case.offload else {
            "fine_grained_activation_offloading": True, "offload_modules": list(case.offload),
            "min_offloaded_tensor_size": case.offload_min}
        if case.offload:
            _offload_shim()
            # the handler is a process-wide singleton (PipelineOffloadManager.OFFLOAD_MGR) that learns its groups
            # in the first step: a job of its own per process in Megatron, a fresh one for each job here
            from megatron.core.pipeline_parallel.fine_grained_activation_offload import PipelineOffloadManager

            PipelineOffloadManager.reset_instance()
        rc = {} if case.recompute == "none" else {"recompute_granularity": case.recompute}
        if case.recompute == "full":
            rc.update(recompute_method="uniform", recompute_num_layers=1)
        if case.modules:
            rc.update(recompute_modules=list(case.modules))
        if case.experts > 1:
            rc.update(num_moe_experts=case.experts, moe_router_topk=case.topk, moe_ffn_hidden_size=case.ffn,
                      expert_model_parallel_size=case.ep)
        config = TransformerConfig(
            num_layers=case.L, hidden_size=case.h, ffn_hidden_size=case.ffn,
            num_attention_heads=case.heads, num_query_groups=case.groups,
            tensor_model_parallel_size=case.tp, pipeline_model_parallel_size=case.pp,
            virtual_pipeline_model_parallel_size=vpp,
            use_cpu_initialization=True, params_dtype=dtype, pipeline_dtype=dtype, bf16=case.bf16,
            gated_linear_unit=not case.gelu, activation_func=F.gelu if case.gelu else F.silu,
            normalization=case.norm, add_bias_linear=case.bias, sequence_parallel=case.sp,
            # fake tensors hold no values: megatron's init (a full master weight split per rank) is skipped
            perform_initialization=not case.fake,
            hidden_dropout=0.0, attention_dropout=0.0,
            gradient_accumulation_fusion=False, bias_activation_fusion=False, bias_dropout_fusion=False,
            masked_softmax_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
            # what Megatron-LM's arguments give where the dataclass defaults differ (arguments.py: "incompatible
            # defaults in dataclass"; --attention-softmax-in-fp32 is store_true) and what
            # core_transformer_config_from_args sets (deallocate_pipeline_outputs)
            attention_softmax_in_fp32=False, deallocate_pipeline_outputs=True, **rc, **offload_config)
        pp_rank = ps.get_pipeline_model_parallel_rank()
        chunks = []
        for i in range(vpp or 1):
            pre = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=i if vpp else None)
            post = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=i if vpp else None)
            spec = get_gpt_layer_local_spec(num_experts=case.experts if case.experts > 1 else None,
                                            normalization=case.norm)
            model = GPTModel(config, spec, vocab_size=case.vocab,
                             max_sequence_length=case.s, pre_process=pre, post_process=post,
                             share_embeddings_and_output_weights=False, position_embedding_type=case.positions,
                             vp_stage=i if vpp else None)
            model.model_type = getattr(model, "model_type", None)
            if vpp:
                model.vp_stage = i
            if case.bf16 and case.fake:
                # Float16Module casts with Module.bfloat16() (transformer/module.py:464); under FakeTensorMode
                # Module._apply swaps every parameter (fake tensors are wrapper subclasses) and refuses one
                # with a weak reference ("Couldn't swap VocabParallelEmbedding.weight"): the same cast, each
                # floating tensor not yet bf16 replaced by its bf16 copy (a parameter keeps its attributes)
                model.bfloat16 = lambda _m=model: _cast_bf16(_m)
            if case.bf16:
                model = Float16Module(config, model)
            chunks.append(model)
        ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=case.bf16,
                                                   use_distributed_optimizer=case.distopt)
        chunks = [DistributedDataParallel(config, ddp_config, mod, disable_bucketing=i > 0 or pp_rank > 0)
                  for i, mod in enumerate(chunks)]
        opt_config = OptimizerConfig(optimizer="adam", lr=1e-4, bf16=case.bf16, params_dtype=dtype,
                                     use_distributed_optimizer=case.distopt, clip_grad=1.0)
        # use_gloo_process_groups: the distributed optimizer's gloo groups (checkpointing) do not exist in a
        # fake world (initialize_model_parallel(create_gloo_process_groups=False))
        optimizer = get_megatron_optimizer(opt_config, chunks, use_gloo_process_groups=not case.fake)
        config.grad_scale_func = optimizer.scale_loss
        config.finalize_model_grads_func = finalize_model_grads
        forward_backward = get_forward_backward_func()

        gen = torch.Generator().manual_seed(7 + ps.get_data_parallel_rank())
        batches = [torch.randint(0, case.vocab, (case.b, case.s + 1), generator=gen) for _ in range(case.m)]
        position_ids = torch.arange(case.s).unsqueeze(0).expand(case.b, case.s)
        loss_mask = torch.ones(case.b, case.s)

        def forward_step(data_iterator, model):  # noqa: ANN001, ANN202 - pretrain_gpt.forward_step
            tokens = next(data_iterator)
            out = model(tokens[:, :-1], position_ids, None, labels=tokens[:, 1:])

            def loss_func(output_tensor):  # noqa: ANN001, ANN202 - pretrain_gpt.loss_func
                losses = output_tensor.view(-1).float()
                loss = torch.sum(losses * loss_mask.view(-1))
                num_tokens = loss_mask.sum().clone().detach().to(torch.int)
                return loss, num_tokens, {"lm loss": torch.cat([loss.clone().detach().view(1),
                                                                num_tokens.view(1)])}

            return out, loss_func

        def train_step(m: int = case.m) -> None:  # megatron/training/training.py train_step
            for c in chunks:
                c.zero_grad_buffer()
            optimizer.zero_grad()
            iters = [iter(batches) for _ in chunks]
            forward_backward(forward_step_func=forward_step, data_iterator=iters if vpp else iters[0],
                             model=chunks if vpp else chunks[0], num_microbatches=m,
                             seq_length=case.s, micro_batch_size=case.b, decoder_seq_length=case.s,
                             forward_only=False)

        # fine-grained offloading's host copies (the handler's pool allocates them with pin_memory=True:
        # tracking.pinned_as_host makes them plain CPU tensors and names them), by serial in the traced step
        # The handler's pinned pool keeps its tensors from step to step and never shrinks: the host memory it
        # holds is the most copies live at once in the first step, when every group is offloaded (after it,
        # post_warmup_callback keeps some on the device) -- counted by weak references during the warm-up step
        host: set[int] = set()
        tracing: list[Any] = []
        pool = {"live": 0, "peak": 0}
        if case.offload:
            import weakref

            from .tracking import pinned_as_host

            def on_host(t) -> None:  # noqa: ANN001
                if tracing:
                    host.update(tracing[0].serials([t]))
                    return
                pool["live"] += t.untyped_storage().nbytes()
                pool["peak"] = max(pool["peak"], pool["live"])
                weakref.finalize(t, lambda n=t.untyped_storage().nbytes(): pool.update(live=pool["live"] - n))

            step_once = train_step

            def train_step(m: int = case.m) -> None:  # noqa: F811 - the same step, its host copies named
                with pinned_as_host(on_host):
                    step_once(m)

        # the warm-up step (the optimizer's states); a fake trace warms up on one micro-batch (the states are
        # the same, and each fake micro-batch costs seconds at a published size)
        train_step(1 if case.fake and not vpp else case.m)
        optimizer.step()
        gc.collect()
        params = [p for c in chunks for p in c.parameters()]
        grad_buffers = [buf.grad_data for c in chunks for buf in (*c.buffers, *c.expert_parallel_buffers)]
        param_buffers = [buf.param_data for c in chunks for buf in (*c.buffers, *c.expert_parallel_buffers)
                         if buf.param_data is not None]
        model_storages = {id(st) for st in storages_of([*params, *param_buffers])}
        inner = [o for o in getattr(optimizer, "chained_optimizers", [optimizer])]
        opt_tensors = []
        for o in inner:
            torch_opt = o.optimizer
            opt_tensors += [p for g in torch_opt.param_groups for p in g["params"]]
            opt_tensors += [t for st in torch_opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
        opt_storages = [st for st in storages_of(opt_tensors) if id(st) not in model_storages]
        model_static = storages_of([*params, *param_buffers, *grad_buffers,
                                    *(b for c in chunks for b in c.module.buffers()), *batches, position_ids, loss_mask])
        static = model_static + opt_storages
        measured = {"params": sum(st.nbytes() for st in storages_of([*params, *param_buffers])),
                    "grads": sum(st.nbytes() for st in storages_of(grad_buffers)),
                    "optimizer": sum(st.nbytes() for st in opt_storages)}

        trace = StepSamples(ignore=static)
        tracing.append(trace)
        # without --recompute-modules megatron resizes no storage of the step in place (its buffers are made
        # whole, deallocate_output_tensor swaps .data): the tracer keeps a running live set
        # (samples.StorageSamples.fixed_sizes). The modules' CheckpointWithoutOutput frees its output with
        # untyped_storage().resize_(0) (tensor_parallel/random.py:848): those traces re-read every storage
        # (fine-grained offloading frees what it offloaded the same way: forced_released_tensors)
        trace.fixed_sizes = not case.modules and not case.offload and os.environ.get("MEMFORM_TRACE_RESCAN") != "1"
        orig_backward = schedules.backward_step
        orig_comm = p2p_communication.P2PCommunicator._communicate

        def backward_step(*a, **k):  # noqa: ANN001, ANN202 - the end of warm-up: the first backward
            if "warmup" not in trace.marks:
                trace.mark("warmup")
            return orig_backward(*a, **k)

        def communicate(self, *a, **k):  # noqa: ANN001, ANN202 - received output gradients, tagged
            out = orig_comm(self, *a, **k)
            trace.tag([out[1]], "p2p")
            return out

        schedules.backward_step = backward_step
        p2p_communication.P2PCommunicator._communicate = communicate
        try:
            with trace.mode:
                train_step()
                trace.mark("fwd_bwd")
                optimizer.step()
                trace.mark("step")
        finally:
            schedules.backward_step = orig_backward
            p2p_communication.P2PCommunicator._communicate = orig_comm
        # megatron's GlobalMemoryBuffer (utils.py GlobalMemoryBuffer, parallel_state.get_global_memory_buffer):
        # persistent scratch -- the unfused attention's baddbmm input (dot_product_attention.py), sequence
        # parallelism's all-gathers (tensor_parallel/mappings.py): a communication-side buffer
        trace.tag(list(ps.get_global_memory_buffer().buffer.values()), "gmb")
        # a storage first seen as a view op's output was allocated outside the dispatcher: gloo's scratch
        # (its reduce-scatter / all-gather copies), not megatron's (NCCL works in place)
        for serial, op in trace.op_of.items():
            if op in VIEW_OPS and serial not in trace.tags:
                trace.tags[serial] = "backend"
        # each storage's category decided once (the peaks below test every storage of every sample: tens of
        # millions of tests on a whole published stage, most of its trace's time when decided per test)
        comm_set = {s for s, op in trace.op_of.items()
                    if trace.tags.get(s) == "gmb" or any(k in op for k in COLLECTIVES)}
        act_set = {s for s in trace.op_of if s not in comm_set and trace.tags.get(s) != "backend" and s not in host}
        is_comm, act = comm_set.__contains__, act_set.__contains__
        # what the forward passes left saved: without the output gradient the stage has just received
        saved = {s for s in act_set if trace.tags.get(s) != "p2p"}.__contains__
        fb = trace.marks["fwd_bwd"]
        warm = trace.marks.get("warmup", fb)
        peak, at = _peak(trace, act, 0, fb + 1)
        step_peak, step_at = _peak(trace, act, fb + 1, len(trace.samples))
        comm_peak, comm_at = trace.peak(is_comm)
        measured.update(activations=trace.at(warm, saved), activations_peak=peak, comm=comm_peak)
        if case.offload:
            # the pool's pinned host memory (above); the traced step's copies at the first backward in the notes
            measured["host"] = pool["peak"]
        # the allocator's reserve: the traced step replayed through memform's caching-allocator model,
        # megatron's own tensors (parameters, their buffers, the grad buffers) first
        measured.update(replayed_figures(replay_reserved(trace, model_static, opt_storages, host=host)))
        notes = {"peak_by_op": trace.by_op(at, act, 12), "warmup_by_op": trace.by_op(warm, saved, 12),
                 "step_peak": step_peak, "step_by_op": trace.by_op(step_at, act, 8),
                 "comm_by_op": trace.by_op(comm_at, is_comm, 8), "rank": rank,
                 "host_at_warmup": trace.at(warm, host.__contains__) if case.offload else 0}
        return measured, notes
    finally:
        fake_mode.close()
        ps.destroy_model_parallel()


def _cast_bf16(model):  # noqa: ANN001, ANN202 - Module.bfloat16() without Module._apply's tensor swap
    import torch

    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None and p.is_floating_point() and p.dtype != torch.bfloat16:
                q = torch.nn.Parameter(p.detach().to(torch.bfloat16), requires_grad=p.requires_grad)
                q.__dict__.update(p.__dict__)
                mod._parameters[name] = q
        for name, buf in list(mod._buffers.items()):
            if buf is not None and buf.is_floating_point() and buf.dtype != torch.bfloat16:
                mod._buffers[name] = buf.to(torch.bfloat16)
    return model


#: the c10d ops whose outputs are communication buffers
COLLECTIVES = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "broadcast", "alltoall",
               "all_to_all")


def _peak(trace, keep, start: int, stop: int) -> tuple[int, int]:  # noqa: ANN001
    """The largest live sum of the storages ``keep`` accepts over samples [start, stop), and where."""
    best, where = 0, -1
    for i in range(start, stop):
        total = trace.at(i, keep)
        if total > best:
            best, where = total, i
    return best, where


# ---- the cases -------------------------------------------------------------------------------------
BASE = McoreCase()


def _stages(case: McoreCase) -> list[McoreCase]:
    return [replace(case, stage=i) for i in range(case.pp)]


def sweep() -> list[McoreCase]:
    """Every megatron-core case of ``bench/validate.py --frameworks``: TP 2 (fp32, bf16, selective and
    full recompute, and MHA with and without selective recompute), PP 2 with 1F1B (fp32, bf16, full
    recompute) and interleaved (vpp 2), TP 2 × PP 2 in bf16 (4 ranks), DP 2 with the distributed
    optimizer (fp32, bf16), TP 2 bf16 with --recompute-modules (layernorm, mlp, both); every pipeline
    stage a row; MoE; and the published shapes under fake tensors (:data:`PUBLISHED`)."""
    tp = replace(BASE, tp=2)
    pp = replace(BASE, pp=2)
    dp = replace(BASE, dp=2, distopt=True)
    mha = replace(tp, groups=tp.heads)
    cases = [tp, replace(tp, bf16=True), replace(tp, recompute="selective"), replace(tp, recompute="full"),
             mha, replace(mha, recompute="selective")]
    cases += _stages(pp) + _stages(replace(pp, bf16=True)) + _stages(replace(pp, recompute="full"))
    cases += _stages(replace(pp, vpp=2)) + _stages(replace(pp, tp=2, bf16=True))
    cases += [dp, replace(dp, bf16=True)]
    # --recompute-modules (selective): the norms' outputs, the dense MLP, both
    sel = replace(tp, recompute="selective", bf16=True)
    cases += [replace(sel, modules=("core_attn", "layernorm")), replace(sel, modules=("mlp",)),
              replace(sel, modules=("core_attn", "layernorm", "mlp"))]
    cases += offload_sweep()
    # MoE (SequentialMLP, 4 experts top-2; one rank: MoE with TP needs sequence parallelism, blocked here)
    moe = replace(BASE, bf16=True, experts=4, topk=2)
    cases += [moe, replace(moe, pp=2), replace(moe, pp=2, stage=1)]
    # published sizes under fake tensors: every pipeline stage cut to one layer per stage, the whole
    # model's last stage (one micro-batch in flight) and Llama-2-70B's whole first stage (PP = 4 micro-batches
    # of 20 layers in flight: 82 s since the storages' categories are decided once per storage; the other
    # whole stages: fake_sweep())
    return (cases + fake_quick_sweep() + [c for c in fake_sweep() if c.stage == c.pp - 1]
            + [replace(LLAMA2_70B, stage=0)])


def offload_sweep() -> list[McoreCase]:
    """Fine-grained activation offloading (megatron-core's handler on the CPU, :func:`_offload_shim`): the core
    alone and every dense module without a pipeline, core + projection with 1F1B (both stages), every module
    interleaved (vpp 2, both stages)."""
    every = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm")
    return ([replace(BASE, offload=("core_attn",)), replace(BASE, offload=every)]
            + _stages(replace(BASE, pp=2, offload=("core_attn", "attn_proj")))
            + _stages(replace(BASE, pp=2, vpp=2, L=8, offload=every)))


def quick_sweep() -> list[McoreCase]:
    """The tests' subset: TP 2 and PP 2 (1F1B, both stages), two ranks each."""
    return [replace(BASE, tp=2)] + _stages(replace(BASE, pp=2))


# ---- published sizes, traced with fake tensors ----------------------------------------------------------
#: GPT-3 175B as Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
#: Table 3) train it with Megatron: 96 layers, h 12288, 96 heads, s 2048, micro-batch 1, TP 8 × PP 8 with
#: sequence parallelism and selective recompute; GPT-2's BPE vocabulary 50257 padded to 51200 (Megatron-LM
#: pads to a multiple of 128 × TP); LayerNorm, GeLU, biases, learned positions. m 8: 1F1B holds at most PP
#: micro-batches in flight, so any m ≥ 8 (the paper's global batch 64) has the same memory.
GPT3_175B = McoreCase(fake=True, recipe="gpt3-175b", tp=8, pp=8, bf16=True, recompute="selective", L=96, h=12288,
                      ffn=4 * 12288, heads=96, groups=96, vocab=51200, s=2048, b=1, m=8, gelu=True, norm="LayerNorm",
                      bias=True, positions="learned_absolute", sp=True)
#: Llama-2-70B (its config.json: 80 layers, h 8192, 64 heads / 8 KV heads, ffn 28672, vocab 32000 -> 32768
#: padded as above, RMSNorm, SwiGLU, RoPE, untied, no biases) at s 4096, micro-batch 1, TP 8 × PP 4 with
#: sequence parallelism, DP 2 with the distributed optimizer (64 GPUs), m 4 (= PP)
LLAMA2_70B = McoreCase(fake=True, recipe="llama2-70b", tp=8, pp=4, dp=2, distopt=True, bf16=True, L=80, h=8192,
                       ffn=28672, heads=64, groups=8, vocab=32768, s=4096, b=1, m=4, sp=True)
#: Mixtral 8x7B (its config.json: 32 layers, h 4096, 32 heads / 8 KV heads, 8 experts of ffn 14336, top-2,
#: vocab 32000, RMSNorm, SwiGLU, RoPE, untied) as Megatron-LM's examples/mixtral train it (TP 2 × PP 4 × EP 8
#: with sequence parallelism, the distributed optimizer; 64 GPUs: DP 8), s 4096, micro-batch 1, m 4 (= PP);
#: the allgather token dispatcher, routing in balance under fake tensors (_shim_moe_dispatch)
MIXTRAL_8X7B = McoreCase(fake=True, recipe="mixtral-8x7b", tp=2, pp=4, dp=8, ep=8, distopt=True, bf16=True, L=32,
                         h=4096, ffn=14336, heads=32, groups=8, vocab=32000, s=4096, b=1, m=4, sp=True,
                         experts=8, topk=2)
PUBLISHED = [GPT3_175B, LLAMA2_70B, MIXTRAL_8X7B]


def fake_sweep() -> list[McoreCase]:
    """Every pipeline stage (its first rank) of each published shape, whole (:func:`sweep` runs the last
    stages: see there)."""
    return [c for case in PUBLISHED for c in _stages(case)]


def fake_quick_sweep() -> list[McoreCase]:
    """The tests' fake traces: the published shapes cut to one layer per pipeline stage."""
    return [c for case in PUBLISHED for c in _stages(replace(case, L=case.pp))]
