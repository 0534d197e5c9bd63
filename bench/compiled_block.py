"""What a torch.compile'd Llama block keeps for its backward (formulas/frameworks/fsdp2.mf, model.compile: blocks).

torchtitan compiles each transformer block on its own (``apply_compile``: ``torch.compile(block, fullgraph=True)``,
models/llama3/parallelize.py at 9dec370; distributed/compile.py in 0.3). AOTAutograd traces the block's forward and
backward as one joint graph and Inductor's partitioner (torch/_inductor/compile_fx.py ``partition_fn`` ->
torch/_functorch/partitioners.py ``min_cut_rematerialization_partition``) decides what the forward saves: whatever
the backward needs that it cannot recompute from a cheaper cut -- matmul and attention outputs (compute-intensive,
banned from recompute), reductions at least 4x smaller than their input (the norms' rstd), the block input; the
pointwise ops (the norms' scaling, RoPE, silu, the gate's product, the dtype casts) and views/expands (repeat_kv)
are recomputed in the backward. Under op-level SAC the policy's tags bind it: PREFER_RECOMPUTE nodes are never
saved (partitioners.py must_recompute), MUST_SAVE ones are saved only if the backward reads them.

This script builds the Llama 3 block as torchtitan 9dec370 writes it (models/llama3/model.py: RMSNorm upcasting to
fp32, separate wq/wk/wv, complex RoPE, repeat_kv, causal SDPA, SwiGLU w2(silu(w1 x) * w3 x)), optionally wrapped in
torchtitan's op-level SAC (distributed/activation_checkpoint.py: save every odd mm and the attention kernel) or its
full AC, and runs one forward and backward eager and compiled, recording every tensor autograd saves
(saved_tensors_hooks; one entry per storage, parameters excluded). The compiled run uses Inductor's own
partitioner and decompositions with no code generation (the "inductor-partition" backend below: what
``backend="inductor"`` saves, without the C++ compile; ``--inductor`` runs the real backend once to check that).
It prints the measured bytes per layer beside memform's (the fsdp2 profile's decoder act, eager and with
model.compile: blocks)::

    PYTHONPATH=src python bench/compiled_block.py            # the sweep: 24 cases, about a minute of CPU
    PYTHONPATH=src python bench/compiled_block.py --inductor # + one case through the real Inductor backend
    PYTHONPATH=src /work/venv-titan/bin/python bench/compiled_block.py --titan   # torchtitan's own blocks (below)

``--titan`` (torchtitan 0.3.0 installed) compiles torchtitan's own blocks the same way: DeepSeek-V3's
(models/deepseek_v3: MLA attention with flex attention, its dense FFN or its MoE -- TokenChoiceTopKRouter,
LocalTokenDispatcher or, at EP 2, AllToAllTokenDispatcher, GroupedExperts over torch._grouped_mm, shared
experts), built by its
``build_mla_moe_layers``, and Llama 3's debugmodel block tensor-parallelized by torchtitan's own
``parallelize_llama`` (DTensor, TP 2 with and without sequence parallelism, on a ``fake`` process group with
real CPU tensors: the collectives return uninitialised buffers of the right size; EP likewise, each rank
receiving the expert counts it sends), each under no AC,
torchtitan's SelectiveAC (op SAC) and FullAC (their ``_wrap_block``). Eager runs use the harness's RMSNorm
(what the CUDA ``_fused_rms_norm`` saves: memform.validation.frameworks.titan), compiled ones nn.RMSNorm
(decomposed by the compile on any device). Flex attention has no CPU backward (its device check is lifted;
the eager HOP's math forward and backward run) and torchtitan's nested ``torch.compile(flex_attention)`` is
its eager function (inlined by the block's compile either way). It writes bench/results/compiled_block_titan.json
(read by tests/test_compiled_block.py) and prints each case beside memform's figures. Measured (2026-12-07, 20 cases,
about 5 minutes of CPU): op SAC and full AC exact but for flex's block mask (64-96 bytes); no AC 2.4-3.7 % above
memform's compiled figure for MLA / MoE until issue 30 counted MLA's v keeping wkv_b's whole output (dense.mf
mla_v_view; re-run 2026-12-08: -0.18..+0.27 %, the norms' rstd and the router's ints: EP's permutation indices:
tests/test_compiled_block.py _titan_uncounted), 0.08 % with TP + SP; TP without SP keeps more than eager (not
modelled). backend="inductor" does not compile the MLA block on the CPU (flex attention's backward: "IndexError: tuple
index out of range" in its lowering); on the MoE part alone (the base shape's ffn_norm + MoE, x + moe(ffn_norm(x)))
it saves the same tensors as the partition-only backend, 1,525,792 bytes without AC and 200,704 under op SAC
(``--titan --inductor``, a few minutes of C++ compiles).

Measured (torch 2.13 CPU, 2026-12-07): every no-AC case 0.05-0.11 % above memform's compiled figure (the two
norms' fp32 rstd, 8 bytes a token, which memform counts for neither eager nor compiled blocks), every op-SAC
case exact, full AC the block input plus the CPU generator's state (5,056 bytes); against memform's eager
figure a compiled block saves one f-wide tensor fewer without AC (silu(w1 x)) and one h-wide fewer under op
SAC (w2's output). backend="inductor" (its C++ code for the CPU) saves the same bytes as the partition-only
backend: 3,960,832 without AC and 1,630,208 under op SAC (bf16 base shape), 7,909,376 (fp32, no AC). With 9dec370's repeat_kv (``Shape(gqa="repeat")``) the compiled block without AC saves the repeated
k and v, a·d_h wide, as the eager one does (4,222,976 bytes in the base case); under op SAC it saves wv's output, as without.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Shape:
    b: int = 2
    s: int = 256
    h: int = 256
    heads: int = 4
    kv: int = 2
    ffn: int = 688
    dtype: str = "bf16"
    ac: str = "none"        # none | op | full
    gqa: str = "enable_gqa"  # enable_gqa: SDPA reads the kv heads (torchtitan 0.3); repeat: repeat_kv first (9dec370)

    def label(self) -> str:
        rep = " repeat_kv" if self.gqa == "repeat" else ""
        return f"b{self.b} s{self.s} h{self.h} a{self.heads}/{self.kv} f{self.ffn} {self.dtype} ac={self.ac}{rep}"


# ---- the block (torchtitan 9dec370 models/llama3/model.py, models/norms.py) ------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    k = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    f = freqs_cis.view(1, q.shape[1], 1, q.shape[-1])
    return (torch.view_as_real(q * f).flatten(3).type_as(xq), torch.view_as_real(k * f).flatten(3).type_as(xk))


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    bs, slen, n_kv, hd = x.shape
    return x if n_rep == 1 else x[:, :, :, None, :].expand(bs, slen, n_kv, n_rep, hd).reshape(bs, slen, n_kv * n_rep, hd)


class Block(nn.Module):
    def __init__(self, sh: Shape) -> None:
        super().__init__()
        hd = sh.h // sh.heads
        self.heads, self.kv, self.hd, self.repeat = sh.heads, sh.kv, hd, sh.gqa == "repeat"
        self.wq = nn.Linear(sh.h, sh.heads * hd, bias=False)
        self.wk = nn.Linear(sh.h, sh.kv * hd, bias=False)
        self.wv = nn.Linear(sh.h, sh.kv * hd, bias=False)
        self.wo = nn.Linear(sh.heads * hd, sh.h, bias=False)
        self.w1 = nn.Linear(sh.h, sh.ffn, bias=False)
        self.w2 = nn.Linear(sh.ffn, sh.h, bias=False)
        self.w3 = nn.Linear(sh.h, sh.ffn, bias=False)
        self.attention_norm, self.ffn_norm = RMSNorm(sh.h), RMSNorm(sh.h)
        freqs = 1.0 / (500000.0 ** (torch.arange(0, hd, 2).float() / hd))
        angles = torch.outer(torch.arange(sh.s).float(), freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles), persistent=False)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        bs, s, _ = x.shape
        xq = self.wq(x).view(bs, s, self.heads, self.hd)
        xk = self.wk(x).view(bs, s, self.kv, self.hd)
        xv = self.wv(x).view(bs, s, self.kv, self.hd)
        xq, xk = rope(xq, xk, self.freqs_cis)
        if self.repeat:   # 9dec370: repeat_kv, then SDPA over a heads
            xk, xv = repeat_kv(xk, self.heads // self.kv), repeat_kv(xv, self.heads // self.kv)
        out = F.scaled_dot_product_attention(xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2),
                                             is_causal=True, enable_gqa=not self.repeat)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, s, -1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        y = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(y)) * self.w3(y))


# ---- torchtitan's activation checkpointing (distributed/activation_checkpoint.py) ------------------------------

def _op_sac_context():
    """_apply_op_sac's policy: save the attention kernel's outputs and every odd-numbered mm's (wq, wv, w1, w2),
    recompute everything else. The CPU flash kernel stands in for the CUDA ones in the save list."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    save = {aten.mm.default, aten._scaled_dot_product_flash_attention_for_cpu.default,
            aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_efficient_attention.default}
    meta = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):  # noqa: ANN001, ANN202 - torch's policy signature
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == aten.mm.default:
            meta[mode] += 1
        if func in save and not (func == aten.mm.default and meta[mode] % 2 == 0):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class Checkpointed(nn.Module):
    """ptd_checkpoint_wrapper's non-reentrant checkpoint around the block (full, or op SAC's context)."""

    def __init__(self, block: nn.Module, ac: str) -> None:
        super().__init__()
        self.block, self.ac = block, ac

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        kw = {"context_fn": _op_sac_context} if self.ac == "op" else {}
        return checkpoint(self.block, x, use_reentrant=False, preserve_rng_state=False, **kw)


