"""``--model FILE`` of the formats that describe training only (deepspeed, torchtitan).

A ds_config.json or a torchtitan job config says how a model is trained, not (always) what it is:
``--model`` names the model, as a Hugging Face ``config.json`` (read by the ``hf`` importer into
the same draft, its warnings prefixed with the file's name) or a memform config YAML, whose
mapping is returned for the importer to take what it needs (the ``model:`` section's shape; the
strategy is the importer's own source's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml

from ..errors import MemformError, read_text
from .draft import Draft, describe


def read_model_file(model: Path, draft: Draft, given: Mapping[str, Any] | set[str]) -> dict | None:
    """None after reading a Hugging Face config.json into ``draft``; else the memform YAML's mapping
    (checked to hold a ``model:`` section)."""
    if model.suffix == ".json":
        from . import hf

        before = len(draft.warnings)
        hf.convert(model, draft, given)
        draft.warnings[before:] = [f"{model.name}: {w}" for w in draft.warnings[before:]]
        return None
    text = read_text(model, "model config")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MemformError(f"{model}: YAML syntax error: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise MemformError(f"{model}: --model must be a memform config with a 'model:' section "
                           f"(or a Hugging Face config.json), got {describe(data)}")
    return data
