"""What every ``memform import`` shares: exit codes, warnings, default names, ``hf DIR``, one file or several.

Runs the real console script (tests/cli_helpers.py). Expected names are the file names themselves
(the model id where the source has one: Hugging Face ``_name_or_path``, HyperParallel ``model.name``);
the models' facts are those of tests/data/importers/README.md.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from cli_helpers import ROOT, memform_command, run_memform
from cli_inprocess import memform_in_process  # memform.cli.main in this process (same output)

from memform.importers import IMPORTERS, Options, import_config, takes_several_files
from memform.importers.draft import Draft, default_name

DATA = ROOT / "tests" / "data" / "importers"
LLAMA = DATA / "llama3-8b.config.json"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# ---- exit codes ------------------------------------------------------------------------------

def test_exit_0_when_the_written_config_loads(tmp_path: Path) -> None:
    out = tmp_path / "llama.yaml"
    # the training sequence given: hf's default (4096) would otherwise be warned about (issue 31)
    r = run_memform("import", "hf", LLAMA, "--set", "model.seq_length=8192", "-o", out)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert run_memform("estimate", out).returncode == 0


def test_a_config_that_does_not_load_is_written_then_exit_2(tmp_path: Path) -> None:
    # Llama-3-8B's 32 heads do not split over tp 3 (formulas/dense.mf: parallel.tp must divide num_heads)
    out = tmp_path / "llama.yaml"
    r = run_memform("import", "hf", LLAMA, "--set", "parallel.tp=3", "--set", "model.seq_length=8192", "-o", out)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"memform: error: {out} was written but does not load")
    assert "parallel.tp must divide" in r.stderr
    assert yaml.safe_load(out.read_text())["parallel"]["tp"] == 3  # still written, for the user to fix
    e = run_memform("estimate", out)  # the same message as estimate gives
    assert e.returncode == 2 and "parallel.tp must divide" in e.stderr


def test_a_config_that_does_not_load_is_still_printed(tmp_path: Path) -> None:
    r = run_memform("import", "hf", LLAMA, "--set", "parallel.tp=3")
    assert r.returncode == 2
    assert yaml.safe_load(r.stdout)["model"]["hidden_size"] == 4096
    assert "the config printed above was written but does not load" in r.stderr


def test_a_malformed_source_writes_nothing(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.json", '{"hidden_size": 4096}')
    out = tmp_path / "never.yaml"
    r = run_memform("import", "hf", bad, "-o", out)
    assert r.returncode == 2 and "'num_attention_heads' is missing" in r.stderr
    assert not out.exists() and r.stdout == ""


@pytest.mark.parametrize("fmt", sorted(f for f in IMPORTERS if not takes_several_files(f)))
def test_one_file_per_format_unless_it_reads_several(fmt: str) -> None:
    r = memform_in_process("import", fmt, LLAMA, DATA / "gpt2.config.json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"'memform import {fmt}' reads one file, got 2" in r.stderr


# ---- warnings: after the config, each once, naming the key and the assumption -----------------

def test_warnings_come_once_after_the_config(tmp_path: Path) -> None:
    cfg = json.loads(LLAMA.read_text())
    src = write(tmp_path / "c.json", json.dumps({**cfg, "fancy_a": 1, "fancy_b": 2}))
    # hf refuses unread fields unless --accept names them, which turns each into a warning (issue 31)
    both = subprocess.run(memform_command() + ["import", "hf", str(src), "--accept", "fancy_a,fancy_b", "--set",
                                               "model.seq_length=8192"], cwd=ROOT, capture_output=False,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert both.returncode == 0
    lines = both.stdout.rstrip("\n").splitlines()
    warnings = [line for line in lines if line.startswith("memform: warning:")]
    assert warnings == [f"memform: warning: {src}: field 'fancy_a' is not read by memform; taken as "
                        f"memory-neutral (--accept)",
                        f"memform: warning: {src}: field 'fancy_b' is not read by memform; taken as "
                        f"memory-neutral (--accept)"]
    assert lines[-2:] == warnings  # at the end, after the YAML
    assert yaml.safe_load("\n".join(lines[:-2]))["model"]["hidden_size"] == 4096


def test_a_warning_raised_twice_is_kept_once() -> None:
    draft = Draft(Path("x.yaml"), "test")
    for _ in range(3):
        draft.warn("model_config.offset 3 (one number) is not imported: an even split is assumed")
    assert len(draft.warnings) == 1


MF_VPP = ("model: {model_config: {hidden_size: 64, num_heads: 4, num_layers: 4, vocab_size: 64, seq_length: 8, "
          "pp_interleave_num: 2, offset: 1}}\n"
          "parallel_config: {data_parallel: 1, model_parallel: 1, pipeline_stage: 2, micro_batch_num: 2}\n")


def test_mindformers_warnings_name_the_source_key_and_the_assumption(tmp_path: Path) -> None:
    r = run_memform("import", "mindformers", write(tmp_path / "m.yaml", MF_VPP))
    assert r.returncode == 0, r.stderr
    warnings = r.stderr.strip().splitlines()
    assert len(warnings) == len(set(warnings)) == 2
    assert "model_config.pp_interleave_num 2" in warnings[0] and "one chunk per stage assumed" in warnings[0]
    assert "model_config.offset 1 (one number)" in warnings[1] and "even split" in warnings[1]


# ---- default names: unique per file -----------------------------------------------------------

NAMES = [
    ("llama-3.1-8b.json", "llama-3.1-8b"),          # the whole stem, dots kept
    ("llama-3.2-3b.json", "llama-3.2-3b"),
    ("llama3-8b.config.json", "llama3-8b"),         # a config marker dropped
    ("qwen2_config.json", "qwen2"),
    ("gpt3-175b.args.txt", "gpt3-175b"),
    ("mixtral-8x7b.sh", "mixtral-8x7b"),
    ("deepseek3-mindformers.yaml", "deepseek3-mindformers"),
    ("pretrain_llama2_7b.yaml", "pretrain_llama2_7b"),
    ("llama3_8b.toml", "llama3_8b"),
    ("Meta-Llama-3-8B/config.json", "Meta-Llama-3-8B"),   # a stem naming no model: the folder
    ("mixtral/default.yaml", "mixtral"),
    ("run-42/train.toml", "run-42"),
]


@pytest.mark.parametrize("relative, expected", NAMES, ids=[n for n, _ in NAMES])
def test_default_name_from_the_file_name(tmp_path: Path, relative: str, expected: str) -> None:
    assert default_name(tmp_path / relative) == expected


def test_default_names_are_unique_and_load(tmp_path: Path) -> None:
    # two Llama 3 releases whose config.json carry no _name_or_path: their file names tell them apart
    cfg = {k: v for k, v in json.loads(LLAMA.read_text()).items() if k != "_name_or_path"}
    names = set()
    for stem in ("llama-3.1-8b", "llama-3.2-3b"):
        draft = import_config("hf", write(tmp_path / f"{stem}.json", json.dumps(cfg)))
        assert draft.load_error is None
        names.add(draft.get("name"))
    assert names == {"llama-3.1-8b", "llama-3.2-3b"}


def test_the_model_id_wins_over_the_file_name(tmp_path: Path) -> None:
    cfg = {**json.loads(LLAMA.read_text()), "_name_or_path": "meta-llama/Llama-3.1-8B"}
    assert import_config("hf", write(tmp_path / "config.json", json.dumps(cfg))).get("name") == "Llama-3.1-8B"
    hp = import_config("hyperparallel", DATA / "mixtral-8x7b-hyperparallel.yaml")
    assert hp.get("name") == "mixtral-8x7b"  # model.name
    assert import_config("hf", LLAMA, Options(name="mine")).get("name") == "mine"


# ---- hf DIR ------------------------------------------------------------------------------------

def test_hf_reads_a_checkpoint_folder(tmp_path: Path) -> None:
    folder = tmp_path / "Meta-Llama-3-8B"
    write(folder / "config.json", LLAMA.read_text())
    r = run_memform("import", "hf", folder)
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load(r.stdout)
    assert (cfg["name"], cfg["model"]["hidden_size"], cfg["model"]["num_kv_heads"]) == ("Meta-Llama-3-8B", 4096, 8)
    assert r.stdout.startswith("# memform config imported from config.json")


def test_hf_folder_without_config_json(tmp_path: Path) -> None:
    folder = tmp_path / "empty-checkpoint"
    folder.mkdir()
    r = run_memform("import", "hf", folder)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{folder}: a folder, but it holds no config.json" in r.stderr


# ---- one setting, several spellings (Fields.alias: hf and mindformers) ----------------------------------
@pytest.mark.parametrize("fields, expect", [
    ({"num_hidden_layers": 40}, ("num_hidden_layers", 40)),
    ({"num_layers": 40}, ("num_layers", 40)),                           # ChatGLM's spelling alone
    ({"num_hidden_layers": 40, "num_layers": 40}, ("num_hidden_layers", 40)),   # GLM-4 copies both: they agree
    ({}, (None, None)),
])
def test_fields_alias_reads_the_first_spelling_and_marks_the_others_read(fields, expect):
    from memform.importers.draft import Fields
    f = Fields(fields, "config.json")
    assert f.alias(("num_hidden_layers", "num_layers"), f.integer) == expect
    assert not f.unused()


def test_fields_alias_refuses_spellings_that_disagree_naming_both(tmp_path):
    from memform.errors import MemformError
    from memform.importers.draft import Fields
    f = Fields({"num_hidden_layers": 40, "num_layers": 41}, "config.json")
    with pytest.raises(MemformError, match=r"config.json: field 'num_layers' is 41 but 'num_hidden_layers' is 40: "
                                           r"the file disagrees with itself"):
        f.alias(("num_hidden_layers", "num_layers"), f.integer)
    # through the importer: a GLM-4 config.json whose two layer counts differ exits 2
    cfg = json.loads((DATA / "hf" / "glm-4-9b-chat.config.json").read_text())
    cfg["num_hidden_layers"] = cfg["num_layers"] + 1
    path = write(tmp_path / "glm.json", json.dumps(cfg))
    r = memform_in_process("import", "hf", str(path))
    assert r.returncode == 2 and "disagrees with itself" in r.stderr
