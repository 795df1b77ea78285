"""Release files from the package index, by project and file name.

`pip download` cannot fetch an sdist without building it (it prepares the
metadata, and vLLM's needs torch and a compiler), so files are taken straight
from the index's JSON simple API (PEP 691) and checked against the sha256 the
index lists, and against a pinned sha256 where the caller has one. Downloads
are cached by file name and hash."""

from __future__ import annotations

import json
import os
import pathlib
import ssl
import tempfile
import urllib.error
import urllib.parse
import urllib.request

from packaging.utils import canonicalize_name, parse_wheel_filename

from .digest import sha256_file
from .errors import OverlayError
from .progress import step

#: PyPI, the index pip and uv use when none is configured.
DEFAULT_INDEX = "https://pypi.org/simple"
_JSON = "application/vnd.pypi.simple.v1+json"


def index_url() -> str:
    """The index the user's uv or pip is set to use, as they would read it."""
    for var in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        if os.environ.get(var):
            return os.environ[var].rstrip("/")
    return DEFAULT_INDEX


def _context() -> ssl.SSLContext:
    # The CA bundle the environment gives pip or OpenSSL, where it gives one.
    return ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE") or os.environ.get("PIP_CERT") or None)


def files(project: str) -> list[dict]:
    """`project`'s files on the index: PEP 691 entries (filename, url, hashes)."""
    url = f"{index_url()}/{canonicalize_name(project)}/"
    request = urllib.request.Request(url, headers={"Accept": _JSON})
    try:
        with urllib.request.urlopen(request, context=_context(), timeout=120) as response:
            listing = json.load(response)
    except (OSError, ValueError) as exc:
        raise OverlayError(f"cannot read the file list of {project} from the package index {url}: {exc}") from None
    return [dict(entry, url=urllib.parse.urljoin(url, entry["url"])) for entry in listing.get("files", [])]


def wheel_name(project: str, version: str) -> str:
    """The file name of `project`'s pure-Python wheel of `version`."""
    for entry in files(project):
        name = entry["filename"]
        if name.endswith("-py3-none-any.whl") and str(parse_wheel_filename(name)[1]) == version:
            return name
    raise OverlayError(f"the package index has no pure-Python wheel of {project} {version}.")


def file_info(project: str, filename: str) -> tuple[str, str]:
    """(url, sha256) of `filename` among `project`'s files on the index."""
    for entry in files(project):
        if entry.get("filename") == filename:
            sha = entry.get("hashes", {}).get("sha256")
            if not sha:
                raise OverlayError(f"the package index lists {filename} without a sha256; refusing to use it unchecked.")
            return entry["url"], sha
    raise OverlayError(f"the package index has no file {filename} for {project}.")


def download(project: str, filename: str, dest_dir: pathlib.Path, *, sha256: str | None = None) -> pathlib.Path:
    """`filename` of `project` in `dest_dir`, downloaded once and checked."""
    dest = dest_dir / filename
    if sha256 and dest.is_file() and sha256_file(dest) == sha256:
        return dest
    url, listed = file_info(project, filename)
    if sha256 and listed != sha256:
        raise OverlayError(f"the package index lists {filename} with sha256 {listed}, not the pinned {sha256}.")
    if dest.is_file() and sha256_file(dest) == listed:
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=filename + ".", dir=dest_dir)
    try:
        with step(project, f"downloading {filename}"), os.fdopen(fd, "wb") as out:
            with urllib.request.urlopen(url, context=_context(), timeout=600) as response:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
        got = sha256_file(pathlib.Path(tmp))
        if got != listed:
            raise OverlayError(f"{filename}: downloaded sha256 {got} is not the {listed} the index lists.")
        os.replace(tmp, dest)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return dest

