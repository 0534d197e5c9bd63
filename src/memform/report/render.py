"""Rendering estimates for people: Jinja2 templates shipped in ``memform/templates``.

Templates see the *context* built by :func:`context` (documented in the README, section
"Reports"): plain numbers and strings, plus ``StageView``/``LayerView`` objects that carry
each stage's breakdown, its closed forms (text, LaTeX, MathML) and every layer group's
contribution with the file:line of the formula it came from. A user's own template
(``--template my.j2``) gets the same context and may ``{% extends %}`` or ``{% import %}``
the bundled ones.
"""

from __future__ import annotations

import html.entities
import re
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import jinja2
import sympy

from ..engine.interpreter import CATEGORIES, MODEL, QUANTITY_OF, STATIC, LayerReport, StageResult, to_bytes
from ..engine.model import Estimate
from ..engine.symbolic import (assumption_lines, closed_form_latex, closed_form_text, ordered_assumptions,
                               simplify_assumptions, summary_assumptions, tidy)
from ..errors import MemformError
from ..lang.program import Program
from ..resources import resolve_display_path, templates_dir
from ..units import human_bytes, human_count, signed_bytes, signed_seconds
from .chart import CAPACITY_COLOR, CATEGORY_COLORS, CATEGORY_LABELS, PEAK_COLOR, axis_for, gib_near, near_bytes, verdict
from .table import setup_line, time_line, wrap_prose  # noqa: F401 (re-exported: plot, templates)

if TYPE_CHECKING:
    from ..analysis.compare import Comparison


#: report format -> bundled template (``memform report --format``)
REPORT_TEMPLATES = {"md": "report.md.j2", "html": "report.html.j2", "tex": "report.tex.j2"}
#: comparison format -> bundled template (``memform compare --format``)
COMPARE_TEMPLATES = {"txt": "compare.txt.j2", "md": "compare.md.j2", "html": "compare.html.j2",
                     "tex": "compare.tex.j2"}
#: the per-layer quantities shown by ``--explain`` and the reports, in order
LAYER_QUANTITIES = ("param_count",) + MODEL


def percent(part: Any, whole: Any, signed: bool = False) -> str:
    """``part`` as a percentage of ``whole`` (``n/a`` when whole is zero)."""
    if not whole:
        return "n/a"
    value = 100.0 * float(part) / float(whole)
    return f"{value:+.1f}%" if signed else f"{value:.1f}%"


_TEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                # characters formula docs and labels use that pdflatex's utf8 input does not know
                "×": r"$\times$", "·": r"$\cdot$", "≤": r"$\le$", "≥": r"$\ge$", "→": r"$\to$",
                "–": "--", "—": "---", "…": r"\ldots{}", "²": r"$^2$", "√": r"$\surd$", "≈": r"$\approx$",
                "|": r"$|$", "<": r"$<$", ">": r"$>$"}


def tex_escape(text: Any) -> str:
    """Plain text made safe for LaTeX (names such as ``llama3_70b`` or ``50%``)."""
    return "".join(_TEX_SPECIAL.get(ch, ch) for ch in str(text))


def tex_symbol(name: Any) -> str:
    """A symbol name for math mode: multi-letter names upright (``cp`` is one symbol, not c·p)."""
    name = str(name)
    return name if len(name) == 1 else r"\mathrm{" + tex_escape(name) + "}"


def to_latex(expr: sympy.Expr) -> str:
    """LaTeX of ``expr`` as-is (no tidying), with multi-letter symbols upright."""
    names = {sym: tex_symbol(sym.name) for sym in expr.free_symbols if len(sym.name) > 1}
    return sympy.latex(expr, symbol_names=names)


