"""The one sha256 helper: of a file, read in chunks (wheels and sdists run
to hundreds of MB)."""

from __future__ import annotations

import hashlib
import pathlib


def sha256_file(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
