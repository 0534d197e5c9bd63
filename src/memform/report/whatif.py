"""The interactive what-if page: every stage's closed forms as exact JavaScript, with inputs.

``memform whatif CONFIG -o whatif.html`` writes one self-contained HTML file (no network, no
external script or style). The page carries, for each *structural* variant of the config (pipeline
size, virtual chunks, schedule, recompute mode, ZeRO stage: they change the stage partition or the
substituted options), the per-stage, per-category closed forms that the interpreter derives with
``resolve=False`` (valid for every value of the kept symbols; see
:class:`memform.fastpath.compiled.CompiledModel`), compiled to BigInt JavaScript by
:func:`memform.fastpath.exact.compile_js`: the same exact integer computation that ``memform search``
runs in numpy, so the page shows what ``memform estimate --set ...`` prints, byte for byte. The numeric
symbols (parallel degrees, micro-batch size and count, sequence length, and any ``--vary`` key) are
inputs; the formula files' ``require`` conditions come along and are checked on every change, as are
the device count and the global batch size, so values the estimate would refuse are flagged rather
than shown. Where the config has a time model (a device with peak FLOP/s), each stage's step time,
the stages' ideal time and the tokens per step come along too, in floating point with exact branch
conditions as ``memform search`` computes them, so the page shows the step time, MFU and tokens/s.

No formula lives here: the page data is built from the engine's and the analysis's results.
"""

from __future__ import annotations

import hashlib
import itertools
import shlex
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

import sympy

from ..fastpath.compiled import NUMERIC_KEYS, CompiledModel, compile_structures, time_flags
from ..fastpath.exact import JS_HELPERS, compile_js
from ..analysis.search import body_layers, stage_split
from ..engine.binding import get_path
from ..engine.config import RECOMPUTE_MODES
from ..engine.interpreter import CATEGORIES
from ..engine.model import Model, partition_of, rebind
from ..errors import MemformError
from .chart import CAPACITY_COLOR, CATEGORY_COLORS, CATEGORY_LABELS, PEAK_COLOR

#: the numeric config keys a page offers by default (where the formula files bind them)
DEFAULT_KEYS = NUMERIC_KEYS + ("model.seq_length",)
#: the degrees whose product ``parallel.devices`` must equal (as ``memform estimate`` checks it)
DEVICE_KEYS = ("parallel.dp", "parallel.tp", "parallel.pp", "parallel.cp")
#: more structural variants than this make the page large and slow to build: narrow the choices
MAX_VARIANTS = 256
#: keys the page reads or sets itself, never listed as fixed
_PAGE_KEYS = ("parallel.pp", "parallel.vpp", "parallel.pp_schedule", "training.recompute", "parallel.zero",
              "parallel.stage_layers", "parallel.devices", "training.global_batch_size", "device.capacity_gib",
              "training.num_micro_batches")


@dataclass
class Axis:
    """One structural choice offered as a select: its config key and the precomputed values."""

    key: str
    label: str
    values: list[Any]
    base: Any
    #: per value, a note the select shows after it (the effective ZeRO stage), or None
    notes: list[str] | None = None


@dataclass
class WhatIf:
    """Everything the page template needs: the JSON-able ``data`` and one JS function per variant."""

    data: dict[str, Any]
    functions: list[str | None]


def _binding_of(model: Model, key: str) -> tuple[str, Any] | None:
    for name, b in model.program.bindings.items():
        if b.path == key:
            return name, b
    return None


def _plain(v: Any) -> Any:
    if isinstance(v, sympy.Basic) and v.is_number:
        return int(v) if v.is_integer else float(v)
    return v


def int_list(text: str | Sequence[Any] | None, what: str) -> list[int] | None:
    if text is None:
        return None
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for item in items:
        try:
            v = int(str(item).strip())
        except ValueError:
            raise MemformError(f"{what}: expected comma-separated integers, got {item!r}") from None
        if v < 0:
            raise MemformError(f"{what}: values must not be negative, got {v}")
        out.append(v)
    if not out:
        raise MemformError(f"{what}: give at least one value")
    return sorted(set(out))


