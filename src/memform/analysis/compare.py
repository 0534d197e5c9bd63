"""Comparing estimates stage by stage: N configs, variants of one config, or a sweep of keys.

The question behind it is "what does this change buy me?" (tp 4 -> 8, selective -> full
recompute, 1f1b -> interleaved), so every stage shows every variant's breakdown side by side
and the difference to the first variant that estimated (the *baseline*) per category.

Variants, in this order (each gets a letter: A, B, C, ...):

* every config given (``compare(a, b, c)``);
* every ``variants`` entry: the first config with that list of overrides
  (``memform compare A.yaml --variant 'parallel.tp=4,training.recompute=full'``);
* ``set_a`` / ``set_b`` add overrides to variant A / B (``--set-a`` / ``--set-b``); with a single
  config and no other variant, B is that config again (the two-variant form of old);
* ``vary`` (``--vary parallel.tp=1,2,4,8``) replaces each variant so far by one variant per value,
  several keys giving their cartesian product.

A variant that changes a parallel degree of the device product (``parallel.tp``, ``pp`` or ``cp``)
without setting ``parallel.dp`` keeps its config's device count: its ``dp`` becomes the devices
over the new ``tp × pp × cp`` (and the variant fails, saying so, where that does not divide). "tp 4 ->
8" is a question about the same cluster; ``free_devices`` (``--free-devices``) lets the count follow
the degrees instead.

``overrides`` (``--set``) apply to every variant, before the variant's own. A variant whose
estimate fails (an unmet ``require``, a missing file) keeps its error message and no estimate;
only when every variant fails is that an error. Stages are matched by index; a variant with
fewer stages has ``None`` where it lacks one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..engine.config import apply_overrides, normalize, parse_override, read_yaml
from ..engine.interpreter import CATEGORIES, StageResult
from ..engine.model import ConfigSource, Estimate, estimate_numbers
from ..engine.values import dotted
from ..errors import MemformError

#: a comparison estimates every variant; a product of sweeps beyond this is most likely a typo
MAX_VARIANTS = 64
#: the degrees whose product is the device count (expert parallelism works inside dp)
DEVICE_DEGREES = ("parallel.dp", "parallel.tp", "parallel.pp", "parallel.cp")


def variant_key(index: int) -> str:
    """A, B, ..., Z, then V27, V28, ... (the letter a variant is shown under)."""
    return chr(ord("A") + index) if index < 26 else f"V{index + 1}"


@dataclass
class Variant:
    """One run of a comparison: a config with its own overrides, and its estimate or its error."""

    key: str                              # "A", "B", ...
    label: str                            # config stem and the variant's own overrides
    config: ConfigSource
    overrides: list[str]                  # this variant's own overrides (after the shared --set ones)
    est: Estimate | None = None
    error: str | None = None
    #: the config as the estimate read it (normalized), or as far as it could be read when the
    #: estimate failed; None when not even the file could be read
    data: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.est is not None

    @property
    def config_path(self) -> str | None:
        return str(self.config) if isinstance(self.config, (str, Path)) else None


#: the name of a comparison's run before it was N-way (kept for imports)
Side = Variant


@dataclass
class StageDiff:
    """One stage index across the variants: each variant's result (``None`` where the variant
    failed or lacks the stage) and each variant's bytes minus the baseline's."""

    stage: int
    results: list[StageResult | None]
    baseline: int

    @property
    def a(self) -> StageResult | None:
        return self.results[0]

    @property
    def b(self) -> StageResult | None:
        return self.results[1] if len(self.results) > 1 else None

    def delta_between(self, i: int, j: int) -> dict[str, int] | None:
        """Variant j - variant i bytes per category (and ``peak``), or None when one lacks this stage."""
        x, y = self.results[i], self.results[j]
        if x is None or y is None:
            return None
        out = {c: y.values[c] - x.values[c] for c in CATEGORIES}
        out["peak"] = y.peak_bytes - x.peak_bytes
        return out

    @property
    def deltas(self) -> list[dict[str, int] | None]:
        """Per variant: its bytes minus the baseline's (None for the baseline itself and where missing)."""
        return [None if j == self.baseline else self.delta_between(self.baseline, j)
                for j in range(len(self.results))]

    @property
    def delta(self) -> dict[str, int] | None:
        """B - A bytes per category (and ``peak``), or None when one side lacks this stage."""
        return self.delta_between(0, 1) if len(self.results) > 1 else None


