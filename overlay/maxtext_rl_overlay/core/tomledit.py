"""Editing a TOML file's values in place, its comments and layout kept.

tomllib reads TOML but cannot write it, and a rewrite from the parsed data
would lose the comments that explain each pin. So a value is replaced where
it stands, by a pattern, and the result is parsed again: the edit counts only
if the value now read at that place is the new one."""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any

from .errors import OverlayError


def set_value(text: str, table: tuple[str, ...], key: str, value: str | list[str], *, where: str) -> str:
    """`text` with `key` of `table` (() for the top level) set to `value`: a
    string, or a list of strings (written on one line or one item a line,
    as the old list was)."""
    name = re.escape(key)
    if isinstance(value, str):
        pattern = rf'(?m)^({name}\s*=\s*)"[^"\n]*"'
        new_text = json.dumps(value)
    else:
        pattern = rf"(?ms)^({name}\s*=\s*)\[.*?\]$"
        new_text = ""
    def replace(m: re.Match[str]) -> str:
        if isinstance(value, str):
            return m.group(1) + new_text
        if "\n" in m.group(0):
            return m.group(1) + "[\n" + "".join(f"  {json.dumps(v)},\n" for v in value) + "]"
        return m.group(1) + json.dumps(value)
    edited, count = re.subn(pattern, replace, text, count=1)
    if count != 1 or _read(edited, table, key) != value:
        place = ".".join((*table, key))
        raise OverlayError(f"{where}: cannot set {place} in place (no `{key} = ...` line of that table found); restore it by hand.")
    return edited


def _read(text: str, table: tuple[str, ...], key: str) -> Any:
    try:
        node: Any = tomllib.loads(text)
        for part in table:
            node = node[part]
        return node[key]
    except (tomllib.TOMLDecodeError, KeyError, TypeError):
        return None
