"""torchtitan as the ground truth: its own Llama 3 recipes, parallelized by its own code, traced at
the size of the published jobs with fake tensors and a fake process group, held against memform's
``fsdp2`` profile.

A case takes one of torchtitan's recipe functions (``torchtitan/models/llama3/config_registry.py``:
``llama3_8b`` and the like: model flavor, local batch, sequence length, activation checkpointing, the
chunked loss), runs what ``Trainer.__init__`` runs -- ``ParallelDims.build_mesh``, the model built on
meta, ``parallelize_llama`` (FSDP2 ``fully_shard`` per block, the embedding and the head,
``MixedPrecisionPolicy`` bf16 / fp32, torchtitan's selective or full activation checkpointing),
``to_empty`` + ``init_weights``, the optimizer container and the loss -- and then the body of
``Trainer.forward_backward_step`` (model forward with the head skipped, ``ChunkedLossWrapper`` running
the head and the loss chunk by chunk, ``loss.backward()``) and the optimizer step. Everything runs
under ``FakeTensorMode`` on a ``fake`` process group of the recipe's world size, so rank 0 of an 8- or
64-GPU job is traced in seconds without its memory. The FSDP2 accounting is :func:`..fsdp2.trace_step`'s.

The shims (torchtitan 0.3.0 on torch 2.13 CPU; ``shared/reference/frameworks-on-cpu.md``), each for a
line of torchtitan that assumes a GPU or a torch nightly:

- ``torchtitan.tools.utils.device_type`` is "cuda" when no accelerator is found (``tools/utils.py``),
  so it is set to "cpu" before any torchtitan module reads it;
- language models refuse SDPA (``models/common/config_utils.py`` ``get_attention_config``) and flex
  attention has no CPU backward: "sdpa" is routed to torchtitan's own ``ScaledDotProductAttention``
  (causal; one document per sample, so block-causal = causal). Its memory is flex's: q, k, v, the output
  and the fp32 log-sum-exp;
- torchtitan's selective AC saves the attention output only for kernels in torch's compute-intensive
  op list: the CPU flash kernel is added to its save list, as the CUDA kernels are there;
- the ``spmd_types`` backend fails in torch 2.13's FSDP2 (``_fsdp_param.py``): ``partial_dtensor``;
- ``torch.nn.init.trunc_normal_`` is data-dependent (``mask.any()``), which fake tensors refuse: it is
  a no-op while the weights are initialised (their values do not change memory);
- torchtitan's ``RMSNorm`` (``models/common/nn_modules.py``, ``nn.RMSNorm``) calls ``F.rms_norm`` ->
  ``at::_fused_rms_norm``, a CUDA kernel whose autograd saves the input, the weight and the fp32 rstd
  (``tools/autograd/derivatives.yaml`` ``_fused_rms_norm``); torch's CPU build has no kernel for it and
  runs its CompositeImplicitAutograd body (upcast, pow, mean, rsqrt, mul), which saves two fp32 copies
  of the input -- four times a bf16 input, kept by every norm outside a checkpoint and re-made by every
  recomputed one, which no GPU run holds. ``RMSNorm.forward`` is an autograd function that saves what
  the CUDA kernel saves (:func:`_fused_rms_norm_class`; the same values).

Two tracer details matter with tensor parallelism (DTensor, ``tp`` > 1): the model's buffers are DTensors
too (each block's RoPE cache), so their local tensors are what ``static`` excludes; and under
``FakeTensorMode`` the Meta kernel of ``_c10d_functional.wait_tensor`` allocates a copy where the real op
returns its input (:class:`..fsdp2._Samples` records its input instead).

Needs torchtitan 0.3.0 (``pip install torchtitan==0.3.0`` and ``pip install --no-deps triton``, which
torchtitan imports unconditionally: about 1 GB, so it is not in the ``frameworks`` extra).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: the recipes of torchtitan/models/llama3/config_registry.py this harness runs
RECIPES = ("llama3_debugmodel", "llama3_8b", "llama3_70b")


@dataclass(frozen=True)
class TitanCase:
    """One torchtitan recipe on ``world`` fake ranks (FSDP over all of them unless ``tp`` > 1)."""

    recipe: str = "llama3_8b"
    world: int = 8
    layers: int = 0           # > 0: keep only the first n blocks (a quicker trace of the same layer)
    tp: int = 1

    @property
    def reserve_checked(self) -> bool:
        """The allocator's reserve is held to its threshold for whole recipes only: cut to a few blocks,
        the head's vocabulary-wide buffers (one FSDP unit, one block in memform's replay) dominate the
        step, which no real job is (the cut's figure is still shown, marked ``~``)."""
        return self.layers == 0

    def label(self) -> str:
        cut = f" L{self.layers}" if self.layers else ""
        return f"titan {self.recipe}{cut} fsdp{self.world // self.tp}" + (f" tp{self.tp}" if self.tp > 1 else "") + " fake"

    def job(self):  # noqa: ANN201 - torchtitan's Trainer.Config
        _shim()
        from torchtitan.models.llama3 import config_registry, model_registry

        config = getattr(config_registry, self.recipe)()
        flavor = config.model_spec.flavor
        config.model_spec = model_registry(flavor, attn_backend="sdpa")
        config.parallelism.spmd_backend = "partial_dtensor"
        config.parallelism.tensor_parallel_degree = self.tp
        if self.layers:
            config.model_spec.model.layers = config.model_spec.model.layers[: self.layers]
        return config

    def memform_config(self) -> dict[str, Any]:
        """The same job in memform's keys (the fsdp2 profile), read off torchtitan's config objects."""
        config = self.job()
        mc = config.model_spec.model
        block = mc.layers[0]
        attn, ffn = block.attention, block.feed_forward
        qkv = attn.qkv_linear
        ac = type(config.activation_checkpoint).__qualname__   # "SelectiveAC.Config", "FullAC.Config"
        recompute = {"SelectiveAC": "selective", "FullAC": "full"}.get(ac.split(".")[0], "none")
        tr = config.training
        return {
            "name": self.label().replace(" ", "-"),
            "model": {
                "hidden_size": mc.dim, "num_layers": len(mc.layers), "num_heads": qkv.n_heads,
                "num_kv_heads": qkv.n_kv_heads, "ffn_hidden_size": ffn.w1.out_features,
                "vocab_size": mc.vocab_size, "seq_length": tr.seq_len, "activation": "swiglu",
                "norm": "rmsnorm", "bias": False, "dropout": False, "flash_attention": True,
                "tied_embeddings": bool(mc.enable_weight_tying), "position_embedding": "rope",
                # torchtitan FeedForward: w2(silu(w1(x)) * w3(x)); CrossEntropyLoss: F.cross_entropy
                "swiglu_impl": "eager", "cross_entropy": "eager",
            },
            "parallel": {"dp": self.world // self.tp, "tp": self.tp, "pp": 1,
                         "sequence_parallel": bool(config.parallelism.enable_sequence_parallel) and self.tp > 1},
            "training": {
                "framework": "fsdp2", "micro_batch_size": tr.local_batch_size, "num_micro_batches": 1,
                "loss_chunks": getattr(config.loss, "num_chunks", 1),
                "recompute": recompute,
                # torchtitan builds the model in training.dtype (float32) and trains it through
                # MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)
                "precision": {"params": "bf16", "grads": "fp32", "optimizer": "fp32", "activations": "bf16",
                              "master_weights": tr.dtype == "float32"},
            },
            "fsdp2": {"param_dtype": "bf16", "reduce_dtype": "fp32", "selective_ac": "op",
                      "fused_qkv": type(qkv).__qualname__.startswith("FusedQKVLinear")},
        }


@dataclass
class Step:
    """Rank 0's measured bytes per category; the ops live at the activation peak, and at each peak."""

    measured: dict[str, int]
    peak_by_op: dict[str, int] = field(default_factory=dict)
    by_op: dict[str, dict[str, int]] = field(default_factory=dict)


_SHIMMED = False


def _shim() -> None:
    """The module-level shims of the module docstring (once per process, before torchtitan loads)."""
    global _SHIMMED
    if _SHIMMED:
        return
    import torch
    import torchtitan.tools.utils as tu

    tu.device_type, tu.device_module = "cpu", torch.cpu
    import torchtitan.models.llama3 as llama3
    from torchtitan.models.common.attention import ScaledDotProductAttention

    # torchtitan's SAC saves the attention kernel's output when the kernel is in torch's compute-intensive
    # op list (distributed/activation_checkpoint.py _get_default_save_ops): the CUDA flash/efficient
    # kernels are, the CPU's _scaled_dot_product_flash_attention_for_cpu is not -- without this, SAC would
    # recompute attention here, which it does not on a GPU
    import torchtitan.distributed.activation_checkpoint as ac

    default_save = ac._get_default_save_ops
    ac._get_default_save_ops = lambda: default_save() | {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}
    routed = llama3.get_attention_config
    llama3.get_attention_config = (
        lambda backend: ScaledDotProductAttention.Config() if backend == "sdpa" else routed(backend))
    # torchtitan's RMSNorm is nn.RMSNorm (models/common/nn_modules.py), F.rms_norm -> at::_fused_rms_norm:
    # a CUDA kernel whose autograd saves the input, the weight and the fp32 rstd (derivatives.yaml
    # _fused_rms_norm); torch's CPU build has no kernel for it, and its CompositeImplicitAutograd body
    # (upcast, pow, mean, rsqrt, mul) saves two fp32 copies of the input instead -- four times the input
    # at bf16, which no GPU run keeps
    from torchtitan.models.common.nn_modules import RMSNorm

    fused = _fused_rms_norm_class()
    RMSNorm.forward = lambda self, x: fused.apply(x, self.weight, self.eps)
    _SHIMMED = True


def _fused_rms_norm_class():  # noqa: ANN202 - a torch.autograd.Function
    import torch

    class FusedRMSNorm(torch.autograd.Function):
        """RMSNorm over the last dimension with what at::_fused_rms_norm's CUDA autograd saves: the input,
        the weight and the fp32 rstd (one per row); its backward recomputes the normalised input."""

        @staticmethod
        def forward(ctx, x, weight, eps):  # noqa: ANN001, ANN205
            eps = torch.finfo(x.dtype).eps if eps is None else eps
            xf = x.float()
            rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            y = xf * rstd
            if weight is not None:
                y = y * weight
            ctx.save_for_backward(x, weight, rstd)
            return y.type_as(x)

        @staticmethod
        def backward(ctx, gy):  # noqa: ANN001, ANN205
            x, weight, rstd = ctx.saved_tensors
            xhat = x.float() * rstd
            g = gy.float()
            gw = None
            if weight is not None:
                if ctx.needs_input_grad[1]:
                    gw = (g * xhat).sum(dim=tuple(range(g.dim() - 1))).to(weight.dtype)
                g = g * weight
            gx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
            return gx.type_as(x), gw, None

    return FusedRMSNorm


def measure(case: TitanCase) -> Step:
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    config = case.job()
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.tools.utils import set_default_dtype

    from ..fsdp2 import _local, trace_step
    from ..tracker import storages_of

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=case.world)
    try:
        dims = ParallelDims.from_config(config.parallelism, case.world)
        dims.build_mesh()
        dist_utils.set_spmd_backend(config.parallelism.spmd_backend)
        mc = config.model_spec.model
        mc.update_from_config(config=config)
        with torch.device("meta"), set_default_dtype(getattr(torch, config.training.dtype)):
            model = mc.build()
        # parallelized on meta, as the Trainer does (outside fake mode: DeviceMesh bookkeeping reads real
        # rank tensors); materialised as fake tensors
        model = config.model_spec.parallelize_fn(
            model, parallel_dims=dims, training=config.training, parallelism=config.parallelism,
            compile_config=config.compile, ac_config=config.activation_checkpoint,
            dump_folder=config.dump_folder)
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")
            trunc = torch.nn.init._no_grad_trunc_normal_
            torch.nn.init._no_grad_trunc_normal_ = lambda t, *a, **k: t
            try:
                with torch.no_grad():
                    model.init_weights(buffer_device=None)
            finally:
                torch.nn.init._no_grad_trunc_normal_ = trunc
            model.train()
            loss_fn = config.loss.build(compile_config=config.compile)
            if hasattr(loss_fn, "set_lm_head"):   # ChunkedLossWrapper: the head runs inside the loss
                loss_fn.set_lm_head(model.lm_head)
                model._skip_lm_head = True
            opts = config.optimizer.build(model_parts=[model])
            b, s = config.training.local_batch_size, config.training.seq_len
            inputs = torch.randint(0, mc.vocab_size, (b, s))
            labels = torch.randint(0, mc.vocab_size, (b, s))
            positions = torch.arange(s).unsqueeze(0).expand(b, s)
            tokens = torch.tensor(b * s * dims.dp_shard)

            def forward():  # noqa: ANN202 - Trainer._forward_backward_body up to loss.backward()
                pred = model(inputs, positions=positions)
                return loss_fn(pred, labels, tokens, positions=positions)[0]

            def step() -> None:  # Trainer.train_step: clip, then the optimizer container
                dist_utils.clip_grad_norm_(list(model.parameters()), config.training.max_norm, foreach=True)
                opts.step()

            opts.zero_grad()
            forward().backward()
            step()                        # warm-up: the optimizer's states exist
            opts.zero_grad()
            params = list(model.parameters())
            # (with TP the buffers are DTensors too -- each block's RoPE cache, Replicate over the TP mesh --:
            # their local tensors are the storages)
            static = storages_of([*(_local(p) for p in params), *(_local(b) for b in model.buffers()), inputs,
                                  labels, positions, tokens])
            states = lambda: [t for o in opts.optimizers for st in o.state.values()  # noqa: E731
                              for t in st.values() if isinstance(t, torch.Tensor)]
            measured, by_op = trace_step(model, static, forward, step, states, tensor_parallel=case.tp > 1)
    finally:
        dist.destroy_process_group()
    return Step(measured, by_op.get("activations_peak", {}), by_op)


