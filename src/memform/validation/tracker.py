"""Which tensor storages are alive, and how many bytes they hold, measured at the dispatcher.

Every ATen op that runs while :class:`LiveStorages` is active reports its outputs; the tracker keeps a
weak reference to each *storage* (not tensor: views share one storage, and a storage holds memory for as
long as anything — a Python tensor, an autograd saved-variable, a checkpoint closure — still refers to
it). Asking later which storages are still alive gives the memory that the traced code left resident,
however it is held. Bytes are ``UntypedStorage.nbytes()``: what was requested from the allocator, without
the CPU allocator's alignment padding (at most 63 bytes per allocation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary


def storages_of(tensors: Iterable[torch.Tensor]) -> list[torch.UntypedStorage]:
    """Distinct storages behind ``tensors`` (views of one storage count once)."""
    seen: dict[int, torch.UntypedStorage] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            seen.setdefault(id(st), st)
    return list(seen.values())


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes held by the distinct storages behind ``tensors``."""
    return sum(st.nbytes() for st in storages_of(tensors))


@dataclass(frozen=True)
class Origin:
    """The op that first returned a storage, and the shape/dtype of that first tensor."""

    op: str
    shape: tuple[int, ...]
    dtype: torch.dtype


class LiveStorages(TorchDispatchMode):
    """A dispatch mode that remembers (weakly) every storage the ops it sees produce.

    ``created_by`` maps each still-alive storage to the :class:`Origin` that first returned it, which is
    what the harness prints when it explains a disagreement.
    """

    def __init__(self) -> None:
        super().__init__()
        self.created_by: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch protocol
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                if st not in self.created_by:
                    self.created_by[st] = Origin(str(func.overloadpacket.__name__), tuple(t.shape), t.dtype)
        return out

    def alive(self, exclude: Iterable[torch.UntypedStorage] = ()) -> list[tuple[torch.UntypedStorage, "Origin"]]:
        """Storages created while tracing that are still alive, minus ``exclude`` (by identity)."""
        skip = {id(st) for st in exclude}
        return [(st, op) for st, op in list(self.created_by.items()) if id(st) not in skip]

    def alive_bytes(self, exclude: Iterable[torch.UntypedStorage] = ()) -> int:
        return sum(st.nbytes() for st, _ in self.alive(exclude))

    def by_op(self, exclude: Iterable[torch.UntypedStorage] = ()) -> dict[str, int]:
        """Alive bytes grouped by the op that created them (for explaining a mismatch)."""
        out: dict[str, int] = {}
        for st, origin in self.alive(exclude):
            out[origin.op] = out.get(origin.op, 0) + st.nbytes()
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


