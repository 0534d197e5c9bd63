"""The loaded formula program: every declaration visible, the last definition of each name winning.

A name defined again in a *later file* overrides the earlier definition -- that is how a
config adds an architecture-specific file that changes one quantity. Defining a name twice
in the *same* file is a mistake and is reported. Reading files is :mod:`memform.lang.loader`'s
job; this module only holds the data and the rules of adding to it, so that the checker can
use it without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Mapping

from ..errors import Loc, MemformError, did_you_mean
from . import ast

RECOMPUTE_MODES = ("none", "selective", "full")
#: in a block quantity, the definition it replaces (see :func:`with_super`): a later file -- a
#: framework profile, loaded after the architecture files a config names -- adds to a quantity
#: whatever file defined it, instead of redefining it over a user's own block
SUPER = "super"
BUILTIN_FUNCS = {"ceil": 1, "floor": 1, "min": None, "max": None, "log2": 1, "abs": 1,
                 "layers_sum": 1, "layers_max": 1, "layers_last": 1, "layers_after": 1,
                 "is_list": 1, "len": 1, "at": 2, "has": 2, "tensors": None, "slots": None}
#: functions on the list values of ``int | list`` options: whether a value is a list, its length,
#: and its element at a 0-based index; and whether a ``set`` or ``list`` option holds a name: has(x, "name")
LIST_FUNCS = ("is_list", "len", "at", "has")
#: ``tensors(x1, x2, ...)``: a list value of numbers (two or more), e.g. the sizes of a layer's tensors that the
#: allocator replay's granularity quantities give (formulas/common.mf layer); at() and len() read it
TENSORS = "tensors"
#: ``slots(list, "name", ...)``: the positions (0-based) of a ``tensors(...)`` list's named entries (``"end"``: the
#: position after its last entry), a list of numbers -- ``fwd_slot`` / ``fwd_until`` of formulas/common.mf layer
SLOTS = "slots"
#: the name :data:`SLOTS` reads as the position after a list's last entry (no entry may take it)
END = "end"
#: the schedule name a ``let`` or ``def`` may read: its value is the stage of the block that uses it
#: (:meth:`Program.stage_readers`)
STAGE = "stage"
#: reductions over the layers of the stage being evaluated (schedule blocks only): the argument
#: is evaluated once per layer group, in that layer's block with its recompute mode and chunk
AGGREGATES = ("layers_sum", "layers_max", "layers_last")
#: inside a reduction's argument: ``x`` summed over the stage's layers after the group being visited
#: (forward order; the stage's last group counts itself once) -- what a layer's backward no longer
#: holds of the same micro-batch, the later layers' backward having freed it
AFTER = "layers_after"
SCHEDULE_NAMES = ("stage", "chunk")  # bound by the interpreter inside schedule blocks
#: bound while a stack entry's ``if`` choice is evaluated: the layer's 0-based index among the body
#: layers (among the entry's own layers for a ``first``/``last`` entry)
STACK_NAMES = ("layer_index",)
LAYER_NAMES = ("mode",)  # bound inside an aggregate's argument: the layer's recompute mode
#: quantities every layer block in the stack must define (possibly by inheritance)
LAYER_QUANTITIES = ("params", "param_bytes", "grad_bytes", "optimizer_bytes", "act", "comm")
SCHEDULE_QUANTITIES = ("inflight",)
#: bound by the interpreter inside runtime blocks: the stage, and its model bytes (static + dynamic)
RUNTIME_NAMES = ("stage", "model_bytes")
RUNTIME_QUANTITIES = ("bytes",)
#: bound by the interpreter inside cost blocks: the stage, and the schedule's ``bubble`` (idle
#: micro-batch slots of a stage per step) and ``overlap`` (the fraction of compute under which the
#: schedule runs other micro-batches' expert and pipeline transfers)
COST_NAMES = ("stage", "bubble", "overlap", "runs", "idle", "p2p_async")
COST_QUANTITIES = ("seconds",)
#: optional cost-block quantities: the seconds the stage's model FLOPs would take at peak (MFU),
#: and the tokens the whole job trains on per step (tokens/s)
COST_OPTIONAL = ("ideal_seconds", "tokens")
#: the schedule quantities bound by the same names in cost blocks
SCHEDULE_TIME_QUANTITIES = ("bubble", "overlap")
#: ... and those a schedule may leave out, with their value then: ``runs``, the share of the step's m
#: micro-batches each of a stage's chunks runs (1; DualPipe's two directions take half each), and
#: ``idle``, the share of the compute stream's span it leaves without a kernel (0; DualPipe's overlapped
#: chunk pairs wait on their all-to-alls), and ``p2p_async``, the chunk passes per direction whose pipeline
#: transfers run asynchronously beside compute (0; Megatron's overlapped interleaving: its steady state)
SCHEDULE_TIME_OPTIONAL = (("runs", 1), ("idle", 0), ("p2p_async", 0))
#: optional layer quantity: bytes of the layer held in host (CPU) memory, e.g. offloaded states
HOST_QUANTITY = "host_bytes"
#: optional layer quantity: bytes of one micro-batch's stored activations the layer holds in host memory
#: (activation offloading), counted once per micro-batch in flight, as its ``act``
HOST_ACT_QUANTITY = "act_host"


@dataclass
class QuantityDef:
    """All definitions of one quantity in one block: a default and/or per-variant formulas."""

    name: str
    default: ast.Quantity | None = None
    variants: dict[str, ast.Quantity] = field(default_factory=dict)
    moment: bool = False  # a schedule's candidate peak moment

    def pick(self, mode: str | None) -> ast.Quantity | None:
        if mode is not None and mode in self.variants:
            return self.variants[mode]
        return self.default

    def all(self) -> Iterator[ast.Quantity]:
        if self.default is not None:
            yield self.default
        yield from self.variants.values()


@dataclass
class BlockDef:
    kind: str  # block | comm | schedule | runtime | cost
    name: str
    base: str | None
    loc: Loc
    quantities: dict[str, QuantityDef] = field(default_factory=dict)
    base_loc: Loc | None = None  # the declaration that last set `base` (an override may change it)


@dataclass
class Program:
    """Every declaration visible after loading, with the last definition of each name winning."""

    files: list[str] = field(default_factory=list)
    #: the same files, resolved (absolute), in load order (what the fast path's cache checks)
    paths: list[str] = field(default_factory=list)
    bindings: dict[str, ast.Binding] = field(default_factory=dict)
    lets: dict[str, ast.Let] = field(default_factory=dict)
    defs: dict[str, ast.Def] = field(default_factory=dict)
    requires: list[ast.Require] = field(default_factory=list)
    blocks: dict[str, BlockDef] = field(default_factory=dict)
    stack: ast.Stack | None = None
    #: every ``include ... when KEY`` met while loading, with whether the config set one of its keys
    conditions: list[tuple[ast.Include, bool]] = field(default_factory=list)
    _origin: dict[tuple[str, str], str] = field(default_factory=dict)  # (namespace, name) -> file
    _stage_readers: tuple[frozenset[str], frozenset[str]] | None = field(default=None, repr=False, compare=False)
    _costs_read_position: bool | None = field(default=None, repr=False, compare=False)

    # ---------------------------------------------------------------- lookups
    def chain(self, block: str) -> list[BlockDef]:
        """The block followed by its bases (nearest first)."""
        out: list[BlockDef] = []
        seen: set[str] = set()
        name: str | None = block
        while name is not None:
            if name in seen:
                cycle = " extends ".join([b.name for b in out] + [name])
                # point at the newest 'extends' in the cycle: an override file's, when one closed it
                closing = max((b.base_loc or b.loc for b in out), key=lambda loc: self.files.index(loc.file)
                              if loc.file in self.files else len(self.files))
                raise MemformError(f"cyclic 'extends': {cycle}", closing)
            seen.add(name)
            b = self.blocks.get(name)
            if b is None:
                child = out[-1] if out else None
                raise MemformError(f"block '{child.name if child else block}' extends unknown block "
                                   f"'{name}'{did_you_mean(name, self.blocks)}", child.loc if child else None)
            out.append(b)
            name = b.base
        return out

    def find_quantity(self, block: str, qname: str) -> QuantityDef | None:
        for b in self.chain(block):
            if qname in b.quantities:
                return b.quantities[qname]
        return None

    def quantity_names(self, block: str) -> set[str]:
        return {q for b in self.chain(block) for q in b.quantities}

    def pick(self, block: str, qname: str, mode: str | None) -> ast.Quantity | None:
        """The formula that defines ``block.qname`` for recompute ``mode`` (inheritance applied)."""
        for b in self.chain(block):
            qd = b.quantities.get(qname)
            if qd is not None:
                return qd.pick(mode)
        return None

    def moments(self, block: str) -> list[str]:
        """The schedule's ``moment`` quantities, bases' first, in declaration order."""
        names: dict[str, None] = {}
        for b in reversed(self.chain(block)):
            for qname, qd in b.quantities.items():
                if qd.moment:
                    names[qname] = None
        return list(names)

    def has_variants(self, block: str, qname: str) -> bool:
        qd = self.find_quantity(block, qname)
        return bool(qd and qd.variants)

    def stage_readers(self) -> tuple[frozenset[str], frozenset[str]]:
        """The lets and the defs that read ``stage``, directly or through other lets and defs: their value is
        that of the stage where a schedule, runtime or cost block uses them (and an error elsewhere)."""
        if self._stage_readers is None:
            lets: set[str] = set()
            defs: set[str] = set()

            def reads(expr: ast.Expr, params: tuple[str, ...]) -> bool:
                for n in ast.walk(expr):
                    if isinstance(n, ast.Ref) and n.attr is None and n.name not in params and (
                            n.name == STAGE or n.name in lets):
                        return True
                    if isinstance(n, ast.Call) and n.func in defs:
                        return True
                return False

            changed = True
            while changed:
                changed = False
                for name, let in self.lets.items():
                    if name not in lets and reads(let.expr, ()):
                        lets.add(name)
                        changed = True
                for name, d in self.defs.items():
                    if name not in defs and reads(d.expr, d.params):
                        defs.add(name)
                        changed = True
            self._stage_readers = (frozenset(lets), frozenset(defs))
        return self._stage_readers

    def same_conditions(self, config: Mapping[str, Any]) -> bool:
        """Whether ``config`` answers every ``include ... when`` met while loading as the config the program was
        loaded for did (else loading for it gives another program)."""
        return all(any(key_is_set(config, k) for k in decl.keys) == answer for decl, answer in self.conditions)

    def global_names(self) -> set[str]:
        return set(self.bindings) | set(self.lets)

    def schedules(self) -> dict[str, BlockDef]:
        return {n: b for n, b in self.blocks.items() if b.kind == "schedule"}

    def comms(self) -> dict[str, BlockDef]:
        return {n: b for n, b in self.blocks.items() if b.kind == "comm"}

    def runtimes(self) -> dict[str, BlockDef]:
        """Runtime blocks, in declaration order: their ``bytes`` make up the ``runtime`` category."""
        return {n: b for n, b in self.blocks.items() if b.kind == "runtime"}

    def costs_read_position(self) -> bool:
        """Whether a cost block names ``stage`` or ``chunk`` (not only through ``layers_*``, ``bubble`` and
        ``overlap``), itself or through a ``let`` or function that reads ``stage`` at any depth
        (:meth:`stage_readers`; megatron-core.mf's ``opt_flat_bucket`` is one): then the interpreter evaluates
        every stage's costs on their own, where alike stages would otherwise share one value. Answered once
        per program (an interpreter is made per estimate)."""
        if self._costs_read_position is None:
            lets, defs = self.stage_readers()
            # a function may read ``chunk`` in its body too (bound where a schedule or cost block calls it)
            defs = defs | {name for name, d in self.defs.items() if "chunk" not in d.params and any(
                isinstance(n, ast.Ref) and n.attr is None and n.name == "chunk" for n in ast.walk(d.expr))}
            exprs = [q.expr for b in self.costs().values() for qd in b.quantities.values() for q in qd.all()]
            self._costs_read_position = any(
                (isinstance(n, ast.Ref) and n.attr is None and (n.name in SCHEDULE_NAMES or n.name in lets))
                or (isinstance(n, ast.Call) and n.func in defs) for e in exprs for n in ast.walk(e))
        return self._costs_read_position

    def costs(self) -> dict[str, BlockDef]:
        """Cost blocks, in declaration order: their ``seconds`` make up each stage's step time."""
        return {n: b for n, b in self.blocks.items() if b.kind == "cost"}

    # ---------------------------------------------------------------- building
    def _claim(self, namespace: str, name: str, loc: Loc, previous: Loc | None) -> None:
        origin = self._origin.get((namespace, name))
        if origin == loc.file and previous is not None:
            raise MemformError(f"'{name}' is defined twice in this file (first at {previous})", loc)
        self._origin[(namespace, name)] = loc.file

    def add(self, decl: ast.Decl) -> None:
        self._stage_readers = None
        self._costs_read_position = None
        if isinstance(decl, (ast.Binding, ast.Let)):
            prev = self.bindings.get(decl.name) or self.lets.get(decl.name)
            self._claim("global", decl.name, decl.loc, prev.loc if prev else None)
            self.bindings.pop(decl.name, None)
            self.lets.pop(decl.name, None)
            if isinstance(decl, ast.Binding):
                self.bindings[decl.name] = decl
            else:
                self.lets[decl.name] = decl
        elif isinstance(decl, ast.Def):
            prev = self.defs.get(decl.name)
            self._claim("def", decl.name, decl.loc, prev.loc if prev else None)
            if decl.name in BUILTIN_FUNCS:
                raise MemformError(f"'{decl.name}' is a built-in function and cannot be redefined", decl.loc)
            self.defs[decl.name] = decl
        elif isinstance(decl, ast.Require):
            self.requires.append(decl)
        elif isinstance(decl, ast.Block):
            self._add_block(decl)
        elif isinstance(decl, ast.Stack):
            prev = self.stack
            self._claim("stack", "stack", decl.loc, prev.loc if prev else None)
            self.stack = decl

    def _add_block(self, decl: ast.Block) -> None:
        prev = self.blocks.get(decl.name)
        self._claim("block", decl.name, decl.loc, prev.loc if prev else None)
        if prev is not None and prev.kind != decl.kind:
            raise MemformError(f"'{decl.name}' was declared as a {prev.kind} at {prev.loc}; "
                               f"it cannot be redeclared as a {decl.kind}", decl.loc)
        if prev is None:
            prev = BlockDef(decl.kind, decl.name, decl.base, decl.loc)
            self.blocks[decl.name] = prev
        elif decl.base is not None:
            prev.base = decl.base
            prev.base_loc = decl.loc
        fresh: set[tuple[str, str | None]] = set()  # what this declaration itself defines
        before = {name: (qd.default, dict(qd.variants)) for name, qd in prev.quantities.items()}
        for q in decl.quantities:
            qd = prev.quantities.setdefault(q.name, QuantityDef(q.name))
            keys = q.variants if q.variants is not None else (None,)
            for key in keys:
                kq = self._with_super(q, decl.name, key, before.get(q.name), prev.base)
                if (q.name, key) in fresh:
                    what = q.name if key is None else f"{q.name}[{key}]"
                    raise MemformError(f"'{what}' is defined twice in block '{decl.name}'", q.loc)
                fresh.add((q.name, key))
                qd.moment = qd.moment or q.moment
                if key is None:
                    qd.default = kq
                else:
                    if key not in RECOMPUTE_MODES:
                        raise MemformError(f"unknown variant '{key}'{did_you_mean(key, RECOMPUTE_MODES)}; "
                                           f"variants are the recompute modes {', '.join(RECOMPUTE_MODES)}",
                                           q.loc)
                    qd.variants[key] = kq

    def _with_super(self, q: ast.Quantity, block: str, key: str | None,
                    before: tuple[ast.Quantity | None, dict[str, ast.Quantity]] | None,
                    base: str | None) -> ast.Quantity:
        """``q`` with every ``super`` replaced by the definition of ``block.q[key]`` that ``q`` replaces:
        the block's own before this declaration, else the one it inherits from ``base``."""
        if not uses_super(q.expr):
            return q
        old: ast.Quantity | None = None
        if before is not None:
            default, variants = before
            old = variants.get(key, default) if key is not None else default
        if old is None and base is not None and base in self.blocks:
            old = self.pick(base, q.name, key)
        if old is None:
            what = q.name if key is None else f"{q.name}[{key}]"
            raise MemformError(f"'super' in '{what}' of block '{block}' names the definition it replaces, "
                               f"but no file before this one defines '{what}' for '{block}'", q.loc)
        return replace(q, expr=ast.substitute(q.expr, SUPER, old.expr))


def key_is_set(config: Mapping[str, Any], key: str) -> bool:
    """Whether a config's nested data holds a value (not None) at the dotted ``key``."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return node is not None


def uses_super(expr: ast.Expr) -> bool:
    return any(isinstance(n, ast.Ref) and n.name == SUPER and n.attr is None for n in ast.walk(expr))
