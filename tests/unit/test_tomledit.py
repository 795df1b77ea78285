"""Values edited in place: comments and layout kept, the edit proven by parsing."""

from __future__ import annotations

import tomllib

import pytest

from maxtext_rl_overlay.core.errors import OverlayError
from maxtext_rl_overlay.core.tomledit import set_value

DOC = '''# the pin
commit = "aaa"  # why this commit
[project]
version = "1.0"
dependencies = [
  "packaging>=24",
]
[project.optional-dependencies]
maxtext = ["maxtext[tpu-post-train]==0.2.4"]
'''


def test_strings_and_lists_are_replaced_where_they_stand():
    text = set_value(DOC, (), "commit", "bbb", where="t")
    assert text == DOC.replace('"aaa"', '"bbb"')  # the comments stay
    text = set_value(text, ("project",), "dependencies", ["packaging>=24", "x==1"], where="t")
    assert 'dependencies = [\n  "packaging>=24",\n  "x==1",\n]\n' in text  # one item a line, as before
    text = set_value(text, ("project", "optional-dependencies"), "maxtext", ["maxtext[tpu-post-train]==0.2.4", "a==1"], where="t")
    assert 'maxtext = ["maxtext[tpu-post-train]==0.2.4", "a==1"]\n' in text  # one line, as before
    doc = tomllib.loads(text)
    assert doc["commit"] == "bbb" and doc["project"]["version"] == "1.0"


def test_an_edit_that_misses_its_table_is_refused():
    with pytest.raises(OverlayError, match="cannot set project.name"):
        set_value(DOC, ("project",), "name", "x", where="t")
    # `version` exists, but not at the top level: the first match is [project]'s, so the check refuses it.
    with pytest.raises(OverlayError, match="cannot set version"):
        set_value(DOC, (), "version", "2.0", where="t")