@dataclass
class Comparison:
    variants: list[Variant]
    stages: list[StageDiff]
    baseline: int                                  # index of the first variant that estimated
    config_keys: list[tuple[str, list[Any]]]       # (dotted key, value per variant) where they differ
    sweep: list[tuple[str, list[str]]] = field(default_factory=list)   # (key, values) of --vary

    # ---- the two-variant view (A and B), as before comparisons were N-way
    @property
    def a(self) -> Variant:
        return self.variants[0]

    @property
    def b(self) -> Variant:
        return self.variants[1]

    @property
    def config_diff(self) -> list[tuple[str, Any, Any]]:
        """(dotted key, value in A, value in B) for the keys where A and B differ."""
        return [(k, vals[0], vals[1]) for k, vals in self.config_keys if vals[0] != vals[1]]

    @property
    def peak_delta(self) -> int | None:
        """B's peak minus A's (None when either failed)."""
        return self._peak_minus(0, 1)

    # ---- N variants
    @property
    def ok_variants(self) -> list[Variant]:
        return [v for v in self.variants if v.ok]

    @property
    def failed(self) -> list[Variant]:
        return [v for v in self.variants if not v.ok]

    @property
    def peak_deltas(self) -> list[int | None]:
        """Per variant: its peak minus the baseline's (None for the baseline and failed variants)."""
        return [None if j == self.baseline else self._peak_minus(self.baseline, j) for j in range(len(self.variants))]

    @property
    def step_deltas(self) -> list[float | None]:
        """Per variant: its step seconds minus the baseline's (None for the baseline, failed variants
        and where either has no time model: no device peak FLOP/s)."""
        base = self.variants[self.baseline].est
        out: list[float | None] = []
        for j, v in enumerate(self.variants):
            ok = j != self.baseline and v.est is not None and base is not None and v.est.has_time and base.has_time
            out.append(v.est.step_seconds - base.step_seconds if ok else None)
        return out

    def _peak_minus(self, i: int, j: int) -> int | None:
        x, y = self.variants[i].est, self.variants[j].est
        return None if x is None or y is None else y.peak_bytes - x.peak_bytes

    @property
    def title(self) -> str:
        """A short name for the whole comparison (headings, chart titles)."""
        labels = [v.label for v in self.variants]
        if self.sweep:
            # the dp that keeps the device count follows the swept degree: not a variant of its own
            strip = self.sweep + [("parallel.dp", [])]
            bases = list(dict.fromkeys(_strip_sweep(v.label, strip) for v in self.variants))
            what = "; ".join(f"{k} = {', '.join(vals)}" for k, vals in self.sweep)
            return (f"{bases[0]}: " if len(bases) == 1 else f"{' vs '.join(bases)}: ") + what
        if len(labels) <= 4:
            return " vs ".join(labels)
        return f"{labels[0]} and {len(labels) - 1} other variants"

    def to_dict(self) -> dict[str, Any]:
        """The ``memform compare --json`` shape (README, "Reports"): ``variants`` (one entry per
        variant, its ``estimate`` exactly ``memform estimate --json``, or its ``error``), the
        baseline's key, ``config_keys`` and, for the first two variants as before, ``a``, ``b``,
        ``config_diff``, ``peak_delta_bytes`` and per-stage ``stages`` deltas (B - A)."""
        dicts = [v.est.to_dict() if v.ok else None for v in self.variants]
        peaks, steps = self.peak_deltas, self.step_deltas
        variants = []
        for j, (v, d) in enumerate(zip(self.variants, dicts)):
            variants.append({
                "key": v.key, "label": v.label, "config": v.config_path, "overrides": list(v.overrides),
                "ok": v.ok, "error": v.error, "estimate": d,
                "peak_delta_bytes": peaks[j],
                "step_delta_seconds": steps[j],
                "stage_deltas": [{"stage": s.stage, "delta": s.deltas[j]} for s in self.stages],
            })

        def side(j: int) -> dict[str, Any]:
            v = self.variants[j]
            return {"label": v.label, **dicts[j]} if v.ok else {"label": v.label, "error": v.error}

        return {
            "baseline": self.variants[self.baseline].key,
            "variants": variants,
            "config_keys": [{"key": k, "values": list(vals)} for k, vals in self.config_keys],
            "sweep": [{"key": k, "values": list(vals)} for k, vals in self.sweep],
            "a": side(0),
            "b": side(1),
            "config_diff": [{"key": k, "a": va, "b": vb} for k, va, vb in self.config_diff],
            "peak_delta_bytes": self.peak_delta,
            "stages": [{"stage": d.stage, "delta": d.delta} for d in self.stages],
        }


_ABSENT = "(unset)"
_UNREAD = "(not read)"


def config_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    fa, fb = dotted(a, keep_empty=False), dotted(b, keep_empty=False)
    keys = sorted(set(fa) | set(fb))
    return [(k, fa.get(k, _ABSENT), fb.get(k, _ABSENT)) for k in keys if fa.get(k, _ABSENT) != fb.get(k, _ABSENT)]


