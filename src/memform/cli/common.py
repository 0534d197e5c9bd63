"""Argument conventions shared by every sub-command (so command modules need not import each other)."""

from __future__ import annotations

import argparse


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML config (model, parallel, training, device)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key by dotted path, e.g. --set parallel.tp=8 (repeatable)")