def latex_lines(expr: sympy.Expr, per_line: int = 3) -> list[str]:
    """A long closed form split after every ``per_line`` terms, for an ``aligned`` environment.

    ``tidy`` often returns ``k·(t1 + t2 + …)``; the factor stays on the first line and the
    bracket is closed on the last, with ``\\bigl(``/``\\bigr)`` because ``\\left``/``\\right``
    cannot span lines.
    """
    e = tidy(expr)
    outer, inner = sympy.Integer(1), e
    if e.is_Mul:
        adds = [a for a in e.args if a.is_Add]
        if len(adds) == 1:
            inner = adds[0]
            outer = sympy.Mul(*[a for a in e.args if a is not inner])
    if not inner.is_Add or len(inner.args) <= per_line:
        return [to_latex(e)]
    terms = [to_latex(t) for t in inner.as_ordered_terms(order="grlex")]
    pieces = [terms[0]] + [(" " if t.startswith("-") else " + ") + t for t in terms[1:]]
    lines = ["".join(pieces[i:i + per_line]) for i in range(0, len(pieces), per_line)]
    if outer != 1:
        lines[0] = to_latex(outer) + r" \bigl(" + lines[0]
        lines[-1] += r" \bigr)"
    return lines


#: the same stage and layer closed forms recur across formats and stages; tidying is the costly step


_NAMED_ENTITY = re.compile(r"&([A-Za-z][A-Za-z0-9]*);")


def _numeric_entity(m: re.Match[str]) -> str:
    """``&InvisibleTimes;`` -> ``&#x2062;`` so the page stays well-formed XML as well as HTML."""
    if m.group(1) in ("amp", "lt", "gt", "quot", "apos"):
        return m.group(0)
    chars = html.entities.html5.get(m.group(1) + ";")
    return "".join(f"&#x{ord(ch):x};" for ch in chars) if chars else m.group(0)


class Formula:
    """A closed form and its renderings, computed on first use (MathML is the costly one)."""

    def __init__(self, expr: sympy.Expr):
        self.expr = expr

    @cached_property
    def tidy(self) -> sympy.Expr:
        return tidy(self.expr)

    @cached_property
    def text(self) -> str:
        return sympy.sstr(self.tidy, order="grlex")  # as symbolic.closed_form_text

    @cached_property
    def latex(self) -> str:
        return to_latex(self.tidy)

    @cached_property
    def latex_lines(self) -> list[str]:
        return latex_lines(self.expr)

    @cached_property
    def mathml(self) -> str:
        """Presentation MathML (a ``<math>`` element; browsers render it natively)."""
        from sympy.printing.mathml import mathml
        body = _NAMED_ENTITY.sub(_numeric_entity, mathml(self.tidy, printer="presentation"))
        return f'<math xmlns="http://www.w3.org/1998/Math/MathML" display="inline">{body}</math>'

    def __str__(self) -> str:
        return self.text


@dataclass
class LayerView:
    """One group of identical layers on a stage, ready to print (see ``engine.LayerReport``)."""

    report: LayerReport
    inflight_source: str
    #: bytes the group adds to its stage per category; comm is the group's transient buffer,
    #: which counts towards the stage only when it is the largest one (``comm_is_peak``)
    contribution: dict[str, int]
    comm_is_peak: bool
    source_text: dict[str, str]
    defined_in: dict[str, str]          # category -> "block.quantity[variants]" that supplied it
    formulas: dict[str, Formula]

    def __getattr__(self, name: str) -> Any:  # stage, chunk, block, mode, count, sources, ...
        if name == "report":
            raise AttributeError(name)
        return getattr(self.report, name)

    @property
    def last_layer(self) -> int:
        return self.report.first_layer + self.report.count_value - 1

    @property
    def label(self) -> str:
        r = self.report
        return f"{r.count_value}×{r.block}" + (f" [{r.mode}]" if r.mode != "none" else "")


