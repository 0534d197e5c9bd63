#!/usr/bin/env python
"""Mutation score of the bundled formula files: how many small planted errors the test suite catches.

    python bench/mutate.py                     # a random sample of 150 of the mutants (stated as such)
    python bench/mutate.py --limit 0           # every mutant of formulas/**/*.mf (the framework subfolders too)
    python bench/mutate.py --space variants --no-subprocess --tests 'tests/test_reference_*.py' ...
                                               # the tool before issue 35 (its space, its tests), same sample
    python bench/mutate.py --files dense.mf    # only mutants of the named files (glob patterns, repeatable)
    python bench/mutate.py --seed 101 --limit 60 --only @survivors.txt   # re-run chosen mutants of the sample
    python bench/mutate.py --limit 300 --seed 1   # another sample size / sample
    python bench/mutate.py --jobs 2            # worker processes (default: 2)
    python bench/mutate.py --list              # only print the mutants, run nothing
    python bench/mutate.py --exclude 'frameworks/*'   # leave files out (repeatable)
    python bench/mutate.py --time              # also the step-time model and its tests (skipped by default)

Mutants are made mechanically on the parse tree of the project's own grammar (memform.lang.parser), so
every one is syntactically valid and touches exactly one token or term: each numeric literal +1, -1
and x2; each ``+``<->``-`` and ``*``<->``/``; ``min``<->``max``; one term of a sum dropped; a symbol swapped
for a sibling (h<->f, t<->cp, g<->a). Each mutant is then classified, in this order:

* invalid     -- the loader/checker rejects the mutated program (``memform check`` would): not a silent
                 error, so it is neither killed nor survived;
* equivalent  -- no memory number changes on any config of the DRAWN SPACE (issue 35; :func:`draw_configs`):
                 ``--draws`` (48) configs drawn with a fixed ``--draw-seed`` (35) -- every bundled config and
                 two toys (:data:`TOY_BASES`: a hybrid stack with every layer kind, a vision tower before a
                 MoE) in turn x a framework profile x schedule x recompute x pp/vpp/micro-batches x
                 dp/tp/cp/ep/expert-tp/ZeRO/SP/distributed optimizer x each ``option`` of the loaded formula
                 files (drawn from its type's values), repaired where the loader refuses -- plus a targeted
                 draw for each value of a finite-valued option no draw reached (the run prints how many of
                 them the space reaches, and which not; the values are read from every formula file, and
                 ``--coverage`` draws the space alone and records bench/results/mutate-coverage.json, which
                 tests/test_mutate.py holds the files' declarations to). Each draw is then widened (:func:`_widen`; ``--space
                 narrow`` leaves this out: stop 43's space): a device preset (so that step-time terms are
                 told apart as step-time), a sequence length, the width with the head count, the layer count,
                 and one or two of the base's keys that a formula declares with a default DROPPED (the
                 default is read). Each config is estimated by the numeric path
                 (``memform.estimate(numeric=True)``: categories, moments, peak moment, parameters, host and
                 runtime bytes, the allocator's reserve, the active parameters of MoE layers); a live mutant names the draw that told it apart.
                 ``--space variants`` is the space before issue 35 (the bundled configs and :data:`VARIANTS`),
                 under which a mutant no bundled set-up tells apart was "equivalent";
* step-time   -- only the step-time model's numbers change (the ``time`` keys of ``--json``, issue 14):
                 reported separately and not counted unless ``--time``, which also mutates the step-time
                 model's own files (:data:`TIME_FILES`, left out by default);
* killed      -- some test of the selection fails with the mutant in place;
* survived    -- every test of the selection passes.

The tests run IN-PROCESS: a worker starts one pytest session over the selected test files, runs each
test once unmutated (the baseline: tests that fail, skip or use hypothesis are left out, and counted),
records which formula files each test reads, and then, per mutant, serves the mutated text through
memform's formula reader (``memform.lang.parser.read_text``) and re-runs only the tests that read the
mutated file, stopping at the first failure (per formula file, the test that killed that file's last
mutant goes first). A test that starts a subprocess runs too (issue 35): each worker keeps a copy of
formulas/ with the mutant's text in place and names it to its children through memform's formula-directory
variable (``MEMFORM_FORMULAS_DIR``, :data:`memform.resources.FORMULAS_ENV`); such a test is counted as
reading every formula file, and goes after the in-process ones (slowest last). ``--no-subprocess`` leaves
them out as before (the baseline stops them at their first Popen). PyTorch
measurements do not depend on the formula files, so the run measures each validation case once: the
workers share them through a temporary directory, and the mutant phase reuses the baseline's.

Prints every surviving mutant as ``file:line:col  mutation``, then ``killed K of N (P %)`` with N the
valid, non-equivalent mutants (a mutant whose tests run past the per-mutant limit, 600 s, is listed
with the survivors and counted as one: undecided is not killed).

Under the bundled-configs space (``--space variants``) many mutants were "equivalent" only because no
bundled set-up reached them (a profile redefining what it models, options no bundled config turns on):
issue 35 measured about 87 % killed where that space said 98-100 %. The drawn space reaches those options;
what stays equivalent under it is argued mutant by mutant in bench/results/mutate-equivalent.md.
"""

from __future__ import annotations

import argparse
import bisect
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
#: PyTorch validation subset (each measured once per worker), and (stop 45) the files that hold formula
#: numbers to recorded framework runs: torchtitan's op-level SAC on MLA/MoE (test_fsdp2_*.py: they kill
#: seed 101's survivors fsdp2/mla.mf:15 and fsdp2/moe.mf:15, which no file of the old list reads), the
#: DeepSpeed / Megatron / transformers ground truth, published runs, MindFormers' recorded memory; (compile7)
#: the compiled blocks' recorded partitioner measurements (test_compiled_block.py: model.compile's terms)
DEFAULT_TESTS = ("tests/test_reference_*.py", "tests/test_pipeline.py", "tests/test_models.py",
                 "tests/test_validate.py", "tests/test_frameworks.py", "tests/test_framework_*.py",
                 "tests/test_distributed.py", "tests/test_arch_*.py", "tests/test_optimizers.py",
                 "tests/test_finetune.py", "tests/test_qlora.py", "tests/test_fsdp2_*.py",
                 "tests/test_frameworks_*.py", "tests/test_optimizers_finetune.py", "tests/test_grad_clip.py",
                 "tests/test_published_runs.py", "tests/test_mindformers_recorded_memory.py",
                 "tests/test_frozen.py", "tests/test_megatron_allocator.py", "tests/test_compiled_block.py",
                 # stop 48: tests of formula numbers the selection left out (fine-grained / layer offload, Muon, hf-fsdp1)
                 "tests/test_offload*.py", "tests/test_muon.py", "tests/test_trainer_fsdp1.py")
#: the selection before issue 35 (``--tests`` with these, ``--space variants --no-subprocess``: the figure
#: the tool reported then, on the same sample)
OLD_TESTS = DEFAULT_TESTS[:7]

#: added to the default selection with ``--time``: the step-time model's own references
TIME_TESTS = ("tests/test_time.py", "tests/test_search_time.py", "tests/test_published_throughput.py")

#: formula files a default run leaves alone: the step-time model (issue 14), which its own tests pin;
#: ``--time`` mutates it too (see :func:`formula_files`)
TIME_FILES = ("time.mf", "time/*.mf")
#: the ``--json`` keys of the step-time model (results.py: a stage's and the estimate's ``time``); a
#: mutant that changes nothing but these is a step-time mutant, skipped unless ``--time``
TIME_KEYS = ("time",)

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


def _matches(p: Path, patterns) -> bool:
    rel = p.relative_to(ROOT).as_posix()
    return any(fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(p.name, pat) or fnmatch.fnmatch(rel, "formulas/" + pat)
               for pat in patterns)


def formula_files(patterns: list[str] | None = None, exclude: list[str] | tuple[str, ...] = TIME_FILES) -> list[Path]:
    """The bundled formula files to mutate: formulas/*.mf, formulas/frameworks/*.mf and formulas/time/*.mf
    (or those whose repository-relative path or file name matches one of ``patterns``), less those
    matching ``exclude`` (by default the step-time model's files, :data:`TIME_FILES`)."""
    files = sorted((ROOT / "formulas").rglob("*.mf"))
    if patterns:
        files = [p for p in files if _matches(p, patterns)]
    return [p for p in files if not _matches(p, exclude or ())]


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
    # the top-level declarations' spans: a dropped term is re-parsed within its own declaration only.
    # Every declaration starts with a keyword that cannot continue an expression, and the parser is in
    # the same state before each (grammar/memform.lark: start: item*), so the file parses iff the edited
    # declaration parses on its own (the text around it is unchanged; ToAst keeps no state across
    # declarations); a whole-file parse per mutant was most of generate()'s time
    starts = [_span(item)[0] for item in tree.children]
    ends = [_span(item)[1] for item in tree.children]
    out = []
    for s, e, new, pos, kind, desc in sorted(edits, key=lambda x: (x[3], x[4], x[5])):
        mutated = text[:s] + new + text[e:]
        if kind == "drop":     # a token swap keeps the grammar; a dropped term is re-parsed to be sure
            k = bisect.bisect_right(starts, s) - 1
            lo, hi = starts[k], ends[k]
            try:
                parse_text(text[lo:s] + new + text[e:hi] if lo <= s and e <= hi else mutated, rel)
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
#: set while the baseline runs: a test that starts a subprocess is stopped there (it is left out in any case,
#: and what the subprocess would run is the slow part)
_BLOCK_SPAWN: list[bool] = [False]


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
        import memform.fastpath.fastcache as fastcache
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


def bundled_configs() -> list[Path]:
    """The bundled configs, the published runs of ``configs/published/`` included (the test suite's
    every-config loops leave those out for time; the equivalence space keeps them)."""
    return sorted((ROOT / "configs").glob("*.yaml")) + sorted((ROOT / "configs" / "published").glob("*.yaml"))


def variants() -> list[tuple[str, tuple[str, ...]]]:
    """The bundled configs and :data:`VARIANTS` (the equivalence space before issue 35; kept for
    ``--space variants``, the figure the drawn space is compared with)."""
    return [(str(p.relative_to(ROOT)), ()) for p in bundled_configs()] + list(VARIANTS)


#: the equivalence space: ``("draws", seed, n, time_model, targeted, wide)`` (:func:`draw_configs`) or
#: ``("variants",)``
SPACE: list = [("draws", 17, 0, False, True, True, True)]
#: per point of the space: (its label, raw config or path, overrides, its numbers, the formula files it reads)
_BASE: list[tuple[str, object, object, dict | str, set[str]]] = []
#: the drawn configs of the space (:func:`draw_configs`), for the coverage line
_DRAWN: list = []


def set_space(kind: str, seed: int = 17, n: int = 0, time_model: bool = False, targeted: bool = True,
              pairs: bool = True) -> None:
    """Choose the equivalence space (before the first :func:`classify`): ``draws`` (``n`` drawn with
    ``seed``, plus the targeted draws unless ``targeted`` is false, each widened by :func:`_widen`:
    :func:`draw_configs`), ``narrow`` (the same without :func:`_widen`: the space of stop 43) or
    ``variants`` (the bundled configs and :data:`VARIANTS`)."""
    SPACE[0] = (("draws", seed, n or DEFAULT_DRAWS, time_model, targeted, kind == "draws", pairs and targeted)
                if kind in ("draws", "narrow") else ("variants",))
    _BASE.clear()
    _DRAWN.clear()


def set_draws(draws: list) -> None:
    """Make the equivalence space exactly ``draws`` (:class:`Draw` s; tests pin a space so)."""
    SPACE[0] = ("given", draws)
    _BASE.clear()
    _DRAWN.clear()


#: a drawn override value that removes the base config's key instead (:func:`_widen`: the formula's
#: default is read then)
DROP = "<dropped>"


def _split(raw: dict, overrides: dict) -> tuple[dict, dict]:
    """``raw`` less the keys ``overrides`` maps to :data:`DROP`, and the other overrides."""
    drops = [k for k, v in overrides.items() if v == DROP]
    if not drops:
        return raw, overrides
    raw = json.loads(json.dumps(raw))
    for k in drops:
        *parents, last = k.split(".")
        node = raw
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return raw, {k: v for k, v in overrides.items() if v != DROP}


