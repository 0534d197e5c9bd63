"""Running the real ``memform`` console script from tests (one helper for every test file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def memform_command() -> list[str]:
    """The installed console script next to this interpreter, else ``python -m memform``."""
    exe = Path(sys.executable).with_name("memform")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "memform"]


def run_memform(*args: str, cwd: Path = ROOT, timeout: int = 300,
                env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra} if env_extra else None
    return subprocess.run(memform_command() + [str(a) for a in args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)
