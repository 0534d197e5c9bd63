"""Per-op samples of the live bytes of every storage created while a dispatch mode is active.

Unlike :class:`~.timeline.StorageTimeline` it re-reads each storage's size at every sample: FSDP frees and
re-allocates unsharded parameters by resizing their storages, which no dispatcher op reports (a trace
whose storages keep their size sets ``fixed_sizes`` and keeps a running live set instead). Both
multi-process harnesses use it (:mod:`.fsdp2`, :mod:`.distributed`); each subclass says how a new storage
is tagged (:meth:`StorageSamples._classify`) and how a tagged storage is labelled in :meth:`by_op`. torch
is imported lazily: these run only in the ranks' processes.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterable

Keep = Callable[[int], bool]


class StorageSamples:
    """Storages get a serial when an op first returns them; ``samples[i]`` = ((serial, bytes), ...) after op i."""

    #: record a DTensor's local tensor (its wrapper storage reports the global size without holding memory)
    unwrap_dtensor = False
    #: see DTensor ops as the local-shard ops they desugar to (every intermediate, e.g. a redistribute's
    #: all-gather output), rather than as one op returning a DTensor
    defer_dtensor = False
    #: storages keep the size they are made with (no FSDP-style ``resize_``): a sample is then the running
    #: live set, kept up to date when an op makes a storage and when one dies (a weakref callback), instead
    #: of re-reading every live storage after every op -- that scan made a trace cost ops x live storages
    fixed_sizes = False

    def __init__(self, ignore: Iterable[Any]) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
                if outer.defer_dtensor and any(getattr(t, "__name__", "") == "DTensor" for t in types):
                    # let DTensor desugar the op first: its local-shard ops, collectives included, then
                    # come back through this mode (as torch's MemTracker does)
                    return NotImplemented
                return outer._dispatch(func, args, kwargs or {})

        self.mode = Mode()
        self._ignored = {id(st): st for st in ignore}
        self.refs: dict[int, weakref.ref] = {}     # serial -> storage
        self.serial_of: dict[int, int] = {}         # id(storage) -> serial (while alive)
        self.op_of: dict[int, str] = {}
        self.tags: dict[int, str] = {}
        self.samples: list[tuple[tuple[int, int], ...]] = []
        self._next = 0
        self._live: dict[int, int] = {}             # fixed_sizes: serial -> bytes of the live storages

    # ---- what a subclass may refine ------------------------------------------------------------
    def _dispatch(self, func, args, kwargs):  # noqa: ANN001, ANN202
        out = func(*args, **kwargs)
        self._record(out, str(func.overloadpacket.__name__))
        return out

    def _classify(self, op: str) -> str | None:
        """The tag of a storage first returned by ``op`` (None: untagged)."""
        return None

    def _label(self, serial: int) -> str:
        return self.tags.get(serial, "") + ":" + self.op_of[serial]

    # ---- recording -----------------------------------------------------------------------------
    def _storage(self, t):  # noqa: ANN001, ANN202
        import torch
        from torch._subclasses.fake_tensor import FakeTensor

        if isinstance(t, torch.UntypedStorage):
            return t
        if not isinstance(t, torch.Tensor):
            return None
        if self.unwrap_dtensor and hasattr(t, "_local_tensor"):
            t = t._local_tensor
        # a FakeTensor (FakeTensorMode) holds no memory but its meta storage reports the bytes it stands
        # for: traced like a real tensor; other subclasses (a DTensor wrapper) and meta tensors are not
        if isinstance(t, FakeTensor):
            return t.untyped_storage()
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.device.type == "meta":
            return None
        return t.untyped_storage()

    def _alive_serial(self, st) -> int | None:  # noqa: ANN001
        serial = self.serial_of.get(id(st))
        ref = self.refs.get(serial) if serial is not None else None
        return serial if ref is not None and ref() is st else None

    def _record(self, out, op: str) -> None:  # noqa: ANN001
        from torch.utils._pytree import tree_leaves

        tag = self._classify(op)
        for t in tree_leaves(out):
            st = self._storage(t)
            if st is None or id(st) in self._ignored or self._alive_serial(st) is not None:
                continue
            serial = self._next
            self._next += 1
            if self.fixed_sizes:
                self.refs[serial] = weakref.ref(st, self._gone(serial))
                n = st.nbytes()
                if n:
                    self._live[serial] = n
            else:
                self.refs[serial] = weakref.ref(st)
            self.serial_of[id(st)] = serial
            self.op_of[serial] = op
            if tag is not None:
                self.tags[serial] = tag
        self.sample()

    def _gone(self, serial: int):  # noqa: ANN202 - the weakref callback of a fixed-size storage
        live, refs = self._live, self.refs

        def gone(_ref) -> None:  # noqa: ANN001
            live.pop(serial, None)
            if refs.get(serial) is _ref:
                del refs[serial]
        return gone

    def sample(self) -> None:
        if self.fixed_sizes:
            self.samples.append(tuple(self._live.items()))
            return
        live = []
        for serial, ref in list(self.refs.items()):
            st = ref()
            if st is None:
                del self.refs[serial]
                continue
            n = st.nbytes()
            if n:
                live.append((serial, n))
        self.samples.append(tuple(live))

    # ---- reading -------------------------------------------------------------------------------
    def events(self, tag: str = "", stream_of: Callable[[int], Any] | None = None) -> list[tuple]:
        """The traced allocations and frees in order, for the allocator model
        (:func:`memform.allocator.sequence.from_samples`); ``stream_of(serial)``: the CUDA stream a
        storage would be allocated on (default: one stream)."""
        from ..allocator.sequence import from_samples

        return from_samples(self.samples, stream_of or (lambda s: 0), tag)


    def serials(self, items: Iterable[Any]) -> set[int]:
        """Serials of the live tracked storages behind ``items`` (tensors or storages; None skipped)."""
        out = set()
        for item in items:
            st = self._storage(item) if item is not None else None
            serial = self._alive_serial(st) if st is not None else None
            if serial is not None:
                out.add(serial)
        return out

    def tag(self, items: Iterable[Any], what: str) -> None:
        for s in self.serials(items):
            self.tags[s] = what

    def tagged(self, what: str) -> set[int]:
        return {s for s, t in self.tags.items() if t == what}

    def live_bytes(self, keep: Keep) -> int:
        """Bytes of the tracked storages alive now that ``keep(serial)`` accepts."""
        total = 0
        for serial, ref in list(self.refs.items()):
            st = ref()
            if st is not None and keep(serial):
                total += st.nbytes()
        return total

    def at(self, i: int, keep: Keep) -> int:
        return sum(n for s, n in self.samples[i] if keep(s)) if 0 <= i < len(self.samples) else 0

    def peak(self, keep: Keep, start: int = 0) -> tuple[int, int]:
        """The largest sum over the samples (from ``start``) of the live storages ``keep`` accepts, and where."""
        best, where = 0, -1
        for i in range(start, len(self.samples)):
            total = sum(n for s, n in self.samples[i] if keep(s))
            if total > best:
                best, where = total, i
        return best, where

    def by_op(self, i: int, keep: Keep, limit: int | None = None) -> dict[str, int]:
        """Bytes per creating op (with its tag label) live at sample ``i``, largest first."""
        out: dict[str, int] = {}
        for s, n in self.samples[i] if 0 <= i < len(self.samples) else ():
            if keep(s):
                k = self._label(s)
                out[k] = out.get(k, 0) + n
        return dict(sorted(out.items(), key=lambda kv: -kv[1])[:limit])
