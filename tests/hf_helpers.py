"""What the architecture tests share: a config.json written and imported as `memform import hf` reads it,
memform's parameter total, and transformers' own model of the same config built on the meta device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import memform
from memform.importers import Options, import_config


def write_json(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def import_hf(path: Path, **options):
    return import_config("hf", path, Options(**options))


def total_params(cfg) -> int:
    """memform's parameters over every stage of ``cfg`` (a config mapping or path)."""
    return sum(stage.param_count for stage in memform.estimate(cfg).stages)


def built_params(data: dict) -> int:
    """transformers' own model of ``data``, built on the meta device (no weights)."""
    transformers = pytest.importorskip("transformers")
    import torch
    fields = {k: v for k, v in data.items() if k not in ("architectures", "model_type")}
    cfg = transformers.AutoConfig.for_model(data["model_type"], **fields)
    with torch.device("meta"):
        return sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(cfg).parameters())
