"""Wheel build hook: the bundled formula files' syntax trees, parsed once at build time
(``memform/_parsed/formulas.pickle``, read by :mod:`memform.lang.bundled`), so that an installed memform's
first run parses nothing. A source checkout (and an editable install) writes the same file on first use."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class ParsedFormulas(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel" or version == "editable":
            return
        sys.path.insert(0, str(Path(self.root) / "src"))
        try:
            from memform.lang import bundled
            from memform.lang.parser import parse_text
            target = Path(tempfile.mkdtemp(prefix="memform-parsed-")) / "formulas.pickle"
            bundled.build(target, parse_text)
        finally:
            sys.path.pop(0)
        build_data["force_include"][str(target)] = "memform/_parsed/formulas.pickle"
