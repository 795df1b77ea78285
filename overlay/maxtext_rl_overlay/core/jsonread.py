"""One JSON document read as an object, refused in words where it is not
one: the one reader of the tool's own JSON files (manifest.py's build
manifest, reports.py's reports), each then checking its own format or kind
and version. (tpucell/host.py reads its cell.json on the host with the
standard library alone: it cannot share this.)"""

from __future__ import annotations

import json
from typing import Any

from .errors import OverlayError


def json_object(text: str, where: str, refused: str, *, name_type: bool = False) -> dict[str, Any]:
    """`text` as a JSON object. Else an OverlayError: `where` is not JSON
    (the parser's words), or not a JSON object (with `name_type`, what it
    is instead), then `refused`: what that means and what to do."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise OverlayError(f"{where} is not JSON ({exc}){refused}") from None
    if not isinstance(doc, dict):
        raise OverlayError(f"{where} is not a JSON object{f' but {type(doc).__name__}' if name_type else ''}{refused}")
    return doc
