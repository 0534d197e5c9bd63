"""Closed-form derivations: a stage's peak in the symbols you choose, laid out as a paper would.

``memform derive CONFIG --keep h,s,b`` keeps those symbols, substitutes every other one by its
config value, and writes the peak of each stage as

    M_i = M_static + M_act + M_comm,   M_static = (bytes per parameter) · Φ_i

where Φ_i is the stage's parameter count (Korthikanti et al. 2022 §4 and ZeRO §3.1 write the
static part the same way: 2 + 2 + 12 bytes per parameter for mixed-precision Adam). When the
layers on a stage do not share one bytes-per-parameter factor the three static categories are
written out separately instead.

``--explain`` traces every term back to the formula (block quantity, ``let`` or function) and
the file:line it came from, following the references inside each formula.

``--time`` writes each stage's step time instead (formulas/time.mf: one term per ``cost`` block,
T_i = T_compute + T_tp + ... + T_bubble), in the same kept symbols; device figures are numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import sympy

from ..engine.evaluator import Evaluator
from ..engine.interpreter import PS_PER_SECOND, STATIC, StageResult
from ..engine.model import Estimate, Model, estimate_model
from ..engine.symbolic import assumption_lines, tidy
from ..errors import MemformError
from ..lang import ast
from ..lang.checker import walk
from ..units import human_bytes


@dataclass
class StageForm:
    """One stage's peak, split the way a paper writes it."""

    stage: int
    param_count: sympy.Expr                          # Φ
    static: sympy.Expr
    bytes_per_param: dict[str, sympy.Expr] | None     # params/grads/optimizer per parameter, when uniform
    categories: dict[str, sympy.Expr]                 # params, grads, optimizer, activations, comm
    total: sympy.Expr
    peak_bytes: int
    time: dict[str, sympy.Expr] = field(default_factory=dict)   # seconds per cost block (empty: no time model)
    step_seconds: float = 0.0


@dataclass
class Derivation:
    name: str
    keep: list[str] | None                 # None: every symbol kept
    substituted: dict[str, Any]            # symbol -> value, for symbols not kept
    stages: list[StageForm]
    assumptions: list[str]
    estimate: Estimate = field(repr=False)


def parse_keep(model: Model, text: str | None) -> frozenset[str] | None:
    """``h,s,b`` or config keys (``model.hidden_size``) → symbol names; None keeps all."""
    if text is None:
        return None
    names = set()
    symbols = {n for n, b in model.program.bindings.items() if b.keyword == "symbol"}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        if item in symbols:
            names.add(item)
            continue
        sym = model.symbol_for_key(item)
        if sym is None:
            from ..errors import did_you_mean
            raise MemformError(f"--keep: '{item}' is not a symbol of the formula files"
                               f"{did_you_mean(item, sorted(symbols))} (symbols: {', '.join(sorted(symbols))})")
        names.add(sym.name)
    return frozenset(names)


def derive(model: Model, keep: frozenset[str] | None = None, *, resolve: bool = True) -> Derivation:
    est = estimate_model(model, resolve=resolve, keep=keep)
    stages = [_stage_form(s) for s in est.stages]
    substituted = {}
    if keep is not None:
        for name, b in model.program.bindings.items():
            if b.keyword == "symbol" and name not in keep:
                substituted[name] = model.bound.value_of(name)
    return Derivation(est.name, sorted(keep) if keep is not None else None, substituted, stages,
                      list(est.assumptions), est)


def _stage_form(s: StageResult) -> StageForm:
    phi = sympy.Add(*(l.count * l.per_layer["param_count"] for l in s.layers))
    static = sympy.Add(*(s.exprs[c] for c in STATIC))
    ratios: dict[str, sympy.Expr] | None = None
    if phi != 0:  # one bytes-per-parameter factor only when every layer on the stage shares it
        per_group = []
        for layer in s.layers:
            count = layer.per_layer["param_count"]
            if count == 0:
                if any(layer.per_layer[c] != 0 for c in STATIC):
                    per_group = None
                    break
                continue
            per_group.append({c: sympy.cancel(layer.per_layer[c] / count) for c in STATIC})
        if per_group and all(all(sympy.simplify(g[c] - per_group[0][c]) == 0 for c in STATIC) for g in per_group):
            ratios = {c: sympy.factor_terms(per_group[0][c]) for c in STATIC}
            if any(r.free_symbols & phi.free_symbols for r in ratios.values()):
                ratios = None
    return StageForm(s.stage, tidy(phi), tidy(static), ratios, {c: tidy(e) for c, e in s.exprs.items()},
                     tidy(s.total_expr), s.peak_bytes,
                     {k: tidy(e) for k, e in s.time_exprs.items()} if s.step_ps else {}, s.step_ps / PS_PER_SECOND)


