"""The harness model (:mod:`.torch_models`) cut or spread over ranks, for :mod:`.distributed`.

- :class:`Piece`: a contiguous run of the decoder's blocks, with the embedding when it is the first
  piece and the final norm + head when it is the last (a ``torch.distributed.pipelining`` stage module);
  the last piece returns the fp32 logits, the loss is the schedule's ``loss_fn`` (:func:`pipeline_loss`).
- :class:`ExpertParallelMoE`: the harness's :class:`~.torch_models.MoE` with its experts split over the
  ranks, tokens dispatched to the rank of their expert and combined back with autograd
  ``all_to_all_single`` (Megatron-LM's all-to-all token dispatcher, one local expert per rank).
- :func:`localise_attention`: after DTensor tensor parallelism shards the Q/K/V projections, each rank's
  attention runs on its heads only (torchtitan reshapes with ``-1`` heads for the same reason).
"""

from __future__ import annotations

import warnings

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .torch_models import Decoder, MoE, dropout


class Piece(nn.Module):
    """Blocks ``lo .. hi - 1`` of ``dec`` (+ embedding when ``first``, + final norm and head when ``last``)."""

    def __init__(self, dec: Decoder, lo: int, hi: int, first: bool, last: bool):
        super().__init__()
        self.sh, self.first, self.last = dec.sh, first, last
        if first:
            self.embed = dec.embed
            if dec.sh.learned_pos:
                self.pos = dec.pos
                self.register_buffer("positions", dec.positions, persistent=False)
        self.blocks = nn.ModuleList(dec.blocks[lo:hi])
        if last:
            self.norm, self.head = dec.norm, dec.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            ids = x
            x = self.embed(ids)
            if self.sh.learned_pos:
                x = x + self.pos(self.positions)
            x = dropout(x, self.sh.dropout)
        for blk in self.blocks:
            if self.sh.recompute == "full":
                x = checkpoint(blk, x, use_reentrant=False, preserve_rng_state=self.sh.dropout)
            else:
                x = blk(x)
        if self.last:
            return self.head(self.norm(x)).float()
        return x


def pipeline_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The harness's loss (eager fp32 cross-entropy over the vocabulary) as a pipeline ``loss_fn``."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def pieces(dec: Decoder, n: int) -> list[Piece]:
    """``dec`` cut into ``n`` pieces of equal numbers of blocks (memform's even split of the body)."""
    L = len(dec.blocks)
    if L % n:
        raise ValueError(f"{L} layers do not split into {n} pipeline pieces")
    k = L // n
    return [Piece(dec, i * k, (i + 1) * k, i == 0, i == n - 1) for i in range(n)]


class ExpertParallelMoE(nn.Module):
    """:class:`~.torch_models.MoE` with expert ``rank`` on each of ``world`` ranks (one local expert).

    Router and routing are the harness's (softmax in fp32, top-k, renormalised, tokens permuted by expert);
    the permuted rows are sent to their expert's rank with ``all_to_all_single`` (the *dispatch* buffer,
    which the local expert's first GEMM keeps as its input), the expert's output rows go back the same way
    (the *combine* buffer, kept by the multiplication with the router weights) and are scattered into
    place. ``buffers`` collects every all-to-all output storage, for the measurement.
    """

    def __init__(self, moe: MoE, rank: int, world: int, group=None):  # noqa: ANN001
        super().__init__()
        if moe.n != world:
            raise ValueError(f"ExpertParallelMoE holds one expert per rank: {moe.n} experts on {world} ranks")
        if moe.shared is not None:  # not carried over: it would be dropped silently
            raise ValueError("ExpertParallelMoE has no shared experts (model.num_shared_experts must be 0)")
        self.top_k, self.n, self.rank, self.world, self.group = moe.top_k, moe.n, rank, world, group
        self.router = moe.router
        self.expert = moe.experts[rank]
        self.buffers: list[torch.Tensor] = []

    def _a2a(self, x: torch.Tensor, out_rows: list[int], in_rows: list[int]) -> torch.Tensor:
        from torch.distributed.nn.functional import all_to_all_single

        out = x.new_empty((sum(out_rows), x.shape[-1]))
        self.buffers.append(out)
        # the autograd-aware collective writing into a buffer we allocate (and so can measure); torch 2.13
        # marks it deprecated in favour of _functional_collectives, whose output torch allocates itself
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return all_to_all_single(out, x, out_rows, in_rows, group=self.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = torch.softmax(self.router(x).float(), dim=-1)
        weight, chosen = probs.topk(self.top_k, dim=-1)
        weight = weight / weight.sum(-1, keepdim=True)
        order = chosen.flatten().argsort(stable=True)
        token = order // self.top_k
        counts = torch.bincount(chosen.flatten(), minlength=self.n)
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=self.group)   # rows each rank sends to me
        send, recv = counts.tolist(), recv_counts.tolist()
        permuted = x.index_select(0, token)
        mine = self._a2a(permuted, recv, send)                # dispatch
        back = self._a2a(self.expert(mine), send, recv)       # combine
        w = weight.flatten().index_select(0, order).to(x.dtype)
        y = back * w.unsqueeze(-1)
        out = x.new_zeros(x.shape).scatter_add(0, token.unsqueeze(-1).expand(-1, x.shape[-1]), y)
        return out.view(shape)


def expert_parallel(dec: Decoder, rank: int, world: int, group=None) -> list[ExpertParallelMoE]:  # noqa: ANN001
    """Replace every block's MoE by its expert-parallel form (in place); returns the new modules."""
    out = []
    for blk in dec.blocks:
        if not isinstance(blk.mlp, MoE):
            raise ValueError("expert_parallel needs a MoE model (model.num_experts > 1)")
        blk.mlp = ExpertParallelMoE(blk.mlp, rank, world, group)
        out.append(blk.mlp)
    return out


def localise_attention(dec: Decoder, t: int) -> None:
    """Each attention module computes with ``heads / t`` query and ``kv_heads / t`` KV heads (same head
    dimension), as its column-parallel Q/K/V shards give it."""
    for blk in dec.blocks:
        sh = blk.attn.sh
        blk.attn.sh = replace(sh, hidden=sh.hidden // t, heads=sh.heads // t, kv_heads=sh.kv_heads // t)