def _draw_numbers(raw: dict, overrides: dict) -> dict | str:
    """The numbers of one drawn config from the numeric evaluator (``memform.estimate``'s numbers without
    sympy): per stage its categories, moments, peak moment, parameters, host and runtime bytes, the
    allocator's reserve, and -- under ``.time.`` keys -- the step-time model's; or the error's text."""
    import memform.engine.model as model
    from memform.errors import MemformError

    try:
        est = model.estimate(*_split(raw, overrides), numeric=True)
    except MemformError as exc:
        # without the requirement's file:line (a dropped term spanning lines moves the ones after it)
        import re
        return "error: " + re.sub(r"requirement at [^)]*", "requirement", str(exc))
    out: dict = {}
    for s in est.stages:
        p = f".stages[{s.stage}]"
        out.update({f"{p}.{k}": v for k, v in s.values.items()})
        out.update({f"{p}.moments.{k}": v for k, v in s.moments.items()})
        out.update({f"{p}.runtime.{k}": v for k, v in s.runtime.items()})
        out.update({f"{p}.time.{k}": v for k, v in s.time_ps.items()})
        out[f"{p}.time.ideal"] = s.ideal_ps
        out[f"{p}.peak_moment"] = str(s.peak_moment)
        out[f"{p}.param_count"] = s.param_count
        out[f"{p}.host_bytes"] = s.host_bytes
        out[f"{p}.reserve"] = (s.reserve, s.reserve_oom, s.reserve_releases)
    # (stop 47) the parameters a token passes through (moe.mf / mamba.mf ``active_params``: tests/test_models.py holds
    # them to the published activated counts), which no category reads: a mutant of them was "equivalent"
    ev = None
    for s in est.stages:
        act = 0
        for g in s.layers:
            if est.model.program.pick(g.block, "active_params", g.mode) is not None:
                ev = ev or est.model.evaluator()
                act += g.count_value * ev.number(ev.quantity(g.block, "active_params", g.mode, overrides=g.bindings))
        out[f".stages[{s.stage}].active_params"] = act
    return out


def _baseline() -> list[tuple[str, object, object, dict | str, set[str]]]:
    if not _BASE:
        install_reader()
        serve(None)
        if SPACE[0][0] == "variants":
            for cfg, over in variants():
                _READS.clear()
                nums = _estimate_numbers(cfg, over)
                if isinstance(nums, str):
                    print(f"mutate: variant {cfg} {' '.join(over)} fails unmutated, left out: {nums[:200]}",
                          file=sys.stderr)
                    continue
                _BASE.append((f"{cfg} {' '.join(over)}".strip(), cfg, over, nums, set(_READS)))
        else:
            raws = dict(_bases())
            stored = _space_file(SPACE[0]) if SPACE[0][0] == "draws" else None
            if stored is not None and stored.exists():
                import pickle
                drawn, rows = pickle.loads(stored.read_bytes())
                _DRAWN[:] = drawn
                _BASE.extend((label, raws[base], over, nums, reads) for label, base, over, nums, reads in rows)
                return _BASE
            if SPACE[0][0] == "given":
                _DRAWN[:] = SPACE[0][1]
            else:
                _, seed, n, time_model, targeted, wide, pairs = SPACE[0]
                _DRAWN[:] = draw_configs(seed, n or DEFAULT_DRAWS, time_model=time_model, targeted=targeted,
                                         wide=wide, pairs=pairs)
            rows = []
            for d in _DRAWN:
                _READS.clear()
                nums = _draw_numbers(raws[d.base], d.overrides)
                if not isinstance(nums, str) or str(d.index).startswith("R"):
                    _BASE.append((d.label(), raws[d.base], d.overrides, nums, set(_READS)))
                    rows.append((d.label(), d.base, d.overrides, nums, set(_READS)))
            if stored is not None:
                import pickle
                part = stored.with_suffix(f".{os.getpid()}.part")
                part.write_bytes(pickle.dumps((list(_DRAWN), rows)))
                os.replace(part, stored)
    return _BASE


def _space_file(space: tuple) -> Path:
    """Where a drawn space's unmutated numbers are kept between runs (the temporary directory; named by a
    digest of the space's parameters, bench/mutate.py, the bundled configs, every formula file and memform's
    code: any change draws and estimates it again)."""
    import hashlib
    h = hashlib.sha256(repr(space).encode())
    for p in [Path(__file__).resolve(), *bundled_configs(),
              *sorted((ROOT / "formulas").rglob("*.mf")), *sorted((ROOT / "src" / "memform").rglob("*.py"))]:
        h.update(p.as_posix().encode() + b"\0" + p.read_bytes())
    return Path(tempfile.gettempdir()) / f"memform-mutate-space-{h.hexdigest()[:24]}.pickle"


def _memory(nums: dict[str, float]) -> dict[str, float]:
    """``nums`` less the step-time model's numbers (:data:`TIME_KEYS`)."""
    return {k: v for k, v in nums.items() if not any(f".{t}." in k or k.startswith(f".{t}.") or k == f".{t}"
                                                    for t in TIME_KEYS)}


def classify(m: Mutant, time_model: bool = False) -> tuple[str, str]:
    """``("invalid", why)``, ``("equivalent", "")``, ``("time", point)`` -- only step-time numbers change
    (:data:`TIME_KEYS`; ``live`` when ``time_model``) -- or ``("live", the first point of the space that
    tells it apart)``: a drawn config (``draw I (base key=value ...)``) or a variant."""
    base = _baseline()
    drawn = SPACE[0][0] != "variants"
    time_only = ""
    key = str((ROOT / m.file).resolve())
    serve(m)
    try:
        with tagged_loader():
            for where, cfg, over, nums, reads in base:
                if key not in reads:
                    continue
                try:
                    got = _draw_numbers(cfg, over) if drawn else _estimate_numbers(cfg, over)
                except LoadError as exc:
                    return "invalid", " ".join(str(exc).split())[:160]
                except Exception as exc:     # ZeroDivisionError, numeric.Inexact (an irrational value), ...
                    import traceback
                    last = traceback.extract_tb(exc.__traceback__)[-1]
                    return "live", (f"{where} raises {type(exc).__name__}: {str(exc)[:80]} "
                                    f"({Path(last.filename).name}:{last.lineno})")
                if got != nums:
                    if time_model or isinstance(got, str) or isinstance(nums, str) or _memory(got) != _memory(nums):
                        return "live", where
                    time_only = time_only or where
        return ("time", time_only) if time_only else ("equivalent", "")
    finally:
        serve(None)


def _classify_batch(mutants: list[Mutant], time_model: bool = False) -> list[tuple[str, str]]:
    return [classify(m, time_model) for m in mutants]


# ------------------------------------------------------------------------------ the drawn config space

#: framework profiles a draw picks from (formulas/frameworks/NAME.mf)
PROFILES = ("megatron", "deepspeed", "fsdp2", "hf-trainer", "torch", "mindspore")
#: (stop 49) the profiles a random draw picks from: PROFILES and the three that compose them (torch's FSDP1 and the
#: HF Trainer over FSDP1 / FSDP2), which no random draw loaded before (PROFILES stays the recompute x profile pairs'
#: list, so that their ``P<k>`` numbers keep)
DRAW_PROFILES = PROFILES + ("fsdp1", "hf-fsdp1", "hf-fsdp2")
#: draws the equivalence check estimates by default (per --seed); every mutant is checked against the
#: draws that read its file, stopping at the first that tells it apart
DEFAULT_DRAWS = 48
#: the seed of the draws (fixed: the same space for every --seed, which picks the sample)
DRAW_SEED = 35
#: a draw the loader refuses is drawn again (a new set of choices), at most this many times
REDRAWS = 8
#: a value no draw reached gets this many targeted draws (on bases whose files declare its option)
TARGET_TRIES = 6
#: toy architectures beside the bundled configs: the hybrid stack (mamba.mf) at 8 layers with every
#: layer kind in reach (M Mamba-2, * attention, - MLP, E MoE, P parallel hybrid, S Mamba-1, C LFM2 conv),
#: and a vision tower in front of a MoE language model (vision-moe.mf), so that every formula file is read
TOY_BASES: dict[str, dict] = {
    "toy-hybrid": {"name": "toy-hybrid", "formulas": ["mamba.mf"], "model": {
        "hidden_size": 256, "num_heads": 8, "num_kv_heads": 4, "num_layers": 8, "ffn_hidden_size": 512,
        "vocab_size": 1024, "seq_length": 512, "hybrid_pattern": "M*-ESCPM", "norm": "rmsnorm", "bias": False,
        "position_embedding": "rope", "activation": "swiglu", "mamba_num_heads": 8, "mamba_head_dim": 64,
        "mamba_num_groups": 2, "mamba_state_dim": 16, "num_experts": 4, "moe_top_k": 2,
        "moe_ffn_hidden_size": 256},
        "parallel": {"dp": 2}, "training": {"micro_batch_size": 1, "num_micro_batches": 4}},
    "toy-vision-moe": {"name": "toy-vision-moe", "formulas": ["vision-moe.mf"], "model": {
        "hidden_size": 256, "num_heads": 8, "num_kv_heads": 4, "num_layers": 4, "ffn_hidden_size": 512,
        "vocab_size": 1024, "seq_length": 512, "norm": "rmsnorm", "bias": False, "position_embedding": "rope",
        "activation": "swiglu", "num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 256,
        "vision": {"hidden_size": 128, "num_heads": 4, "num_layers": 2, "ffn_hidden_size": 256, "patch_size": 14,
                   "temporal_patch_size": 2, "in_channels": 3, "image_size": 224, "images_per_sample": 1,
                   "spatial_merge_size": 2}},
        "parallel": {"dp": 2}, "training": {"micro_batch_size": 1, "num_micro_batches": 4}},
}
#: structural keys a draw sets (the interpreter's, not declared by an option): value lists
STRUCTURAL_DRAWS: dict[str, tuple] = {
    "training.recompute": ("none", "selective", "full"),
    "parallel.pp": (1, 2, 4),
    "parallel.vpp": (1, 1, 2),
    "training.num_micro_batches": (1, 4, 8),
}
#: symbols (kept symbolic in closed forms, so not options) a draw sets too: the parallel degrees and batch
SYMBOL_DRAWS: dict[str, tuple] = {
    "parallel.dp": (1, 2, 4, 8), "parallel.tp": (1, 2, 4), "parallel.cp": (1, 1, 2), "parallel.ep": (1, 2, 4),
    "parallel.expert_tp": (1, 2), "training.micro_batch_size": (1, 2), "parallel.zero": (0, 1, 2, 3),
    "parallel.sequence_parallel": (False, True), "parallel.distributed_optimizer": (False, True),
}
#: dtype names a dtype option draws from
DTYPES = ("fp32", "bf16", "fp16", "fp8")


@dataclasses.dataclass
class Draw:
    index: int | str                # the draw's number (``T<k>``: a targeted draw)
    base: str                       # a bundled config's path or a TOY_BASES name
    overrides: dict                 # dotted key -> value
    attempts: int = 1

    def label(self) -> str:
        over = " ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in self.overrides.items())
        return f"draw {self.index} ({self.base} {over})"


def _bases() -> list[tuple[str, dict]]:
    """(name, raw config) of every architecture a draw starts from: the bundled configs and :data:`TOY_BASES`;
    the bundled configs' device counts and global batch sizes are dropped (a draw sets the degrees itself)."""
    from memform.engine.config import parse_yaml

    out = []
    for p in bundled_configs():
        # memform's own YAML reading (1.2-style floats such as 160.0e9: yaml.safe_load left DeepSeek-V3's device
        # bandwidth a string, so every draw of that base was refused until stop 48)
        raw = parse_yaml(p.read_text(encoding="utf-8"))
        raw.setdefault("formulas", ["dense.mf"])
        raw["formulas"] = [str((p.parent / f).resolve()) if (p.parent / f).exists() else f for f in raw["formulas"]]
        for sect, key in (("parallel", "devices"), ("training", "global_batch_size"), ("parallel", "stage_layers"),
                          ("training", "recompute_num_layers"), ("training", "recompute_layers"),
                          ("training", "selective_recompute_num_layers")):
            (raw.get(sect) or {}).pop(key, None)
        out.append((str(p.relative_to(ROOT)), raw))
    out += [(name, json.loads(json.dumps(raw))) for name, raw in TOY_BASES.items()]
    return out


def _value_of(rng: random.Random, spec, default=None):
    """A value of an option's type (:class:`memform.lang.ast.TypeSpec`), or ``_NO`` where it has no finite
    or small set of values worth drawing (real numbers: a few; unranged integers: a few small ones)."""
    kind = spec.kind
    if spec.or_bool and rng.random() < 0.5:
        return rng.choice([True, False])
    if kind == "bool":
        return rng.choice([True, False])
    if kind == "enum":
        return rng.choice(list(spec.choices))
    if kind == "set":
        return sorted(c for c in spec.choices if rng.random() < 0.5)
    if kind == "dtype":
        return rng.choice(DTYPES)
    if kind == "real":
        return rng.choice([0, 0.1, 0.5, 1, 2])
    if kind == "int":
        lo = spec.lo if spec.lo is not None else 0
        hi = spec.hi if spec.hi is not None else 8
        cands = sorted({v for v in (lo, lo + 1, 2, 3, 4, 8, hi) if lo <= v <= hi})
        return rng.choice(cands)
    return _NO


_NO = object()


def _program_of(raw: dict, overrides: dict):
    from memform.engine.config import apply_overrides, normalize
    from memform.engine.model import _program
    raw, overrides = _split(raw, overrides)
    return _program(normalize(apply_overrides(raw, overrides), None), None)


