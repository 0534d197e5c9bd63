"""The corpus of bad inputs under ``tests/bad_inputs``: each one fails with exit 2 and a clear message.

``cases.yaml`` lists every case: ``file`` (a config or formula file in that folder), optional
``args`` (the command line; default ``estimate FILE`` for YAML, ``check FILE`` for ``.mf``),
``fragment`` (text the one-paragraph error must contain), ``why`` (what is wrong, and for
regressions which bug it pinned) and ``script: true`` for the cases also run through the
real ``memform`` console script. Every case runs in-process through :func:`memform.cli.main`
(fast); the script cases prove the installed entry point behaves the same.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from memform import cli
from memform.errors import EXIT_USER_ERROR
from cli_helpers import memform_command

HERE = Path(__file__).resolve().parent / "bad_inputs"
CASES = yaml.safe_load((HERE / "cases.yaml").read_text(encoding="utf-8"))


def _args(case: dict) -> list[str]:
    if "args" in case:
        return list(case["args"])
    return ["check" if case["file"].endswith(".mf") else "estimate", case["file"]]


def _id(case: dict) -> str:
    return case["file"] if "args" not in case else f"{case['file']}:{'-'.join(case['args'][2:])}"


def test_corpus_is_large_and_complete():
    assert len(CASES) >= 40
    for case in CASES:
        assert case["fragment"] and case["why"], case
        if case["file"] != "no-such-config.yaml":
            assert (HERE / case["file"]).is_file(), case["file"]
    assert sum(1 for c in CASES if c.get("script")) >= 5


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_bad_input_in_process(case, capsys, monkeypatch):
    monkeypatch.chdir(HERE)
    code = cli.main(_args(case))
    err = capsys.readouterr().err
    assert code == EXIT_USER_ERROR, err
    assert err.startswith("memform: error: "), err
    assert case["fragment"] in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("case", [c for c in CASES if c.get("script")], ids=_id)
def test_bad_input_through_console_script(case):
    r = subprocess.run([*memform_command(), *_args(case)], cwd=HERE, capture_output=True, text=True, timeout=120)
    assert r.returncode == EXIT_USER_ERROR, r.stderr
    assert case["fragment"] in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout == ""


def test_a_requirement_on_lets_alone_names_only_its_location():
    # finetune.mf's `require not quant_on or lora_on` reads two lets and no config value: the message ends
    # with the requirement's location, without an empty "(; " in front of it (engine/model.py _check_requires)
    import memform
    from memform.errors import MemformError
    with pytest.raises(MemformError) as err:
        memform.estimate(str(Path(__file__).resolve().parent.parent / "configs" / "llama2-7b.yaml"),
                         {"lora.base_quant": "nf4"})
    msg = str(err.value)
    assert "(requirement at " in msg and "finetune.mf" in msg and "(; " not in msg, msg
