"""Comparing two estimates stage by stage: two configs, or one config with two sets of overrides.

The question behind it is "what does this change buy me?" (tp 4 -> 8, selective -> full
recompute, 1f1b -> interleaved), so every stage shows both breakdowns side by side and the
difference B - A per category. Stages are matched by index; when the two runs have a
different number of stages the missing side is ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..engine.interpreter import CATEGORIES, StageResult
from ..engine.model import ConfigSource, Estimate, estimate
from ..errors import MemformError


@dataclass
class Side:
    """One of the two runs being compared."""

    label: str
    est: Estimate


@dataclass
class StageDiff:
    stage: int
    a: StageResult | None
    b: StageResult | None

    @property
    def delta(self) -> dict[str, int] | None:
        """B - A bytes per category (and ``peak``), or None when one side lacks this stage."""
        if self.a is None or self.b is None:
            return None
        out = {c: self.b.values[c] - self.a.values[c] for c in CATEGORIES}
        out["peak"] = self.b.peak_bytes - self.a.peak_bytes
        return out


@dataclass
class Comparison:
    a: Side
    b: Side
    stages: list[StageDiff]
    config_diff: list[tuple[str, Any, Any]]   # (dotted key, value in A, value in B)

    @property
    def peak_delta(self) -> int:
        return self.b.est.peak_bytes - self.a.est.peak_bytes

    def to_dict(self) -> dict[str, Any]:
        """The ``memform compare --json`` shape: both estimates' ``--json`` plus per-stage deltas."""
        return {
            "a": {"label": self.a.label, **self.a.est.to_dict()},
            "b": {"label": self.b.label, **self.b.est.to_dict()},
            "config_diff": [{"key": k, "a": va, "b": vb} for k, va, vb in self.config_diff],
            "peak_delta_bytes": self.peak_delta,
            "stages": [{"stage": d.stage, "delta": d.delta} for d in self.stages],
        }


_ABSENT = "(unset)"


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"parallel": {"tp": 8}}`` -> ``{"parallel.tp": 8}`` (lists stay values)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def config_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    fa, fb = flatten(a), flatten(b)
    keys = sorted(set(fa) | set(fb))
    return [(k, fa.get(k, _ABSENT), fb.get(k, _ABSENT)) for k in keys if fa.get(k, _ABSENT) != fb.get(k, _ABSENT)]


def _label(config: ConfigSource, overrides: list[str], fallback: str) -> str:
    base = Path(config).stem if isinstance(config, (str, Path)) else fallback
    return base + (f" ({', '.join(overrides)})" if overrides else "")


def compare(config_a: ConfigSource, config_b: ConfigSource | None = None, *, overrides: list[str] | None = None,
            set_a: list[str] | None = None, set_b: list[str] | None = None) -> Comparison:
    """Estimate A and B and line their stages up. ``config_b`` defaults to ``config_a``;
    ``overrides`` apply to both sides, ``set_a``/``set_b`` to one side each (applied after)."""
    overrides, set_a, set_b = list(overrides or []), list(set_a or []), list(set_b or [])
    if config_b is None:
        if not set_a and not set_b:
            raise MemformError("compare needs two configs (memform compare A.yaml B.yaml) or one config with "
                               "--set-a KEY=VALUE and/or --set-b KEY=VALUE variants")
        config_b = config_a
    est_a = estimate(config_a, overrides + set_a)
    est_b = estimate(config_b, overrides + set_b)
    label_a, label_b = _label(config_a, set_a, "A"), _label(config_b, set_b, "B")
    if label_a == label_b:
        label_a, label_b = f"A: {label_a}", f"B: {label_b}"
    n = max(len(est_a.stages), len(est_b.stages))
    stages = [StageDiff(i, est_a.stages[i] if i < len(est_a.stages) else None,
                        est_b.stages[i] if i < len(est_b.stages) else None) for i in range(n)]
    return Comparison(Side(label_a, est_a), Side(label_b, est_b), stages,
                      config_diff(est_a.model.data, est_b.model.data))