def _draw_once(rng: random.Random, raw: dict, p_option: float, time_model: bool = False) -> dict:
    over: dict = {"training.framework": rng.choice(DRAW_PROFILES)}
    for key, values in STRUCTURAL_DRAWS.items():
        over[key] = rng.choice(values)
    program = _program_of(raw, over)
    over["parallel.pp_schedule"] = rng.choice(sorted(program.schedules()))
    layers = (raw.get("model") or {}).get("num_layers", 0)
    for b in sorted(program.bindings.values(), key=lambda b: b.path):
        if not time_model and any(fnmatch.fnmatch(Path(b.loc.file).name, t) or b.loc.file.endswith("/" + t)
                                  for t in TIME_FILES):
            continue       # the step-time model's own keys change only ``time`` numbers
        if b.path in SYMBOL_DRAWS:
            if rng.random() < 0.6:
                over[b.path] = rng.choice(SYMBOL_DRAWS[b.path])
        elif b.keyword != "option" or rng.random() >= p_option:
            continue
        elif b.type.kind == "names":
            if 0 < layers <= 16 and b.type.choices:     # a toy's per-layer kinds, one name per layer
                over[b.path] = [rng.choice(b.type.choices) for _ in range(layers)]
        else:
            value = _value_of(rng, b.type)
            if value is not _NO:
                over[b.path] = value
    return over


#: pipeline schedules that place two chunks per stage in a V (schedules.mf, frameworks/torch.mf)
V_SCHEDULES = ("zero-bubble-v", "dualpipev", "torch-zbv", "torch-dualpipev")
#: sequence lengths a widened draw sets (besides the base's): short, past one 2048-token scan chunk, long
WIDE_SEQ = (256, 3000, 8192, 65536)


def _widen(rng: random.Random, raw: dict, over: dict, keep: tuple[str, ...] = ()) -> None:
    """Widen one draw (issue 35: mutants "equivalent" only because the space held these fixed), in place,
    with its own ``rng``: a device preset (half the draws: step-time terms then classify as step-time, not
    equivalent), a sequence length (half), the width doubled with the head count (a quarter: head size
    kept), the layer count doubled where no per-layer pattern fixes it (a quarter), and one or two of the
    base's keys that a formula declares with a default dropped (40 %: the default is read then)."""
    from memform.engine.config import device_presets

    model = raw.get("model") or {}
    if rng.random() < 0.5 and "device.preset" not in keep:
        over["device.preset"] = rng.choice(sorted(device_presets()))
    if rng.random() < 0.5 and model.get("seq_length"):
        over["model.seq_length"] = rng.choice(WIDE_SEQ)
    if rng.random() < 0.25 and model.get("hidden_size") and model.get("num_heads"):
        over["model.hidden_size"] = 2 * model["hidden_size"]
        over["model.num_heads"] = 2 * model["num_heads"]
    if rng.random() < 0.25 and model.get("num_layers") and not model.get("hybrid_pattern"):
        over["model.num_layers"] = 2 * model["num_layers"]
    if rng.random() < 0.4:
        try:
            program = _program_of(raw, over)
        except Exception:
            return
        from memform.engine.config import get_path
        cands = sorted(b.path for b in program.bindings.values()
                       if b.default is not None and b.path not in over and b.path not in keep
                       and b.path.split(".")[0] in ("model", "training", "parallel")
                       and get_path(raw, b.path, None) is not None)
        for k in rng.sample(cands, min(len(cands), rng.choice((1, 2)))):
            over[k] = DROP


def _repair(raw: dict, over: dict, rng: random.Random, keep: tuple[str, ...] = ()) -> int:
    """Take drawn keys back until the numeric estimate accepts ``over`` (in place): the keys an error names
    (else one at random; never ``training.framework`` nor ``keep``). The attempts it took, or 0."""
    import memform.engine.model as model

    for attempt in range(1, REDRAWS + 1):
        try:
            model.estimate(*_split(raw, over), numeric=True)
            return attempt
        except Exception as exc:     # MemformError, or an inexact (irrational) value
            text = str(exc)
            fixed = ("training.framework", *keep)
            drop = [k for k in over if k not in fixed and (k in text or f"'{k.split('.')[0]}'" in text)]
            if "schedule" in text and "parallel.pp_schedule" not in fixed:
                drop.append("parallel.pp_schedule")
            free = [k for k in over if k not in fixed]
            if not [k for k in drop if k in over]:
                if not free:
                    return 0
                drop = [rng.choice(free)]
            for k in drop:
                over.pop(k, None)
    return 0


#: option PAIRS (stop 45; 26): terms that two or three option values gate together, which per-value targeted
#: draws reach only by chance (each pins one value; the rest is drawn, and the repair takes drawn keys back).
#: Each is (why, base, pinned overrides); a pair the loader refuses is left out and named on stderr. From the
#: "equivalent" mutants of seeds 101, 202 and 303 (bench/results/mutate-equivalent.md) that were space misses.
_HF = {"training.framework": "hf-trainer", "parallel.tp": 1, "parallel.sequence_parallel": False, "parallel.zero": 0,
       "parallel.pp": 1, "parallel.cp": 1, "training.precision.params": "fp32",
       "training.precision.grads": "fp32", "training.precision.optimizer": "fp32",
       "training.precision.master_weights": False}
_DS3 = {"training.framework": "deepspeed", "parallel.zero": 3, "parallel.dp": 4, "parallel.pp": 1}
_TOY_WIDTH = {"model.hidden_size": 256, "model.num_heads": 8, "model.num_kv_heads": 4, "model.ffn_hidden_size": 512,
              "model.vocab_size": 1024, "model.num_layers": 4, "model.seq_length": 512}
