"""REFERENCE COPY for tests/test_allocator.py: memform.allocator.caching as it was before it was made faster
(commit fee874b, one method per step of c10/cuda/CUDACachingAllocator.cpp). The fast model must replay every
sequence to the same figures as this one; do not edit it to follow a change of the model (change both, on purpose).

A model of PyTorch's CUDA caching allocator: what a sequence of tensor allocations *reserves*.

An out-of-memory error is raised when the allocator cannot reserve a new segment, not when the live
tensors exceed the device: ``torch.cuda.memory_reserved`` (segments obtained from ``cudaMalloc`` and
kept for reuse) is what must fit, and it is never below ``memory_allocated``. How far above depends on
the order and the sizes of the allocations, so this module replays them through the allocator's own
rules, as ``c10/cuda/CUDACachingAllocator.cpp`` (PyTorch 2.x, ``DeviceCachingAllocator``) writes them:

- every request is rounded up to a multiple of 512 bytes (``round_size``, ``kMinBlockSize``);
- requests up to 1 MiB (``kSmallSize``) come from the small pool, larger ones from the large pool
  (``get_pool``); blocks of one pool and one stream are never used for another;
- a request takes the smallest cached free block of its pool and stream that is large enough, the lowest
  address on ties (``get_free_block``: ``pool.blocks.lower_bound``, ``BlockComparatorSize``); with
  ``max_split_size_mb`` set, a block at least that large serves no smaller request, and serves a larger
  one only when it exceeds the request by less than 20 MiB;
- when none fits, a new segment is reserved (``alloc_block``): 2 MiB (``kSmallBuffer``) for a small
  request, 20 MiB (``kLargeBuffer``) for one below 10 MiB (``kMinLargeAlloc``), else the request rounded
  up to 2 MiB (``kRoundLarge``, ``get_allocation_size``);
- the block is split when what is left over is worth keeping (``should_split``): at least 512 bytes in
  the small pool, more than 1 MiB in the large one (and only for requests below ``max_split_size_mb``);
  a whole unsplit block counts as allocated (``memory_allocated`` counts block sizes, not requests);
- a freed block merges with free neighbours of its segment (``free_block``, ``try_merge_blocks``);
  segments are returned to the device only when a ``cudaMalloc`` fails: first the cached oversize
  blocks (``release_available_cached_blocks``, with ``max_split_size_mb``), then every wholly free segment
  (``release_cached_blocks``), then the request is retried once, else it raises out of memory;
- with ``expandable_segments:True`` each pool and stream has one segment whose address range grows in
  pages of 2 MiB (small pool) or 20 MiB (large pool) (``ExpandableSegment``, ``try_allocate_expandable_block``):
  a request that no free block holds extends the segment's free tail instead of reserving a new segment,
  and any leftover of at least 512 bytes is split off.

Not modelled: CUDA graph private pools, ``garbage_collection_threshold``, ``roundup_power2_divisions``,
events that delay the reuse of a block freed while another stream still uses it (``record_stream``), and
the interior pages of free expandable blocks that a release unmaps (only the free tail is unmapped).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from itertools import count
from typing import Hashable, Iterable

KIB, MIB = 1024, 1024 ** 2
MIN_BLOCK = 512            # kMinBlockSize: all sizes are rounded to at least 512 bytes
SMALL_SIZE = 1 * MIB       # kSmallSize: the largest "small" allocation
SMALL_BUFFER = 2 * MIB     # kSmallBuffer: small allocations are packed in 2 MiB segments
LARGE_BUFFER = 20 * MIB    # kLargeBuffer: allocations between 1 and 10 MiB share 20 MiB segments
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc
ROUND_LARGE = 2 * MIB      # kRoundLarge: larger segments are rounded up to 2 MiB


@dataclass(frozen=True)
class AllocatorConfig:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` settings the model follows (PyTorch's defaults when left out)."""

    expandable_segments: bool = False
    #: ``max_split_size_mb`` in bytes; None: unlimited (the default: every block may be split)
    max_split_size: int | None = None
    #: bytes the allocator may reserve (the device's free memory); None: unbounded
    capacity: int | None = None

    def split_limit(self) -> int:
        return self.max_split_size if self.max_split_size is not None else 2 ** 63


class OutOfMemory(Exception):
    """A request that no cached block, new segment or release of cached segments can satisfy."""

    def __init__(self, size: int, reserved: int, allocated: int, capacity: int) -> None:
        super().__init__(f"tried to allocate {size} bytes with {reserved} reserved, {allocated} allocated "
                         f"of {capacity}")
        self.size, self.reserved, self.allocated, self.capacity = size, reserved, allocated, capacity