def sweep() -> list[TitanCase]:
    """torchtitan's Llama-3.1-8B recipe on 8 GPUs (its docs' FSDP example), whole and cut to 2 blocks; the
    same recipe with FSDP × TP (DTensor, sequence parallel: torchtitan's default with TP) 4 × 2 and 4 × 4,
    whose peak is the vocabulary-parallel loss; and the Llama-3.1-70B recipe on 256 GPUs, FSDP 32 × TP 8
    with full AC (its own parallelism), whose peak is a block's forward re-run in backward (issue 29)."""
    return [TitanCase("llama3_8b", world=8), TitanCase("llama3_8b", world=8, layers=2),
            TitanCase("llama3_8b", world=8, tp=2), TitanCase("llama3_8b", world=8, tp=2, layers=2),
            TitanCase("llama3_8b", world=16, tp=4),
            TitanCase("llama3_70b", world=256, tp=8), TitanCase("llama3_70b", world=256, tp=8, layers=2)]


def quick_sweep() -> list[TitanCase]:
    """The cases the test suite runs: the 8B recipe cut to 2 blocks, and the 70B FSDP × TP recipe cut to 2."""
    return [TitanCase("llama3_8b", world=8, layers=2), TitanCase("llama3_70b", world=256, tp=8, layers=2)]