PAIR_DRAWS: tuple[tuple[str, str, dict], ...] = (
    # Muon's AdamW share of the non-matrix parameters, per layer kind (mamba.mf, mamba1.mf, lfm2.mf vec_params)
    ("muon x hybrid layers", "toy-hybrid", {"training.optimizer": "muon", "model.short_conv_bias": True}),
    ("muon x hybrid, mamba-1 bias", "toy-hybrid", {"training.optimizer": "muon", "model.bias": True,
                                                    "model.mamba1_dt_norms": True}),
    ("muon x nemotron-h", "configs/nemotron-h-8b.yaml", {"training.optimizer": "muon"}),
    ("muon x deltanet", "configs/qwen3-next-80b-a3b.yaml", {"training.optimizer": "muon"}),
    ("muon x MoE", "configs/mixtral-8x7b.yaml", {"training.optimizer": "muon"}),
    # ZeRO-3's small tensors (deepspeed.mf ds_small: tensors under the persistence threshold stay gathered), with
    # the transformers modeling's separate q/k/v and TP splitting them (a threshold of 10^7 elements: Llama-3-8B's
    # q/o at tp 2 are 8.4M; 10^15 is refused: zero3_cache goes negative); prefetch with a small live budget
    ("ZeRO-3 small tensors, transformers modeling, tp 2", "configs/llama3-8b.yaml",
     {**_DS3, "deepspeed.modeling": "transformers", "parallel.tp": 2,
      "deepspeed.stage3_param_persistence_threshold": 10 ** 7}),
    ("ZeRO-3 small tensors, plain, tp 2", "configs/llama3-8b.yaml",
     {**_DS3, "parallel.tp": 2, "deepspeed.stage3_param_persistence_threshold": 10 ** 7}),
    ("ZeRO-3 small tensors x MoE", "configs/mixtral-8x7b.yaml",
     {**_DS3, "parallel.ep": 1, "deepspeed.modeling": "transformers",
      "deepspeed.stage3_param_persistence_threshold": 10 ** 7}),
    # ... and at a toy width, where the layers' sum is below the reuse window (z3_live) and ds_small reaches the
    # working set (checked on these two draws alone: seed 202's deepspeed.mf:179:56 and seed 101's :247:62 live)
    ("ZeRO-3 small tensors x toy width, transformers modeling, tp 2", "configs/llama3-8b.yaml",
     {**_DS3, **_TOY_WIDTH, "deepspeed.modeling": "transformers", "parallel.tp": 2}),
    ("ZeRO-3 small tensors x toy width x short reuse", "configs/llama3-8b.yaml",
     {**_DS3, **_TOY_WIDTH, "parallel.tp": 2, "deepspeed.stage3_max_reuse_distance": 0,
      "deepspeed.stage3_prefetch_bucket_size": 10 ** 5}),
    ("ZeRO-3 prefetch x small live budget", "configs/llama3-8b.yaml",
     {**_DS3, "deepspeed.stage3_max_live_parameters": 1, "deepspeed.stage3_prefetch_bucket_size": 8,
      "deepspeed.stage3_max_reuse_distance": 0}),
    ("ZeRO-3 x deltanet", "configs/qwen3-next-80b-a3b.yaml", {**_DS3, "parallel.ep": 1, "parallel.tp": 1}),
    # Megatron's local (non-TE) core with its unfused kernels on a MoE, and fp8 on a MoE
    ("megatron local core x eager attention x MoE", "configs/mixtral-8x7b.yaml",
     {"training.framework": "megatron", "megatron.transformer_impl": "local", "megatron.masked_softmax_fusion": False,
      "model.flash_attention": False}),
    ("megatron local core x rope x selective", "configs/llama3-8b.yaml",
     {"training.framework": "megatron", "megatron.transformer_impl": "local", "megatron.rope_fusion": False,
      "training.recompute": "selective", "model.flash_attention": False}),
    ("megatron fp8 x MoE", "configs/mixtral-8x7b.yaml", {"training.framework": "megatron", "megatron.fp8": "hybrid"}),
    ("megatron fp8 x MoE, fp8 activation input", "configs/deepseek-v2-lite.yaml",
     {"training.framework": "megatron", "megatron.fp8": "e4m3", "megatron.activation_func_fp8_input_store": True}),
    # the HF Trainer's AMP on a MoE (fp32 grouped experts), on a gated-attention hybrid, with LoRA on the MLP
    ("hf-trainer amp x MoE", "configs/mixtral-8x7b.yaml", {**_HF, "parallel.ep": 1, "hf_trainer.amp": "bf16",
                                                           "training.precision.activations": "bf16"}),
    ("hf-trainer fp32 x deltanet", "configs/qwen3-next-80b-a3b.yaml", {**_HF, "parallel.ep": 1,
                                                                       "training.precision.activations": "fp32",
                                                                       "training.recompute": "selective"}),
    ("hf-trainer amp x LoRA MLP x dropout", "configs/llama3-8b.yaml",
     {**_HF, "hf_trainer.amp": "bf16", "training.precision.activations": "bf16", "lora.rank": 8,
      "lora.gate_proj": True, "lora.up_proj": True, "lora.down_proj": True, "lora.dropout": 0.1}),
    ("hf-trainer amp x vision", "configs/qwen2-vl-7b.yaml", {**_HF, "hf_trainer.amp": "bf16",
                                                             "training.precision.activations": "bf16"}),
    # fsdp2's op-level SAC with the fused QKV; torchtitan's chunked loss with TP
    ("fsdp2 op SAC x fused QKV", "configs/llama3-8b.yaml",
     {"training.framework": "fsdp2", "training.recompute": "selective", "fsdp2.selective_ac": "op",
      "fsdp2.fused_qkv": True}),
    ("fsdp2 op SAC x MLA x MoE", "configs/deepseek-v2-lite.yaml",
     {"training.framework": "fsdp2", "training.recompute": "selective", "fsdp2.selective_ac": "op",
      "fsdp2.grouped_experts": True, "parallel.ep": 2, "parallel.tp": 1}),
    # MoE's shared-expert gate with SP; MLA with context parallelism; a NAS linear sublayer under full recompute
    ("shared-expert gate x SP", "configs/qwen3-next-80b-a3b.yaml",
     {"training.framework": "megatron", "parallel.tp": 2, "parallel.sequence_parallel": True}),
    ("MLA x CP", "configs/deepseek-v2-lite.yaml", {"training.framework": "megatron", "parallel.cp": 2}),
    ("NAS linear sublayers x full recompute", "configs/llama-3.3-nemotron-super-49b.yaml",
     {"training.recompute": "full"}),
    ("NAS linear sublayers x selective", "configs/llama-3.3-nemotron-super-49b.yaml",
     {"training.recompute": "selective", "model.flash_attention": False}),
)
#: stop 46: the joint conditions stop 45's equivalents and survivors pointed at (bench/results/mutate-equivalent.md):
#: fp8 recipes, DeepSpeed's offload x stage, hf-trainer AMP x Mamba, activation offload modes x profiles, PEFT/LoRA
#: (4-bit bases), Muon under hf-trainer, the hf-fsdp2 profile (no draw picked it: PROFILES), the DualPipeV and
#: zero-bubble schedules on NAS / MoE stacks, Mamba with CP, ZeRO-3 with every tensor persistent. They come after
#: the recompute draws, so that every earlier draw keeps its ``P<k>`` (a mutant told apart only by one of these
#: is one stop 45's space calls equivalent)
_PP_V = {"parallel.pp": 2, "parallel.vpp": 2, "training.num_micro_batches": 4}
MORE_PAIR_DRAWS: tuple[tuple[str, str, dict], ...] = (
    ("megatron fp8 mxfp8 x dense", "configs/llama3-8b.yaml",
     {"training.framework": "megatron", "megatron.fp8": "e4m3", "megatron.fp8_recipe": "mxfp8"}),
    ("megatron fp8 blockwise x MoE", "configs/deepseek-v2-lite.yaml",
     {"training.framework": "megatron", "megatron.fp8": "e4m3", "megatron.fp8_recipe": "blockwise"}),
    ("megatron fp8 tensorwise x fp8 param gather", "configs/llama3-8b.yaml",
     {"training.framework": "megatron", "megatron.fp8": "hybrid", "megatron.fp8_recipe": "tensorwise",
      "megatron.fp8_param_gather": True}),
    ("fsdp2 float8 tensorwise x float8 all-gather", "configs/llama3-8b.yaml",
     {"training.framework": "fsdp2", "fsdp2.float8": "tensorwise", "fsdp2.float8_all_gather": True}),
    ("deepspeed offload x ZeRO-1", "configs/llama3-8b.yaml",
     {**_DS3, "parallel.zero": 1, "deepspeed.offload_optimizer": "cpu"}),
    ("deepspeed offload x ZeRO-2 x accumulation", "configs/llama3-8b.yaml",
     {**_DS3, "parallel.zero": 2, "deepspeed.offload_optimizer": "cpu", "training.num_micro_batches": 4}),
    ("deepspeed offload optimizer + params x ZeRO-3", "configs/llama3-8b.yaml",
     {**_DS3, "deepspeed.offload_optimizer": "cpu", "deepspeed.offload_param": "cpu"}),
    ("deepspeed ZeRO-3 x every tensor persistent", "configs/llama3-8b.yaml",
     {**_DS3, "parallel.tp": 2, "deepspeed.stage3_param_persistence_threshold": 10 ** 15}),
    ("deepspeed ZeRO-3 x NAS", "configs/llama-3.3-nemotron-super-49b.yaml", {**_DS3, "parallel.tp": 1}),
    ("deepspeed ZeRO-2 x MoE", "configs/mixtral-8x7b.yaml", {**_DS3, "parallel.zero": 2, "parallel.ep": 1}),
    ("mindspore optimizer offload x MoE", "configs/deepseek-v2-lite.yaml",
     {"training.framework": "mindspore", "training.optimizer_offload": 1}),
    ("hf-trainer amp x Mamba", "configs/nemotron-h-8b.yaml",
     {**_HF, "hf_trainer.amp": "bf16", "training.precision.activations": "bf16"}),
    ("hf-trainer amp x hybrid toy, torch scan", "toy-hybrid",
     {**_HF, "hf_trainer.amp": "bf16", "training.precision.activations": "bf16", "model.mamba_impl": "torch"}),
    ("hf-trainer muon", "configs/llama3-8b.yaml", {**_HF, "hf_trainer.optim": "muon", "hf_trainer.muon_adamw": "single"}),
    ("hf-trainer adafactor x LoRA", "configs/llama3-8b.yaml",
     {**_HF, "hf_trainer.optim": "adafactor", "lora.rank": 16, "lora.o_proj": True}),
    ("QLoRA nf4 x double quant x every projection", "configs/llama3-8b.yaml",
     {**_HF, "lora.rank": 16, "lora.base_quant": "nf4", "lora.double_quant": True, "lora.k_proj": True,
      "lora.o_proj": True, "lora.gate_proj": True, "lora.up_proj": True, "lora.down_proj": True}),
    ("QLoRA fp4 x bf16 base x dropout", "configs/llama3-8b.yaml",
     {**_HF, "lora.rank": 8, "lora.base_quant": "fp4", "training.precision.params": "bf16",
      "training.precision.grads": "bf16", "training.precision.optimizer": "bf16",
      "training.precision.activations": "bf16", "lora.dropout": 0.1}),
    ("hf-fsdp2", "configs/llama3-8b.yaml", {"training.framework": "hf-fsdp2", "parallel.tp": 1, "parallel.pp": 1}),
    ("hf-fsdp2 x full recompute x MoE", "configs/mixtral-8x7b.yaml",
     {"training.framework": "hf-fsdp2", "parallel.tp": 1, "parallel.pp": 1, "parallel.ep": 1,
      "training.recompute": "full"}),
    ("activation offload checkpoint x full recompute, megatron", "configs/llama3-8b.yaml",
     {"training.framework": "megatron", "training.recompute": "full", "training.activation_offload": "checkpoint"}),
    ("activation offload checkpoint x hf-trainer", "configs/llama3-8b.yaml",
     {**_HF, "training.recompute": "full", "training.activation_offload": "checkpoint"}),
    ("activation offload layers x megatron", "configs/llama3-8b.yaml",
     {"training.framework": "megatron", "parallel.pp": 1, "training.activation_offload": "layers",
      "training.activation_offload_layers": 8}),
    ("activation offload all x fsdp2", "configs/llama3-8b.yaml",
     {"training.framework": "fsdp2", "training.activation_offload": "all"}),
    ("torch dualpipev x p4 m8", "configs/llama3-8b.yaml",
     {"training.framework": "torch", "parallel.pp": 4, "parallel.vpp": 2, "training.num_micro_batches": 8,
      "parallel.pp_schedule": "torch-dualpipev"}),
    ("torch zero-bubble-v x NAS", "configs/llama-3.3-nemotron-super-49b.yaml",
     {"training.framework": "torch", **_PP_V, "parallel.pp_schedule": "torch-zbv"}),
    ("torch zero-bubble-v x MoE", "configs/mixtral-8x7b.yaml",
     {"training.framework": "torch", **_PP_V, "parallel.pp_schedule": "torch-zbv"}),
    ("Mamba x CP", "configs/nemotron-h-8b.yaml", {"training.framework": "megatron", "parallel.cp": 2, "parallel.dp": 1}),
    ("megatron MoE allgather dispatcher x capacity padding x probs at the combine", "configs/mixtral-8x7b.yaml",
     {"training.framework": "megatron", "megatron.moe_token_dispatcher_type": "allgather",
      "megatron.moe_pad_expert_input_to_capacity": True, "megatron.moe_probs_in_experts": False}),
    ("megatron MoE flex dispatcher", "configs/deepseek-v2-lite.yaml",
     {"training.framework": "megatron", "megatron.moe_token_dispatcher_type": "flex"}),
    ("adafactor x tp 1", "configs/llama3-8b.yaml",
     {"training.framework": "megatron", "parallel.tp": 1, "parallel.distributed_optimizer": False,
      "training.optimizer": "adafactor"}),
    # (seed 606's equivalents, each a term two or three settings gate together)
    ("deepspeed ZeRO-2 offload x NAS x transformers modeling x tp 2", "configs/llama-3.3-nemotron-super-49b.yaml",
     {**_DS3, "parallel.zero": 2, "deepspeed.offload_optimizer": "cpu", "deepspeed.modeling": "transformers",
      "parallel.tp": 2}),
    ("megatron local core x GQA x rope x no recompute", "configs/llama3-8b.yaml",
     {"training.framework": "megatron", "megatron.transformer_impl": "local", "training.recompute": "none"}),
    ("NAS x ungated MLP", "configs/llama-3.3-nemotron-super-49b.yaml", {"model.activation": "gelu"}),
    ("megatron full recompute x uniform groups", "configs/llama3-8b.yaml",
     {"training.framework": "megatron", "training.recompute": "full", "megatron.recompute_uniform_layers": 2}),
    ("dualpipe x device", "configs/llama3-8b.yaml",
     {"parallel.pp": 4, "parallel.vpp": 2, "training.num_micro_batches": 8, "parallel.pp_schedule": "dualpipe",
      "device.preset": "h100-sxm"}),
    ("hf-trainer x micro-batch 2", "configs/llama3-8b.yaml", {**_HF, "training.micro_batch_size": 2}),
    # (seed 404's equivalents, added after the four-seed measurement: bench/results/mutate-equivalent.md)
    ("deepspeed ZeRO-1 offload x pp 4", "configs/llama3-8b.yaml",
     {**_DS3, "parallel.zero": 1, "parallel.dp": 2, "parallel.pp": 4, "training.num_micro_batches": 8,
      "deepspeed.offload_optimizer": "cpu"}),
    ("deepspeed ZeRO-1 offload x pp 4 x NAS", "configs/llama-3.3-nemotron-super-49b.yaml",
     {**_DS3, "parallel.zero": 1, "parallel.dp": 2, "parallel.pp": 4, "training.num_micro_batches": 8,
      "deepspeed.offload_optimizer": "cpu"}),
    ("deepspeed ZeRO-1 x fp32 gradients", "configs/llama3-8b.yaml",
     {**_DS3, "parallel.zero": 1, "training.precision.grads": "fp32"}),
    ("mindspore x biases x threshold 0", "configs/llama3-8b.yaml",
     {"training.framework": "mindspore", "model.bias": True, "mindspore.parallel_optimizer_threshold": 0,
      "parallel.zero": 1}),
    ("megatron local core x GQA x learned positions", "configs/llama3-8b.yaml",
     {"training.framework": "megatron", "megatron.transformer_impl": "local", "training.recompute": "none",
      "model.position_embedding": "learned"}),
    ("megatron local core x GLU x selective", "configs/llama3-8b.yaml",
     {"training.framework": "megatron", "megatron.transformer_impl": "local", "training.recompute": "selective"}),
)

#: stop 47: seed 202's and 101's equivalents of the stop-46 space (bench/results/mutate-equivalent.md, "Stop 47"), each a
#: term two or three settings gate together, or an option value no targeted draw reached (the Gated DeltaNet torch
#: kernel, Megatron's fine-grained activation offload: its modules need the mode with them). After MORE_PAIR_DRAWS, so
#: every earlier ``P<k>`` keeps its number
_FG = {"training.framework": "megatron", "training.activation_offload": "modules",
       "training.activation_offload_min_elements": 0}
