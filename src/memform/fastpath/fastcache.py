"""The numeric fast path of ``memform estimate``: compiled closed forms, cached per structure.

Every call of the interpreter rebuilds sympy expressions, although most of a config never
changes between calls: a planner varies the parallel degrees and micro-batching, a user
re-runs the same file. So a config is split into

* its *structure*: the formula files' contents, memform's own code (version, grammar and the
  sources that compute numbers: :func:`memform.cachedir.code_digest`) and every
  config value except the numeric keys of :data:`NUMERIC_KEYS` that the config sets (their
  presence is part of the structure, their values are not); and
* its *inputs*: those numeric values.

A structure is compiled once (:mod:`memform.fastpath.fastcompile`) into a plain Python
function of its inputs; the entry is kept in process and on disk (the platform's user cache
directory via ``platformdirs``; ``MEMFORM_CACHE_DIR`` overrides it). The key is a SHA-256 of
the structure; an entry also records every formula file it read with its digest, and a
checksum of itself. An entry that does not parse, fails its checksum, names another key or
format, or whose files changed, is ignored and rebuilt, never trusted.

A compile costs seconds of sympy; the interpreter with every symbol replaced by its number as it is
read (the numeric evaluator, :mod:`memform.engine.numeric`: exact ints and fractions, no closed
forms, no sympy) costs a parse plus an evaluation. So a structure is
compiled only where it pays: when the same process asks for it a second time (a planner's or a
notebook's loop) or when asked to (``compile=True``). Until then a miss answers with those
interpreted numbers (:func:`numeric_estimate`), byte for byte the interpreter's; the command line,
one estimate per process, compiles nothing and reads what a loop stored.

Nothing here imports sympy: a cache hit reads YAML, hashes a few files and runs integer code.
Where the compiled function reports that the interpreter would refuse or treat differently
(a ``require`` failing, a size out of range, a zero denominator), :func:`fast_estimate`
returns ``None`` and the caller runs the interpreter, which gives its own answer or error.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Mapping

from ..engine.config import NUMERIC_KEYS, apply_overrides, normalize, read_yaml
from ..engine.results import CATEGORIES, EstimateNumbers, StageNumbers, with_devices
from ..engine.values import get_path
from ..errors import MemformError
from .cachestore import CACHE_ENV, cache_dir  # noqa: F401 (re-exported: where entries are kept)
from .cachestore import digest, entry_path, file_digests, formula_paths, read_entry, structure_key, write_entry


_MEMO: dict[str, "_Loaded"] = {}          # key -> entry and its function, this process
_MISSES: set[str] = set()                 # keys this process answered without compiling (compiled next time)
#: what :func:`_lookup` returns for a structure not worth compiling yet
_NOT_YET = "not yet"


@dataclass
class _Loaded:
    body: dict[str, Any] | None       # None: the structure is uncompilable (use the interpreter)
    files: list[list[str]]
    function: Callable[..., tuple[list[Any], bool]] | None


def load_scalar(source: str) -> Callable[..., tuple[list[Any], bool]]:
    """The function defined by a compiled entry's source (see :mod:`memform.fastpath.scalar`)."""
    namespace: dict[str, Any] = {"_sgn": _sgn, "__builtins__": {"abs": abs}}
    exec(compile(source, "<memform compiled structure>", "exec"), namespace)  # noqa: S102 - our own generated code
    return namespace["_scalar"]


def _sgn(x: int) -> int:
    return (x > 0) - (x < 0)


def _compile(config: Any, overrides: Any, candidates: list[str]) -> tuple[_Loaded, str | None] | None:
    """Compile the structure (cache miss). None when the config itself is refused."""
    from ..engine.model import load_model
    from .fastcompile import Uncompilable, compile_entry
    try:
        model = load_model(config, overrides)
        files = file_digests(model.program.paths)
        try:
            body = compile_entry(model, candidates)
        except Uncompilable as exc:
            return _Loaded(None, files, None), str(exc)
    except MemformError:
        return None
    return _Loaded(body, files, load_scalar(body["source"])), None


