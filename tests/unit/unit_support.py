"""Helpers of the fast tests (tests/unit), run in the tool venv; imported as
`unit.unit_support` (pyproject's pythonpath puts tests/ on sys.path).

They live in tests/unit rather than tests/support because tests/unit must
stand alone: the rebase command runs the fast tests, and its own tests
(tests/rebase) run it on a project copy that holds tests/conftest.py and
tests/unit only."""

from __future__ import annotations

import pathlib
import zipfile


def fake_wheel(folder: pathlib.Path, name: str, version: str, requires_python: str | None = ">=3.12", extra: str = "") -> pathlib.Path:
    """A minimal wheel: a package and its METADATA."""
    dist = name.replace("-", "_")
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + (f"Requires-Python: {requires_python}\n" if requires_python else "")
    with zipfile.ZipFile(wheel, "w") as zf:  # fixed dates: the same arguments give the same bytes
        zf.writestr(zipfile.ZipInfo(f"{dist}/__init__.py", (1980, 1, 1, 0, 0, 0)), extra)
        zf.writestr(zipfile.ZipInfo(f"{dist}-{version}.dist-info/METADATA", (1980, 1, 1, 0, 0, 0)), meta)
    return wheel