STOP47_PAIR_DRAWS: tuple[tuple[str, str, dict], ...] = (
    ("deltanet torch kernel x hf-trainer amp", "configs/qwen3-next-80b-a3b.yaml",
     {**_HF, "parallel.ep": 1, "hf_trainer.amp": "bf16", "training.precision.activations": "bf16",
      "model.gdn_kernel": "torch"}),
    ("deltanet torch kernel x fp32", "configs/qwen3-next-80b-a3b.yaml",
     {**_HF, "parallel.ep": 1, "training.precision.activations": "fp32", "model.gdn_kernel": "torch"}),
    ("deepspeed ZeRO-0 x bf16 gradients x short sequence", "configs/llama3-8b.yaml",
     {**_DS3, "parallel.zero": 0, "parallel.distributed_optimizer": False, "training.precision.grads": "bf16",
      "model.seq_length": 128, "training.recompute": "full"}),
    ("deepspeed ZeRO-0 x fp32 gradients x short sequence", "configs/llama3-8b.yaml",
     {**_DS3, "parallel.zero": 0, "parallel.distributed_optimizer": False, "training.precision.grads": "fp32",
      "model.seq_length": 128, "training.recompute": "full"}),
    ("ZeRO-3 small tensors x plain modeling x tp 2 x qkv bias", "configs/llama3-8b.yaml",
     {**_DS3, **_TOY_WIDTH, "parallel.tp": 2, "model.qkv_bias": True}),
    ("megatron fp8 x hybrid toy (P layer)", "toy-hybrid", {"training.framework": "megatron", "megatron.fp8": "hybrid"}),
    ("megatron NAS x selective x local core x unfused rope", "configs/llama-3.3-nemotron-super-49b.yaml",
     {"training.framework": "megatron", "training.recompute": "selective", "megatron.transformer_impl": "local",
      "megatron.rope_fusion": False, "model.flash_attention": False}),
    ("torch zero-bubble-v x fewer micro-batches than stages", "configs/llama3-8b.yaml",
     {"training.framework": "torch", "parallel.pp": 4, "parallel.vpp": 2, "training.num_micro_batches": 2,
      "parallel.pp_schedule": "torch-zbv"}),
    ("torch zero-bubble-v x MoE x expert tp 2", "configs/mixtral-8x7b.yaml",
     {"training.framework": "torch", **_PP_V, "parallel.pp_schedule": "torch-zbv", "parallel.tp": 2,
      "parallel.sequence_parallel": True, "parallel.expert_tp": 2, "parallel.ep": 1}),
    ("hybrid toy x full recompute x tp 2 x device", "toy-hybrid",
     {"training.recompute": "full", "parallel.tp": 2, "parallel.sequence_parallel": True, "device.preset": "h100-sxm"}),
    ("activation offload layers x megatron x eager SwiGLU x dropout", "configs/llama3-8b.yaml",
     {"training.framework": "megatron", "parallel.pp": 1, "training.activation_offload": "layers",
      "training.activation_offload_layers": 8, "model.swiglu_impl": "eager", "model.dropout": True}),
    ("activation offload modules x attention", "configs/llama3-8b.yaml",
     {**_FG, "training.activation_offload_modules": ["attn_norm", "qkv_linear", "core_attn", "attn_proj"]}),
    ("activation offload modules x MLP norm x selective", "configs/llama3-8b.yaml",
     {**_FG, "training.recompute": "selective", "training.activation_offload_modules": ["mlp_norm", "core_attn"]}),
    ("activation offload modules x MoE", "configs/mixtral-8x7b.yaml",
     {**_FG, "training.activation_offload_modules": ["expert_fc1", "moe_act", "mlp_norm"]}),
    ("activation offload modules x MoE x eager SwiGLU x dropout", "configs/mixtral-8x7b.yaml",
     {**_FG, "training.activation_offload_modules": ["attn_norm", "qkv_linear", "expert_fc1", "moe_act"],
      "model.swiglu_impl": "eager", "model.dropout": True}),
    ("MTP x full recompute x CP 2 x device", "configs/deepseek-v2-lite.yaml",
     {"training.framework": "megatron", "model.mtp_layers": 1, "training.recompute": "full", "parallel.cp": 2,
      "parallel.tp": 1, "device.preset": "h100-sxm"}),
    # (seed 606's equivalents of the same space)
    ("qwen3-next without linear_num_value_heads", "configs/qwen3-next-80b-a3b.yaml",
     {"model.linear_num_value_heads": DROP, "model.gdn_kernel": "torch", **_HF, "parallel.ep": 1}),
    ("megatron hybrid toy x selective x unfused rope", "toy-hybrid",
     {"training.framework": "megatron", "training.recompute": "selective", "megatron.rope_fusion": False,
      "model.flash_attention": False}),
    ("megatron local core x MHA x rope x tp 2 x micro-batch 2", "configs/llama2-7b.yaml",
     {"training.framework": "megatron", "megatron.transformer_impl": "local", "training.recompute": "none",
      "parallel.tp": 2, "training.micro_batch_size": 2}),
    ("MoE layer pattern as a list", "configs/mixtral-8x7b.yaml",
     {"model.moe_layer_freq": [1, 0] * 16, "parallel.pp": 1}),
    ("NAS x full recompute x device", "configs/llama-3.3-nemotron-super-49b.yaml",
     {"training.recompute": "full", "device.preset": "h100-sxm"}),
    ("activation offload modules x unfused core x no dropout x default minimum", "configs/llama3-8b.yaml",
     {**_FG, "model.flash_attention": False, "model.dropout": False, "model.seq_length": 2048,
      "training.activation_offload_min_elements": 1048576, "training.activation_offload_modules": ["core_attn",
                                                                                                  "attn_proj"]}),
    # (seed 101's equivalents of the same space)
    ("deltanet MoE x dropout", "configs/qwen3-next-80b-a3b.yaml", {"model.dropout": True}),
    ("deepspeed ZeRO-1 offload x pp 2 x tied embeddings", "configs/llama3-8b.yaml",
     {**_DS3, "parallel.zero": 1, "parallel.dp": 2, "parallel.pp": 2, "training.num_micro_batches": 4,
      "deepspeed.offload_optimizer": "cpu", "model.tied_embeddings": True}),
    ("ZeRO-3 small tensors x tied embeddings x toy width", "configs/llama3-8b.yaml",
     {**_DS3, **_TOY_WIDTH, "parallel.tp": 2, "model.tied_embeddings": True}),
    ("hf-fsdp1", "configs/llama3-8b.yaml", {"training.framework": "hf-fsdp1", "parallel.tp": 1, "parallel.pp": 1}),
    ("hf-fsdp1 x MoE x full recompute x CPU offload", "configs/mixtral-8x7b.yaml",
     {"training.framework": "hf-fsdp1", "parallel.tp": 1, "parallel.pp": 1, "parallel.ep": 1,
      "training.recompute": "full", "training.optimizer_offload": 1}),
    ("hf-trainer amp x hybrid toy x tp 2", "toy-hybrid",
     {**_HF, "hf_trainer.amp": "bf16", "training.precision.activations": "bf16", "parallel.tp": 2,
      "parallel.sequence_parallel": True}),
    ("megatron eager SwiGLU x no recompute", "configs/llama3-8b.yaml",
     {"training.framework": "megatron", "model.swiglu_impl": "eager", "training.recompute": "none"}),
    ("mindspore x MoE x threshold 0", "configs/mixtral-8x7b.yaml",
     {"training.framework": "mindspore", "mindspore.parallel_optimizer_threshold": 0, "parallel.zero": 1}),
    ("megatron NAS x layernorm recompute", "configs/llama-3.3-nemotron-super-49b.yaml",
     {"training.framework": "megatron", "training.recompute": "selective",
      "training.recompute_modules": ["core_attn", "layernorm"]}),
    ("activation offload modules x qk norm", "configs/llama3-8b.yaml",
     {**_FG, "model.qk_norm": True, "training.activation_offload_modules": ["attn_norm", "qkv_linear", "core_attn"]}),
    ("activation offload modules x MoE x selective", "configs/mixtral-8x7b.yaml",
     {**_FG, "training.recompute": "selective", "training.activation_offload_modules": ["core_attn", "expert_fc1",
                                                                                         "moe_act"]}),
    # (compile7: torch.compile'd blocks under fsdp2 -- the MoE experts, the shared experts' silu, op SAC's topk values
    # and shared w2 output with EP, the w2 reduce-scatter output with TP + SP: terms model.compile: blocks gates)
    ("fsdp2 compiled blocks x op SAC x MLA x MoE x EP", "configs/deepseek-v2-lite.yaml",
     {"training.framework": "fsdp2", "training.recompute": "selective", "fsdp2.selective_ac": "op",
      "fsdp2.grouped_experts": True, "parallel.ep": 2, "parallel.tp": 1, "model.compile": "blocks"}),
    ("fsdp2 compiled blocks x MoE x no recompute", "configs/deepseek-v2-lite.yaml",
     {"training.framework": "fsdp2", "training.recompute": "none", "fsdp2.grouped_experts": True, "parallel.ep": 1,
      "parallel.tp": 1, "model.compile": "blocks"}),
    ("fsdp2 compiled blocks x op SAC x TP 2 x SP", "configs/llama3-8b.yaml",
     {"training.framework": "fsdp2", "training.recompute": "selective", "fsdp2.selective_ac": "op", "parallel.tp": 2,
      "parallel.sequence_parallel": True, "model.compile": "blocks"}),
)

#: stop 47: configs the loader must REFUSE, kept in the space with their error text as the baseline (``draw R<k>``):
#: a mutant that loosens a ``require`` (accepts one of them) or moves its message's values is live. Only accepted
#: configs were drawn before, so a loosened requirement was "equivalent" (seed 606's dense.mf:86:33 `t -> cp`)
REFUSAL_DRAWS: tuple[tuple[str, str, dict], ...] = (
    ("SP with tp not dividing the sequence", "configs/llama3-8b.yaml",
     {"parallel.tp": 8, "parallel.sequence_parallel": True, "model.seq_length": 3004}),
    ("vpp group below pp", "configs/llama3-8b.yaml",
     {"training.framework": "megatron", "parallel.pp": 4, "parallel.vpp": 2, "training.num_micro_batches": 16,
      "parallel.vpp_microbatch_group": 3}),
    ("vpp group leaving a short last group", "configs/llama3-8b.yaml",
     {"training.framework": "megatron", "parallel.pp": 4, "parallel.vpp": 2, "training.num_micro_batches": 14,
      "parallel.vpp_microbatch_group": 6}),
    ("MoE x tp without SP", "configs/mixtral-8x7b.yaml",
     {"parallel.tp": 2, "parallel.sequence_parallel": False}),
    ("GQA heads not divisible by tp", "configs/llama3-8b.yaml", {"parallel.tp": 16, "parallel.dp": 1}),
    ("offload_param without ZeRO-3", "configs/llama3-8b.yaml",
     {"training.framework": "deepspeed", "parallel.zero": 2, "deepspeed.offload_param": "cpu"}),
    # (stop 49) option values every config refuses, so that the space holds them (option_coverage counts a value a
    # refusal draw pins): DeepSpeed's pipeline engine runs 1f1b only (deepspeed.mf ds_pp: the one profile whose
    # option lists dualpipe), Megatron's --main-params-dtype is fp32 or fp16 (megatron-core.mf pao_master), the TE
    # op fuser's grouped expert MLP is not modelled as an offloaded module (offload-decoder.mf fg_mods)
    ("deepspeed x dualpipe", "configs/llama3-8b.yaml",
     {"training.framework": "deepspeed", "parallel.pp": 2, "parallel.vpp": 2, "training.num_micro_batches": 4,
      "parallel.pp_schedule": "dualpipe"}),
    ("megatron main params in fp8", "configs/llama3-8b.yaml",
     {"training.framework": "megatron", "megatron.main_params_dtype": "fp8"}),
    ("image tokens beyond the sequence", "toy-vision-moe", {"model.seq_length": 62}),
    ("offloaded fused grouped MLP", "configs/mixtral-8x7b.yaml",
     {"training.framework": "megatron", "training.activation_offload": "modules",
      "training.activation_offload_modules": ["fused_group_mlp"]}),
)

#: recompute x profile x schedule: each profile under selective and full recompute with a pipeline, its
#: schedules in turn (the first its loader accepts)
PAIR_RECOMPUTE_BASES = ("configs/llama3-8b.yaml", "toy-hybrid", "configs/mixtral-8x7b.yaml")


#: stop 48 (issue 35): pinned draws for the joint conditions five of stop 47's unargued equivalents needed, each
#: checked on its mutant (unmutated vs mutated ``_draw_numbers`` differ): DeepSeek-V3's MTP under mindspore
#: (mindspore/moe.mf mtp, mtp_embedding), a MoE layer's attention groups offloaded under selective recompute
#: (offload-moe.mf off_dev[selective]), torchtitan's one-round interleaved schedule with unsharded fp32
#: accumulators (fsdp2.mf titan_one_round), 8-bit AdamW's fp32 states of tensors under 4096 values at h < 4096
#: (finetune.mf small_params), DualPipeV's rank 0 where the loss chunk's backward sets the peak (torch.mf), NAS
#: linear sublayers under layernorm recompute (nas.mf), Muon's step temporaries under hf-trainer when the step sets
#: the peak (hf-trainer.mf optimizer_step), the unfused core's tensors on either side of the offload threshold
#: (offload-decoder.mf) and the local core's held QKV output with MHA (megatron-core.mf qkv_held)
STOP48_PAIR_DRAWS: tuple[tuple[str, str, dict], ...] = (
    ("mindspore x MTP", "configs/deepseek-v3.yaml", {"training.framework": "mindspore", "parallel.pp": 2,
                                                    "model.num_layers": 4}),
    ("megatron x MoE x selective x attention offload", "configs/mixtral-8x7b.yaml",
     {"training.framework": "megatron", "training.recompute": "selective", "parallel.pp": 1,
      "training.activation_offload": "modules", "training.activation_offload_modules": ["qkv_linear", "core_attn"]}),
    ("fsdp2 interleaved x one round x unsharded accumulation", "configs/llama3-8b.yaml",
     {"training.framework": "fsdp2", "parallel.tp": 1, "parallel.sequence_parallel": False, "parallel.pp": 2,
      "parallel.vpp": 2, "training.num_micro_batches": 2, "parallel.pp_schedule": "interleaved",
      "parallel.grad_accumulation_shard": False}),
    ("8-bit AdamW x h below 4096", "configs/llama3-8b.yaml",
     {"training.framework": "megatron", "parallel.pp": 1, "training.optimizer": "adamw8bit", "model.hidden_size": 1024,
      "model.num_heads": 8, "model.num_kv_heads": 8}),
    ("torch dualpipev x few layers (loss-bound rank 0)", "configs/llama3-8b.yaml",
     {"training.framework": "torch", "parallel.pp": 4, "parallel.vpp": 2, "training.num_micro_batches": 8,
      "parallel.pp_schedule": "torch-dualpipev", "model.num_layers": 8, "training.recompute": "none"}),
    ("megatron NAS x linear sublayers x layernorm recompute", "configs/llama-3.3-nemotron-super-49b.yaml",
     {"training.framework": "megatron", "training.recompute": "selective", "model.layer_attention": "L" * 80,
      "model.layer_ffn": "L" * 80, "training.recompute_modules": ["core_attn", "layernorm"]}),
    ("hf-trainer muon x foreach x short sequence (step-bound peak)", "configs/llama3-8b.yaml",
     {**_HF, "hf_trainer.optim": "muon", "hf_trainer.muon_adamw": "foreach", "model.seq_length": 16,
      "training.recompute": "full"}),
    ("core offload x unfused x many sequences", "configs/llama3-8b.yaml",
     {"training.framework": "megatron", "parallel.pp": 1, "model.flash_attention": False, "model.seq_length": 512,
      "training.micro_batch_size": 16, "training.recompute": "none", "training.activation_offload": "modules",
      "training.activation_offload_modules": ["core_attn"]}),
    ("core offload x unfused x tp 8 x short sequence", "configs/llama3-8b.yaml",
     {"training.framework": "megatron", "parallel.pp": 1, "model.flash_attention": False, "model.dropout": False,
      "model.seq_length": 256, "parallel.tp": 8, "training.recompute": "none", "training.activation_offload": "modules",
      "training.activation_offload_modules": ["core_attn"]}),
    ("megatron local core x MHA x rope x b 2", "configs/llama2-7b.yaml",
     {"training.framework": "megatron", "megatron.transformer_impl": "local", "training.micro_batch_size": 2,
      "training.recompute": "none", "model.flash_attention": False}),
)


