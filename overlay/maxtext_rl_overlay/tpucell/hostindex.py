"""What a TPU cell host's own package index holds, read (never assumed):
a PEP 503 simple index (a folder, or a file:// URL of one, holding
`<name>/index.html`) or a find-links folder of wheels. The host's Python
and platform decide which wheels it can install (`host_tags`)."""

from __future__ import annotations

import dataclasses
import html.parser
import pathlib
import urllib.parse
from collections.abc import Iterable, Sequence

from packaging import tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from ..core.errors import OverlayError


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs += [v for k, v in attrs if k == "href" and v]


def folder_of(location: str) -> pathlib.Path:
    """A host index location as a folder: a path, or a file:// URL."""
    parsed = urllib.parse.urlparse(location)
    if parsed.scheme not in ("", "file"):
        raise OverlayError(f"--host-index {location}: only a folder or a file:// URL can be read here (the host has no network).")
    path = pathlib.Path(urllib.parse.unquote(parsed.path) if parsed.scheme else location)
    if not path.is_dir():
        raise OverlayError(f"--host-index {location}: no such folder (a simple index holding NAME/index.html, or a folder of wheels).")
    return path.resolve()


@dataclasses.dataclass(frozen=True)
class Location:
    given: str  # as the user wrote it
    folder: pathlib.Path
    simple: bool  # a PEP 503 index (else a find-links folder of wheels)

    @property
    def url(self) -> str:
        return self.folder.as_uri()


@dataclasses.dataclass(frozen=True)
class HostIndex:
    locations: tuple[Location, ...]

    def wheels(self, name: str) -> list[tuple[str, Location]]:
        """Every wheel file of `name` the host's index holds, with where."""
        canon = canonicalize_name(name)
        found: list[tuple[str, Location]] = []
        for loc in self.locations:
            if loc.simple:
                page = loc.folder / canon / "index.html"
                if not page.is_file():
                    continue
                parser = _Links()
                parser.feed(page.read_text(errors="replace"))
                names = [urllib.parse.unquote(h.split("#")[0].rstrip("/").rsplit("/", 1)[-1]) for h in parser.hrefs]
            else:
                names = [p.name for p in loc.folder.glob("*.whl")]
            for file in names:
                try:
                    if file.endswith(".whl") and parse_wheel_filename(file)[0] == canon:
                        found.append((file, loc))
                except InvalidWheelFilename:
                    continue
        return found

    def versions(self, name: str, compatible: Iterable[tags.Tag]) -> list[Version]:
        """The versions of `name` the host can install from its index, newest first."""
        ok = set(compatible)
        return sorted({parse_wheel_filename(f)[1] for f, _ in self.wheels(name) if ok & set(parse_wheel_filename(f)[3])}, reverse=True)

    def provides(self, name: str, version: str, compatible: Iterable[tags.Tag]) -> str | None:
        """The file of `name` at `version` the host can install, or None."""
        want, ok = Version(version), set(compatible)
        for file, loc in self.wheels(name):
            _, got, _, file_tags = parse_wheel_filename(file)
            if got == want and ok & set(file_tags):
                return f"{loc.given}: {file}"
        return None


def read(locations: Sequence[str]) -> HostIndex:
    if not locations:
        raise OverlayError("name the host's package index with --host-index (a simple index folder or file:// URL, or a folder of wheels).")
    found = []
    for given in locations:
        folder = folder_of(given)
        simple = any(p.is_dir() and (p / "index.html").is_file() for p in folder.iterdir())
        if not simple and not any(folder.glob("*.whl")):
            raise OverlayError(f"--host-index {given}: neither a simple index (NAME/index.html) nor a folder of wheels.")
        found.append(Location(given, folder, simple))
    return HostIndex(tuple(found))


def platforms(platform: str) -> list[str]:
    """The platform tags a host of `platform` (x86_64-manylinux_2_31: uv's
    spelling) installs, newest first."""
    arch, _, libc = platform.partition("-")
    if not libc.startswith("manylinux_2_"):
        raise OverlayError(f"host platform {platform!r}: expected ARCH-manylinux_2_N (such as x86_64-manylinux_2_31).")
    glibc = int(libc.removeprefix("manylinux_2_"))
    found = [f"manylinux_2_{n}_{arch}" for n in range(glibc, 4, -1)]
    found += [f"manylinux{legacy}_{arch}" for legacy, n in (("2014", 17), ("2010", 12), ("1", 5)) if n <= glibc]
    return [*found, f"linux_{arch}"]


def host_tags(python: str, platform: str) -> list[tags.Tag]:
    """The wheel tags a CPython `python` (3.11) on `platform` can install."""
    try:
        major, minor = (int(x) for x in python.split(".")[:2])
    except ValueError:
        raise OverlayError(f"--host-python {python!r}: expected a version such as 3.11.") from None
    interpreter, where = f"cp{major}{minor}", platforms(platform)
    return [*tags.cpython_tags((major, minor), abis=[interpreter, "abi3", "none"], platforms=where),
            *tags.compatible_tags((major, minor), interpreter=interpreter, platforms=where)]