# ---- compile: Inductor's partition without its code generation ---------------------------------------------------

def inductor_partition_backend():
    """aot_autograd with Inductor's decompositions and partition_fn (its joint-graph passes, then
    min_cut_rematerialization_partition(compiler="inductor")), the partitioned graphs run as they are."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import get_nop_func
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table

    return aot_autograd(fw_compiler=get_nop_func(), bw_compiler=get_nop_func(),
                        decompositions=select_decomp_table(), partition_fn=partition_fn)


def saved_tensors(sh: Shape, compiled: bool, backend=None, seed: int = 0) -> dict[int, tuple]:  # noqa: ANN001
    """The distinct storages autograd saves in one forward of the block (its parameters excluded): storage ->
    (shape, dtype, bytes) of a tensor saved in it."""
    torch.manual_seed(seed)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[sh.dtype]
    block = Block(sh).to(dtype)
    block.freqs_cis = block.freqs_cis.to(torch.complex64)
    module: nn.Module = block if sh.ac == "none" else Checkpointed(block, sh.ac)
    if compiled:
        torch._dynamo.reset()
        module = torch.compile(module, fullgraph=True, backend=backend or inductor_partition_backend())
    x = torch.randn(sh.b, sh.s, sh.h, dtype=dtype, requires_grad=True)
    skip = {p.untyped_storage().data_ptr() for p in block.parameters()} | {block.freqs_cis.untyped_storage().data_ptr()}
    seen: dict[int, tuple] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in skip and st.nbytes():
            seen[st.data_ptr()] = (tuple(t.shape), str(t.dtype).removeprefix("torch."), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(x)
    out.sum().backward()
    return seen


def saved_bytes(sh: Shape, compiled: bool, backend=None) -> int:  # noqa: ANN001
    """Bytes of what :func:`saved_tensors` finds."""
    return sum(n for _, _, n in saved_tensors(sh, compiled, backend).values())


# ---- memform's side ------------------------------------------------------------------------------------------------

def memform_layer(sh: Shape, compiled: bool) -> int:
    """memform's per-layer activations of the decoder block (fsdp2 profile, torchtitan's eager SwiGLU and loss)."""
    from memform.engine.model import estimate

    recompute = {"none": "none", "op": "selective", "full": "full"}[sh.ac]
    precision = {"bf16": {"params": "bf16", "grads": "fp32", "optimizer": "fp32", "activations": "bf16",
                          "master_weights": True},
                 "fp32": {"params": "fp32", "grads": "fp32", "optimizer": "fp32", "activations": "fp32"}}[sh.dtype]
    cfg = {"name": "compiled-block",
           "model": {"hidden_size": sh.h, "num_heads": sh.heads, "num_kv_heads": sh.kv, "ffn_hidden_size": sh.ffn,
                     "num_layers": 2, "vocab_size": 512, "seq_length": sh.s, "activation": "swiglu", "norm": "rmsnorm",
                     "bias": False, "dropout": False, "flash_attention": True, "position_embedding": "rope",
                     "swiglu_impl": "eager", "cross_entropy": "eager", "compile": "blocks" if compiled else "none"},
           "parallel": {"dp": 1, "tp": 1, "pp": 1},
           "training": {"micro_batch_size": sh.b, "num_micro_batches": 1, "recompute": recompute,
                        "precision": precision, "framework": "fsdp2"},
           "fsdp2": {"param_dtype": sh.dtype, "reduce_dtype": "fp32", "selective_ac": "op"}}
    est = estimate(cfg, numeric=True)
    return next(int(g.per_layer_values["activations"]) for g in est.stages[0].layers if g.block == "decoder")


BASE = Shape()


def sweep() -> list[Shape]:
    shapes = [BASE, replace(BASE, b=4), replace(BASE, s=512), replace(BASE, h=512, heads=8, kv=2, ffn=1376),
              replace(BASE, kv=4), replace(BASE, kv=1), replace(BASE, ffn=1024), replace(BASE, dtype="fp32")]
    return [replace(sh, ac=ac) for sh in shapes for ac in ("none", "op", "full")]


# ---- torchtitan's own blocks (--titan) ------------------------------------------------------------------------

@dataclass(frozen=True)
class TitanBlock:
    """A torchtitan block: kind "moe" / "mla" (DeepSeek-V3's MoE block / its dense first block) or "tp" (Llama 3
    debugmodel, TP ``tp`` with or without SP); ``ac`` none | op | full."""

    kind: str = "moe"
    ac: str = "none"
    b: int = 2
    s: int = 128
    h: int = 256
    heads: int = 4
    q_rank: int = 0
    kv_rank: int = 128
    dn: int = 32
    dr: int = 16
    dv: int = 32
    fexp: int = 128
    experts: int = 8
    topk: int = 2
    shared: int = 1
    ffn: int = 512
    tp: int = 1
    sp: bool = True
    ep: int = 1

    def label(self) -> str:
        if self.kind == "tp":
            return f"llama3-debug tp{self.tp}{' sp' if self.sp else ''} b{self.b} s{self.s} ac={self.ac}"
        q = f" q{self.q_rank}" if self.q_rank else ""
        moe = f" E{self.experts} K{self.topk} fe{self.fexp} sh{self.shared}" if self.kind == "moe" else f" f{self.ffn}"
        moe += f" ep{self.ep}" if self.ep > 1 else ""
        return f"dsv3-{self.kind} b{self.b} s{self.s} h{self.h} a{self.heads}{q}{moe} ac={self.ac}"


def _titan_setup() -> None:
    import torch.nn.attention.flex_attention as fa
    import torchtitan.tools.utils as tu

    tu.device_type, tu.device_module = "cpu", torch.cpu   # (the titan harness's first shim)
    from torchtitan.models.common.attention import FlexAttention
    from torchtitan.models.common.nn_modules import RMSNorm
    from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher

    from memform.validation.frameworks.titan import _fused_rms_norm_class

    fa._validate_device = lambda *a, **k: None        # flex's CPU check ("does not support backward on CPU")
    FlexAttention._compiled_flex_attn = fa.flex_attention   # the block's compile inlines it either way
    # the harness's RMSNorm (what the CUDA _fused_rms_norm saves) for eager blocks; its EP shim of the
    # dispatcher (balanced splits for fake tensors, applied by TitanCase.job) is undone for the EP-1 blocks
    fused = _fused_rms_norm_class()
    RMSNorm._harness_forward = lambda self, x: fused.apply(x, self.weight, self.eps)
    AllToAllTokenDispatcher._torchtitan_local_reorder = AllToAllTokenDispatcher._local_reorder
    torch._dynamo.config.capture_scalar_outputs = True   # apply_compile's setting (distributed/compile.py)


def _norms(compiled: bool) -> None:
    from torchtitan.models.common.nn_modules import RMSNorm

    RMSNorm.forward = nn.RMSNorm.forward if compiled else RMSNorm._harness_forward


def _saved(module, args, kwargs, skip, backend, compiled, shapes=frozenset()) -> dict[int, tuple]:  # noqa: ANN001
    from torch.distributed.tensor import DTensor

    if compiled:
        torch._dynamo.reset()
        module = torch.compile(module, fullgraph=True, backend=backend or inductor_partition_backend())
    seen: dict[int, tuple] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        u = t._local_tensor if isinstance(t, DTensor) else t
        if tuple(u.shape) in shapes:      # the TP block's local weights (the forward's bf16 views of them)
            return t
        try:
            st = u.untyped_storage()
            ptr = st.data_ptr()
        except RuntimeError:     # eager DTensor's AsyncCollectiveTensor (a wait pending): its shape's bytes
            seen[id(u)] = (tuple(u.shape), str(u.dtype).removeprefix("torch."), u.numel() * u.element_size())
            return t
        if ptr not in skip and st.nbytes():
            seen[ptr] = (tuple(u.shape), str(u.dtype).removeprefix("torch."), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(*args, **kwargs)
    out.float().sum().backward()
    return seen


def _wrap(block: nn.Module, ac: str) -> nn.Module:
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    if ac == "full":
        return FullAC(FullAC.Config())._wrap_block(block)
    if ac == "op":
        return SelectiveAC(SelectiveAC.Config())._wrap_block(block, base_fqn="layers.1")
    return block


def _dsv3_saved(tb: TitanBlock, compiled: bool, backend=None) -> dict[int, tuple]:  # noqa: ANN001
    if tb.ep == 1:
        return _dsv3_block_saved(tb, compiled, backend)
    # expert parallelism: rank 0 of a `fake` process group of ep ranks holds E/ep experts; torchtitan's
    # AllToAllTokenDispatcher exchanges the per-expert counts (an all-to-all whose output the fake group leaves
    # uninitialised): here each rank receives what it sends, as under balanced routing, so the splits agree;
    # the data all-to-alls return buffers of those sizes
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher

    from memform.validation.ranks import fake_group

    exchange = AllToAllTokenDispatcher._token_count_exchange
    AllToAllTokenDispatcher._token_count_exchange = lambda self, counts, pg, ep: counts.view(ep, -1).clone()
    try:
        with fake_group(tb.ep):
            dist_utils.set_spmd_backend("partial_dtensor")
            return _dsv3_block_saved(tb, compiled, backend, init_device_mesh("cpu", (tb.ep,), mesh_dim_names=("ep",)))
    finally:
        AllToAllTokenDispatcher._token_count_exchange = exchange


def _dsv3_block_saved(tb: TitanBlock, compiled: bool, backend=None, ep_mesh=None) -> dict[int, tuple]:  # noqa: ANN001
    from torch.nn.attention.flex_attention import create_block_mask
    from torchtitan.models.common import ComplexRoPE
    from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher
    from torchtitan.models.deepseek_v3 import _build_dsv3_layers

    AllToAllTokenDispatcher._local_reorder = AllToAllTokenDispatcher._torchtitan_local_reorder
    _norms(compiled)
    rope = ComplexRoPE.Config(dim=tb.dr, max_seq_len=tb.s, theta=10000.0)
    layers = _build_dsv3_layers(
        n_layers=2, n_dense_layers=1, dim=tb.h, n_heads=tb.heads, q_lora_rank=tb.q_rank, kv_lora_rank=tb.kv_rank,
        qk_nope_head_dim=tb.dn, qk_rope_head_dim=tb.dr, v_head_dim=tb.dv, mscale=1.0, dense_hidden_dim=tb.ffn,
        moe_hidden_dim=tb.fexp, num_experts=tb.experts, num_shared_experts=tb.shared, router_top_k=tb.topk,
        router_score_func="sigmoid", attn_backend="flex", moe_comm_backend="standard",
        non_blocking_capacity_factor=None, rope=rope)
    torch.manual_seed(0)
    block = layers[1 if tb.kind == "moe" else 0].build()
    if ep_mesh is not None:     # this rank's experts (ExpertParallel shards GroupedExperts' weights on dim 0)
        experts = block.moe.routed_experts.inner_experts
        for name in ("w1_EFD", "w2_EDF", "w3_EFD"):
            setattr(experts, name, nn.Parameter(getattr(experts, name).detach()[: tb.experts // tb.ep].clone()))
        block.moe.routed_experts.token_dispatcher.wire_meshes(ep_mesh=ep_mesh)
    for p in block.parameters():      # FSDP2's param_dtype bf16 (buffers stay fp32 / complex)
        nn.init.normal_(p, std=0.02)
        p.data = p.data.to(torch.bfloat16)
    mask = create_block_mask(lambda b, h, q, kv: q >= kv, tb.b, None, tb.s, tb.s, device="cpu")
    x = torch.randn(tb.b, tb.s, tb.h, dtype=torch.bfloat16, requires_grad=True)
    skip = {t.untyped_storage().data_ptr() for t in [*block.parameters(), *block.buffers()]}
    return _saved(_wrap(block, tb.ac), (x, mask, None), {}, skip, backend, compiled)


def _tp_case(tb: TitanBlock):  # noqa: ANN202
    from memform.validation.frameworks.titan import TitanCase

    return TitanCase("llama3_debugmodel", world=tb.tp, tp=tb.tp, layers=1, batch=tb.b, seq=tb.s,
                     ac={"none": "", "op": "op", "full": "full"}[tb.ac])


def _tp_saved(tb: TitanBlock, compiled: bool, backend=None) -> dict[int, tuple]:  # noqa: ANN001
    from torch.distributed.tensor import DTensor

    from memform.validation.frameworks.titan import fake_rank, parallelize

    config = _tp_case(tb).job()
    if tb.ac == "none":
        config.activation_checkpoint = None
    config.parallelism.enable_sequence_parallel = tb.sp
    _norms(compiled)
    with fake_rank(config, tb.tp) as (dims, model):     # the titan harness's set-up (training.dtype float32)
        mc = config.model_spec.model
        model = parallelize(config, dims, model)
        model.to_empty(device="cpu")
        torch.manual_seed(0)
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        for m in model.modules():     # FSDP2's param_dtype bf16
            for name, p in list(m._parameters.items()):
                if p is not None:
                    m._parameters[name] = nn.Parameter(p.detach().to(torch.bfloat16))
        block = model.layers["0"]
        local = lambda t: t._local_tensor if isinstance(t, DTensor) else t  # noqa: E731
        got: dict = {}
        hook = block.register_forward_pre_hook(lambda m, a, k: got.update(args=a, kwargs=k), with_kwargs=True)
        model._skip_lm_head = True
        with torch.no_grad():
            model(torch.randint(0, mc.vocab_size, (tb.b, tb.s)))
        hook.remove()
        x = got["args"][0].detach().to(torch.bfloat16).requires_grad_()
        skip = {local(t).untyped_storage().data_ptr() for t in [*block.parameters(), *block.buffers()]}
        # the forward's weights reach the saved tensors as the local bf16 tensors' views or copies (by shape)
        shapes = frozenset({tuple(local(p).shape) for p in block.parameters()}
                           | {tuple(local(p).shape)[::-1] for p in block.parameters()})
        return _saved(block, (x, *got["args"][1:]), got["kwargs"], skip, backend, compiled, shapes)


def moe_part_saved_bytes(tb: TitanBlock, backend=None) -> int:  # noqa: ANN001
    """The compiled MoE part of the MoE block alone, x + moe(ffn_norm(x)) (no flex attention: backend="inductor"
    cannot lower its backward on the CPU), under ``tb.ac``."""
    from torchtitan.models.common import ComplexRoPE
    from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher
    from torchtitan.models.deepseek_v3 import _build_dsv3_layers

    class MoEPart(nn.Module):
        def __init__(self, block: nn.Module) -> None:
            super().__init__()
            self.ffn_norm, self.moe = block.ffn_norm, block.moe

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.moe(self.ffn_norm(x))

    AllToAllTokenDispatcher._local_reorder = AllToAllTokenDispatcher._torchtitan_local_reorder
    _norms(True)
    layers = _build_dsv3_layers(
        n_layers=2, n_dense_layers=1, dim=tb.h, n_heads=tb.heads, q_lora_rank=tb.q_rank, kv_lora_rank=tb.kv_rank,
        qk_nope_head_dim=tb.dn, qk_rope_head_dim=tb.dr, v_head_dim=tb.dv, mscale=1.0, dense_hidden_dim=tb.ffn,
        moe_hidden_dim=tb.fexp, num_experts=tb.experts, num_shared_experts=tb.shared, router_top_k=tb.topk,
        router_score_func="sigmoid", attn_backend="flex", moe_comm_backend="standard",
        non_blocking_capacity_factor=None, rope=ComplexRoPE.Config(dim=tb.dr, max_seq_len=tb.s, theta=10000.0))
    torch.manual_seed(0)
    part = MoEPart(layers[1].build())
    for p in part.parameters():
        nn.init.normal_(p, std=0.02)
        p.data = p.data.to(torch.bfloat16)
    x = torch.randn(tb.b, tb.s, tb.h, dtype=torch.bfloat16, requires_grad=True)
    skip = {t.untyped_storage().data_ptr() for t in [*part.parameters(), *part.buffers()]}
    return sum(n for _, _, n in _saved(_wrap(part, tb.ac), (x,), {}, skip, backend, True).values())


def titan_saved_bytes(tb: TitanBlock, compiled: bool, backend=None) -> int:  # noqa: ANN001
    """Bytes the torchtitan block saves for its backward (its parameters and buffers excluded)."""
    fn = _tp_saved if tb.kind == "tp" else _dsv3_saved
    return sum(n for _, _, n in fn(tb, compiled, backend).values())


def titan_memform_layer(tb: TitanBlock, compiled: bool) -> int:
    """memform's per-layer activations of the same block (the fsdp2 profile, as the titan harness writes it)."""
    from memform.engine.model import estimate

    recompute = {"none": "none", "op": "selective", "full": "full"}[tb.ac]
    if tb.kind == "tp":
        cfg = _tp_case(tb).memform_config()
        cfg["parallel"]["sequence_parallel"] = tb.sp
        cfg["training"].update(recompute=recompute, loss_chunks=1)
        block = "decoder"
    else:
        cfg = {"name": "compiled-titan-block", "formulas": ["moe.mf", "mla.mf"],
               "model": {"attention": "mla", "hidden_size": tb.h, "num_layers": 2, "num_heads": tb.heads,
                         "ffn_hidden_size": tb.ffn, "vocab_size": 512, "seq_length": tb.s, "activation": "swiglu",
                         "norm": "rmsnorm", "bias": False, "dropout": False, "flash_attention": True,
                         "position_embedding": "rope", "swiglu_impl": "eager", "cross_entropy": "eager",
                         "q_lora_rank": tb.q_rank, "kv_lora_rank": tb.kv_rank, "qk_rope_head_dim": tb.dr,
                         "qk_nope_head_dim": tb.dn, "v_head_dim": tb.dv, "num_experts": tb.experts,
                         "moe_top_k": tb.topk, "moe_ffn_hidden_size": tb.fexp, "num_shared_experts": tb.shared,
                         "first_k_dense": 1, "moe_grouped_gemm": True},
               "parallel": {"dp": tb.ep, "tp": 1, "pp": 1, "ep": tb.ep, "expert_tp": 1},
               "training": {"framework": "fsdp2", "micro_batch_size": tb.b, "num_micro_batches": 1,
                            "recompute": recompute,
                            "precision": {"params": "bf16", "grads": "fp32", "optimizer": "fp32",
                                          "activations": "bf16", "master_weights": True}},
               "fsdp2": {"param_dtype": "bf16", "reduce_dtype": "fp32", "selective_ac": "op",
                         "grouped_experts": True}}
        block = "moe_decoder" if tb.kind == "moe" else "decoder"
    cfg["model"]["compile"] = "blocks" if compiled else "none"
    est = estimate(cfg, numeric=True)
    return next(int(g.per_layer_values["activations"]) for g in est.stages[0].layers if g.block == block)


