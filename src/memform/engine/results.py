"""The numbers of an estimate, without its closed forms (no sympy).

An :class:`~memform.engine.model.Estimate` carries exact sympy expressions next to its byte
counts; the cached numeric fast path (:mod:`memform.fastpath.fastcache`) produces the byte
counts alone. Both share these classes, so the properties every output uses (``peak_bytes``,
``fits``, the ``--json`` numbers) are defined once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CATEGORIES = ("params", "grads", "optimizer", "activations", "comm", "runtime")
STATIC = ("params", "grads", "optimizer")
#: what the model itself holds (the runtime category is computed from their sum)
MODEL = ("params", "grads", "optimizer", "activations", "comm")
#: times are kept as whole picoseconds, rounded up (exact and identical on every path; far finer
#: than any step-time model is accurate)
PS_PER_SECOND = 10 ** 12


@dataclass
class StageNumbers:
    """One pipeline stage's whole bytes per category and what set its activation peak."""

    stage: int
    values: dict[str, int] = field(default_factory=dict)
    param_count: int = 0
    capacity_bytes: int = 0
    #: the schedule moment that sets the activation peak ("warmup" when the schedule names none)
    peak_moment: str = "warmup"
    #: activation bytes at each moment of the schedule, in declaration order
    moments: dict[str, int] = field(default_factory=dict)
    #: bytes of this stage's layers held in host memory (offloaded parameters/optimizer states)
    host_bytes: int = 0
    #: each runtime block's bytes on this stage (context, allocator reserve, safety buffer, ...)
    runtime: dict[str, int] = field(default_factory=dict)
    #: each cost block's part of this stage's step time, in picoseconds (empty: no time model)
    time_ps: dict[str, int] = field(default_factory=dict)
    #: what the stage's model FLOPs would take at peak, picoseconds (cost blocks' ideal_seconds)
    ideal_ps: int = 0
    #: tokens the whole job trains on per step (cost blocks' tokens; 0 when none says)
    tokens: int = 0
    #: the allocator model's figures (see the ``reserve`` properties); ``_reserve_pending``: a function that
    #: sets them on first use (the fast path defers the replay: a planner reading only peaks never pays it)
    _reserve: int | None = None
    _reserve_oom: bool = False
    _reserve_releases: int = 0
    _reserve_pending: Any = None

    @property
    def step_ps(self) -> int:
        return sum(self.time_ps.values())

    @property
    def static_bytes(self) -> int:
        return sum(self.values[c] for c in STATIC)

    @property
    def dynamic_bytes(self) -> int:
        return self.values["activations"] + self.values["comm"]

    @property
    def runtime_bytes(self) -> int:
        return self.values["runtime"]

    @property
    def model_bytes(self) -> int:
        """What the model holds, without the runtime's own bytes."""
        return self.static_bytes + self.dynamic_bytes

    @property
    def peak_bytes(self) -> int:
        return self.static_bytes + self.dynamic_bytes + self.runtime_bytes

    def _settle(self) -> None:
        if self._reserve_pending is not None:
            pending, self._reserve_pending = self._reserve_pending, None
            pending(self)

    def set_reserve(self, reserve: int, oom: bool, releases: int) -> None:
        self._reserve, self._reserve_oom, self._reserve_releases = reserve, oom, releases

    @property
    def reserve(self) -> int | None:
        """What the caching allocator reserves beyond the model's bytes (memform.allocator; None: not
        modelled, with ``allocator.model: none``)."""
        self._settle()
        return self._reserve

    @property
    def reserve_oom(self) -> bool:
        """The allocator model ran out of memory on the device even after releasing its cached segments."""
        self._settle()
        return self._reserve_oom

    @property
    def reserve_releases(self) -> int:
        """Cache releases (``cudaFree`` of every free segment, a device synchronisation) the step needed to fit."""
        self._settle()
        return self._reserve_releases

    @property
    def reserved_bytes(self) -> int:
        """What the caching allocator reserves at the step's peak (``torch.cuda.max_memory_reserved``):
        the model's bytes plus the allocator's reserve (the model's bytes when it is not modelled)."""
        return self.model_bytes + (self.reserve or 0)

    @property
    def device_bytes(self) -> int:
        """What the device must hold: the reserved bytes plus the runtime's own (context, margin)."""
        return self.reserved_bytes + self.runtime_bytes

    @property
    def fits(self) -> bool:
        """Under the allocator model: no out-of-memory when the step's allocations are replayed on the
        device (the allocator releases its cache and retries first); else the peak within capacity."""
        if self.reserve is not None:
            return not self.reserve_oom and (self.device_bytes <= self.capacity_bytes or self.reserve_releases > 0
                                             or self.peak_bytes <= self.capacity_bytes)
        return self.peak_bytes <= self.capacity_bytes

    def to_dict(self, labels: list[list[str]]) -> dict[str, Any]:
        """The per-stage part of ``memform estimate --json`` (``labels``: layer groups per chunk)."""
        return {
            "stage": self.stage,
            "layers": labels,
            "param_count": self.param_count,
            "peak_bytes": self.peak_bytes,
            "static_bytes": self.static_bytes,
            "dynamic_bytes": self.dynamic_bytes,
            "runtime_bytes": self.runtime_bytes,
            "reserved_bytes": self.reserved_bytes,
            "reserve_bytes": self.reserve,
            "reserve_releases": self.reserve_releases,
            "runtime": dict(self.runtime),
            "host_bytes": self.host_bytes,
            "breakdown": {c: self.values[c] for c in CATEGORIES},
            "peak_moment": self.peak_moment,
            "moments": dict(self.moments),
            "fits": self.fits,
            **({"time": {"step_seconds": self.step_ps / PS_PER_SECOND,
                         "parts": {k: v / PS_PER_SECOND for k, v in self.time_ps.items()}}}
               if self.step_ps else {}),
        }


