"""``memform ARGS`` in this process (issue 32: the suite within its time budget).

A real console-script run costs a Python start and memform's imports (0.3-1 CPU-s); tests that check what a
command prints or its exit status for one config can call :func:`memform.cli.main` in the test's own process
instead and get the same :class:`subprocess.CompletedProcess` shape (returncode, stdout, stderr). Every
command keeps real console-script tests (tests/test_cli.py, tests/test_fuzz_commands.py, ...); a
traceback here becomes exit status 1 with the traceback on stderr, as the console script would print it.
Not for ``--no-cache`` (it switches the cache off for the rest of the process).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import traceback
from pathlib import Path
from typing import Any

from cli_helpers import ROOT


@contextlib.contextmanager
def _chdir(path: Path):
    """contextlib.chdir, which Python 3.10 (pyproject's requires-python) lacks."""
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def _stream() -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", newline="\n", write_through=True)


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    return stream.buffer.getvalue().decode("utf-8")


def memform_in_process(*args: Any, cwd: Path = ROOT, env_extra: dict[str, str] | None = None
                       ) -> subprocess.CompletedProcess:
    """What ``run_memform(*args)`` (tests/cli_helpers.py) returns, from ``memform.cli.main`` in this process."""
    assert "--no-cache" not in args, "--no-cache switches the cache off process-wide: use run_memform"
    from memform import cli

    argv = [str(a) for a in args]
    out, err = _stream(), _stream()
    saved = {k: os.environ.get(k) for k in (env_extra or {})}
    try:
        os.environ.update(env_extra or {})
        with _chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(argv)
            except SystemExit as exc:  # argparse's usage errors (2) and --help (0)
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except Exception:  # noqa: BLE001 (what the console script would print)
                traceback.print_exc()
                code = 1
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return subprocess.CompletedProcess(["memform", *argv], code, _text(out), _text(err))