TITAN_BASE = TitanBlock()


def titan_sweep() -> list[TitanBlock]:
    moe = [TITAN_BASE, replace(TITAN_BASE, q_rank=96), replace(TITAN_BASE, topk=3, experts=16, fexp=64, shared=2),
           replace(TITAN_BASE, b=1, s=256, h=384, heads=6)]
    moe.append(replace(TITAN_BASE, ep=2))
    mla = [replace(TITAN_BASE, kind="mla"), replace(TITAN_BASE, kind="mla", q_rank=96)]
    tp = [TitanBlock(kind="tp", tp=2, b=2, s=96), TitanBlock(kind="tp", tp=2, b=2, s=96, sp=False)]
    # full AC: the block input (the DeepSeek-V3 shapes); the TP block's FullAC does not compile here (torch 2.13:
    # "expected all tensors_saved_with_vc_check to be Tensors", a DeviceMesh among them)
    return ([replace(tb, ac=ac) for tb in moe + mla for ac in ("none", "op")] + [replace(tb, ac="full") for tb in (moe[0], mla[0])]
            + [replace(tb, ac=ac) for tb in tp for ac in ("none", "op")])


def titan_main(out_path: str, only: str = "", inductor: bool = False) -> int:
    import json
    import time

    _titan_setup()
    if inductor:     # the real backend (C++ code for the CPU) against the partition-only one, on the MoE part
        for ac in ("none", "op"):
            tb = replace(TITAN_BASE, ac=ac)
            print(f"MoE part of {tb.label()}: backend inductor {moe_part_saved_bytes(tb, 'inductor'):,d} bytes saved, "
                  f"inductor-partition {moe_part_saved_bytes(tb):,d}", flush=True)
        return 0
    rows = []
    print(f"{'case':58s} {'eager':>10s} {'memform':>10s} {'compiled':>10s} {'memform':>10s} {'error':>7s}")
    for tb in titan_sweep():
        if only and only not in tb.label():
            continue
        t0 = time.time()
        eager = titan_saved_bytes(tb, False) if tb.ac == "none" else None   # SAC's cache is not seen by the hooks
        comp = titan_saved_bytes(tb, True)
        mf_eager, mf_comp = titan_memform_layer(tb, False), titan_memform_layer(tb, True)
        rows.append({"case": tb.label(), "block": {k: v for k, v in tb.__dict__.items()}, "eager": eager,
                     "compiled": comp, "memform_eager": mf_eager, "memform_compiled": mf_comp})
        e = f"{eager:>10,d}" if eager is not None else f"{'-':>10s}"
        print(f"{tb.label():58s} {e} {mf_eager:>10,d} {comp:>10,d} {mf_comp:>10,d} {mf_comp / comp - 1:>+7.2%}"
              f"  ({time.time() - t0:.0f} s)", flush=True)
    if not only:
        with open(out_path, "w") as fh:
            json.dump({"torch": torch.__version__, "rows": rows}, fh, indent=1)
            fh.write("\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inductor", action="store_true", help="also run the base shape (no AC, op SAC) through "
                                                            "backend='inductor' (a few minutes of C++ compiles)")
    ap.add_argument("--quick", action="store_true", help="the base shape only")
    ap.add_argument("--titan", action="store_true", help="torchtitan 0.3's own DeepSeek-V3 MLA / MoE blocks and its "
                                                         "TP'd Llama block (needs torchtitan; writes the recording)")
    ap.add_argument("--only", default="", help="with --titan: the cases whose label contains this (not recorded)")
    args = ap.parse_args(argv)
    torch._dynamo.config.cache_size_limit = 64
    if args.titan:
        from pathlib import Path

        return titan_main(str(Path(__file__).parent / "results" / "compiled_block_titan.json"), args.only, args.inductor)
    shapes = [replace(BASE, ac=ac) for ac in ("none", "op", "full")] if args.quick else sweep()
    print(f"{'case':46s} {'eager':>10s} {'memform':>10s} {'compiled':>10s} {'memform':>10s} {'error':>7s}")
    print(f"{'':46s} {'measured':>10s} {'eager':>10s} {'measured':>10s} {'compiled':>10s}")
    worst = 0.0
    for sh in shapes:
        # eager op SAC / full AC: torch.utils.checkpoint's own saved-tensor hooks take the tensors (the SAC
        # cache is not seen here); memform's eager figures are bench/validate.py --frameworks's
        eager = f"{saved_bytes(sh, False):>10,d}" if sh.ac == "none" else f"{'-':>10s}"
        comp = saved_bytes(sh, True)
        mf_eager, mf_comp = memform_layer(sh, False), memform_layer(sh, True)
        err = mf_comp / comp - 1
        if sh.ac != "full":    # full AC: the block input and, on the CPU only, the RNG state (5,056 bytes)
            worst = max(worst, abs(err))
        print(f"{sh.label():46s} {eager} {mf_eager:>10,d} {comp:>10,d} {mf_comp:>10,d} {err:>+7.2%}", flush=True)
    if args.inductor:
        for sh in (replace(BASE, ac="none"), replace(BASE, ac="op")):
            real = saved_bytes(sh, True, backend="inductor")
            print(f"backend inductor, {sh.label()}: {real:,d} bytes saved (inductor-partition: {saved_bytes(sh, True):,d})")
    print(f"largest |error| of memform's compiled figure (no AC, op SAC): {worst:.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