# ------------------------------------------------------------------------- rendering


def _text(e: sympy.Expr) -> str:
    return sympy.sstr(e, order="grlex")


def _bpp_text(ratios: dict[str, sympy.Expr]) -> str:
    return " + ".join(_text(ratios[c]) if not ratios[c].is_Add else f"({_text(ratios[c])})" for c in STATIC)


def _seconds(e: sympy.Expr) -> str:
    """A time closed form with its (device-figure) coefficients as 4-digit decimals."""
    return _text(e.evalf(4)) if e.free_symbols else f"{float(e):.4g}"


def render_time_text(d: Derivation, stages: Iterable[int]) -> str:
    """Each stage's step time, term by term (``memform derive --time``)."""
    if not any(f.time for f in d.stages):
        raise MemformError("--time: no time model for this config: give it a device with peak FLOP/s "
                           "(e.g. --set device=h100-sxm; presets in configs/devices/)")
    out = _heading(d, "step time", ", seconds")
    for i in stages:
        f = d.stages[i]
        out.append("")
        out.append(f"stage {f.stage}:  T = {' + '.join('T_' + k for k in f.time)} = {f.step_seconds:.6g} s")
        for k, e in f.time.items():
            out.append(f"  T_{k:<10s}= {_seconds(e)}")
        out.append(f"  T          = {_seconds(sympy.Add(*f.time.values()))}")
    return _finish(d, out)


def _heading(d: Derivation, what: str, suffix: str = "") -> list[str]:
    """The first lines of ``derive``'s text: what is derived, in which symbols, the rest's values."""
    st = d.estimate.model.structure
    kept = "every symbol" if d.keep is None else ", ".join(d.keep) or "no symbol"
    out = [f"{d.name}: closed-form {what} per stage in {kept} ({st.schedule}, recompute={st.recompute}){suffix}"]
    if d.substituted:
        out.append("other symbols at their config values: " +
                   ", ".join(f"{k}={_show(v)}" for k, v in sorted(d.substituted.items())))
    return out


def _finish(d: Derivation, out: list[str]) -> str:
    """``out`` with the conditions the closed forms hold under, as text."""
    if d.assumptions:
        out.append("")
        out.extend(assumption_lines(d.assumptions, shown=None))  # a derivation states every condition
    return "\n".join(out) + "\n"


def render_text(d: Derivation, stages: Iterable[int]) -> str:
    out = _heading(d, "peak")
    for i in stages:
        f = d.stages[i]
        out.append("")
        out.append(f"stage {f.stage}:  M = M_static + M_act + M_comm = {f.peak_bytes} bytes ({human_bytes(f.peak_bytes)})")
        if f.bytes_per_param is not None:
            total_bpp = sympy.factor_terms(sympy.Add(*f.bytes_per_param.values()))
            out.append(f"  M_static = ({_bpp_text(f.bytes_per_param)}) * Phi = {_text(total_bpp)} * Phi"
                       f"      [bytes per parameter: params + grads + optimizer]")
            out.append(f"  Phi      = {_text(f.param_count)}      [parameters on this stage]")
        else:
            out.append(f"  M_static = {_text(f.static)}")
            for c in STATIC:
                out.append(f"    {c:<10s}= {_text(f.categories[c])}")
        out.append(f"  M_act    = {_text(f.categories['activations'])}")
        out.append(f"  M_comm   = {_text(f.categories['comm'])}")
        out.append(f"  M        = {_text(f.total)}")
    return _finish(d, out)