@dataclass
class StageView:
    """One pipeline stage as templates see it: numbers, closed forms and its layer groups."""

    result: StageResult
    chunks: list[list[str]]            # per chunk, "16×decoder" labels
    layers: list[LayerView]
    symbolic: dict[str, Formula]        # category -> closed form
    total: Formula
    capacity_bytes: int
    moment_sources: dict[str, str] = field(default_factory=dict)  # moment -> file:line

    def __getattr__(self, name: str) -> Any:  # exprs, exact, param_count, static_bytes, ...
        if name == "result":
            raise AttributeError(name)
        return getattr(self.result, name)

    @property
    def stage(self) -> int:
        return self.result.stage

    @property
    def values(self) -> dict[str, int]:
        return self.result.values

    @property
    def breakdown(self) -> dict[str, int]:
        return self.result.values

    @property
    def peak_bytes(self) -> int:
        return self.result.peak_bytes

    @property
    def fits(self) -> bool:
        return self.result.fits

    @property
    def reserved_bytes(self) -> int:
        return self.result.reserved_bytes

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.result.peak_bytes

    @property
    def moments(self) -> dict[str, int]:
        """Activation bytes at each moment of the schedule (the largest is ``values.activations``)."""
        return dict(getattr(self.result, "moments", None) or {})

    @property
    def peak_moment(self) -> str | None:
        return getattr(self.result, "peak_moment", None)

    @property
    def inflight_activations(self) -> int:
        """Stored activations of the in-flight micro-batches: the layer groups' sum (end of warm-up)."""
        return sum(l.contribution["activations"] for l in self.layers)

    @property
    def layers_text(self) -> str:
        return " / ".join(" ".join(c) for c in self.chunks if c)


@lru_cache(maxsize=256)
def _source_line(loc: str) -> str:
    """The first line of the formula at ``file:line:col`` (empty when the file is unreadable)."""
    parts = loc.rsplit(":", 2)
    try:
        lines = resolve_display_path(parts[0]).read_text(encoding="utf-8").splitlines()
        return lines[int(parts[1]) - 1].strip()
    except (OSError, UnicodeDecodeError, ValueError, IndexError):
        return ""


def _defined_in(program: Program, block: str, qname: str, mode: str) -> str:
    """Which block of the ``extends`` chain supplied ``block.qname`` for ``mode``, e.g. ``layer.grad_bytes``."""
    for b in program.chain(block):
        qd = b.quantities.get(qname)
        if qd is None:
            continue
        q = qd.pick(mode)
        variants = f"[{', '.join(q.variants)}]" if q is not None and q.variants else ""
        return f"{b.name}.{qname}{variants}"
    return f"{block}.{qname}"


def layer_view(program: Program, r: LayerReport, inflight_source: str, comm_is_peak: bool) -> LayerView:
    contribution = {c: to_bytes(r.count_value * r.per_layer_values[c]) for c in STATIC}
    contribution["activations"] = to_bytes(r.inflight_value * r.count_value * r.per_layer_values["activations"])
    contribution["comm"] = to_bytes(r.per_layer_values["comm"])
    return LayerView(r, inflight_source, contribution, comm_is_peak,
                     {c: _source_line(r.sources[c]) for c in LAYER_QUANTITIES},
                     {c: _defined_in(program, r.block, QUANTITY_OF[c], r.mode) for c in LAYER_QUANTITIES},
                     {c: Formula(r.per_layer[c]) for c in LAYER_QUANTITIES})


def stage_view(est: Estimate, s: StageResult, inflight_source: str) -> StageView:
    chunks = [[f"{g.count_value}×{g.block}" for g in c.groups] for c in est.partition.chunks[s.stage]]
    comm_peak = max(range(len(s.layers)), key=lambda i: s.layers[i].per_layer_values["comm"], default=None)
    layers = [layer_view(est.model.program, r, inflight_source, i == comm_peak) for i, r in enumerate(s.layers)]
    sources = {}
    for name in getattr(s, "moments", None) or {}:
        q = est.model.program.pick(est.model.structure.schedule, name, None)
        sources[name] = str(q.loc) if q is not None else ""
    return StageView(s, chunks, layers, {c: Formula(s.exprs[c]) for c in CATEGORIES}, Formula(s.total_expr),
                     est.capacity_bytes, sources)


