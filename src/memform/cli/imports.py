"""``memform import {hf,megatron,mindformers} FILE``: print (or write) a memform YAML config.

Warnings (fields memform does not use, approximations) go to stderr, one line each, and the
import continues; a missing required field or a malformed file is a MemformError (exit 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..engine.config import parse_override
from ..errors import MemformError
from ..importers import IMPORTERS, Options, import_config


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="convert a Hugging Face / Megatron-LM / MindFormers config to memform YAML",
                       description="Convert another tool's config into a memform config (YAML on stdout).")
    p.add_argument("format", choices=sorted(IMPORTERS),
                   help="hf: config.json; megatron: Megatron-LM arguments; mindformers: MindFormers YAML; "
                        "torchtitan: a torchtitan job config (train_configs/*.toml)")
    p.add_argument("file", help="the file to import")
    p.add_argument("-o", "--output", metavar="YAML", help="write the config here instead of stdout")
    p.add_argument("--devices", type=int, metavar="N",
                   help="total devices: derives parallel.dp = N / (tp × pp × cp)")
    p.add_argument("--name", help="the config's name (default: from the source)")
    p.add_argument("--model", metavar="FILE",
                   help="deepspeed: the model underneath, a memform config YAML or a Hugging Face config.json")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="set a memform key in the output, e.g. --set parallel.tp=8 (repeatable)")
    p.set_defaults(func=cmd_import)


def cmd_import(args: argparse.Namespace) -> int:
    overrides = dict(parse_override(o) for o in args.overrides)
    draft = import_config(args.format, args.file, Options(devices=args.devices, name=args.name,
                                                          overrides=overrides, model=args.model))
    for message in draft.warnings:
        print(f"memform: warning: {args.file}: {message}", file=sys.stderr)
    text = draft.to_yaml()
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise MemformError(f"cannot write {args.output}: {exc}") from None
    else:
        sys.stdout.write(text)
    return 0
