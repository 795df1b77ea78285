"""Helpers of the fast tests (tests/unit), run in the tool venv; imported as
`unit.unit_support` (pyproject's pythonpath puts tests/ on sys.path).

They live in tests/unit rather than tests/support because tests/unit must
stand alone: the rebase command runs the fast tests, and its own tests
(tests/rebase) run it on a project copy that holds tests/conftest.py and
tests/unit only."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import os
import pathlib
import shutil
import sys
import threading
import zipfile
from collections.abc import Iterator

#: The checkout the fast tests test.
ROOT = pathlib.Path(__file__).resolve().parents[2]
#: The tool venv's uv (scripts/setup.sh installs it there).
UV = shutil.which("uv") or str(pathlib.Path(sys.executable).parent / "uv")


def fake_wheel(folder: pathlib.Path, name: str, version: str, requires_python: str | None = ">=3.12", extra: str = "") -> pathlib.Path:
    """A minimal wheel: a package and its METADATA."""
    dist = name.replace("-", "_")
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + (f"Requires-Python: {requires_python}\n" if requires_python else "")
    with zipfile.ZipFile(wheel, "w") as zf:  # fixed dates: the same arguments give the same bytes
        zf.writestr(zipfile.ZipInfo(f"{dist}/__init__.py", (1980, 1, 1, 0, 0, 0)), extra)
        zf.writestr(zipfile.ZipInfo(f"{dist}-{version}.dist-info/METADATA", (1980, 1, 1, 0, 0, 0)), meta)
    return wheel


def installable_wheel(folder: pathlib.Path, name: str, version: str, requires: tuple[str, ...] = ()) -> pathlib.Path:
    """An installable wheel: a package, METADATA, WHEEL and RECORD."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}/__init__.py": b"",
        f"{info}/METADATA": (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                             + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
                     for n, d in files.items()) + f"{info}/RECORD,,\n"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in {**files, f"{info}/RECORD": record.encode()}.items():
            zf.writestr(zipfile.ZipInfo(n, (1980, 1, 1, 0, 0, 0)), d)
    return path


def uv_offline_env(tmp_path: pathlib.Path) -> dict[str, str]:
    # Only the find-links folders (the index is an empty folder: no registry), no user settings; the tool runs this uv.
    (tmp_path / "no-index").mkdir(exist_ok=True)
    return dict(os.environ, UV_DEFAULT_INDEX=(tmp_path / "no-index").as_uri(), UV_PYTHON_DOWNLOADS="never", UV_NO_CONFIG="1",
                UV_CACHE_DIR=str(tmp_path / "uv-cache"),
                PATH=f"{pathlib.Path(UV).parent}{os.pathsep}{os.environ['PATH']}")


def assert_uploads_every_junit(job: dict, root: pathlib.Path) -> None:
    """`job` (a workflow job running scripts/test-matrix.sh) uploads the
    JUnit XML of every run of every cell the matrix declares, and fails when
    there is none."""
    import fnmatch

    from maxtext_rl_overlay.pins import load_project
    from maxtext_rl_overlay.testmatrix import junit_name, load_matrix

    (upload,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact") and "junit" in s["with"]["name"]]
    assert upload.get("if") == "always()", "kept when the matrix fails too"
    assert upload["with"].get("if-no-files-found") == "error", "a matrix that wrote no report must not pass unseen"
    path = upload["with"]["path"]
    project = load_project(root)
    matrix = load_matrix(project.options.matrix, where="pyproject.toml", quick=False)
    written = [f"build/test-matrix/cells/{cell.name}/{junit_name(run)}" for cell in matrix.cells for run in cell.runs]
    assert "build/test-matrix/cells/maxtext-0.2.4/junit-maxtext-shims.xml" in written
    missed = [w for w in written if not fnmatch.fnmatch(w, path)]
    assert not missed, f"the upload's path {path!r} misses {missed}"


def project_copy(dest: pathlib.Path, *, licence: bool = False) -> pathlib.Path:
    """A copy of the project's pyproject.toml, README.md (LICENSE) and
    patches/ in `dest`: enough for the tool to read, lint and begin a build."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", *(("LICENSE",) if licence else ())):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "patches", dest / "patches")
    return dest


@contextlib.contextmanager
def served(folder: pathlib.Path) -> Iterator[str]:
    """`folder` served over HTTP on 127.0.0.1 for the block: its URL."""

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kw):
            super().__init__(*args, directory=str(folder), **kw)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
