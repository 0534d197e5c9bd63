"""``memform whatif CONFIG -o whatif.html``: the interactive what-if page (:mod:`memform.report.whatif`).

Registered through :data:`memform.cli.main.EXTENSIONS`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import MemformError
from .common import add_config_args, emit


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("whatif", help="an interactive what-if HTML page (inputs for the numeric symbols, "
                                      "exact numbers computed in the page)",
                       description="Write one self-contained HTML page carrying every stage's closed forms as "
                                   "exact JavaScript, with inputs for the parallel degrees, micro-batching and "
                                   "sequence length and selects for precomputed structural variants.")
    add_config_args(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE.html", help="the page to write ('-': stdout)")
    p.add_argument("--vary", action="append", default=[], metavar="KEY",
                   help="also offer this integer config key as an input (e.g. model.hidden_size; repeatable)")
    p.add_argument("--pp", default=None, metavar="N,N,...",
                   help="pipeline sizes to precompute (default: the config's, half, double and 1)")
    p.add_argument("--vpp", default=None, metavar="N,N,...", help="virtual chunks per stage (default: the config's)")
    p.add_argument("--schedule", default=None, metavar="NAME,...", help="pipeline schedules (default: the config's)")
    p.add_argument("--recompute", default=None, metavar="MODE,...",
                   help="recompute modes (default: every mode the formula files offer)")
    p.add_argument("--zero", default=None, metavar="N,N,...", help="ZeRO stages (default: 0,1,2,3 where bound)")
    p.add_argument("--no-cache", action="store_true",
                   help="compile every variant afresh; do not read or write the on-disk cache")
    p.set_defaults(func=cmd_whatif)


def cmd_whatif(args: argparse.Namespace) -> int:
    from ..report.whatif import int_list, str_list, whatif_html
    output = args.output
    if output != "-" and Path(output).suffix.lower() not in (".html", ".htm"):
        raise MemformError(f"-o {output}: the what-if page is HTML; name the file .html or .htm")
    text = whatif_html(args.config, args.overrides, vary=args.vary, pp=int_list(args.pp, "--pp"),
                       vpp=int_list(args.vpp, "--vpp"), schedules=str_list(args.schedule),
                       recompute=str_list(args.recompute), zero=int_list(args.zero, "--zero"),
                       cache=not args.no_cache)
    emit(text, output, show_size=True)
    return 0
