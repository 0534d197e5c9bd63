"""Run a measurement on every rank of a gloo process group spawned on loopback (CPU, no network).

Both multi-process harnesses (:mod:`.fsdp2` and :mod:`.distributed`) use it: :func:`spawn` starts
``world`` processes with ``torch.multiprocessing.spawn``, each joins one gloo group on a free local port
and calls ``measure(payload_item, rank, world)`` for every item, in order, with a barrier between items
(so that no rank races ahead into the next case's collectives) and a garbage collection before each (the
previous case's model, often held in reference cycles by hooks, is gone before the next is measured).
The results travel back as JSON files, one per rank. ``measure`` must be a module-level function (it is
pickled into the child processes) returning something JSON can hold.

The fake-tensor harnesses (:mod:`.frameworks.titan`, :mod:`.frameworks.mcore`, ``bench/compiled_block.py``)
trace one rank of a large job in this process instead: :func:`fake_group` opens torch's ``fake`` process
group (``torch.testing._internal.distributed.fake_pg``: collectives return at once, nothing is sent) of the
job's world size as that rank, and destroys it afterwards.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

Measure = Callable[[Any, int, int], Any]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for the group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(world: int, measure: Measure, payload: list[Any], prefix: str = "memform-ranks-") -> list[list[Any]]:
    """Per payload item, per rank: what ``measure(item, rank, world)`` returned on that rank."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        mp.spawn(_worker, args=(world, measure, payload, free_port(), tmp), nprocs=world, join=True)
        per_rank = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(world)]
    return [[per_rank[r][i] for r in range(world)] for i in range(len(payload))]


@contextmanager
def fake_group(world: int, rank: int = 0) -> Iterator[None]:
    """This process as rank ``rank`` of a ``fake`` process group of ``world`` ranks, for the ``with`` block."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _worker(rank: int, world: int, measure: Measure, payload: list[Any], port: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = []
        for item in payload:
            gc.collect()
            results.append(measure(item, rank, world))
            dist.barrier()
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(results))
        dist.barrier()
    finally:
        dist.destroy_process_group()