def render_latex(d: Derivation, stages: Iterable[int]) -> str:
    lines = []
    for i in stages:
        f = d.stages[i]
        sub = f"{{{f.stage}}}"
        lines.append(f"M_{sub} &= M^{{\\mathrm{{static}}}}_{sub} + M^{{\\mathrm{{act}}}}_{sub} + "
                     f"M^{{\\mathrm{{comm}}}}_{sub} \\\\")
        if f.bytes_per_param is not None:
            parts = " + ".join(sympy.latex(f.bytes_per_param[c]) for c in STATIC)
            lines.append(f"M^{{\\mathrm{{static}}}}_{sub} &= \\left({parts}\\right) \\Phi_{sub}, \\quad "
                         f"\\Phi_{sub} = {sympy.latex(f.param_count)} \\\\")
        else:
            lines.append(f"M^{{\\mathrm{{static}}}}_{sub} &= {sympy.latex(f.static)} \\\\")
        lines.append(f"M^{{\\mathrm{{act}}}}_{sub} &= {sympy.latex(f.categories['activations'])} \\\\")
        lines.append(f"M^{{\\mathrm{{comm}}}}_{sub} &= {sympy.latex(f.categories['comm'])} \\\\")
        lines.append(f"M_{sub} &= {sympy.latex(f.total)} \\\\[4pt]")
    if lines:
        lines[-1] = lines[-1].removesuffix(" \\\\[4pt]")
    body = "\n".join(lines)
    text = "\\begin{aligned}\n" + body + "\n\\end{aligned}\n"
    if d.assumptions:
        text += "".join(f"% {line}\n" for line in assumption_lines(d.assumptions, shown=None))
    return text


def to_dict(d: Derivation, stages: Iterable[int]) -> dict[str, Any]:
    def form(e: sympy.Expr) -> dict[str, str]:
        return {"text": _text(e), "latex": sympy.latex(e), "srepr": sympy.srepr(e)}

    out = []
    for i in stages:
        f = d.stages[i]
        out.append({
            "stage": f.stage,
            "peak_bytes": f.peak_bytes,
            "param_count": form(f.param_count),
            "bytes_per_param": None if f.bytes_per_param is None else
            {c: form(v) for c, v in f.bytes_per_param.items()},
            "static": form(f.static),
            "categories": {c: form(e) for c, e in f.categories.items()},
            "total": form(f.total),
            **({"time": {k: form(e) for k, e in f.time.items()}, "step_seconds": f.step_seconds} if f.time else {}),
        })
    return {"model": d.name, "keep": d.keep, "substituted": {k: _show(v) for k, v in d.substituted.items()},
            "assumptions": d.assumptions, "stages": out}


def _show(v: Any) -> Any:
    if isinstance(v, sympy.Integer):
        return int(v)
    if isinstance(v, sympy.Rational):
        return str(v)
    return v


# ------------------------------------------------------------------------- explain


@dataclass
class Trace:
    """One formula that contributes to a term: where it is and what it evaluates to."""

    label: str
    loc: str
    expr: Any
    children: list["Trace"] = field(default_factory=list)
    repeated: bool = False


class Tracer:
    """Follows the references inside formulas (block quantities, lets, functions)."""

    def __init__(self, model: Model, ev: Evaluator, depth: int = 3):
        self.prog = model.program
        self.ev = ev
        self.depth = depth
        self.seen: set[str] = set()

    def quantity(self, block: str, qname: str, mode: str | None,
                 extra: tuple = (), depth: int = 0, overrides: tuple = ()) -> Trace:
        """``overrides``: a layer group's per-layer ``where`` values (the stack's bindings)."""
        q = self.prog.pick(block, qname, mode)
        label = f"{block}.{qname}" + (f"[{mode}]" if mode and self.prog.has_variants(block, qname) else "")
        value = self.ev.quantity(block, qname, mode, extra=extra, overrides=overrides)
        tr = Trace(label, str(q.loc) if q else "?", value)
        if q is not None:
            self._children(tr, q.expr, block, mode, extra, depth, overrides)
        return tr

    def let(self, name: str, depth: int, overrides: tuple = (), extra: tuple = ()) -> Trace:
        """``extra``: the reading block's bindings; a let that reads ``stage`` takes the stage from them (a
        schedule's moment or in-flight count is traced at one stage)."""
        decl = self.prog.lets[name]
        stage = dict(extra).get("stage") if name in self.prog.stage_readers()[0] else None
        tr = Trace(name, str(decl.loc), self.ev.let(name, overrides=overrides, stage=stage))
        self._children(tr, decl.expr, None, None, extra if stage is not None else (), depth, overrides)
        return tr

    def _children(self, tr: Trace, expr: ast.Expr, block: str | None, mode: str | None,
                  extra: tuple, depth: int, overrides: tuple = ()) -> None:
        key = f"{tr.label}@{tr.loc}"
        if key in self.seen:
            tr.repeated = True
            return
        self.seen.add(key)
        if depth >= self.depth:
            return
        done: set[tuple] = set()
        for n in walk(expr):
            child: Trace | None = None
            if isinstance(n, ast.Ref):
                if n.attr is not None:
                    target = (n.name, n.attr, n.variant or mode)
                    if target not in done:
                        child = self.quantity(*target, depth=depth + 1, overrides=overrides)
                elif block is not None and self.prog.find_quantity(block, n.name) is not None:
                    target = (block, n.name, n.variant or mode)
                    if target not in done:
                        child = self.quantity(*target, extra=extra, depth=depth + 1, overrides=overrides)
                elif n.name in self.prog.lets:
                    target = ("let", n.name, None)
                    if target not in done:
                        child = self.let(n.name, depth + 1, overrides, extra)
                else:
                    continue
                done.add(target)
            elif isinstance(n, ast.Call) and n.func in self.prog.defs:
                target = ("def", n.func, None)
                if target in done:
                    continue
                done.add(target)
                d = self.prog.defs[n.func]
                child = Trace(f"{n.func}({', '.join(d.params)})", str(d.loc), None)
            if child is not None:
                tr.children.append(child)