@dataclass(eq=False)
class _Block:
    ptr: int
    size: int
    segment: "_Segment"
    allocated: bool = False
    requested: int = 0
    prev: "_Block | None" = None
    next: "_Block | None" = None

    def key(self) -> tuple[int, int]:
        return (self.size, self.ptr)


@dataclass(eq=False)
class _Segment:
    base: int
    size: int                 # reserved bytes (mapped bytes for an expandable segment)
    pool: "_Pool"
    expandable: bool = False
    #: the block at the segment's highest address (an expandable segment grows there)
    last: "_Block | None" = None


@dataclass(eq=False)
class _Pool:
    """One stream's small or large pool: its free blocks sorted by (size, address)."""

    small: bool
    free: list[tuple[int, int]] = field(default_factory=list)
    blocks: dict[tuple[int, int], _Block] = field(default_factory=dict)
    expandable: _Segment | None = None

    def insert(self, b: _Block) -> None:
        k = b.key()
        bisect.insort(self.free, k)
        self.blocks[k] = b

    def remove(self, b: _Block) -> None:
        k = b.key()
        i = bisect.bisect_left(self.free, k)
        del self.free[i]
        del self.blocks[k]


def round_size(size: int) -> int:
    """``round_size``: a multiple of 512 bytes, at least 512."""
    return max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment ``cudaMalloc`` reserves for a request no cached block holds."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class CachingAllocator:
    """Replays ``malloc`` / ``free`` through the allocator's rules; tracks what is requested, allocated
    (block bytes, as ``torch.cuda.memory_allocated``) and reserved (segments), and their peaks."""

    def __init__(self, config: AllocatorConfig = AllocatorConfig()) -> None:
        self.config = config
        self._pools: dict[tuple[Hashable, bool], _Pool] = {}
        self._segments: list[_Segment] = []
        self._live: dict[Hashable, _Block] = {}
        self._addr = count(0)
        self._next_base = 0
        self.requested = self.allocated = self.reserved = 0
        self.peak_requested = self.peak_allocated = self.peak_reserved = 0
        self.segments_created = 0
        self.releases = 0

    # ---- the public protocol ---------------------------------------------------------------------
    def malloc(self, key: Hashable, nbytes: int, stream: Hashable = 0) -> None:
        """Allocate ``nbytes`` under ``key`` on ``stream``; raises :class:`OutOfMemory`."""
        if key in self._live:
            raise ValueError(f"allocation {key!r} is already live")
        size = round_size(nbytes)
        pool = self._pool(stream, size <= SMALL_SIZE)
        block = self._free_block(pool, size)
        if block is None:
            block = self._new_block(pool, size)
        self._use(pool, block, size)
        block.allocated, block.requested = True, nbytes
        self._live[key] = block
        self.requested += nbytes
        self.allocated += block.size
        self.peak_requested = max(self.peak_requested, self.requested)
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key: Hashable) -> None:
        block = self._live.pop(key)
        self.requested -= block.requested
        self.allocated -= block.size
        block.allocated, block.requested = False, 0
        pool = block.segment.pool
        for other in (block.prev, block.next):
            if other is not None and not other.allocated:
                pool.remove(other)
                if other is block.prev:
                    block.ptr, block.prev = other.ptr, other.prev
                    if other.prev is not None:
                        other.prev.next = block
                else:
                    block.next = other.next
                    if other.next is not None:
                        other.next.prev = block
                    if block.segment.last is other:
                        block.segment.last = block
                block.size += other.size
        pool.insert(block)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache``: release every wholly free segment."""
        self._release_cached()

    @property
    def live(self) -> int:
        return len(self._live)

    # ---- internals -------------------------------------------------------------------------------
    def _pool(self, stream: Hashable, small: bool) -> _Pool:
        key = (stream, small)
        if key not in self._pools:
            self._pools[key] = _Pool(small)
        return self._pools[key]

    def _free_block(self, pool: _Pool, size: int) -> _Block | None:
        """``get_free_block``: best fit among the pool's cached blocks, with ``max_split_size`` rules."""
        i = bisect.bisect_left(pool.free, (size, -1))
        if i == len(pool.free):
            return None
        block = pool.blocks[pool.free[i]]
        limit = self.config.split_limit()
        if size < limit <= block.size:
            return None        # an oversize block serves no small request
        if size >= limit and block.size >= size + LARGE_BUFFER:
            return None        # nor a large request it exceeds by a whole large buffer
        pool.remove(block)
        return block

    def _new_block(self, pool: _Pool, size: int) -> _Block:
        """``alloc_block`` with the two release-and-retry steps of ``malloc``."""
        for attempt in range(3):
            block = self._try_reserve(pool, size)
            if block is not None:
                return block
            if attempt == 0:
                if not self._release_oversize(size):
                    continue
            elif attempt == 1:
                self._release_cached()
        cap = self.config.capacity or 0
        raise OutOfMemory(size, self.reserved, self.allocated, cap)

    def _try_reserve(self, pool: _Pool, size: int) -> _Block | None:
        cap = self.config.capacity
        if self.config.expandable_segments:
            return self._extend(pool, size, cap)
        need = allocation_size(size)
        if cap is not None and self.reserved + need > cap:
            return None
        seg = _Segment(self._next_base, need, pool)
        self._next_base += need + ROUND_LARGE     # segments never touch: no merging across them
        self._add_segment(seg)
        seg.last = _Block(seg.base, need, seg)
        return seg.last

    def _extend(self, pool: _Pool, size: int, cap: int | None) -> _Block | None:
        """``try_allocate_expandable_block``: grow the pool's segment at its free tail, in whole pages."""
        page = SMALL_BUFFER if pool.small else LARGE_BUFFER
        seg = pool.expandable
        if seg is None:
            seg = _Segment(self._next_base, 0, pool, expandable=True)
            self._next_base += 2 ** 48            # a virtual range no device fills
            pool.expandable = seg
            self._segments.append(seg)
            self.segments_created += 1
        tail = seg.last
        have = tail.size if tail is not None and not tail.allocated else 0
        grow = -(-(size - have) // page) * page
        if cap is not None and self.reserved + grow > cap:
            return None
        seg.size += grow
        self.reserved += grow
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        if have:
            pool.remove(tail)
            tail.size += grow
            return tail
        block = _Block(seg.base + seg.size - grow, grow, seg, prev=tail)
        if tail is not None:
            tail.next = block
        seg.last = block
        return block

    def _add_segment(self, seg: _Segment) -> None:
        self._segments.append(seg)
        self.reserved += seg.size
        self.segments_created += 1
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def _use(self, pool: _Pool, block: _Block, size: int) -> None:
        """``alloc_found_block``: split off the remainder when ``should_split`` says it is worth keeping."""
        remaining = block.size - size
        if pool.small or self.config.expandable_segments:
            split = remaining >= MIN_BLOCK
        else:
            split = size < self.config.split_limit() and remaining > SMALL_SIZE
        if split:
            rest = _Block(block.ptr + size, remaining, block.segment, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            if block.segment.last is block:
                block.segment.last = rest
            pool.insert(rest)

    def _release_oversize(self, size: int) -> bool:
        """``release_available_cached_blocks``: with ``max_split_size`` set, free cached oversize
        segments (whole, unsplit blocks at least that large), the smallest sufficient one first."""
        limit = self.config.max_split_size
        if limit is None:
            return False
        freed = False
        for seg in sorted(self._segments, key=lambda s: s.size):
            # never an expandable segment (release_available_cached_blocks skips expandable_segment_ blocks;
            # release_block asserts it is not one): its free tail is only unmapped by release_cached_blocks
            if not seg.expandable and seg.size >= max(limit, size) and self._wholly_free(seg):
                self._drop(seg)
                freed = True
                break
        return freed

    def _release_cached(self) -> None:
        """``release_cached_blocks``: return every wholly free segment (an expandable one: its free tail)."""
        self.releases += 1
        for seg in list(self._segments):
            if seg.expandable:
                tail = seg.last
                if tail is not None and not tail.allocated:
                    seg.pool.remove(tail)
                    self.reserved -= tail.size
                    seg.size -= tail.size
                    seg.last = tail.prev
                    if tail.prev is not None:
                        tail.prev.next = None
            elif self._wholly_free(seg):
                self._drop(seg)

    def _wholly_free(self, seg: _Segment) -> bool:
        b = seg.pool.blocks.get((seg.size, seg.base))
        return b is not None and b.segment is seg and b.prev is None and b.next is None

    def _drop(self, seg: _Segment) -> None:
        b = seg.pool.blocks[(seg.size, seg.base)]
        seg.pool.remove(b)
        self._segments.remove(seg)
        self.reserved -= seg.size


@dataclass(frozen=True)
class Replay:
    """What a replayed sequence reached: requested (tensor bytes), allocated (block bytes) and reserved
    (segment bytes) peaks, the segments reserved, and whether a release had to run (capacity reached)."""

    peak_requested: int
    peak_allocated: int
    peak_reserved: int
    segments: int
    releases: int

    @property
    def reserve_ratio(self) -> float:
        return self.peak_reserved / self.peak_requested if self.peak_requested else 1.0


#: one event of a sequence: ("alloc", key, nbytes, stream) or ("free", key)
Event = tuple


def replay(events: Iterable[Event], config: AllocatorConfig = AllocatorConfig()) -> Replay:
    """Run ``events`` through a fresh :class:`CachingAllocator` (raises :class:`OutOfMemory`)."""
    a = CachingAllocator(config)
    for ev in events:
        if ev[0] == "alloc":
            if ev[2] > 0:
                a.malloc(ev[1], ev[2], ev[3] if len(ev) > 3 else 0)
        elif ev[1] in a._live:
            a.free(ev[1])
    return Replay(a.peak_requested, a.peak_allocated, a.peak_reserved, a.segments_created, a.releases)


# ---- memform.allocator.sequence.from_estimate as it was (tuple keys, one generator per group) -------------
from memform.allocator.sequence import COMM, COMPUTE, LayerBlocks, Sequence, act_pieces, coarsen, pieces, two_steps  # noqa: E402

def from_estimate(layers: Sequence[LayerBlocks], grads_persist: bool = False) -> list[Event]:
    """The two-step sequence of one stage from its per-layer figures (see the module docstring).

    A layer's weights, gradients and each optimizer moment are ``weight_tensors`` tensors; its saved
    activations and backward transient are tensors of ``act_tensor`` bytes. Each layer's transient is
    allocated at its backward and freed when it ends; ``grads_persist``: gradients live in buffers kept
    across steps (Megatron's and DeepSpeed's contiguous gradient buffers) rather than freed by ``zero_grad``.
    A stage far beyond any real one is :func:`coarsen`-ed first, so the replay stays bounded."""
    layers = coarsen(layers)

    def w(lb: LayerBlocks, total: int) -> list[int]:
        return pieces(total, lb.weight_tensors)

    static = [x for lb in layers for x in w(lb, lb.params)]
    if grads_persist:
        static += [x for lb in layers for x in w(lb, lb.grads)]
    states = [x for lb in layers for k in range(2) for x in w(lb, lb.optimizer // 2 + (lb.optimizer % 2) * (1 - k))]
    held = max((lb.inflight for lb in layers), default=0)

    def alloc(ev: list[Event], key: tuple, sizes: list[int], stream: object = COMPUTE) -> None:
        ev.extend(("alloc", key + (j,), n, stream) for j, n in enumerate(sizes) if n)

    def free(ev: list[Event], key: tuple, sizes: list[int]) -> None:
        ev.extend(("free", key + (j,)) for j, n in enumerate(sizes) if n)

    def step(tag: str) -> list[Event]:
        ev: list[Event] = []
        for mb in range(held):
            for i, lb in enumerate(layers):
                alloc(ev, (tag, "comm", mb, i), [lb.comm], COMM)
                if mb < lb.inflight:
                    alloc(ev, (tag, "act", mb, i), act_pieces(lb.activations, lb.act_tensor))
                free(ev, (tag, "comm", mb, i), [lb.comm])
        # the first backward (where 1F1B's step peaks): the last micro-batch in, the layers in reverse; the
        # other micro-batches' backwards repeat its allocations in the blocks it freed, so they are
        # replayed as the frees of their activations
        mb = held - 1
        for i in reversed(range(len(layers))):
            lb = layers[i]
            if mb < lb.inflight:
                transient = act_pieces(lb.transient, lb.act_tensor)
                alloc(ev, (tag, "comm-b", mb, i), [lb.comm], COMM)
                alloc(ev, (tag, "transient", mb, i), transient)
            if not grads_persist:
                alloc(ev, (tag, "grad", i), w(lb, lb.grads))
            if mb < lb.inflight:
                free(ev, (tag, "transient", mb, i), transient)
                free(ev, (tag, "act", mb, i), act_pieces(lb.activations, lb.act_tensor))
                free(ev, (tag, "comm-b", mb, i), [lb.comm])
        for k in reversed(range(held - 1)):
            for i in reversed(range(len(layers))):
                if k < layers[i].inflight:
                    free(ev, (tag, "act", k, i), act_pieces(layers[i].activations, layers[i].act_tensor))
        return ev

    return two_steps(static, step, [x for x in states if x])
