"""Command line entry point: the parser, ``memform estimate | check``, and the error boundary.

Other command groups live in sibling modules and register themselves (:data:`EXTENSIONS`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from ..errors import EXIT_USER_ERROR, MemformError
from .common import add_config_args

#: modules that add sub-commands: each defines ``register(subparsers)`` and sets
#: ``func=`` on its parser(s) (one module per feature keeps this file small)
EXTENSIONS: list[str] = ["memform.cli.reports", "memform.cli.imports", "memform.cli.analysis", "memform.cli.keys",
                         "memform.cli.cache", "memform.cli.whatif"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memform", description="Per-stage training memory of LLMs, "
                                     "from declarative formula files.")
    from .. import __version__
    parser.add_argument("--version", action="version", version=f"memform {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("estimate", help="per-stage peak memory table")
    add_config_args(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true",
                     help="machine-readable numbers (with --symbolic: also closed forms and assumptions)")
    out.add_argument("--explain", type=int, metavar="STAGE", help="every layer's contribution on one stage")
    p.add_argument("--symbolic", action="store_true", help="closed form of each stage's peak")
    p.add_argument("--assumptions", action="store_true",
                   help="with --symbolic: every condition the closed forms hold under (by default the first 8)")
    p.add_argument("--wide", action="store_true",
                   help="the table unabridged: each figure with its unit, every layer group on one line "
                        "(by default it fits 100 columns: memform.report.table.WIDTH)")
    p.add_argument("--no-cache", action="store_true",
                   help="do not read or write the on-disk cache of compiled structures")
    p.set_defaults(func=cmd_estimate)

    p = sub.add_parser("check", help="parse and validate formula files (the author's lint)")
    p.add_argument("files", nargs="+", help=".mf files, loaded in order (later ones override)")
    p.set_defaults(func=cmd_check)

    import importlib
    for name in EXTENSIONS:
        importlib.import_module(name).register(sub)
    return parser


def cmd_estimate(args: argparse.Namespace) -> int:
    """The table and ``--json`` numbers come from the fast path (a compiled structure on a cache hit,
    else the interpreter's numbers from the numeric evaluator: one estimate does not repay a compile;
    neither imports sympy); closed forms (``--symbolic``, ``--explain``) from the symbolic interpreter."""
    if args.symbolic and args.explain is not None:
        raise MemformError("--symbolic and --explain: choose one")
    est = None
    if not args.symbolic and args.explain is None:
        from ..fastpath.fastcache import fast_estimate
        est = fast_estimate(args.config, args.overrides, cache=not args.no_cache, compile=False)
    if est is None:
        from ..engine.model import estimate
        est = estimate(args.config, args.overrides)
    if args.json:
        print(json.dumps(est.to_dict(symbolic=args.symbolic), indent=2, sort_keys=True))
    elif args.symbolic or args.explain is not None:
        from ..report.render import render
        if args.symbolic:
            write_text(render("symbolic.txt.j2", est, every_assumption=args.assumptions))
        elif not 0 <= args.explain < len(est.stages):
            raise MemformError(f"--explain: stage {args.explain} does not exist (stages 0..{len(est.stages) - 1})")
        else:
            write_text(render("explain.txt.j2", est, stage=est.stages[args.explain]))
    else:
        from ..report.table import render_table
        write_text(render_table(est, wide=args.wide))
    return 0


def write_text(text: str) -> None:
    """``text`` on stdout ending in one newline: the shell's prompt must not land on its last line
    (templates and the table end without one)."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def cmd_check(args: argparse.Namespace) -> int:
    from ..lang.loader import EVERY_KEY, load_program
    prog = load_program(args.files, config=EVERY_KEY)   # the lint takes every `include ... when KEY`
    blocks = len(prog.blocks)
    print(f"ok: {len(prog.files)} file(s), {len(prog.bindings)} bindings, {len(prog.lets)} lets, "
          f"{blocks} blocks, {len(prog.schedules())} schedules")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `memform import megatron run.sh -- ARG ...`: what follows `--` is the launch script's own argument
    # list, as a shell would pass it (argparse would take the words for more files)
    tail = None
    if argv[:1] == ["import"] and "--" in argv:
        cut = argv.index("--")
        argv, tail = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if tail is not None:
        args.script_tail = tail
    if getattr(args, "no_cache", False):
        from ..cachedir import set_enabled
        set_enabled(False)
    try:
        return args.func(args)
    except MemformError as exc:
        print(f"memform: error: {exc.render()}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