def _plain(value: Any) -> Any:
    """Config values for display: sympy numbers as Python numbers."""
    if isinstance(value, sympy.Basic) and value.is_number:
        return int(value) if value.is_integer else float(value)
    return value


def context(est: Estimate) -> dict[str, Any]:
    """What every template sees (documented in the README, section "Reports")."""
    model = est.model
    st = model.structure
    prog = model.program
    q = prog.pick(st.schedule, "inflight", None)
    inflight_source = str(q.loc) if q is not None else ""
    stages = [stage_view(est, s, inflight_source) for s in est.stages]
    symbols, options = [], []
    for name, b in prog.bindings.items():
        row = {"name": name, "key": b.path, "doc": b.doc, "unit": b.unit or "",
               "value": _plain(model.bound.value_of(name))}
        (symbols if b.keyword == "symbol" else options).append(row)
    data = model.data
    from .. import __version__
    return {
        "est": est,
        "name": est.name,
        "model": {"name": est.name, "config": str(model.source) if model.source else None,
                  "formulas": list(data.get("formulas", [])), "hyper": dict(data.get("model", {}) or {})},
        "strategy": {"schedule": st.schedule, "pp": st.pp, "vpp": st.vpp, "recompute": st.recompute,
                     "framework": st.framework,
                     "parallel": dict(data.get("parallel", {}) or {}),
                     "training": dict(data.get("training", {}) or {})},
        "schedule": st.schedule,
        "pp": st.pp,
        "vpp": st.vpp,
        "recompute": st.recompute,
        "framework": st.framework,
        "capacity_bytes": est.capacity_bytes,
        "peak_bytes": est.peak_bytes,
        "reserved_bytes": est.stages[est.peak_stage].reserved_bytes,
        "reserved": any(getattr(s, "reserve", None) is not None for s in est.stages),
        "peak_stage": est.peak_stage,
        "fits": est.fits,
        "categories": CATEGORIES,
        "layer_categories": MODEL,
        "category_labels": CATEGORY_LABELS,
        "colors": {**CATEGORY_COLORS, "capacity": CAPACITY_COLOR, "peak": PEAK_COLOR},
        "stages": stages,
        "breakdowns": [dict(s.values) for s in est.stages],
        "partition": est.partition,
        "assumptions": est.assumptions,
        "setup": Lazy(lambda: est.setup),
        "parameters": Lazy(lambda: est.parameters),
        "setup_line": LazyText(lambda: setup_line(est)),
        "time_line": time_line(est),   # the step-time model's line ("" without one)
        "layer_labels": [est.terminal_label(s.stage) for s in est.stages],
        "symbols": symbols,
        "options": options,
        "axis": axis_for(est.capacity_bytes, est.peak_bytes),
        "json": Lazy(est.to_dict),
        "version": __version__,
    }


class Lazy(Mapping):
    """A mapping computed on first use: ``json`` (the ``--json`` dict) costs a closed form per
    stage, which most templates never read."""

    def __init__(self, make: Callable[[], Mapping[str, Any]]):
        self._make = make
        self._value: Mapping[str, Any] | None = None

    def _get(self) -> Mapping[str, Any]:
        if self._value is None:
            self._value = self._make()
        return self._value

    def __getitem__(self, key: str) -> Any:
        return self._get()[key]

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


class LazyText:
    """A string computed when a template prints it (the parameter count re-evaluates the stack)."""

    def __init__(self, make: Callable[[], str]):
        self._make = make
        self._value: str | None = None

    def __str__(self) -> str:
        if self._value is None:
            self._value = self._make()
        return self._value

    def __html__(self) -> str:
        from markupsafe import escape
        return str(escape(str(self)))


