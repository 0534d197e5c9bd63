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

#: the skips CI accepts: packages the README's test command does not install (each has its own install
#: line in the README: torchtitan pulls triton, about 1 GB; megatron-core's wheel says Python >= 3.12).
#: Any other skip under CI=true (torch, transformers, deepspeed, peft, playwright, Chromium, Node.js:
#: what `pip install '.[test]'` and .ci/run install) fails the run: a test that silently stopped
#: running is a test lost.
CI_MAY_SKIP = ("torchtitan is not installed", "megatron-core not installed")


def pytest_sessionfinish(session, exitstatus):
    if not os.environ.get("CI") or hasattr(session.config, "workerinput"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    lost = []
    for rep in reporter.stats.get("skipped", []):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        if not any(ok in reason for ok in CI_MAY_SKIP):
            lost.append(f"{rep.nodeid}: {reason}")
    if lost:
        reporter.ensure_newline()
        reporter.write_line(f"CI=true: {len(lost)} test(s) skipped for something CI installs (a failure here):",
                            red=True)
        for line in lost:
            reporter.write_line(f"  {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

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
