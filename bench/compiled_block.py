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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inductor", action="store_true", help="also run the base shape (no AC, op SAC) through "
                                                            "backend='inductor' (a few minutes of C++ compiles)")
    ap.add_argument("--quick", action="store_true", help="the base shape only")
    args = ap.parse_args(argv)
    torch._dynamo.config.cache_size_limit = 64
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
