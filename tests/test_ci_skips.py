"""Under CI=true a test skipped for a dependency CI installs fails the run (tests/conftest.py).

Each case runs pytest in a subprocess on a two-file project: a copy of this suite's conftest.py and a
test that skips with the given reason."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _run(tmp_path: Path, reason: str, ci: bool) -> subprocess.CompletedProcess:
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_one.py").write_text(
        "import pytest\n\n\ndef test_ok():\n    pass\n\n\n"
        f"def test_needs_something():\n    pytest.skip({reason!r})\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-o", "addopts=", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("reason, ci, code", [
    ("playwright is not installed (pip install playwright)", True, 1),   # the test extra installs it
    ("no Chromium at /usr/bin/chromium (apt-get install chromium)", True, 1),  # .ci/run installs it
    ("playwright is not installed (pip install playwright)", False, 0),  # locally a skip stays a skip
    ("torchtitan is not installed (pip install torchtitan==0.3.0)", True, 0),  # not in the test extra
    ("megatron-core not installed: pip install ...", True, 0),
])
def test_a_skip_fails_ci_only_for_what_ci_installs(tmp_path, reason, ci, code):
    r = _run(tmp_path, reason, ci)
    assert r.returncode == code, r.stdout + r.stderr
    if code:
        assert "skipped for something CI installs" in r.stdout and "test_needs_something" in r.stdout
