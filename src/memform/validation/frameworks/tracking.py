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
