"""Small but real decoder-only transformers built from a memform config (random weights).

Llama-style (RMSNorm, SwiGLU, RoPE, GQA, no biases), GPT-style (LayerNorm, GeLU, learned positions,
biases, dropout) and Mixtral-style (top-k MoE) models come from the same ``model.*`` keys memform
reads. The layers do what Megatron-LM's kernels do, so that what autograd keeps for backward is what a
production framework keeps:

- RMSNorm is one autograd function that saves its input and the fp32 1/rms per token (as apex's
  ``FusedRMSNorm`` and Transformer Engine's ``RMSNorm`` do); ``F.rms_norm`` on the CPU is composite and
  would keep an fp32 copy of the input and of the normalised output instead. LayerNorm is ATen's kernel
  (keeps its input and the fp32 mean and 1/std per token).
- Attention: separate Q, K, V projections (the same weights as a fused QKV GEMM) so that exactly the
  (rotated) Q and K and the V projection are kept; rotary tables are precomputed buffers.
  ``model.flash_attention: true`` calls ``F.scaled_dot_product_attention`` (on the CPU a flash kernel that
  keeps Q, K, V, its output and the fp32 log-sum-exp, with GQA handled without expanding K/V);
  ``false`` runs the unfused core: scores, causal mask, softmax (its output is kept), dropout, @ V,
  with query heads grouped per KV head so K/V are never copied to ``num_heads`` width.
- MLA (``model.attention: mla``): DeepSeek-V2's multi-head latent attention, built as Megatron-LM's
  ``MLASelfAttention`` builds it (see :class:`MLAttention`): low-rank query and key/value latents with
  their own RMSNorms, a decoupled rotary key shared by all heads, the same flash or unfused core.
- Dropout is ATen's fused ``native_dropout`` (a 1-byte mask, like Megatron's kernels) after the
  embedding, on the attention probabilities, after the attention projection and after the MLP.
- MLP: GeLU, or SwiGLU with ``model.swiglu_impl: fused`` — one autograd function over the concatenated
  gate/up GEMM output that saves only that input (Megatron's ``bias_swiglu_impl``) — or ``eager`` —
  PyTorch's plain ``silu(gate) * up``, which also keeps ``silu(gate)``.
- Recompute: ``full`` checkpoints every layer, ``selective`` checkpoints the unfused attention core (a
  flash core is not recomputed, as in Megatron-LM, which only checkpoints the non-flash core).
- The loss is PyTorch's eager fp32 ``F.cross_entropy`` over the vocabulary (the bf16 logits are upcast
  first), i.e. memform's ``model.cross_entropy: eager``: its backward holds two fp32 s·b·v gradients.
- The fused kernels' stand-ins (RMSNorm, SwiGLU) compute their backward in blocks of ``FUSED_ROWS``
  rows, so that, like the real kernels, they allocate little beyond their output (the measured peak).
- MoE (``model.num_experts`` > 1, dropless): a softmax router picks ``model.moe_top_k`` experts per
  token (Mixtral, Jiang et al. 2024 §2.1); tokens are permuted by expert, run through that expert's
  MLP, weighted by their renormalised router probabilities and scattered back (see :class:`MoE`).
  ``model.num_shared_experts`` > 0 adds DeepSeekMoE's always-active shared experts (DeepSeek-V3
  report, arXiv:2412.19437, §2.1.2: output = x + Σ shared + Σ gated routed), as one MLP of their total
  width (``model.shared_expert_ffn_hidden_size``, else num_shared_experts × moe_ffn_hidden_size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..engine.binding import get_path


@dataclass(frozen=True)
class Shape:
    """The model hyper-parameters the harness reads from a memform config dict (dense.mf's defaults)."""

    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    layers: int
    vocab: int
    seq: int
    activation: str = "gelu"
    norm: str = "layernorm"
    bias: bool = True
    dropout: bool = True
    flash: bool = False
    learned_pos: bool = True
    swiglu_impl: str = "fused"
    recompute: str = "none"
    experts: int = 1
    top_k: int = 1
    expert_ffn: int = 0
    shared_ffn: int = 0     # total width of the shared experts (0: none), moe.mf's f_sh
    #: weight each routed token by its router probability inside the expert MLP, before fc2, as
    #: Megatron-Core does (frameworks/megatron/moe.mf), instead of at the combine (moe.mf)
    probs_in_experts: bool = False
    attention: str = "mha"  # "mla": multi-head latent attention (mla.mf), with the five widths below
    q_rank: int = 0         # query latent d_c' (0: queries projected directly, DeepSeek-V2-Lite)
    kv_rank: int = 0        # key/value latent d_c
    d_rope: int = 0         # decoupled rotary head dimension d_h^R
    d_nope: int = 0         # per-head query/key dimension without rope d_h
    d_v: int = 0            # per-head value dimension

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "Shape":
        m = lambda key, default=None: get_path(cfg, f"model.{key}", default)  # noqa: E731
        if m("tied_embeddings", False):
            raise ValueError("the PyTorch harness builds untied output heads only (model.tied_embeddings: false)")
        if m("cross_entropy", "fused") != "eager":
            raise ValueError("the PyTorch harness's loss is F.cross_entropy: set model.cross_entropy: eager")
        if m("dropout", True) and m("flash_attention", False):
            raise ValueError("PyTorch's CPU flash attention has no dropout (it falls back to the unfused fp32 "
                             "path): use model.dropout: false or model.flash_attention: false")
        for key, default, allowed in (("norm", "layernorm", ("layernorm", "rmsnorm")),
                                      ("activation", "gelu", ("gelu", "swiglu")),
                                      ("position_embedding", "learned", ("learned", "rope"))):
            if m(key, default) not in allowed:
                raise ValueError(f"model.{key} must be one of {', '.join(allowed)}, got {m(key)!r}")
        h, a = int(m("hidden_size")), int(m("num_heads"))
        mla = _mla_widths(m, h // a)
        experts = int(m("num_experts", 1) or 1)
        expert_ffn = int(m("moe_ffn_hidden_size", m("ffn_hidden_size", 4 * h)))
        if m("shared_expert_gate", False):
            raise ValueError("the PyTorch harness's shared experts are DeepSeekMoE's, ungated "
                             "(model.shared_expert_gate: false)")
        # moe.mf's f_sh: the total width if given (Qwen2-MoE / Megatron-LM), else n_shared experts of f_exp
        shared_ffn = (int(m("shared_expert_ffn_hidden_size", 0) or 0)
                      or int(m("num_shared_experts", 0) or 0) * expert_ffn)
        # the megatron profile (the default) weights inside the experts unless megatron.moe_probs_in_experts
        # says otherwise; every other profile at the combine
        in_experts = (get_path(cfg, "training.framework", "megatron") == "megatron"
                      and bool(get_path(cfg, "megatron.moe_probs_in_experts", True)))
        return cls(hidden=h, heads=a, kv_heads=int(m("num_kv_heads", a)), ffn=int(m("ffn_hidden_size", 4 * h)),
                   layers=int(m("num_layers")), vocab=int(m("vocab_size")), seq=int(m("seq_length")),
                   activation=str(m("activation", "gelu")), norm=str(m("norm", "layernorm")),
                   bias=bool(m("bias", True)), dropout=bool(m("dropout", True)),
                   flash=bool(m("flash_attention", False)),
                   learned_pos=m("position_embedding", "learned") == "learned",
                   swiglu_impl=str(m("swiglu_impl", "fused")),
                   recompute=str(get_path(cfg, "training.recompute", "none")), experts=experts,
                   top_k=int(m("moe_top_k", 2)) if experts > 1 else 1,
                   expert_ffn=expert_ffn, shared_ffn=shared_ffn if experts > 1 else 0,
                   probs_in_experts=in_experts and experts > 1, **mla)


def _mla_widths(m, head_dim: int) -> dict[str, Any]:  # noqa: ANN001
    """The MLA fields of :class:`Shape` from mla.mf's keys (its defaults: d_h = d_v = h / a, d_c' = 0)."""
    attention = str(m("attention", "mha"))
    if attention not in ("mha", "mla"):
        raise ValueError(f"model.attention must be one of mha, mla, got {attention!r}")
    if attention == "mha":
        return {}
    if m("bias", True):
        raise ValueError("the PyTorch harness's MLA has no biases, as DeepSeek-V2 (model.bias: false)")
    if m("position_embedding", "learned") != "rope":
        raise ValueError("MLA's decoupled rotary key (DeepSeek-V2 §2.1.3) needs model.position_embedding: rope")
    d_rope = int(m("qk_rope_head_dim"))
    if d_rope <= 0 or d_rope % 2:
        raise ValueError(f"model.qk_rope_head_dim must be even and positive for rotary pairs, got {d_rope}")
    return {"attention": attention, "q_rank": int(m("q_lora_rank", 0) or 0), "kv_rank": int(m("kv_lora_rank")),
            "d_rope": d_rope, "d_nope": int(m("qk_nope_head_dim", head_dim)), "d_v": int(m("v_head_dim", head_dim))}


#: dropout probability (its value does not change what is stored)
DROPOUT_P = 0.1


def dropout(x: torch.Tensor, on: bool) -> torch.Tensor:
    """ATen's fused dropout (``native_dropout``): keeps a 1-byte bool mask, like Megatron's kernels.

    ``F.dropout`` on the CPU is composite and would keep a mask of the input's dtype instead.
    """
    return torch.native_dropout(x, DROPOUT_P, True)[0] if on else x


def make_norm(sh: Shape) -> nn.Module:
    """RMSNorm (weight) or LayerNorm (weight + bias; ATen's kernel keeps input, fp32 mean and 1/std)."""
    return RMSNorm(sh.hidden) if sh.norm == "rmsnorm" else nn.LayerNorm(sh.hidden)


def _acc(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the accumulation precision of the fused kernels: fp32, or wider if it already is."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


#: rows per block of the fused kernels' backward (see :func:`_by_rows`)
FUSED_ROWS = 4


def _by_rows(fn, out: torch.Tensor, *inputs: torch.Tensor) -> None:  # noqa: ANN001
    """Run an element-wise backward ``fn(out_rows, *input_rows)`` over blocks of ``FUSED_ROWS`` rows.

    A fused kernel (Megatron's bias_swiglu / apex's RMSNorm backward) computes in fp32 registers and
    allocates only its output; done in eager PyTorch over the whole tensor, every fp32 intermediate
    would be a tensor-sized allocation that no real framework makes. Block-wise, the intermediates are
    ``FUSED_ROWS`` rows wide (the measured backward peak sees that small remainder).
    """
    for start in range(0, out.shape[0], FUSED_ROWS):
        sl = slice(start, start + FUSED_ROWS)
        fn(out[sl], *(t[sl] for t in inputs))


class _RMSNormFn(torch.autograd.Function):
    """y = x / rms(x) * w, keeping x and the fp32 1/rms per row (like apex/TE fused RMSNorm)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:  # noqa: ANN001
        xf = _acc(x)
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, w, rstd)
        return (xf * rstd).to(x.dtype) * w

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # noqa: ANN001, ANN205
        x, w, rstd = ctx.saved_tensors
        h = x.shape[-1]
        dx = torch.empty_like(x)
        dw = torch.zeros(h, dtype=_acc(w).dtype)

        def rows(out: torch.Tensor, xr: torch.Tensor, dyr: torch.Tensor, rr: torch.Tensor) -> None:
            xhat = _acc(xr) * rr
            dyw = _acc(dyr) * _acc(w)
            out.copy_(rr * (dyw - xhat * (dyw * xhat).mean(-1, keepdim=True)))
            dw.add_((_acc(dyr) * xhat).sum(0))

        _by_rows(rows, dx.view(-1, h), x.reshape(-1, h), dy.reshape(-1, h), rstd.reshape(-1, 1))
        return dx, dw.to(w.dtype), None


class RMSNorm(nn.Module):
    def __init__(self, h: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNormFn.apply(x, self.weight, self.eps)


class _SwiGLUFn(torch.autograd.Function):
    """silu(a) * b over the concatenated [a | b] GEMM output, keeping only that input."""

    @staticmethod
    def forward(ctx, ab: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(ab)
        a, b = ab.chunk(2, dim=-1)
        return F.silu(a) * b

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # noqa: ANN001, ANN205
        (ab,) = ctx.saved_tensors
        two_f = ab.shape[-1]
        dab = torch.empty_like(ab)

        def rows(out: torch.Tensor, abr: torch.Tensor, dyr: torch.Tensor) -> None:
            a, b = _acc(abr).chunk(2, dim=-1)
            sig = torch.sigmoid(a)
            dyf = _acc(dyr)
            out.copy_(torch.cat([dyf * b * sig * (1 + a * (1 - sig)), dyf * a * sig], dim=-1))

        _by_rows(rows, dab.view(-1, two_f), ab.reshape(-1, two_f), dy.reshape(-1, two_f // 2))
        return dab


class _WeightedSwiGLUFn(torch.autograd.Function):
    """(silu(a) * b) · w per row, keeping only [a | b] and w (Megatron-Core weighted_bias_swiglu_impl)."""

    @staticmethod
    def forward(ctx, ab: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(ab, w)
        a, b = ab.chunk(2, dim=-1)
        return F.silu(a) * b * w

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # noqa: ANN001, ANN205
        ab, w = ctx.saved_tensors
        two_f = ab.shape[-1]
        dab, dw = torch.empty_like(ab), torch.empty_like(w)

        def rows(out: torch.Tensor, abr: torch.Tensor, dyr: torch.Tensor, wr: torch.Tensor,
                 dwr: torch.Tensor) -> None:
            a, b = _acc(abr).chunk(2, dim=-1)
            sig = torch.sigmoid(a)
            dyf = _acc(dyr)
            dwr.copy_((dyf * a * sig * b).sum(-1, keepdim=True))
            dyf = dyf * _acc(wr)
            out.copy_(torch.cat([dyf * b * sig * (1 + a * (1 - sig)), dyf * a * sig], dim=-1))

        _by_rows(rows, dab.view(-1, two_f), ab.reshape(-1, two_f), dy.reshape(-1, two_f // 2),
                 w.reshape(-1, 1), dw.view(-1, 1))
        return dab, dw


class SwiGLU(nn.Module):
    """gate/up h×f, down f×h (Shazeer 2020); ``impl`` chooses what is kept for backward."""

    def __init__(self, h: int, f: int, impl: str, bias: bool = False):
        super().__init__()
        if impl not in ("fused", "eager"):
            raise ValueError(f"model.swiglu_impl must be 'fused' or 'eager', got {impl!r}")
        self.impl = impl
        if impl == "fused":
            self.gate_up = nn.Linear(h, 2 * f, bias=bias)
        else:
            self.gate = nn.Linear(h, f, bias=bias)
            self.up = nn.Linear(h, f, bias=bias)
        self.down = nn.Linear(f, h, bias=bias)

    def forward(self, x: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
        """``w``: one weight per row, applied to the activation's output before fc2 (Megatron-Core's
        per_token_scale: transformer/mlp.py MLP.forward; fused, moe/experts.py weighted_bias_swiglu)."""
        if self.impl == "fused":
            if w is not None:
                return self.down(_WeightedSwiGLUFn.apply(self.gate_up(x), w))
            return self.down(_SwiGLUFn.apply(self.gate_up(x)))
        y = F.silu(self.gate(x)) * self.up(x)
        return self.down(y if w is None else y * w)


class GeLUMLP(nn.Module):
    """fc1 h×f, GeLU (keeps its input, as Megatron's fused bias_gelu does), fc2 f×h (keeps the GeLU output)."""

    def __init__(self, h: int, f: int, bias: bool):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(h, f, bias=bias), nn.Linear(f, h, bias=bias)

    def forward(self, x: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
        """``w``: per-row weights on the GeLU output (Megatron-Core's unfused per_token_scale product)."""
        y = F.gelu(self.fc1(x))
        return self.fc2(y if w is None else y * w)


def make_mlp(sh: Shape, f: int) -> nn.Module:
    if sh.activation == "swiglu":
        return SwiGLU(sh.hidden, f, sh.swiglu_impl, sh.bias)
    if sh.activation == "gelu":
        return GeLUMLP(sh.hidden, f, sh.bias)
    raise ValueError(f"model.activation must be 'gelu' or 'swiglu', got {sh.activation!r}")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class Attention(nn.Module):
    def __init__(self, sh: Shape):
        super().__init__()
        self.sh = sh
        d = sh.head_dim
        self.q = nn.Linear(sh.hidden, sh.heads * d, bias=sh.bias)
        self.k = nn.Linear(sh.hidden, sh.kv_heads * d, bias=sh.bias)
        self.v = nn.Linear(sh.hidden, sh.kv_heads * d, bias=sh.bias)
        self.o = nn.Linear(sh.heads * d, sh.hidden, bias=sh.bias)
        # rotary tables (Su et al. 2021, RoFormer §3.4.2) and the causal mask are constant buffers
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
        ang = torch.outer(torch.arange(sh.seq).float(), inv)
        ang = torch.cat([ang, ang], dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)
        group = sh.heads // sh.kv_heads
        mask = torch.ones(sh.seq, sh.seq, dtype=torch.bool).triu(1)
        self.register_buffer("mask", mask.repeat(group, 1), persistent=False)  # rows: (head in group, query)

    def rope(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.sh.learned_pos else x * self.cos + _rotate_half(x) * self.sin

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Unfused causal attention; q [b,a,s,d], k/v [b,g,s,d] -> [b,a,s,d]."""
        b, a, s, d = q.shape
        g = k.shape[1]
        qg = q.reshape(b, g, (a // g) * s, d)      # a view: query heads grouped per KV head
        scores = (qg @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        probs = torch.softmax(scores.masked_fill(self.mask, float("-inf")), dim=-1)
        return (dropout(probs, self.sh.dropout) @ v).view(b, a, s, v.shape[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        sh, d = self.sh, self.sh.head_dim
        # [b, s, heads, d] memory viewed as [b, heads, s, d]: the flash kernel then writes its output in
        # [b, s, h] order, so the output projection's input is a view of the kept output, not a copy
        # (Megatron's [s, b, h] layout has the same property). The unfused core groups query heads by
        # KV head with a view, which needs [b, heads, s, d] memory.
        q = self.q(x).view(b, s, sh.heads, d).transpose(1, 2)
        k = self.k(x).view(b, s, sh.kv_heads, d).transpose(1, 2)
        if not sh.flash:
            q, k = q.contiguous(), k.contiguous()
        q, k = self.rope(q), self.rope(k)
        v = self.v(x).view(b, s, sh.kv_heads, d).transpose(1, 2)
        if sh.flash:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=sh.kv_heads != sh.heads)
        elif sh.recompute == "selective":
            out = checkpoint(self.core, q, k, v, use_reentrant=False, preserve_rng_state=sh.dropout)
        else:
            out = self.core(q, k, v)
        return dropout(self.o(out.transpose(1, 2).reshape(b, s, sh.heads * d)), sh.dropout)


class _FlashDiffVFn(torch.autograd.Function):
    """Causal flash attention whose value head dimension d_v differs from the query/key one (MLA).

    PyTorch's CPU flash kernel takes one head size for Q, K and V (``F.scaled_dot_product_attention``
    falls back to its unfused fp32 path when they differ, which keeps an fp32 a·s² softmax and fp32
    copies of Q, K, V); the GPU kernels Megatron-LM uses for MLA take k_channels ≠ v_channels
    (``MLASelfAttention`` builds its core attention so and pads V only for the packed THD format). This
    stand-in keeps what such a kernel keeps -- Q, K, V at their own widths, the output at d_v and the
    fp32 log-sum-exp (Dao et al. 2022 §3.1) -- and runs the CPU kernel with the narrower of Q/K and V
    zero-padded to the wider head size, inside forward and inside backward only: zero columns change
    neither q·k nor the used output columns (the scale stays 1/sqrt(d_h + d_h^R)), and the padded
    tensors, the padded output and the padded gradients are transients, never saved. The output comes
    back in [b, s, heads, d_v] memory (as the CPU kernel's does for [b, s, heads, d] queries), so the
    output projection's input is a view of the kept output.
    """

    @staticmethod
    def _padded(width: int, *ts: torch.Tensor) -> list[torch.Tensor]:
        return [F.pad(t, (0, width - t.shape[-1])) if t.shape[-1] < width else t for t in ts]

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        width, d_v = max(q.shape[-1], v.shape[-1]), v.shape[-1]
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            *_FlashDiffVFn._padded(width, q, k, v), 0.0, True, scale=q.shape[-1] ** -0.5)
        out = out.transpose(1, 2)[..., :d_v].contiguous().transpose(1, 2)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):  # noqa: ANN001, ANN205
        q, k, v, out, lse = ctx.saved_tensors
        width = max(q.shape[-1], v.shape[-1])
        dpad, qp, kp, vp, opad = _FlashDiffVFn._padded(width, dout, q, k, v, out)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dpad, qp, kp, vp, opad, lse, 0.0, True, scale=q.shape[-1] ** -0.5)
        return dq[..., :q.shape[-1]], dk[..., :k.shape[-1]], dv[..., :v.shape[-1]]


class MLAttention(nn.Module):
    """Multi-head latent attention, DeepSeek-V2 (arXiv:2405.04434) §2.1.2-2.1.3, eqs. (9)-(19), built as
    Megatron-LM's ``MLASelfAttention`` builds it (no biases):

    - queries: W^DQ h -> d_c', an RMSNorm on the latent c^Q and W^UQ/W^QR d_c' -> n_h·(d_h + d_h^R)
      (eqs. 12-13, 15, one GEMM for both), or, with ``q_rank`` 0 (DeepSeek-V2-Lite), one h -> n_h·(d_h +
      d_h^R) projection (``linear_q_proj``);
    - keys/values: W^DKV and W^KR as one h -> d_c + d_h^R GEMM (``linear_kv_down_proj``), split into the
      latent c^KV (eq. 9) and the rotary key k^R (eq. 14, one per token, shared by all heads); an RMSNorm
      on c^KV and W^UK/W^UV d_c -> n_h·(d_h + d_v) (eqs. 10-11, ``linear_kv_up_proj``);
    - RoPE on q^R and k^R only (the decoupled rotary part, §2.1.3; rotate-half pairing, as the harness's
      other RoPE -- Megatron's interleaved pairing permutes elements, it keeps no other tensor);
    - q = [q^C, q^R], k = [k^C, k^R broadcast to every head] (eqs. 16-17), V contiguous (Megatron makes
      query, key and value contiguous for the core), the causal core over head dim d_h + d_h^R with
      scale 1/sqrt(d_h + d_h^R), values at d_v (eq. 18): flash (``F.scaled_dot_product_attention``, or
      :class:`_FlashDiffVFn` when d_v ≠ d_h + d_h^R) or the unfused core of :class:`Attention`, checkpointed
      under selective recompute;
    - W^O n_h·d_v -> h (eq. 19), dropout.

    What autograd keeps is then what Megatron's kernels keep: the layer input (read by both down
    projections), the query latent before and after its norm, the down projection's [c^KV | k^R] output
    (the kv norm's input is a view of it, so its storage, d_c + d_h^R wide, is what stays) and the
    normalised c^KV, Q and K at n_h·(d_h + d_h^R), V at n_h·d_v, the core's kept tensors and the output.
    Each latent RMSNorm also keeps its fp32 1/rms per token, as the block's norms do.
    """

    #: the unfused causal core of :class:`Attention`, with one KV head per query head (MHA-like)
    core = Attention.core

    def __init__(self, sh: Shape):
        super().__init__()
        self.sh = sh
        a, q_dim = sh.heads, sh.d_nope + sh.d_rope
        if sh.q_rank > 0:
            self.q_down = nn.Linear(sh.hidden, sh.q_rank, bias=False)
            self.q_norm = RMSNorm(sh.q_rank)
            self.q_up = nn.Linear(sh.q_rank, a * q_dim, bias=False)
        else:
            self.q_up = nn.Linear(sh.hidden, a * q_dim, bias=False)
        self.kv_down = nn.Linear(sh.hidden, sh.kv_rank + sh.d_rope, bias=False)
        self.kv_norm = RMSNorm(sh.kv_rank)
        self.kv_up = nn.Linear(sh.kv_rank, a * (sh.d_nope + sh.d_v), bias=False)
        self.o = nn.Linear(a * sh.d_v, sh.hidden, bias=False)
        # rotary tables over d_h^R for [b, s, heads, d_h^R] tensors (RoFormer §3.4.2), causal mask (one group)
        inv = 1.0 / (10000 ** (torch.arange(0, sh.d_rope, 2).float() / sh.d_rope))
        ang = torch.outer(torch.arange(sh.seq).float(), inv)
        ang = torch.cat([ang, ang], dim=-1).unsqueeze(1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)
        self.register_buffer("mask", torch.ones(sh.seq, sh.seq, dtype=torch.bool).triu(1), persistent=False)

    def rope(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.cos + _rotate_half(x) * self.sin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        sh, a = self.sh, self.sh.heads
        c_q = self.q_norm(self.q_down(x)) if sh.q_rank > 0 else x
        q_nope, q_rope = self.q_up(c_q).view(b, s, a, sh.d_nope + sh.d_rope).split([sh.d_nope, sh.d_rope], dim=-1)
        c_kv, k_rope = self.kv_down(x).split([sh.kv_rank, sh.d_rope], dim=-1)
        kv = self.kv_up(self.kv_norm(c_kv)).view(b, s, a, sh.d_nope + sh.d_v)
        k_nope, v = kv.split([sh.d_nope, sh.d_v], dim=-1)
        q = torch.cat([q_nope, self.rope(q_rope)], dim=-1)
        k = torch.cat([k_nope, self.rope(k_rope.unsqueeze(2)).expand(b, s, a, sh.d_rope)], dim=-1)
        if sh.flash:   # [b, s, heads, d] memory seen as [b, heads, s, d], as in Attention.forward
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.contiguous().transpose(1, 2)
            if sh.d_v == sh.d_nope + sh.d_rope:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                out = _FlashDiffVFn.apply(q, k, v)
        else:          # the unfused core views [b, heads, s, d] memory
            q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
            if sh.recompute == "selective":
                out = checkpoint(self.core, q, k, v, use_reentrant=False, preserve_rng_state=sh.dropout)
            else:
                out = self.core(q, k, v)
        return dropout(self.o(out.transpose(1, 2).reshape(b, s, a * sh.d_v)), sh.dropout)


class MoE(nn.Module):
    """Top-k routed SwiGLU experts, dropless, routed the way Megatron-LM's token dispatcher does it.

    Router: softmax over the experts in fp32, top-k, renormalised (Mixtral, Jiang et al. 2024 §2.1).
    Tokens are permuted so each expert's tokens are contiguous (one gathered copy, k·T rows), every expert
    runs on its slice, the concatenated outputs are multiplied by their router weights and scattered back
    with ``scatter_add`` over an expanded index (a view), so only the index is kept for the combine —
    ``index_add`` would also keep its weighted source.

    Shared experts (``sh.shared_ffn`` > 0): every token also passes through them, ungated, and their
    output is added to the routed one (DeepSeek-V3 §2.1.2, eq. 12; DeepSeekMoE, Dai et al. 2024,
    arXiv:2401.06066, §3.2).
    The N_s experts of width f_exp are one MLP of width N_s·f_exp: the same GEMMs with their weights
    concatenated along f (Megatron-LM's SharedExpertMLP builds them so), and so the same saved tensors.
    They read the router's input, so they keep no input of their own.
    """

    def __init__(self, sh: Shape):
        super().__init__()
        self.top_k, self.n = sh.top_k, sh.experts
        self.in_experts = sh.probs_in_experts
        self.router = nn.Linear(sh.hidden, sh.experts, bias=False)
        self.experts = nn.ModuleList(make_mlp(sh, sh.expert_ffn) for _ in range(sh.experts))
        self.shared = make_mlp(sh, sh.shared_ffn) if sh.shared_ffn else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = torch.softmax(self.router(x).float(), dim=-1)
        weight, chosen = probs.topk(self.top_k, dim=-1)
        weight = weight / weight.sum(-1, keepdim=True)
        order = chosen.flatten().argsort(stable=True)           # (token, slot) pairs sorted by expert
        token = order // self.top_k
        counts = torch.bincount(chosen.flatten(), minlength=self.n).tolist()
        permuted = x.index_select(0, token)
        if self.in_experts:  # Megatron-Core: the probabilities scale the activation, the combine only scatters
            w = weight.flatten().index_select(0, order).to(x.dtype)
            outs = [expert(part, pw.unsqueeze(-1)) for expert, part, pw
                    in zip(self.experts, permuted.split(counts), w.split(counts)) if part.shape[0]]
            y = torch.cat(outs)
        else:
            outs = [expert(part) for expert, part in zip(self.experts, permuted.split(counts)) if part.shape[0]]
            w = weight.flatten().index_select(0, order).to(x.dtype)
            y = torch.cat(outs) * w.unsqueeze(-1)
        out = x.new_zeros(x.shape).scatter_add(0, token.unsqueeze(-1).expand(-1, x.shape[-1]), y)
        if self.shared is not None:
            out = out + self.shared(x)
        return out.view(shape)


class Block(nn.Module):
    def __init__(self, sh: Shape):
        super().__init__()
        self.sh = sh
        self.norm1, self.norm2 = make_norm(sh), make_norm(sh)
        self.attn = MLAttention(sh) if sh.attention == "mla" else Attention(sh)
        self.mlp = MoE(sh) if sh.experts > 1 else make_mlp(sh, sh.ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + dropout(self.mlp(self.norm2(x)), self.sh.dropout)


class Decoder(nn.Module):
    """Embedding (+ learned positions), ``L`` pre-norm blocks, final norm, untied head, fp32 cross-entropy."""

    def __init__(self, sh: Shape):
        super().__init__()
        self.sh = sh
        self.embed = nn.Embedding(sh.vocab, sh.hidden)
        if sh.learned_pos:
            self.pos = nn.Embedding(sh.seq, sh.hidden)
            self.register_buffer("positions", torch.arange(sh.seq), persistent=False)
        self.blocks = nn.ModuleList(Block(sh) for _ in range(sh.layers))
        self.norm = make_norm(sh)
        self.head = nn.Linear(sh.hidden, sh.vocab, bias=False)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        if self.sh.learned_pos:
            x = x + self.pos(self.positions)
        x = dropout(x, self.sh.dropout)
        for blk in self.blocks:
            if self.sh.recompute == "full":
                x = checkpoint(blk, x, use_reentrant=False, preserve_rng_state=self.sh.dropout)
            else:
                x = blk(x)
        logits = self.head(self.norm(x)).float()
        return F.cross_entropy(logits.view(-1, self.sh.vocab), labels.view(-1))


def build(cfg: Mapping[str, Any], dtype: torch.dtype, seed: int = 0) -> Decoder:
    """A randomly initialised model for ``cfg`` with parameters (and buffers) in ``dtype``."""
    torch.manual_seed(seed)
    return Decoder(Shape.from_config(cfg)).to(dtype)
