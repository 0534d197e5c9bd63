"""Shared fixtures: paths to the bundled configs and a small dense model as a dict."""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

# CI (CI=true) explores the same examples on every run, so a submission's result does not depend on
# luck; locally hypothesis keeps drawing fresh examples (and remembers failures in .hypothesis/).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# compiled fast-path entries go to a fresh directory per test session (inherited by the CLI
# subprocesses), never to the user's own cache
if "MEMFORM_CACHE_DIR" not in os.environ:
    os.environ["MEMFORM_CACHE_DIR"] = tempfile.mkdtemp(prefix="memform-test-cache-")

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"

#: GPT-3 175B shape (Brown et al. 2020, Table 2.1), no parallelism, Korthikanti's setting
GPT3 = {
    "name": "gpt3",
    "model": {"hidden_size": 12288, "num_heads": 96, "num_layers": 96, "ffn_hidden_size": 49152,
              "vocab_size": 51200, "seq_length": 2048, "activation": "gelu", "norm": "layernorm",
              "dropout": True, "position_embedding": "learned"},
    "parallel": {"dp": 1, "tp": 1, "pp": 1},
    "training": {"micro_batch_size": 1, "num_micro_batches": 8, "recompute": "none"},
}


@pytest.fixture
def gpt3() -> dict:
    return copy.deepcopy(GPT3)