def config_keys(datas: Sequence[Mapping[str, Any] | None]) -> list[tuple[str, list[Any]]]:
    """The dotted keys whose values differ between the configs that could be read, with every
    config's value (``(unset)`` where a config lacks the key, ``(not read)`` for an unread one)."""
    flats = [dotted(d, keep_empty=False) if d is not None else None for d in datas]
    keys = sorted(set().union(*[f for f in flats if f is not None]))
    out = []
    for k in keys:
        vals = [f.get(k, _ABSENT) if f is not None else _UNREAD for f in flats]
        known = [v for v, f in zip(vals, flats) if f is not None]
        if any(v != known[0] for v in known):
            out.append((k, vals))
    return out


def split_top_level(text: str, what: str) -> list[str]:
    """``a=1,b=[2,3]`` -> ``["a=1", "b=[2,3]"]``: split at commas outside brackets and quotes."""
    parts, depth, quote, cur = [], 0, None, []
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur).strip())
    if any(not p for p in parts):
        raise MemformError(f"{what} {text!r}: an empty item between commas")
    return parts


def parse_variant(spec: str | Sequence[str]) -> list[str]:
    """``--variant 'parallel.tp=4,training.recompute=full'`` -> its ``KEY=VALUE`` overrides."""
    items = split_top_level(spec, "--variant") if isinstance(spec, str) else list(spec)
    for item in items:
        if "=" not in item:
            raise MemformError(f"--variant {spec!r}: {item!r} is not KEY=VALUE (separate overrides with commas; "
                               f"a list value goes in brackets, e.g. training.recompute=[full,none])")
        parse_override(item)
    return items


def parse_vary(spec: str) -> tuple[str, list[str]]:
    """``--vary parallel.tp=1,2,4,8`` -> ``("parallel.tp", ["1", "2", "4", "8"])``."""
    if "=" not in spec:
        raise MemformError(f"--vary expects KEY=VALUE1,VALUE2,... (e.g. parallel.tp=1,2,4,8), got {spec!r}")
    key, raw = spec.split("=", 1)
    key = key.strip()
    values = split_top_level(raw, f"--vary {key}") if raw.strip() else []
    if not values:
        raise MemformError(f"--vary {key}: no values (e.g. --vary {key}=1,2,4)")
    for v in values:
        parse_override(f"{key}={v}")
    if len(set(values)) != len(values):
        raise MemformError(f"--vary {key}: a value is given twice ({', '.join(values)})")
    return key, values


def _label(config: ConfigSource, overrides: list[str], fallback: str) -> str:
    base = Path(config).stem if isinstance(config, (str, Path)) else fallback
    return base + (f" ({', '.join(overrides)})" if overrides else "")


def _strip_sweep(label: str, sweep: list[tuple[str, list[str]]]) -> str:
    """A variant's label without its sweep overrides (for the comparison's title)."""
    base, _, rest = label.partition(" (")
    keep = [o for o in rest.rstrip(")").split(", ") if o and not any(o.startswith(k + "=") for k, _ in sweep)]
    return base + (f" ({', '.join(keep)})" if keep else "")


def _config_data(config: ConfigSource, overrides: list[str]) -> dict[str, Any] | None:
    """The config a failed variant would have estimated, as far as it can be read."""
    try:
        raw = dict(config) if isinstance(config, Mapping) else read_yaml(config)
        data = apply_overrides(raw, overrides)
        source = Path(config) if isinstance(config, (str, Path)) else None
        try:
            return normalize(data, source)
        except MemformError:
            return data
    except MemformError:
        return None


def plan(configs: Sequence[ConfigSource], *, set_a: Iterable[str] = (), set_b: Iterable[str] = (),
         variants: Iterable[str | Sequence[str]] = (), vary: Iterable[str] = ()
         ) -> tuple[list[tuple[ConfigSource, list[str]]], list[tuple[str, list[str]]]]:
    """The variants to estimate, as (config, own overrides), and the parsed sweep."""
    set_a, set_b = list(set_a), list(set_b)
    runs: list[tuple[ConfigSource, list[str]]] = [(c, []) for c in configs]
    runs += [(configs[0], parse_variant(v)) for v in variants]
    if len(runs) == 1 and (set_a or set_b):
        runs.append((configs[0], []))
    if runs:
        runs[0] = (runs[0][0], runs[0][1] + set_a)
    if len(runs) > 1:
        runs[1] = (runs[1][0], runs[1][1] + set_b)
    sweep = [parse_vary(s) for s in vary]
    seen = [k for k, _ in sweep]
    dup = sorted({k for k in seen if seen.count(k) > 1})
    if dup:
        raise MemformError(f"--vary {dup[0]} is given twice; list every value in one --vary {dup[0]}=V1,V2,...")
    if sweep:
        n = len(runs) * _product([len(vals) for _, vals in sweep])
        if n > MAX_VARIANTS:
            raise MemformError(f"the sweep makes {n} variants ({len(runs)} × "
                               f"{' × '.join(str(len(v)) for _, v in sweep)}); compare takes at most {MAX_VARIANTS}")
        combos = list(itertools.product(*[[f"{k}={v}" for v in vals] for k, vals in sweep]))
        runs = [(c, own + list(combo)) for c, own in runs for combo in combos]
    if len(runs) > MAX_VARIANTS:
        raise MemformError(f"{len(runs)} variants; compare takes at most {MAX_VARIANTS}")
    return runs, sweep