#: stop 49 (issue 35): a vision model whose image tokens fill its sequence exactly (vision.mf's require at its
#: limit: a loosened or tightened merge^2 tells apart; the refusal draw below is one token pair short), and
#: torch's DualPipeV over DeepSeek-V3 at 8 layers under full recompute (stage 0's chunk 0 holds two of its dense first layers,
#: chunk 1 MoE layers, so which chunk's recompute term torch.mf's backward moment reads matters; the hybrid toy
#: under torch's pipelines was refused -- torch_p2p's bytes negative at stage 0 -- until frameworks/torch/mamba.mf
#: gave the hybrid layers their share of the receive buffers)
STOP49_PAIR_DRAWS: tuple[tuple[str, str, dict], ...] = (
    ("vision x image tokens filling the sequence", "toy-vision-moe", {"model.seq_length": 64}),
    ("torch dualpipev x leading dense layers x full recompute", "configs/deepseek-v3.yaml",
     {"training.framework": "torch", "parallel.pp": 2, "parallel.vpp": 2, "training.num_micro_batches": 4,
      "parallel.pp_schedule": "torch-dualpipev", "training.recompute": "full", "model.num_layers": 8}),
    # NemotronHRMSNorm's fp32 output under the transformers modeling with TP 2 + SP (hf-trainer/mamba.mf norm: the
    # sequence split of its 8h + 4 bytes per token), which no draw joined
    ("hf-trainer x nemotron-h fp32 norm output x TP 2 + SP", "configs/nemotron-h-8b.yaml",
     {**_HF, "parallel.tp": 2, "parallel.sequence_parallel": True, "parallel.dp": 1,
      "hf_trainer.modeling": "transformers", "model.norm_fp32_output": True}),
)


def pair_draws(seed: int) -> list[Draw]:
    """The option-pair draws (:data:`PAIR_DRAWS`, and recompute x profile x schedule), each pinned, repaired
    only in its unpinned keys (:func:`_repair`), ``draw P<k>``; refused ones are named on stderr."""
    from memform.errors import MemformError
    raws = dict(_bases())
    out: list[Draw] = []
    items = [(why, base, dict(over)) for why, base, over in PAIR_DRAWS]
    k = 0
    for prof in PROFILES:
        for rc in ("selective", "full"):
            base = PAIR_RECOMPUTE_BASES[k % len(PAIR_RECOMPUTE_BASES)]
            k += 1
            try:
                scheds = sorted(_program_of(raws[base], {"training.framework": prof, "parallel.pp": 2}).schedules())
            except Exception:
                scheds = []
            for j in range(len(scheds)):
                sched = scheds[(k + j) % len(scheds)]
                over = {"training.framework": prof, "training.recompute": rc, "parallel.pp": 2,
                        "training.num_micro_batches": 4, "parallel.pp_schedule": sched}
                if sched in V_SCHEDULES:
                    over["parallel.vpp"] = 2
                items.append((f"{prof} x {rc} x {sched}", base, over))
    items += [(why, base, dict(over)) for why, base, over in MORE_PAIR_DRAWS + STOP47_PAIR_DRAWS + STOP48_PAIR_DRAWS
              + STOP49_PAIR_DRAWS]
    last_group = ""
    for i, (why, base, over) in enumerate(items):
        group = why.rsplit(" x ", 1)[0] if " x selective x " in why or " x full x " in why else why
        if group == last_group:
            continue      # recompute x profile: the first schedule the loader accepts
        rng = random.Random(f"{seed}:pair:{i}")
        try:
            if not _repair(raws[base], over, rng, keep=tuple(over)):
                raise MemformError("refused")
        except Exception as exc:
            if " x selective x " not in why and " x full x " not in why:
                print(f"mutate: pair draw '{why}' ({base}) refused, left out: {str(exc)[:160]}", file=sys.stderr)
            continue
        out.append(Draw(f"P{i}", base, over))
        last_group = group
    out += [Draw(f"R{k}", base, dict(over)) for k, (_, base, over) in enumerate(REFUSAL_DRAWS)]
    return out


def draw_configs(seed: int, n: int, p_option: float = 0.35, time_model: bool = False,
                 targeted: bool = True, wide: bool = False, pairs: bool = False) -> list[Draw]:
    """``n`` valid configs drawn with ``seed``: architecture ``i % len(bases)`` (every bundled config and
    toy in turn), a framework profile, pipeline schedule, recompute mode, pipeline/virtual-pipeline sizes,
    micro-batches, parallel degrees (dp, tp, cp, ep, expert tp, ZeRO, sequence parallelism, the distributed
    optimizer) and each ``option`` of the loaded formula files with probability ``p_option``, from its
    type's values (:func:`_value_of`; the step-time model's keys only with ``time_model``). A draw the
    loader, a ``require`` or the estimate refuses is repaired (:func:`_repair`: the drawn keys the error
    names are taken back); one still refused is left out (its index is missing from the result).

    ``targeted``: then, for every value of a finite-valued option (:func:`option_coverage`) no draw has
    reached, up to :data:`TARGET_TRIES` more draws with that value forced (``draw T<k>``): bases that load its file in turn,
    under the profile that declares it; the first the loader accepts is kept."""
    from memform.errors import MemformError

    bases = _bases()
    out = []
    for i in range(n):
        name, raw = bases[i % len(bases)]
        rng = random.Random(f"{seed}:{i}")
        try:
            over = _draw_once(rng, raw, p_option, time_model)
        except MemformError:
            continue
        if wide:
            _widen(random.Random(f"{seed}:{i}:wide"), raw, over)
        attempts = _repair(raw, over, rng)
        if attempts:
            out.append(Draw(i, name, over, attempts))
    if not targeted:
        return out
    _, _, missing = option_coverage(out)
    for k, item in enumerate(missing):
        d = targeted_draw(item, k, seed, bases, p_option, time_model, wide)
        if d is not None:
            out.append(d)
    if pairs:
        out += pair_draws(seed)
    return out


def targeted_draw(item: str, k: int, seed: int, bases: list | None = None, p_option: float = 0.35,
                  time_model: bool = False, wide: bool = True) -> Draw | None:
    """The targeted draw ``T<k>`` of one option value ``item`` (``key=value``; :func:`draw_configs`), or None when
    the loader refuses each of its :data:`TARGET_TRIES` tries: bases that declare the key in turn (from the
    ``k``-th), under each profile whose program holds the declaring file in turn (:func:`_profiles_loading`; for a
    model file's option the drawn profile, then the others of :data:`PROFILES`), with the value and its
    :data:`TARGET_PINS` pinned."""
    from memform.errors import MemformError

    bases = bases or _bases()
    key, value = item.split("=", 1)
    # (stop 49) every profile whose program holds a declaring file, in turn: fsdp1.mf is loaded by the
    # fsdp1 and hf-fsdp1 profiles, neither of them in PROFILES, so no targeted draw reached its 18 values; and a
    # key two profiles declare (parallel.pp_schedule: deepspeed.mf, which refuses every schedule but 1f1b, and
    # torch.mf) is drawn under both, or zero-bubble-v was reached only when a random draw happened to bind it
    profiles = list(dict.fromkeys(p for where in _declaring(key) for p in _profiles_loading(where)))
    extra = TARGET_PINS.get(item, {})
    rng = random.Random(f"{seed}:{item}")
    tries = 0
    for t in range(len(bases) * max(1, len(profiles))):
        name, raw = bases[(k + t) % len(bases)]
        if tries == TARGET_TRIES:
            break
        try:
            over = _draw_once(rng, raw, p_option, time_model)
        except MemformError:
            continue
        if profiles:
            over["training.framework"] = profiles[t % len(profiles)]
        elif t:
            over["training.framework"] = PROFILES[t % len(PROFILES)]
        over[key] = _parse_value(value)
        pinned: tuple[str, ...] = (key,)
        if extra:
            over.update(extra)
            pinned += tuple(extra)
        if key == "parallel.pp_schedule" and value in V_SCHEDULES:
            # a V schedule needs two chunks per stage and a pipeline (its require): pinned with it, or the
            # repair takes vpp back and the value is never reached (stop 43: torch-zbv, zero-bubble-v)
            over.update({"parallel.pp": 2, "parallel.vpp": 2, "training.num_micro_batches": 4})
            pinned += ("parallel.pp", "parallel.vpp", "training.num_micro_batches")
        if not _declares(raw, over, key):
            continue
        if wide:
            _widen(random.Random(f"{seed}:{item}:{t}:wide"), raw, over, keep=pinned)
        tries += 1
        attempts = _repair(raw, over, rng, keep=pinned)
        if attempts:
            return Draw(f"T{k}", name, over, attempts)
    # (stop 49) every try refused (the drawn rest clashes with the value): the value and its pins alone, on the
    # bases in turn
    for t in range(len(bases)):
        name, raw = bases[(k + t) % len(bases)]
        for prof in profiles or [extra.get("training.framework", PROFILES[0])]:
            over = {"training.framework": prof, **extra, key: _parse_value(value)}
            if key == "parallel.pp_schedule" and value in V_SCHEDULES:
                over.update({"parallel.pp": 2, "parallel.vpp": 2, "training.num_micro_batches": 4})
            if _declares(raw, over, key) and _repair(raw, over, rng, keep=tuple(over)):
                return Draw(f"T{k}", name, over, 1)
    return None


_DECLARED: dict[str, list[str]] = {}


def _declaring(key: str) -> list[str]:
    """The formula files that declare config key ``key`` (an option's or symbol's files, in path order), []
    when none does."""
    if not _DECLARED:
        from memform.lang.parser import parse_text
        for p in sorted((ROOT / "formulas").rglob("*.mf")):
            try:
                decls = parse_text(p.read_text(encoding="utf-8"), str(p)).decls
            except Exception:
                continue
            for d in decls:
                if getattr(d, "path", None) and getattr(d, "keyword", None):
                    files = _DECLARED.setdefault(d.path, [])
                    if p.relative_to(ROOT).as_posix() not in files:
                        files.append(p.relative_to(ROOT).as_posix())
        _DECLARED.setdefault("", [])
    return _DECLARED.get(key, [])


def _profiles_loading(where: str) -> list[str]:
    """The bundled framework profiles whose program holds formula file ``where`` (repository-relative, as
    :func:`_declaring` names them): the profile itself (frameworks/NAME.mf), a profile's companions
    (frameworks/NAME/F.mf) and every profile that includes either, transitively (hf-fsdp1 includes hf-trainer.mf
    and fsdp1.mf; torch includes hf-trainer.mf); [] for a file outside frameworks/ (the base loads it)."""
    from memform.lang.ast import Include
    from memform.lang.parser import parse_file
    if not where.startswith("formulas/frameworks/"):
        return []
    fw = ROOT / "formulas" / "frameworks"
    names = sorted(p.stem for p in fw.glob("*.mf"))
    target = (ROOT / where).resolve()

    def loads(path: Path, seen: set) -> bool:
        if path == target:
            return True
        if path in seen or not path.is_file():
            return False
        seen.add(path)
        incs = [d for d in parse_file(path).decls if isinstance(d, Include)]
        return any(loads((path.parent / d.path).resolve(), seen) for d in incs)

    out = []
    for name in names:
        own = fw / name
        if (target.parent == own.resolve() or loads((fw / f"{name}.mf").resolve(), set())
                or any(loads(c.resolve(), set()) for c in sorted(own.glob("*.mf")))):
            out.append(name)
    # the profile named after the file first (fsdp1.mf: fsdp1, then hf-fsdp1)
    stem = Path(where).parent.name if Path(where).parent.name != "frameworks" else Path(where).stem
    return sorted(out, key=lambda n: n != stem)


