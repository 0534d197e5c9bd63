"""Unread source fields are refused unless the user vouches for them (``memform import --accept``).

Issue 31: "every flag the importer does not model is either proven memory-neutral (listed with the
reason) or refused". The importers list their memory-neutral fields; what is left is refused here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memform.errors import MemformError
from memform.importers.draft import Draft, Fields


def _draft(data: dict) -> tuple[Draft, Fields]:
    draft = Draft(Path("model.json"), "test")
    fields = Fields(data, Path("model.json"))
    return draft, fields


def test_a_read_or_neutral_field_passes() -> None:
    draft, fields = _draft({"hidden_size": 8, "bos_token_id": 1})
    fields.integer("hidden_size")
    draft.refuse_unused(fields, {"bos_token_id": "a token id"})
    draft.check_unread()
    assert draft.warnings == []


def test_an_unread_field_is_refused_with_its_name_and_the_way_round() -> None:
    draft, fields = _draft({"hidden_size": 8, "block_sparse": True, "other": 1})
    fields.integer("hidden_size")
    draft.refuse_unused(fields)
    with pytest.raises(MemformError) as err:
        draft.check_unread()
    text = str(err.value)
    assert "model.json" in text and "'block_sparse', 'other'" in text
    assert "--accept block_sparse,other" in text


def test_accepted_fields_become_warnings_and_stray_accepts_are_said() -> None:
    draft, fields = _draft({"block_sparse": True})
    draft.refuse_unused(fields)
    draft.check_unread(["block_sparse", "typo"])
    assert any("'block_sparse'" in w and "--accept" in w for w in draft.warnings)
    assert any("--accept typo" in w for w in draft.warnings)


def test_a_partly_accepted_list_still_refuses_the_rest() -> None:
    draft = Draft(Path("run.sh"), "test")
    draft.refuse_unread("--foo")
    draft.refuse_unread("--bar")
    with pytest.raises(MemformError) as err:
        draft.check_unread(["--foo"])
    assert "'--bar'" in str(err.value) and "'--foo'" not in str(err.value)


def test_nested_fields_are_named_with_their_section() -> None:
    draft = Draft(Path("ds.json"), "test")
    section = Fields({"zero_hpz": 2}, Path("ds.json"), "zero_optimization.")
    draft.refuse_unused(section)
    with pytest.raises(MemformError, match=r"'zero_optimization\.zero_hpz'"):
        draft.check_unread()
    draft.check_unread(["zero_optimization.zero_hpz"])


def test_a_field_of_another_file_names_that_file() -> None:
    # deepspeed reads its model from --model config.json: an unread field there is named with its file
    draft = Draft(Path("ds.json"), "test")
    draft.refuse_unused(Fields({"odd_field": 1}, Path("model/config.json")))
    with pytest.raises(MemformError, match=r"ds\.json: .*'odd_field' \(in model/config\.json\)"):
        draft.check_unread()