class EstimateNumbers:
    """What every estimate offers: stages with byte counts, the peak, and the ``--json`` numbers.

    Subclasses provide ``name``, ``stages``, ``capacity_bytes``, ``schedule``, ``framework``,
    ``setup``, ``parameters`` and ``stage_labels()``.
    """

    name: str
    stages: list[Any]
    capacity_bytes: int

    @property
    def peak_stage(self) -> int:
        return max(range(len(self.stages)), key=lambda i: (self.stages[i].peak_bytes, -i))

    @property
    def peak_bytes(self) -> int:
        return self.stages[self.peak_stage].peak_bytes

    @property
    def reserved_bytes(self) -> int:
        """The largest stage's reserved bytes (:attr:`StageNumbers.reserved_bytes`)."""
        return max(s.reserved_bytes for s in self.stages)

    @property
    def device_bytes(self) -> int:
        return max(s.device_bytes for s in self.stages)

    @property
    def fits(self) -> bool:
        return all(s.fits for s in self.stages)

    @property
    def has_time(self) -> bool:
        return any(s.step_ps for s in self.stages)

    @property
    def time_stage(self) -> int:
        """The stage that takes longest: the pipeline's step ends when it does."""
        return max(range(len(self.stages)), key=lambda i: (self.stages[i].step_ps, -i))

    @property
    def step_seconds(self) -> float | None:
        """Estimated time of one optimizer step (the slowest stage's), or None without cost blocks."""
        return self.stages[self.time_stage].step_ps / PS_PER_SECOND if self.has_time else None

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation: every stage holds the same number of devices, so the job's model
        FLOPs at peak take the stages' mean ideal time; MFU is that over the step time."""
        step = self.stages[self.time_stage].step_ps if self.has_time else 0
        if not step:
            return None
        return sum(s.ideal_ps for s in self.stages) / len(self.stages) / step

    @property
    def tokens_per_second(self) -> float | None:
        tokens = max((s.tokens for s in self.stages), default=0)
        step = self.step_seconds
        return tokens / step if tokens and step else None

    def time_dict(self) -> dict[str, Any]:
        """The step-time part of ``--json``: step seconds, MFU, tokens/s and the slowest stage."""
        return {"step_seconds": self.step_seconds, "mfu": self.mfu, "mfu_peak": "dense BF16 (device.peak_flops_bf16)",
                "tokens_per_second": self.tokens_per_second,
                "slowest_stage": self.time_stage,
                "parts": {k: v / PS_PER_SECOND for k, v in self.stages[self.time_stage].time_ps.items()}}

    def stage_labels(self, stage: int) -> list[list[str]]:
        """Layer groups per chunk of ``stage``, e.g. ``[["1xembedding", "20xdecoder(full)"]]``."""
        raise NotImplementedError

    def numbers_dict(self) -> dict[str, Any]:
        """The numeric ``--json`` shape (closed forms and assumptions are added by :meth:`to_dict`)."""
        return {
            "model": self.name,
            "schedule": self.schedule,
            "framework": self.framework,
            "capacity_bytes": self.capacity_bytes,
            "peak_bytes": self.peak_bytes,
            "peak_stage": self.peak_stage,
            "reserved_bytes": self.reserved_bytes,
            "fits": self.fits,
            "setup": dict(self.setup),
            "parameters": dict(self.parameters),
            **({"time": self.time_dict()} if self.has_time else {}),
            "stages": [s.to_dict(self.stage_labels(s.stage)) for s in self.stages],
        }


def group_label(count: int, block: str, mode: str) -> str:
    """``20xdecoder(full)``: a run of identical layers as the JSON output names it."""
    return f"{count}x{block}" + (f"({mode})" if mode != "none" else "")


def with_devices(setup: dict[str, Any]) -> dict[str, Any]:
    """``setup`` plus ``devices`` = dp × tp × pp × cp (the product ``parallel.devices`` is checked
    against; expert parallelism works inside dp), when dp, tp and pp are known integers."""
    degrees = [setup.get(k, 1) for k in ("dp", "tp", "pp", "cp")]
    if all(k in setup for k in ("dp", "tp", "pp")) and all(isinstance(v, int) for v in degrees):
        setup["devices"] = degrees[0] * degrees[1] * degrees[2] * degrees[3]
    return setup
