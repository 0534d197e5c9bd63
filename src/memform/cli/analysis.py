"""Sub-commands on closed forms: ``derive``, ``solve``, ``sensitivity`` and ``search``."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from typing import Any

from ..errors import MemformError
from ..units import human_bytes


def register(sub: argparse._SubParsersAction) -> None:
    from .common import add_config_args

    p = sub.add_parser("derive", help="closed-form peak of each stage in chosen symbols (text, LaTeX, JSON)")
    add_config_args(p)
    p.add_argument("--stage", type=int, help="only this stage (default: every stage)")
    p.add_argument("--keep", metavar="SYMS", help="symbols (h,s,b) or config keys kept symbolic; the rest "
                   "are substituted by their config values (default: keep every symbol)")
    p.add_argument("--general", action="store_true", help="keep min/max/if as Piecewise (valid for all values) "
                   "instead of deciding them at the config's values")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--latex", action="store_true", help="LaTeX (aligned environment)")
    out.add_argument("--json", action="store_true", help="text, LaTeX and sympy srepr of every form")
    out.add_argument("--explain", action="store_true", help="trace each term to its formula and file:line")
    out.add_argument("--time", action="store_true",
                     help="the step time per stage instead, one term per cost block (formulas/time.mf)")
    p.add_argument("--depth", type=int, default=3, help="--explain: how deep to follow references (default 3)")
    p.set_defaults(func=cmd_derive)

    p = sub.add_parser("solve", help="largest value of a key (smallest parallel degree) that fits the device")
    add_config_args(p)
    p.add_argument("--for", dest="key", required=True, metavar="KEY",
                   help="config key or symbol, e.g. training.micro_batch_size, model.seq_length, parallel.tp")
    p.add_argument("--max", dest="limit", type=int, help="largest value tried (default 2^20; 2^16 for degrees)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--assumptions", action="store_true", help="every condition the closed form holds under "
                   "(by default the first 8, simplified)")
    p.set_defaults(func=cmd_solve)

    p = sub.add_parser("sensitivity", help="∂(stage peak)/∂symbol at the config, in bytes per unit")
    add_config_args(p)
    p.add_argument("--wrt", required=True, metavar="KEY", action="append",
                   help="config key or symbol (repeatable), e.g. --wrt b --wrt model.seq_length")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--assumptions", action="store_true", help="every condition the closed forms hold under "
                   "(by default the first 8, simplified)")
    p.set_defaults(func=cmd_sensitivity)

    p = sub.add_parser("search", help="every parallel strategy for N devices that fits, ranked")
    add_config_args(p)
    p.add_argument("--devices", type=int, required=True, help="number of devices (N)")
    for name, what in (("tp", "tensor"), ("pp", "pipeline"), ("vpp", "virtual pipeline"), ("cp", "context"),
                       ("ep", "expert")):
        p.add_argument(f"--{name}", type=_ints, metavar="LIST", help=f"{what}-parallel sizes to try "
                       f"(default: {'every divisor of N' if name != 'vpp' else '1 and the config value'})")
    p.add_argument("--zero", type=_ints, metavar="LIST", help="ZeRO stages to try (default 0,1,2,3)")
    p.add_argument("--recompute", type=_strs, metavar="LIST", help="default none,selective,full")
    p.add_argument("--schedules", type=_strs, metavar="LIST", help="pipeline schedules (default: the config's)")
    p.add_argument("--mbs", dest="micro_batch", type=_ints, metavar="LIST", help="micro-batch sizes (default 1,2,4,8)")
    p.add_argument("--exact-devices", action="store_true", help="use all N devices (no idle devices)")
    p.add_argument("--tp-across-nodes", action="store_true",
                   help="also try tensor-parallel sizes beyond device.devices_per_node (default: tp stays in a node)")
    p.add_argument("--ep-in-node", action="store_true",
                   help="keep each expert-parallel group (expert-tp × ep ranks) inside a node")
    p.add_argument("--sort", default=None,
                   help="comma-separated fields, '-' for descending (default: step_seconds,peak_bytes with a "
                        "time model -- a device with peak FLOP/s, e.g. device: h100-sxm -- else devices_wasted,peak_bytes)")
    p.add_argument("--all", dest="keep_all", action="store_true",
                   help="keep plans that another plan beats in both step time and peak memory (dropped by default)")
    p.add_argument("--pareto", action="store_true",
                   help="only the plans no other beats in both step time and peak memory, by peak memory")
    p.add_argument("--top", type=int, default=20, help="rows to print (0: all; default 20)")
    p.add_argument("--wide", action="store_true", help="the table unabridged: every merged alternative and "
                   f"per-stage layer list whole, no line wrapped (by default it fits {TABLE_WIDTH} columns)")
    p.add_argument("--format", choices=("table", "csv", "json", "html"), default="table",
                   help="html: the rows and a chart of peak memory against step time (the Pareto front marked)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the rows there instead of stdout")
    p.add_argument("--no-cache", action="store_true",
                   help="compile every structure afresh; do not read or write the on-disk cache")
    prog = p.add_mutually_exclusive_group()
    prog.add_argument("--progress", dest="progress", action="store_true", default=None,
                      help="progress bar on stderr (default: when stderr is a terminal)")
    prog.add_argument("--no-progress", dest="progress", action="store_false")
    p.set_defaults(func=cmd_search)


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _strs(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


# ------------------------------------------------------------------------- derive


def cmd_derive(args: argparse.Namespace) -> int:
    from ..analysis.derive import derive, explain_text, parse_keep, render_latex, render_text, render_time_text, to_dict
    from ..engine.model import load_model
    model = load_model(args.config, args.overrides)
    keep = parse_keep(model, args.keep)
    d = derive(model, keep, resolve=not args.general)
    n = len(d.stages)
    if args.stage is not None and not 0 <= args.stage < n:
        raise MemformError(f"--stage: stage {args.stage} does not exist (stages 0..{n - 1})")
    stages = [args.stage] if args.stage is not None else list(range(n))
    if args.json:
        print(json.dumps(to_dict(d, stages), indent=2))
    elif args.latex:
        sys.stdout.write(render_latex(d, stages))
    elif args.explain:
        for i in stages:
            sys.stdout.write(explain_text(model, d, i, keep, args.depth))
    elif args.time:
        sys.stdout.write(render_time_text(d, stages))
    else:
        sys.stdout.write(render_text(d, stages))
    return 0


# ------------------------------------------------------------------------- solve


def cmd_solve(args: argparse.Namespace) -> int:
    import sympy

    from ..analysis.solve import solve
    from ..engine.model import load_model
    model = load_model(args.config, args.overrides)
    sol = solve(model, args.key, limit=args.limit)
    cap = sol.capacity_bytes
    if args.json:
        print(json.dumps({
            "key": sol.key, "symbol": sol.symbol, "direction": sol.direction, "value": sol.value,
            "capacity_bytes": cap, "unbounded": sol.unbounded, "limit": sol.limit,
            "stage_peaks": sol.stage_peaks, "binding_stage": sol.binding_stage,
            "other_value": sol.other_value, "other_peaks": sol.other_peaks,
            "closed_form": None if sol.closed_form is None else sympy.sstr(sol.closed_form),
            "continuous": [str(r) for r in sol.continuous],
            "bytes_per_unit": None if sol.derivative is None else str(sol.derivative),
            "assumptions": sol.assumptions, "admissible": sol.admissible, "notes": sol.notes,
            "refused_value": sol.refused_value, "refused_by": sol.refused_by, "refused_values": sol.refused_values,
        }, indent=2))
        return 0 if sol.value is not None else 1
    name = model.structure.name
    x = sol.symbol
    if sol.value is None:
        where = f"in 1..{sol.limit}" if sol.direction == "smallest" else "at all (it only grows from the smallest value)"
        print(f"{name}: nothing fits {human_bytes(cap)}: no {sol.key} ({x}) fits {where}")
        if sol.other_value is not None:
            peak = max(sol.other_peaks)
            print(f"  {'even at' if sol.direction == 'largest' else 'at'} {x} = {sol.other_value} stage "
                  f"{sol.binding_stage} needs {human_bytes(peak)} ({peak} bytes) > {human_bytes(cap)}")
        for n in sol.notes:
            print(f"  note: {n}")
        return 1
    print(f"{name}: {sol.direction} {sol.key} ({x}) that fits {human_bytes(cap)}: {sol.value}")
    peak = max(sol.stage_peaks)
    print(f"  at {x} = {sol.value}: peak {human_bytes(peak)} ({peak} bytes), stages " +
          ", ".join(human_bytes(p) for p in sol.stage_peaks))
    if sol.unbounded:
        print(f"  every value up to --max {sol.limit} fits: the peak does not grow without bound in {x}")
    elif sol.other_value is not None:
        op = peak_other = max(sol.other_peaks)
        print(f"  binding stage: {sol.binding_stage} ({x} = {sol.other_value} would need "
              f"{human_bytes(op)} = {peak_other} bytes on stage {sol.binding_stage})")
    else:
        print(f"  binding stage: {sol.binding_stage}")
    if sol.refused_value is not None:
        vals = sol.refused_values
        which = ", ".join(map(str, vals)) if len(vals) <= 4 else f"{vals[0]} ... {vals[-1]} ({len(vals)} values)"
        print(f"  shaped by requirements: memory alone would allow {x} = {sol.refused_value}; {x} = {which} "
              f"{'is' if len(vals) == 1 else 'are'} refused: " + "; ".join(sol.refused_by))
    if sol.closed_form is not None:
        print(f"  stage {sol.binding_stage} peak in {x}: {sympy.sstr(sol.closed_form)}")
        if sol.continuous:
            bound = ", ".join(f"{float(r):.6g}" for r in sol.continuous)
            print(f"  peak = capacity at {x} = {bound} (continuous solution of the closed form)")
        if sol.derivative is not None:
            print(f"  d peak / d {x} at {sol.value}: {human_bytes(float(sol.derivative))} per unit "
                  f"({sympy.sstr(sol.derivative)} bytes)")
        if sol.assumptions:
            from ..engine.symbolic import SHOWN_ASSUMPTIONS, assumption_lines
            for line in assumption_lines(sol.assumptions, "  closed form valid where:", "    ",
                                         shown=None if args.assumptions else SHOWN_ASSUMPTIONS,
                                         domain=(x, sol.admissible) if sol.admissible else None):
                print(line)
    for n in sol.notes:
        print(f"  note: {n}")
    return 0


# ------------------------------------------------------------------------- sensitivity


def cmd_sensitivity(args: argparse.Namespace) -> int:
    import sympy

    from ..analysis.solve import sensitivity
    from ..engine.model import load_model
    model = load_model(args.config, args.overrides)
    results = []
    for name in args.wrt:
        key, sym, rows, assumptions = sensitivity(model, name)
        results.append((key, sym, rows, assumptions))
    if args.json:
        print(json.dumps([{
            "key": key, "symbol": sym.name, "value": str(model.bound.values[sym]),
            "assumptions": assumptions,
            "stages": [{"stage": r.stage, "derivative": sympy.sstr(r.derivative), "bytes_per_unit": str(r.value),
                        "step_bytes": r.step} for r in rows]} for key, sym, rows, assumptions in results],
            indent=2))
        return 0
    for key, sym, rows, assumptions in results:
        v = model.bound.values[sym]
        print(f"{model.structure.name}: sensitivity of each stage's peak to {key} ({sym} = {v})")
        print(f"{'stage':>5}  {'d peak/d ' + sym.name:>22}  {'peak(' + sym.name + '+1) - peak':>22}  closed form")
        for r in rows:
            step = "" if r.step is None else f"{human_bytes(r.step)}"
            print(f"{r.stage:5d}  {human_bytes(float(r.value)) + ' / unit':>22}  {step:>22}  "
                  f"{sympy.sstr(r.derivative, order='grlex')}")
        if assumptions:
            from ..engine.symbolic import SHOWN_ASSUMPTIONS, assumption_lines
            for line in assumption_lines(assumptions, shown=None if args.assumptions else SHOWN_ASSUMPTIONS):
                print(line)
        print()
    return 0


# ------------------------------------------------------------------------- search


def cmd_search(args: argparse.Namespace) -> int:
    from ..analysis.search import FIELDS, TIME_FIELDS, StderrBar, default_space, pareto_front, rank, search
    from ..engine.model import load_model
    model = load_model(args.config, args.overrides)
    space = default_space(model, args.devices, tp=args.tp, pp=args.pp, vpp=args.vpp, cp=args.cp, ep=args.ep,
                          zero=args.zero, recompute=args.recompute, schedules=args.schedules,
                          micro_batch=args.micro_batch, exact_devices=args.exact_devices,
                          tp_across_nodes=args.tp_across_nodes, ep_in_node=args.ep_in_node)
    sort_keys = None if args.sort is None else [k.strip() for k in args.sort.split(",") if k.strip()]
    rank([], sort_keys or [])  # validate the fields before the (long) search
    result = search(model, space, progress=StderrBar(args.progress), cache=not args.no_cache)
    top = None if args.top == 0 else args.top
    if args.pareto:
        if not result.timed:
            raise MemformError("--pareto needs a time model: give the config a device with peak FLOP/s "
                               "(e.g. --set device=h100-sxm; presets: configs/devices/)")
        listed = sorted(pareto_front(result.plans(sort_keys, keep_all=True)), key=lambda r: r["peak_bytes"])
    else:
        listed = result.plans(sort_keys, keep_all=args.keep_all)
    shown = listed[:top] if top else listed
    total = len(result)
    st = result.stats
    if st.valid == 0:  # not "too big" but "impossible": say why, as for any bad input
        reasons = "; ".join(f"{n} structure(s): {r}" for r, n in st.structures_skipped.items())
        raise MemformError(f"no valid strategy for {args.devices} devices: every candidate was refused"
                           + (f" ({reasons})" if reasons else " by the formula files' requirements"))
    fields = [f for f in FIELDS if not (f == "cp" and space.cp is None) and not (f == "ep" and space.ep is None)
              and not (f == "zero" and space.zero is None) and not (f in TIME_FIELDS and not result.timed)
              and not (f == "equivalent" and not any(r["equivalent"] for r in shown))]
    if args.format == "json":
        text = json.dumps({"model": model.structure.name, "devices": args.devices,
                           "capacity_bytes": result.capacity_bytes,
                           "stats": {"structures": st.structures, "structures_skipped": st.structures_skipped,
                                     "candidates": st.candidates, "valid": st.valid, "fitting": st.fitting,
                                     "compile_seconds": round(st.compile_seconds, 4),
                                     "evaluate_seconds": round(st.evaluate_seconds, 4)},
                           "ranking": list(sort_keys or result.default_sort), "timed": result.timed,
                           "rows": [{**{f: r[f] for f in fields}, **({"why": r["why"]} if "why" in r else {})}
                                    for r in shown]}, indent=2) + "\n"
    elif args.format == "html":
        from ..report.search import render_search_html
        everything = result.plans(sort_keys, None, keep_all=True)
        text = render_search_html(model, args.devices, result, shown, everything, fields)
    elif args.format == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(shown)
        text = buf.getvalue()
    else:
        text = _table(model.structure.name, args.devices, result, shown, total, fields, len(listed), wide=args.wide)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            raise MemformError(f"--output: cannot write {args.output}: {exc}") from None
        print(f"wrote {len(shown)} of {total} fitting strategies to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0 if total else 1


#: the search table fits a terminal this wide (``--wide``: unabridged)
TABLE_WIDTH = 100


def _fit(text: str, width: int) -> str:
    """A comma-separated cell cut at a comma to ``width`` characters, saying how many entries it left
    out (``a, b, +3 more``)."""
    if len(text) <= width:
        return text
    parts = [p.strip() for p in text.split(",")]
    for keep in range(len(parts) - 1, 0, -1):
        cut = ",".join(parts[:keep]) + f", +{len(parts) - keep} more"
        if len(cut) <= width:
            return cut
    return f"{len(parts)} entries" if len(parts) > 1 else text[: max(1, width - 1)] + "…"


def _table(name: str, devices: int, result: Any, shown: list[dict[str, Any]], total: int,
           fields: list[str], listed: int | None = None, wide: bool = False) -> str:
    import textwrap

    from ..analysis.search import FAR_FROM_BEST, TIE_TOLERANCE

    st = result.stats
    cols = [f for f in fields if f not in ("peak_bytes", "headroom_bytes", "schedule")
            and not (f == "stage_layers" and not any(r[f] for r in shown))]
    head = {"micro_batch_size": "mbs", "num_micro_batches": "m", "devices_used": "used",
            "devices_wasted": "idle", "peak_gib": "peak GiB", "peak_stage": "stage", "recompute": "recompute",
            "step_seconds": "step s", "mfu": "MFU %", "tokens_per_second": "tokens/s",
            "equivalent": "same memory and time with"}

    def cell(f: str, v: Any) -> str:
        if v is None:
            return "-"
        if f == "step_seconds":  # fixed-point: 12,650 s reads as a step, 1.265e+04 does not
            return f"{v:.4g}" if v < 100 else f"{v:,.0f}"
        if f == "mfu":
            return f"{100 * v:.1f}"
        if f == "tokens_per_second":
            return f"{v:,.0f}"
        return str(v)

    shown = [{**r, **{f: cell(f, r[f]) for f in cols}} for r in shown]
    sep, below = "  ", []
    if not wide:
        # within TABLE_WIDTH: one space between columns, no used/idle columns when no plan leaves a device
        # idle, and the per-stage layer lists and merged alternatives on an indented line under their row,
        # cut at a comma (--wide, --format json/csv give them whole)
        sep = " "
        if all(str(r.get("devices_wasted", "0")) == "0" for r in shown):
            cols = [f for f in cols if f not in ("devices_used", "devices_wasted")]
        below = [f for f in ("stage_layers", "equivalent") if f in cols]
        cols = [f for f in cols if f not in below]
    widths = {f: max(len(head.get(f, f)), *(len(str(r[f])) for r in shown)) if shown else len(head.get(f, f))
              for f in cols}
    prose = [f"{name}: {total} of {st.valid} valid strategies fit {human_bytes(result.capacity_bytes)} on "
             f"{devices} devices ({st.evaluated} candidates over {st.structures} structures; "
             f"compile {st.compile_seconds:.2f} s, evaluate {st.evaluate_seconds:.3f} s)"]
    if st.structures_skipped:
        skipped = sum(st.structures_skipped.values())
        prose.append(f"skipped {skipped} structure(s): " + "; ".join(
            f"{reason} ({count})" for reason, count in st.structures_skipped.items()))
    if result.timed:
        prose.append("ranked by estimated step time (formulas/time.mf; memory breaks ties); rows with the same "
                     "memory and time merged; plans slower and bigger than another, or more than "
                     f"{FAR_FROM_BEST:g}× slower than the fastest, dropped (--all keeps them); plans within "
                     f"{TIE_TOLERANCE:.0%} of the fastest step ranked simplest first and none of them dropped for "
                     "being slower (those a no less simple plan beats in both listed after the others); MFU of the "
                     "dense BF16 peak")
    if shown and shown[0].get("why"):
        prose.append(f"first row: {shown[0]['why']}")
    beaten = [i for i, r in enumerate(shown, 1) if i > 1 and r.get("why", "").startswith("within")]
    if beaten:
        where = f"row {beaten[0]}" if len(beaten) == 1 else f"rows {beaten[0]}-{beaten[-1]}"
        prose.append(f"{where}: within {TIE_TOLERANCE:.0%} of the fastest step, which the time model cannot tell "
                     "apart, but beaten in both step time and peak memory by a no less simple plan above (the "
                     "reason under each)")
    wrap = (lambda t: [t]) if wide else \
        textwrap.TextWrapper(TABLE_WIDTH, subsequent_indent="  ", break_on_hyphens=False).wrap
    lines = [line for t in prose for line in wrap(t)]
    if not shown:
        lines.append("nothing fits")
        return "\n".join(lines) + "\n"
    lines.append(sep.join(head.get(f, f).rjust(widths[f]) if f != "equivalent" else head[f] for f in cols))
    label = {"stage_layers": "layers per stage", "equivalent": "same memory and time with"}
    for r in shown:
        lines.append(sep.join(str(r[f]).rjust(widths[f]) if f != "equivalent" else str(r[f])
                              for f in cols).rstrip())
        extra = [(f, str(r[f])) for f in below if r[f] not in ("", "-", None)]
        if r is not shown[0] and r.get("why"):
            lines += [f"    {r['why']}"] if wide else textwrap.wrap(r["why"], TABLE_WIDTH, initial_indent="    ",
                                                                     subsequent_indent="    ", break_on_hyphens=False)
        if extra:
            text = "; ".join(f"{label[f]}: {v}" for f, v in extra)
            if len(text) > TABLE_WIDTH - 4:
                room = TABLE_WIDTH - 4 - sum(len(label[f]) + 4 for f, _ in extra)
                text = "; ".join(f"{label[f]}: {_fit(v, max(12, room // len(extra)))}" for f, v in extra)
            lines.append("    " + text)
    listed = total if listed is None else listed
    tail = []
    if listed > len(shown):
        tail.append(f"... {listed - len(shown)} more (--top 0 for all)")
    if listed < total:
        tail.append(f"({total - listed} of the {total} fitting strategies are merged into an equivalent row or "
                    f"beaten in both step time and peak memory" + (f" (outside {TIE_TOLERANCE:.0%} of the fastest "
                    f"step, or by a variant of their own layout)" if result.timed else "")
                    + (f", or take over {FAR_FROM_BEST:g}× the "
                    f"fastest step" if result.timed else "") + ": --all lists them)")
    lines += [line for t in tail for line in wrap(t)]
    return "\n".join(lines) + "\n"