def _lookup(config: Any, overrides: Any, data: Mapping[str, Any], source: Path | None,
            use_disk: bool, compile: bool | None) -> _Loaded | str | None:
    files = formula_paths(data, source)
    candidates = [k for k in NUMERIC_KEYS if type(get_path(data, k, None)) is int]
    key = structure_key(data, files, candidates, "estimate")
    if key is None:
        return None
    hit = _MEMO.get(key)
    if hit is not None and all(digest(f) == d for f, d in hit.files):
        return hit
    path = entry_path("estimate", key)
    stored = read_entry(path, key, lambda body: (body, load_scalar(body["source"]))) if use_disk else None
    if stored is not None:
        pair, files, _ = stored
        body, function = pair or (None, None)
        loaded = _Loaded(body, files, function)
    else:
        if compile is False or (compile is None and key not in _MISSES):
            _MISSES.add(key)
            return _NOT_YET
        built = _compile(config, overrides, candidates)
        if built is None:
            return None
        loaded, reason = built
        if use_disk:
            write_entry(path, key, loaded.files, loaded.body, reason)
    _MEMO[key] = loaded
    return loaded


def fast_estimate(config: Any, overrides: Mapping[str, Any] | list[str] | None = None, *,
                  cache: bool = True, compile: bool | None = None) -> "FastEstimate | None":
    """The numbers of ``memform.estimate(config, overrides)`` without closed forms, or None where
    the interpreter must answer (a refused config, values outside the region a compiled function
    vouches for). From a compiled structure where one is in memory or on disk; on a miss,
    ``compile`` says whether to compile it now (True), never (False: the command line), or the
    second time this process misses it (None); otherwise, and for a structure that does not
    compile, from :func:`numeric_estimate`. ``cache=False`` skips the on-disk cache."""
    if isinstance(config, Mapping):
        raw, source = copy.deepcopy(dict(config)), None
    else:
        source = Path(config)
        raw = read_yaml(source)
    data = normalize(apply_overrides(raw, overrides), source)
    loaded = _lookup(config, overrides, data, source, cache, compile)
    if loaded is None:
        return None
    if loaded is _NOT_YET or loaded.body is None:
        return numeric_estimate(config, overrides)
    return _run(loaded, data, lambda: _full_estimate(config, overrides))


def numeric_estimate(config: Any, overrides: Mapping[str, Any] | list[str] | None = None) -> "FastEstimate | None":
    """The interpreter's numbers from the numeric evaluator (plain ints and fractions, every symbol
    replaced by its value as it is read: no sympy, no closed forms), as a :class:`FastEstimate` whose
    closed forms come from the symbolic estimate on first use. Where a formula's value is irrational
    (:class:`~memform.engine.numeric.Inexact`) the sympy evaluator gives the numbers instead. None
    where the interpreter refuses the config: the symbolic estimate then raises its own error."""
    from ..engine.model import estimate_numbers
    try:
        num = estimate_numbers(config, overrides)
    except MemformError:
        return None
    body = {"name": num.name, "capacity_bytes": num.capacity_bytes, "schedule": num.schedule,
            "framework": num.framework, "pp": num.pp, "vpp": num.vpp, "recompute": num.recompute,
            "stages": [{"labels": num.stage_labels(i), "terminal": num.terminal_label(i)}
                       for i in range(len(num.stages))]}
    stages = []
    for s in num.stages:
        fs = FastStage(s.stage, dict(s.values), s.param_count, s.capacity_bytes, s.peak_moment, dict(s.moments),
                       s.host_bytes, dict(s.runtime), dict(s.time_ps), s.ideal_ps, s.tokens)
        if s._reserve_pending is not None or s._reserve is not None:
            # the interpreted stage's replay, run on first use (the table's fits reads it; a loop's peaks do not)
            fs._reserve_pending = lambda st, s=s: st.set_reserve(s.reserve, s.reserve_oom, s.reserve_releases)
        stages.append(fs)
    est = FastEstimate(body, stages, dict(num.setup), dict(num.parameters), lambda: _full_estimate(config, overrides))
    for fs in stages:
        fs._owner = est
    return est


def _full_estimate(config: Any, overrides: Any) -> Any:
    from ..engine.model import estimate
    return estimate(config, overrides)


