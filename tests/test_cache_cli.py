"""The cache directory: ``memform cache info|clear``, its size limit and ``--no-cache``.

Expected figures are the files this test writes itself (their sizes from the file system)."""

from __future__ import annotations

import os

from cli_helpers import run_memform

from memform import cachedir


def _env(tmp_path, **extra) -> dict[str, str]:
    return {cachedir.CACHE_ENV: str(tmp_path / "cache"), **extra}


def test_info_lists_what_an_estimate_left_and_clear_empties_it(tmp_path):
    assert run_memform("estimate", "configs/llama2-7b.yaml", env_extra=_env(tmp_path)).returncode == 0
    checked = [f for f in (tmp_path / "cache" / "checked").rglob("*") if f.is_file()]
    assert checked  # the program the config reads passed the checker, recorded once
    # (the bundled formula files' syntax trees come from the installation's store, memform/lang/bundled.py,
    # not from the user's cache)
    assert not list((tmp_path / "cache" / "syntax").rglob("*.pickle"))
    info = run_memform("cache", "info", env_extra=_env(tmp_path))
    assert info.returncode == 0, info.stderr
    line = next(x for x in info.stdout.splitlines() if x.split()[:1] == ["checked"])
    assert int(line.split()[1]) == len(checked)
    assert str(tmp_path / "cache") in info.stdout and "256.00 MiB" in info.stdout
    cleared = run_memform("cache", "clear", env_extra=_env(tmp_path))
    total = cleared.stdout.split()[1]
    assert cleared.returncode == 0 and int(total) >= len(checked)
    assert not [f for f in (tmp_path / "cache").rglob("*") if f.is_file()]


def test_a_write_keeps_the_cache_within_its_limit_dropping_the_oldest(tmp_path, monkeypatch):
    monkeypatch.setenv(cachedir.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(cachedir.LIMIT_ENV, str(10 / 1024))  # 10 KiB
    for i in range(5):
        path = cachedir.cache_dir() / "estimate" / "aa" / f"{i}.json"
        cachedir.write_atomic(path, b"x" * 3000)
        os.utime(path, ns=(i * 10 ** 9, i * 10 ** 9))  # written in this order
    left = sorted(p.name for p in (tmp_path / "cache").rglob("*.json"))
    assert left == ["2.json", "3.json", "4.json"]  # 9,000 bytes: the two oldest went
    assert cachedir.limit_bytes() == 10 * 1024


def test_the_limit_takes_a_number_of_mib_and_falls_back_on_nonsense(monkeypatch):
    monkeypatch.setenv(cachedir.LIMIT_ENV, "1.5")
    assert cachedir.limit_bytes() == 3 * 2 ** 19
    monkeypatch.setenv(cachedir.LIMIT_ENV, "lots")
    assert cachedir.limit_bytes() == cachedir.DEFAULT_LIMIT_MIB * 2 ** 20


def test_a_bad_action_is_a_usage_error(tmp_path):
    r = run_memform("cache", "wipe", env_extra=_env(tmp_path))
    assert r.returncode == 2 and "invalid choice" in r.stderr and "Traceback" not in r.stderr
