#!/usr/bin/env python
"""Mutation score of the bundled formula files: how many small planted errors the test suite catches.

    python bench/mutate.py                     # a random sample of 150 of the mutants (stated as such; < 10 min)
    python bench/mutate.py --limit 0           # every mutant of formulas/*.mf and formulas/frameworks/*.mf
    python bench/mutate.py --files dense.mf    # only mutants of the named files (glob patterns, repeatable)
    python bench/mutate.py --limit 300 --seed 1   # another sample size / sample
    python bench/mutate.py --jobs 2            # worker processes (default: 2)
    python bench/mutate.py --list              # only print the mutants, run nothing

Mutants are made mechanically on the parse tree of the project's own grammar (memform.lang.parser), so
every one is syntactically valid and touches exactly one token or term: each numeric literal +1, -1
and x2; each ``+``<->``-`` and ``*``<->``/``; ``min``<->``max``; one term of a sum dropped; a symbol swapped
for a sibling (h<->f, t<->cp, g<->a). Each mutant is then classified, in this order:

* invalid     -- the loader/checker rejects the mutated program (``memform check`` would): not a silent
                 error, so it is neither killed nor survived;
* equivalent  -- ``memform estimate --json`` gives the same numbers as the unmutated files on every
                 config of :data:`VARIANTS` (the bundled configs in configs/ plus override variants that
                 reach the framework profiles, recompute modes, ZeRO stages, CP, ...): no bundled
                 set-up can tell it apart, so it is reported separately and not counted;
* killed      -- some test of the selection fails with the mutant in place;
* survived    -- every test of the selection passes.

The tests run IN-PROCESS: a worker starts one pytest session over the selected test files, runs each
test once unmutated (the baseline: tests that fail, skip, spawn a subprocess -- which would read the
unmutated files from disk -- or use hypothesis are left out, and counted), records which formula files
each test reads, and then, per mutant, serves the mutated text through memform's formula reader
(``memform.lang.parser.read_text``) and re-runs only the tests that read the mutated file, stopping at
the first failure (the test that killed the last mutant goes first). PyTorch measurements do not
depend on the formula files, so a worker measures each validation case once.

Prints every surviving mutant as ``file:line:col  mutation``, then ``killed K of N (P %)`` with N the
valid, non-equivalent mutants (a mutant whose tests run past the per-mutant limit, 600 s, is listed
with the survivors and counted as one: undecided is not killed).

Many mutants are equivalent by that definition: a framework profile loaded after the model files
redefines what it models itself (the default ``megatron`` profile's megatron-core.mf replaces common.mf's
static functions and the decoder's full-recompute activations, so those dense.mf/common.mf lines only
count under the profiles that keep them), and options no bundled set-up turns on (Gemma's soft-capping,
sliding windows, qk norms, ...) change nothing that is estimated.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fnmatch
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

#: sibling symbols a mutant swaps: hidden <-> MLP width, tensor <-> context parallel, KV heads <-> heads
SWAPS = {"h": "f", "f": "h", "t": "cp", "cp": "t", "g": "a", "a": "g"}

#: the test files run against each mutant: references, pipeline schedules, models, profiles, the
#: PyTorch validation subset (each measured once per worker)
DEFAULT_TESTS = ("tests/test_reference_*.py", "tests/test_pipeline.py", "tests/test_models.py",
                 "tests/test_validate.py", "tests/test_frameworks.py", "tests/test_framework_*.py",
                 "tests/test_distributed.py")

#: mutants a default run samples: the whole set (3,380 for the bundled files) takes well over an hour
#: on 2 cores, mostly the equivalence check and the survivors, which run every selected test
DEFAULT_LIMIT = 150

#: configs the equivalence check estimates: every bundled config, plus override variants that reach
#: the code paths the bundled configs leave alone (framework profiles, recompute modes, ZeRO, CP, ...)
LLAMA = "configs/llama3-8b.yaml"
GPT = "configs/gpt3-175b.yaml"
MIXTRAL = "configs/mixtral-8x7b.yaml"
VARIANTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (LLAMA, ("training.recompute=selective", "model.flash_attention=false")),
    (LLAMA, ("training.recompute=full",)),
    (LLAMA, ("model.flash_attention=false", "model.dropout=true", "model.swiglu_impl=eager",
             "model.cross_entropy=eager")),
    (LLAMA, ("parallel.cp=2", "parallel.sequence_parallel=false")),
    (LLAMA, ("parallel.cp=2", "parallel.cp_algo=allgather")),
    (LLAMA, ("parallel.zero=2", "parallel.tp=1", "parallel.sequence_parallel=false", "parallel.dp=8")),
    (LLAMA, ("parallel.zero=3", "parallel.tp=1", "parallel.sequence_parallel=false", "parallel.dp=8")),
    (LLAMA, ("parallel.pp=4", "parallel.vpp=2", "training.global_batch_size=64")),
    (GPT, ("parallel.pp_schedule=gpipe",)),
    (LLAMA, ("training.framework=deepspeed", "parallel.zero=3", "parallel.tp=1",
             "parallel.sequence_parallel=false", "parallel.dp=8")),
    (LLAMA, ("training.framework=deepspeed", "parallel.zero=1")),
    (LLAMA, ("training.framework=fsdp2", "parallel.zero=3", "parallel.tp=1",
             "parallel.sequence_parallel=false", "parallel.dp=8")),
    (LLAMA, ("training.framework=hf-trainer", "parallel.tp=1", "parallel.sequence_parallel=false",
             "parallel.zero=0", "parallel.dp=1")),
    (LLAMA, ("training.framework=torch", "parallel.zero=0")),
    (LLAMA, ("training.framework=torch", "parallel.pp=2", "parallel.zero=0")),
    (LLAMA, ("training.framework=mindspore",)),
    (MIXTRAL, ("training.framework=torch",)),
    (MIXTRAL, ("training.framework=mindspore",)),
)


# ------------------------------------------------------------------------------ generating mutants


@dataclasses.dataclass(frozen=True)
class Mutant:
    file: str      # repository-relative, e.g. formulas/dense.mf
    line: int
    col: int
    kind: str      # number | op | minmax | drop | symbol
    desc: str      # e.g. "2 -> 3", "+ -> -", "drop `dropout * s * b * h / sd`"
    text: str      # the whole mutated file

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def label(self) -> str:
        return f"{self.where}  {self.kind}: {self.desc}"


def formula_files(patterns: list[str] | None = None) -> list[Path]:
    """The bundled formula files to mutate: formulas/*.mf and formulas/frameworks/*.mf (or those
    whose repository-relative path or file name matches one of ``patterns``)."""
    files = sorted((ROOT / "formulas").glob("*.mf")) + sorted((ROOT / "formulas" / "frameworks").glob("*.mf"))
    if not patterns:
        return files
    rel = lambda p: p.relative_to(ROOT).as_posix()  # noqa: E731
    return [p for p in files if any(fnmatch.fnmatch(rel(p), pat) or fnmatch.fnmatch(p.name, pat)
                                    or fnmatch.fnmatch(rel(p), "formulas/" + pat) for pat in patterns)]


def _number_variants(tok: str) -> list[str]:
    value = Decimal(tok)
    out = []
    for new in (value + 1, value - 1, value * 2):
        if new < 0 or new == value:
            continue
        text = str(int(new)) if new == new.to_integral_value() else format(new.normalize(), "f")
        if text not in out and text != tok:
            out.append(text)
    return out


def _span(node) -> tuple[int, int]:
    if hasattr(node, "start_pos") and not hasattr(node, "meta"):     # a Token
        return node.start_pos, node.end_pos
    return node.meta.start_pos, node.meta.end_pos


def _skip_back(text: str, pos: int, parens: int) -> int:
    """From ``pos`` backwards over whitespace and ``parens`` opening parentheses."""
    while parens:
        pos -= 1
        if text[pos] == "(":
            parens -= 1
        elif not text[pos].isspace():
            raise ValueError("unbalanced term")
    return pos


def _skip_forward(text: str, pos: int, parens: int) -> int:
    while parens:
        if text[pos] == ")":
            parens -= 1
        elif not text[pos].isspace():
            raise ValueError("unbalanced term")
        pos += 1
    return pos


def _drops(text: str, tree) -> list[tuple[int, int, str, int]]:
    """(start, end, replacement, term index) edits that drop one term of the sum ``tree``."""
    ch = tree.children
    terms, ops = ch[0::2], ch[1::2]
    edits = []
    for k, term in enumerate(terms):
        s, e = _span(term)
        try:
            if k == 0:
                op = ops[0]
                s = _skip_back(text, s, text[e:op.start_pos].count(")"))
                # "a + b" -> "b"; "a - b" -> "- b" (the dropped term's sign stays with the next)
                edits.append((s, op.end_pos if op == "+" else op.start_pos, "", k))
            else:
                prev = ops[k - 1]
                if k < len(ops):
                    end = ops[k].start_pos
                else:
                    end = _skip_forward(text, e, text[prev.end_pos:s].count("("))
                edits.append((prev.start_pos, end, " " if k < len(ops) else "", k))
        except (ValueError, IndexError):
            continue
    return edits


def generate(path: Path) -> list[Mutant]:
    """Every mutant of one formula file, in source order."""
    from lark import Token, Tree

    from memform.errors import MemformError
    from memform.lang.parser import _lark, parse_text

    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    tree = _lark().parse(text)
    edits: list[tuple[int, int, str, int, str, str]] = []   # start, end, new, pos, kind, desc
    for node in tree.iter_subtrees_topdown():
        kind = node.data
        if kind == "number":
            tok = node.children[0]
            for new in _number_variants(str(tok)):
                edits.append((tok.start_pos, tok.end_pos, new, tok.start_pos, "number", f"{tok} -> {new}"))
        elif kind in ("sum", "product"):
            for tok in node.children[1::2]:
                swap = {"+": "-", "-": "+", "*": "/", "/": "*"}.get(str(tok))
                if swap:
                    edits.append((tok.start_pos, tok.end_pos, swap, tok.start_pos, "op", f"{tok} -> {swap}"))
            if kind == "sum":
                for s, e, new, k in _drops(text, node):
                    term = node.children[0::2][k]
                    dropped = " ".join(text[slice(*_span(term))].split())
                    edits.append((s, e, new, _span(term)[0], "drop", f"drop term `{dropped}`"))
        elif kind == "call":
            tok = node.children[0]
            swap = {"min": "max", "max": "min"}.get(str(tok))
            if swap:
                edits.append((tok.start_pos, tok.end_pos, swap, tok.start_pos, "minmax", f"{tok} -> {swap}"))
        elif kind == "ref" and len(node.children) == 1:
            name = node.children[0]
            tok = name.children[0] if isinstance(name, Tree) else name
            if isinstance(tok, Token) and str(tok) in SWAPS:
                new = SWAPS[str(tok)]
                edits.append((tok.start_pos, tok.end_pos, new, tok.start_pos, "symbol", f"{tok} -> {new}"))
    out = []
    for s, e, new, pos, kind, desc in sorted(edits, key=lambda x: (x[3], x[4], x[5])):
        mutated = text[:s] + new + text[e:]
        if kind == "drop":     # a token swap keeps the grammar; a dropped term is re-parsed to be sure
            try:
                parse_text(mutated, rel)
            except MemformError:
                continue       # not seen for the bundled files; never counted
        line = text.count("\n", 0, pos) + 1
        col = pos - (text.rfind("\n", 0, pos) + 1) + 1
        out.append(Mutant(rel, line, col, kind, desc, mutated))
    return out


def all_mutants(patterns: list[str] | None = None) -> list[Mutant]:
    return [m for p in formula_files(patterns) for m in generate(p)]


# ------------------------------------------------------------------------------ serving mutants in-process

_SERVED: dict[str, str] = {}     # resolved path -> mutated text
_READS: set[str] = set()         # resolved formula paths read since the last clear
_SPAWNED: list[int] = [0]


def install_reader() -> None:
    """Route memform's formula reader through :data:`_SERVED` and record what it reads."""
    import memform.lang.parser as parser

    if getattr(parser.read_text, "_mutate", False):
        return
    original = parser.read_text

    def read_text(path, what="file"):
        key = _checkout_path(path)
        _READS.add(key)
        if key in _SERVED:
            return _SERVED[key]
        return original(path, what)

    read_text._mutate = True
    parser.read_text = read_text
    disable_fast_path()


def _replace_everywhere(original, replacement) -> None:
    """Rebind every memform module attribute that is ``original`` (``from X import f`` copies included)."""
    for name, mod in list(sys.modules.items()):
        if name.startswith("memform") and mod is not None:
            for attr, value in list(vars(mod).items()):
                if value is original:
                    setattr(mod, attr, replacement)


def disable_fast_path() -> None:
    """The compiled fast path of ``memform.estimate`` keys its cache on the bytes on disk, which a served
    mutant does not change: turn it off, so every estimate runs the interpreter on the served text (what
    the fast path is checked to equal, byte for byte). Its on-disk cache goes to a temporary directory."""
    if not os.environ.get("MEMFORM_CACHE_DIR"):
        import atexit
        import shutil

        os.environ["MEMFORM_CACHE_DIR"] = tmp = tempfile.mkdtemp(prefix="memform-mutate-cache-")
        atexit.register(shutil.rmtree, tmp, True)
    try:
        import memform  # noqa: F401  (imports every module that copies the function)
        import memform.analysis.fastcache as fastcache
    except ImportError:
        return
    original = getattr(fastcache, "fast_estimate", None)
    if original is None or getattr(original, "_mutate", False):
        return

    def no_fast_path(*args, **kwargs):
        return None

    no_fast_path._mutate = True
    _replace_everywhere(original, no_fast_path)


def serve(m: Mutant | None) -> None:
    _SERVED.clear()
    if m is not None:
        _SERVED[str((ROOT / m.file).resolve())] = m.text


def _checkout_path(path: str | Path) -> str:
    """The checkout's path of a formula file memform reads: an installed (not editable) memform reads
    its bundled files from its own data directory, whose files are the checkout's formulas/."""
    from memform.resources import formulas_dir
    resolved = Path(path).resolve()
    try:
        rel = resolved.relative_to(formulas_dir().resolve())
    except ValueError:
        return str(resolved)
    return str((ROOT / "formulas" / rel).resolve())


class LoadError(Exception):
    """The loader or checker rejected the program (an invalid mutant)."""


@contextlib.contextmanager
def tagged_loader():
    """Make a MemformError raised while loading/checking formula files distinguishable."""
    import memform.lang.loader as loader
    from memform.errors import MemformError

    original = loader.load_program

    def load_program(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        except MemformError as exc:
            raise LoadError(str(exc)) from exc

    patched = []
    for name, mod in list(sys.modules.items()):
        if name.startswith("memform") and getattr(mod, "load_program", None) is original:
            mod.load_program = load_program
            patched.append(mod)
    try:
        yield
    finally:
        for mod in patched:
            mod.load_program = original


def _numbers(obj, prefix="") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_numbers(v, f"{prefix}.{k}"))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(_numbers(v, f"{prefix}[{i}]"))
    elif isinstance(obj, bool):
        out[prefix] = float(obj)
    elif isinstance(obj, (int, float)):
        out[prefix] = obj
    return out


def _estimate_numbers(config: str, overrides: tuple[str, ...]) -> dict[str, float] | str:
    """The --json numbers of one estimate, or the error's text (a MemformError is an outcome too)."""
    import memform
    from memform.errors import MemformError

    try:
        # every symbol substituted (keep=frozenset()): the same exact numbers, five times faster
        return _numbers(memform.estimate(str(ROOT / config), overrides=list(overrides), keep=frozenset()).to_dict())
    except MemformError as exc:
        return f"error: {exc}"


def variants() -> list[tuple[str, tuple[str, ...]]]:
    return [(str(p.relative_to(ROOT)), ()) for p in sorted((ROOT / "configs").glob("*.yaml"))] + list(VARIANTS)


_BASE: list[tuple[str, tuple[str, ...], dict | str, set[str]]] = []


def _baseline() -> list[tuple[str, tuple[str, ...], dict | str, set[str]]]:
    if not _BASE:
        install_reader()
        serve(None)
        for cfg, over in variants():
            _READS.clear()
            nums = _estimate_numbers(cfg, over)
            if isinstance(nums, str):
                print(f"mutate: variant {cfg} {' '.join(over)} fails unmutated, left out: {nums[:200]}",
                      file=sys.stderr)
                continue
            _BASE.append((cfg, over, nums, set(_READS)))
    return _BASE


def classify(m: Mutant) -> tuple[str, str]:
    """``("invalid", why)``, ``("equivalent", "")`` or ``("live", the first config it changes)``."""
    base = _baseline()
    key = str((ROOT / m.file).resolve())
    serve(m)
    try:
        with tagged_loader():
            for cfg, over, nums, reads in base:
                if key not in reads:
                    continue
                try:
                    got = _estimate_numbers(cfg, over)
                except LoadError as exc:
                    return "invalid", " ".join(str(exc).split())[:160]
                except (ArithmeticError, RecursionError, ValueError, TypeError, OverflowError) as exc:
                    return "live", f"{cfg} {' '.join(over)} raises {type(exc).__name__}"
                if got != nums:
                    return "live", f"{cfg} {' '.join(over)}".strip()
        return "equivalent", ""
    finally:
        serve(None)


def _classify_batch(mutants: list[Mutant]) -> list[tuple[str, str]]:
    return [classify(m) for m in mutants]


# ------------------------------------------------------------------------------ the in-process test oracle


class Oracle:
    """A pytest plugin that replaces the run loop.

    ``mode="baseline"``: run each collected test once unmutated and record whether it can serve (passes,
    no subprocess, no hypothesis, reads a formula file, fast enough) and which formula files it reads.
    ``mode="mutants"``: for each mutant, run the baseline-selected tests that read the mutated file,
    stopping at the first failure."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.mode = spec["mode"]
        self.results: list[dict] = []
        self.wanted = set(spec.get("nodeids") or ())

    def pytest_collection_modifyitems(self, session, config, items):
        if self.mode == "mutants":
            items[:] = [it for it in items if it.nodeid in self.wanted]
        else:
            share, of = self.spec["share"]
            items[:] = items[share::of]

    @staticmethod
    def _run(item) -> bool:
        from _pytest.runner import runtestprotocol

        reports = runtestprotocol(item, nextitem=None, log=False)
        return all(not r.failed for r in reports) and any(r.when == "call" and r.passed for r in reports)

    def pytest_runtestloop(self, session):
        install_reader()
        _patch_measurements()
        _patch_spawn()
        if self.mode == "baseline":
            self._baseline(session.items)
        else:
            self._mutants(session.items)
        return True

    def _baseline(self, items) -> None:
        for item in items:
            why = ""
            reads: set[str] = set()
            took = 0.0
            if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
                why = "hypothesis property"
            else:
                serve(None)
                _READS.clear()
                _SPAWNED[0] = 0
                start = time.perf_counter()
                ok = self._run(item)
                took = time.perf_counter() - start
                reads = set(_READS)
                if not ok:
                    why = "fails or skips unmutated"
                elif _SPAWNED[0]:
                    why = "runs a subprocess (would read the files on disk)"
                elif not reads:
                    why = "reads no formula file"
                elif took > self.spec["max_test_s"]:
                    why = f"slower than {self.spec['max_test_s']:g} s"
            self.results.append({"nodeid": item.nodeid, "excluded": why, "reads": sorted(reads),
                                 "seconds": round(took, 4)})

    def _mutants(self, items) -> None:
        reads = {n: set(r) for n, r in self.spec["reads"].items()}
        # cheapest first; then the test that killed the last mutant moves to the front
        good = sorted(items, key=lambda it: self.spec["seconds"].get(it.nodeid, 0.0))
        progress = self.spec.get("progress")
        for i, m in enumerate(self.spec_mutants()):
            key = str((ROOT / m.file).resolve())
            serve(m)
            killer, why, ran = None, "", 0
            start = time.perf_counter()
            signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_REAL, self.spec["per_mutant_s"])
            try:
                for item in good:
                    if key not in reads.get(item.nodeid, ()):
                        continue
                    ran += 1
                    if not self._run(item):
                        killer = item
                        break
            except _Timeout:
                why = "timeout"
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                serve(None)
            if _TIMED_OUT[0]:     # the alarm may have fired inside a test, which pytest reports as failed
                killer, why = None, "timeout"
                _TIMED_OUT[0] = False
            if killer is not None:
                good.remove(killer)
                good.insert(0, killer)
            self.results.append({"label": m.label(), "killed": killer is not None,
                                 "by": killer.nodeid if killer else why, "tests": ran,
                                 "seconds": round(time.perf_counter() - start, 3)})
            if progress and (i + 1) % progress == 0:
                done = sum(r["killed"] for r in self.results)
                print(f"  worker {self.spec['share'][0]}: {i + 1} of {len(self.spec['mutants'])} mutants, "
                      f"{done} killed", file=sys.__stderr__, flush=True)

    def spec_mutants(self) -> list[Mutant]:
        return [Mutant(**m) for m in self.spec["mutants"]]


class _Timeout(Exception):
    pass


_TIMED_OUT = [False]


def _alarm(signum, frame):
    _TIMED_OUT[0] = True
    raise _Timeout()


def _patch_measurements() -> None:
    """PyTorch measurements depend only on the case, never on the formula files: measure each once."""
    try:
        import memform.validation.compare as compare
    except ImportError:
        return
    original = compare.measure_step
    if getattr(original, "_mutate", False):
        return
    cache: dict[str, object] = {}

    def measure_step(cfg, precision, *args, **kwargs):
        key = json.dumps([cfg, precision, args, kwargs], sort_keys=True, default=str)
        if key not in cache:
            cache[key] = original(cfg, precision, *args, **kwargs)
        return cache[key]

    measure_step._mutate = True
    compare.measure_step = measure_step


def _patch_spawn() -> None:
    original = subprocess.Popen.__init__
    if getattr(original, "_mutate", False):
        return

    def init(self, *args, **kwargs):
        _SPAWNED[0] += 1
        return original(self, *args, **kwargs)

    init._mutate = True
    subprocess.Popen.__init__ = init


def worker(spec_path: str, out_path: str) -> int:
    import pytest

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    oracle = Oracle(spec)
    os.chdir(ROOT)
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:xdist", "-m", "not slow",
                     *spec["tests"]], plugins=[oracle])
    Path(out_path).write_text(json.dumps(oracle.results), encoding="utf-8")
    return 0


def _workers(specs: list[dict]) -> list[list[dict]]:
    """Run one worker process per spec, concurrently; their results in order."""
    with tempfile.TemporaryDirectory(prefix="memform-mutate-") as tmp:
        procs = []
        for i, spec in enumerate(specs):
            spec_file, out = Path(tmp) / f"spec{i}.json", Path(tmp) / f"out{i}.json"
            spec_file.write_text(json.dumps(spec), encoding="utf-8")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                                          os.environ.get("PYTHONPATH")])))
            procs.append((subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker",
                                            str(spec_file), str(out)], cwd=ROOT, env=env), out))
        results = []
        for proc, out in procs:
            proc.wait()
            if not out.exists():
                raise RuntimeError(f"mutate: a worker exited {proc.returncode} without results")
            results.append(json.loads(out.read_text(encoding="utf-8")))
    return results


def select_tests(tests: list[str], jobs: int, max_test_s: float) -> list[dict]:
    """The baseline: every collected test once, unmutated, shared out over ``jobs`` workers."""
    base = {"mode": "baseline", "tests": tests, "max_test_s": max_test_s}
    return [row for part in _workers([dict(base, share=[i, jobs]) for i in range(jobs)]) for row in part]


def run_oracle(mutants: list[Mutant], tests: list[str], baseline: list[dict], jobs: int,
               per_mutant_s: float = 600.0) -> list[dict]:
    """Run ``mutants`` against the baseline-selected tests in ``jobs`` worker processes."""
    if not mutants:
        return []
    good = [r for r in baseline if not r["excluded"]]
    jobs = max(1, min(jobs, len(mutants)))
    spec = {"mode": "mutants", "tests": tests, "nodeids": [r["nodeid"] for r in good],
            "reads": {r["nodeid"]: r["reads"] for r in good}, "seconds": {r["nodeid"]: r["seconds"] for r in good},
            "per_mutant_s": per_mutant_s, "progress": 25}
    parts = _workers([dict(spec, share=[i, jobs], mutants=[dataclasses.asdict(m) for m in mutants[i::jobs]])
                      for i in range(jobs)])
    results = [r for part in parts for r in part]
    order = {m.label(): i for i, m in enumerate(mutants)}
    results.sort(key=lambda r: order[r["label"]])
    return results


def expand_tests(patterns: list[str]) -> list[str]:
    out: list[str] = []
    for pat in patterns:
        if "::" in pat:
            out.append(pat)
            continue
        out += sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(pat))
    return list(dict.fromkeys(out))


# ------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", action="append", metavar="GLOB",
                    help="mutate only these formula files (e.g. dense.mf, 'frameworks/*.mf'); repeatable")
    ap.add_argument("--limit", type=int, metavar="N", default=DEFAULT_LIMIT,
                    help=f"run a random sample of N mutants (see --seed; default {DEFAULT_LIMIT}, which keeps the "
                         "run under 10 minutes on 2 cores; 0: every mutant)")
    ap.add_argument("--seed", type=int, default=17, help="seed of the --limit sample (default 17)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--tests", action="append", metavar="GLOB",
                    help="test files (globs relative to the repository, or node ids) run against each mutant; "
                         f"default: {' '.join(DEFAULT_TESTS)}")
    ap.add_argument("--max-test-seconds", type=float, default=10.0,
                    help="leave out tests slower than this unmutated (default 10; a first PyTorch "
                         "measurement is slow once, then cached)")
    ap.add_argument("--list", action="store_true", help="print the mutants and stop")
    ap.add_argument("--json", metavar="PATH", help="also write every mutant's outcome as JSON")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(*args.worker)
    start = time.perf_counter()
    files = formula_files(args.files)
    if not files:
        print(f"mutate: --files {' '.join(args.files)} matches no formula file", file=sys.stderr)
        return 2
    mutants = [m for p in files for m in generate(p)]
    total = len(mutants)
    if args.list:
        for m in mutants:
            print(m.label())
        print(f"{total} mutants of {len(files)} files")
        return 0
    sampled = ""
    if args.limit and args.limit < total:
        mutants = sorted(random.Random(args.seed).sample(mutants, args.limit),
                         key=lambda m: (m.file, m.line, m.col, m.kind, m.desc))
        sampled = f"sampled {len(mutants)} of {total} mutants (--limit {args.limit} --seed {args.seed})"
        print(sampled)
    print(f"{len(mutants)} mutants of {len(files)} formula files; classifying against "
          f"{len(variants())} configs ...", flush=True)
    classes = _classify_all(mutants, args.jobs)
    invalid = [(m, why) for m, (c, why) in zip(mutants, classes) if c == "invalid"]
    equivalent = [m for m, (c, _) in zip(mutants, classes) if c == "equivalent"]
    live = [m for m, (c, _) in zip(mutants, classes) if c == "live"]
    print(f"{len(invalid)} invalid (rejected by the loader/checker), {len(equivalent)} equivalent "
          f"(no estimate number changes on any config), {len(live)} to test; "
          f"{time.perf_counter() - start:.0f} s so far", flush=True)
    tests = expand_tests(args.tests or list(DEFAULT_TESTS))
    baseline = select_tests(tests, args.jobs, args.max_test_seconds) if live else []
    excluded: dict[str, int] = {}
    for r in baseline:
        if r["excluded"]:
            excluded[r["excluded"]] = excluded.get(r["excluded"], 0) + 1
    print(f"tests: {sum(not r['excluded'] for r in baseline)} of {len(baseline)} selected from "
          f"{' '.join(tests)}" + ("; left out: " + ", ".join(f"{n} {why}" for why, n in sorted(excluded.items()))
                                   if excluded else "") + f"; {time.perf_counter() - start:.0f} s so far", flush=True)
    results = run_oracle(live, tests, baseline, args.jobs)
    print("\nequivalent mutants (not counted):")
    for m in equivalent:
        print(f"  {m.label()}")
    print("\nsurviving mutants:")
    survivors = [r for r in results if not r["killed"]]
    for r in survivors:
        print(f"  {r['label']}" + ("   (timed out: not decided, counted as surviving)" if r["by"] == "timeout" else ""))
    killed = sum(r["killed"] for r in results)
    n = len(results)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "sampled": sampled, "total": total, "invalid": [[m.label(), w] for m, w in invalid],
            "equivalent": [m.label() for m in equivalent], "results": results}, indent=1), encoding="utf-8")
    print(f"\n{len(invalid)} invalid, {len(equivalent)} equivalent; {time.perf_counter() - start:.0f} s"
          + (f"; {sampled}" if sampled else ""))
    print(f"killed {killed} of {n} ({100 * killed / n if n else 100:.1f} %)")
    return 0


def _classify_all(mutants: list[Mutant], jobs: int) -> list[tuple[str, str]]:
    if jobs <= 1 or len(mutants) < 8:
        return [classify(m) for m in mutants]
    import multiprocessing

    _baseline()   # once, before forking: every worker inherits it
    ctx = multiprocessing.get_context("fork")
    chunks = [mutants[i::jobs] for i in range(jobs)]
    with ctx.Pool(jobs) as pool:
        parts = pool.map(_classify_batch, chunks)
    out: list[tuple[str, str] | None] = [None] * len(mutants)
    for i, part in enumerate(parts):
        for j, res in enumerate(part):
            out[i + j * jobs] = res
    return out  # type: ignore[return-value]


if __name__ == "__main__":
    sys.exit(main())