def _add_filters(env: jinja2.Environment) -> jinja2.Environment:
    env.filters["bytes"] = human_bytes
    env.filters["count"] = human_count
    env.filters["assumption_lines"] = assumption_lines
    env.filters["ordered_assumptions"] = ordered_assumptions
    env.filters["simplified_assumptions"] = simplify_assumptions
    env.filters["summary_assumptions"] = summary_assumptions
    env.filters["wrap_prose"] = wrap_prose
    env.filters["signed_bytes"] = signed_bytes
    env.filters["signed_seconds"] = signed_seconds
    env.filters["percent"] = percent
    env.filters["closed_form"] = closed_form_text
    env.filters["latex"] = closed_form_latex
    env.filters["tex"] = tex_escape
    env.filters["tex_symbol"] = tex_symbol
    env.filters["source_line"] = _source_line
    env.filters["gib"] = lambda n: float(n) / 2 ** 30
    env.filters["gib_near"] = gib_near
    env.filters["near_bytes"] = near_bytes
    env.filters["verdict"] = verdict
    return env


def _autoescape(name: str | None) -> bool:
    return bool(name) and name.lower().rsplit(".j2", 1)[0].endswith((".html", ".htm", ".svg", ".xml"))


def _new_environment(loader: jinja2.BaseLoader) -> jinja2.Environment:
    return _add_filters(jinja2.Environment(loader=loader, autoescape=_autoescape, trim_blocks=True,
                                           lstrip_blocks=True, keep_trailing_newline=True,
                                           undefined=jinja2.StrictUndefined))


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The bundled templates (HTML ones autoescaped)."""
    return _new_environment(jinja2.FileSystemLoader(str(templates_dir())))


def user_environment(directory: Path) -> jinja2.Environment:
    """A user's template directory first, then the bundled templates (for extends/import)."""
    return _new_environment(jinja2.ChoiceLoader([jinja2.FileSystemLoader(str(directory)),
                                                 jinja2.FileSystemLoader(str(templates_dir()))]))


def _render(env: jinja2.Environment, name: str, values: Mapping[str, Any], shown: str) -> str:
    """Render with template mistakes turned into a :class:`MemformError` naming file:line."""
    try:
        return env.get_template(name).render(**values)
    except jinja2.TemplateNotFound as exc:
        raise MemformError(f"template not found: {shown} ({exc.message or exc.name})") from None
    except jinja2.TemplateSyntaxError as exc:
        where = f"{exc.filename or shown}:{exc.lineno}"
        raise MemformError(f"{where}: template syntax error: {exc.message}") from None
    except (jinja2.UndefinedError, TypeError, ValueError, AttributeError) as exc:
        raise MemformError(f"{_template_frame(exc) or shown}: template error: {exc} "
                           f"(the names a template can use are listed in the README, section 'Reports')") from None


def _template_frame(exc: BaseException) -> str | None:
    """file:line of the innermost template frame in ``exc``'s traceback (Jinja rewrites them)."""
    tb, where = exc.__traceback__, None
    while tb is not None:
        fname = tb.tb_frame.f_code.co_filename
        if fname.endswith(".j2") or fname.endswith((".html", ".md", ".tex", ".txt")):
            where = f"{fname}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def render(template: str, est: Estimate, **extra: Any) -> str:
    """Render a bundled template for ``est``; ``stage=`` may be a StageResult or a stage index."""
    values = context(est)
    stage = extra.get("stage")
    if isinstance(stage, StageResult):
        extra["stage"] = values["stages"][stage.stage]
    elif isinstance(stage, int) and not isinstance(stage, bool):
        extra["stage"] = values["stages"][stage]
    values.update(extra)
    return _render(environment(), template, values, template)


def render_report(est: Estimate, fmt: str = "md", template: str | Path | None = None, **extra: Any) -> str:
    """A whole report: the bundled template for ``fmt`` or the user's ``template`` file."""
    values = {**context(est), **extra}
    return render_with(values, REPORT_TEMPLATES, fmt, template)