def _degrees(config: ConfigSource, overrides: list[str]) -> dict[str, int] | None:
    """dp, tp, pp, cp of a config with overrides (1 where unset), or None where they cannot be read
    as positive integers (the estimate will say why)."""
    data = _config_data(config, overrides)
    if data is None:
        return None
    out = {}
    for key in DEVICE_DEGREES:
        section, name = key.split(".")
        v = (data.get(section) or {}).get(name, 1) if isinstance(data.get(section) or {}, Mapping) else None
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            return None
        out[key] = v
    return out


def _keep_devices(config: ConfigSource, shared: list[str], own: list[str]) -> list[str]:
    """``own`` plus the ``parallel.dp`` that keeps the device count of ``config`` (with the shared
    ``--set`` overrides), where ``own`` changes tp, pp or cp and sets neither dp nor the device count
    (see the module docstring)."""
    keys = {o.partition("=")[0].strip() for o in own}
    if not keys & set(DEVICE_DEGREES[1:]) or keys & {"parallel.dp", "parallel.devices"}:
        return own
    before, after = _degrees(config, shared), _degrees(config, shared + own)
    if before is None or after is None:
        return own
    devices = _product(list(before.values()))
    others = _product([v for k, v in after.items() if k != "parallel.dp"])
    if devices % others:
        raise MemformError(f"keeps the config's {devices} devices, which tp × pp × cp = {others} does not divide "
                           f"(--free-devices lets the device count follow the degrees)")
    return own + [f"parallel.dp={devices // others}"] if devices // others != after["parallel.dp"] else own


def _product(xs: list[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def compare(*configs: ConfigSource | None, overrides: list[str] | None = None,
            set_a: list[str] | None = None, set_b: list[str] | None = None,
            variants: Sequence[str | Sequence[str]] | None = None, vary: Sequence[str] | None = None,
            free_devices: bool = False) -> Comparison:
    """Estimate every variant (see the module's docstring for how they are formed) and line
    their stages up. ``compare(a, b)``, ``compare(a, set_b=[...])`` are the two-variant forms."""
    configs_l = [c for c in configs if c is not None]
    if not configs_l:
        raise MemformError("compare needs at least one config")
    shared = list(overrides or [])
    runs, sweep = plan(configs_l, set_a=set_a or [], set_b=set_b or [], variants=variants or [], vary=vary or [])
    if len(runs) < 2:
        raise MemformError("compare needs two variants or more: several configs (memform compare A.yaml B.yaml "
                           "C.yaml), or one config with --variant 'KEY=VALUE,...', --set-a KEY=VALUE / "
                           "--set-b KEY=VALUE, or a sweep --vary KEY=V1,V2,...")
    out: list[Variant] = []
    for i, (config, own) in enumerate(runs):
        v = Variant(variant_key(i), _label(config, own, variant_key(i)), config, own)
        try:
            if not free_devices:
                own = _keep_devices(config, shared, own)
                v.label, v.overrides = _label(config, own, variant_key(i)), own
            v.est = estimate_numbers(config, shared + own)  # numbers only: no closed form is shown
            v.data = v.est.model.data
        except MemformError as exc:
            v.error = str(exc)
            v.data = _config_data(config, shared + own)
        out.append(v)
    ok = [i for i, v in enumerate(out) if v.ok]
    if not ok:
        messages = list(dict.fromkeys(v.error for v in out))
        if len(messages) == 1:
            raise MemformError(f"every variant failed: {messages[0]}")
        raise MemformError("every variant failed:\n" + "\n".join(f"  {v.key} ({v.label}): {v.error}" for v in out))
    n = max(len(out[i].est.stages) for i in ok)
    stages = [StageDiff(s, [v.est.stages[s] if v.ok and s < len(v.est.stages) else None for v in out], ok[0])
              for s in range(n)]
    return Comparison(out, stages, ok[0], config_keys([v.data for v in out]), sweep)