def str_list(text: str | Sequence[str] | None) -> list[str] | None:
    if text is None:
        return None
    items = text.split(",") if isinstance(text, str) else list(text)
    return list(dict.fromkeys(s.strip() for s in items if s.strip())) or None


def numeric_keys(model: Model, vary: Sequence[str] = ()) -> list[str]:
    """The config keys offered as inputs: :data:`DEFAULT_KEYS` the formulas bind, then ``vary``.

    A ``vary`` key must be bound to an integer ``symbol`` (the exact compiler takes positive
    integers); anything else is a :class:`MemformError` naming the key.
    """
    keys = [k for k in DEFAULT_KEYS if model.symbol_for_key(k) is not None]
    for key in vary:
        if key in _PAGE_KEYS:
            raise MemformError(f"--vary {key}: the page sets this key itself (structural choices: --pp, --vpp, "
                               f"--schedule, --recompute, --zero; the batch, device count and capacity are inputs)")
        found = _binding_of(model, key)
        if found is None:
            raise MemformError(f"--vary {key}: the formula files ({', '.join(model.data['formulas'])}) do not "
                               f"bind this key (see 'memform keys CONFIG')")
        name, b = found
        if b.keyword != "symbol" or b.type.kind != "int" or b.type.or_list:
            raise MemformError(f"--vary {key}: only integer symbols can be varied in the page; '{name}' "
                               f"({b.loc}) is {'an option' if b.keyword != 'symbol' else 'not an integer'}; "
                               f"make a variant with --set instead")
        _check_layout_free(model, key, name)
        if key not in keys:
            keys.append(key)
    return keys


def _layout(model: Model) -> list[list[tuple[str, str, int, tuple]]]:
    part = partition_of(model, model.evaluator(keep=frozenset()))
    return [[(g.block, g.mode, g.count_value, g.bindings) for c in chunks for g in c.groups] for chunks in part.chunks]


def _check_layout_free(model: Model, key: str, name: str) -> None:
    """Refuse a ``--vary`` key that moves layers between stages or blocks (``model.num_layers``,
    ``model.first_k_dense``, ...): the page's partition is fixed per structural variant."""
    base = int(model.bound.value_of(name))
    want = _layout(model)
    for value in (base + 1, 2 * base):
        try:
            same = _layout(rebind(model, {key: value}, check=False)) == want
        except MemformError:
            same = False
        if not same:
            raise MemformError(f"--vary {key}: its value changes how the layers are laid out over the stages "
                               f"(tried {value} instead of {base}), which the page cannot follow; write one page "
                               f"per value with --set {key}=N instead")


