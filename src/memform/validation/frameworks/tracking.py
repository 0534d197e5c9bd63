"""The storage accounting of a real framework's training step, for real and for fake tensors.

:class:`StepSamples` is :class:`~memform.validation.samples.StorageSamples` (a dispatch mode that gives
every storage an op returns a serial and re-reads the live bytes after each op) with the changes the
frameworks need (``shared/reference/frameworks-on-cpu.md``, "How it was measured"):

- it also records the storages an op *takes*: a buffer filled through an ``out=`` op that returns
  nothing (FSDP2's all-gather copy-out) would otherwise go unseen;
- it reads a DTensor's local shard (``unwrap_dtensor``).

Like every :class:`StorageSamples` it accepts :class:`~torch._subclasses.fake_tensor.FakeTensor`: under
``FakeTensorMode`` every tensor is a fake one whose (meta) storage still reports its ``nbytes``, so the
same accounting traces a 70B or 405B model's step without allocating it.

Phases are sample indices (:meth:`StepSamples.mark`); a category is a set of serials, assigned after
the step from the objects the framework holds (parameters, ``.grad``, optimizer state).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from ..samples import StorageSamples


class StepSamples(StorageSamples):
    """Serials and per-op live bytes of every storage a training step touches (see the module doc)."""

    unwrap_dtensor = True

    def __init__(self, ignore=()) -> None:  # noqa: ANN001 - storages, as StorageSamples takes them
        super().__init__(ignore)
        self.marks: dict[str, int] = {}

    def _dispatch(self, func, args, kwargs):  # noqa: ANN001, ANN202
        out = func(*args, **kwargs)
        op = str(func.overloadpacket.__name__)
        self._record((args, kwargs, out), op)
        return out

    def mark(self, name: str) -> None:
        """Sample now and remember that sample under ``name``: what is live between two ops (after the
        forward has returned, say, and its frame's temporaries are gone)."""
        self.sample()
        self.marks[name] = len(self.samples) - 1


def replay_reserved(trace: StepSamples, static, states, stream_of=None, host=frozenset()):  # noqa: ANN001, ANN201
    """The :class:`~memform.allocator.Replay` (requested, allocated and reserved peaks) of what PyTorch's
    caching allocator would reserve over two steps of the traced one
    (:func:`memform.allocator.sequence.two_steps`): the ``static`` tensors (parameters, buffers, inputs,
    in creation order) first, the optimizer ``states`` after the first step, the traced step twice. The
    allocator model replays the framework's own allocation sequence: the measured side of the reserved
    comparison on a machine without a GPU (on a GPU, ``bench/gpu_truth.py`` sets it against
    ``torch.cuda.max_memory_reserved``). ``host``: serials of storages in host memory (offloaded
    activations' copies, :func:`pinned_as_host`), which the device's allocator never sees."""
    from ...allocator import replay
    from ...allocator.sequence import two_steps

    def sizes(tensors) -> list[int]:  # noqa: ANN001
        seen: dict[int, int] = {}
        for t in tensors:
            st = trace._storage(t)
            if st is not None:
                seen.setdefault(id(st), st.nbytes())
        return list(seen.values())

    def step(tag: str) -> list:
        return [e for e in trace.events(tag, stream_of) if e[1][1] not in host]

    events = two_steps(sizes(static), step, sizes(states))
    return replay(events)


def replayed_figures(r) -> dict[str, int]:  # noqa: ANN001 - a memform.allocator.Replay
    """The measured side of the reserve comparison: the replayed reserved peak, the step's allocated peak
    (every tensor, static ones included: what ``torch.cuda.max_memory_allocated`` counts) and the reserve."""
    return {"reserved": r.peak_reserved, "step_peak": r.peak_requested, "reserve": r.peak_reserved - r.peak_requested}


@contextlib.contextmanager
def pinned_as_host(on_host: Callable[[Any], None]) -> Iterator[None]:
    """Host memory on a machine without an accelerator. Activation offloading allocates its host copies
    with ``torch.empty(..., pin_memory=True)`` (torch/autograd/graph.py ``save_on_cpu.pack_to_cpu``, which
    transformers' ``activation_checkpointing_enable(offload=True)`` runs with ``device_type`` "cpu" where no
    accelerator is found), which raises there ("no pinned memory allocator"), and brings them back with
    ``Tensor.to(device)`` (``unpack_from_cpu``), which on the CPU returns the host tensor itself. Inside
    this context the first allocates an ordinary CPU tensor instead (the same bytes, unpinned) and hands
    it to ``on_host``, so that a harness counts it as host memory rather than as the device's; and moving
    such a host tensor to a device returns a new copy, as the copy to a GPU is (so the device holds the
    reloaded tensor while backward uses it). Nothing else is changed."""
    import weakref

    import torch

    orig_empty, orig_to = torch.empty, torch.Tensor.to
    hosts: "weakref.WeakSet[Any]" = weakref.WeakSet()

    def empty(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        pinned = kwargs.pop("pin_memory", False)
        out = orig_empty(*args, **kwargs)
        if pinned:
            hosts.add(out)
            on_host(out)
        return out

    def to(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if self in hosts and args and isinstance(args[0], (torch.device, str)) and len(args) == 1:
            return self.clone()
        return orig_to(self, *args, **kwargs)

    torch.empty, torch.Tensor.to = empty, to
    try:
        yield
    finally:
        torch.empty, torch.Tensor.to = orig_empty, orig_to