def explain_text(model: Model, d: Derivation, stage: int, keep: frozenset[str] | None,
                 depth: int = 3) -> str:
    """Every term of one stage, traced to its formulas (file:line), with closed forms and bytes."""
    est = d.estimate
    s = est.stages[stage]
    ev = model.evaluator(resolve=True, keep=keep)
    sched = model.structure.schedule
    # walk the stage once with this evaluator: schedule moments read the stage's layers from it
    from ..engine.interpreter import Interpreter
    from ..engine.model import partition_of
    Interpreter(model.program, ev, sched).stage(stage, partition_of(model, ev), model.structure.capacity_bytes)
    tracer = Tracer(model, ev, depth)
    moments = list(getattr(model.program, "moments", lambda _: [])(sched) or [])
    act_rule = ("act = the schedule's largest moment (below)" if moments
                else "act = Σ count × in-flight × act")
    out = [f"{d.name}: stage {stage}, where each term comes from",
           f"  static = Σ count × (param_bytes + grad_bytes + optimizer_bytes);  {act_rule};  "
           "comm = max over layers of comm", ""]
    quantities = {"params": "param_bytes", "grads": "grad_bytes", "optimizer": "optimizer_bytes",
                  "activations": "act", "comm": "comm"}
    for layer in s.layers:
        out.append(f"{layer.count_value} × {layer.block}" + (f" [{layer.mode}]" if layer.mode != "none" else "") +
                   f"  (chunk {layer.chunk}, layers {layer.first_layer}..{layer.first_layer + layer.count_value - 1})")
        try:
            extra = (("stage", sympy.Integer(stage)), ("chunk", sympy.Integer(layer.chunk)))
            infl = tracer.quantity(sched, "inflight", None, extra=extra)
            out.extend(_lines(infl, ev, "  in-flight: ", 2))
        except MemformError:
            pass
        for cat, qname in quantities.items():
            term = tracer.quantity(layer.block, qname, layer.mode, overrides=layer.bindings)
            if cat == "comm":
                head = f"  {cat:<11s} max over layers of "
            else:
                mult = layer.count * (layer.inflight if cat == "activations" else 1)
                head = f"  {cat:<11s} {_text(tidy(mult))} × "
            out.extend(_lines(term, ev, head, 2))
        out.append("")
    if moments:
        out.append("activations at the schedule's moments (the largest is the stage's activation memory):")
        for name in moments:
            tr = tracer.quantity(sched, name, None, extra=(("stage", sympy.Integer(stage)),))
            mark = "  <- largest" if name == getattr(s, "peak_moment", None) else ""
            lines = _lines(tr, ev, "  moment ", 2)
            lines[0] += mark
            out.extend(lines)
        out.append("")
    out.append(f"stage {stage} total: {s.peak_bytes} bytes ({human_bytes(s.peak_bytes)})")
    return "\n".join(out) + "\n"


def _lines(tr: Trace, ev: Evaluator, head: str, indent: int) -> list[str]:
    value = ""
    if tr.expr is not None and not isinstance(tr.expr, (str, bool)):
        try:
            expr = tidy(ev.as_expr(tr.expr, None))
            number = ev.number(expr)
            value = f" = {_text(expr)}" + (f"  ({_text(number)})" if expr.free_symbols else "")
        except (MemformError, TypeError, AttributeError):
            value = f" = {tr.expr}"
    elif isinstance(tr.expr, (str, bool)):
        value = f" = {tr.expr}"
    lines = [f"{head}{tr.label}  [{tr.loc}]{value}" + ("  (traced above)" if tr.repeated else "")]
    for c in tr.children:
        lines.extend(_lines(c, ev, " " * (indent + 4) + "<- ", indent + 4))
    return lines