def default_axes(model: Model, *, pp: Sequence[int] | None = None, vpp: Sequence[int] | None = None,
                 schedules: Sequence[str] | None = None, recompute: Sequence[str] | None = None,
                 zero: Sequence[int] | None = None) -> list[Axis]:
    """The structural selects: the config's own value plus a few neighbours (or what is given)."""
    st = model.structure
    body = body_layers(model)
    if pp is None:
        pp = sorted({v for v in (1, st.pp // 2 if st.pp % 2 == 0 else 0, st.pp, 2 * st.pp)
                     if 1 <= v <= max(body, 1)} | {st.pp})
    if any(v < 1 for v in pp):
        raise MemformError(f"--pp: values must be positive integers, got {list(pp)}")
    vpp = list(vpp) if vpp is not None else [st.vpp]
    if any(v < 1 for v in vpp):
        raise MemformError(f"--vpp: values must be positive integers, got {vpp}")
    known = list(model.program.schedules())
    schedules = list(schedules) if schedules is not None else [st.schedule]
    for s in schedules:
        if s not in known:
            raise MemformError(f"--schedule: unknown schedule '{s}' (the formula files define {', '.join(known)})")
    axes = [Axis("parallel.pp", "pipeline stages (pp)", list(pp), st.pp),
            Axis("parallel.vpp", "virtual chunks per stage (vpp)", vpp, st.vpp),
            Axis("parallel.pp_schedule", "pipeline schedule", schedules, st.schedule)]
    single = isinstance(get_path(model.data, "training.recompute", "none"), str) and all(
        get_path(model.data, k, None) is None for k in ("training.recompute_layers", "training.recompute_num_layers",
                                                        "training.selective_recompute_num_layers"))
    offered = _recompute_modes(model)
    if recompute is not None:
        for mode in recompute:
            if mode not in offered:
                raise MemformError(f"--recompute: '{mode}' is not a recompute mode of the formula files "
                                   f"(they offer {', '.join(offered)})")
        if not single:
            raise MemformError("--recompute: this config sets recompute per stage or per layer "
                               "(training.recompute as a list, recompute_layers or *_num_layers); "
                               "it is kept as configured in the page")
    if single:
        base = get_path(model.data, "training.recompute", "none")
        axes.append(Axis("training.recompute", "activation recompute", list(recompute or offered), base))
    zero_bound = _binding_of(model, "parallel.zero")
    if zero_bound is not None:
        base = int(model.bound.value_of(zero_bound[0]))
        spec = zero_bound[1].type
        values = list(zero) if zero is not None else list(range(spec.lo or 0, (spec.hi if spec.hi is not None
                                                                                else 3) + 1))
        label = "ZeRO stage"
        if get_path(model.data, "parallel.distributed_optimizer", False):
            # Megatron's distributed optimizer shards the optimizer states by itself (common.mf shard_os):
            # at ZeRO 0 the page still estimates ZeRO-1's optimizer bytes, which "0" alone would hide
            label = "ZeRO stage (distributed optimizer on: optimizer states sharded even at 0)"
        axes.append(Axis("parallel.zero", label, values, base))
    elif zero is not None:
        raise MemformError("--zero: the formula files do not bind parallel.zero")
    for a in axes:
        if a.base not in a.values:
            a.values = sorted(a.values + [a.base], key=lambda v: (str(type(v)), v))
        if a.key == "parallel.zero" and get_path(model.data, "parallel.distributed_optimizer", False):
            # common.mf: shard_os = zero_group "if zero >= 1 or dist_opt": below 1 the optimizer states are
            # sharded as at ZeRO-1 (the option's doc: "Megatron distributed optimizer (= ZeRO-1)")
            a.notes = ["= effective 1 (distributed optimizer)" if v < 1 else "" for v in a.values]
    return axes


def _recompute_modes(model: Model) -> list[str]:
    """The recompute modes the formula files distinguish (variants of any quantity), in canonical order."""
    used = {"none"}
    for block in model.program.blocks:
        for qname in model.program.quantity_names(block):
            qd = model.program.find_quantity(block, qname)
            if qd is not None and qd.variants:
                used.update(qd.variants)
    return [m for m in RECOMPUTE_MODES if m in used] + sorted(used - set(RECOMPUTE_MODES))


def build_whatif(model: Model, *, vary: Sequence[str] = (), pp: Sequence[int] | None = None,
                 vpp: Sequence[int] | None = None, schedules: Sequence[str] | None = None,
                 recompute: Sequence[str] | None = None, zero: Sequence[int] | None = None,
                 config_label: str | None = None, overrides: Sequence[str] = (),
                 max_variants: int = MAX_VARIANTS, cache: bool = True) -> WhatIf:
    """The page data for ``model`` (a loaded config, its ``--set`` overrides applied).

    Each structural variant is compiled once and kept, with its JavaScript and stage labels, in the
    on-disk store (:func:`memform.fastpath.compiled.compile_structures`, purpose ``whatif-…``;
    ``cache=False``: neither read nor written): the page for the same config is then built without
    sympy's work."""
    keys = numeric_keys(model, vary)
    axes = default_axes(model, pp=pp, vpp=vpp, schedules=schedules, recompute=recompute, zero=zero)
    combos = list(itertools.product(*(a.values for a in axes)))
    if len(combos) > max_variants:
        raise MemformError(f"the page would hold {len(combos)} structural variants (more than {max_variants}): "
                           f"choose fewer values with --pp, --vpp, --schedule, --recompute or --zero")
    st = model.structure
    body = body_layers(model)
    inputs = []
    for key in keys:
        name, b = _binding_of(model, key)
        inputs.append({"key": key, "symbol": str(model.bound.symbols[name]), "doc": b.doc,
                       "value": str(_plain(model.bound.value_of(name)))})
    variants: list[dict[str, Any]] = []
    functions: list[str | None] = []
    todo: list[tuple[int, dict[str, Any]]] = []
    for combo in combos:
        choice = dict(zip((a.key for a in axes), combo))
        variant, structure = _variant(model, choice, {a.key: a.base for a in axes}, body, st)
        if structure is not None:
            todo.append((len(variants), structure))
        variants.append(variant)
        functions.append(None)
    # every variant at once: stored ones are read back, the rest compiled in parallel processes
    built = compile_structures(model, [o for _, o in todo], keys, cache=cache, purpose=_store_purpose(),
                               extra=_page_part, numpy=False)  # the page computes with its JavaScript alone
    for (i, _), cm in zip(todo, built):
        functions[i] = _fill(variants[i], cm)
    degrees = []
    for key in DEVICE_KEYS:
        found = _binding_of(model, key)
        if found is not None:
            degrees.append({"key": key, "value": str(_plain(model.bound.value_of(found[0])))})
    gbs = get_path(model.data, "training.global_batch_size", None)
    devices = get_path(model.data, "parallel.devices", None)
    varied = set(keys) | {a.key for a in axes}
    fixed = [[k, _show(v)] for k, v in _leaves(model.data)
             if k not in varied and k not in _PAGE_KEYS and not k.startswith(("name", "formulas"))]
    if get_path(model.data, "parallel.stage_layers", None) is not None:
        fixed.append(["parallel.stage_layers", _show(get_path(model.data, "parallel.stage_layers", None))
                      + f" (at pp = {st.pp}, vpp = {st.vpp}; other pipeline sizes split evenly or balanced)"])
    data = {
        "name": st.name,
        "config": config_label or (str(model.source) if model.source else st.name),
        "overrides": list(overrides),
        "formulas": list(model.data.get("formulas", [])),
        "framework": st.framework,
        "capacity_gib": float(get_path(model.data, "device.capacity_gib", st.capacity_bytes / 2 ** 30)),
        "categories": [{"key": c, "label": CATEGORY_LABELS[c], "color": CATEGORY_COLORS[c]} for c in CATEGORIES],
        "colors": {"capacity": CAPACITY_COLOR, "peak": PEAK_COLOR},
        "inputs": inputs,
        "axes": [{"key": a.key, "label": a.label, "values": a.values, "base": a.base, "notes": a.notes} for a in axes],
        "variants": variants,
        "timed": any(v["timed"] for v in variants),
        "degrees": degrees,
        "global_batch_size": None if gbs is None else str(gbs),
        "devices": None if devices is None else str(devices),
        "dp_base": str(get_path(model.data, "parallel.dp", 1)),
        "mbs_base": str(get_path(model.data, "training.micro_batch_size", 1)),
        "fixed": fixed,
    }
    return WhatIf(data, functions)


def _variant(model: Model, choice: Mapping[str, Any], bases: Mapping[str, Any], body: int,
             st: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One structural combination: its page entry (filled in by :func:`_fill` once compiled) and
    the overrides to compile it with (None: it cannot be built, ``error`` says why)."""
    own = choice["parallel.pp"] == st.pp and choice["parallel.vpp"] == st.vpp
    overrides: dict[str, Any] = {k: v for k, v in choice.items()}
    overrides["parallel.devices"] = None  # the page checks the device count itself
    shown = {k: v for k, v in choice.items() if v != bases[k]}
    info: dict[str, Any] = {"choice": [choice[k] for k in choice], "set": {}, "error": None,
                            "stages": 0, "labels": [], "requires": [], "timed": False}
    if not own:
        split = stage_split(model, body, choice["parallel.pp"], choice["parallel.vpp"])
        if split is None:
            info["error"] = (f"{choice['parallel.pp']} × {choice['parallel.vpp']} pipeline pieces but only "
                             f"{body} body layers")
            return info, None
        overrides["parallel.stage_layers"] = split or None
        if split or get_path(model.data, "parallel.stage_layers", None) is not None:
            shown["parallel.stage_layers"] = split or None
    info["set"] = {k: _show(v) for k, v in shown.items()}
    return info, overrides


def _page_part(smodel: Model, cm: CompiledModel) -> dict[str, Any]:
    """What the page needs of a compiled structure beyond its numbers: the JavaScript of its closed
    forms and its stage labels (run where the structure is compiled, and stored with it)."""
    part = cm.partition if cm.partition is not None else partition_of(smodel, smodel.evaluator(keep=frozenset()))
    # a device without peak FLOP/s gives every stage 0 s: no time model to show (Estimate.has_time)
    times = list(cm.times) if any(e != 0 for e in cm.times[:-1]) else []
    flat = [e[c] for e in cm.exprs for c in CATEGORIES] + [cond for _, cond in cm.requires] + times
    labels = [" ".join(f"{g.count_value}x{g.block}" + (f"({g.mode})" if g.mode != "none" else "")
                       for c in part.chunks[i] for g in c.groups) for i in range(cm.stages)]
    return {"js": compile_js(flat, cm.symbols, time_flags(len(flat) - len(times), times)), "labels": labels, "timed": bool(times)}


@lru_cache(maxsize=1)
def _store_purpose() -> str:
    """The store's purpose for page entries. Their labels are written by this module, whose code the
    store's own code digest does not cover (it covers lang, engine and analysis), so its source is
    part of the name: an entry written by other page code is never read."""
    return "whatif-" + hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def _fill(info: dict[str, Any], cm: "CompiledModel | MemformError") -> str | None:
    """A variant's page entry from its compiled structure (or the reason it has none); its JS."""
    if isinstance(cm, MemformError):
        info["error"] = cm.message.splitlines()[0]
        info["set"] = {}
        return None
    info["stages"] = cm.stages
    info["labels"] = list(cm.extra["labels"])
    info["requires"] = [message for message, _ in cm.requires]
    info["timed"] = cm.extra["timed"]
    return cm.extra["js"]


def _leaves(node: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, v in node.items():
        path = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            out.extend(_leaves(v, path))
        else:
            out.append((path, v))
    return out


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_show(x) for x in v) + "]"
    return str(v)


def render_whatif(w: WhatIf) -> str:
    """The HTML page (``templates/whatif.html.j2``), one self-contained file."""
    from .. import __version__
    from .render import _render, environment
    return _render(environment(), "whatif.html.j2",
                   {"data": w.data, "functions": w.functions, "helpers": JS_HELPERS, "version": __version__},
                   "whatif.html.j2")


def whatif_html(config: str | Path, overrides: Sequence[str] = (), **options: Any) -> str:
    """Load ``config`` with ``--set``-style ``overrides`` and render its what-if page."""
    from ..engine.model import load_model
    model = load_model(config, list(overrides))
    label = shlex.quote(str(config))
    return render_whatif(build_whatif(model, config_label=label, overrides=list(overrides), **options))