def render_with(values: Mapping[str, Any], table: Mapping[str, str], fmt: str,
                template: str | Path | None) -> str:
    if template is not None:
        path = Path(template)
        if not path.is_file():
            raise MemformError(f"--template: no such file: {path}")
        return _render(user_environment(path.resolve().parent), path.name, values, str(path))
    if fmt not in table:
        raise MemformError(f"unknown format {fmt!r} (choose one of {', '.join(table)})")
    return _render(environment(), table[fmt], values, table[fmt])


def compare_context(cmp: "Comparison") -> dict[str, Any]:
    """What comparison templates see (README, "Reports"): ``variants`` (per variant a full report
    context plus ``key``, ``label``, ``ok``, ``error``, ``index``, ``peak_delta`` vs the baseline,
    ``step_seconds`` and ``step_delta`` vs the baseline's (None without a time model);
    a failed variant has only ``key``, ``label``, ``ok``, ``error``, ``index``, ``config``,
    ``overrides``), ``shown`` (the variants that estimated), ``baseline``, ``diffs`` (per stage:
    ``stage``, ``cells`` (per variant a StageView or None), ``deltas`` (per variant bytes minus the
    baseline's per category and ``peak``, None for the baseline and where missing), and for the
    first two variants ``a``/``b``/``delta`` B - A), ``config_keys`` (``key``, ``values``), the
    two-variant ``a``, ``b``, ``config_diff``, ``peak_delta``, and the shared chart/colour names."""
    peaks, steps = cmp.peak_deltas, cmp.step_deltas
    variants: list[dict[str, Any]] = []
    for j, v in enumerate(cmp.variants):
        common = {"key": v.key, "label": v.label, "ok": v.ok, "error": v.error, "index": j,
                  "config": v.config_path, "overrides": list(v.overrides), "baseline": j == cmp.baseline}
        if v.ok:
            variants.append({**context(v.est), **common, "peak_delta": peaks[j], "step_delta": steps[j],
                             "step_seconds": v.est.step_seconds if v.est.has_time else None})
        else:
            variants.append(common)
    diffs = []
    for d in cmp.stages:
        cells = [variants[j]["stages"][d.stage] if r is not None else None for j, r in enumerate(d.results)]
        diffs.append({"stage": d.stage, "cells": cells, "deltas": d.deltas,
                      "a": cells[0], "b": cells[1], "delta": d.delta})
    shown = [v for v in variants if v["ok"]]
    ests = [v.est for v in cmp.ok_variants]
    from .. import __version__
    return {
        "title": cmp.title,
        "variants": variants, "shown": shown, "baseline": variants[cmp.baseline],
        "failed": [v for v in variants if not v["ok"]],
        "diffs": diffs,
        "config_keys": [{"key": k, "values": vals} for k, vals in cmp.config_keys],
        "sweep": [{"key": k, "values": vals} for k, vals in cmp.sweep],
        "a": variants[0], "b": variants[1],
        "config_diff": [{"key": k, "a": va, "b": vb} for k, va, vb in cmp.config_diff],
        "peak_delta": cmp.peak_delta,
        "capacities": sorted({e.capacity_bytes for e in ests}),
        "categories": CATEGORIES,
        "category_labels": CATEGORY_LABELS,
        "colors": {**CATEGORY_COLORS, "capacity": CAPACITY_COLOR, "peak": PEAK_COLOR},
        "axis": axis_for(*[e.capacity_bytes for e in ests], *[e.peak_bytes for e in ests]),
        "json": Lazy(cmp.to_dict),
        "version": __version__,
    }


def render_comparison(cmp: "Comparison", fmt: str = "txt", template: str | Path | None = None) -> str:
    """A comparison in ``fmt`` (txt, md, html, tex) or through the user's ``template``."""
    return render_with(compare_context(cmp), COMPARE_TEMPLATES, fmt, template)
