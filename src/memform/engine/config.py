"""Reading, overriding and validating YAML configs.

The set of valid keys is not hard-coded: it is the keys the loaded formula files bind
(``symbol h : int = model.hidden_size``) plus the few structural keys the interpreter itself
reads (:data:`STRUCTURAL`). A new architecture's formula file therefore brings its own
config keys, types and defaults with it.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..errors import MemformError, did_you_mean, read_text
from ..lang import ast
from .values import check_value, get_path


@dataclass(frozen=True)
class Key:
    path: str
    type: ast.TypeSpec | None  # None: checked by hand (lists, strings)
    default: Any
    doc: str
    positive: bool = False


_INT = ast.TypeSpec("int")
#: numeric config keys a search or a solver varies, and the inputs of a compiled structure
#: (:mod:`memform.fastpath.fastcache`) where the config sets them
NUMERIC_KEYS = ("parallel.dp", "parallel.tp", "parallel.cp", "parallel.ep",
                "training.micro_batch_size", "training.num_micro_batches")

#: keys read by the interpreter (partitioning, schedule choice, recompute, capacity)
STRUCTURAL: tuple[Key, ...] = (
    Key("name", None, None, "model name shown in reports (default: the config file's stem)"),
    Key("formulas", None, ["dense.mf"], "formula files, in order; later files override earlier ones"),
    Key("training.framework", None, "megatron",
        "framework profile: what the training framework really allocates (megatron, deepspeed, fsdp2, "
        "mindspore, hf-trainer, torch: formulas/frameworks/NAME.mf, loaded after the config's formula files), "
        "or the path of your own profile .mf file"),
    Key("parallel.pp", _INT, 1, "pipeline-parallel stages", True),
    Key("parallel.vpp", _INT, 1, "virtual pipeline chunks per stage (interleaved schedules)", True),
    Key("parallel.pp_schedule", None, "1f1b", "pipeline schedule: the name of a 'schedule' block"),
    Key("parallel.stage_layers", None, None, "body layers per stage (list of p integers); default: even split"),
    Key("parallel.devices", _INT, None, "total devices; when given must equal the product of the degrees", True),
    Key("training.recompute", None, "none",
        "activation recomputation: none, selective (attention core) or full (layer input only); "
        "or a list of p such modes, one per pipeline stage"),
    Key("training.recompute_layers", None, None,
        "recompute mode of every body layer (a list of none/selective/full, one per layer of the stack "
        "body, in forward order); overrides training.recompute for body layers"),
    Key("training.recompute_num_layers", None, None,
        "full recompute of the first n body layers of each stage (of each model chunk when vpp > 1), as "
        "Megatron-LM's --recompute-method block --recompute-num-layers n; an integer, or a list of p "
        "integers (one per stage). The other layers keep training.recompute's mode, with 'full' there "
        "meaning none"),
    Key("training.selective_recompute_num_layers", None, None,
        "selective recompute of the first n body layers of each stage (of each model chunk when vpp > 1), "
        "as MindFormers' recompute_config.select_recompute given as per-stage layer counts "
        "(mindformers/models/utils.py LayerSetting: the first n layers of the stage, those "
        "training.recompute_num_layers fully recomputes excepted); an integer, or a list of p integers. "
        "The other layers keep training.recompute's mode"),
    Key("training.num_micro_batches", _INT, None,
        "micro-batches per step (default: global_batch_size / (micro_batch_size * dp), else 1)", True),
    Key("training.global_batch_size", _INT, None, "sequences per optimizer step", True),
    Key("device.capacity_gib", ast.TypeSpec("real"), 80, "device memory in GiB used for the fits column", True),
    Key("device.preset", None, None,
        "a bundled device description (configs/devices/NAME.yaml: capacity, peak FLOP/s, bandwidths, "
        "devices per node, efficiency); `device: NAME` is short for `device: {preset: NAME}`, and the "
        "config's own device keys override the preset's"),
)
_STRUCTURAL = {k.path: k for k in STRUCTURAL}


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 exponent numbers: ``1e30`` and ``3E-5`` are numbers, not
    strings (YAML 1.1, which PyYAML follows, wants a dot in the mantissa: ``1.0e+30``). A whole
    mantissa with a non-negative exponent (``1e30``, ``4e3``) is the exact integer it writes."""