#: (stop 49) overrides a targeted draw of one option value pins with it, where the value needs another setting to
#: be read at all or to be accepted (the repair would otherwise take the value back, or the draw never binds it):
#: ``key=value`` -> overrides
TARGET_PINS: dict[str, dict] = {
    # ZeRO's 16-bit master weights need ZeRO 1-3 and the moments in their dtype (deepspeed.mf ds_mw requires)
    "deepspeed.master_weights_and_grads=bf16": {"training.framework": "deepspeed", "parallel.zero": 2,
                                                "training.precision.optimizer": "bf16"},
    "deepspeed.master_weights_and_grads=fp16": {"training.framework": "deepspeed", "parallel.zero": 2,
                                                "training.precision.optimizer": "fp16"},
    "deepspeed.master_weights_and_grads=fp8": {"training.framework": "deepspeed", "parallel.zero": 2,
                                               "training.precision.optimizer": "fp8"},
    # the HF Trainer's AMP runs over fp32 parameters with 16-bit activations (hf-trainer.mf amp requires)
    "hf_trainer.amp=fp16": {**_HF, "training.precision.activations": "fp16"},
    "hf_trainer.ddp_gradient_as_bucket_view=true": {**_HF, "parallel.dp": 2},
    "hf_trainer.optim=lion_8bit": dict(_HF),
    # a 4-bit head needs a 4-bit base and an untied head (finetune.mf q4_head requires)
    "lora.quantize_head=true": {"training.framework": "megatron", "lora.rank": 8, "lora.base_quant": "nf4",
                                "model.tied_embeddings": False, "parallel.tp": 1, "parallel.sequence_parallel": False},
    # DualPipe's two chunks per stage, an even pipeline; torch's interleaved schedule two chunks per stage
    "parallel.pp_schedule=dualpipe": {"parallel.pp": 2, "parallel.vpp": 2, "training.num_micro_batches": 4},
    "parallel.pp_schedule=torch-interleaved": {"training.framework": "torch", "parallel.pp": 2, "parallel.vpp": 2,
                                               "training.num_micro_batches": 4},
    # the optimizers the hf-trainer and fsdp1 profiles refuse (they read their own): megatron's
    "training.optimizer=lion": {"training.framework": "megatron"},
    "training.optimizer=sgd": {"training.framework": "megatron"},
    "fsdp1.sharding_strategy=shard_grad_op": {"training.framework": "fsdp1", "parallel.tp": 1, "parallel.pp": 1,
                                              "parallel.cp": 1, "training.optimizer": "adam"},
}


def _declares(raw: dict, over: dict, key: str) -> bool:
    try:
        return any(b.path == key for b in _program_of(raw, over).bindings.values())
    except Exception:
        return False


def _parse_value(text: str):
    return {"true": True, "false": False}.get(text, text)


def _value_text(x) -> str:
    """A drawn value as :func:`option_coverage` names it (``true`` / ``false`` for a bool)."""
    return ("true" if x else "false") if isinstance(x, bool) else str(x)


def _finite_values(t) -> set[str] | None:
    """The values a finite-valued option type takes, as the coverage counts them (``None``: not finite)."""
    return ({"true", "false"} if t.kind == "bool" or t.or_bool else set(t.choices) if t.kind in ("enum", "set")
            else set(DTYPES) if t.kind == "dtype" else None)


def declared_values(time_model: bool = False) -> dict[str, set[str]]:
    """Every value of every finite-valued option (bool, enum, dtype; a set's each name) that a formula file of
    formulas/ declares, by config key -- read from the files themselves, whether or not a draw loads them
    (stop 49: the coverage counted only the options of files some draw loaded, so no draw reaching any of
    fsdp1.mf's 18 values went unreported as long as no draw loaded fsdp1.mf). The step-time model's files
    (:data:`TIME_FILES`) only with ``time_model``."""
    from memform.lang.parser import parse_file     # the installation's stored trees: no lark parse
    out: dict[str, set[str]] = {}
    for p in sorted((ROOT / "formulas").rglob("*.mf")):
        if not time_model and _matches(p, TIME_FILES):
            continue
        for d in parse_file(p).decls:
            if getattr(d, "keyword", None) != "option":
                continue
            vals = _finite_values(d.type)
            if vals:
                out.setdefault(d.path, set()).update(vals)
    return out


def option_coverage(draws: list[Draw], time_model: bool = False) -> tuple[int, int, list[str]]:
    """(values reached, values in all, the unreached ``key=value``) over every finite-valued option
    (bool, enum, dtype; a set's each name) that a formula file declares (:func:`declared_values`) or the draws
    load. A value is reached by an accepted draw that binds it, or by a refusal draw (``R<k>``,
    :data:`REFUSAL_DRAWS`) that pins it: a value every config refuses (a ``require``) is in the space as the
    refusal, and a mutant that loosens that require is live."""
    from memform.engine.config import get_path
    raws = dict(_bases())
    seen: dict[str, set] = {}
    values: dict[str, set] = {k: set(v) for k, v in declared_values(time_model).items()}
    for d in draws:
        if str(d.index).startswith("R"):
            for k, v in d.overrides.items():
                if k in values:
                    for x in (v if isinstance(v, (list, tuple)) else [v]):
                        seen.setdefault(k, set()).add(_value_text(x))
            continue
        from memform.engine.model import load_model
        try:
            m = load_model(*_split(raws[d.base], d.overrides), numeric=True)
        except Exception:
            continue
        for name, b in m.program.bindings.items():
            if b.keyword != "option":
                continue
            t = b.type
            allv = _finite_values(t)
            if not allv:
                continue
            values.setdefault(b.path, set()).update(allv)
            v = m.bound.value_of(name)
            vs = list(v) if isinstance(v, (list, tuple)) else [v]
            if t.kind == "bool" or (t.or_bool and v in (True, False)):
                vs = ["true" if v else "false"]
            elif t.kind == "dtype":
                vs = [str(get_path(m.data, b.path, None) or "")]
            seen.setdefault(b.path, set()).update(str(x) for x in vs)
    total = sum(len(v) for v in values.values())
    missing = sorted(f"{k}={v}" for k, vs in values.items() for v in vs if v not in seen.get(k, set()))
    return total - len(missing), total, missing


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

        # tests/estimate_helpers.py keeps one estimate per bundled config for a process (the every-config loops
        # share it): made under another mutant (or none) it would hide this one
        helpers = sys.modules.get("estimate_helpers")
        if helpers is not None and hasattr(helpers, "bundled"):
            helpers.bundled.cache_clear()
        reports = runtestprotocol(item, nextitem=None, log=False)
        return all(not r.failed for r in reports) and any(r.when == "call" and r.passed for r in reports)

    def pytest_runtestloop(self, session):
        install_reader()
        _patch_measurements()
        _patch_spawn()
        if self.mode == "baseline":
            _BLOCK_SPAWN[0] = bool(self.spec.get("no_subprocess"))
            try:
                self._baseline(session.items)
            finally:
                _BLOCK_SPAWN[0] = False
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
                if _SPAWNED[0] and _BLOCK_SPAWN[0]:      # first: the blocked subprocess may have failed it
                    why = "runs a subprocess (would read the files on disk)"
                elif _SPAWNED[0] and ok:
                    # its subprocess may read any formula file (of the tree MEMFORM_FORMULAS_DIR names)
                    reads |= {str(p.resolve()) for p in (ROOT / "formulas").rglob("*.mf")}
                if why:
                    pass
                elif not ok:
                    why = "fails or skips unmutated"
                elif not reads:
                    why = "reads no formula file"
                elif took > self.spec["max_test_s"]:
                    why = f"slower than {self.spec['max_test_s']:g} s"
            self.results.append({"nodeid": item.nodeid, "excluded": why, "reads": sorted(reads),
                                 "seconds": round(took, 4), "spawns": bool(_SPAWNED[0])})

    def _mutants(self, items) -> None:
        reads = {n: set(r) for n, r in self.spec["reads"].items()}
        # cheapest first; then, per formula file, the test that killed the last mutant of that file moves
        # to the front of the file's order (a file's mutants mostly fall to the same few tests); a file
        # seen first starts from the order of every kill so far (``good``)
        good = sorted(items, key=lambda it: self.spec["seconds"].get(it.nodeid, 0.0))
        per_file: dict[str, list] = {}
        progress = self.spec.get("progress")
        tree = _mutable_tree()
        for i, m in enumerate(self.spec_mutants()):
            key = str((ROOT / m.file).resolve())
            serve(m)
            tree.write(m)
            killer, why, ran = None, "", 0
            start = time.perf_counter()
            signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_REAL, self.spec["per_mutant_s"])
            order = per_file.setdefault(key, [it for it in good if key in reads.get(it.nodeid, ())])
            try:
                for item in order:
                    ran += 1
                    if not self._run(item):
                        killer = item
                        break
            except _Timeout:
                why = "timeout"
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                serve(None)
                tree.write(None)
            if _TIMED_OUT[0]:     # the alarm may have fired inside a test, which pytest reports as failed
                killer, why = None, "timeout"
                _TIMED_OUT[0] = False
            if killer is not None:
                for lst in (good, order):
                    lst.remove(killer)
                    lst.insert(0, killer)
            self.results.append({"label": m.label(), "killed": killer is not None,
                                 "by": killer.nodeid if killer else why, "tests": ran,
                                 "seconds": round(time.perf_counter() - start, 3)})
            if progress and (i + 1) % progress == 0:
                done = sum(r["killed"] for r in self.results)
                print(f"  worker {self.spec['share'][0]}: {i + 1} of {len(self.spec['mutants'])} mutants, "
                      f"{done} killed", file=sys.__stderr__, flush=True)

    def spec_mutants(self) -> list[Mutant]:
        return [Mutant(**m) for m in self.spec["mutants"]]


class _Tree:
    """A copy of formulas/ that the subprocesses of the tests read (memform.resources.FORMULAS_ENV):
    :meth:`write` puts a mutant's text in place of its file, or (None) the original back."""

    def __init__(self, root: Path):
        self.root = root
        self.last: str | None = None

    def write(self, m: Mutant | None) -> None:
        if self.last is not None:
            rel = Path(self.last).relative_to("formulas")
            (self.root / rel).write_text((ROOT / self.last).read_text(encoding="utf-8"), encoding="utf-8")
            self.last = None
        if m is not None:
            (self.root / Path(m.file).relative_to("formulas")).write_text(m.text, encoding="utf-8")
            self.last = m.file


def _mutable_tree() -> _Tree:
    """This worker's copy of formulas/, named to its subprocesses through memform's formula-directory
    variable (its own formula reader keeps the checkout's: the directory is looked up once per process,
    here before the variable is set; served mutants reach it through :func:`serve`)."""
    import atexit
    import shutil

    from memform.resources import FORMULAS_ENV, formulas_dir

    formulas_dir()
    tmp = Path(tempfile.mkdtemp(prefix="memform-mutate-tree-"))
    atexit.register(shutil.rmtree, tmp, True)
    shutil.copytree(ROOT / "formulas", tmp / "formulas")
    os.environ[FORMULAS_ENV] = str(tmp / "formulas")
    return _Tree(tmp / "formulas")


class _Timeout(Exception):
    pass


_TIMED_OUT = [False]


def _alarm(signum, frame):
    _TIMED_OUT[0] = True
    raise _Timeout()


#: environment variable naming the directory where a run's workers share their PyTorch measurements
MEASURE_DIR = "MEMFORM_MUTATE_MEASUREMENTS"


def _patch_measurements() -> None:
    """PyTorch measurements depend only on the case, never on the formula files: measure each once per
    run -- in this process's memory and, when :data:`MEASURE_DIR` is set (by :func:`main`: a temporary
    directory removed at the end of the run), in files every worker of the run reads, so that the
    mutant phase's workers reuse what the baseline's measured."""
    try:
        import hashlib
        import pickle

        import memform.validation.compare as compare
        import memform.validation.measure as measure
    except ImportError:
        return
    original = measure.measure_step
    if getattr(compare.measure_step, "_mutate", False):
        return
    cache: dict[str, object] = {}
    shared = os.environ.get(MEASURE_DIR)

    def measure_step(cfg, precision="bf16-mixed", *args, **kwargs):
        key = json.dumps([cfg, precision, args, kwargs], sort_keys=True, default=str)
        if key in cache:
            return cache[key]
        path = Path(shared) / (hashlib.sha256(key.encode()).hexdigest() + ".pickle") if shared else None
        if path is not None and path.exists():
            cache[key] = pickle.loads(path.read_bytes())
        else:
            cache[key] = original(cfg, precision, *args, **kwargs)
            if path is not None:
                part = path.with_suffix(f".{os.getpid()}.part")
                part.write_bytes(pickle.dumps(cache[key]))
                os.replace(part, path)
        return cache[key]

    measure_step._mutate = True
    # compare.py and the tests that import it directly (``from ...measure import measure_step``)
    _replace_everywhere(original, measure_step)
    for mod in list(sys.modules.values()):
        if mod is not None and getattr(mod, "measure_step", None) is original:
            mod.measure_step = measure_step


def _patch_spawn() -> None:
    original = subprocess.Popen.__init__
    if getattr(original, "_mutate", False):
        return

    def init(self, *args, **kwargs):
        _SPAWNED[0] += 1
        if _BLOCK_SPAWN[0]:
            raise RuntimeError("bench/mutate.py: this test starts a subprocess, which would read the formula "
                               "files on disk; it is left out")
        return original(self, *args, **kwargs)

    init._mutate = True
    subprocess.Popen.__init__ = init


