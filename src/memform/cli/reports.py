"""Sub-commands for people-facing output: ``memform report | plot | compare``.

Registered through :data:`memform.cli.EXTENSIONS`; each command is a thin shell over
:mod:`memform.report.render`, :mod:`memform.report.plot` and :mod:`memform.analysis.compare`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import MemformError
from .common import add_config_args, emit

_SUFFIX_FORMAT = {".md": "md", ".markdown": "md", ".html": "html", ".htm": "html", ".tex": "tex", ".txt": "txt"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="a whole report (Markdown, self-contained HTML, or LaTeX)",
                       description="Render a report from the bundled Jinja2 templates or your own (--template).")
    add_config_args(p)
    p.add_argument("--format", choices=("md", "html", "tex"), default=None,
                   help="output format (default: from -o's suffix, else md)")
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="write here instead of stdout")
    p.add_argument("--template", default=None, metavar="FILE.j2",
                   help="render your own Jinja2 template with the report context (see README 'Reports')")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("plot", help="per-stage stacked bars as PNG, SVG or PDF (needs matplotlib)")
    add_config_args(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="stages.png, stages.svg or stages.pdf")
    p.add_argument("--dpi", type=int, default=150, help="resolution of PNG output (default 150)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("compare", help="several configs, variants of one, or a sweep, side by side per stage",
                       description="Estimate every variant and show them per stage side by side, with each "
                                   "variant's bytes minus the first's (the baseline). Variants, lettered A, B, "
                                   "C, ...: every CONFIG, then every --variant (the first config with those "
                                   "overrides); --vary then makes one variant per value of each of them "
                                   "(several --vary: every combination). A variant that fails is shown with "
                                   "its error; exit status 2 only when every variant fails.")
    p.add_argument("configs", nargs="+", metavar="CONFIG", help="one or more configs (each is a variant)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key in every variant (repeatable)")
    p.add_argument("--variant", dest="variants", action="append", default=[], metavar="'KEY=VALUE,...'",
                   help="add a variant: the first config with these comma-separated overrides (repeatable; "
                        "list values in brackets, e.g. training.recompute=[full,none])")
    p.add_argument("--set-a", action="append", default=[], metavar="KEY=VALUE",
                   help="override in variant A only (repeatable)")
    p.add_argument("--set-b", action="append", default=[], metavar="KEY=VALUE",
                   help="override in variant B only; with one config and no --variant, B is that config again")
    p.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="sweep a key: one variant per value, for every variant above (repeatable: the "
                        "cartesian product)")
    p.add_argument("--free-devices", action="store_true",
                   help="let the device count follow the degrees; by default a variant that changes tp, pp or cp "
                        "and not dp keeps its config's devices (its dp is the devices over tp × pp × cp)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="machine-readable output (every estimate + deltas)")
    out.add_argument("--format", choices=("txt", "md", "html", "tex"), default=None,
                     help="output format (default: from -o's suffix, else txt for the terminal)")
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="write here instead of stdout; .png, .svg or .pdf draws the grouped per-stage chart "
                        "(needs matplotlib)")
    p.add_argument("--dpi", type=int, default=150, help="resolution of PNG output (default 150)")
    p.add_argument("--template", default=None, metavar="FILE.j2", help="render your own comparison template")
    p.set_defaults(func=cmd_compare)


def _format(fmt: str | None, output: str | None, default: str, allowed: tuple[str, ...]) -> str:
    """The output format: ``--format``, else ``-o``'s suffix (an unknown suffix is an error rather
    than a file of another format under that name), else ``default``."""
    if fmt is not None:
        return fmt
    if output and output != "-":
        suffix = Path(output).suffix.lower()
        guess = _SUFFIX_FORMAT.get(suffix)
        if guess in allowed:
            return guess
        known = ", ".join(s for s, f in _SUFFIX_FORMAT.items() if f in allowed)
        shown = f"suffix {suffix!r}" if suffix else "no suffix"
        raise MemformError(f"-o {output}: {shown} is not a supported output format; use one of {known} "
                           f"(or name the format with --format)")
    return default


def cmd_report(args: argparse.Namespace) -> int:
    from ..engine.model import estimate
    from ..report.render import render_report
    est = estimate(args.config, args.overrides)
    fmt = _format(args.format, args.output, "md", ("md", "html", "tex"))
    emit(render_report(est, fmt, args.template), args.output)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from ..engine.model import estimate_numbers
    from ..report.plot import plot_stages
    if args.dpi <= 0:
        raise MemformError(f"--dpi must be positive, got {args.dpi}")
    est = estimate_numbers(args.config, args.overrides)  # a picture of numbers: no closed form
    path = plot_stages(est, args.output, dpi=args.dpi)
    print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from ..analysis.compare import compare
    from ..report.plot import FORMATS as PICTURES
    from ..report.render import render_comparison
    picture = (args.output and not args.json and args.format is None and args.template is None
               and Path(args.output).suffix.lower().lstrip(".") in PICTURES)
    if picture and args.dpi <= 0:
        raise MemformError(f"--dpi must be positive, got {args.dpi}")
    cmp = compare(*args.configs, overrides=args.overrides, set_a=args.set_a, set_b=args.set_b,
                  variants=args.variants, vary=args.vary, free_devices=args.free_devices)
    for v in cmp.failed if (args.json or (args.output and args.output != "-")) else []:
        print(f"memform: variant {v.key} ({v.label}) failed: {v.error}", file=sys.stderr)
    if args.json:
        emit(json.dumps(cmp.to_dict(), indent=2, sort_keys=True) + "\n", args.output)
        return 0
    if picture:
        from ..report.plot import plot_comparison
        print(f"wrote {plot_comparison(cmp, args.output, dpi=args.dpi)}", file=sys.stderr)
        return 0
    fmt = _format(args.format, args.output, "txt", ("txt", "md", "html", "tex"))
    emit(render_comparison(cmp, fmt, args.template), args.output)
    return 0
