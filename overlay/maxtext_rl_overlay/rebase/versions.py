"""The version a moved pin is built as, by the rule its pin.toml [rebase]
version names (pins.VERSION_RULES). Each rule returns the version and why."""

from __future__ import annotations

import datetime
import pathlib
import re
import tomllib
from collections.abc import Callable

from ..config.pins import Pin
from ..core.errors import OverlayError
from ..core.git import git, out

Rule = Callable[[Pin, pathlib.Path, str, str], tuple[str, str]]


def release_tag_dev_date(pin: Pin, git_dir: pathlib.Path, commit: str, date: str) -> tuple[str, str]:
    """<release>.dev<YYYYMMDD>, as tpu-inference names its daily builds:
    <release> is the newest release (tag vX.Y.Z) at the time (0.26.0 was
    tagged 2026-07-30, and the builds of 2026-07-31..08-20 are
    0.26.0.devYYYYMMDD). Release tags sit on release branches (git describe
    on main finds only v0.11.1), so: the newest vX.Y.Z tag whose commit is not
    later than the new commit; with no such tag, the previous pin's base.
    YYYYMMDD is the new commit's committer date, as recorded in the pin."""
    when = datetime.datetime.fromisoformat(date)
    refs = out("for-each-ref", "--format=%(refname:strip=2) %(*committerdate:unix)%(committerdate:unix)", "refs/tags", git_dir=git_dir)
    best: tuple[int, tuple[int, ...], str] | None = None
    for line in refs.splitlines():
        tag, _, stamp = line.partition(" ")
        m = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)", tag)
        if m and stamp.isdigit() and int(stamp) <= when.timestamp():
            key = (int(stamp), tuple(int(x) for x in m.groups()), ".".join(m.groups()))
            best = max(best, key) if best else key
    if best:
        base, why = best[2], f"newest release tag v{best[2]} not after the commit"
    else:
        base = re.sub(r"\.dev\d+$", "", pin.version)
        why = f"no release tag found: base {base} kept from the previous pin {pin.version}"
    return f"{base}.dev{when:%Y%m%d}", why


def pyproject(pin: Pin, git_dir: pathlib.Path, commit: str, date: str) -> tuple[str, str]:
    """pyproject.toml's static [project] version at the new commit."""
    proc = git("show", f"{commit}:pyproject.toml", git_dir=git_dir, check=False)
    try:
        version = tomllib.loads(proc.stdout)["project"]["version"]
    except (tomllib.TOMLDecodeError, KeyError):
        raise OverlayError(
            f"{pin.distribution}: pyproject.toml at {commit[:12]} has no static [project] version; "
            f"set version in {pin.pin_file} by hand."
        ) from None
    return version, f"pyproject.toml [project] version at {commit[:12]}"


def kept(pin: Pin, git_dir: pathlib.Path, commit: str, date: str) -> tuple[str, str]:
    """The previous pin's, for a version a mirror cannot tell (vLLM's
    setuptools-scm reads release tags on other branches). Said so."""
    return pin.version, f"KEPT from the previous pin: {pin.distribution}'s version is not derived from its upstream here; set it by hand"


#: One function per name pins.VERSION_RULES accepts in a pin.toml.
RULES: dict[str, Rule] = {"release-tag-dev-date": release_tag_dev_date, "pyproject": pyproject, "kept": kept}


def new_version(pin: Pin, git_dir: pathlib.Path, commit: str, date: str) -> tuple[str, str]:
    return RULES[pin.rebase.version_rule](pin, git_dir, commit, date)
