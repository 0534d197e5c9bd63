"""What the caching allocator reserves for a training step, next to what the tensors allocate.

- :mod:`.caching`: a model of PyTorch's CUDA caching allocator that replays an allocation sequence;
- :mod:`.sequence`: the allocation sequence of a step, from a trace the validation harness recorded or,
  without one, built from an estimate's per-layer figures;
- :mod:`.estimate`: an estimate's reserved figure and out-of-memory verdict per stage.

May import: :mod:`memform.errors` only (the engine calls it; it takes the engine's objects by duck
typing). Pure Python: no sympy at import time, no torch.
"""

from .caching import AllocatorConfig, CachingAllocator, OutOfMemory, Replay, replay

__all__ = ["AllocatorConfig", "CachingAllocator", "OutOfMemory", "Replay", "replay"]