def _run(loaded: _Loaded, data: Mapping[str, Any], full: Callable[[], Any]) -> "FastEstimate | None":
    body = loaded.body
    if any(get_path(data, key, None) != value for key, value in body["fixed"].items()):
        return None  # a key the formulas do not bind, with another value than the compiled one
    args = []
    for key, limits in zip(body["inputs"], body["limits"]):
        v = get_path(data, key, None)
        if type(v) is not int or v < 1 or (limits is not None and not limits[0] <= v <= limits[1]):
            return None  # the binding refuses it: the interpreter says why
        args.append(v)
    try:
        outs, bad = loaded.function(*args)
    except (ArithmeticError, TypeError, ValueError, RecursionError):
        return None
    if bad or not all(outs[body["conditions"]:]):
        return None

    def value(ref: list[Any]) -> Any:
        kind, x = ref
        return x if kind == "const" else (args[x] if kind == "input" else outs[x])

    setup = with_devices({label: value(ref) for label, ref in body["setup"].items()})
    devices = body["devices"]
    if devices is not None and math.prod(setup.get(k, 1) for k in ("dp", "tp", "pp", "cp")) != devices:
        return None
    total, expert = value(body["parameters"]["total"]), value(body["parameters"]["expert"])
    stages = []
    k = len(CATEGORIES)
    for i, st in enumerate(body["stages"]):
        f = st["first"]
        values = dict(zip(CATEGORIES, outs[f:f + k]))
        names = st["moments"]
        m = f + k + 2
        moments = dict(zip(names, outs[m:m + len(names)]))
        best = 0
        if len(names) > 1:
            best = next(j for j, won in enumerate(outs[m + len(names):m + 2 * len(names)]) if won)
            m += len(names)
        r = m + len(names)
        c = r + len(st["runtime"])
        times = st.get("time", [])
        extra = outs[c + len(times):c + len(times) + 2] if times else [0, 0]
        stages.append(FastStage(i, values, outs[f + k], body["capacity_bytes"], names[best], moments,
                                outs[f + k + 1], dict(zip(st["runtime"], outs[r:c])),
                                dict(zip(times, outs[c:c + len(times)])), extra[0], extra[1]))
    if "allocator" not in body:
        return None   # an entry written before the allocator model: the interpreter answers
    if body["allocator"] is not None:
        from ..allocator.estimate import defer_reserve, from_settings_dict
        from ..allocator.sequence import LayerBlocks

        config, kept = from_settings_dict(body["allocator"], outs)
        for i, (stage, st) in enumerate(zip(stages, body["stages"])):
            layers: list[LayerBlocks] = []
            for n, at, *shape in st["groups"]:
                layers += [LayerBlocks(*outs[at:at + 6], *_granularity(outs, at + 6, shape))] * n
            defer_reserve(stage, layers, config, kept.at(i))
    est = FastEstimate(body, stages, setup, {"total": total, "expert": expert, "dense": total - expert}, full)
    for s in stages:
        s._owner = est
    return est


def _granularity(outs: list[int], at: int, shape: list) -> list[Any]:
    """A group's granularity figures from ``outs[at:]`` (allocator.estimate.granularity_exprs): each a
    number, or (its ``shape`` entry k > 0) a tuple of k numbers."""
    out: list[Any] = []
    from ..allocator.estimate import GRANULARITY

    for k in (shape[0] if shape else (0,) * len(GRANULARITY)):
        out.append(tuple(outs[at:at + k]) if k else outs[at])
        at += k or 1
    return out


class FastStage(StageNumbers):
    """A stage's numbers; closed forms and layer groups (``exprs``, ``layers``, ...) are those of
    the interpreted estimate, computed on first use."""

    _owner: "FastEstimate"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._owner.full.stages[self.stage], name)


class FastEstimate(EstimateNumbers):
    """:class:`memform.Estimate`'s numbers from a compiled structure.

    Everything symbolic (``model``, ``partition``, ``assumptions``, each stage's ``exprs`` and
    ``layers``) is delegated to the interpreted estimate of the same config, built on first use.
    """

    def __init__(self, body: Mapping[str, Any], stages: list[FastStage], setup: dict[str, Any],
                 parameters: dict[str, int], full: Callable[[], Any]):
        self._body = body
        self.name = body["name"]
        self.stages = stages
        self.capacity_bytes = body["capacity_bytes"]
        self.schedule = body["schedule"]
        self.framework = body["framework"]
        self.pp, self.vpp, self.recompute = body["pp"], body["vpp"], body["recompute"]
        self.setup = setup
        self.parameters = parameters
        self._make_full = full

    @cached_property
    def full(self) -> Any:
        """The interpreted :class:`memform.Estimate` (imports sympy)."""
        return self._make_full()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "full":
            raise AttributeError(name)
        return getattr(self.full, name)

    def stage_labels(self, stage: int) -> list[list[str]]:
        return self._body["stages"][stage]["labels"]

    def terminal_label(self, stage: int) -> str:
        return self._body["stages"][stage]["terminal"]

    def to_dict(self, symbolic: bool = False) -> dict[str, Any]:
        return self.full.to_dict(symbolic=True) if symbolic else self.numbers_dict()
