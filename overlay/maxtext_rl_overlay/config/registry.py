"""Release files from the package index, by project and file name.

`pip download` cannot fetch an sdist without building it (it prepares the
metadata, and vLLM's needs torch and a compiler), so files are taken straight
from the index's JSON simple API (PEP 691) and checked against the sha256 the
index lists, and against a pinned sha256 where the caller has one. Downloads
are cached by file name and hash, in a folder of the tool's cache
(`<cache>/<kind>`: each file is written under its lock there, staged beside
it, so a download a killed run left half done is cleared by the next one).

A release wheel looked up by project and version (`release_wheel`) reads the
file list once, and records which file it chose and the sha256 the index
listed for it; a later lookup of the same release on the same index reuses the
cached file when it still has that sha256, without the network: index files
are immutable once published (a name cannot be uploaded twice), and the file
was checked against the index's sha256 when it was downloaded."""

from __future__ import annotations

import json
import os
import pathlib
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from ..cache import buildcache, cachekeys
from ..core.digest import sha256_file
from ..core.errors import OverlayError
from ..core.output import step
from ..core.staging import staged_path

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


def files(project: str) -> list[dict[str, Any]]:
    """`project`'s files on the index: PEP 691 entries (filename, url, hashes)."""
    url = f"{index_url()}/{canonicalize_name(project)}/"
    request = urllib.request.Request(url, headers={"Accept": _JSON})
    try:
        with urllib.request.urlopen(request, context=_context(), timeout=120) as response:
            listing = json.load(response)
    except (OSError, ValueError) as exc:
        raise OverlayError(f"cannot read the file list of {project} from the package index {url}: {exc}") from None
    return [dict(entry, url=urllib.parse.urljoin(url, entry["url"])) for entry in listing.get("files", [])]


def _pure_wheel(listing: list[dict[str, Any]], project: str, version: str) -> str:
    """The pure-Python wheel of `version`, compared as PEP 440 versions
    (v0.2.4 and 0.2.4.0 are 0.2.4); where there is none, the error lists
    the versions there are."""
    try:
        wanted: Version | None = Version(version)
    except InvalidVersion:
        wanted = None
    pure = [(parse_wheel_filename(str(e["filename"]))[1], str(e["filename"])) for e in listing if str(e["filename"]).endswith("-py3-none-any.whl")]
    for found, name in pure:
        if found == wanted:
            return name
    have = ", ".join(str(v) for v in sorted({v for v, _ in pure})) or "none"
    why = "" if wanted is not None else " (not a PEP 440 version)"
    raise OverlayError(f"the package index has no pure-Python wheel of {project} {version}{why}; the releases it has: {have}.")


def file_info(project: str, filename: str) -> tuple[str, str]:
    """(url, sha256) of `filename` among `project`'s files on the index."""
    return _info(files(project), project, filename)


def _info(listing: list[dict[str, Any]], project: str, filename: str) -> tuple[str, str]:
    for entry in listing:
        if entry.get("filename") == filename:
            sha = entry.get("hashes", {}).get("sha256")
            if not sha:
                raise OverlayError(f"the package index lists {filename} without a sha256; refusing to use it unchecked.")
            return entry["url"], sha
    raise OverlayError(f"the package index has no file {filename} for {project}.")


def download(project: str, filename: str, dest_dir: pathlib.Path, *, kind: str, sha256: str | None = None) -> pathlib.Path:
    """`filename` of `project` in `dest_dir`, the cache's folder of `kind`
    (one of buildcache.KINDS), downloaded once and checked."""
    dest = dest_dir / filename
    if sha256 and dest.is_file() and sha256_file(dest) == sha256:
        return dest
    url, listed = file_info(project, filename)
    if sha256 and listed != sha256:
        raise OverlayError(f"the package index lists {filename} with sha256 {listed}, not the pinned {sha256}.")
    return _fetch(project, filename, url, listed, dest_dir, kind)


def release_wheel(project: str, version: str, dest_dir: pathlib.Path) -> pathlib.Path:
    """`project`'s pure-Python wheel of `version` in `dest_dir`: one read of
    the index's file list the first time; afterwards, while the cached file
    still has the sha256 recorded then, none."""
    inputs = {"index": index_url(), "project": canonicalize_name(project), "version": version}
    entry = buildcache.Entry(dest_dir / f"{canonicalize_name(project)}-{version}.release.json", cachekeys.key(inputs), who=project,
                             kind="releases", one_file=True)

    def check(record: dict[str, Any]) -> pathlib.Path:
        wheel = dest_dir / str(record["filename"])
        if wheel.name != record["filename"] or not wheel.is_file() or sha256_file(wheel) != record["sha256"]:
            raise buildcache.Damaged
        return wheel

    with entry.locked():
        kept = entry.reuse(check)  # none, or a damaged one (said): ask the index
    if kept is not None:
        return kept
    listing = files(project)
    filename = _pure_wheel(listing, project, version)
    url, listed = _info(listing, project, filename)
    wheel = _fetch(project, filename, url, listed, dest_dir, "releases")
    with entry.locked():
        entry.make(lambda _: {**inputs, "filename": filename, "sha256": listed})
    return wheel


def _fetch(project: str, filename: str, url: str, listed: str, dest_dir: pathlib.Path, kind: str) -> pathlib.Path:
    """`filename` in `dest_dir` with the sha256 the index lists: the cached
    copy if it has it, else downloaded from `url` and checked. The download
    is staged beside it (`FILENAME.<8 hex>`) under the file's cache lock, so
    one a killed run left is cleared by the next download of that file."""
    dest = dest_dir / filename
    if dest.is_file() and sha256_file(dest) == listed:
        return dest
    # The cache's entry of the download: named by the file, checked by the sha256 the index lists.
    with buildcache.Entry(dest, listed, who=project, kind=kind).locked():
        if dest.is_file() and sha256_file(dest) == listed:  # another build downloaded it meanwhile
            return dest
        with step(project, f"downloading {filename}"), staged_path(dest) as tmp, open(tmp, "wb") as out:
            try:
                with urllib.request.urlopen(url, context=_context(), timeout=600) as response:
                    while chunk := response.read(1 << 20):
                        out.write(chunk)
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                raise OverlayError(f"cannot download {filename} from the package index ({url}): {exc}; "
                                   "check the network, or the index the environment names (UV_DEFAULT_INDEX, UV_INDEX_URL, PIP_INDEX_URL).") from None
            out.flush()
            got = sha256_file(tmp)
            if got != listed:
                raise OverlayError(f"{filename}: downloaded sha256 {got} is not the {listed} the index lists.")
    return dest
