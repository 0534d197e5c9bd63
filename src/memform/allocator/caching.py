"""A model of PyTorch's CUDA caching allocator: what a sequence of tensor allocations *reserves*.

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

from bisect import bisect_left, insort
from dataclasses import dataclass
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


class _Block:
    """A block of a segment (``Block``): its address, size, whether it is allocated, and its neighbours."""

    __slots__ = ("ptr", "size", "segment", "allocated", "requested", "prev", "next")

    def __init__(self, ptr: int, size: int, segment: "_Segment", prev: "_Block | None" = None,
                 next: "_Block | None" = None) -> None:
        self.ptr, self.size, self.segment = ptr, size, segment
        self.allocated, self.requested = False, 0
        self.prev, self.next = prev, next

    def key(self) -> tuple[int, int]:
        return (self.size, self.ptr)


class _Segment:
    """One ``cudaMalloc``-ed segment (or a pool's expandable one)."""

    __slots__ = ("base", "size", "pool", "expandable", "last")

    def __init__(self, base: int, size: int, pool: "_Pool", expandable: bool = False) -> None:
        self.base, self.size, self.pool, self.expandable = base, size, pool, expandable
        #: reserved bytes (mapped bytes for an expandable segment) in ``size``; ``last``: the block at the
        #: segment's highest address (an expandable segment grows there)
        self.last: _Block | None = None


class _Pool:
    """One stream's small or large pool: its free blocks sorted by (size, address)."""

    __slots__ = ("small", "free", "blocks", "expandable")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.free: list[tuple[int, int]] = []
        self.blocks: dict[tuple[int, int], _Block] = {}
        self.expandable: _Segment | None = None

    def insert(self, b: _Block) -> None:
        k = (b.size, b.ptr)
        insort(self.free, k)
        self.blocks[k] = b

    def remove(self, b: _Block) -> None:
        k = (b.size, b.ptr)
        del self.free[bisect_left(self.free, k)]
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
    (block bytes, as ``torch.cuda.memory_allocated``) and reserved (segments), and their peaks.

    A replay runs ``malloc`` and ``free`` tens of thousands of times per stage, so their common paths
    (a cached block found or a new segment reserved; a freed block merged) are written out in place
    rather than as one call per step; the rarer steps (expandable segments, releases) keep a method each.
    ``tests/allocator_reference.py`` keeps the one-method-per-step form, and the tests replay drawn
    sequences through both."""

    def __init__(self, config: AllocatorConfig = AllocatorConfig()) -> None:
        self.config = config
        self._limit = config.split_limit()
        self._pools: dict[tuple[Hashable, bool], _Pool] = {}
        #: every reserved segment, in reservation order (a dict: a release drops one in O(1))
        self._segments: dict[_Segment, None] = {}
        self._live: dict[Hashable, _Block] = {}
        self._next_base = 0
        self.requested = self.allocated = self.reserved = 0
        self.peak_requested = self.peak_allocated = self.peak_reserved = 0
        self.segments_created = 0
        self.releases = 0

    # ---- the public protocol ---------------------------------------------------------------------
    def malloc(self, key: Hashable, nbytes: int, stream: Hashable = 0) -> None:
        """Allocate ``nbytes`` under ``key`` on ``stream``; raises :class:`OutOfMemory`."""
        live = self._live
        if key in live:
            raise ValueError(f"allocation {key!r} is already live")
        size = -(-nbytes // MIN_BLOCK) * MIN_BLOCK          # round_size
        if size < MIN_BLOCK:
            size = MIN_BLOCK
        small = size <= SMALL_SIZE
        pool = self._pools.get((stream, small))
        if pool is None:
            pool = self._pools[(stream, small)] = _Pool(small)
        limit = self._limit
        # get_free_block: best fit among the pool's cached blocks, with max_split_size's rules
        block = None
        free = pool.free
        if free:
            i = bisect_left(free, (size, -1))
            if i < len(free):
                k = free[i]
                have = k[0]
                # an oversize block serves no small request, nor a large request it exceeds by a whole
                # large buffer
                if not (size < limit <= have) and not (size >= limit and have >= size + LARGE_BUFFER):
                    del free[i]
                    block = pool.blocks.pop(k)
        if block is None:
            block = self._new_block(pool, size)
        # alloc_found_block: split off the remainder when should_split says it is worth keeping
        remaining = block.size - size
        if small or self.config.expandable_segments:
            split = remaining >= MIN_BLOCK
        else:
            split = size < limit and remaining > SMALL_SIZE
        if split:
            nxt = block.next
            rest = _Block(block.ptr + size, remaining, block.segment, block, nxt)
            if nxt is not None:
                nxt.prev = rest
            block.next = rest
            block.size = size
            seg = block.segment
            if seg.last is block:
                seg.last = rest
            k = (remaining, rest.ptr)
            insort(free, k)
            pool.blocks[k] = rest
        block.allocated, block.requested = True, nbytes
        live[key] = block
        self.requested += nbytes
        self.allocated += block.size
        if self.requested > self.peak_requested:
            self.peak_requested = self.requested
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated

    def free(self, key: Hashable) -> None:
        block = self._live.pop(key)
        self.requested -= block.requested
        self.allocated -= block.size
        block.allocated, block.requested = False, 0
        pool = block.segment.pool
        free, blocks = pool.free, pool.blocks
        # free_block / try_merge_blocks: merge with the free neighbours of its segment
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated:
            k = (prev.size, prev.ptr)
            del free[bisect_left(free, k)]
            del blocks[k]
            block.ptr, block.prev = prev.ptr, prev.prev
            if prev.prev is not None:
                prev.prev.next = block
            block.size += prev.size
        if nxt is not None and not nxt.allocated:
            k = (nxt.size, nxt.ptr)
            del free[bisect_left(free, k)]
            del blocks[k]
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
            if block.segment.last is nxt:
                block.segment.last = block
            block.size += nxt.size
        k = (block.size, block.ptr)
        insort(free, k)
        blocks[k] = block

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache``: release every wholly free segment."""
        self._release_cached()

    @property
    def live(self) -> int:
        return len(self._live)

    # ---- internals -------------------------------------------------------------------------------
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
            self._segments[seg] = None
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
        self._segments[seg] = None
        self.reserved += seg.size
        self.segments_created += 1
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved

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
        del self._segments[seg]
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
    if config.capacity is None and not config.expandable_segments:
        events = events if isinstance(events, (list, tuple)) else list(events)
        try:
            return _replay_unbounded(events, config.split_limit())
        except _AddressSpace:
            pass  # addresses beyond the packed keys' range (fuzzed figures): the general path below
    a = CachingAllocator(config)
    malloc, free, live = a.malloc, a.free, a._live
    for ev in events:
        if ev[0] == "alloc":
            if ev[2] > 0:
                malloc(ev[1], ev[2], ev[3] if len(ev) > 3 else 0)
        elif ev[1] in live:
            free(ev[1])
    return Replay(a.peak_requested, a.peak_allocated, a.peak_reserved, a.segments_created, a.releases)


#: :func:`_replay_unbounded` keys a free block by one integer, ``size << _PTR_BITS | ptr``: the same order as
#: (size, ptr) while every address is below 2**_PTR_BITS (2**64 bytes: no real stage comes near)
_PTR_BITS = 64
_PTR_LIMIT = 1 << _PTR_BITS


class _AddressSpace(Exception):
    """A segment's address reached 2**_PTR_BITS: :func:`_replay_unbounded`'s keys would lose the order."""


def _replay_unbounded(events: Iterable[Event], limit: int) -> Replay:
    """:func:`replay` without a capacity and without expandable segments (every stage's first replay):
    :meth:`CachingAllocator.malloc` and :meth:`~CachingAllocator.free` written out in one loop over local
    variables, the same steps in the same order -- a replay is tens of thousands of events. Without a
    capacity no reservation fails, so no release ever runs, the reserved bytes only grow, and a segment
    needs no record of its own. A block is a list ``[ptr, size, free-list, blocks, requested, prev, next]``
    (``requested`` None while it is free); each pool's free list is keyed by one integer per block,
    ``size << 64 | ptr``, which sorts as the (size, ptr) pairs."""
    shift = _PTR_BITS
    pools: dict[tuple[Hashable, bool], tuple[list[int], dict[int, list]]] = {}
    live: dict[Hashable, list] = {}
    next_base = requested = allocated = reserved = 0
    peak_requested = peak_allocated = 0
    segments = 0
    for ev in events:
        if ev[0] == "alloc":
            nbytes = ev[2]
            if nbytes <= 0:
                continue
            key = ev[1]
            if key in live:
                raise ValueError(f"allocation {key!r} is already live")
            size = -(-nbytes // MIN_BLOCK) * MIN_BLOCK      # round_size
            if size < MIN_BLOCK:
                size = MIN_BLOCK
            small = size <= SMALL_SIZE
            pk = (ev[3] if len(ev) > 3 else 0, small)
            pool = pools.get(pk)
            if pool is None:
                pool = pools[pk] = ([], {})
            free, blocks = pool
            block = None
            if free:                                        # get_free_block: best fit, lowest address
                i = bisect_left(free, size << shift)
                if i < len(free):
                    k = free[i]
                    have = k >> shift
                    if not (size < limit <= have) and not (size >= limit and have >= size + LARGE_BUFFER):
                        del free[i]
                        block = blocks.pop(k)
            if block is None:                               # alloc_block: a new segment
                need = SMALL_BUFFER if small else LARGE_BUFFER if size < MIN_LARGE_ALLOC \
                    else -(-size // ROUND_LARGE) * ROUND_LARGE
                block = [next_base, need, free, blocks, None, None, None]
                next_base += need + ROUND_LARGE
                if next_base >= _PTR_LIMIT:
                    raise _AddressSpace
                reserved += need
                segments += 1
            remaining = block[1] - size                     # alloc_found_block / should_split
            if remaining >= MIN_BLOCK if small else (size < limit and remaining > SMALL_SIZE):
                nxt = block[6]
                rest = [block[0] + size, remaining, free, blocks, None, block, nxt]
                if nxt is not None:
                    nxt[5] = rest
                block[6] = rest
                block[1] = size
                k = remaining << shift | rest[0]
                insort(free, k)
                blocks[k] = rest
            block[4] = nbytes
            live[key] = block
            requested += nbytes
            allocated += block[1]
            if requested > peak_requested:
                peak_requested = requested
            if allocated > peak_allocated:
                peak_allocated = allocated
        else:
            block = live.pop(ev[1], None)
            if block is None:
                continue
            requested -= block[4]
            allocated -= block[1]
            block[4] = None
            free, blocks = block[2], block[3]
            prev, nxt = block[5], block[6]
            if prev is not None and prev[4] is None:        # free_block / try_merge_blocks
                k = prev[1] << shift | prev[0]
                del free[bisect_left(free, k)]
                del blocks[k]
                block[0] = prev[0]
                pp = block[5] = prev[5]
                if pp is not None:
                    pp[6] = block
                block[1] += prev[1]
            if nxt is not None and nxt[4] is None:
                k = nxt[1] << shift | nxt[0]
                del free[bisect_left(free, k)]
                del blocks[k]
                nn = block[6] = nxt[6]
                if nn is not None:
                    nn[5] = block
                block[1] += nxt[1]
            k = block[1] << shift | block[0]
            insort(free, k)
            blocks[k] = block
    return Replay(peak_requested, peak_allocated, reserved, segments, 0)