_SCIENTIFIC_TAG = "tag:memform:scientific"
ConfigLoader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
ConfigLoader.add_implicit_resolver(
    _SCIENTIFIC_TAG, re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def _scientific(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int | float:
    text = loader.construct_scalar(node).replace("_", "")
    mantissa, exponent = re.split("[eE]", text)
    if "." not in mantissa and not exponent.startswith("-") and len(exponent.lstrip("+")) <= 4:
        return int(mantissa) * 10 ** int(exponent)
    return float(text)


ConfigLoader.add_constructor(_SCIENTIFIC_TAG, _scientific)


def parse_yaml(text: str) -> Any:
    """YAML text as memform reads every config and ``--set`` value (see :class:`ConfigLoader`)."""
    return yaml.load(text, Loader=ConfigLoader)  # noqa: S506 - a SafeLoader subclass


def load_yaml(path: str | Path, what: str = "file") -> Any:
    """A user's YAML file, parsed; syntax errors name file:line:col, pathological input is refused."""
    p = Path(path)
    text = read_text(p, what)
    try:
        data = parse_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}: " if mark else f"{p}: "
        problem = getattr(exc, "problem", None) or str(exc)
        raise MemformError(f"{where}YAML syntax error: {problem}") from None
    except (RecursionError, ValueError) as exc:  # nesting beyond Python's stack; a 5000-digit number
        reason = ("it nests too deeply" if isinstance(exc, RecursionError)
                  else "a number has too many digits" if "digits" in str(exc) else str(exc))
        raise MemformError(f"{p}: cannot read the {what}: {reason}") from None
    check_tree(data, str(p))
    return data


#: parsed config files of this process: resolved path -> (mtime_ns, size, data); a planner or a
#: notebook estimates the same file again and again, and parsing YAML is most of a warm estimate
_READ: dict[str, tuple[int, int, dict[str, Any]]] = {}


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A config file as a mapping (a fresh copy: callers may change it)."""
    p = Path(path)
    try:
        st = p.stat()
        stamp = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = None
    hit = _READ.get(stamp[0]) if stamp else None
    if hit is not None and hit[:2] == stamp[1:]:
        return copy.deepcopy(hit[2])
    data = load_yaml(p, "config file")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise MemformError(f"{p}: a config must be a YAML mapping (model:, parallel:, training:, ...), "
                           f"got {type(data).__name__}")
    if stamp:
        _READ[stamp[0]] = (stamp[1], stamp[2], copy.deepcopy(data))
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
        value = parse_yaml(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    except (RecursionError, ValueError) as exc:
        reason = ("it nests too deeply" if isinstance(exc, RecursionError)
                  else "a number has too many digits" if "digits" in str(exc) else str(exc))
        raise MemformError(f"--set {key}: cannot read the value: {reason}") from None
    check_tree(value, f"--set {key}")
    return key, value


#: Limits on a config's shape. Real configs nest 3 levels and hold ~50 values; YAML aliases can
#: make a few lines expand to billions of values ("billion laughs"), which would hang every
#: later step (copying, key checks, error messages) instead of failing.
MAX_CONFIG_DEPTH = 32
MAX_CONFIG_VALUES = 10_000


def check_tree(data: Any, where: str) -> None:
    """Reject a YAML tree nested deeper or holding more values (aliases expanded) than a config can."""
    todo = [(data, 0)]
    seen = 0
    while todo:
        node, depth = todo.pop()
        seen += 1
        if seen > MAX_CONFIG_VALUES:
            raise MemformError(f"{where}: the config holds more than {MAX_CONFIG_VALUES} values "
                               f"(YAML aliases expanding?)")
        if depth > MAX_CONFIG_DEPTH:
            raise MemformError(f"{where}: the config nests more than {MAX_CONFIG_DEPTH} levels deep")
        if isinstance(node, dict):
            todo.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            todo.extend((v, depth + 1) for v in node)


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
    recompute: str                                  # the global mode, or a short description
    capacity_bytes: int
    recompute_stages: list[str] | None = None       # one mode per stage (training.recompute as a list)
    recompute_layers: list[str] | None = None       # one mode per body layer
    recompute_num_layers: list[int] | None = None   # full recompute of the first n layers, per stage
    selective_num_layers: list[int] | None = None   # selective recompute of the first n layers, per stage
    recompute_default: str = "none"                 # training.recompute when it is one mode
    framework: str = "megatron"                     # training.framework: the profile loaded last

    def stage_mode(self, stage: int) -> str:
        """The recompute mode training.recompute gives ``stage``."""
        return self.recompute_stages[stage] if self.recompute_stages is not None else self.recompute_default

    def layer_mode(self, stage: int, index_in_chunk: int | None, body_index: int | None) -> str:
        """Recompute mode of one layer: per-layer list, else recompute_num_layers, else the stage's.

        ``None`` indices mean a pinned layer (embedding, output head): it gets the stage's mode.
        """
        mode = self.stage_mode(stage)
        if body_index is None or index_in_chunk is None:
            return mode
        if self.recompute_layers is not None:
            return self.recompute_layers[body_index]
        if self.recompute_num_layers is not None:
            if index_in_chunk < self.recompute_num_layers[stage]:
                return "full"
            mode = "none" if mode == "full" else mode
        if self.selective_num_layers is not None and index_in_chunk < self.selective_num_layers[stage] \
                and mode != "full":
            return "selective"
        return mode


def structural_value(data: Mapping[str, Any], path: str) -> Any:
    key = _STRUCTURAL[path]
    raw = get_path(data, path, None)
    if raw is None:
        return key.default
    if key.type is None:
        return raw
    v = check_value(raw, key.type, path, positive=key.positive)
    return v if isinstance(v, str) else (int(v) if key.type.kind == "int" else v)


#: where the bundled device presets live, relative to the bundled configs
DEVICES_DIR = "devices"


def device_presets() -> list[str]:
    """The bundled device presets' names (``configs/devices/NAME.yaml``)."""
    from ..resources import data_dir
    return sorted(f.stem for f in (data_dir("configs") / DEVICES_DIR).glob("*.yaml"))


def expand_device(out: dict[str, Any]) -> None:
    """``device: h100-sxm`` or ``device: {preset: h100-sxm, ...}``: the preset's keys under the config's."""
    device = out.get("device")
    if isinstance(device, str):
        device = out["device"] = {"preset": device}
    if not isinstance(device, dict) or device.get("preset") is None:
        return
    name = device["preset"]
    if not isinstance(name, str) or name not in device_presets():
        raise MemformError(f"config key 'device.preset' is {name!r}: no such device preset; bundled: "
                           f"{', '.join(device_presets())}{did_you_mean(str(name), device_presets())}")
    preset = {k: v for k, v in _device_preset(name).items() if k != "name"}
    out["device"] = {**preset, **device}


#: parsed device presets: name -> (mtime_ns, size, data); every rebind of a config (a search's or a
#: what-if page's structures) expands its preset again
_PRESETS: dict[str, tuple[int, int, Any]] = {}


def _device_preset(name: str) -> Any:
    from ..resources import data_dir
    path = data_dir("configs") / DEVICES_DIR / f"{name}.yaml"
    try:
        st = path.stat()
        stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = None
    hit = _PRESETS.get(name)
    if stamp is not None and hit is not None and hit[:2] == stamp:
        return copy.deepcopy(hit[2])
    data = load_yaml(path, "device preset")
    if stamp is not None:
        _PRESETS[name] = (*stamp, copy.deepcopy(data))
    return data


def normalize(data: dict[str, Any], source: Path | None) -> dict[str, Any]:
    """Fill derived keys (micro-batch count) and check cross-key consistency."""
    out = copy.deepcopy(data)
    expand_device(out)
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
    framework = structural_value(out, "training.framework")
    if not isinstance(framework, str) or not framework.strip():
        raise MemformError(f"config key 'training.framework' must be a framework name "
                           f"({', '.join(frameworks())}) or a profile .mf file, got {framework!r}")
    return out


#: where framework profiles live, relative to the bundled formula files
FRAMEWORKS_DIR = "frameworks"
#: the bundled file loaded after a config's formula files and profile (formulas/offload.mf) when the config
#: sets one of its keys
OFFLOAD_FILE = "offload.mf"
OFFLOAD_KEYS = ("training.activation_offload", "training.activation_offload_layers",
                "training.activation_offload_modules", "training.activation_offload_min_elements")


def frameworks() -> list[str]:
    """The bundled framework profiles' names (``formulas/frameworks/NAME.mf``)."""
    from ..resources import formulas_dir
    return sorted(f.stem for f in (formulas_dir() / FRAMEWORKS_DIR).glob("*.mf"))


def formula_files(data: Mapping[str, Any]) -> list[str]:
    """The formula files a normalized config loads: its ``formulas`` list, then its framework profile,
    then ``offload.mf`` where the config sets an activation-offload key (it needs every other file's last
    word).

    The profile comes last so that it overrides the model files; a name is a bundled profile, a
    name ending in ``.mf`` a file of the user's (relative to the config). A bundled profile NAME may
    refine a model file F.mf with ``frameworks/NAME/F.mf``, loaded after the profile when the config
    loads F.mf: the profile itself may name only what every model defines (common.mf, dense.mf).
    """
    framework = structural_value(data, "training.framework")
    if framework.endswith(".mf"):
        profile = framework
    else:
        if framework not in frameworks():
            raise MemformError(f"config key 'training.framework' is {framework!r}: no such framework profile; "
                               f"bundled: {', '.join(frameworks())} (or give a profile .mf file)"
                               f"{did_you_mean(framework, frameworks())}")
        profile = f"{FRAMEWORKS_DIR}/{framework}.mf"
    files = list(data["formulas"])
    files = files if profile in files else files + [profile]
    # a bundled profile's refinements of model files: frameworks/NAME/F.mf follows the profile when
    # the config loads F.mf (what the profile says about layers only that file defines)
    if not framework.endswith(".mf"):
        from ..resources import formulas_dir
        for name in data["formulas"]:
            companion = f"{FRAMEWORKS_DIR}/{framework}/{Path(name).name}"
            if (formulas_dir() / companion).is_file() and companion not in files:
                files.append(companion)
    # activation offloading subtracts from what every file above says a layer saves: it comes last, for a
    # config that names it (any value: its keys are declared there); other configs load exactly what they did
    if any(get_path(data, key, None) is not None for key in OFFLOAD_KEYS) and OFFLOAD_FILE not in files:
        files.append(OFFLOAD_FILE)
    return files


def _approx(x: Any) -> str:
    """A number for a message, however large (``float()`` of a 400-digit integer overflows)."""
    try:
        return f"{float(x):g}"
    except OverflowError:
        return f"about 10^{len(str(int(x))) - 1}"


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
    recompute, stages, layers, num_layers, selective = _recompute(data, pp)
    default = get_path(data, "training.recompute", None)
    cap = structural_value(data, "device.capacity_gib")
    if cap > 2 ** 200:  # reports turn byte counts into floats; 2^230 bytes is far past any device
        raise MemformError(f"config key 'device.capacity_gib' must be at most 2^200, got {_approx(cap)}")
    return Structure(name=data["name"], pp=pp, vpp=vpp, schedule=schedule, stage_layers=stage_layers,
                     recompute=recompute, capacity_bytes=int(math.floor(cap * 2 ** 30)),
                     recompute_stages=stages, recompute_layers=layers, recompute_num_layers=num_layers,
                     selective_num_layers=selective,
                     recompute_default=default if isinstance(default, str) else "none",
                     framework=structural_value(data, "training.framework"))


RECOMPUTE_MODES = ("none", "selective", "full")


def _modes(value: Any, key: str, what: str) -> list[str]:
    """A list of recompute modes, or a :class:`MemformError` naming ``key``."""
    if not isinstance(value, list) or not value:
        raise MemformError(f"config key '{key}' must be {what}, got {value!r}")
    for i, mode in enumerate(value):
        if mode not in RECOMPUTE_MODES:
            hint = did_you_mean(str(mode), RECOMPUTE_MODES) if isinstance(mode, str) else ""
            raise MemformError(f"config key '{key}' entry {i} is {mode!r}: a recompute mode must be one of "
                               f"{', '.join(RECOMPUTE_MODES)}{hint}")
    return list(value)


def _layer_counts(data: Mapping[str, Any], key: str, pp: int) -> list[int] | None:
    """A per-stage layer-count key (an int or p ints), checked; None when absent."""
    num = get_path(data, key, None)
    if num is None:
        return None
    items = num if isinstance(num, list) else [num] * pp
    if (not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in items)
            or len(items) != pp):
        raise MemformError(f"config key '{key}' must be a non-negative integer or "
                           f"a list of {pp} of them (one per pipeline stage), got {num!r}")
    return items


