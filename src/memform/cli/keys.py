"""``memform keys``: every config key a set of formula files accepts, with type, default and doc.

The key reference is generated from the ``symbol``/``option`` declarations (plus the
interpreter's structural keys), so it cannot drift from what the loader actually checks.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..engine.config import STRUCTURAL, formula_files, normalize, read_yaml
from ..lang.loader import EVERY_KEY, load_program, resolve_formula_path
from ..lang.printer import print_expr, print_type
from ..lang.program import Program


@dataclass(frozen=True)
class KeyDoc:
    path: str
    type: str
    default: str
    doc: str
    where: str


def key_docs(program: Program) -> list[KeyDoc]:
    """One row per valid config key, sorted by path; formula bindings first claim a path."""
    rows: dict[str, KeyDoc] = {}
    for b in program.bindings.values():
        default = "required" if b.default is None else print_expr(b.default)
        unit = f" [{b.unit}]" if b.unit else ""
        rows.setdefault(b.path, KeyDoc(b.path, print_type(b.type), default, f"{b.name}: {b.doc}{unit}",
                                       str(b.loc)))
    for k in STRUCTURAL:
        if k.path not in rows:
            typ = print_type(k.type) if k.type is not None else "-"
            default = "-" if k.default is None else str(k.default)
            rows[k.path] = KeyDoc(k.path, typ, default, k.doc, "memform (structural)")
    return [rows[p] for p in sorted(rows)]


def formulas_of(target: str | None, formulas: list[str]) -> list[Path]:
    """The files whose keys to list: ``--formulas``, else the config's (framework profile included)."""
    if formulas:
        return [resolve_formula_path(f, Path.cwd()) for f in formulas]
    if target is None:
        return [resolve_formula_path(f, None) for f in formula_files(normalize({}, None))]
    source = Path(target)
    data = normalize(read_yaml(source), source)
    return [resolve_formula_path(str(n), source.parent) for n in formula_files(data)]


def cmd_keys(args: argparse.Namespace) -> int:
    # every key a config could set: what the files include `when` a key is set too
    rows = key_docs(load_program(formulas_of(args.config, args.formulas), config=EVERY_KEY))
    if args.markdown:
        print("| key | type | default | meaning |")
        print("| --- | --- | --- | --- |")
        for r in rows:
            print(f"| `{r.path}` | {r.type.replace('|', '/')} | `{r.default}` | {r.doc} |")
        return 0
    width = max(len(r.path) for r in rows)
    type_width = max(len(r.type) for r in rows)
    default_width = max(len(r.default) for r in rows)
    for r in rows:
        print(f"{r.path:<{width}}  {r.type:<{type_width}}  default {r.default:<{default_width}}  {r.doc}  "
              f"({r.where})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="list the config keys the formula files accept (type, default, doc)")
    p.add_argument("config", nargs="?", help="a config whose 'formulas:' to use (default: dense.mf)")
    p.add_argument("--formulas", nargs="+", default=[], metavar="FILE.mf", help="formula files instead")
    p.add_argument("--markdown", action="store_true", help="a Markdown table")
    p.set_defaults(func=cmd_keys)
