"""Reading, overriding and validating YAML configs.

The set of valid keys is not hard-coded: it is the keys the loaded formula files bind
(``symbol h : int = model.hidden_size``) plus the few structural keys the interpreter itself
reads (:data:`STRUCTURAL`). A new architecture's formula file therefore brings its own
config keys, types and defaults with it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from . import ast
from .binding import coerce, get_path
from .errors import MemformError, did_you_mean


@dataclass(frozen=True)
class Key:
    path: str
    type: ast.TypeSpec | None  # None: checked by hand (lists, strings)
    default: Any
    doc: str
    positive: bool = False


_INT = ast.TypeSpec("int")
#: keys read by the interpreter (partitioning, schedule choice, recompute, capacity)
STRUCTURAL: tuple[Key, ...] = (
    Key("name", None, None, "model name shown in reports (default: the config file's stem)"),
    Key("formulas", None, ["dense.mf"], "formula files, in order; later files override earlier ones"),
    Key("parallel.pp", _INT, 1, "pipeline-parallel stages", True),
    Key("parallel.vpp", _INT, 1, "virtual pipeline chunks per stage (interleaved schedules)", True),
    Key("parallel.pp_schedule", None, "1f1b", "pipeline schedule: the name of a 'schedule' block"),
    Key("parallel.stage_layers", None, None, "body layers per stage (list of p integers); default: even split"),
    Key("parallel.devices", _INT, None, "total devices; when given must equal the product of the degrees", True),
    Key("training.recompute", ast.TypeSpec("enum", choices=("none", "selective", "full")), "none",
        "activation recomputation: none, selective (attention core) or full (layer input only)"),
    Key("training.num_micro_batches", _INT, None,
        "micro-batches per step (default: global_batch_size / (micro_batch_size * dp), else 1)", True),
    Key("training.global_batch_size", _INT, None, "sequences per optimizer step", True),
    Key("device.capacity_gib", ast.TypeSpec("real"), 80, "device memory in GiB used for the fits column", True),
)
_STRUCTURAL = {k.path: k for k in STRUCTURAL}


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MemformError(f"config file not found: {p}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MemformError(f"cannot read config {p}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}: " if mark else f"{p}: "
        problem = getattr(exc, "problem", None) or str(exc)
        raise MemformError(f"{where}YAML syntax error: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise MemformError(f"{p}: a config must be a YAML mapping (model:, parallel:, training:, ...), "
                           f"got {type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[str, Any]:
    """``parallel.tp=8`` → ("parallel.tp", 8); the value is read as YAML."""
    if "=" not in text:
        raise MemformError(f"--set expects KEY=VALUE (e.g. parallel.tp=8), got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise MemformError(f"--set has an empty key in {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key, value


def apply_overrides(data: dict[str, Any], overrides: Mapping[str, Any] | list[str] | None) -> dict[str, Any]:
    """A deep copy of ``data`` with dotted-path overrides applied."""
    out = copy.deepcopy(data)
    if not overrides:
        return out
    items = [parse_override(o) for o in overrides] if isinstance(overrides, list) else list(overrides.items())
    for key, value in items:
        node = out
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise MemformError(f"cannot set '{key}': '{'.'.join(parts[:i + 1])}' is not a mapping")
            node = nxt
        node[parts[-1]] = value
    return out


def check_keys(data: Mapping[str, Any], known: dict[str, str]) -> None:
    """Reject keys nobody reads. ``known`` maps each valid dotted path to who reads it."""
    prefixes = {".".join(k.split(".")[:i]) for k in known for i in range(1, k.count(".") + 1)}

    def visit(node: Mapping[str, Any], prefix: str) -> None:
        for key, value in node.items():
            if not isinstance(key, str):
                raise MemformError(f"config key {key!r} under '{prefix or '<top>'}' must be a string")
            path = f"{prefix}.{key}" if prefix else key
            if path in known:
                continue
            if path in prefixes:
                if value is None:
                    continue
                if not isinstance(value, Mapping):
                    raise MemformError(f"config key '{path}' must be a mapping, got {value!r}")
                visit(value, path)
                continue
            siblings = [k for k in known | {p: "" for p in prefixes} if k.rsplit(".", 1)[0] == prefix
                        or (not prefix and "." not in k)]
            hint = did_you_mean(path, list(known) + list(prefixes)) or did_you_mean(path, siblings)
            raise MemformError(f"unknown config key '{path}'{hint}")

    visit(data, "")


@dataclass
class Structure:
    """The structural settings the interpreter reads, validated."""

    name: str
    pp: int
    vpp: int
    schedule: str
    stage_layers: list[int] | None
    recompute: str
    capacity_bytes: int


def structural_value(data: Mapping[str, Any], path: str) -> Any:
    key = _STRUCTURAL[path]
    raw = get_path(data, path, None)
    if raw is None:
        return key.default
    if key.type is None:
        return raw
    v = coerce(raw, key.type, path, positive=key.positive)
    return v if isinstance(v, str) else (int(v) if key.type.kind == "int" else v)


def normalize(data: dict[str, Any], source: Path | None) -> dict[str, Any]:
    """Fill derived keys (micro-batch count) and check cross-key consistency."""
    out = copy.deepcopy(data)
    training = out.setdefault("training", {}) if isinstance(out.get("training", {}), dict) else None
    if training is None:
        raise MemformError("config key 'training' must be a mapping")
    m = structural_value(out, "training.num_micro_batches")
    gbs = structural_value(out, "training.global_batch_size")
    mbs = get_path(out, "training.micro_batch_size", 1)
    dp = get_path(out, "parallel.dp", 1)
    if gbs is not None and isinstance(mbs, int) and isinstance(dp, int) and mbs > 0 and dp > 0:
        if gbs % (mbs * dp):
            raise MemformError(f"training.global_batch_size ({gbs}) must be a multiple of "
                               f"training.micro_batch_size × parallel.dp ({mbs} × {dp})")
        derived = gbs // (mbs * dp)
        if m is not None and m != derived:
            raise MemformError(f"training.num_micro_batches ({m}) disagrees with training.global_batch_size "
                               f"/ (micro_batch_size × dp) = {gbs} / ({mbs} × {dp}) = {derived}")
        m = derived
    training["num_micro_batches"] = 1 if m is None else m
    if not out.get("name"):
        out["name"] = source.stem if source else "model"
    if not isinstance(out["name"], str):
        raise MemformError(f"config key 'name' must be a string, got {out['name']!r}")
    formulas = out.get("formulas", _STRUCTURAL["formulas"].default)
    if isinstance(formulas, str):
        formulas = [formulas]
    if not isinstance(formulas, list) or not formulas or not all(isinstance(f, str) for f in formulas):
        raise MemformError(f"config key 'formulas' must be a list of formula file names, got {formulas!r}")
    out["formulas"] = formulas
    return out


def structure(data: Mapping[str, Any], schedules: list[str]) -> Structure:
    pp = structural_value(data, "parallel.pp")
    vpp = structural_value(data, "parallel.vpp")
    schedule = structural_value(data, "parallel.pp_schedule")
    if not isinstance(schedule, str) or schedule not in schedules:
        raise MemformError(f"config key 'parallel.pp_schedule' must name a schedule "
                           f"({', '.join(sorted(schedules))}), got {schedule!r}"
                           f"{did_you_mean(str(schedule), schedules)}")
    stage_layers = get_path(data, "parallel.stage_layers", None)
    if stage_layers is not None:
        if (not isinstance(stage_layers, list) or len(stage_layers) != pp
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in stage_layers)):
            raise MemformError(f"config key 'parallel.stage_layers' must be a list of {pp} non-negative "
                               f"integers (one per pipeline stage), got {stage_layers!r}")
    recompute = structural_value(data, "training.recompute")
    cap = structural_value(data, "device.capacity_gib")
    import math
    return Structure(name=data["name"], pp=pp, vpp=vpp, schedule=schedule, stage_layers=stage_layers,
                     recompute=recompute, capacity_bytes=int(math.floor(cap * 2 ** 30)))


def known_keys(bindings: Mapping[str, ast.Binding]) -> dict[str, str]:
    known = {k.path: "memform" for k in STRUCTURAL}
    for b in bindings.values():
        known.setdefault(b.path, f"{b.keyword} {b.name} ({b.loc})")
    return known