def _recompute(data: Mapping[str, Any], pp: int
               ) -> tuple[str, list[str] | None, list[str] | None, list[int] | None, list[int] | None]:
    """training.recompute (mode or per-stage list), recompute_layers, recompute_num_layers and
    selective_recompute_num_layers, checked."""
    raw = get_path(data, "training.recompute", None)
    stages = None
    if raw is None:
        mode = "none"
    elif isinstance(raw, list):
        stages = _modes(raw, "training.recompute", f"a recompute mode or a list of {pp} modes (one per stage)")
        if len(stages) != pp:
            raise MemformError(f"config key 'training.recompute' lists {len(stages)} modes but there are "
                               f"{pp} pipeline stages (parallel.pp); give one mode per stage")
        mode = stages[0] if len(set(stages)) == 1 else "per-stage " + "/".join(stages)
    elif isinstance(raw, str) and raw in RECOMPUTE_MODES:
        mode = raw
    else:
        raise MemformError(f"config key 'training.recompute' must be one of {', '.join(RECOMPUTE_MODES)} or a "
                           f"list of {pp} of them (one per stage), got {raw!r}"
                           f"{did_you_mean(raw, RECOMPUTE_MODES) if isinstance(raw, str) else ''}")
    layers = get_path(data, "training.recompute_layers", None)
    if layers is not None:
        layers = _modes(layers, "training.recompute_layers", "a list of recompute modes, one per body layer")
        mode = "per-layer"
    num = _layer_counts(data, "training.recompute_num_layers", pp)
    selective = _layer_counts(data, "training.selective_recompute_num_layers", pp)
    for key, value in (("recompute_num_layers", num), ("selective_recompute_num_layers", selective)):
        if value is not None and layers is not None:
            raise MemformError(f"config keys 'training.recompute_layers' and 'training.{key}' "
                               "both choose per-layer recompute modes; give only one of them")

    def counts(ns: list[int]) -> str:
        return str(ns[0]) if len(set(ns)) == 1 else "/".join(map(str, ns))

    if num is not None or selective is not None:
        rest = "none" if num is not None and mode == "full" else mode
        parts = ([f"full×{counts(num)}"] if num is not None else []) + \
                ([f"selective×{counts(selective)}"] if selective is not None else [])
        mode = " + ".join(parts + [rest])
    return mode, stages, layers, num, selective


def known_keys(bindings: Mapping[str, ast.Binding]) -> dict[str, str]:
    known = {k.path: "memform" for k in STRUCTURAL}
    for b in bindings.values():
        known.setdefault(b.path, f"{b.keyword} {b.name} ({b.loc})")
    return known
