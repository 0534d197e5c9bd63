"""Running the real ``memform`` console script from tests (one helper for every test file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sets_keys_of_another_profile(config: Path, profile: str) -> bool:
    """Whether the bundled ``config`` has a section of another framework profile's own keys (e.g. a
    ``megatron:`` section): it describes a job in that framework and does not load under ``profile``."""
    import yaml

    from memform.engine.config import frameworks

    sections = set(yaml.safe_load(config.read_text()))
    return any(other in sections for other in frameworks() if other != profile)


def memform_command() -> list[str]:
    """The installed console script next to this interpreter, else ``python -m memform``."""
    exe = Path(sys.executable).with_name("memform")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "memform"]


def run_memform(*args: str, cwd: Path = ROOT, timeout: int = 300,
                env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra} if env_extra else None
    return subprocess.run(memform_command() + [str(a) for a in args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)
