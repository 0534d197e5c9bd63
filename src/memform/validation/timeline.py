"""When each tensor storage is born and dies during a traced region, and the peak of the live bytes.

:class:`LiveStorages` answers "what is still alive now"; a training step's peak, though, is reached
inside backward, when saved activations, activation gradients, recomputed activations and the loss
gradient overlap. :class:`StorageTimeline` puts every storage an ATen op creates on an op clock (the
clock ticks once per op that returns) and records, with a ``weakref.finalize``, the clock at which the
storage is freed. A storage is *live at the end of op k* when it was born at op ≤ k and freed at clock
≥ k (it died after op k returned). The peak is the largest sum of live bytes over those instants —
sampled once per op, so a kernel's internal scratch memory (not made by the dispatcher) is not seen.

Storages can be classed *after* the traced region (``exclude``): e.g. the parameter gradients, which
only turn out to be gradients when autograd accumulates them.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


@dataclass
class Life:
    """One storage's bytes, the op clock it was born at, the op that made it, and when it died."""

    nbytes: int
    born: int
    op: str
    died: int | None = None   # None: still alive


class StorageTimeline(TorchDispatchMode):
    """A dispatch mode that records the lifetime of every storage the traced ops create."""

    def __init__(self, ignore: Iterable[torch.UntypedStorage] = ()) -> None:
        """``ignore``: storages that exist before tracing (parameters, gradient buffers, inputs); an
        in-place op on one of them returns it, and it must not be taken for a new storage."""
        super().__init__()
        self._ignored = {id(st): st for st in ignore}   # strong references: the ids stay theirs
        self.clock = 0
        self.lives: dict[int, Life] = {}          # keyed by a serial number, not id(): ids get reused
        self._serial_of: dict[int, int] = {}      # id(storage) -> serial, while the storage is alive
        self.marks: dict[str, int] = {}           # name -> clock, e.g. "forward end"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch protocol
        out = func(*args, **(kwargs or {}))
        self.clock += 1
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                if id(st) not in self._serial_of and id(st) not in self._ignored:
                    serial = len(self.lives)
                    self.lives[serial] = Life(st.nbytes(), self.clock, str(func.overloadpacket.__name__))
                    self._serial_of[id(st)] = serial
                    weakref.finalize(st, self._died, serial, id(st))
        return out

    def ignore(self, storages: Iterable[torch.UntypedStorage]) -> None:
        """Add storages made before tracing to ``ignore`` (see the constructor)."""
        self._ignored.update((id(st), st) for st in storages)

    def _died(self, serial: int, key: int) -> None:
        self.lives[serial].died = self.clock
        if self._serial_of.get(key) == serial:
            del self._serial_of[key]

    def mark(self, name: str) -> None:
        """Remember the current clock under ``name`` (to report a phase's own peak)."""
        self.marks[name] = self.clock

    def serials(self, storages: Iterable[torch.UntypedStorage]) -> set[int]:
        """Serial numbers of those ``storages`` that were created while tracing and are still alive."""
        return {self._serial_of[id(st)] for st in storages if id(st) in self._serial_of}

    def live_bytes(self, exclude: set[int] = frozenset(), start: int = 0, end: int | None = None) -> list[int]:
        """Live bytes at the end of every op ``start + 1 .. end`` (all ops by default), minus ``exclude``."""
        end = self.clock if end is None else end
        delta = [0] * (self.clock + 2)
        for serial, life in self.lives.items():
            if serial in exclude:
                continue
            delta[life.born] += life.nbytes
            died = self.clock + 1 if life.died is None else life.died + 1   # alive at the end of op `died`
            delta[died] -= life.nbytes
        live, running = [], 0
        for k in range(end + 1):
            running += delta[k]
            if k > start:
                live.append(running)
        return live

    def peak(self, exclude: set[int] = frozenset(), start: int = 0, end: int | None = None) -> tuple[int, int]:
        """(peak live bytes, op clock where it is first reached) over ops ``start + 1 .. end``."""
        live = self.live_bytes(exclude, start, end)
        if not live:
            return 0, start
        top = max(live)
        return top, start + 1 + live.index(top)

    def live_at(self, k: int, exclude: set[int] = frozenset()) -> dict[str, int]:
        """Bytes live at the end of op ``k`` grouped by the op that created them (to explain a peak)."""
        out: dict[str, int] = {}
        for serial, life in self.lives.items():
            if serial not in exclude and life.born <= k and (life.died is None or life.died >= k):
                out[life.op] = out.get(life.op, 0) + life.nbytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))