def worker(spec_path: str, out_path: str) -> int:
    import pytest

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    oracle = Oracle(spec)
    os.chdir(ROOT)
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        # one process, the oracle in it: the README's addopts (-n auto, pytest-xdist) are dropped
        pytest.main(["-q", "-o", "addopts=", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:xdist",
                     "-m", "not slow",
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


def select_tests(tests: list[str], jobs: int, max_test_s: float, no_subprocess: bool = False) -> list[dict]:
    """The baseline: every collected test once, unmutated, shared out over ``jobs`` workers (``no_subprocess``:
    a test that starts a subprocess is stopped there and left out, as before issue 35)."""
    base = {"mode": "baseline", "tests": tests, "max_test_s": max_test_s, "no_subprocess": no_subprocess}
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
                         f"default: {' '.join(DEFAULT_TESTS)}; with --time also {' '.join(TIME_TESTS)}")
    ap.add_argument("--max-test-seconds", type=float, default=10.0,
                    help="leave out tests slower than this unmutated (default 10; a first PyTorch "
                         "measurement is slow once, then cached)")
    ap.add_argument("--exclude", action="append", metavar="GLOB",
                    help="leave out these formula files (globs as for --files; repeatable; default: "
                         f"{' '.join(TIME_FILES)}, the step-time model)")
    ap.add_argument("--time", action="store_true",
                    help="also mutate the step-time model: its files, and count a mutant that changes only "
                         "step-time numbers as live (by default both are skipped and counted apart)")
    ap.add_argument("--draws", type=int, default=DEFAULT_DRAWS, metavar="N",
                    help=f"configs drawn for the equivalence check (with --draw-seed; default {DEFAULT_DRAWS}, and the targeted draws)")
    ap.add_argument("--draw-seed", type=int, default=DRAW_SEED, metavar="N",
                    help=f"seed of the drawn configs (default {DRAW_SEED}, fixed; --seed picks the sample)")
    ap.add_argument("--space", choices=("draws", "narrow", "variants"), default="draws",
                    help="the equivalence space: drawn configs, widened (default: device presets, sequence "
                         "lengths, widths, layer counts, dropped keys), 'narrow' the same without the widening "
                         "(stop 43's space), or the bundled configs and override variants the tool used before "
                         "issue 35 (for comparison)")
    ap.add_argument("--no-pairs", action="store_true",
                    help="leave the option-pair draws (PAIR_DRAWS: terms two or three option values gate together; "
                         "recompute x profile x schedule) out of the drawn space: the space of stop 44")
    ap.add_argument("--no-subprocess", action="store_true",
                    help="leave out the tests that start a subprocess (the tool before issue 35)")
    ap.add_argument("--classify-only", action="store_true",
                    help="classify the sample (invalid / equivalent / step-time / live, and the draw that told "
                         "each live one apart) and stop: no tests")
    ap.add_argument("--only", action="append", metavar="WHERE",
                    help="run only the mutants at FILE:LINE:COL (or whose label starts with the text given, e.g. "
                         "'formulas/torch.mf:77:20  number: 1 -> 0'); repeatable; '@PATH' reads one per line "
                         "(a previous run's survivors, re-checked after new tests); applied after --limit/--seed")
    ap.add_argument("--coverage", metavar="PATH", nargs="?", const=str(COVERAGE_FILE.relative_to(ROOT)),
                    help="draw the equivalence space only, print which values of the finite-valued options it reaches "
                         "and which not, write them to PATH (default: %(const)s, which tests/test_mutate.py reads) and "
                         "stop; exit status 1 if a value is unreached")
    ap.add_argument("--list", action="store_true", help="print the mutants and stop")
    ap.add_argument("--json", metavar="PATH", help="also write every mutant's outcome as JSON")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(*args.worker)
    start = time.perf_counter()
    if args.coverage:
        return write_coverage(Path(args.coverage), args.draw_seed, args.draws, args.time, args.space,
                              not args.no_pairs)
    exclude = list(args.exclude or ()) + ([] if args.time else list(TIME_FILES))
    files = formula_files(args.files, exclude)
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
    if args.only:
        wanted = _only(args.only)
        mutants = [m for m in mutants if any(m.where == w or m.label().startswith(w) for w in wanted)]
        sampled += f"; --only: {len(mutants)} of them"
        print(f"--only: {len(mutants)} mutants match", flush=True)
        if not mutants:
            print("mutate: --only matches no mutant", file=sys.stderr)
            return 2
    set_space(args.space, args.draw_seed, args.draws, args.time, pairs=not args.no_pairs)
    base = _baseline()
    if args.space in ("draws", "narrow"):
        reached, values, missing = option_coverage(list(_DRAWN), args.time)
        print(f"equivalence space: {len(base)} valid configs: {sum(isinstance(d.index, int) for d in _DRAWN)} of "
              f"{args.draws} draws (--draw-seed {args.draw_seed} --draws {args.draws}) and "
              f"{sum(not isinstance(d.index, int) and not str(d.index).startswith('P') for d in _DRAWN)} targeted "
              f"and {sum(str(d.index).startswith('P') for d in _DRAWN)} option-pair draws; they reach {reached} of {values} values of the finite-valued options "
              f"(unreached: {' '.join(missing) or 'none'}); {time.perf_counter() - start:.0f} s so far", flush=True)
    print(f"{len(mutants)} mutants of {len(files)} formula files; classifying against "
          f"{len(base)} configs ...", flush=True)
    classes = _classify_all(mutants, args.jobs, args.time)
    invalid = [(m, why) for m, (c, why) in zip(mutants, classes) if c == "invalid"]
    equivalent = [m for m, (c, _) in zip(mutants, classes) if c == "equivalent"]
    timed = [m for m, (c, _) in zip(mutants, classes) if c == "time"]
    live = [m for m, (c, _) in zip(mutants, classes) if c == "live"]
    told = {m.label(): why for m, (c, why) in zip(mutants, classes) if c == "live"}
    print(f"{len(invalid)} invalid (rejected by the loader/checker), {len(equivalent)} equivalent "
          f"(no estimate number changes on any config), "
          + (f"{len(timed)} step-time only (skipped: --time), " if timed else "")
          + f"{len(live)} to test; {time.perf_counter() - start:.0f} s so far", flush=True)
    if args.classify_only:
        for m, (c, why) in zip(mutants, classes):
            print(f"  {c:<10} {m.label()}" + (f"\n      {why}" if why else ""))
        valid = len(mutants) - len(invalid)
        print(f"equivalent {len(equivalent)} of the {valid} valid mutants "
              f"({100 * len(equivalent) / valid if valid else 0:.1f} %); step-time only {len(timed)}; live {len(live)}; "
              f"{time.perf_counter() - start:.0f} s" + (f"; {sampled}" if sampled else ""))
        if args.json:
            Path(args.json).write_text(json.dumps({"sampled": sampled, "classes": [[m.label(), c, why] for m, (c, why)
                                                                                   in zip(mutants, classes)]}, indent=1))
        return 0
    tests = expand_tests(args.tests or list(DEFAULT_TESTS) + (list(TIME_TESTS) if args.time else []))
    # the run's workers share their PyTorch measurements (see _patch_measurements)
    measured = tempfile.TemporaryDirectory(prefix="memform-mutate-measured-")
    os.environ.setdefault(MEASURE_DIR, measured.name)
    baseline = select_tests(tests, args.jobs, args.max_test_seconds, args.no_subprocess) if live else []
    excluded: dict[str, int] = {}
    for r in baseline:
        if r["excluded"]:
            excluded[r["excluded"]] = excluded.get(r["excluded"], 0) + 1
    print(f"tests: {sum(not r['excluded'] for r in baseline)} of {len(baseline)} selected "
          f"({sum(not r['excluded'] and r.get('spawns', False) for r in baseline)} of them start a subprocess) from "
          f"{' '.join(tests)}" + ("; left out: " + ", ".join(f"{n} {why}" for why, n in sorted(excluded.items()))
                                   if excluded else "") + f"; {time.perf_counter() - start:.0f} s so far", flush=True)
    results = run_oracle(live, tests, baseline, args.jobs)
    measured.cleanup()
    print("\nequivalent mutants (not counted):")
    for m in equivalent:
        print(f"  {m.label()}")
    if timed:
        print("\nstep-time mutants (only the step-time model's numbers change; skipped, not counted: --time):")
        for m in timed:
            print(f"  {m.label()}")
    print("\nsurviving mutants:")
    survivors = [r for r in results if not r["killed"]]
    for r in survivors:
        print(f"  {r['label']}" + ("   (timed out: not decided, counted as surviving)" if r["by"] == "timeout" else ""))
        print(f"      told apart by {told.get(r['label'], '?')}")
    killed = sum(r["killed"] for r in results)
    n = len(results)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "sampled": sampled, "total": total, "invalid": [[m.label(), w] for m, w in invalid],
            "equivalent": [m.label() for m in equivalent], "time": [m.label() for m in timed],
            "told_apart_by": told, "results": results}, indent=1), encoding="utf-8")
    print(f"\n{len(invalid)} invalid, {len(equivalent)} equivalent"
          + (f", {len(timed)} step-time only" if timed else "") + f"; {time.perf_counter() - start:.0f} s"
          + (f"; {sampled}" if sampled else ""))
    valid = len(mutants) - len(invalid)
    print(f"killed {killed} of {n} ({100 * killed / n if n else 100:.1f} %); equivalent {len(equivalent)} of the "
          f"{valid} valid mutants ({100 * len(equivalent) / valid if valid else 0:.1f} %)"
          + (f", step-time only {len(timed)}" if timed else ""))
    return 0


#: the recorded coverage of the default drawn space (``--coverage``): tests/test_mutate.py holds every option value
#: the formula files declare today to it
COVERAGE_FILE = ROOT / "bench" / "results" / "mutate-coverage.json"


def write_coverage(path: Path, seed: int, n: int, time_model: bool, space: str, pairs: bool) -> int:
    """``--coverage``: draw the space (:func:`draw_configs`), print and record (``path``, JSON) the values of the
    finite-valued options it reaches, by key, and the unreached ones; 1 when a value is unreached."""
    if space == "variants":
        print("mutate: --coverage needs a drawn space (--space draws or narrow)", file=sys.stderr)
        return 2
    start = time.perf_counter()
    install_reader()
    serve(None)
    drawn = draw_configs(seed, n, time_model=time_model, wide=space == "draws", pairs=pairs)
    reached, values, missing = option_coverage(drawn, time_model)
    declared = declared_values(time_model)
    by_key = {k: sorted(v - {m.split("=", 1)[1] for m in missing if m.split("=", 1)[0] == k})
              for k, v in sorted(declared.items())}
    kinds = {"random": sum(isinstance(d.index, int) for d in drawn),
             "targeted": sum(str(d.index).startswith("T") for d in drawn),
             "pair": sum(str(d.index).startswith("P") for d in drawn),
             "refusal": sum(str(d.index).startswith("R") for d in drawn)}
    print(f"drawn space (--draw-seed {seed} --draws {n}, --space {space}{'' if pairs else ' --no-pairs'}): "
          f"{len(drawn)} configs ({', '.join(f'{v} {k}' for k, v in kinds.items())}); they reach {reached} of "
          f"{values} values of the finite-valued options; unreached: {' '.join(missing) or 'none'}; "
          f"{time.perf_counter() - start:.0f} s")
    path.write_text(json.dumps({
        "command": f"python bench/mutate.py --coverage --draw-seed {seed} --draws {n} --space {space}"
                   + ("" if pairs else " --no-pairs") + (" --time" if time_model else ""),
        "configs": kinds, "reached": reached, "values": values, "unreached": missing,
        "reached_by_key": by_key}, indent=1) + "\n", encoding="utf-8")
    return 1 if missing else 0


def _only(items: list[str]) -> list[str]:
    """The ``--only`` selectors: each item, or with ``@PATH`` the file's non-empty lines (a leading
    ``survived``/``equivalent``... class word of ``--classify-only`` output is dropped)."""
    out = []
    for item in items:
        lines = Path(item[1:]).read_text(encoding="utf-8").splitlines() if item.startswith("@") else [item]
        for line in lines:
            line = line.strip()
            if line.split(" ", 1)[0] in ("invalid", "equivalent", "time", "live", "survived", "killed"):
                line = line.split(" ", 1)[1].strip()
            if line:
                out.append(line)
    return out


def _classify_all(mutants: list[Mutant], jobs: int, time_model: bool = False) -> list[tuple[str, str]]:
    if jobs <= 1 or len(mutants) < 8:
        return [classify(m, time_model) for m in mutants]
    import multiprocessing

    _baseline()   # once, before forking: every worker inherits it
    ctx = multiprocessing.get_context("fork")
    chunks = [mutants[i::jobs] for i in range(jobs)]
    with ctx.Pool(jobs) as pool:
        parts = pool.starmap(_classify_batch, [(c, time_model) for c in chunks])
    out: list[tuple[str, str] | None] = [None] * len(mutants)
    for i, part in enumerate(parts):
        for j, res in enumerate(part):
            out[i + j * jobs] = res
    return out  # type: ignore[return-value]


if __name__ == "__main__":
    sys.exit(main())
